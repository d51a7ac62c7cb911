package cachemgrv2

import (
	"errors"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
	"github.com/kvx-dev/kvx/plugins/v1/spec"
)

// smallCfg: tpb 4, one GQA group, reuse on, blocks device blocks.
func smallCfg(blocks, hostBlocks int) kvcache.Config {
	layers := []spec.Layer{gqaLayer(0, 0)}
	bb := stageBlockBytes(layers, 4)
	return kvcache.Config{Layers: layers, TokensPerBlock: 4, DeviceBytes: int64(blocks) * bb, HostBytes: int64(hostBlocks) * bb,
		MaxBatchSize: 4, MaxNumTokens: 16, MaxSeqLen: 32, MaxDraftTokens: 2, EnableBlockReuse: true}
}

func TestReuseSharesPages(t *testing.T) {
	m, _ := configure(t, smallCfg(16, 0))
	p := tokens(13, 1)
	mustGrant(t, m, kvcache.ReserveItem{Seq: 1, Tokens: 13, New: true, Prompt: p})
	mustCommit(t, m, 1, 13) // 3 full prompt blocks registered
	look, _ := m.Lookup(ctx, []kvcache.LookupItem{{Prompt: p}, {Prompt: p[:12]}, {Prompt: p[:3]}, {Prompt: tokens(13, 2)}})
	if !slices.Equal(look, []int{12, 8, 0, 0}) {
		t.Fatalf("Lookup = %v, want [12 8 0 0] (at most len-1, full blocks)", look)
	}
	// Seq 2 takes 12 tokens while seq 1 is still live: shared pages, refcount 2.
	g := mustGrant(t, m, kvcache.ReserveItem{Seq: 2, Tokens: 1, New: true, Prompt: p, Reuse: 12})
	snap := inspect(t, m)
	s1, s2 := seqState(t, snap, 1), seqState(t, snap, 2)
	if !slices.Equal(s1.Tables[0][:3], s2.Tables[0][:3]) || s2.History != 12 || s2.Capacity != 13 {
		t.Fatalf("seq 2 = %+v, want seq 1's first 3 blocks and history 12", s2)
	}
	for _, b := range s2.Tables[0][:3] {
		if snap.RefCounts[0][b] != 2 {
			t.Errorf("shared block %d refcount %d, want 2", b, snap.RefCounts[0][b])
		}
	}
	if len(g.Tables) != 1 || g.Tables[0].From != 0 || !slices.Equal(g.Tables[0].Blocks, s2.Tables[0]) {
		t.Errorf("new sequence grant tables %+v, want its whole table", g.Tables)
	}
	if st, _ := m.Stats(ctx); st.ReusedTokens != 12 || st.LookupTokens != 13+12+3+13 {
		t.Errorf("Stats = %+v", st)
	}
	// Releasing both leaves the prompt blocks cached, the private ones free.
	m.Release(ctx, []kvcache.SeqID{1, 2})
	if ps := inspect(t, m).Pools[0]; ps.Cached != 3 || ps.InUse != 0 || ps.Free != ps.Total-3 {
		t.Errorf("after release %+v, want 3 cached", ps)
	}
	// Reuse rules.
	for _, tc := range []struct {
		it   kvcache.ReserveItem
		want string
	}{
		{kvcache.ReserveItem{Seq: 3, Tokens: 1, New: true, Prompt: p, Reuse: 6}, "invalid: seq 3: reuse 6 is not a multiple"},
		{kvcache.ReserveItem{Seq: 3, Tokens: 1, New: true, Prompt: p[:12], Reuse: 12}, "invalid: seq 3: reuse 12 > len(prompt)-1"},
		{kvcache.ReserveItem{Seq: 3, Tokens: 1, New: true, Prompt: tokens(13, 5), Reuse: 4}, "reuse 4 tokens no longer cached (0 now)"},
		{kvcache.ReserveItem{Seq: 3, Tokens: 1, Draft: 3, New: true}, "invalid: seq 3: draft 3 > max_draft_tokens 2"},
		{kvcache.ReserveItem{Seq: 3, Tokens: 40, New: true}, "invalid: seq 3: needs 40 tokens"},
		{kvcache.ReserveItem{Seq: 3, Tokens: -1, New: true}, "invalid: seq 3: tokens -1"},
		{kvcache.ReserveItem{Seq: 3, Tokens: 1}, "invalid: seq 3: unknown sequence"},
	} {
		before := inspect(t, m)
		g := reserve1(t, m, tc.it)
		if g.OK || !strings.Contains(g.Reason, tc.want) {
			t.Errorf("Reserve(%+v) = %+v, want denial %q", tc.it, g, tc.want)
		}
		if !reflect.DeepEqual(inspect(t, m), before) {
			t.Errorf("denied Reserve(%+v) changed state", tc.it)
		}
	}
}

