package cachemgrv2

import (
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
