package cachemgrv1

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
)

// xcfg: one full-attention pool of 8 blocks of 4 tokens, reuse on, no
// drafts, max_seq_len 32 (one request may take the whole pool).
func xcfg() kvcache.Config {
	c := smallConfig(4, 8)
	c.MaxSeqLen = 32
	c.MaxDraftTokens = 0
	c.EnableBlockReuse = true
	return c
}

// req is one scripted request: served whole (Lookup's reuse, the rest
// computed and committed) at engine time now.
type req struct {
	seq  kvcache.SeqID
	p    []int32
	salt string
	prio int
	dur  int64
	now  int64
}

// serve reserves r (reusing what Lookup offers) and commits it; the
// sequence stays live.
func serve(t *testing.T, m *Manager, r req) kvcache.Grant {
	t.Helper()
	n, err := m.Lookup(bg, []kvcache.LookupItem{{Seq: r.seq, Prompt: r.p, CacheSalt: r.salt, Now: r.now}})
	if err != nil {
		t.Fatalf("Lookup: %v", err)
	}
	g := mustGrant(t, m, kvcache.ReserveItem{Seq: r.seq, New: true, Tokens: len(r.p) - n[0], Reuse: n[0], Prompt: r.p,
		CacheSalt: r.salt, Priority: r.prio, PriorityDuration: r.dur, Now: r.now})
	commit(t, m, r.seq, len(r.p)-n[0])
	noViolations(t, m)
	return g
}

// store serves r and releases it: its full prompt blocks stay cached.
func store(t *testing.T, m *Manager, r req) {
	t.Helper()
	serve(t, m, r)
	release(t, m, r.seq)
	noViolations(t, m)
}

// explain explains one lookup and checks that Tokens is Lookup's answer.
func explain(t *testing.T, m *Manager, p []int32, salt string, now int64) kvcache.Explanation {
	t.Helper()
	it := []kvcache.LookupItem{{Seq: 999, Prompt: p, CacheSalt: salt, Now: now}}
	before := inspect(t, m)
	ex, err := m.Explain(bg, it)
	if err != nil || len(ex) != 1 {
		t.Fatalf("Explain = %v, %v", ex, err)
	}
	sameSnapshot(t, "Explain", before, inspect(t, m))
	n, err := m.Lookup(bg, it)
	if err != nil {
		t.Fatal(err)
	}
	if ex[0].Tokens != n[0] {
		t.Fatalf("Explain Tokens = %d, Lookup = %d", ex[0].Tokens, n[0])
	}
	return ex[0]
}

func wantExplain(t *testing.T, what string, got, want kvcache.Explanation) {
	t.Helper()
	if got != want {
		t.Fatalf("%s: Explain = %+v (%s), want %+v (%s)", what, got, got.Miss, want, want.Miss)
	}
}

func TestExplainNeverStoredAndPartialBlock(t *testing.T) {
	m := configured(t, xcfg())
	a := prompt(4, []int32{1, 2}, 1, 1) // 9 tokens: 2 full blocks + 1
	wantExplain(t, "empty cache", explain(t, m, a, "", 0), kvcache.Explanation{Miss: kvcache.MissNeverStored})
	store(t, m, req{seq: 1, p: a})
	wantExplain(t, "stored", explain(t, m, a, "", 0), kvcache.Explanation{Tokens: 8, Miss: kvcache.MissPartialBlock})
	// A prompt of exactly two blocks may reuse only the first: the last
	// token's logits are computed.
	wantExplain(t, "exact blocks", explain(t, m, prompt(4, []int32{1, 2}, 0, 0), "", 0),
		kvcache.Explanation{Tokens: 4, Miss: kvcache.MissPartialBlock})
	wantExplain(t, "short prompt", explain(t, m, prompt(4, nil, 3, 2), "", 0),
		kvcache.Explanation{Miss: kvcache.MissPartialBlock})
	wantExplain(t, "diverging", explain(t, m, prompt(4, []int32{1, 3}, 1, 3), "", 0),
		kvcache.Explanation{Tokens: 4, Miss: kvcache.MissNeverStored})
}

