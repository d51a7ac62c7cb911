package cachemgrv2

import (
	"errors"
	"reflect"
	"slices"
	"strings"
	"testing"

	"pgregory.net/rapid"

	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
	"github.com/kvx-dev/kvx/plugins/v1/spec"
)

// tiny is a stage of one pool group of 6 blocks of 4 tokens: three 2-block
// prompts fill it.
func tiny(t *testing.T, policy string, reuse bool) *Manager {
	t.Helper()
	layers := []spec.Layer{gqaLayer(0, 0)}
	m, lay := configure(t, kvcache.Config{
		Layers: layers, TokensPerBlock: 4, DeviceBytes: 6 * stageBlockBytes(layers, 4),
		MaxBatchSize: 2, MaxNumTokens: 12, MaxSeqLen: 12, EnableBlockReuse: reuse, EvictionPolicy: policy,
	})
	if lay.Pools[0].Blocks != 6 {
		t.Fatalf("pool of %d blocks, want 6", lay.Pools[0].Blocks)
	}
	return m
}

// store runs a new sequence through prompt p (one chunk) at now with the
// given retention and releases it, leaving its full blocks cached.
func store(t *testing.T, m *Manager, id kvcache.SeqID, p []int32, salt string, prio int, dur, now int64) {
	t.Helper()
	mustGrant(t, m, kvcache.ReserveItem{Seq: id, Tokens: len(p), New: true, Prompt: p, CacheSalt: salt,
		Priority: prio, PriorityDuration: dur, Now: now})
	mustCommit(t, m, id, len(p))
	if err := m.Release(ctx, []kvcache.SeqID{id}); err != nil {
		t.Fatal(err)
	}
	inspect(t, m)
}

// reuseOnce runs a new sequence that reuses what Lookup offers of p (and
// computes one token), then releases it.
func reuseOnce(t *testing.T, m *Manager, id kvcache.SeqID, p []int32, now int64) {
	t.Helper()
	n, err := m.Lookup(ctx, []kvcache.LookupItem{{Seq: id, Prompt: p, Now: now}})
	if err != nil || n[0] != len(p)-1 {
		t.Fatalf("Lookup = %v, %v, want %d", n, err, len(p)-1)
	}
	mustGrant(t, m, kvcache.ReserveItem{Seq: id, Tokens: 1, New: true, Prompt: p, Reuse: n[0], Now: now})
	mustCommit(t, m, id, 1)
	if err := m.Release(ctx, []kvcache.SeqID{id}); err != nil {
		t.Fatal(err)
	}
}

// explain1 explains prompt p under salt at now, checking that Tokens is what
// Lookup says and that nothing changed.
func explain1(t *testing.T, m *Manager, p []int32, salt string, now int64) kvcache.Explanation {
	t.Helper()
	before := inspect(t, m)
	items := []kvcache.LookupItem{{Seq: 99, Prompt: p, CacheSalt: salt, Now: now}}
	ex, err := m.Explain(ctx, items)
	if err != nil || len(ex) != 1 {
		t.Fatalf("Explain = %v, %v", ex, err)
	}
	look, err := m.Lookup(ctx, items)
	if err != nil || look[0] != ex[0].Tokens {
		t.Fatalf("Explain Tokens %d, Lookup %v (%v)", ex[0].Tokens, look, err)
	}
	if after := inspect(t, m); !reflect.DeepEqual(after, before) {
		t.Fatalf("Explain changed the state:\n%+v\n%+v", before, after)
	}
	return ex[0]
}

func want(t *testing.T, what string, got, want kvcache.Explanation) {
	t.Helper()
	if got != want {
		t.Fatalf("%s: Explain = %+v, want %+v", what, got, want)
	}
}

// probe is p plus one token, so that all of p's full blocks may be reused.
func probe(p []int32) []int32 { return append(slices.Clone(p), 7) }

