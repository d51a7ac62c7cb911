package cachemgrv2

import (
	"slices"
	"testing"

	"pgregory.net/rapid"

	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
)

func TestLedger(t *testing.T) {
	for _, tc := range []struct {
		name                  string
		start                 Ledger
		tokens, draft, hold   int
		accepted              int
		wantNeed, wantCap     int // after Reserve
		wantHist, wantPostCap int // after Commit
		wantErr               bool
	}{
		{"decode, draft rejected at cap == hist", Ledger{History: 146000, Capacity: 146000}, 1, 1, 0, 1, 146002, 146002, 146001, 146001, false},
		{"decode, draft accepted", Ledger{History: 200, Capacity: 200}, 1, 1, 0, 2, 202, 202, 202, 202, false},
		{"prefill chunk", Ledger{History: 8192, Capacity: 8192}, 8192, 0, 0, 8192, 16384, 16384, 16384, 16384, false},
		{"hold keeps capacity", Ledger{History: 10, Capacity: 100, Hold: 100}, 1, 2, 0, 1, 100, 100, 11, 100, false},
		{"hold raised", Ledger{History: 10, Capacity: 10}, 1, 0, 50, 1, 50, 50, 11, 50, false},
		{"accepted beyond draft", Ledger{History: 200, Capacity: 200}, 1, 1, 0, 3, 202, 202, 200, 202, true},
		{"accepted below tokens", Ledger{History: 200, Capacity: 200}, 4, 0, 0, 3, 204, 204, 200, 204, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := tc.start
			if got := l.Need(tc.tokens, tc.draft, tc.hold); got != tc.wantNeed {
				t.Errorf("Need = %d, want %d", got, tc.wantNeed)
			}
			if got := l.Reserve(tc.tokens, tc.draft, tc.hold); got != tc.wantCap {
				t.Errorf("Reserve = %d, want %d", got, tc.wantCap)
			}
			reserved := l
			if r := l.CheckCommit(tc.accepted); (r != "") != tc.wantErr {
				t.Fatalf("CheckCommit(%d) = %q, want error %v", tc.accepted, r, tc.wantErr)
			}
			if tc.wantErr {
				l.Unreserve()
				l.undoCap, l.undoHold = 0, 0
				if l != tc.start {
					t.Errorf("Unreserve = %+v, want %+v", l, tc.start)
				}
				return
			}
			if got := l.Commit(tc.accepted); got != tc.wantPostCap || l.History != tc.wantHist || got > reserved.Capacity {
				t.Errorf("Commit = cap %d hist %d, want %d, %d (<= reserved %d)", got, l.History, tc.wantPostCap, tc.wantHist, reserved.Capacity)
			}
			if r := l.CheckCommit(0); r == "" {
				t.Error("second Commit accepted without a reservation")
			}
		})
	}
}

func TestBlockPool(t *testing.T) {
	p := NewBlockPool(3, kvcache.TierDevice, 4)
	got := p.Take(nil, 3)
	if !slices.Equal(got, []kvcache.BlockID{0, 1, 2}) || p.Free() != 1 {
		t.Fatalf("Take(3) = %v, free %d", got, p.Free())
	}
	n := &Node{pages: []kvcache.BlockID{1}}
	p.adopt(1, n)
	p.Ref(1)
	p.Unref(1)
	p.Unref(1) // last reference: a page becomes cached
	p.Unref(0) // a private block becomes free
	if st := p.Stats(); st != (kvcache.PoolStats{Pool: 3, Total: 4, Free: 2, Cached: 1, InUse: 1}) {
		t.Fatalf("Stats = %+v", st)
	}
	p.Ref(1) // reuse a cached page
	if st := p.Stats(); st.Cached != 0 || st.InUse != 2 {
		t.Fatalf("after reuse Stats = %+v", st)
	}
	p.Unref(1)
	p.drop(1) // evicted
	if st := p.Stats(); st.Free != 3 || st.Cached != 0 || p.Owner(1) != nil {
		t.Fatalf("after drop Stats = %+v", st)
	}
}

// treeFixture is a tree over one pool whose blocks are taken as needed.
type treeFixture struct {
	t    *testing.T
	pool *BlockPool
	tree *Tree
}

func newTreeFixture(t *testing.T, blocks int) *treeFixture {
	pool := NewBlockPool(0, kvcache.TierDevice, blocks)
	return &treeFixture{t: t, pool: pool, tree: NewTree(2, []*BlockPool{pool})}
}

// chain registers the blocks of toks (2 tokens each) like a sequence does
// and returns the pinned path.
func (f *treeFixture) chain(toks ...int32) []*Node {
	var path []*Node
	parent := f.tree.Root()
	for i := 0; i+2 <= len(toks); i += 2 {
		b := f.pool.Take(nil, 1)
		n, adopted := f.tree.Extend(parent, toks[i:i+2], b)
		if n == nil {
			f.t.Fatalf("Extend(%v) collided", toks[i:i+2])
		}
		if !adopted {
			f.pool.Unref(b[0]) // a duplicate: the block stays private and is freed here
		} else {
			f.pool.Unref(b[0]) // the sequence's reference; the node keeps the page
			f.pool.Ref(b[0])
		}
		path = append(path, n)
		parent = n
	}
	return path
}

