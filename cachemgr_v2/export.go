package cachemgrv2

import "fmt"

// This file holds exports of the Tree for managers built on Core (the mamba
// manager's Hooks and its self-check read the tree through them). They add
// no behaviour: each one exposes what the Core already does internally.
// Managers evict only through the Core (Hooks.Evicted tells them); EvictLeaf
// is for tests that break a tree behind a manager's back.

// Complete reports whether the node holds a page in every pool group, so a
// sequence may take the whole block from the cache.
func (n *Node) Complete() bool { return n.complete() }

// Child returns parent's child holding exactly tokens (one full block), or
// nil. It changes nothing.
func (t *Tree) Child(parent *Node, tokens []int32) *Node { return t.child(parent, "", tokens) }

// SaltedChild is Child under cache salt salt: a child of the root matches
// only a block stored under the same salt.
func (t *Tree) SaltedChild(parent *Node, salt string, tokens []int32) *Node {
	return t.child(parent, salt, tokens)
}

// EvictLeaf is EvictOne that returns the evicted node (nil when nothing is
// evictable). The node keeps its place in the tree, without pages, until a
// Prune at a safe point; the caller must drop whatever it keeps about the
// node's content now.
func (t *Tree) EvictLeaf() *Node { return t.evictLeaf() }

// Attached reports whether n is reachable from the root through child links
// (every ancestor lists its child under the child's hash). A pinned node is
// always attached; an evicted one stays attached until Prune.
func (t *Tree) Attached(n *Node) bool {
	for n != t.root {
		p := n.parent
		if p == nil || p.children.get(n.hash) != n {
			return false
		}
		n = p
	}
	return true
}

// Depth is the number of blocks from the root to n (n's block included).
func (t *Tree) Depth(n *Node) int {
	d := 0
	for ; n != t.root && n != nil; n = n.parent {
		d++
	}
	return d
}

// Ref names n for good among its tree's nodes (it survives the node's
// pruning and reuse for another block): a small integer, 1 for the root,
// the index of PinnedPriority.
func (n *Node) Ref() int32 { return n.ref }

// Placed reports whether n is listed among the tree's attached nodes (at
// its recorded list position), and its depth (Depth) when it is, in O(1):
// from the node's own records, which the deep check proves (Tree.Check
// and its incremental form: every listed node reaches the root through
// linked parents, and its depth is its parent's plus one), so after a
// clean check of the same tree, Placed answers what Attached and Depth
// would.
func (t *Tree) Placed(n *Node) (depth int, ok bool) {
	if !t.listed(n) {
		return 0, false
	}
	return int(n.depth), true
}

// Walk calls f for every node attached to the tree, root excluded, parents
// before their children. f must not change the tree.
func (t *Tree) Walk(f func(n *Node)) {
	t.WalkDepth(func(n *Node, _ int) { f(n) })
}

// WalkDepth is Walk that also gives each node's depth (Depth: the root's
// children are at 1). It keeps its own stack, so a path of a million-token
// prompt does not grow the goroutine's.
func (t *Tree) WalkDepth(f func(n *Node, depth int)) {
	type entry struct {
		n     *Node
		depth int
	}
	stack := []entry{{t.root, 0}}
	for len(stack) > 0 {
		e := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		if e.n != t.root {
			f(e.n, e.depth)
		}
		for c := range e.n.children.all() {
			stack = append(stack, entry{c, e.depth + 1})
		}
	}
}

// BeginCheck starts a deep self-check of the tree: the caller then counts,
// with CountPin, every pin its sequences hold, and calls Check.
func (t *Tree) BeginCheck() {
	t.epoch++
	t.counted = t.counted[:0]
}

// CountPin counts one pin on n that a sequence holds, for Check.
func (t *Tree) CountPin(n *Node) {
	t.scratch(n)
	if n.chkPins == 0 {
		t.counted = append(t.counted, n.ref)
	}
	n.chkPins++
}

// scratch readies n's check scratch for this check.
func (t *Tree) scratch(n *Node) {
	if n.chkEpoch != t.epoch {
		n.chkEpoch, n.chkPins, n.chkLive, n.chkFlags = t.epoch, 0, 0, 0
	}
}