func TestExplainNeverStoredPartialBlockReuseOff(t *testing.T) {
	m := tiny(t, "", true)
	a := tokens(8, 1)
	want(t, "empty cache", explain1(t, m, probe(a), "", 10), kvcache.Explanation{Miss: kvcache.MissNeverStored})
	store(t, m, 1, a, "", 0, 0, 20)
	want(t, "all full blocks cached", explain1(t, m, probe(a), "", 30), kvcache.Explanation{Tokens: 8, Miss: kvcache.MissPartialBlock})
	// a itself: its last token must be computed, so only block 0 is offered.
	want(t, "prompt of exactly two blocks", explain1(t, m, a, "", 30), kvcache.Explanation{Tokens: 4, Miss: kvcache.MissPartialBlock})
	want(t, "one token", explain1(t, m, a[:1], "", 30), kvcache.Explanation{Miss: kvcache.MissPartialBlock})
	// Block 1 differs: never stored.
	b := append(slices.Clone(a[:4]), tokens(5, 2)...)
	want(t, "second block differs", explain1(t, m, b, "", 30), kvcache.Explanation{Tokens: 4, Miss: kvcache.MissNeverStored})

	off := tiny(t, "", false)
	want(t, "reuse off", explain1(t, off, probe(a), "", 0), kvcache.Explanation{Miss: kvcache.MissReuseOff})
}

func TestExplainCacheSalt(t *testing.T) {
	m := tiny(t, "", true)
	a := tokens(8, 1)
	store(t, m, 1, a, "alice", 0, 0, 10)
	want(t, "same salt", explain1(t, m, probe(a), "alice", 20), kvcache.Explanation{Tokens: 8, Miss: kvcache.MissPartialBlock})
	want(t, "no salt", explain1(t, m, probe(a), "", 20), kvcache.Explanation{Miss: kvcache.MissCacheSalt})
	want(t, "other salt", explain1(t, m, probe(a), "bob", 20), kvcache.Explanation{Miss: kvcache.MissCacheSalt})
	store(t, m, 2, tokens(8, 2), "", 0, 0, 30)
	want(t, "unsalted block under a salt", explain1(t, m, probe(tokens(8, 2)), "alice", 40), kvcache.Explanation{Miss: kvcache.MissCacheSalt})
	// Only the first block is checked for another salt: a miss further on
	// is never stored.
	b := append(slices.Clone(a[:4]), tokens(5, 3)...)
	want(t, "second block, same salt", explain1(t, m, b, "alice", 40), kvcache.Explanation{Tokens: 4, Miss: kvcache.MissNeverStored})
}

func TestExplainInFlight(t *testing.T) {
	m := tiny(t, "", true)
	p := tokens(12, 5)
	mustGrant(t, m, kvcache.ReserveItem{Seq: 1, Tokens: 4, New: true, Prompt: p, Now: 10})
	want(t, "first chunk reserved", explain1(t, m, probe(p), "", 10), kvcache.Explanation{Miss: kvcache.MissInFlight})
	want(t, "in flight under another salt", explain1(t, m, probe(p), "alice", 10), kvcache.Explanation{Miss: kvcache.MissNeverStored})
	mustCommit(t, m, 1, 4)
	want(t, "block 0 committed", explain1(t, m, probe(p), "", 20), kvcache.Explanation{Tokens: 4, Miss: kvcache.MissInFlight})
	q := append(slices.Clone(p[:4]), tokens(9, 6)...)
	want(t, "another block 1", explain1(t, m, q, "", 20), kvcache.Explanation{Tokens: 4, Miss: kvcache.MissNeverStored})
	mustGrant(t, m, kvcache.ReserveItem{Seq: 1, Tokens: 8, Now: 30})
	mustCommit(t, m, 1, 8)
	want(t, "all committed", explain1(t, m, probe(p), "", 30), kvcache.Explanation{Tokens: 12, Miss: kvcache.MissPartialBlock})

	// A sequence released after its first chunk never stored the rest.
	r := tokens(8, 7)
	mustGrant(t, m, kvcache.ReserveItem{Seq: 2, Tokens: 4, New: true, Prompt: r, Now: 40})
	mustCommit(t, m, 2, 4)
	if err := m.Release(ctx, []kvcache.SeqID{2}); err != nil {
		t.Fatal(err)
	}
	want(t, "released after one chunk", explain1(t, m, probe(r), "", 40), kvcache.Explanation{Tokens: 4, Miss: kvcache.MissNeverStored})
}

