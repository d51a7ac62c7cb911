package cachemgrv2

import (
	"cmp"
	"slices"

	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
)

// Unreserve puts back the cached content its reservation evicted.
//
// A reservation's allocation (Core.grow) evicts cached tree nodes when the
// free lists are short: each node gives up its pages (Tree.evictLeaf), which
// the reservation then takes. When the reservation is undone, the forward it
// was for never ran and none of its grant's copies were made (the engine
// applies neither for a grant it undoes), so every such page still holds the
// KV it held as the node's page. Unreserve, after the unreserved sequences'
// tables are released, gives each evicted node its pages back as cached
// content (owned, unreferenced, in the eviction heap with its old LRU key)
// when
//
//   - the node is still attached and is the same node: its generation is
//     the one recorded (a prune at a safe point in between may have
//     detached it and newNode reused it for another block);
//   - it holds no pages now (a Commit may have stored the content in it
//     again: the tree holds one copy per content, and a node's key, its
//     block under its parent, is the content) and no pins;
//   - its parent holds pages (or is the root), as leaf-first eviction
//     requires of a node with pages;
//   - every recorded page is free in its pool and was not allocated since
//     the reservation took it: its allocation generation (BlockPool.gen) is
//     the one it had right after the reservation's Take, so no other
//     allocation can have let a copy or a forward write it;
//   - with KV events on, the eviction's BlockRemoved is still unread: it is
//     taken back. Once read (Events in between), the node stays evicted, so
//     the events never disagree with the tree.
//
// Nodes are put back latest eviction first, over all the sequences of one
// Unreserve call, which undoes leaf-first eviction in reverse: a parent that
// became a leaf when its child was evicted, and was evicted next, has its
// pages again before the child is considered. Evictions made by Resume are
// not recorded (no Unreserve undoes a Resume).
//
// With a host tier for reuse, a device eviction inside a reservation may be
// an offload (hostreuse.go): the node keeps its content on the host tier,
// pending the copy in the grant. The record is the same, and so is the
// put-back, which runs after the unreserved sequences' moves settled (their
// holds gone, promotions undone): an undone offload's node gets its device
// pages back when the conditions above hold (its device pages still hold
// the content, and the host copy never ran, so it is freed: content is
// never on two tiers), and only otherwise loses its content
// (Core.undoOffloads, after the put-back). A node with a pending move (some
// other reservation's) is not put back; one whose host copy settled since
// (evicted again by a later, kept reservation) is, and frees that copy.
//
// Without it, an engine whose pipeline stages disagree on a grant (one stage
// grants, another denies, the first unreserves) wipes the granting stage's
// cache a little more at every retry of a request that does not fit yet, and
// Lookup, the minimum over stages, collapses.

// evicted is one tree node whose pages a reservation's allocation took.
type evicted struct {
	n   *Node
	gen uint32 // n's generation then: a node pruned and reused has another
	at  uint64 // when, on the tree's eviction clock (undoHook.clock)
	// off locates n's pages then, one per pool group, at undoRec.pages[off:],
	// and the allocation generation each must still have at undoRec.gens[off:].
	off int
	// pend is a host node's pending count then (another reservation's
	// offload filling it, whose move still holds its host blocks).
	pend int32
	// told says a host BlockStored had announced the host node's content
	// (events.go): its host BlockRemoved must be taken back to put it back.
	told bool
}

// undoRec is what one sequence's outstanding reservation evicted, in
// eviction order (Seq.undo).
type undoRec struct {
	nodes []evicted
	pages []kvcache.BlockID
	gens  []uint32
	// With a host tier for reuse: the cached host nodes it evicted to make
	// room for its offloads (or whose device parent lost its content), their
	// host pages and those pages' allocation generations (off indexes these).
	hnodes []evicted
	hpages []kvcache.BlockID
	hgens  []uint32
}

// reset empties r, keeping its capacity.
func (r *undoRec) reset() {
	r.nodes, r.pages, r.gens = r.nodes[:0], r.pages[:0], r.gens[:0]
	r.hnodes, r.hpages, r.hgens = r.hnodes[:0], r.hpages[:0], r.hgens[:0]
}

// emptied is r emptied, for a recycled Seq.
func (r undoRec) emptied() undoRec { r.reset(); return r }

// taken records, right after the reservation's Take, the allocation
// generation of each page recorded since: the generation the page must still
// have when it is put back.
func (r *undoRec) taken(pools, hosts []*BlockPool) {
	for k := len(r.gens); k < len(r.pages); k++ {
		var gen uint32
		if b := r.pages[k]; b != NoBlock {
			gen = pools[k%len(pools)].gen[b]
		}
		r.gens = append(r.gens, gen)
	}
	for k := len(r.hgens); k < len(r.hpages); k++ {
		r.hgens = append(r.hgens, hosts[k%len(hosts)].gen[r.hpages[k]])
	}
}

