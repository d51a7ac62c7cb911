package cachemgrv1

import (
	"strings"
	"testing"

	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
)

// holds is Lookup's answer for one prompt.
func holds(t *testing.T, m *Manager, p []int32) int {
	t.Helper()
	return lookup(t, m, p)[0]
}

// TestRetentionPriorityBeatsLRU: a's blocks (priority 80 for 1000 ns) are
// the least recently used, yet a request that needs two of the cached
// blocks evicts b's (default priority); once a's priority expired, a is
// evicted first again, as plain LRU would.
func TestRetentionPriorityBeatsLRU(t *testing.T) {
	for _, tc := range []struct {
		name    string
		prio    int
		evicted string // a's fate at 300
	}{{"priority 80", 80, ""}, {"default priority", 0, "lru"}} {
		t.Run(tc.name, func(t *testing.T) {
			m := configured(t, xcfg())
			a := prompt(4, []int32{1, 2}, 1, 1)
			b := prompt(4, []int32{3, 4}, 1, 2)
			c := prompt(4, []int32{10, 11, 12, 13, 14, 15}, 0, 0) // 6 blocks
			store(t, m, req{seq: 1, p: a, prio: tc.prio, dur: 1000, now: 100})
			store(t, m, req{seq: 2, p: b, now: 200})
			serve(t, m, req{seq: 3, p: c, now: 300}) // 4 free + 2 evicted
			if tc.evicted != "" {
				wantExplain(t, "a without priority", explain(t, m, a, "", 300), kvcache.Explanation{
					Miss: kvcache.MissEvicted, EvictedTier: kvcache.TierDevice, EvictedBy: tc.evicted, EvictedAt: 300})
				if got := holds(t, m, b); got != 8 {
					t.Fatalf("Lookup(b) = %d, want 8: LRU evicts a, the older", got)
				}
				return
			}
			if got := holds(t, m, a); got != 8 {
				t.Fatalf("Lookup(a) = %d, want 8: a's priority 80 outranks b's default", got)
			}
			wantExplain(t, "b", explain(t, m, b, "", 300), kvcache.Explanation{
				Miss: kvcache.MissEvicted, EvictedTier: kvcache.TierDevice, EvictedBy: "priority", EvictedAt: 300})
			release(t, m, 3) // c's 5 full blocks are cached, the most recent
			// At 2000 a's priority (until 1100) has expired: a is the least
			// recently used block again and goes first.
			serve(t, m, req{seq: 4, p: prompt(4, []int32{20, 21}, 0, 0), now: 2000})
			wantExplain(t, "a after expiry", explain(t, m, a, "", 2000), kvcache.Explanation{
				Miss: kvcache.MissEvicted, EvictedTier: kvcache.TierDevice, EvictedBy: "lru", EvictedAt: 2000})
			if got := holds(t, m, c); got != 20 {
				t.Fatalf("Lookup(c) = %d, want 20: c is more recent than the expired a", got)
			}
		})
	}
}

// TestRetentionRuleIsPrecise: a high-priority block elsewhere in the cache
// does not make an eviction "priority" when LRU would have chosen the same
// victim.
func TestRetentionRuleIsPrecise(t *testing.T) {
	m := configured(t, xcfg())
	a := prompt(4, []int32{1, 2}, 1, 1)
	b := prompt(4, []int32{3, 4}, 1, 2)
	store(t, m, req{seq: 1, p: a, now: 100})
	store(t, m, req{seq: 2, p: b, prio: 90, now: 200})
	serve(t, m, req{seq: 3, p: prompt(4, []int32{10, 11, 12, 13, 14, 15}, 0, 0), now: 300})
	wantExplain(t, "a", explain(t, m, a, "", 300), kvcache.Explanation{
		Miss: kvcache.MissEvicted, EvictedTier: kvcache.TierDevice, EvictedBy: "lru", EvictedAt: 300})
	if got := holds(t, m, b); got != 8 {
		t.Fatalf("Lookup(b) = %d, want 8", got)
	}
}

// TestRetentionReuseRaisesPriority: a default-priority prefix reused by a
// priority-90 request takes priority 90.
func TestRetentionReuseRaisesPriority(t *testing.T) {
	m := configured(t, xcfg())
	a := prompt(4, []int32{1, 2}, 1, 1)
	b := prompt(4, []int32{3, 4}, 1, 2)
	store(t, m, req{seq: 1, p: a, now: 100})
	store(t, m, req{seq: 2, p: a, prio: 90, now: 150}) // reuses a's 2 blocks
	store(t, m, req{seq: 3, p: b, now: 200})
	// a was released last (most recent): make b's blocks the older ones by
	// reusing nothing and checking that a survives anyway by priority.
	serve(t, m, req{seq: 4, p: prompt(4, []int32{10, 11, 12, 13, 14, 15}, 0, 0), now: 300})
	if got := holds(t, m, a); got != 8 {
		t.Fatalf("Lookup(a) = %d, want 8", got)
	}
	if got := explain(t, m, b, "", 300); got.Miss != kvcache.MissEvicted {
		t.Fatalf("Explain(b) = %+v, want evicted", got)
	}
	p := m.paged[0]
	for j := range 2 {
		blk, ok := p.lookup(m.h.chain(nil, "", a, 2)[j])
		if !ok || p.prio[blk] != 90 {
			t.Fatalf("a's block %d: registered %v, priority %d, want 90", j, ok, p.prio[blk])
		}
	}
}

