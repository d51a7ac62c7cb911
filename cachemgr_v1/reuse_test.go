package cachemgrv1

import (
	"reflect"
	"strings"
	"testing"

	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
)

// reuseConfig: one full-attention pool of 32 blocks of 4 tokens, reuse on.
func reuseConfig() kvcache.Config {
	c := smallConfig(4, 32)
	c.MaxSeqLen = 128
	c.MaxDraftTokens = 0
	c.MaxNumTokens = 4
	c.EnableBlockReuse = true
	return c
}

func lookup(t *testing.T, m *Manager, prompts ...[]int32) []int {
	t.Helper()
	items := make([]kvcache.LookupItem, len(prompts))
	for i, p := range prompts {
		items[i] = kvcache.LookupItem{Seq: kvcache.SeqID(100 + i), Prompt: p}
	}
	n, err := m.Lookup(bg, items)
	if err != nil {
		t.Fatalf("Lookup: %v", err)
	}
	return n
}

func TestPrefixReuseLifecycle(t *testing.T) {
	const tpb = 4
	m := configured(t, reuseConfig())
	a := prompt(tpb, []int32{1, 2, 3}, 5, 1) // 17 tokens: 4 full blocks
	b := prompt(tpb, []int32{1, 2, 3}, 6, 2) // 18 tokens: shares 3 blocks with a

	if n := lookup(t, m, a); n[0] != 0 {
		t.Fatalf("Lookup on an empty cache = %d", n[0])
	}
	mustGrant(t, m, kvcache.ReserveItem{Seq: 1, New: true, Tokens: len(a), Prompt: a})
	if n := lookup(t, m, a); n[0] != 0 {
		t.Fatalf("Lookup before the prompt is committed = %d, want 0", n[0])
	}
	commit(t, m, 1, len(a))
	if n := lookup(t, m, b, a, a[:16], a[:13], a[:4]); !reflect.DeepEqual(n, []int{3 * tpb, 4 * tpb, 3 * tpb, 3 * tpb, 0}) {
		t.Fatalf("Lookup(b, a, a[:16], a[:13], a[:4]) = %v, want [12 16 12 12 0]", n)
	}

	g := mustGrant(t, m, kvcache.ReserveItem{Seq: 2, New: true, Reuse: 3 * tpb, Tokens: len(b) - 3*tpb, Prompt: b})
	if len(g.Tables) != 1 || g.Tables[0].From != 0 || len(g.Tables[0].Blocks) != 5 {
		t.Fatalf("grant tables = %+v, want one delta of 5 blocks from 0", g.Tables)
	}
	snap := inspect(t, m)
	ta, tb := snap.Seqs[0].Tables[0], snap.Seqs[1].Tables[0]
	if !reflect.DeepEqual(ta[:3], tb[:3]) || ta[3] == tb[3] {
		t.Fatalf("tables a %v b %v: want the first 3 blocks shared, the 4th not", ta, tb)
	}
	if st := snap.Seqs[1]; st.History != 12 || st.Capacity != 18 {
		t.Fatalf("seq 2 = %+v, want history 12 (reused) and capacity 18", st)
	}
	for j, blk := range ta {
		want := int32(1)
		if j < 3 {
			want = 2
		}
		if got := snap.RefCounts[0][blk]; got != want {
			t.Errorf("refcount of block %d (position %d) = %d, want %d", blk, j, got, want)
		}
	}
	commit(t, m, 2, len(b)-3*tpb)

	if err := m.Release(bg, []kvcache.SeqID{1, 2}); err != nil {
		t.Fatal(err)
	}
	snap = inspect(t, m)
	// a's 4 full blocks and b's own 4th block stay cached; the two partial tails are free.
	if p := snap.Pools[0]; p.Cached != 5 || p.Free != 27 || p.InUse != 0 || len(snap.Violations) > 0 {
		t.Fatalf("after release: %+v %v", p, snap.Violations)
	}
	if n := lookup(t, m, a, b); !reflect.DeepEqual(n, []int{16, 16}) {
		t.Fatalf("Lookup after release = %v, want [16 16]", n)
	}

	// Pressure: a sequence that takes every free block evicts nothing; each
	// further block evicts the least recently used cached block. Release
	// order made a's 4th block the oldest, then b's, then the shared chain
	// deepest first.
	c := prompt(tpb, []int32{7}, 0, 0)
	mustGrant(t, m, kvcache.ReserveItem{Seq: 3, New: true, Tokens: 27 * tpb, Prompt: c})
	if st, _ := m.Stats(bg); st.Evictions != 0 {
		t.Fatalf("Evictions = %d with free blocks left", st.Evictions)
	}
	steps := []struct{ a, b int }{{12, 16}, {12, 12}, {8, 8}, {4, 4}, {0, 0}}
	for i, want := range steps {
		mustGrant(t, m, kvcache.ReserveItem{Seq: kvcache.SeqID(10 + i), New: true, Tokens: 1})
		if n := lookup(t, m, a, b); n[0] != want.a || n[1] != want.b {
			t.Fatalf("after %d evictions Lookup = %v, want [%d %d]", i+1, n, want.a, want.b)
		}
	}
	st, _ := m.Stats(bg)
	if st.Evictions != 5 || st.ReusedTokens != 12 || st.Pools[0].Free != 0 || st.Pools[0].Cached != 0 {
		t.Fatalf("Stats = %+v", st)
	}
	g = reserve(t, m, kvcache.ReserveItem{Seq: 99, New: true, Tokens: 1})[0]
	if g.OK || !strings.Contains(g.Reason, "0 free + 0 evictable of 32") {
		t.Fatalf("Reserve on a full cache = %+v", g)
	}
	noViolations(t, m)
}