func (f *treeFixture) release(path []*Node) {
	for i := len(path) - 1; i >= 0; i-- {
		if f.pool.Refs(path[i].pages[0]) > 0 {
			f.pool.Unref(path[i].pages[0])
		}
		f.tree.Unpin(path[i], true)
	}
}

func TestTreeEvictsLeavesFirstByLRUAndPrunesLater(t *testing.T) {
	f := newTreeFixture(t, 16)
	a := f.chain(1, 1, 2, 2, 3, 3) // a0 a1 a2
	b := f.chain(1, 1, 2, 2, 4, 4) // a0 a1 b2
	if b[0] != a[0] || b[1] != a[1] || b[2] == a[2] {
		t.Fatal("shared prefix not shared")
	}
	f.release(a) // a2 unpinned first: older
	f.release(b)
	if f.tree.Evictable() != 4 {
		t.Fatalf("evictable = %d, want 4", f.tree.Evictable())
	}
	// Leaves first, LRU: a2 (older) then b2, then a1, then a0.
	want := [][]int32{{3, 3}, {4, 4}, {2, 2}, {1, 1}}
	for i, w := range want {
		heap0 := f.tree.heap[0]
		if !slices.Equal(heap0.tokens, w) {
			t.Fatalf("eviction %d: next victim %v, want %v", i, heap0.tokens, w)
		}
		if !f.tree.EvictOne() {
			t.Fatalf("eviction %d failed", i)
		}
		if f.tree.Nodes() != 4 {
			t.Fatalf("nodes = %d before Prune, want 4 (deferred)", f.tree.Nodes())
		}
	}
	if f.tree.EvictOne() {
		t.Fatal("evicted from an empty cache")
	}
	if f.pool.Free() != 16 {
		t.Fatalf("free = %d after evicting all, want 16", f.pool.Free())
	}
	f.tree.Prune()
	if f.tree.Nodes() != 0 || f.tree.Root().children.len() != 0 {
		t.Fatalf("nodes = %d after Prune, want 0", f.tree.Nodes())
	}
}

func TestTreePinnedPathNeverEvicted(t *testing.T) {
	f := newTreeFixture(t, 16)
	live := f.chain(1, 1, 2, 2) // stays pinned
	dead := f.chain(1, 1, 5, 5, 6, 6)
	f.release(dead) // unpins d2, d1 ("5 5"); a0 keeps live's pin
	for f.tree.EvictOne() {
	}
	if !live[0].complete() || !live[1].complete() || live[0].pins != 1 || live[1].pins != 1 {
		t.Fatalf("pinned path lost pages or pins: %+v %+v", live[0], live[1])
	}
	f.tree.Prune()
	if got := f.tree.MatchLen([]int32{1, 1, 2, 2}, 2); got != 2 {
		t.Fatalf("MatchLen(live) = %d after eviction, want 2", got)
	}
	if got := f.tree.MatchLen([]int32{1, 1, 5, 5}, 2); got != 1 {
		t.Fatalf("MatchLen(dead) = %d, want 1", got)
	}
	// The live sequence extends its path under its pinned tail.
	more := f.chain(1, 1, 2, 2, 7, 7)
	if more[1] != live[1] || more[2].parent != live[1] {
		t.Fatal("extension did not attach under the pinned node")
	}
}

// TestTreeReattachEvictedNode: a sequence that computes a block whose node was
// evicted but not yet pruned gives the node its pages back (the node is
// re-attached to the cache, never dereferenced after detach).
func TestTreeReattachEvictedNode(t *testing.T) {
	f := newTreeFixture(t, 8)
	p := f.chain(1, 1, 2, 2)
	f.release(p)
	f.tree.EvictOne() // evicts "2 2"; node stays attached, queued
	if p[1].nPages != 0 || !p[1].queued {
		t.Fatal("evicted node should be pageless and queued")
	}
	q := f.chain(1, 1, 2, 2)
	if q[1] != p[1] || !q[1].complete() || q[1].pins != 1 {
		t.Fatalf("re-attach: got node %p (pins %d, pages %v), want %p with a page", q[1], q[1].pins, q[1].pages, p[1])
	}
	f.tree.Prune() // must not prune the re-attached, pinned node
	if f.tree.MatchLen([]int32{1, 1, 2, 2}, 2) != 2 {
		t.Fatal("re-attached node pruned")
	}
}