// TestDenialLeavesNoTrace: a denial after pinning reuse candidates restores
// the eviction order exactly.
func TestDenialLeavesNoTrace(t *testing.T) {
	m, _ := configure(t, smallCfg(10, 0))
	for i := range 3 {
		p := tokens(9, int32(i))
		id := kvcache.SeqID(i + 1)
		mustGrant(t, m, kvcache.ReserveItem{Seq: id, Tokens: 9, New: true, Prompt: p})
		mustCommit(t, m, id, 9)
		m.Release(ctx, []kvcache.SeqID{id})
	}
	mustGrant(t, m, kvcache.ReserveItem{Seq: 9, Tokens: 8, New: true}) // 2 free left + 6 cached
	order := evictionOrder(m.tree)
	before := inspect(t, m)
	// Needs 8 reused + 26 = 34 tokens: 7 new blocks, 2 free + 4 evictable.
	g := reserve1(t, m, kvcache.ReserveItem{Seq: 10, Tokens: 24, Draft: 2, New: true, Prompt: tokens(25, 0), Reuse: 8})
	if g.OK || !strings.Contains(g.Reason, "no capacity") {
		t.Fatalf("Reserve = %+v, want no capacity", g)
	}
	if after := inspect(t, m); !reflect.DeepEqual(after, before) {
		t.Fatalf("denied Reserve changed state:\n got %+v\nwant %+v", after, before)
	}
	if !slices.Equal(evictionOrder(m.tree), order) {
		t.Fatal("denied Reserve changed the eviction order")
	}
}

func TestUnreserveRestoresExactly(t *testing.T) {
	m, _ := configure(t, smallCfg(16, 0))
	p := tokens(9, 1)
	mustGrant(t, m, kvcache.ReserveItem{Seq: 1, Tokens: 9, New: true, Prompt: p})
	mustCommit(t, m, 1, 9)
	m.Release(ctx, []kvcache.SeqID{1})
	mustGrant(t, m, kvcache.ReserveItem{Seq: 2, Tokens: 7, New: true})
	mustCommit(t, m, 2, 7)
	g0 := mustGrant(t, m, kvcache.ReserveItem{Seq: 2, Tokens: 1})
	mustCommit(t, m, 2, 1) // history 8: block boundary
	if len(g0.Tables) != 0 {
		t.Fatalf("grant within the known table: %+v, want no delta", g0.Tables)
	}
	order := evictionOrder(m.tree)
	before := inspect(t, m)

	g1 := mustGrant(t, m, kvcache.ReserveItem{Seq: 2, Tokens: 1, Draft: 2})                 // crosses into block 2
	mustGrant(t, m, kvcache.ReserveItem{Seq: 3, Tokens: 2, New: true, Prompt: p, Reuse: 8}) // pins cached nodes
	if err := m.Unreserve(ctx, []kvcache.SeqID{2, 3}); err != nil {
		t.Fatal(err)
	}
	if after := inspect(t, m); !reflect.DeepEqual(after, before) || !slices.Equal(evictionOrder(m.tree), order) {
		t.Fatalf("Unreserve did not restore:\n got %+v\nwant %+v", after, before)
	}
	if err := m.Unreserve(ctx, []kvcache.SeqID{2, 3}); !errors.Is(err, kvcache.ErrInvalidArg) {
		t.Errorf("second Unreserve = %v, want item error", err)
	}
	// The worker may have applied the unreserved grant; the next one replaces the same tail.
	g2 := mustGrant(t, m, kvcache.ReserveItem{Seq: 2, Tokens: 1, Draft: 2})
	if len(g2.Tables) != 1 || g2.Tables[0].From != g1.Tables[0].From || len(g2.Tables[0].Blocks) != len(g1.Tables[0].Blocks) {
		t.Errorf("grant after Unreserve %+v, want the same tail as %+v", g2.Tables, g1.Tables)
	}
}

