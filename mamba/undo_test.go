package mamba

import (
	"context"
	"testing"

	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
)

// An Unreserve gives the attention pages its reservation evicted back to the
// tree (cachemgr_v2/undo.go), but not the snapshots the eviction dropped:
// the stage stays consistent, Lookup stops at the last node that still has
// a snapshot, and a sequence reuses that far. (With a host tier the
// snapshots it offloaded are dropped too: TestUnreserveDropsOffloads.)
func TestUnreservePutsBackPagesNotSnapshots(t *testing.T) {
	const tpb = 16
	ctx := context.Background()
	m, _ := configured(t, testConfig(tpb, 34, 4+8))
	p := tokens(5*tpb+3, 1)
	prefill(t, m, 1, p, 4*tpb)
	release(t, m, 1)
	if n := lookup(t, m, p); n != 5*tpb {
		t.Fatalf("Lookup = %d after caching p, want %d", n, 5*tpb)
	}
	// 32 blocks: 29 free and the last 3 prompt blocks, with their snapshots.
	reserve(t, m, kvcache.ReserveItem{Seq: 2, New: true, Tokens: 1, Hold: 32 * tpb})
	if n := lookup(t, m, p); n != 2*tpb {
		t.Fatalf("Lookup = %d while seq 2 holds the blocks, want %d", n, 2*tpb)
	}
	if err := m.Unreserve(ctx, []kvcache.SeqID{2}); err != nil {
		t.Fatal(err)
	}
	mustClean(t, m, "after Unreserve")
	st, _ := m.Stats(ctx)
	if st.Pools[0].Cached != 5 {
		t.Fatalf("attention pool after Unreserve %+v, want the 5 prompt blocks cached again", st.Pools[0])
	}
	if n := lookup(t, m, p); n != 2*tpb {
		t.Fatalf("Lookup = %d after Unreserve, want %d (the snapshots of blocks 3 to 5 were dropped)", n, 2*tpb)
	}
	if reused := prefill(t, m, 3, p, 4*tpb); reused != 2*tpb {
		t.Fatalf("seq 3 reused %d, want %d", reused, 2*tpb)
	}
	mustClean(t, m, "after seq 3")
}