// TestRetentionHostTier: priority travels with a block to the host tier,
// and the host tier too evicts the lowest priority first.
func TestRetentionHostTier(t *testing.T) {
	m := configured(t, hostConfig(3)) // 16 device blocks, 3 host blocks
	a := prompt(4, []int32{1}, 1, 1)  // 1 full block
	store(t, m, req{seq: 1, p: a, prio: 70, now: 100})
	fill := func(seq kvcache.SeqID, first int32, now int64) []int32 {
		labels := make([]int32, 8)
		for i := range labels {
			labels[i] = first + int32(i)
		}
		p := prompt(4, labels, 0, 0)
		serve(t, m, req{seq: seq, p: p, now: now})
		return p
	}
	p3 := fill(3, 10, 200) // 8 of 15 free blocks
	fill(4, 20, 300)       // 7 free + a's block, which goes to the host
	if ex := explain(t, m, a, "", 300); ex.Tokens != 4 || ex.HostTokens != 4 {
		t.Fatalf("Explain(a) = %+v, want 4 tokens on the host", ex)
	}
	if hb, ok := m.host[0].lookup(m.h.chain(nil, "", a, 1)[0]); !ok || m.host[0].prio[hb] != 70 {
		t.Fatalf("a on the host: held %v, priority %d, want 70", ok, m.host[0].prio[hb])
	}
	release(t, m, 3) // 8 cached device blocks, seq 3's last the oldest
	// b (priority 10): its 2 blocks evict seq 3's blocks 7 and 6 to the
	// host's 2 free blocks.
	b := prompt(4, []int32{2}, 1, 2)
	store(t, m, req{seq: 5, p: b, prio: 10, now: 400})
	// c's 3 blocks: 1 free + b's block (priority 10) and seq 3's block 5 go
	// to the host, which evicts seq 3's blocks 7 and 6 (default priority)
	// though a (70) is its least recently used.
	serve(t, m, req{seq: 6, p: prompt(4, []int32{40, 41, 42}, 0, 0), now: 500})
	if ex := explain(t, m, a, "", 500); ex.Tokens != 4 || ex.HostTokens != 4 {
		t.Fatalf("Explain(a) = %+v, want 4 tokens still on the host", ex)
	}
	wantExplain(t, "seq 3's prompt", explain(t, m, p3, "", 500), kvcache.Explanation{
		Tokens: 24, HostTokens: 4, Miss: kvcache.MissEvicted, EvictedTier: kvcache.TierHost, EvictedBy: "priority", EvictedAt: 500})
}

// TestLFUKeepsFrequentBlock: a is reused twice, b never; b is the more
// recent. LRU evicts a, LFU evicts b.
func TestLFUKeepsFrequentBlock(t *testing.T) {
	for _, pol := range []string{kvcache.EvictionLRU, kvcache.EvictionLFU} {
		t.Run(pol, func(t *testing.T) {
			cfg := xcfg()
			cfg.EvictionPolicy = pol
			m := configured(t, cfg)
			a := prompt(4, []int32{1, 2}, 1, 1)
			b := prompt(4, []int32{3, 4}, 1, 2)
			store(t, m, req{seq: 1, p: a, now: 100})
			store(t, m, req{seq: 2, p: a, now: 110}) // hit
			store(t, m, req{seq: 3, p: a, now: 120}) // hit
			store(t, m, req{seq: 4, p: b, now: 200})
			serve(t, m, req{seq: 5, p: prompt(4, []int32{10, 11, 12, 13, 14, 15}, 0, 0), now: 300})
			kept, lost := a, b
			if pol == kvcache.EvictionLRU {
				kept, lost = b, a
			}
			if got := holds(t, m, kept); got != 8 {
				t.Fatalf("%s: Lookup(kept) = %d, want 8", pol, got)
			}
			wantExplain(t, pol, explain(t, m, lost, "", 300), kvcache.Explanation{
				Miss: kvcache.MissEvicted, EvictedTier: kvcache.TierDevice, EvictedBy: pol, EvictedAt: 300})
		})
	}
}