// undoHook is the tree's side of the record (Tree.undo): the record of the
// reservation being applied, nil outside Core.grow, and the eviction clock.
type undoHook struct {
	rec   *undoRec
	clock uint64
}

// note records node n and its pages, which it is about to lose, when a
// reservation is being applied.
func (h *undoHook) note(n *Node) {
	r := h.rec
	if r == nil {
		return
	}
	h.clock++
	r.nodes = append(r.nodes, evicted{n: n, gen: n.gen, at: h.clock, off: len(r.pages)})
	r.pages = append(r.pages, n.pages...)
}

// noteHost records host node n and its host pages, which it is about to
// lose, when a reservation is being applied.
func (h *undoHook) noteHost(n *Node) {
	r := h.rec
	if r == nil {
		return
	}
	h.clock++
	r.hnodes = append(r.hnodes, evicted{n: n, gen: n.gen, at: h.clock, off: len(r.hpages), pend: n.h.pend, told: n.h.told})
	r.hpages = append(r.hpages, n.hpages()...)
}

// undoState is Unreserve's scratch (Core.undo).
type undoState struct {
	back undoRec // the records of the sequences being unreserved, merged
	// offloads are the nodes whose offload this Unreserve undoes (settle):
	// host-only, their host copy never written; the put-back gives them
	// their device pages back, undoOffloads drops the others' content.
	offloads []*Node
	marks    [][]bool // per device pool: pages put back, still on the free stack
	count    []int    // per device pool: how many are marked
	// the same per host pool, for host nodes put back
	hmarks [][]bool
	hcount []int
}

// collect moves r into the merged record of this Unreserve call.
func (u *undoState) collect(r *undoRec) {
	base := len(u.back.pages)
	for _, e := range r.nodes {
		e.off += base
		u.back.nodes = append(u.back.nodes, e)
	}
	u.back.pages = append(u.back.pages, r.pages...)
	u.back.gens = append(u.back.gens, r.gens...)
	hbase := len(u.back.hpages)
	for _, e := range r.hnodes {
		e.off += hbase
		u.back.hnodes = append(u.back.hnodes, e)
	}
	u.back.hpages = append(u.back.hpages, r.hpages...)
	u.back.hgens = append(u.back.hgens, r.hgens...)
	r.reset()
}

// putBack gives the nodes the collected records evicted their pages back
// where the conditions above hold, the latest eviction first. Call it after
// the unreserved sequences' tables were released.
func (c *Core) putBack() {
	u := &c.undo
	b := &u.back
	c.putBackDevice()
	c.undoOffloads()
	c.putBackHost()
	b.reset()
}

// putBackDevice is putBack's device pass.
func (c *Core) putBackDevice() {
	u := &c.undo
	b := &u.back
	if len(b.nodes) == 0 {
		return
	}
	slices.SortFunc(b.nodes, func(x, y evicted) int { return cmp.Compare(y.at, x.at) })
	ng := len(c.dev)
	if len(u.marks) != ng {
		u.marks, u.count = make([][]bool, ng), make([]int, ng)
	}
	t := c.tree
	for _, e := range b.nodes {
		pages := b.pages[e.off : e.off+ng]
		if !c.restorable(e, pages, b.gens[e.off:e.off+ng]) || t.ev != nil && !t.ev.Unremove(kvcache.TierDevice, e.n.chain) {
			continue
		}
		for g, p := range pages {
			if p == NoBlock {
				continue
			}
			if len(u.marks[g]) != c.dev[g].Total() {
				u.marks[g] = make([]bool, c.dev[g].Total())
			}
			u.marks[g][p] = true
			u.count[g]++
		}
		t.restore(e.n, pages)
	}
	for g, pool := range c.dev {
		if u.count[g] > 0 {
			pool.unfree(u.marks[g], u.count[g])
			u.count[g] = 0
		}
	}
}

