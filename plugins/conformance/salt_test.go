package conformance_test

import (
	"context"
	"slices"
	"strings"
	"testing"

	cachemgrv2 "github.com/kvx-dev/kvx/cachemgr_v2"
	"github.com/kvx-dev/kvx/plugins/conformance"
	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
	"github.com/kvx-dev/kvx/plugins/v1/pluginrpc"
)

// saltBlind claims the cache_salt capability but keys its cache by the
// tokens alone (it drops the salt before a real manager sees it): what an
// old manager would do if the host trusted it.
type saltBlind struct{ kvcache.Manager }

func (s saltBlind) Info(ctx context.Context) (kvcache.Info, error) {
	info, err := s.Manager.Info(ctx)
	info.Capabilities.CacheSalt = true
	return info, err
}

func (s saltBlind) Lookup(ctx context.Context, items []kvcache.LookupItem) ([]int, error) {
	items = slices.Clone(items)
	for i := range items {
		items[i].CacheSalt = ""
	}
	return s.Manager.Lookup(ctx, items)
}

func (s saltBlind) Reserve(ctx context.Context, items []kvcache.ReserveItem) ([]kvcache.Grant, error) {
	items = slices.Clone(items)
	for i := range items {
		items[i].CacheSalt = ""
	}
	return s.Manager.Reserve(ctx, items)
}

// TestCacheSaltCheckCatchesSharing: the CacheSalt check fails a manager that
// shares blocks across salts, in-process and over gRPC (where the salt
// crosses the wire and is then ignored).
func TestCacheSaltCheckCatchesSharing(t *testing.T) {
	for name, f := range map[string]func() kvcache.Manager{
		"inprocess": func() kvcache.Manager { return saltBlind{cachemgrv2.New()} },
		"grpc":      func() kvcache.Manager { return pluginrpc.TestManagerPair(t, saltBlind{cachemgrv2.New()}) },
	} {
		err := conformance.CheckManager(ctx, f, conformance.ManagerOptions{Reuse: true, Checks: []string{"CacheSalt"}})
		vs := conformance.Violations(err)
		i := slices.IndexFunc(vs, func(v *conformance.Violation) bool { return v.Check == "CacheSalt" })
		if i < 0 || !strings.Contains(vs[i].Got, `Lookup(salt "conformance-b")`) {
			t.Errorf("%s: CheckManager(CacheSalt) = %v; want the cross-salt Lookup reported", name, err)
		}
	}
	// Without the capability the check has nothing to ask (the host sends
	// such a manager no salt).
	if err := conformance.CheckManager(ctx, func() kvcache.Manager { return &refManager{} },
		conformance.ManagerOptions{Reuse: true, Checks: []string{"CacheSalt"}}); err != nil {
		t.Errorf("CheckManager(CacheSalt) of a manager without the capability = %v", err)
	}
}

// mute claims KV events but reports none.
type mute struct{ *cachemgrv2.Manager }

func (mute) Events(context.Context) ([]kvcache.Event, error) { return nil, nil }

// TestKVEventsCheckCatchesSilence: the real managers' events pass the KVEvents check (in
// TestManagers); a manager that reports nothing fails it, in-process and
// over gRPC.
func TestKVEventsCheckCatchesSilence(t *testing.T) {
	for name, f := range map[string]func() kvcache.Manager{
		"inprocess": func() kvcache.Manager { return mute{cachemgrv2.New()} },
		"grpc":      func() kvcache.Manager { return pluginrpc.TestManagerPair(t, mute{cachemgrv2.New()}) },
	} {
		err := conformance.CheckManager(ctx, f, conformance.ManagerOptions{Reuse: true, Checks: []string{"KVEvents"}})
		vs := conformance.Violations(err)
		if i := slices.IndexFunc(vs, func(v *conformance.Violation) bool { return v.Check == "KVEvents" }); i < 0 || !strings.Contains(vs[i].Want, "AllBlocksCleared") {
			t.Errorf("%s: CheckManager(KVEvents) = %v; want the missing AllBlocksCleared reported", name, err)
		}
	}
}
