package engine_test

import (
	"context"
	"fmt"
	"testing"

	cachemgrv1 "github.com/kvx-dev/kvx/cachemgr_v1"
	"github.com/kvx-dev/kvx/core/sched"
	"github.com/kvx-dev/kvx/device"
	"github.com/kvx-dev/kvx/dsa"
	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
	"github.com/kvx-dev/kvx/plugins/v1/worker"
)

// boundaries is a manager that reuses prefixes only at multiples of every
// blocks blocks, as a Mamba stage reuses only at its snapshot boundaries: its
// Lookup answers such lengths and its Reserve refuses any other Reuse.
type boundaries struct {
	kvcache.Manager
	every int // blocks
	tpb   int
}

func (b *boundaries) Configure(ctx context.Context, cfg kvcache.Config) (kvcache.Layout, error) {
	b.tpb = cfg.TokensPerBlock
	return b.Manager.Configure(ctx, cfg)
}

func (b *boundaries) Lookup(ctx context.Context, items []kvcache.LookupItem) ([]int, error) {
	got, err := b.Manager.Lookup(ctx, items)
	for i := range got {
		got[i] -= got[i] % (b.every * b.tpb)
	}
	return got, err
}

func (b *boundaries) Reserve(ctx context.Context, items []kvcache.ReserveItem) ([]kvcache.Grant, error) {
	for _, it := range items {
		if it.Reuse%(b.every*b.tpb) != 0 {
			return nil, fmt.Errorf("seq %d: reuse %d is not a multiple of %d blocks of %d tokens", it.Seq, it.Reuse, b.every, b.tpb)
		}
	}
	return b.Manager.Reserve(ctx, items)
}

// everyStage gives stage s a boundaries manager with every[s].
type everyStage []int

func (e everyStage) Manager(_ context.Context, s int) (kvcache.Manager, error) {
	return &boundaries{Manager: cachemgrv1.New(), every: e[s]}, nil
}

func (everyStage) Worker(context.Context, int) (worker.Worker, error) {
	return device.NewWorker(dsa.Backend), nil
}

// TestStagesAgreeOnReuse: when stages reuse at different granularities (3
// blocks and 2 blocks), the engine settles on a length valid on both (a
// multiple of 6 blocks) instead of the minimum of their answers, which one
// of them would refuse.
func TestStagesAgreeOnReuse(t *testing.T) {
	wl := genWorkload(t, 30, 288) // 9 blocks: stage answers 288 and 256 (min 256 is no multiple of 3 blocks)
	s := buildSpec(t, testSpec{pp: 2, draft: 1, reuse: true, policy: sched.GuaranteedNoEvict, cacheTokens: 1 << 16, reqs: wl, maxSeqLen: 2048})
	rep := runSpec(t, s, everyStage{3, 2})
	if rep.Requests.Completed != len(wl.Requests) || rep.Requests.Failed != 0 {
		t.Fatalf("requests = %+v, want all %d completed", rep.Requests, len(wl.Requests))
	}
	if rep.Tokens.PrefixReused == 0 {
		t.Error("prefix_reused = 0: the stages never agreed on a reusable length")
	}
	if r := rep.Tokens.PrefixReused % (6 * 32); r != 0 {
		t.Errorf("prefix_reused = %d, not a sum of multiples of 6 blocks of 32 tokens", rep.Tokens.PrefixReused)
	}
}