// TestPartialReuseCopyOnWrite exercises the partial-match primitive behind
// the internal switch: Lookup may end inside a block and Reserve copies the
// partly matched block into a private one.
func TestPartialReuseCopyOnWrite(t *testing.T) {
	m := New()
	m.partial = true
	if _, err := m.Configure(ctx, smallCfg(16, 0)); err != nil {
		t.Fatal(err)
	}
	a := tokens(12, 1)
	mustGrant(t, m, kvcache.ReserveItem{Seq: 1, Tokens: 12, New: true, Prompt: a})
	mustCommit(t, m, 1, 12)
	m.Release(ctx, []kvcache.SeqID{1})
	b := append(slices.Clone(a[:6]), 99, 98, 97, 96)
	look, _ := m.Lookup(ctx, []kvcache.LookupItem{{Prompt: b}, {Prompt: a[:7]}})
	if !slices.Equal(look, []int{6, 6}) {
		t.Fatalf("Lookup = %v, want [6 6] (one block + 2 tokens; capped at len-1)", look)
	}
	path := m.tree.Match(a, 2, nil)
	g := mustGrant(t, m, kvcache.ReserveItem{Seq: 2, Tokens: 4, New: true, Prompt: b, Reuse: 6})
	s := seqState(t, inspect(t, m), 2)
	want := []kvcache.Copy{{SrcPool: 0, SrcBlock: path[1].pages[0], DstPool: 0, DstBlock: s.Tables[0][1]}}
	if !reflect.DeepEqual(g.Copies, want) || s.Tables[0][0] != path[0].pages[0] || s.History != 6 || s.Capacity != 10 {
		t.Fatalf("grant %+v, state %+v; want copy %+v", g, s, want)
	}
	if path[1].pins != 1 {
		t.Fatalf("copy source pins = %d, want 1 until Commit", path[1].pins)
	}
	mustCommit(t, m, 2, 4)
	if path[1].pins != 0 {
		t.Fatalf("copy source pins = %d after Commit, want 0", path[1].pins)
	}
	inspect(t, m)
	// b's second block is registered as a sibling of a's.
	if got := m.tree.MatchLen(append(slices.Clone(b[:8]), 0), 2); got != 2 {
		t.Errorf("b's blocks not registered: MatchLen = %d", got)
	}
	// With the switch off (the v1 contract) the same lookup is block-granular.
	m.partial = false
	if look, _ := m.Lookup(ctx, []kvcache.LookupItem{{Prompt: b}}); look[0] != 8 {
		t.Errorf("Lookup without partial = %v, want 8 (b's own blocks)", look)
	}
}

func TestReleaseAndItemErrors(t *testing.T) {
	m, _ := configure(t, smallCfg(16, 8))
	mustGrant(t, m, kvcache.ReserveItem{Seq: 1, Tokens: 5, New: true})
	err := m.Release(ctx, []kvcache.SeqID{1, 2, 1})
	var ke *kvcache.Error
	if !errors.As(err, &ke) || !slices.Equal(ke.Seqs, []kvcache.SeqID{2, 1}) {
		t.Fatalf("Release = %v, want item errors for 2 and the repeated 1", err)
	}
	if snap := inspect(t, m); len(snap.Seqs) != 0 || snap.Pools[0].Free != snap.Pools[0].Total {
		t.Fatalf("after release: %+v", snap)
	}
	if _, _, err := m.Resume(ctx, []kvcache.SeqID{5}); !errors.Is(err, kvcache.ErrInvalidArg) {
		t.Errorf("Resume(unknown) = %v", err)
	}
	if st, _ := m.Stats(ctx); st.Sequences != 0 || len(st.Pools) != 2 {
		t.Errorf("Stats = %+v", st)
	}
}

// TestBatchOrderAndAtomicity: items are served in order, an earlier grant can
// cause a later denial, and a denial in the middle leaves the others intact.
func TestBatchOrderAndAtomicity(t *testing.T) {
	m, _ := configure(t, smallCfg(10, 0))
	gs, err := m.Reserve(ctx, []kvcache.ReserveItem{
		{Seq: 1, Tokens: 16, New: true},
		{Seq: 2, Tokens: 16, New: true}, // 4 + 4 > 10 - ... denied: only 6 left
		{Seq: 3, Tokens: 16, New: true},
		{Seq: 1, Tokens: 1}, // duplicate in the batch: outstanding
	})
	if err != nil {
		t.Fatal(err)
	}
	if !gs[0].OK || !gs[1].OK || gs[2].OK || gs[3].OK || !strings.Contains(gs[3].Reason, "outstanding") {
		t.Fatalf("grants = %+v", gs)
	}
	if st, _ := m.Stats(ctx); st.ReserveDenials != 2 {
		t.Errorf("ReserveDenials = %d, want 2", st.ReserveDenials)
	}
	inspect(t, m)
}