func TestExplainEvictedByLRU(t *testing.T) {
	m := tiny(t, "", true)
	a, b, c, d := tokens(8, 1), tokens(8, 2), tokens(8, 3), tokens(8, 4)
	store(t, m, 1, a, "", 0, 0, 100)
	store(t, m, 2, b, "", 0, 0, 200)
	store(t, m, 3, c, "", 0, 0, 300)
	// d needs two blocks: a's two, the least recently used, go.
	mustGrant(t, m, kvcache.ReserveItem{Seq: 4, Tokens: 8, New: true, Prompt: d, Now: 400})
	evicted := kvcache.Explanation{Miss: kvcache.MissEvicted, EvictedTier: kvcache.TierDevice, EvictedBy: "lru", EvictedAt: 400}
	want(t, "a", explain1(t, m, probe(a), "", 450), evicted)
	want(t, "b", explain1(t, m, probe(b), "", 450), kvcache.Explanation{Tokens: 8, Miss: kvcache.MissPartialBlock})
	// d is being computed: in flight wins over anything else.
	want(t, "d", explain1(t, m, probe(d), "", 450), kvcache.Explanation{Miss: kvcache.MissInFlight})
	// Stored again, a is cached; its second block evicted alone reads as
	// evicted after the first.
	mustCommit(t, m, 4, 8)
	if err := m.Release(ctx, []kvcache.SeqID{4}); err != nil {
		t.Fatal(err)
	}
	store(t, m, 5, a, "", 0, 0, 500) // evicts b
	want(t, "a again", explain1(t, m, probe(a), "", 550), kvcache.Explanation{Tokens: 8, Miss: kvcache.MissPartialBlock})
	evicted.EvictedAt = 500
	want(t, "b", explain1(t, m, probe(b), "", 550), evicted)
}

// TestPriorityBeatsLRU: a high-priority prompt stored first survives while
// recent default ones are evicted (by priority); once its duration is over
// it falls back to the default and is evicted first (by LRU).
func TestPriorityBeatsLRU(t *testing.T) {
	m := tiny(t, "", true)
	a, b, c, d, e := tokens(8, 1), tokens(8, 2), tokens(8, 3), tokens(8, 4), tokens(8, 5)
	store(t, m, 1, a, "", 80, 1000, 100) // priority 80 until 1100
	store(t, m, 2, b, "", 0, 0, 200)
	store(t, m, 3, c, "", 0, 0, 300)
	store(t, m, 4, d, "", 0, 0, 400) // evicts b: the least recently used of the default ones
	want(t, "a survives", explain1(t, m, probe(a), "", 450), kvcache.Explanation{Tokens: 8, Miss: kvcache.MissPartialBlock})
	want(t, "b", explain1(t, m, probe(b), "", 450),
		kvcache.Explanation{Miss: kvcache.MissEvicted, EvictedTier: kvcache.TierDevice, EvictedBy: "priority", EvictedAt: 400})
	store(t, m, 5, e, "", 0, 0, 1099) // still 80: c goes
	want(t, "a survives again", explain1(t, m, probe(a), "", 1099), kvcache.Explanation{Tokens: 8, Miss: kvcache.MissPartialBlock})
	want(t, "c", explain1(t, m, probe(c), "", 1099),
		kvcache.Explanation{Miss: kvcache.MissEvicted, EvictedTier: kvcache.TierDevice, EvictedBy: "priority", EvictedAt: 1099})
	// At 1100 a's priority is over: it is the least recently used.
	store(t, m, 6, b, "", 0, 0, 1100)
	want(t, "a after its duration", explain1(t, m, probe(a), "", 1200),
		kvcache.Explanation{Miss: kvcache.MissEvicted, EvictedTier: kvcache.TierDevice, EvictedBy: "lru", EvictedAt: 1100})
	want(t, "d", explain1(t, m, probe(d), "", 1200), kvcache.Explanation{Tokens: 8, Miss: kvcache.MissPartialBlock})
}