func TestRetentionInvalidPriority(t *testing.T) {
	m := configured(t, xcfg())
	p := prompt(4, []int32{1}, 1, 1)
	for _, tc := range []struct {
		it   kvcache.ReserveItem
		want string
	}{
		{kvcache.ReserveItem{Seq: 1, New: true, Tokens: 5, Prompt: p, Priority: 101}, "Priority = 101; must be in [1, 100] (0 = default 35)"},
		{kvcache.ReserveItem{Seq: 1, New: true, Tokens: 5, Prompt: p, Priority: -1}, "Priority = -1; must be in [1, 100]"},
		{kvcache.ReserveItem{Seq: 1, New: true, Tokens: 5, Prompt: p, Priority: 50, PriorityDuration: -5}, "PriorityDuration = -5 ns; must be >= 0"},
	} {
		before := inspect(t, m)
		g := reserve(t, m, tc.it)[0]
		if g.OK || !strings.HasPrefix(g.Reason, "invalid: seq 1: ") || !strings.Contains(g.Reason, tc.want) {
			t.Fatalf("Reserve(%+v) = %+v, want an invalid denial with %q", tc.it, g, tc.want)
		}
		sameSnapshot(t, "a denied item", before, inspect(t, m))
	}
	for seq, prio := range []int{0, 1, 100} {
		mustGrant(t, m, kvcache.ReserveItem{Seq: kvcache.SeqID(10 + seq), New: true, Tokens: 5, Prompt: p, Priority: prio})
	}
}

// TestRetentionExpiryHeap: many durations, refreshed in time order.
func TestRetentionExpiryHeap(t *testing.T) {
	p := newPool(0, 0, 4, 16, true)
	for b := range 10 {
		blk := p.alloc()
		p.register(blk, hashOf(b))
		p.keep(int32(blk), 80, int64(100-5*b), 0)
		p.release(blk)
	}
	p.refresh(74) // expiries 55..100: 55, 60, 65, 70 are due
	got := 0
	for b := range 10 {
		if p.prio[b] == defaultLevel {
			got++
			if p.exp[b] != 0 || 100-5*b > 74 {
				t.Fatalf("block %d (expiry %d) fell back at 74", b, 100-5*b)
			}
		}
	}
	if got != 4 || p.nexp != 6 {
		t.Fatalf("after refresh(74): %d blocks at the default level, %d expiring; want 4 and 6", got, p.nexp)
	}
	// The expired ones keep their LRU order: block 0 was cached first but
	// still has priority 80, so the victim is block 6 (expiry 70, cached
	// before 7, 8, 9).
	if v := p.victim(); v != 6 {
		t.Fatalf("victim = %d, want 6", v)
	}
}

// TestHostTierRecomputedBlock: a request that computes blocks the host
// tier holds (Reuse 0) takes their hashes back at commit, with the host
// copy's priority when higher; the host blocks become free.
func TestHostTierRecomputedBlock(t *testing.T) {
	m := configured(t, hostConfig(8)) // room for a and the 3 blocks a's recomputation offloads
	a := prompt(4, []int32{1, 2}, 1, 1)
	store(t, m, req{seq: 1, p: a, prio: 60, now: 100})
	serve(t, m, req{seq: 2, p: prompt(4, []int32{10, 11, 12, 13, 14, 15, 16, 17}, 0, 0), now: 200})
	serve(t, m, req{seq: 3, p: prompt(4, []int32{20, 21, 22, 23, 24, 25, 26, 27}, 0, 0), now: 300}) // a → host
	if ex := explain(t, m, a, "", 300); ex.HostTokens != 8 {
		t.Fatalf("Explain(a) = %+v, want 8 tokens on the host", ex)
	}
	release(t, m, 2, 3)
	free := len(m.host[0].free)
	g := mustGrant(t, m, kvcache.ReserveItem{Seq: 4, New: true, Tokens: len(a), Prompt: a, Now: 400}) // recompute, no reuse
	commit(t, m, 4, len(a))
	noViolations(t, m)
	if ex := explain(t, m, a, "", 400); ex.Tokens != 8 || ex.HostTokens != 0 {
		t.Fatalf("Explain(a) after recomputing it = %+v, want 8 tokens on the device", ex)
	}
	hashes := m.h.chain(nil, "", a, 2)
	for j, h := range hashes {
		b, ok := m.paged[0].lookup(h)
		if !ok || m.paged[0].prio[b] != 60 {
			t.Fatalf("a's block %d on the device: registered %v, priority %d, want 60 (the host copy's)", j, ok, m.paged[0].prio[b])
		}
		if _, ok := m.host[0].lookup(h); ok {
			t.Fatalf("a's block %d is still registered on the host", j)
		}
	}
	// The grant's copies are offloads into free host blocks; the commit
	// freed a's 2.
	if got, want := len(m.host[0].free), free-len(g.Copies)+2; got != want {
		t.Fatalf("host free blocks %d after %d offloads and the device took a's 2 hashes back, want %d", got, len(g.Copies), want)
	}
}