func TestExplainReuseOff(t *testing.T) {
	cfg := xcfg()
	cfg.EnableBlockReuse = false
	m := configured(t, cfg)
	a := prompt(4, []int32{1, 2}, 1, 1)
	store(t, m, req{seq: 1, p: a})
	wantExplain(t, "reuse off", explain(t, m, a, "", 0), kvcache.Explanation{Miss: kvcache.MissReuseOff})
}

// TestExplainEvictedFromDevice: without a host tier, a's blocks vanish when
// a larger request needs the pool; Explain says when (the Now of that
// Reserve) and by which rule.
func TestExplainEvictedFromDevice(t *testing.T) {
	m := configured(t, xcfg())
	a := prompt(4, []int32{1, 2}, 1, 1)
	store(t, m, req{seq: 1, p: a, now: 100})
	serve(t, m, req{seq: 2, p: prompt(4, []int32{10, 11, 12, 13, 14, 15, 16, 17}, 0, 0), now: 200}) // 8 blocks: evicts a's 2
	wantExplain(t, "evicted", explain(t, m, a, "", 300), kvcache.Explanation{
		Miss: kvcache.MissEvicted, EvictedTier: kvcache.TierDevice, EvictedBy: "lru", EvictedAt: 200})
}

// TestExplainEvictedFromHost: a's blocks go to a host tier of 2 blocks,
// then the host tier evicts them to take another request's.
func TestExplainEvictedFromHost(t *testing.T) {
	m := configured(t, hostConfig(2)) // 16 device blocks of 4 tokens, 2 host blocks
	a := prompt(4, []int32{1, 2}, 1, 1)
	store(t, m, req{seq: 1, p: a, now: 100})
	b := prompt(4, []int32{10, 11, 12, 13, 14, 15, 16, 17}, 0, 0)
	c := prompt(4, []int32{20, 21, 22, 23, 24, 25, 26, 27}, 0, 0)
	serve(t, m, req{seq: 2, p: b, now: 200}) // 8 of the 14 free blocks
	serve(t, m, req{seq: 3, p: c, now: 300}) // 6 free + a's 2, which go to the host
	wantExplain(t, "on the host", explain(t, m, a, "", 300),
		kvcache.Explanation{Tokens: 8, HostTokens: 8, Miss: kvcache.MissPartialBlock})
	release(t, m, 2, 3)
	// d evicts b's blocks from the device; the first two take the host's
	// blocks (evicting a's), the others vanish: the host's blocks are all
	// pending until d commits.
	d := prompt(4, []int32{30, 31, 32, 33, 34, 35, 36, 37}, 0, 0)
	serve(t, m, req{seq: 4, p: d, now: 400})
	wantExplain(t, "evicted from the host", explain(t, m, a, "", 500), kvcache.Explanation{
		Miss: kvcache.MissEvicted, EvictedTier: kvcache.TierHost, EvictedBy: "lru", EvictedAt: 400})
	// b's first block was among those the host could not take.
	wantExplain(t, "refused by the host", explain(t, m, b, "", 500), kvcache.Explanation{
		Miss: kvcache.MissEvicted, EvictedTier: kvcache.TierDevice, EvictedBy: "lru", EvictedAt: 400})
}

// TestExplainHostTokensAndHostReused: a prefix half on the device and half
// on the host: Explain counts the host half, and the grant that reuses it
// says the same and carries one promotion per host block.
func TestExplainHostTokensAndHostReused(t *testing.T) {
	m := New()
	lay, err := m.Configure(bg, hostConfig(8))
	if err != nil {
		t.Fatal(err)
	}
	hostPool := lay.Pools[1].ID
	if lay.Pools[1].Tier != kvcache.TierHost {
		t.Fatalf("pool 1 is %+v, want the host pool", lay.Pools[1])
	}
	a := prompt(4, []int32{1, 2, 3, 4}, 1, 1) // 4 full blocks + 1
	store(t, m, req{seq: 1, p: a, now: 100})
	serve(t, m, req{seq: 2, p: prompt(4, []int32{10, 11, 12, 13, 14, 15, 16, 17}, 0, 0), now: 200})
	serve(t, m, req{seq: 3, p: prompt(4, []int32{20, 21, 22, 23, 24, 25}, 0, 0), now: 300}) // 4 free + a's last 2 → host
	wantExplain(t, "split prefix", explain(t, m, a, "", 300),
		kvcache.Explanation{Tokens: 16, HostTokens: 8, Miss: kvcache.MissPartialBlock})
	release(t, m, 2, 3)
	g := mustGrant(t, m, kvcache.ReserveItem{Seq: 4, New: true, Tokens: 1, Reuse: 16, Prompt: a, Now: 400})
	promotions := 0
	for _, c := range g.Copies {
		if c.SrcPool == hostPool {
			promotions++
		}
	}
	if g.HostReused != 8 || promotions != 2 {
		t.Fatalf("Reserve(Reuse 16) = HostReused %d with %d promotions (%+v), want 8 and 2", g.HostReused, promotions, g.Copies)
	}
	commit(t, m, 4, 1)
	// Now all of a is on the device: reusing it again copies nothing.
	g = mustGrant(t, m, kvcache.ReserveItem{Seq: 5, New: true, Tokens: 1, Reuse: 16, Prompt: a, Now: 500})
	if g.HostReused != 0 {
		t.Fatalf("Reserve(Reuse 16) of a device-held prefix = HostReused %d, want 0", g.HostReused)
	}
	noViolations(t, m)
}