// TestPriorityOfReuse: a node reused by a higher-priority sequence takes
// its priority and expiry; a lower one changes nothing; a reservation
// undone leaves the priority as it was.
func TestPriorityOfReuse(t *testing.T) {
	m := tiny(t, "", true)
	a := tokens(8, 1)
	store(t, m, 1, a, "", 0, 0, 100)
	n := m.tree.match("", a, 2, nil)
	prio := func() []int8 { return []int8{n[0].prio, n[1].prio} }
	mustGrant(t, m, kvcache.ReserveItem{Seq: 2, Tokens: 1, New: true, Prompt: probe(a), Reuse: 8, Priority: 90, Now: 110})
	if err := m.Unreserve(ctx, []kvcache.SeqID{2}); err != nil {
		t.Fatal(err)
	}
	if got := prio(); !slices.Equal(got, []int8{35, 35}) {
		t.Fatalf("priorities after an undone reuse %v, want [35 35]", got)
	}
	mustGrant(t, m, kvcache.ReserveItem{Seq: 3, Tokens: 1, New: true, Prompt: probe(a), Reuse: 8, Priority: 60, PriorityDuration: 50, Now: 120})
	mustCommit(t, m, 3, 1)
	if got := prio(); !slices.Equal(got, []int8{60, 60}) || n[0].until != 170 || n[0].hits != 1 {
		t.Fatalf("after a reuse at 60 until 170: priorities %v until %d hits %d", got, n[0].until, n[0].hits)
	}
	mustGrant(t, m, kvcache.ReserveItem{Seq: 4, Tokens: 1, New: true, Prompt: probe(a), Reuse: 8, Priority: 60, Now: 130})
	mustGrant(t, m, kvcache.ReserveItem{Seq: 5, Tokens: 1, New: true, Prompt: probe(a), Reuse: 8, Priority: 20, PriorityDuration: 5000, Now: 130})
	mustCommit(t, m, 4, 1)
	mustCommit(t, m, 5, 1)
	if got := prio(); !slices.Equal(got, []int8{60, 60}) || n[0].until != 0 || n[1].hits != 3 {
		t.Fatalf("after reuses at 60 for ever and at 20: priorities %v until %d hits %d, want 60 for ever, 3 hits", got, n[0].until, n[1].hits)
	}
	inspect(t, m)
}

// TestLFUKeepsFrequentlyReused: a prompt reused twice and then left alone
// is the least recently used; LRU evicts it, LFU evicts a prompt never
// reused instead.
func TestLFUKeepsFrequentlyReused(t *testing.T) {
	for _, tc := range []struct {
		policy        string
		aCached       bool
		evictedPrompt int32
	}{{"lru", false, 1}, {"lfu", true, 2}} {
		t.Run(tc.policy, func(t *testing.T) {
			m := tiny(t, tc.policy, true)
			a, b, c, d := tokens(8, 1), tokens(8, 2), tokens(8, 3), tokens(8, 4)
			store(t, m, 1, a, "", 0, 0, 100)
			reuseOnce(t, m, 2, probe(a), 110)
			reuseOnce(t, m, 3, probe(a), 120)
			store(t, m, 4, b, "", 0, 0, 200)
			store(t, m, 5, c, "", 0, 0, 300)
			store(t, m, 6, d, "", 0, 0, 400)
			ea := explain1(t, m, probe(a), "", 500)
			if got := ea.Tokens == 8; got != tc.aCached {
				t.Fatalf("a (reused twice) cached %v under %s, want %v: %+v", got, tc.policy, tc.aCached, ea)
			}
			want(t, "evicted prompt", explain1(t, m, probe(tokens(8, tc.evictedPrompt)), "", 500),
				kvcache.Explanation{Miss: kvcache.MissEvicted, EvictedTier: kvcache.TierDevice, EvictedBy: tc.policy, EvictedAt: 400})
			want(t, "c", explain1(t, m, probe(c), "", 500), kvcache.Explanation{Tokens: 8, Miss: kvcache.MissPartialBlock})
		})
	}
}

