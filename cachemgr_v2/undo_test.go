package cachemgrv2

import (
	"reflect"
	"slices"
	"testing"

	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
)

// worker models the worker's memory as the engine drives it: per pool, the
// token whose KV each slot of each block holds, and its view of each
// sequence's tables, built from the deltas of kept grants only. An undone
// grant is never applied (the engine drops its deltas and copies).
type worker struct {
	tpb    int
	mem    [][]int32 // per pool: block*tpb+slot
	tables map[kvcache.SeqID][][]kvcache.BlockID
}

func newWorker(lay kvcache.Layout) *worker {
	w := &worker{tables: map[kvcache.SeqID][][]kvcache.BlockID{}}
	for _, p := range lay.Pools {
		w.tpb = p.TokensPerBlock
		w.mem = append(w.mem, make([]int32, p.Blocks*p.TokensPerBlock))
	}
	return w
}

// run applies a kept grant of seq (deltas, copies) and its forward, which
// writes toks at positions from, from+1, ...
func (w *worker) run(seq kvcache.SeqID, g kvcache.Grant, from int, toks []int32) {
	if w.tables[seq] == nil {
		w.tables[seq] = make([][]kvcache.BlockID, len(w.mem))
	}
	tab := w.tables[seq]
	for _, d := range g.Tables {
		tab[d.Pool] = append(tab[d.Pool][:min(d.From, len(tab[d.Pool]))], d.Blocks...)
	}
	for _, c := range g.Copies {
		copy(w.mem[c.DstPool][int(c.DstBlock)*w.tpb:int(c.DstBlock+1)*w.tpb], w.mem[c.SrcPool][int(c.SrcBlock)*w.tpb:int(c.SrcBlock+1)*w.tpb])
	}
	for i, tok := range toks {
		pos := from + i
		w.mem[0][int(tab[0][pos/w.tpb])*w.tpb+pos%w.tpb] = tok
	}
}

// read checks that seq's first len(want) positions hold want.
func (w *worker) read(t *testing.T, seq kvcache.SeqID, want []int32) {
	t.Helper()
	tab := w.tables[seq][0]
	for pos, tok := range want {
		b := tab[pos/w.tpb]
		if got := w.mem[0][int(b)*w.tpb+pos%w.tpb]; got != tok {
			t.Fatalf("seq %d position %d (block %d) holds %d, want %d", seq, pos, b, got, tok)
		}
	}
}

// cache runs seq over its whole prompt p, commits and releases it: its full
// blocks stay cached.
func (w *worker) cache(t *testing.T, m *Manager, seq kvcache.SeqID, p []int32) {
	t.Helper()
	w.run(seq, mustGrant(t, m, kvcache.ReserveItem{Seq: seq, Tokens: len(p), New: true, Prompt: p}), 0, p)
	mustCommit(t, m, seq, len(p))
	if err := m.Release(ctx, []kvcache.SeqID{seq}); err != nil {
		t.Fatal(err)
	}
}