// putBackHost is putBack's host pass, after the device pass and
// undoOffloads (whose freed host blocks may be the very blocks the evicted
// host nodes had): each recorded host node, latest eviction first, gets its
// host pages back as cached host content when it is the same attached node,
// holds no content and no pins, its parent holds content (or is the root),
// and every page is free and was not allocated since the reservation took
// it (no offload's copy can have written it: the undone ones never ran).
// A node that was pending then (another reservation's offload, dropped with
// the subtree of a device node that lost its content) is put back pending
// when that move still holds its blocks, and nothing else: the move is live
// again and settles it. With KV events, a node whose settled host content a
// host BlockStored had announced comes back only while its host
// BlockRemoved is unread, which is taken back.
func (c *Core) putBackHost() {
	u := &c.undo
	b := &u.back
	if len(b.hnodes) == 0 {
		return
	}
	slices.SortFunc(b.hnodes, func(x, y evicted) int { return cmp.Compare(y.at, x.at) })
	ng := len(c.host)
	if len(u.hmarks) != ng {
		u.hmarks, u.hcount = make([][]bool, ng), make([]int, ng)
	}
	t := c.tree
	for _, e := range b.hnodes {
		n, pages, gens := e.n, b.hpages[e.off:e.off+ng], b.hgens[e.off:e.off+ng]
		if n.allIdx < 0 || n.gen != e.gen || n.Stored() || n.pins != 0 || n.h.pend != 0 ||
			n.parent != t.root && !n.parent.Stored() {
			continue
		}
		ok := true
		for g, p := range pages {
			hp := c.host[g]
			ok = ok && hp.refs[p] == 0 && hp.owner[p] == nil && hp.holds[p] == e.pend && hp.gen[p] == gens[g]
		}
		if !ok || e.told && !t.ev.Unremove(kvcache.TierHost, n.chain) {
			continue
		}
		n.h.told = e.told
		for g, p := range pages {
			hp := c.host[g]
			hp.touch(p)
			hp.owner[p] = n
			n.hpages()[g] = p
			if e.pend > 0 {
				continue // held: counted cached, not on the free stack
			}
			if len(u.hmarks[g]) != hp.Total() {
				u.hmarks[g] = make([]bool, hp.Total())
			}
			u.hmarks[g][p] = true
			u.hcount[g]++
			hp.cached++
		}
		n.h.n, n.h.pend = int32(ng), e.pend
		t.hostOnlyChanged(n, false)
	}
	for g, hp := range c.host {
		if u.hcount[g] > 0 {
			hp.unfree(u.hmarks[g], u.hcount[g])
			u.hcount[g] = 0
		}
	}
}

// restorable reports whether the evicted node e may have pages back (see
// above), but for the KV events.
func (c *Core) restorable(e evicted, pages []kvcache.BlockID, gens []uint32) bool {
	n := e.n
	if n.allIdx < 0 || n.gen != e.gen || n.nPages != 0 || n.pins != 0 || n.h.pend != 0 {
		return false
	}
	if p := n.parent; p != c.tree.root && p.nPages == 0 {
		return false
	}
	for g, p := range pages {
		pool := c.dev[g]
		if p != NoBlock && (pool.refs[p] != 0 || pool.owner[p] != nil || pool.gen[p] != gens[g]) {
			return false
		}
	}
	return true
}

// restore undoes evictLeaf for n: attached, unpinned, without pages, its
// parent holding pages. Its pages (free blocks, which the caller takes off
// the free stacks) become cached again, and n an evictable leaf with its old
// LRU key; its parent has a live kid again. n may still be in the prune
// queue: Prune skips a node with pages.
func (t *Tree) restore(n *Node, pages []kvcache.BlockID) {
	t.touch(n) // the incremental deep check (dirty.go); adopt marks the pages
	for g, b := range pages {
		if b != NoBlock {
			n.pages[g] = b
			t.pools[g].adopt(b, n)
			n.nPages++
		}
	}
	t.evictable++
	t.addLiveKid(n.parent)
	if n.liveKids == 0 {
		t.heapPush(n)
	}
	if n.h.n > 0 {
		// A host tier for reuse: n was offloaded. Its content is on the
		// device again; the host copy (never written when this Unreserve
		// undid the offload, a settled copy otherwise) goes, so that n
		// holds its block on one tier.
		t.releaseHost(n)
		t.hostOnlyChanged(n, true)
	} else if t.ht.pools != nil {
		t.hostFix(n.parent) // a live kid again: no host leaf
	}
}

// undoOffloads ends the offloads that this Unreserve undid and the put-back
// did not reverse: the node's host copy was never written, so its content
// is gone (with the host subtree below it, which nothing could reach).
func (c *Core) undoOffloads() {
	u := &c.undo
	for _, n := range u.offloads {
		if n.h.n > 0 && n.nPages == 0 && n.h.pend == 0 {
			c.dropHost(n, false)
		}
	}
	clear(u.offloads)
	u.offloads = u.offloads[:0]
}

// unfree takes the n blocks marked in mark off the free stack and clears
// their marks; the other free blocks keep their order. The marked blocks are
// near the top: the Unreserve that frees them just pushed them.
func (p *BlockPool) unfree(mark []bool, n int) {
	lo := len(p.free)
	for k := n; k > 0 && lo > 0; {
		lo--
		if mark[p.free[lo]] {
			k--
		}
	}
	w := lo
	p.lowFree(lo)
	for _, b := range p.free[lo:] {
		if mark[b] {
			mark[b] = false
			continue
		}
		p.free[w] = b
		w++
	}
	p.free = p.free[:w]
}