// Check recomputes the tree's incremental state and returns what is wrong:
// each node's pins equal the pins counted since BeginCheck (CountPin: what
// the caller's sequences hold), pinned nodes hold all their pages and have
// pinned parents, parent links and hash keys, live-kid counts, the node
// count, the evictable count, and the eviction heap (exactly the unpinned
// leaves with pages, heap-ordered), and that every page is owned by its
// node in its pool. A counted node that is not attached is reported. It
// changes nothing but the nodes' check scratch.
//
// It visits the nodes through the tree's list of attached nodes rather than
// by iterating every child map (starting a map iteration costs more than the
// rest of a node's checks together). Nothing is lost by that: each listed
// node must be its parent's child under its hash, the child maps must list
// exactly as many nodes as the list holds, and every listed node must reach
// the root through its parents, so the list and the tree hold the same nodes.
func (t *Tree) Check() []string {
	var v []string
	bad := func(format string, args ...any) { v = append(v, fmt.Sprintf(format, args...)) }
	evictable, leaves := 0, 0

	// Pass 1: list positions, parent links and hash keys, the child-map
	// census, live kids recounted into the parents' scratch.
	listed := t.root.children.len()
	rootLive := int32(0)
	for i, n := range t.all {
		if int(n.allIdx) != i {
			bad("tree: node %p: at list position %d, records %d", n, i, n.allIdx)
		}
		t.scratch(n)
		p := n.parent
		if p == nil || p.children.get(n.hash) != n {
			bad("tree: node %p: parent link or hash key wrong", n)
			continue
		}
		n.chkFlags |= chkLinked
		if n.depth != p.depth+1 {
			bad("tree: node %p: depth %d under a parent at depth %d", n, n.depth, p.depth)
		}
		listed += n.children.len()
		if n.nPages > 0 {
			if p == t.root {
				rootLive++
			} else {
				t.scratch(p)
				p.chkLive++
			}
		}
	}
	if listed != len(t.all) {
		bad("tree: child maps hold %d nodes, %d attached", listed, len(t.all))
	}
	if rootLive != t.root.liveKids {
		bad("tree: node %p: live kids %d, recomputed %d", t.root, t.root.liveKids, rootLive)
	}

	// Pass 2: every node reaches the root through linked nodes (no
	// detached subtree, no cycle), memoised through chkSeen so the whole pass
	// is linear.
	for _, n := range t.all {
		steps := 0
		m := n
		for m != t.root && m != nil && m.chkEpoch == t.epoch && m.chkFlags&(chkSeen|chkLinked) == chkLinked {
			if steps++; steps > len(t.all) {
				break
			}
			m = m.parent
		}
		if m != t.root && (m == nil || m.chkEpoch != t.epoch || m.chkFlags&chkSeen == 0) {
			bad("tree: node %p: does not reach the root through its parents", n)
			continue
		}
		for m = n; m != t.root && m.chkFlags&chkSeen == 0; m = m.parent {
			m.chkFlags |= chkSeen
		}
	}

	// Pass 3: each node's own counts.
	for _, n := range t.all {
		if n.chkFlags&chkSeen == 0 {
			continue
		}
		t.checkNodeCounts(n, n.chkLive, n.chkPins, bad)
		t.checkHot(n, bad)
		if n.pins == 0 && n.nPages > 0 {
			evictable++
			if n.chkLive == 0 {
				n.chkFlags |= chkLeaf
				leaves++
			}
		}
	}
	for _, r := range t.counted {
		if n := t.nodeAt(r); n.chkFlags&chkSeen == 0 {
			bad("tree: node %p: pinned %d times by sequences but not attached to the tree", n, n.chkPins)
		}
	}
	if len(t.all) != t.nodes {
		bad("tree: %d nodes attached, counted %d", len(t.all), t.nodes)
	}
	if evictable != t.evictable {
		bad("tree: evictable %d, recomputed %d", t.evictable, evictable)
	}
	if leaves != len(t.heap) {
		bad("tree: eviction heap has %d nodes, %d evictable leaves", len(t.heap), leaves)
	}
	for i, n := range t.heap {
		if n.chkEpoch != t.epoch || n.chkFlags&chkLeaf == 0 || int(n.heapIdx) != i {
			bad("tree: heap entry %d is not an evictable leaf at its index", i)
		}
		if i > 0 && t.less(n, t.heap[(i-1)/2]) {
			bad("tree: heap order broken at %d", i)
		}
	}
	return v
}

// checkPages checks, for both deep checks, that n's device pages are owned
// by n in their pools and that n counts them.
func (t *Tree) checkPages(n *Node, bad func(string, ...any)) {
	got := 0
	for g, b := range n.pages {
		if b != NoBlock {
			got++
			if b < 0 || int(b) >= t.pools[g].Total() || t.pools[g].owner[b] != n {
				bad("tree: node %p: page %d in pool %d not owned by it", n, b, t.pools[g].id)
			}
		}
	}
	if got != n.nPages {
		bad("tree: node %p: %d pages, counted %d", n, n.nPages, got)
	}
}

// checkNodeCounts checks attached node n against its recounted children
// with pages (live) and pins, for both deep checks: its pages, pinned only
// whole and below a pinned parent, pages above children with pages, and
// queued for pruning once empty and unpinned.
func (t *Tree) checkNodeCounts(n *Node, live, pins int32, bad func(string, ...any)) {
	if n.liveKids != live {
		bad("tree: node %p: live kids %d, recomputed %d", n, n.liveKids, live)
	}
	if n.pins != pins {
		bad("tree: node %p: pins %d, recomputed %d", n, n.pins, pins)
	}
	t.checkPages(n, bad)
	if n.pins > 0 && !n.complete() {
		bad("tree: node %p: pinned by %d without all its pages (evicted while pinned)", n, n.pins)
	}
	if n.pins > 0 && n.parent != t.root && n.parent.pins == 0 {
		bad("tree: node %p: pinned but its parent is not", n)
	}
	if n.nPages == 0 && live > 0 {
		bad("tree: node %p: no pages but %d children with pages", n, live)
	}
	if n.nPages == 0 && n.h.n == 0 && n.pins == 0 && !n.queued && n.children.len() == 0 {
		bad("tree: node %p: empty and unpinned but not queued for pruning", n)
	}
}

// checkHot checks n's entry in the index of pins and priorities (Tree.hot).
func (t *Tree) checkHot(n *Node, bad func(string, ...any)) {
	if r := int(n.ref); r >= len(t.hot) || t.hot[r] != hotOf(n) {
		bad("tree: node %p: pinned and priority index wrong for pins %d, priority %d", n, n.pins, n.prio)
	}
}