// evictionOrder is the order in which the tree would evict its current
// evictable leaves.
func evictionOrder(t *Tree) []*Node {
	o := slices.Clone(t.heap)
	slices.SortFunc(o, func(a, b *Node) int {
		if t.less(a, b) {
			return -1
		}
		return 1
	})
	return o
}

// TestDuplicatePrefixIsAdopted: two sequences that computed the same prompt
// side by side (neither could reuse the other) register it once: the second
// one's Commit swaps its private copies for the tree's pages and frees them,
// so it holds no more blocks than one copy, and its next grant tells the
// worker the new table. A max_seq_len request then fits beside the second
// once the first is gone (the guarantee that the earlier fix, stopping
// registration, protected; found by the cpu equivalence suite).
func TestDuplicatePrefixIsAdopted(t *testing.T) {
	m, _ := configure(t, smallCfg(13, 0)) // one 32-token request (+2 drafts) needs 9 blocks
	p := tokens(13, 1)
	mustGrant(t, m, kvcache.ReserveItem{Seq: 1, Tokens: 13, New: true, Prompt: p})
	mustGrant(t, m, kvcache.ReserveItem{Seq: 2, Tokens: 13, New: true, Prompt: p})
	mustCommit(t, m, 1, 13)
	mustCommit(t, m, 2, 13)
	snap := inspect(t, m)
	s1, s2 := seqState(t, snap, 1), seqState(t, snap, 2)
	if !slices.Equal(s1.Tables[0][:3], s2.Tables[0][:3]) || s1.Tables[0][3] == s2.Tables[0][3] {
		t.Fatalf("tables %v and %v: want the 3 prompt blocks shared, the 4th private", s1.Tables[0], s2.Tables[0])
	}
	if ps := snap.Pools[0]; ps.InUse != 5 || ps.Free != 8 {
		t.Fatalf("pool %+v, want 5 blocks in use (3 shared + 2 private), seq 2's 3 copies freed", ps)
	}
	g := mustGrant(t, m, kvcache.ReserveItem{Seq: 2, Tokens: 1})
	if len(g.Tables) != 1 || g.Tables[0].From != 0 || !slices.Equal(g.Tables[0].Blocks, s2.Tables[0]) {
		t.Fatalf("seq 2's next grant tables %+v, want its whole table %v from 0", g.Tables, s2.Tables[0])
	}
	mustCommit(t, m, 2, 1)
	if err := m.Release(ctx, []kvcache.SeqID{1}); err != nil {
		t.Fatal(err)
	}
	if ps := inspect(t, m).Pools[0]; ps.Cached != 0 || ps.InUse != 4 {
		t.Fatalf("pool %+v, want seq 2's 4 blocks in use (3 of them the tree's), nothing else held", ps)
	}
	if g := reserve1(t, m, kvcache.ReserveItem{Seq: 3, Tokens: 16, Hold: 34, New: true, Prompt: tokens(16, 3)}); !g.OK {
		t.Fatalf("a max_seq_len request beside seq 2 was denied: %s", g.Reason)
	}

	// The other way round: the first copy is only cached (its sequence is
	// gone) when the second commits. The node takes the second copy, whose
	// table does not change, and the cached copy is freed: Commit
	// references no block that was unreferenced.
	m, _ = configure(t, smallCfg(13, 0))
	mustGrant(t, m, kvcache.ReserveItem{Seq: 1, Tokens: 13, New: true, Prompt: p})
	mustGrant(t, m, kvcache.ReserveItem{Seq: 2, Tokens: 13, New: true, Prompt: p})
	mustCommit(t, m, 1, 13)
	if err := m.Release(ctx, []kvcache.SeqID{1}); err != nil {
		t.Fatal(err)
	}
	before := seqState(t, inspect(t, m), 2)
	mustCommit(t, m, 2, 13)
	snap = inspect(t, m)
	if s2 := seqState(t, snap, 2); !slices.Equal(s2.Tables[0], before.Tables[0]) {
		t.Fatalf("seq 2's table %v changed from %v", s2.Tables[0], before.Tables[0])
	}
	if ps := snap.Pools[0]; ps.Cached != 0 || ps.InUse != 4 || ps.Free != 9 {
		t.Fatalf("pool %+v, want seq 2's 4 blocks in use (3 now the tree's), the cached copy freed", ps)
	}
	for i, n := range m.tree.Match(p, 3, nil) {
		if n.pages[0] != before.Tables[0][i] {
			t.Fatalf("tree page %d = %d, want seq 2's block %d", i, n.pages[0], before.Tables[0][i])
		}
	}
	if g := mustGrant(t, m, kvcache.ReserveItem{Seq: 2, Tokens: 1}); len(g.Tables) != 0 {
		t.Fatalf("seq 2's next grant tables %+v, want none (its table did not change)", g.Tables)
	}
}