func TestExplainCacheSalt(t *testing.T) {
	m := configured(t, xcfg())
	a := prompt(4, []int32{1, 2}, 1, 1)
	store(t, m, req{seq: 1, p: a, salt: "x"})
	wantExplain(t, "unsalted lookup of a salted prefix", explain(t, m, a, "", 0), kvcache.Explanation{Miss: kvcache.MissCacheSalt})
	wantExplain(t, "another salt", explain(t, m, a, "y", 0), kvcache.Explanation{Miss: kvcache.MissCacheSalt})
	wantExplain(t, "its own salt", explain(t, m, a, "x", 0), kvcache.Explanation{Tokens: 8, Miss: kvcache.MissPartialBlock})
	d := prompt(4, []int32{5, 6}, 1, 2)
	store(t, m, req{seq: 2, p: d})
	wantExplain(t, "salted lookup of an unsalted prefix", explain(t, m, d, "x", 0), kvcache.Explanation{Miss: kvcache.MissCacheSalt})
	wantExplain(t, "never stored under any salt", explain(t, m, prompt(4, []int32{7}, 1, 3), "x", 0),
		kvcache.Explanation{Miss: kvcache.MissNeverStored})
	// Evicting the salted blocks ends the salt explanation.
	serve(t, m, req{seq: 3, p: prompt(4, []int32{10, 11, 12, 13, 14, 15, 16, 17}, 0, 0), now: 50})
	if got := explain(t, m, a, "", 60).Miss; got != kvcache.MissNeverStored {
		t.Fatalf("after the salted blocks were evicted, Explain(a unsalted) = %s, want never_stored", got)
	}
}

func TestExplainInFlight(t *testing.T) {
	m := configured(t, xcfg())
	a := prompt(4, []int32{1, 2, 3}, 1, 1) // 13 tokens
	mustGrant(t, m, kvcache.ReserveItem{Seq: 1, New: true, Tokens: 4, Prompt: a})
	wantExplain(t, "first chunk reserved", explain(t, m, a, "", 0), kvcache.Explanation{Miss: kvcache.MissInFlight})
	commit(t, m, 1, 4)
	wantExplain(t, "first block committed", explain(t, m, a, "", 0), kvcache.Explanation{Tokens: 4, Miss: kvcache.MissInFlight})
	mustGrant(t, m, kvcache.ReserveItem{Seq: 1, Tokens: 9})
	commit(t, m, 1, 9)
	wantExplain(t, "prompt committed", explain(t, m, a, "", 0), kvcache.Explanation{Tokens: 12, Miss: kvcache.MissPartialBlock})
	// An undone reservation leaves nothing in flight.
	b := prompt(4, []int32{5, 6}, 1, 2)
	mustGrant(t, m, kvcache.ReserveItem{Seq: 2, New: true, Tokens: len(b), Prompt: b})
	if got := explain(t, m, b, "", 0).Miss; got != kvcache.MissInFlight {
		t.Fatalf("Explain(b) while b is reserved = %s, want in_flight", got)
	}
	if err := m.Unreserve(bg, []kvcache.SeqID{2}); err != nil {
		t.Fatal(err)
	}
	wantExplain(t, "after Unreserve", explain(t, m, b, "", 0), kvcache.Explanation{Miss: kvcache.MissNeverStored})
}