func looks(t *testing.T, m *Manager, prompts ...[]int32) []int {
	t.Helper()
	items := make([]kvcache.LookupItem, len(prompts))
	for i, p := range prompts {
		items[i].Prompt = p
	}
	n, err := m.Lookup(ctx, items)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func unreserve(t *testing.T, m *Manager, seqs ...kvcache.SeqID) {
	t.Helper()
	if err := m.Unreserve(ctx, seqs); err != nil {
		t.Fatalf("Unreserve(%v): %v", seqs, err)
	}
}

func evictions(t *testing.T, m *Manager) int64 {
	t.Helper()
	st, err := m.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return st.Evictions
}

// undoSetup caches a (13 tokens: 3 full blocks, a chain A1-A2-A3) and then b
// (9 tokens: B1-B2) in 9 blocks: 5 cached, 4 free. Leaf-first LRU eviction
// takes A3, A2, A1, B2, B1 in that order.
func undoSetup(t *testing.T, events bool) (*Manager, *worker, []int32, []int32) {
	cfg := smallCfg(9, 0)
	cfg.KVEvents = events
	m, lay := configure(t, cfg)
	w := newWorker(lay)
	a, b := tokens(13, 1), tokens(9, 2)
	w.cache(t, m, 1, a)
	w.cache(t, m, 2, b)
	if n := looks(t, m, a, b); !slices.Equal(n, []int{12, 8}) {
		t.Fatalf("Lookup(a, b) = %v after caching them, want [12 8]", n)
	}
	return m, w, a, b
}

// A reservation that evicted every cached block, undone, puts them all back:
// the state, the eviction order and Lookup are as before, and a later
// sequence reuses the content it finds with the right tokens.
func TestUnreservePutsBackEvicted(t *testing.T) {
	m, w, a, b := undoSetup(t, false)
	before, order, ev0 := inspect(t, m), evictionOrder(m.tree), evictions(t, m)
	mustGrant(t, m, kvcache.ReserveItem{Seq: 3, Tokens: 16, Hold: 34, New: true})
	if n := looks(t, m, a, b); !slices.Equal(n, []int{0, 0}) {
		t.Fatalf("Lookup(a, b) while seq 3 holds every block = %v, want [0 0]", n)
	}
	if got := evictions(t, m) - ev0; got != 5 {
		t.Fatalf("the reservation evicted %d blocks, want 5", got)
	}
	unreserve(t, m, 3)
	if after := inspect(t, m); !reflect.DeepEqual(after, before) {
		t.Fatalf("after Unreserve:\n got %+v\nwant %+v", after, before)
	}
	if !slices.Equal(evictionOrder(m.tree), order) {
		t.Fatal("Unreserve did not restore the eviction order")
	}
	if n := looks(t, m, a, b); !slices.Equal(n, []int{12, 8}) {
		t.Fatalf("Lookup(a, b) after the evicting reservation was undone = %v, want [12 8]", n)
	}
	w.run(4, mustGrant(t, m, kvcache.ReserveItem{Seq: 4, Tokens: 1, New: true, Prompt: a, Reuse: 12}), 12, a[12:])
	w.read(t, 4, a)
	w.run(5, mustGrant(t, m, kvcache.ReserveItem{Seq: 5, Tokens: 1, New: true, Prompt: b, Reuse: 8}), 8, b[8:])
	w.read(t, 5, b)
	mustCommit(t, m, 4, 1)
	mustCommit(t, m, 5, 1)
	inspect(t, m)
}

// An existing sequence's step that evicted is put back the same way.
func TestUnreserveStepPutsBack(t *testing.T) {
	m, w, a, b := undoSetup(t, false)
	c := tokens(4, 3)
	w.run(3, mustGrant(t, m, kvcache.ReserveItem{Seq: 3, Tokens: 4, New: true, Prompt: c}), 0, c)
	mustCommit(t, m, 3, 4) // 1 block of its own (registered), 3 free
	before := inspect(t, m)
	mustGrant(t, m, kvcache.ReserveItem{Seq: 3, Tokens: 16, Draft: 2, Hold: 28}) // 6 more blocks: 3 evicted
	if n := looks(t, m, a, b); !slices.Equal(n, []int{0, 8}) {
		t.Fatalf("Lookup(a, b) during the step = %v, want [0 8]", n)
	}
	unreserve(t, m, 3)
	if after := inspect(t, m); !reflect.DeepEqual(after, before) {
		t.Fatalf("after Unreserve:\n got %+v\nwant %+v", after, before)
	}
	if n := looks(t, m, a, b); !slices.Equal(n, []int{12, 8}) {
		t.Fatalf("Lookup(a, b) after the step was undone = %v, want [12 8]", n)
	}
}

// Two reservations of one batch, undone in one call in either order: the
// first evicted the leaf A3, the second its parents A2 and A1 (leaves only
// after A3 went). Putting back latest eviction first over the whole call
// gives every parent its pages before its child.
func TestUnreserveBatchPutsBackParentsFirst(t *testing.T) {
	for _, order := range [][]kvcache.SeqID{{3, 4}, {4, 3}} {
		m, w, a, b := undoSetup(t, false)
		before := inspect(t, m)
		gs, err := m.Reserve(ctx, []kvcache.ReserveItem{
			{Seq: 3, Tokens: 16, Hold: 20, New: true}, // 4 free + A3
			{Seq: 4, Tokens: 8, New: true},            // A2, A1
		})
		if err != nil || !gs[0].OK || !gs[1].OK {
			t.Fatalf("Reserve = %+v, %v", gs, err)
		}
		if n := looks(t, m, a, b); !slices.Equal(n, []int{0, 8}) {
			t.Fatalf("Lookup(a, b) during the batch = %v, want [0 8]", n)
		}
		unreserve(t, m, order...)
		if after := inspect(t, m); !reflect.DeepEqual(after, before) {
			t.Fatalf("Unreserve(%v):\n got %+v\nwant %+v", order, after, before)
		}
		if n := looks(t, m, a, b); !slices.Equal(n, []int{12, 8}) {
			t.Fatalf("Lookup(a, b) after Unreserve(%v) = %v, want [12 8]", order, n)
		}
		w.run(5, mustGrant(t, m, kvcache.ReserveItem{Seq: 5, Tokens: 1, New: true, Prompt: a, Reuse: 12}), 12, a[12:])
		w.read(t, 5, a)
	}
}

// A page allocated again since the eviction may have been written: its node
// is not put back, nor are the nodes below it (a node with pages needs a
// parent with pages), and the others still are. No call of the API can hand
// out a page an outstanding reservation holds, so the test counts one more
// allocation of the page itself, as an allocation path that could (a
// promotion, a host tier) would.
func TestUnreserveSkipsReallocatedPage(t *testing.T) {
	for _, tc := range []struct {
		node         int // in eviction order: A3, A2, A1, B2, B1
		look         []int
		cached, free int
	}{
		{0, []int{8, 8}, 4, 5}, // A3: A1, A2 and b are intact
		{2, []int{0, 8}, 2, 7}, // A1: A2 and A3 below it stay evicted
	} {
		m, _, a, b := undoSetup(t, false)
		mustGrant(t, m, kvcache.ReserveItem{Seq: 3, Tokens: 16, Hold: 34, New: true})
		r := &m.seqs[3].undo
		a1 := m.tree.child(m.tree.root, "", a[:4])
		a3 := m.tree.child(m.tree.child(a1, "", a[4:8]), "", a[8:12])
		if len(r.nodes) != 5 || r.nodes[0].n != a3 || r.nodes[2].n != a1 {
			t.Fatalf("undo record %+v, want 5 nodes, A3 first, A1 third", r.nodes)
		}
		m.dev[0].gen[r.pages[r.nodes[tc.node].off]]++
		unreserve(t, m, 3)
		if n := looks(t, m, a, b); !slices.Equal(n, tc.look) {
			t.Fatalf("page of evicted node %d allocated again: Lookup(a, b) = %v, want %v", tc.node, n, tc.look)
		}
		if ps := inspect(t, m).Pools[0]; ps.Cached != tc.cached || ps.Free != tc.free {
			t.Fatalf("page of evicted node %d allocated again: pool %+v, want %d cached, %d free", tc.node, ps, tc.cached, tc.free)
		}
	}
}

// A node pruned at a safe point and reused for another block before the
// Unreserve (its generation changed) is not given the old block's pages,
// though it is attached, empty and a child of the root.
func TestUnreserveSkipsReusedNode(t *testing.T) {
	m, w, a, b := undoSetup(t, false)
	gs, err := m.Reserve(ctx, []kvcache.ReserveItem{
		{Seq: 3, Tokens: 2, New: true, Prompt: []int32{7, 7}}, // no full block
		{Seq: 4, Tokens: 16, Hold: 32, New: true},             // 3 free + all 5 cached
	})
	if err != nil || !gs[0].OK || !gs[1].OK {
		t.Fatalf("Reserve = %+v, %v", gs, err)
	}
	mustCommit(t, m, 3, 2) // a safe point: the evicted nodes are pruned
	if m.tree.Nodes() != 0 {
		t.Fatalf("tree holds %d nodes after the prune, want 0", m.tree.Nodes())
	}
	m.Release(ctx, []kvcache.SeqID{3})
	c := tokens(4, 9)
	w.cache(t, m, 5, c) // a new node, from the pruned ones
	n := m.tree.child(m.tree.root, "", c)
	if !slices.ContainsFunc(m.seqs[4].undo.nodes, func(e evicted) bool { return e.n == n }) {
		t.Fatal("c's node is not one of the pruned nodes seq 4 evicted: the test does not test")
	}
	mustGrant(t, m, kvcache.ReserveItem{Seq: 6, Tokens: 1, New: true}) // evicts c's node
	unreserve(t, m, 4)
	cc := append(slices.Clone(c), 0)
	if got := looks(t, m, a, b, cc); !slices.Equal(got, []int{0, 0, 0}) {
		t.Fatalf("Lookup(a, b, c) = %v, want [0 0 0]: nothing to put back", got)
	}
	if ps := inspect(t, m).Pools[0]; ps.Cached != 0 || ps.InUse != 1 {
		t.Fatalf("pool after Unreserve %+v, want seq 6's block in use, nothing cached", ps)
	}
}

// A Commit that stored the evicted content again (another sequence computed
// the same prompt) leaves one copy: the reservation's pages stay free.
func TestUnreserveSkipsStoredAgain(t *testing.T) {
	cfg := smallCfg(12, 0)
	m, lay := configure(t, cfg)
	w := newWorker(lay)
	a := tokens(13, 1)
	w.cache(t, m, 1, a) // 3 cached, 9 free
	gs, err := m.Reserve(ctx, []kvcache.ReserveItem{
		{Seq: 2, Tokens: 13, New: true, Prompt: a}, // 4 blocks, computing a again
		{Seq: 3, Tokens: 16, Hold: 32, New: true},  // 5 free + A3, A2, A1
	})
	if err != nil || !gs[0].OK || !gs[1].OK {
		t.Fatalf("Reserve = %+v, %v", gs, err)
	}
	w.run(2, gs[0], 0, a)
	mustCommit(t, m, 2, 13) // the evicted nodes adopt seq 2's pages
	m.Release(ctx, []kvcache.SeqID{2})
	unreserve(t, m, 3)
	if ps := inspect(t, m).Pools[0]; ps.Cached != 3 || ps.Free != 9 {
		t.Fatalf("pool after Unreserve %+v, want one copy of a cached (3), 9 free", ps)
	}
	w.run(4, mustGrant(t, m, kvcache.ReserveItem{Seq: 4, Tokens: 1, New: true, Prompt: a, Reuse: 12}), 12, a[12:])
	w.read(t, 4, a)
}

// With KV events, a put back takes the eviction's BlockRemoved back while it
// is unread; once read, the nodes stay evicted.
func TestUnreservePutsBackUnreadEvents(t *testing.T) {
	m, _, a, b := undoSetup(t, true)
	m.Events(ctx)
	mustGrant(t, m, kvcache.ReserveItem{Seq: 3, Tokens: 16, Hold: 34, New: true})
	unreserve(t, m, 3)
	if evs, _ := m.Events(ctx); len(evs) != 0 {
		t.Fatalf("events after an undone eviction = %+v, want none", evs)
	}
	if n := looks(t, m, a, b); !slices.Equal(n, []int{12, 8}) {
		t.Fatalf("Lookup(a, b) = %v, want [12 8]", n)
	}

	// Seq 4 evicts A3, A2, A1, then the events are read.
	mustGrant(t, m, kvcache.ReserveItem{Seq: 4, Tokens: 16, Hold: 28, New: true})
	evs, _ := m.Events(ctx)
	if len(evs) != 1 || evs[0].Kind != kvcache.BlockRemoved || len(evs[0].Hashes) != 3 {
		t.Fatalf("events = %+v, want one BlockRemoved of 3 blocks", evs)
	}
	unreserve(t, m, 4)
	if n := looks(t, m, a, b); !slices.Equal(n, []int{0, 8}) {
		t.Fatalf("Lookup(a, b) = %v after the removals were read, want [0 8]", n)
	}
	if evs, _ := m.Events(ctx); len(evs) != 0 {
		t.Fatalf("events after Unreserve = %+v, want none", evs)
	}
	inspect(t, m)
}