func TestRetentionInvalid(t *testing.T) {
	m := tiny(t, "", true)
	for _, tc := range []struct {
		it   kvcache.ReserveItem
		want string
	}{
		{kvcache.ReserveItem{Seq: 1, Tokens: 4, New: true, Prompt: tokens(4, 1), Priority: 101}, "invalid: seq 1: priority 101 outside 1..100"},
		{kvcache.ReserveItem{Seq: 1, Tokens: 4, New: true, Prompt: tokens(4, 1), Priority: -3}, "invalid: seq 1: priority -3 outside 1..100"},
		{kvcache.ReserveItem{Seq: 1, Tokens: 4, New: true, Prompt: tokens(4, 1), Priority: 50, PriorityDuration: -1}, "invalid: seq 1: priority_duration -1"},
	} {
		before := inspect(t, m)
		g := reserve1(t, m, tc.it)
		if g.OK || !strings.HasPrefix(g.Reason, tc.want) {
			t.Fatalf("Reserve(%+v) = %v %q, want denied %q", tc.it, g.OK, g.Reason, tc.want)
		}
		if after := inspect(t, m); len(after.Seqs) != len(before.Seqs) {
			t.Fatal("a denial left a sequence")
		}
	}
	for _, p := range []int{1, 35, 100} {
		mustGrant(t, m, kvcache.ReserveItem{Seq: kvcache.SeqID(p), Tokens: 4, New: true, Prompt: tokens(4, 1), Priority: p})
	}
}

func TestEvictionPolicyConfig(t *testing.T) {
	layers := []spec.Layer{gqaLayer(0, 0)}
	cfg := kvcache.Config{Layers: layers, TokensPerBlock: 4, DeviceBytes: 6 * stageBlockBytes(layers, 4),
		MaxBatchSize: 2, MaxNumTokens: 12, MaxSeqLen: 12, EnableBlockReuse: true, EvictionPolicy: "mru"}
	_, err := New().Configure(ctx, cfg)
	if !errors.Is(err, kvcache.ErrInvalidConfig) || !strings.Contains(err.Error(), `"mru"`) || !strings.Contains(err.Error(), "lru, lfu") {
		t.Fatalf("Configure(eviction_policy mru) = %v, want ErrInvalidConfig naming it and lru, lfu", err)
	}
	info, err := New().Info(ctx)
	if err != nil || !info.Capabilities.Explain || !info.Capabilities.Retention ||
		!slices.Equal(info.Capabilities.EvictionPolicies, []string{"lru", "lfu"}) {
		t.Fatalf("Info = %+v, %v: want Explain, Retention and policies lru, lfu", info.Capabilities, err)
	}
	for _, p := range []string{"", "lru", "lfu"} {
		cfg.EvictionPolicy = p
		m := New()
		if _, err := m.Configure(ctx, cfg); err != nil {
			t.Fatalf("Configure(eviction_policy %q): %v", p, err)
		}
		if m.tree.ret.lfu != (p == "lfu") {
			t.Fatalf("eviction_policy %q: lfu %v", p, m.tree.ret.lfu)
		}
	}
}

