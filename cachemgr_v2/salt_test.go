package cachemgrv2

import (
	"slices"
	"testing"

	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
)

func saltLookup(t *testing.T, m *Manager, salt string, p []int32) int {
	t.Helper()
	got, err := m.Lookup(ctx, []kvcache.LookupItem{{Seq: 99, Prompt: p, CacheSalt: salt}})
	if err != nil {
		t.Fatalf("Lookup: %v", err)
	}
	return got[0]
}

// saltRun computes p as new sequence seq under salt, reusing what Lookup
// offers, and commits it; it returns the tokens reused and its table.
func saltRun(t *testing.T, m *Manager, seq kvcache.SeqID, salt string, p []int32) (int, []kvcache.BlockID) {
	t.Helper()
	r := saltLookup(t, m, salt, p)
	mustGrant(t, m, kvcache.ReserveItem{Seq: seq, New: true, Tokens: len(p) - r, Prompt: p, Reuse: r, CacheSalt: salt})
	mustCommit(t, m, seq, len(p)-r)
	return r, seqState(t, inspect(t, m), seq).Tables[0]
}

// TestCacheSaltIsolates: the same prompt under two salts shares no node and
// no page; within a salt it is fully reused; with partial reuse on, a salt
// does not even match part of another salt's first block.
func TestCacheSaltIsolates(t *testing.T) {
	for _, partial := range []bool{false, true} {
		m := New()
		m.partial = partial
		if _, err := m.Configure(ctx, smallCfg(32, 0)); err != nil {
			t.Fatal(err)
		}
		p := tokens(13, 1) // 3 full blocks of 4 + 1
		if r, _ := saltRun(t, m, 1, "tenant-a", p); r != 0 {
			t.Fatalf("partial %v: first run reused %d", partial, r)
		}
		m.Release(ctx, []kvcache.SeqID{1})
		for _, tc := range []struct {
			salt string
			want int
		}{{"tenant-a", 12}, {"tenant-b", 0}, {"", 0}} {
			if got := saltLookup(t, m, tc.salt, p); got != tc.want {
				t.Errorf("partial %v: Lookup(salt %q) = %d, want %d", partial, tc.salt, got, tc.want)
			}
		}
		if g := reserve1(t, m, kvcache.ReserveItem{Seq: 2, New: true, Tokens: 1, Prompt: p, Reuse: 12, CacheSalt: "tenant-b"}); g.OK {
			t.Fatalf("partial %v: Reserve(Reuse 12 under another salt) granted", partial)
		}
		ra, ta := saltRun(t, m, 3, "tenant-a", p)
		rb, tb := saltRun(t, m, 4, "tenant-b", p)
		if ra != 12 || rb != 0 {
			t.Fatalf("partial %v: reused %d (same salt) and %d (other salt), want 12 and 0", partial, ra, rb)
		}
		for _, b := range tb {
			if slices.Contains(ta, b) {
				t.Fatalf("partial %v: salts share block %d: %v and %v", partial, b, ta, tb)
			}
		}
		if r, _ := saltRun(t, m, 5, "tenant-b", p); r != 12 {
			t.Errorf("partial %v: second tenant-b run reused %d, want 12", partial, r)
		}
		// Each salt has its own first node; the unsalted tree has none.
		if m.tree.Child(m.tree.Root(), p[:4]) != nil {
			t.Errorf("partial %v: an unsalted node holds a salted block", partial)
		}
		na, nb := m.tree.SaltedChild(m.tree.Root(), "tenant-a", p[:4]), m.tree.SaltedChild(m.tree.Root(), "tenant-b", p[:4])
		if na == nil || nb == nil || na == nb {
			t.Errorf("partial %v: first nodes %p and %p, want two distinct nodes", partial, na, nb)
		}
	}
}

// TestEventsStoreAndEvict: with KVEvents the tree reports AllBlocksCleared at
// Configure, stores with the nodes' chain hashes (the salt's first), and
// removes on eviction.
func TestEventsStoreAndEvict(t *testing.T) {
	cfg := smallCfg(10, 0)
	cfg.KVEvents = true
	m, _ := configure(t, cfg)
	if evs, _ := m.Events(ctx); len(evs) != 1 || evs[0].Kind != kvcache.AllBlocksCleared {
		t.Fatalf("events after Configure = %+v, want AllBlocksCleared", evs)
	}
	p := tokens(13, 1)
	saltRun(t, m, 1, "s", p)
	var want []uint64
	n := m.tree.Root()
	for i := range 3 {
		n = m.tree.SaltedChild(n, "s", p[4*i:4*i+4])
		want = append(want, n.ChainHash())
	}
	evs, _ := m.Events(ctx)
	if len(evs) != 1 || evs[0].Kind != kvcache.BlockStored || !slices.Equal(evs[0].Hashes, want) || evs[0].HasParent ||
		!slices.Equal(evs[0].Tokens, p[:12]) || evs[0].BlockSize != 4 {
		t.Fatalf("events = %+v, want one BlockStored of %v", evs, want)
	}
	// The same tokens unsalted hash differently.
	saltRun(t, m, 2, "", p)
	evs, _ = m.Events(ctx)
	if len(evs) != 1 || evs[0].Kind != kvcache.BlockStored || slices.ContainsFunc(evs[0].Hashes, func(h uint64) bool { return slices.Contains(want, h) }) {
		t.Fatalf("unsalted store = %+v, want hashes other than %v", evs, want)
	}
	m.Release(ctx, []kvcache.SeqID{1, 2})
	// 6 cached of 10 blocks; fresh sequences of 16, 16 and 8 tokens need all 10.
	saltRun(t, m, 3, "", tokens(16, 3))
	saltRun(t, m, 4, "", tokens(16, 4))
	saltRun(t, m, 5, "", tokens(8, 5))
	evs, _ = m.Events(ctx)
	var removed []uint64
	for _, e := range evs {
		if e.Kind == kvcache.BlockRemoved {
			removed = append(removed, e.Hashes...)
		}
	}
	for _, h := range want {
		if !slices.Contains(removed, h) {
			t.Fatalf("events %+v: salted block %x not removed", evs, h)
		}
	}
	if len(removed) != 6 {
		t.Fatalf("removed %d blocks, want the 6 cached", len(removed))
	}
}