func TestPrefixReuseEdgeCases(t *testing.T) {
	const tpb = 4
	m := configured(t, reuseConfig())
	a := prompt(tpb, []int32{1, 2}, 3, 1) // 11 tokens, 2 full blocks

	// Two sequences with the same prompt prefill at once: the second's
	// blocks are not registered again.
	reserve(t, m,
		kvcache.ReserveItem{Seq: 1, New: true, Tokens: len(a), Prompt: a},
		kvcache.ReserveItem{Seq: 2, New: true, Tokens: len(a), Prompt: a})
	if _, err := m.Commit(bg, []kvcache.CommitItem{{Seq: 1, Accepted: len(a)}, {Seq: 2, Accepted: len(a)}}); err != nil {
		t.Fatal(err)
	}
	if err := m.Release(bg, []kvcache.SeqID{1, 2}); err != nil {
		t.Fatal(err)
	}
	if p := inspect(t, m).Pools[0]; p.Cached != 2 || p.Free != 30 {
		t.Fatalf("duplicates registered: %+v", p)
	}

	// Reuse checks.
	for _, tc := range []struct {
		item kvcache.ReserveItem
		want string
	}{
		{kvcache.ReserveItem{Seq: 5, New: true, Reuse: 6, Tokens: 5, Prompt: a}, "multiple of tokens_per_block 4"},
		{kvcache.ReserveItem{Seq: 5, New: true, Reuse: 8, Tokens: 1, Prompt: a[:8]}, "must be <= len(Prompt)-1 = 7"},
		{kvcache.ReserveItem{Seq: 5, New: true, Reuse: 8, Tokens: 3, Prompt: prompt(tpb, []int32{1, 9}, 3, 1)}, "exceeds the 4 prompt tokens"},
	} {
		before := inspect(t, m)
		g := reserve(t, m, tc.item)[0]
		if g.OK || !strings.HasPrefix(g.Reason, "invalid:") || !strings.Contains(g.Reason, tc.want) {
			t.Errorf("Reserve(%+v) = %+v, want invalid ...%s", tc.item, g, tc.want)
		}
		sameSnapshot(t, "an invalid reuse", before, inspect(t, m))
	}

	// Unreserve of a new sequence that reused blocks puts them back in the
	// cache and undoes the reuse counter.
	before := inspect(t, m)
	stBefore, _ := m.Stats(bg)
	mustGrant(t, m, kvcache.ReserveItem{Seq: 6, New: true, Reuse: 8, Tokens: 3, Prompt: a})
	if p := inspect(t, m).Pools[0]; p.Cached != 0 || p.InUse != 3 {
		t.Fatalf("reused blocks not in use: %+v", p)
	}
	if err := m.Unreserve(bg, []kvcache.SeqID{6}); err != nil {
		t.Fatal(err)
	}
	sameSnapshot(t, "Reserve+Unreserve with reuse", before, inspect(t, m))
	// Stats are cumulative: the undone reservation's reuse stays counted.
	if st, _ := m.Stats(bg); st.ReusedTokens != stBefore.ReusedTokens+8 {
		t.Errorf("ReusedTokens = %d, want %d", st.ReusedTokens, stBefore.ReusedTokens+8)
	}

	// A denial for lack of space counts the cached blocks it would pin.
	mustGrant(t, m, kvcache.ReserveItem{Seq: 7, New: true, Tokens: 30 * tpb, Prompt: prompt(tpb, []int32{5}, 0, 0)})
	before = inspect(t, m) // 2 cached, 0 free
	g := reserve(t, m, kvcache.ReserveItem{Seq: 8, New: true, Reuse: 8, Tokens: 3, Prompt: a})[0]
	if g.OK || !strings.Contains(g.Reason, "needs 1 more blocks") || !strings.Contains(g.Reason, "0 free + 0 evictable") {
		t.Fatalf("Reserve pinning the last cached blocks = %+v, want a denial", g)
	}
	sameSnapshot(t, "a reuse denial", before, inspect(t, m))
}

func TestReuseOffForStateStages(t *testing.T) {
	m := configured(t, hybridStage()) // reuse asked for, but the stage has SSM state
	p := prompt(64, []int32{1, 2, 3}, 10, 1)
	mustGrant(t, m, kvcache.ReserveItem{Seq: 1, New: true, Tokens: len(p), Prompt: p})
	commit(t, m, 1, len(p))
	if err := m.Release(bg, []kvcache.SeqID{1}); err != nil {
		t.Fatal(err)
	}
	if n := lookup(t, m, p); n[0] != 0 {
		t.Fatalf("Lookup on a stage with SSM state = %d, want 0", n[0])
	}
	if snap := inspect(t, m); snap.Pools[0].Cached != 0 || snap.Pools[1].Free != 16 {
		t.Fatalf("pools = %+v", snap.Pools)
	}
}