// TestGhostsForgetOldest: the ghost record is bounded; the oldest eviction
// is forgotten first (and then explains as never stored), and a position
// evicted again is remembered from its latest eviction.
func TestGhostsForgetOldest(t *testing.T) {
	g := ghosts{max: 3}
	has := func(want ...uint64) {
		t.Helper()
		var got []uint64
		for _, e := range g.m.slots {
			if e.used {
				got = append(got, e.pos)
			}
		}
		slices.Sort(got)
		if !slices.Equal(got, want) {
			t.Fatalf("ghosts remember %v, want %v", got, want)
		}
	}
	for i := uint64(1); i <= 4; i++ {
		g.add(i, kvcache.TierDevice, byLRU, int64(10*i))
	}
	has(2, 3, 4)
	g.add(3, kvcache.TierHost, byPriority, 50) // 3 evicted again: takes the oldest slot, 2's
	has(3, 4)
	g.add(5, kvcache.TierDevice, byLRU, 60) // overwrites 3's old slot: 3 stays
	has(3, 4, 5)
	if e, _ := g.get(3); e.at != 50 || e.tier != 1 || e.by != byPriority {
		t.Fatalf("ghost 3 = %+v, want its second eviction", e)
	}
	g.add(6, kvcache.TierDevice, byLRU, 70)
	has(3, 5, 6)
}

