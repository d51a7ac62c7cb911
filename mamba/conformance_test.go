package mamba

import (
	"context"
	"testing"

	"github.com/kvx-dev/kvx/plugins/conformance"
	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
	"github.com/kvx-dev/kvx/plugins/v1/pluginrpc"
)

// snapshotting configures the manager with a snapshot at every block
// boundary and at the prompt's end, and a pool_ratio that gives the
// attention groups attnShare of the budget: the conformance suite's configs
// carry no mamba_state_config.
type snapshotting struct {
	*Manager
	attnShare float64
}

func (s snapshotting) Configure(ctx context.Context, cfg kvcache.Config) (kvcache.Layout, error) {
	cfg.Snapshots = kvcache.SnapshotConfig{Interval: cfg.TokensPerBlock, OffsetsFromEnd: []int{0}}
	cfg.PoolRatio = []float64{s.attnShare, 1 - s.attnShare}
	return s.Manager.Configure(ctx, cfg)
}

// TestConformanceHybrid runs the v1 conformance suite on a hybrid stage
// (attention + mamba layers) with block reuse and snapshots. Live slots
// (MaxBatchSize) exceed the attention blocks, and the snapshot slots the
// tree nodes, so that only attention blocks can deny a reservation, as the
// suite's checks assume.
func TestConformanceHybrid(t *testing.T) {
	for _, wire := range []bool{false, true} {
		name := "inprocess"
		if wire {
			name = "grpc"
		}
		t.Run(name, func(t *testing.T) { conformanceHybrid(t, wire) })
	}
}

func conformanceHybrid(t *testing.T, wire bool) {
	const tpb, attnBlocks, slots = 16, 160, 400
	layers := hybridLayers(2, 2)
	blockBytes := int64(2 * kvPerToken * tpb)
	state := int64(2 * (convBytes + ssmBytes))
	a, s := int64(attnBlocks)*blockBytes, int64(slots)*state
	share := (float64(a) + 0.5*float64(blockBytes)) / float64(a+s)
	factory := func() kvcache.Manager {
		var m kvcache.Manager = snapshotting{New(), share}
		if wire {
			m = pluginrpc.TestManagerPair(t, m)
		}
		return m
	}
	conformance.TestManager(t, factory, conformance.ManagerOptions{
		Layers:         layers,
		TokensPerBlock: tpb,
		DeviceBytes:    a + s,
		MaxBatchSize:   attnBlocks + 8,
		Reuse:          true,
		Logf:           t.Logf,
	})
}

// TestConformanceAttentionOnly runs the suite on a stage without state
// layers (a pipeline stage of attention layers only): plain full-block reuse.
func TestConformanceAttentionOnly(t *testing.T) {
	conformance.TestManager(t, func() kvcache.Manager { return New() }, conformance.ManagerOptions{Reuse: true})
}