// TestExplainGhostForgets: the ghost record keeps the latest evictions
// only; a forgotten one reads as never_stored.
func TestExplainGhostForgets(t *testing.T) {
	g := newGhost(2)
	for i := range 3 {
		g.add(hashOf(i), kvcache.TierDevice, ruleLRU, int64(i))
	}
	if _, ok := g.find(hashOf(0)); ok {
		t.Fatalf("a ghost record of 2 remembers the first of 3 evictions")
	}
	for i := 1; i < 3; i++ {
		if e, ok := g.find(hashOf(i)); !ok || e.when != int64(i) {
			t.Fatalf("ghost find(%d) = %+v %v, want the eviction at %d", i, e, ok, i)
		}
	}
	g.add(hashOf(1), kvcache.TierHost, rulePriority, 9) // evicted again: the entry moves to the back
	g.add(hashOf(3), kvcache.TierDevice, ruleLRU, 10)
	if e, ok := g.find(hashOf(1)); !ok || e.when != 9 || e.tier != kvcache.TierHost || e.by != rulePriority {
		t.Fatalf("ghost find(1) = %+v %v, want the re-eviction at 9", e, ok)
	}
	if _, ok := g.find(hashOf(2)); ok {
		t.Fatalf("ghost remembers 3 evictions with room for 2")
	}
	m := configured(t, xcfg())
	if want := ghostsPerBlock * 8; m.ghosts[0].cap != want {
		t.Fatalf("ghost record of an 8-block pool holds %d, want %d", m.ghosts[0].cap, want)
	}
}

func TestConfigureEvictionPolicy(t *testing.T) {
	for _, pol := range []string{"", kvcache.EvictionLRU, kvcache.EvictionLFU} {
		cfg := xcfg()
		cfg.EvictionPolicy = pol
		m := configured(t, cfg)
		if lfu := pol == kvcache.EvictionLFU; m.paged[0].lfu != lfu {
			t.Fatalf("policy %q: pool LFU = %v", pol, m.paged[0].lfu)
		}
	}
	cfg := xcfg()
	cfg.EvictionPolicy = "mru"
	_, err := New().Configure(bg, cfg)
	if !errors.Is(err, kvcache.ErrInvalidConfig) || !strings.Contains(err.Error(), `eviction_policy = "mru"`) ||
		!strings.Contains(err.Error(), "lru, lfu") {
		t.Fatalf("Configure(eviction_policy mru) = %v, want ErrInvalidConfig naming the value and lru, lfu", err)
	}
	info, err := New().Info(bg)
	if err != nil {
		t.Fatal(err)
	}
	if c := info.Capabilities; !c.Explain || !c.Retention || !slices.Equal(c.EvictionPolicies, []string{"lru", "lfu"}) {
		t.Fatalf("Info capabilities %+v, want Explain, Retention and policies [lru lfu]", c)
	}
}

// TestGhostAgainstModel: the ghost record's index against a plain model
// (the last cap evictions; a hash's latest one counts), with hashes that
// collide in the index often.
func TestGhostAgainstModel(t *testing.T) {
	const capacity = 50
	g := newGhost(capacity)
	var model []ghostEntry // oldest first
	r := newLCG(7)
	for step := range 20000 {
		h := hashOf(r.n(120))
		h.Lo *= 64 // share low bits: long probe runs
		model = append(model, ghostEntry{h: h, when: int64(step)})
		if len(model) > capacity {
			model = model[1:]
		}
		g.add(h, kvcache.TierDevice, ruleLRU, int64(step))
		if step%97 != 0 {
			continue
		}
		distinct := map[uint64]bool{}
		for _, e := range model {
			distinct[e.h.Lo] = true
		}
		if g.live != len(distinct) {
			t.Fatalf("step %d: ghost holds %d hashes, model %d", step, g.live, len(distinct))
		}
		for i := range 120 {
			q := hashOf(i)
			q.Lo *= 64
			j := -1 // the latest eviction of q in the model
			for k, e := range model {
				if e.h == q {
					j = k
				}
			}
			e, ok := g.find(q)
			if ok != (j >= 0) || ok && e.when != model[j].when {
				t.Fatalf("step %d: find(%d) = %+v %v, model has it: %v", step, i, e, ok, j >= 0)
			}
		}
	}
}