// BenchmarkExplain is BenchmarkLookup explained: the same tree, the
// fully cached probe (partial_block) and one that misses after 2048 tokens
// while 64 live sequences are resident (never_stored, after the in-flight
// scan and the ghost record). Compare its ns/token with BenchmarkLookup's:
// the extras cost Explain only.
func BenchmarkExplain(b *testing.B) {
	const tpb, n = 64, 4096
	layers := dsaStage(0, 4, false)
	m, _ := configure(b, kvcache.Config{
		Layers: layers, TokensPerBlock: tpb, DeviceBytes: int64(256*n/tpb+64*n/tpb+64) * stageBlockBytes(layers, tpb),
		MaxBatchSize: 256, MaxNumTokens: n, MaxSeqLen: n, EnableBlockReuse: true,
	})
	var hit []int32
	for i := range 256 {
		p := append(tokens(2048, int32(i%16)), tokens(2048, int32(1000+i))...)
		id := kvcache.SeqID(i + 1)
		mustGrant(b, m, kvcache.ReserveItem{Seq: id, Tokens: n, New: true, Prompt: p})
		mustCommit(b, m, id, n)
		m.Release(ctx, []kvcache.SeqID{id})
		hit = append(p, 7)
	}
	for i := range 64 { // live sequences, first chunk only
		p := append(tokens(2048, int32(i%16)), tokens(2048, int32(5000+i))...)
		mustGrant(b, m, kvcache.ReserveItem{Seq: kvcache.SeqID(1000 + i), Tokens: 64, New: true, Prompt: p})
	}
	miss := append(tokens(2048, 3), tokens(2049, 9999)...)
	for _, tc := range []struct {
		name   string
		prompt []int32
		want   kvcache.Explanation
	}{
		{"hit", hit, kvcache.Explanation{Tokens: n, Miss: kvcache.MissPartialBlock}},
		{"miss", miss, kvcache.Explanation{Tokens: 2048, Miss: kvcache.MissNeverStored}},
	} {
		b.Run(tc.name, func(b *testing.B) {
			items := []kvcache.LookupItem{{Prompt: tc.prompt}}
			b.ReportAllocs()
			for b.Loop() {
				ex, _ := m.Explain(ctx, items)
				if ex[0] != tc.want {
					b.Fatalf("Explain = %+v, want %+v", ex[0], tc.want)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(len(tc.prompt)), "ns/token")
		})
	}
}

// TestPriorityExpiriesInTimeOrder: three high-priority prompts whose
// priorities end at different times fall back to the default one by one,
// each when the clock of a Reserve passes its expiry.
func TestPriorityExpiriesInTimeOrder(t *testing.T) {
	m := tiny(t, "", true)
	a, b, c, d, e := tokens(8, 1), tokens(8, 2), tokens(8, 3), tokens(8, 4), tokens(8, 5)
	store(t, m, 1, a, "", 80, 900, 100)  // 80 until 1000
	store(t, m, 2, b, "", 80, 2800, 200) // 80 until 3000
	store(t, m, 3, c, "", 80, 1700, 300) // 80 until 2000
	store(t, m, 4, d, "", 0, 0, 2500)    // a and c are back to 35; b is not
	evicted := kvcache.Explanation{Miss: kvcache.MissEvicted, EvictedTier: kvcache.TierDevice, EvictedBy: "priority", EvictedAt: 2500}
	want(t, "a", explain1(t, m, probe(a), "", 2600), evicted)
	store(t, m, 5, e, "", 0, 0, 3500) // all at 35: b is the least recently used
	evicted.EvictedBy, evicted.EvictedAt = "lru", 3500
	want(t, "b", explain1(t, m, probe(b), "", 3600), evicted)
	want(t, "c", explain1(t, m, probe(c), "", 3600), kvcache.Explanation{Tokens: 8, Miss: kvcache.MissPartialBlock})
	if len(m.tree.ret.exp) != 0 {
		t.Fatalf("%d nodes left in the expiry heap, want none", len(m.tree.ret.exp))
	}
}

// TestSameTokens: the lookup's byte comparison of blocks is slices.Equal.
func TestSameTokens(t *testing.T) {
	cases := [][2][]int32{
		{nil, nil}, {nil, {}}, {{}, {1}}, {{1, 2, 3}, {1, 2, 3}}, {{1, 2, 3}, {1, 2, 4}},
		{{1, 2, 3}, {1, 2}}, {{-1, 1 << 30}, {-1, 1 << 30}}, {{0x01000000}, {0x00000001}},
		{tokens(64, 5), tokens(64, 5)}, {tokens(64, 5), append(tokens(63, 5), 0)},
	}
	for _, c := range cases {
		if got, want := sameTokens(c[0], c[1]), slices.Equal(c[0], c[1]); got != want {
			t.Errorf("sameTokens(%v, %v) = %v, slices.Equal says %v", c[0], c[1], got, want)
		}
	}
}

// TestGhostSet: the ghost record's index answers as a map does under any
// sequence of puts, lookups and deletions, positions crowded into a few
// homes included (long probe runs that wrap around the table).
func TestGhostSet(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		var s ghostSet
		want := map[uint64]ghostEntry{}
		crowd := rapid.Bool().Draw(t, "crowd")
		pos := func() uint64 {
			p := rapid.Uint64Range(0, 40).Draw(t, "pos")
			if crowd {
				p = p<<20 | p&1 // few homes, many positions
			}
			return p
		}
		for i := range rapid.IntRange(0, 300).Draw(t, "ops") {
			p := pos()
			switch rapid.IntRange(0, 2).Draw(t, "op") {
			case 0:
				g := ghostEntry{slot: int32(i), by: uint8(i % 3)}
				s.put(p, g)
				want[p] = g
			case 1:
				if j, ok := s.find(p); ok {
					s.del(j)
				}
				delete(want, p)
			}
			if g, ok := s.get(p); ok != hasGhost(want, p) || g != want[p] {
				t.Fatalf("get(%d) = %+v, %v; want %+v", p, g, ok, want[p])
			}
			if s.n != len(want) {
				t.Fatalf("%d entries, want %d", s.n, len(want))
			}
		}
		for p, g := range want {
			if got, ok := s.get(p); !ok || got != g {
				t.Fatalf("get(%d) = %+v, %v; want %+v", p, got, ok, g)
			}
		}
	})
}

func hasGhost(m map[uint64]ghostEntry, p uint64) bool { _, ok := m[p]; return ok }