// TestDivergingPrefixRegistersLaterBlocks: two concurrent requests share a
// two-block prefix, computed by both, then diverge for two blocks each.
// Registration goes on past the shared blocks that the tree already held
// from the other request, so both requests' unique blocks are registered
// under the one shared node and found by Lookup, also after both are gone.
func TestDivergingPrefixRegistersLaterBlocks(t *testing.T) {
	m, _ := configure(t, smallCfg(32, 0))
	shared := tokens(8, 1)
	a := append(slices.Clone(shared), tokens(8, 2)...)
	b := append(slices.Clone(shared), tokens(8, 3)...)
	gs, err := m.Reserve(ctx, []kvcache.ReserveItem{
		{Seq: 1, Tokens: 4, New: true, Prompt: append(slices.Clone(a), 7)},
		{Seq: 2, Tokens: 4, New: true, Prompt: append(slices.Clone(b), 7)},
	})
	if err != nil || !gs[0].OK || !gs[1].OK {
		t.Fatalf("Reserve = %+v, %v", gs, err)
	}
	// Chunked prefill, both in every step: 4 tokens, then 13 (all but the last).
	if _, err := m.Commit(ctx, []kvcache.CommitItem{{Seq: 1, Accepted: 4}, {Seq: 2, Accepted: 4}}); err != nil {
		t.Fatal(err)
	}
	gs, err = m.Reserve(ctx, []kvcache.ReserveItem{{Seq: 1, Tokens: 13}, {Seq: 2, Tokens: 13}})
	if err != nil || !gs[0].OK || !gs[1].OK {
		t.Fatalf("Reserve = %+v, %v", gs, err)
	}
	if _, err := m.Commit(ctx, []kvcache.CommitItem{{Seq: 1, Accepted: 13}, {Seq: 2, Accepted: 13}}); err != nil {
		t.Fatal(err)
	}
	snap := inspect(t, m)
	s1, s2 := seqState(t, snap, 1), seqState(t, snap, 2)
	if !slices.Equal(s1.Tables[0][:2], s2.Tables[0][:2]) {
		t.Fatalf("tables %v and %v: want the shared prefix's 2 blocks shared", s1.Tables[0], s2.Tables[0])
	}
	if n := m.tree.Nodes(); n != 6 {
		t.Fatalf("tree holds %d nodes, want 6 (2 shared + 2 + 2 unique)", n)
	}
	probe := func(p []int32) []int32 { return append(slices.Clone(p), 9) }
	look, _ := m.Lookup(ctx, []kvcache.LookupItem{{Prompt: probe(a)}, {Prompt: probe(b)}, {Prompt: probe(shared)}})
	if !slices.Equal(look, []int{16, 16, 8}) {
		t.Fatalf("Lookup while both run = %v, want [16 16 8]: both requests' unique blocks registered", look)
	}
	if err := m.Release(ctx, []kvcache.SeqID{1, 2}); err != nil {
		t.Fatal(err)
	}
	if ps := inspect(t, m).Pools[0]; ps.Cached != 6 || ps.InUse != 0 {
		t.Fatalf("after release %+v, want the 6 registered blocks cached", ps)
	}
	look, _ = m.Lookup(ctx, []kvcache.LookupItem{{Prompt: probe(a)}, {Prompt: probe(b)}})
	if !slices.Equal(look, []int{16, 16}) {
		t.Fatalf("Lookup after release = %v, want [16 16]", look)
	}
	// A third request takes all of b's blocks from the cache.
	g := mustGrant(t, m, kvcache.ReserveItem{Seq: 3, Tokens: 1, New: true, Prompt: probe(b), Reuse: 16})
	path := m.tree.Match(b, 4, nil)
	for i, n := range path {
		if g.Tables[0].Blocks[i] != n.pages[0] {
			t.Fatalf("seq 3 table %v, want the tree's pages of b for its first 4 blocks", g.Tables[0].Blocks)
		}
	}
	inspect(t, m)
}

