package cachemgrv2

import (
	"slices"
	"testing"

	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
)

// TestExportsForMamba covers the exports the mamba manager builds on:
// EvictLeaf returns the node EvictOne would evict, and it stays attached
// until Prune; Child, Depth, Walk and Check agree with the tree.
func TestExportsForMamba(t *testing.T) {
	const tpb = 4
	pool := NewBlockPool(0, kvcache.TierDevice, 8)
	tr := NewTree(tpb, []*BlockPool{pool})
	blk := func(k int32) []int32 { return []int32{k, k, k, k} }
	var path []*Node
	parent := tr.Root()
	for k := range int32(3) {
		b := pool.Take(nil, 1)
		n, adopted := tr.Extend(parent, blk(k), b)
		if !adopted {
			t.Fatalf("Extend(%d) did not adopt", k)
		}
		path = append(path, n)
		parent = n
	}
	if got := tr.Child(path[0], blk(1)); got != path[1] {
		t.Fatalf("Child = %p, want %p", got, path[1])
	}
	if d := tr.Depth(path[2]); d != 3 {
		t.Fatalf("Depth = %d, want 3", d)
	}
	tr.BeginCheck()
	for _, n := range path {
		tr.CountPin(n)
	}
	if v := tr.Check(); len(v) > 0 {
		t.Fatalf("Check with pins: %v", v)
	}
	if tr.EvictLeaf() != nil {
		t.Fatal("EvictLeaf evicted a pinned node")
	}
	for i := len(path) - 1; i >= 0; i-- {
		pool.Unref(path[i].Pages()[0])
		tr.Unpin(path[i], true)
	}
	tr.BeginCheck()
	if v := tr.Check(); len(v) > 0 {
		t.Fatalf("Check unpinned: %v", v)
	}
	n := tr.EvictLeaf()
	if n != path[2] || n.Complete() || !tr.Attached(n) {
		t.Fatalf("EvictLeaf = %p (complete %v, attached %v), want the leaf %p, without pages, still attached", n, n.Complete(), tr.Attached(n), path[2])
	}
	walked := 0
	tr.Walk(func(*Node) { walked++ })
	if walked != 3 || tr.Nodes() != 3 {
		t.Fatalf("Walk saw %d nodes, Nodes %d, want 3 before Prune", walked, tr.Nodes())
	}
	tr.Prune()
	if tr.Attached(n) || tr.Nodes() != 2 {
		t.Fatalf("after Prune: attached %v, %d nodes; want detached, 2", tr.Attached(n), tr.Nodes())
	}
	tr.BeginCheck()
	if v := tr.Check(); len(v) > 0 {
		t.Fatalf("Check after Prune: %v", v)
	}
}

// growTree returns an empty tree of tpb-token blocks over a pool of blocks
// pages, and extend, which adds child (k, k, ...) of parent and fails the
// test when the tree does not adopt it.
func growTree(t *testing.T, tpb, blocks int) (*Tree, func(parent *Node, k int32) *Node) {
	t.Helper()
	pool := NewBlockPool(0, kvcache.TierDevice, blocks)
	tr := NewTree(tpb, []*BlockPool{pool})
	return tr, func(parent *Node, k int32) *Node {
		t.Helper()
		toks := make([]int32, tpb)
		for i := range toks {
			toks[i] = k
		}
		n, adopted := tr.Extend(parent, toks, pool.Take(nil, 1))
		if !adopted {
			t.Fatalf("Extend(%d) did not adopt", k)
		}
		return n
	}
}

// TestWalkDepth: WalkDepth visits every attached node once, parents before
// their children, each at its Depth, on a tree with branches and a path
// deeper than a recursive walk would like.
func TestWalkDepth(t *testing.T) {
	const tpb, deep = 2, 5000
	tr, extend := growTree(t, tpb, deep+16)
	a := extend(tr.Root(), 1)
	b := extend(tr.Root(), 2)
	a1, a2 := extend(a, 3), extend(a, 4)
	extend(a1, 5)
	extend(b, 6)
	n := a2
	for k := range int32(deep) {
		n = extend(n, 100+k)
	}
	seen := map[*Node]int{}
	tr.WalkDepth(func(n *Node, d int) {
		if _, ok := seen[n]; ok {
			t.Fatalf("node %p visited twice", n)
		}
		if p := n.Parent(); p != tr.Root() {
			if _, ok := seen[p]; !ok {
				t.Fatalf("node %p before its parent", n)
			}
		}
		if want := tr.Depth(n); d != want {
			t.Fatalf("WalkDepth gives depth %d, Depth %d", d, want)
		}
		seen[n] = d
	})
	if len(seen) != tr.Nodes() || seen[n] != deep+2 {
		t.Fatalf("walked %d nodes (deepest at %d), want %d (deepest at %d)", len(seen), seen[n], tr.Nodes(), deep+2)
	}
}

// TestPlaced: Placed answers Depth for every attached node, on paths of
// thousands of blocks, in either order, and still after a cut elsewhere in
// the tree. (A cut node keeps its records until a check finds it: Placed
// is trusted only after a clean check, so detached nodes are not asked.)
func TestPlaced(t *testing.T) {
	const tpb, deep = 2, 3000
	tr, extend := growTree(t, tpb, deep+16)
	a := extend(tr.Root(), 1)
	b := extend(tr.Root(), 2)
	a1, a2 := extend(a, 3), extend(a, 4)
	a11 := extend(a1, 5)
	b1 := extend(b, 6)
	nodes := []*Node{a, b, a1, a2, a11, b1}
	n := a2
	for k := range int32(deep) {
		n = extend(n, 100+k)
		nodes = append(nodes, n)
	}
	check := func(order []*Node) {
		t.Helper()
		for _, n := range order {
			if !tr.Attached(n) {
				continue
			}
			if d, ok := tr.Placed(n); !ok || d != tr.Depth(n) {
				t.Fatalf("Placed(node at %d) = %d, %v", tr.Depth(n), d, ok)
			}
		}
	}
	check(nodes)
	back := slices.Clone(nodes)
	slices.Reverse(back)
	check(back)
	a.children.del(a1) // a1 and a11 are detached now, the rest still attached
	if tr.Attached(a1) || tr.Attached(a11) || !tr.Attached(a2) {
		t.Fatal("cutting a1 from a did not detach a1 and a11 only")
	}
	check(nodes)
}
