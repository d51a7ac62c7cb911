package main

// This file exists only because kvcache.Manager still lists Suspend and
// Resume. Once they become an optional interface of kvcache (found by type
// assertion, as kvcache.StepEnder is), delete this file: a manager without
// a host tier then simply does not implement them.

import (
	"context"

	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
)

// Suspend implements kvcache.Manager: there is no host tier
// (Capabilities.HostTier is false), so the engine pauses a sequence by
// releasing it and recomputing it later.
func (m *Manager) Suspend(context.Context, []kvcache.SeqID) ([]bool, []kvcache.Copy, error) {
	return nil, nil, kvcache.Errorf(kvcache.KindUnsupported, "fifo: no host tier")
}

// Resume implements kvcache.Manager; see Suspend.
func (m *Manager) Resume(context.Context, []kvcache.SeqID) ([]bool, []kvcache.Copy, error) {
	return nil, nil, kvcache.Errorf(kvcache.KindUnsupported, "fifo: no host tier")
}