// TestSelfCheckFindsCorruption: the deep Inspect notices a broken tree (a
// pin count off by one, a wrong evictable count, a pinned node cut off the
// tree, a pinned node in the eviction heap) and a broken pool. The
// corruptions happen behind the manager's back (nothing is marked dirty), so
// only the full check can see them: the test asks for it every time
// (dirty_test.go corrupts through the marks and compares both checks).
func TestSelfCheckFindsCorruption(t *testing.T) {
	for _, tc := range []struct {
		name    string
		corrupt func(m *Manager)
		want    string
	}{
		{"pins", func(m *Manager) {
			for c := range m.tree.root.children.all() {
				c.pins++
				return
			}
		}, "pins"},
		{"evictable", func(m *Manager) { m.tree.evictable++ }, "evictable"},
		{"detached", func(m *Manager) {
			for c := range m.tree.root.children.all() {
				if c.pins > 0 {
					m.tree.root.children.del(c)
					return
				}
			}
		}, "not attached"},
		{"heap", func(m *Manager) {
			for c := range m.tree.root.children.all() {
				m.tree.heap = append(m.tree.heap, c) // pinned: no evictable leaf
				return
			}
		}, "eviction heap"},
		{"refcount", func(m *Manager) { m.pools[0].refs[0]++ }, "refcount"},
	} {
		m, _ := configure(t, smallCfg(16, 0))
		m.SetFullCheckEvery(1)
		mustGrant(t, m, kvcache.ReserveItem{Seq: 1, Tokens: 13, New: true, Prompt: tokens(13, 1)})
		mustCommit(t, m, 1, 13)
		deep := func() []string { return deepViolations(t, m) }
		if v := deep(); len(v) != 0 {
			t.Fatalf("%s: violations before corrupting: %v", tc.name, v)
		}
		tc.corrupt(m)
		v := deep()
		if !slices.ContainsFunc(v, func(s string) bool { return strings.Contains(s, tc.want) }) {
			t.Errorf("%s: violations %v, want one about %q", tc.name, v, tc.want)
		}
	}
}

// deepViolations is what a full Inspect of m (tables included) reports.
func deepViolations(t *testing.T, m *Manager) []string {
	t.Helper()
	snap, err := m.Inspect(ctx, kvcache.InspectOptions{Tables: true})
	if err != nil {
		t.Fatal(err)
	}
	return snap.Violations
}

// TestSelfCheckFindsReusedBlockTokens: a sequence keeps only a checksum of
// the prompt blocks it reuses (Seq.headSum); the deep check still finds a
// reused path node whose tokens are not the prompt's (S10).
func TestSelfCheckFindsReusedBlockTokens(t *testing.T) {
	m, _ := configure(t, smallCfg(16, 0))
	m.SetFullCheckEvery(1)
	p := tokens(13, 1)
	mustGrant(t, m, kvcache.ReserveItem{Seq: 1, Tokens: 13, New: true, Prompt: p})
	mustCommit(t, m, 1, 13)
	deep := func() []string { return deepViolations(t, m) }
	if v := deep(); len(v) != 0 {
		t.Fatalf("violations before reuse: %v", v)
	}
	mustGrant(t, m, kvcache.ReserveItem{Seq: 2, Tokens: 1, New: true, Prompt: p, Reuse: 12})
	s := m.seqs[2]
	if got := s.PromptBlock(1, m.tpb); !slices.Equal(got, p[4:8]) {
		t.Fatalf("PromptBlock(1) = %v, want %v", got, p[4:8])
	}
	n := s.path[1]
	n.tokens = slices.Clone(n.tokens)
	n.tokens[2]++
	want := "seq 2: path node 1 holds other tokens than prompt block 1"
	if v := deep(); !slices.ContainsFunc(v, func(s string) bool { return strings.Contains(s, want) }) {
		t.Errorf("violations %v, want %q", v, want)
	}
}