func TestTreeMatchPartial(t *testing.T) {
	pool := NewBlockPool(0, kvcache.TierDevice, 8)
	tr := NewTree(4, []*BlockPool{pool})
	for _, blk := range [][]int32{{1, 2, 3, 4}, {1, 2, 9, 9}, {1, 7, 7, 7}} {
		n, _ := tr.Extend(tr.Root(), blk, pool.Take(nil, 1))
		tr.Unpin(n, true)
	}
	for _, tc := range []struct {
		q    []int32
		want []int32
		n    int
	}{
		{[]int32{1, 2, 3, 5}, []int32{1, 2, 3, 4}, 3},
		{[]int32{1, 2, 9}, []int32{1, 2, 9, 9}, 3},
		{[]int32{1, 7}, []int32{1, 7, 7, 7}, 2},
		{[]int32{5}, nil, 0},
	} {
		n, k := tr.MatchPartial(tr.Root(), tc.q)
		if k != tc.n || (n == nil) != (tc.want == nil) || (n != nil && !slices.Equal(n.tokens, tc.want)) {
			t.Errorf("MatchPartial(%v) = %v, %d; want %v, %d", tc.q, n, k, tc.want, tc.n)
		}
	}
}

// randomTree is a tree of 2-token blocks over a 2-token alphabet (so
// prompts share prefixes and nodes have one child or several), under two
// salts, after random registrations, releases, evictions and prunes; it
// returns every node it ever made (pruned and recycled ones too) and the
// root.
func randomTree(rt *rapid.T) (*Tree, []*Node) {
	pool := NewBlockPool(0, kvcache.TierDevice, 12)
	tr := NewTree(2, []*BlockPool{pool})
	seen := []*Node{tr.Root()}
	var pinned [][]*Node
	for range rapid.IntRange(1, 30).Draw(rt, "ops") {
		switch rapid.IntRange(0, 2).Draw(rt, "op") {
		case 0: // register a prompt of a few blocks, pinned
			parent, sl := tr.Root(), randomSalt(rt)
			var path []*Node
			for range rapid.IntRange(1, 3).Draw(rt, "blocks") {
				if pool.Free() == 0 && !tr.EvictOne() {
					break
				}
				b := pool.Take(nil, 1)
				n, adopted := tr.extend(parent, sl, randomBlock(rt, "tok"), b)
				pool.Unref(b[0])
				if n == nil {
					break
				}
				if adopted {
					pool.Ref(b[0])
				}
				path = append(path, n)
				seen = append(seen, n)
				parent = n
			}
			pinned = append(pinned, path)
		case 1: // release one
			if len(pinned) > 0 {
				i := rapid.IntRange(0, len(pinned)-1).Draw(rt, "release")
				for j := len(pinned[i]) - 1; j >= 0; j-- {
					n := pinned[i][j]
					if n.nPages > 0 && pool.Refs(n.pages[0]) > 0 {
						pool.Unref(n.pages[0])
					}
					tr.Unpin(n, true)
				}
				pinned = append(pinned[:i], pinned[i+1:]...)
			}
		case 2: // evict, then prune (detached nodes go to the spare list)
			for range rapid.IntRange(0, 3).Draw(rt, "evict") {
				tr.EvictOne()
			}
			tr.Prune()
		}
	}
	return tr, seen
}

func randomBlock(rt *rapid.T, label string) []int32 {
	return []int32{rapid.Int32Range(1, 2).Draw(rt, label), rapid.Int32Range(1, 2).Draw(rt, label)}
}

func randomSalt(rt *rapid.T) string { return rapid.SampledFrom([]string{"", "s"}).Draw(rt, "salt") }

// TestChildIsKeyLookup: Tree.child, which skips the key when a parent has
// one child, finds what the lookup by key finds (the child under the key
// of the block, when it holds the block, under the same salt at the root).
func TestChildIsKeyLookup(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		tr, seen := randomTree(rt)
		for range 50 {
			parent := rapid.SampledFrom(seen).Draw(rt, "parent")
			sl, b := randomSalt(rt), randomBlock(rt, "query")
			want := parent.children.get(tr.key(parent, sl, b))
			if want != nil && (!slices.Equal(want.tokens, b) || parent == tr.root && want.salt != sl) {
				want = nil
			}
			if got := tr.child(parent, sl, b); got != want {
				rt.Fatalf("child(%p, %q, %v) = %p, want the keyed child %p", parent, sl, b, got, want)
			}
		}
	})
}

// TestChildViaIsChild: a walk's guessed child (Tree.childVia, the hint of
// Core.walk and Reserve's matchVia) is the child Tree.child finds, whatever
// the guess: the right node, a node of another prefix, salt or depth, an
// evicted, pruned or recycled one, or none.
func TestChildViaIsChild(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		tr, seen := randomTree(rt)
		for range 50 {
			parent := rapid.SampledFrom(seen).Draw(rt, "parent")
			g := rapid.SampledFrom(append([]*Node{nil}, seen...)).Draw(rt, "guess")
			sl, b := randomSalt(rt), randomBlock(rt, "query")
			if got, want := tr.childVia(g, parent, sl, b), tr.child(parent, sl, b); got != want {
				rt.Fatalf("childVia(%p, %p, %q, %v) = %p, want child's %p", g, parent, sl, b, got, want)
			}
		}
	})
}
