package mamba

import (
	"context"
	"slices"
	"testing"

	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
)

// saltPrefill is prefill under cache salt salt; it also returns the
// sequence's attention and ssm tables while it is resident.
func saltPrefill(t *testing.T, m *Manager, id kvcache.SeqID, salt string, p []int32, chunk int) (int, [][]kvcache.BlockID) {
	t.Helper()
	look, err := m.Lookup(context.Background(), []kvcache.LookupItem{{Seq: id, Prompt: p, CacheSalt: salt}})
	if err != nil {
		t.Fatalf("Lookup: %v", err)
	}
	reuse := look[0]
	done := reuse
	for first := true; done < len(p); first = false {
		n := min(chunk, len(p)-done)
		it := kvcache.ReserveItem{Seq: id, Tokens: n}
		if first {
			it.New, it.Prompt, it.Reuse, it.CacheSalt = true, p, reuse, salt
		}
		if g := reserve(t, m, it); !g[0].OK {
			t.Fatalf("seq %d at %d: denied: %s", id, done, g[0].Reason)
		}
		commit(t, m, kvcache.CommitItem{Seq: id, Accepted: n})
		done += n
	}
	snap, err := m.Inspect(context.Background(), kvcache.InspectOptions{Tables: true})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range snap.Seqs {
		if s.Seq == id {
			return reuse, s.Tables
		}
	}
	t.Fatalf("seq %d not resident", id)
	return 0, nil
}

// TestCacheSaltIsolates: on the hybrid manager, a prompt reused at a
// snapshot boundary under its salt is not reused under another salt, and
// the two salts' sequences share no attention block and no state slot.
func TestCacheSaltIsolates(t *testing.T) {
	const tpb = 4
	m, _ := configured(t, testConfig(tpb, 64, 24))
	p := tokens(6*tpb+1, 1)
	if r, _ := saltPrefill(t, m, 1, "tenant-a", p, 2*tpb); r != 0 {
		t.Fatalf("first run reused %d", r)
	}
	release(t, m, 1)
	ra, ta := saltPrefill(t, m, 2, "tenant-a", p, 2*tpb)
	rb, tb := saltPrefill(t, m, 3, "tenant-b", p, 2*tpb)
	if ra != 6*tpb || rb != 0 {
		t.Fatalf("reused %d under the same salt and %d under another, want %d and 0", ra, rb, 6*tpb)
	}
	if r := lookup(t, m, p); r != 0 {
		t.Errorf("unsalted Lookup = %d, want 0", r)
	}
	for pool := range ta {
		for _, b := range tb[pool] {
			if slices.Contains(ta[pool], b) {
				t.Fatalf("pool %d: salts share block %d: %v and %v", pool, b, ta[pool], tb[pool])
			}
		}
	}
	release(t, m, 2, 3)
	if r, _ := saltPrefill(t, m, 4, "tenant-b", p, 2*tpb); r != 6*tpb {
		t.Errorf("second tenant-b run reused %d, want %d", r, 6*tpb)
	}
	mustClean(t, m, "after the salted runs")
}

// TestEventsReported: the hybrid manager reports its tree's stores.
func TestEventsReported(t *testing.T) {
	const tpb = 4
	cfg := testConfig(tpb, 64, 24)
	cfg.KVEvents = true
	m, _ := configured(t, cfg)
	saltPrefill(t, m, 1, "x", tokens(3*tpb+1, 1), tpb)
	evs, err := m.Events(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	stored := 0
	for _, e := range evs {
		if e.Kind == kvcache.BlockStored {
			stored += len(e.Hashes)
		}
	}
	if len(evs) == 0 || evs[0].Kind != kvcache.AllBlocksCleared || stored != 3 {
		t.Fatalf("events = %+v, want AllBlocksCleared then 3 blocks stored", evs)
	}
}
