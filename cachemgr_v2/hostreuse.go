package cachemgrv2

import (
	"cmp"
	"fmt"
	"slices"

	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
)

// Host tier for reuse (a host tier and block reuse on): a cached tree node
// that the device evicts keeps its content on the host tier, and a new
// sequence whose Reuse covers it brings it back. The rules (the package doc's
// Tiers section states the shared budget):
//
//   - A node holds its block on at most one tier: device pages (Node.pages)
//     or host pages (Node.hpages()). The one exception is a pending
//     promotion, which holds both until it settles. The device nodes form
//     the top of the tree: a device node's parent is on the device, a host
//     node's parent holds content on some tier, and a node without content
//     has no child with content.
//   - Offload: when Reserve evicts a device leaf to allocate, its pages are
//     copied to one host block per group (a free one, else the least
//     valuable cached host leaf is evicted, if it is no more valuable than
//     the node), and the node stays in the tree on the host tier. Without
//     host room its content vanishes, as without a tier (with its host
//     subtree, which nothing could reach any more). Resume's evictions
//     always drop content: the contract has Resume copy host to device
//     only.
//   - Host eviction is leaf-first by the tree's own order (less), like the
//     device's: a host leaf is a host-only, unpinned, settled node without
//     host-only children.
//   - Promotion: a new sequence whose Reuse covers host nodes pins them (off
//     the host LRU) before anything is allocated, counts them in its need,
//     and gives each fresh device pages with a host->device copy; the node
//     then holds its device pages, shared, and Grant.HostReused counts them.
//   - Registration that meets a host node (Tree.extend) gives it the
//     committing sequence's device copy; its host pages are freed.
//   - The copies travel in the Grant of the item whose reservation made
//     them, in the order the moves happened, and are pending until that
//     reservation is committed or released: the node is not visible to
//     another Lookup or Reserve, and not evictable. Each pending move holds
//     its host blocks (the offload's destination, the promotion's source):
//     no other move may write them meanwhile. Commit and Release settle
//     them as cache content. Unreserve drops them (the copy never ran): an
//     offloaded node loses its content; a promoted node drops its device
//     pages and is back on the host tier, whose copy it kept. Cached blocks
//     evicted to make room stay evicted.
//   - An item of the same Reserve call that covers a node an earlier item
//     promoted shares it: its grant carries the same copy, so its content
//     arrives even if the earlier grant is undone. The node settles when
//     its last holder does.
//
// Without a host tier (or without reuse) Tree.ht.pools is nil and none of
// this runs: nodes never hold host pages and grants carry no such copies.

// hostNode is a node's host tier state.
type hostNode struct {
	n       int32  // pages held: 0 or the number of groups
	kids    int32  // children on the host tier only
	hidx    int32  // position in the host eviction heap + 1; 0 when not in it
	pend    int32  // outstanding moves that fill the node's content
	call    uint32 // the Reserve call that promoted it (pending promotions)
	filled  bool   // a holder of the pending promotion committed or released
	told    bool   // with KV events: a host BlockStored announced its settled host content (events.go)
	counted bool   // in hostTree.evictable
	chkKids int32  // host-only children, recounted by the deep self-check
	chkPend int32  // pending moves naming it, recounted by the deep self-check
	// pendKids counts its children with a pending offload, pendSeq the
	// sequence whose reservation made them all (nil: several). A hint for
	// evictOne (not a checked invariant): see keepParents.
	pendKids int32
	pendSeq  *Seq
}

// hostTree is the tree's host tier of cached nodes.
type hostTree struct {
	pools     []*BlockPool // host pool per group; nil: no reuse offload
	heap      []*Node      // host leaves, a min-heap on Tree.less
	evictable int          // host-only, unpinned, settled nodes: all evictable, leaves first
	call      uint32       // Reserve calls, for promotions shared within one
}

// hostMove is one pending move of a sequence's outstanding reservation.
type hostMove struct {
	n       *Node
	promote bool  // a promotion (host -> device), else an offload
	at      int32 // Seq.moveBlk[at:at+groups]: the host blocks its copy writes or reads, held
	// parent of an offloaded node and its generation, whose pendKids the
	// move counts in
	parent *Node
	pgen   uint32
}

// OnHost reports whether the node holds its block on the host tier only: a
// sequence that reuses it gets it back through a copy.
func (n *Node) OnHost() bool { return n.h.n > 0 && n.nPages == 0 }

// Stored reports whether the node holds its block's content on some tier.
func (n *Node) Stored() bool { return n.nPages > 0 || n.h.n > 0 }

// HostPages returns the node's page per group in the host pools (nil
// without a host tier); the slice belongs to the node.
func (n *Node) HostPages() []kvcache.BlockID { return n.hpages() }

// settled reports whether the node holds content no pending copy fills.
func (n *Node) settled() bool { return n.h.pend == 0 && (n.nPages > 0 && n.complete() || n.h.n > 0) }

// initHost readies a new node's host state.
func (t *Tree) initHost(n *Node) {
	if t.ht.pools == nil {
		return
	}
	pages := n.hpages()
	for g := range pages {
		pages[g] = NoBlock
	}
	n.h = hostNode{}
}

// HostEvictable is the number of cached host nodes that a Suspend or an
// offload may evict (each frees one block in every host pool).
func (t *Tree) HostEvictable() int { return t.ht.evictable }

// hostFix puts n in or out of the host accounting after a change: a
// host-only, unpinned, settled node is evictable, and in the host heap when
// it has no host-only children.
func (t *Tree) hostFix(n *Node) {
	t.touch(n) // the incremental deep check (dirty.go)
	want := n.OnHost() && n.pins == 0 && n.h.pend == 0
	if want != n.h.counted {
		n.h.counted = want
		if want {
			t.ht.evictable++
		} else {
			t.ht.evictable--
		}
	}
	leaf := want && n.h.kids == 0 && n.liveKids == 0
	switch {
	case leaf && n.h.hidx == 0:
		t.hpush(n)
	case !leaf && n.h.hidx > 0:
		t.hremove(n)
	}
}

// hostOnlyChanged fixes the accounting of n and its parent after n became,
// or stopped being, host-only (was says what it was).
func (t *Tree) hostOnlyChanged(n *Node, was bool) {
	if now := n.OnHost(); now != was {
		p := n.parent
		if now {
			p.h.kids++
		} else {
			p.h.kids--
		}
		t.hostFix(p)
	}
	t.hostFix(n)
}

// leaveHost frees the host pages of n, which now holds device pages
// (registration adopted a sequence's copy). A pending offload of n goes
// stale: its move still holds the blocks until it settles.
func (t *Tree) leaveHost(n *Node) {
	t.hostRemoved(n)
	for g, hp := range t.ht.pools {
		hp.disown(n.hpages()[g])
		n.hpages()[g] = NoBlock
	}
	n.h.n, n.h.pend, n.h.filled = 0, 0, false
	t.hostOnlyChanged(n, true)
}

// ---- the Core's side ----

// hostReuse reports whether evicted cached nodes go to the host tier.
func (c *Core) hostReuse() bool { return c.tree.ht.pools != nil }

// evictOne frees the device pages of the least valuable evictable device
// leaf; inside Reserve, with a host tier for reuse, they are offloaded when
// the host has room (kept true), a move pending on the reserving sequence
// (Core.cur). It returns nil when nothing is evictable.
func (c *Core) evictOne() (n *Node, kept bool) {
	t := c.tree
	if !c.hostReuse() {
		return t.evictLeaf(), false
	}
	if c.cur == nil && !c.resuming || len(t.heap) == 0 {
		if n = t.evictLeaf(); n != nil {
			c.dropHostKids(n, true)
		}
		return n, false
	}
	skipped := c.keepParents()
	n = t.heap[0]
	src := append(c.srcPages[:0], n.pages...)
	c.srcPages = src
	t.evictLeaf()
	for _, k := range skipped {
		t.heapPush(k)
	}
	if !c.hostRoomFor(n) {
		c.dropHostKids(n, true)
		return n, false
	}
	for g, hp := range t.ht.pools {
		h := hp.takeFor(n)
		n.hpages()[g] = h
		c.copies = append(c.copies, kvcache.Copy{SrcPool: c.dev[g].id, SrcBlock: src[g], DstPool: hp.id, DstBlock: h})
	}
	n.h.n = int32(len(t.ht.pools))
	if c.cur == nil {
		// Resume's offload: nothing undoes a Resume, and its copies reach
		// the worker in order (this one before the copy that refills the
		// device block), so the host node is settled at once.
		for g, hp := range t.ht.pools {
			hp.unhold(n.hpages()[g]) // takeFor's hold: no move is pending
		}
		c.offloaded++
		t.hostOnlyChanged(n, false)
		t.touch(n)
		t.hostFix(n)
		t.hostStored(n)
		return n, true
	}
	s := c.cur
	n.h.pend = 1
	mv := hostMove{n: n, at: int32(len(s.moveBlk))}
	if p := n.parent; p != t.root {
		if p.h.pendKids == 0 {
			p.h.pendSeq = s
		} else if p.h.pendSeq != s {
			p.h.pendSeq = nil
		}
		p.h.pendKids++
		mv.parent, mv.pgen = p, p.gen
	}
	s.moves = append(s.moves, mv)
	s.moveBlk = append(s.moveBlk, n.hpages()...)
	c.moving++
	c.offloaded++
	t.hostOnlyChanged(n, false)
	return n, true
}

// hostRoomFor reports whether one host block per group is free for the
// offload of n, evicting the least valuable cached host leaf while none is
// and that leaf is no more valuable than n.
func (c *Core) hostRoomFor(n *Node) bool {
	t := c.tree
	for {
		short := false
		for _, hp := range t.ht.pools {
			short = short || hp.Free() == 0
		}
		if !short {
			return true
		}
		if len(t.ht.heap) == 0 || t.less(n, t.ht.heap[0]) {
			return false
		}
		c.dropHost(t.ht.heap[0], true)
	}
}

// hostEvictableNow is the number of cached host nodes that leaf-first
// eviction can reach now: the host evictable ones but those above a pending
// offload (a node offloaded by a reservation not settled yet, below one that
// settled), which stay until that move settles.
func (c *Core) hostEvictableNow() int {
	t := c.tree
	n := t.ht.evictable
	if n == 0 || c.moving == 0 {
		return n
	}
	blocked := map[*Node]bool{}
	for _, s := range c.seqs {
		for _, mv := range s.moves {
			if mv.promote || !mv.n.OnHost() || mv.n.h.pend == 0 {
				continue
			}
			for p := mv.n.parent; p != t.root && p.OnHost() && !blocked[p]; p = p.parent {
				blocked[p] = true
				if p.h.counted {
					n--
				}
			}
		}
	}
	return n
}

// hostMakeRoom evicts cached host leaves until every host pool has nb free
// blocks (Suspend: suspended sequences come first); nb must be at most free
// plus HostEvictable.
func (c *Core) hostMakeRoom(nb int) {
	t := c.tree
	for g := 0; g < len(c.host); {
		if c.host[g].Free() >= nb {
			g++
			continue
		}
		if len(t.ht.heap) == 0 {
			panic(fmt.Sprintf("%s: host pool %s short of %d blocks (%d free) with nothing evictable (%d counted)", c.name, c.groups[g].Name, nb, c.host[g].Free(), t.ht.evictable))
		}
		c.dropHost(t.ht.heap[0], true)
		g = 0
	}
}

// dropHost drops the host content of n and of its host subtree (children
// first, in hash order), telling the Hooks of each node that lost its
// content; evicted counts them as evictions.
func (c *Core) dropHost(n *Node, evicted bool) {
	c.dropHostKids(n, evicted)
	if n.h.n == 0 {
		return
	}
	t := c.tree
	was := n.OnHost()
	if was {
		t.undo.noteHost(n) // inside a reservation: Unreserve may put it back (undo.go)
	}
	t.hostRemoved(n)
	for g, hp := range t.ht.pools {
		hp.disown(n.hpages()[g])
		n.hpages()[g] = NoBlock
	}
	n.h.n, n.h.pend, n.h.filled = 0, 0, false
	t.hostOnlyChanged(n, was)
	if n.nPages == 0 {
		t.evicted(n, kvcache.TierHost) // the content is gone from every tier
		t.queuePrune(n)
		if c.hooks != nil {
			c.hooks.Evicted(n)
		}
	}
	if evicted {
		c.stats.Evictions += int64(len(t.ht.pools))
	}
}

// dropHostKids drops the host subtrees below n, which lost its content (or
// is losing it): nothing could reach them.
func (c *Core) dropHostKids(n *Node, evicted bool) {
	if n.h.kids == 0 {
		return
	}
	var kids []*Node
	for ch := range n.children.all() {
		if ch.OnHost() {
			kids = append(kids, ch)
		}
	}
	slices.SortFunc(kids, func(a, b *Node) int { return cmp.Compare(a.hash, b.hash) })
	for _, ch := range kids {
		c.dropHost(ch, evicted)
	}
}

// hostTokens is how many of the best tokens of walk's match (blocks full
// blocks ending at end) the host tier holds only.
func (c *Core) hostTokens(best, blocks int, end *Node) int {
	host, tpb := 0, c.tpb
	for d, n := blocks, end; d > 0; d, n = d-1, n.parent {
		if d*tpb <= best && n.OnHost() {
			host += tpb
		}
	}
	return host
}

// LookupTiers is Lookup for one prompt under salt, split by tier: the tokens
// a new sequence could take from the cache now and how many of them the host
// tier holds (0 without a host tier for reuse). It changes nothing.
func (c *Core) LookupTiers(salt string, prompt []int32) (tokens, host int) {
	if c.tree == nil || !c.reuse || len(prompt) <= 1 {
		return 0, 0
	}
	best, blocks, end := c.walk(salt, prompt)
	return best, c.hostTokens(best, blocks, end)
}

// matchReserve is Tree.match for a new sequence with a host tier for reuse:
// settled nodes on either tier, and nodes an earlier item of this Reserve
// call promoted (shared).
func (c *Core) matchReserve(salt string, tokens []int32, maxBlocks int, path []*Node) []*Node {
	t, tpb := c.tree, c.tpb
	n := t.root
	for i := 0; i < maxBlocks; i++ {
		ch := t.child(n, salt, tokens[i*tpb:(i+1)*tpb])
		if ch == nil || !ch.settled() && !c.sharedPromotion(ch) {
			break
		}
		path = append(path, ch)
		n = ch
	}
	return path
}

// sharedPromotion reports whether n is a promotion pending from this Reserve
// call, which a later item may share.
func (c *Core) sharedPromotion(n *Node) bool {
	return n.h.pend > 0 && n.nPages > 0 && n.h.n > 0 && n.h.call == c.tree.ht.call
}

// toPromote counts the nodes of a new sequence's path that the host tier
// holds only: each needs fresh device blocks.
func (c *Core) toPromote(path []*Node) int {
	k := 0
	if c.hostReuse() {
		for _, n := range path {
			if n.OnHost() {
				k++
			}
		}
	}
	return k
}

// promote brings the host nodes of s's path (pinned) to the device, after
// making room for need blocks per group (its promotions and its fresh
// blocks): fresh device pages and a host->device copy for each host-only
// node, the same copy again for a node promoted earlier in this call. It
// returns the number of blocks that came from the host tier.
func (c *Core) promote(s *Seq, need int) int {
	t := c.tree
	t.undo.rec = &s.undo // its evictions are undone by Unreserve too (undo.go)
	c.makeRoom(need)
	t.undo.rec = nil
	fromHost := 0
	for _, n := range s.path {
		switch {
		case n.OnHost():
			for g, pool := range c.dev {
				var one [1]kvcache.BlockID
				d := pool.Take(one[:0], 1)[0]
				n.pages[g] = d
				pool.adopt(d, n)
				pool.Unref(d) // cached now; the table's reference follows
			}
			n.nPages = len(n.pages)
			n.h.pend, n.h.call, n.h.filled = 0, t.ht.call, false
			t.addLiveKid(n.parent)
			t.hostOnlyChanged(n, true)
			if t.ev != nil {
				t.ev.stored(t, n)
			}
			c.promoted++
		case c.sharedPromotion(n):
		default:
			continue
		}
		t.touch(n)
		n.h.pend++
		for g, hp := range t.ht.pools {
			hp.hold(n.hpages()[g])
			c.copies = append(c.copies, kvcache.Copy{SrcPool: hp.id, SrcBlock: n.hpages()[g], DstPool: c.dev[g].id, DstBlock: n.pages[g]})
		}
		s.moves = append(s.moves, hostMove{n: n, promote: true, at: int32(len(s.moveBlk))})
		c.moving++
		s.moveBlk = append(s.moveBlk, n.hpages()...)
		fromHost++
	}
	return fromHost
}

// settle ends the pending state of s's moves, last first: keep (Commit,
// Release: the grant's copies were handed to the worker) makes them cache
// content; otherwise (Unreserve: the copies never ran) a promoted node goes
// back to the host tier once its last holder settles, and an offloaded node
// waits in Core.undo.offloads for the put-back (undo.go), which gives it its
// device pages back or, failing that, undoOffloads drops its unwritten host
// copy. Call it after s's table references and pins are dropped when s
// ends.
func (c *Core) settle(s *Seq, keep bool) {
	if len(s.moves) == 0 {
		return
	}
	t := c.tree
	ng := len(t.ht.pools)
	for i := len(s.moves) - 1; i >= 0; i-- {
		mv := s.moves[i]
		if p := mv.parent; p != nil && p.gen == mv.pgen && p.h.pendKids > 0 {
			if p.h.pendKids--; p.h.pendKids == 0 {
				p.h.pendSeq = nil
			}
		}
		blk := s.moveBlk[mv.at : int(mv.at)+ng]
		n := mv.n
		live := n.h.n > 0 && n.hpages()[0] == blk[0] // a block is held by one node at a time
		for g, hp := range t.ht.pools {
			hp.unhold(blk[g])
		}
		if !live {
			continue // offloaded, then dropped or adopted by registration
		}
		t.touch(n)
		n.h.pend--
		switch {
		case !mv.promote && keep:
			t.hostFix(n)
			t.hostStored(n)
		case !mv.promote:
			// The copy never ran: Unreserve's put-back may give n its
			// device pages back, else undoOffloads drops the content.
			c.undo.offloads = append(c.undo.offloads, n)
		case keep:
			n.h.filled = true
			fallthrough
		default:
			if n.h.pend > 0 {
				continue
			}
			if n.h.filled {
				t.releaseHost(n)
			} else {
				c.restore(n)
			}
		}
	}
	c.moving -= len(s.moves)
	clear(s.moves)
	s.moves = s.moves[:0]
	s.moveBlk = s.moveBlk[:0]
}

// releaseHost frees the host pages of a promoted node whose copy ran.
func (t *Tree) releaseHost(n *Node) {
	t.hostRemoved(n)
	for g, hp := range t.ht.pools {
		hp.disown(n.hpages()[g])
		n.hpages()[g] = NoBlock
	}
	n.h.n, n.h.filled = 0, false
	t.hostFix(n)
}

// restore undoes the promotion of n, whose copy never ran and whose last
// holder is gone (unpinned, its device pages unreferenced): the device pages
// are dropped and n is back on the host tier, where its content stayed.
func (c *Core) restore(n *Node) {
	t := c.tree
	if n.pins != 0 || n.liveKids != 0 {
		panic(fmt.Sprintf("%s: restoring a promoted node with %d pins, %d device children", c.name, n.pins, n.liveKids))
	}
	if n.heapIdx >= 0 {
		t.heapRemove(n)
	}
	t.evictable--
	for g, b := range n.pages {
		t.pools[g].drop(b)
		n.pages[g] = NoBlock
	}
	n.nPages = 0
	n.h.filled = false
	if t.ev != nil {
		t.ev.Removed(kvcache.TierDevice, n.chain)
	}
	p := n.parent
	p.liveKids--
	if p != t.root && p.liveKids == 0 && p.pins == 0 && p.nPages > 0 && p.heapIdx < 0 {
		t.heapPush(p)
	}
	t.hostOnlyChanged(n, false)
}

// ---- host pool states ----
//
// A host block owned by a node has no references (sequences reference only
// their suspended blocks there). holds counts the pending moves that hold a
// block; a held or owned unreferenced block is cached, so a pending block is
// accounted (Free + Cached + InUse == Total) and never on the free stack.

// takeFor pops a free block as node n's page, held by the pending move
// that writes it.
func (p *BlockPool) takeFor(n *Node) kvcache.BlockID {
	b := p.free[len(p.free)-1]
	p.free = p.free[:len(p.free)-1]
	p.lowFree(len(p.free))
	p.touch(b)
	p.owner[b] = n
	p.cached++
	p.holds[b]++
	p.gen[b]++ // an allocation: undo.go's put-back of host nodes checks it
	return b
}

// hold adds a pending move's hold on an owned block.
func (p *BlockPool) hold(b kvcache.BlockID) { p.touch(b); p.holds[b]++ }

// unhold drops a hold; an unowned block with no hold left is free.
func (p *BlockPool) unhold(b kvcache.BlockID) {
	p.touch(b)
	p.holds[b]--
	if p.holds[b] == 0 && p.owner[b] == nil {
		p.cached--
		p.free = append(p.free, b)
	}
}

// disown takes b from its node; without a hold it is free.
func (p *BlockPool) disown(b kvcache.BlockID) {
	p.touch(b)
	p.owner[b] = nil
	if p.holds[b] == 0 {
		p.cached--
		p.free = append(p.free, b)
	}
}

// held is the number of pending moves holding b (0 without a host tier for
// reuse).
func (p *BlockPool) held(b int) int32 {
	if p.holds == nil {
		return 0
	}
	return p.holds[b]
}

// ---- the host eviction heap: a min-heap on Tree.less, index hidx-1 ----

func (t *Tree) hpush(n *Node) {
	t.touch(n)
	t.ht.heap = append(t.ht.heap, n)
	n.h.hidx = int32(len(t.ht.heap))
	t.hup(len(t.ht.heap) - 1)
}

func (t *Tree) hremove(n *Node) {
	t.touch(n)
	h := t.ht.heap
	i, last := int(n.h.hidx-1), len(h)-1
	if i != last {
		t.hswap(i, last)
	}
	h[last] = nil
	t.ht.heap = h[:last]
	n.h.hidx = 0
	if i != last {
		t.hdown(i)
		t.hup(i)
	}
}

func (t *Tree) hswap(i, j int) {
	h := t.ht.heap
	h[i], h[j] = h[j], h[i]
	t.touch(h[i])
	t.touch(h[j])
	h[i].h.hidx = int32(i + 1)
	h[j].h.hidx = int32(j + 1)
}

func (t *Tree) hup(i int) {
	h := t.ht.heap
	for i > 0 {
		p := (i - 1) / 2
		if !t.less(h[i], h[p]) {
			return
		}
		t.hswap(i, p)
		i = p
	}
}

func (t *Tree) hdown(i int) {
	h := t.ht.heap
	for {
		l := 2*i + 1
		if l >= len(h) {
			return
		}
		m := l
		if r := l + 1; r < len(h) && t.less(h[r], h[l]) {
			m = r
		}
		if !t.less(h[m], h[i]) {
			return
		}
		t.hswap(i, m)
		i = m
	}
}

// ---- deep self-check ----

// beginHostCheck zeroes the host tier's recounts in the nodes (before
// checkMoves).
func (c *Core) beginHostCheck() {
	t := c.tree
	t.root.h.chkKids, t.root.h.chkPend = 0, 0
	for _, n := range t.all {
		n.h.chkKids, n.h.chkPend = 0, 0
	}
}

// checkMoves recounts, for the deep self-check, the holds of s's pending
// moves into holds (per host pool; nil: the incremental check counts them
// itself) and the live moves per node into the node's chkPend, and says
// what is wrong with them.
func (c *Core) checkMoves(s *Seq, holds [][]int32, bad func(string, ...any)) {
	if len(s.moves) == 0 {
		return
	}
	id := s.id
	if !s.led.Reserved {
		bad("seq %d: %d pending host moves without a reservation", id, len(s.moves))
	}
	if !c.hostReuse() {
		bad("seq %d: pending host moves without a host tier for reuse", id)
		return
	}
	ng := len(c.host)
	for _, mv := range s.moves {
		if int(mv.at)+ng > len(s.moveBlk) {
			bad("seq %d: move blocks at %d beyond %d", id, mv.at, len(s.moveBlk))
			continue
		}
		blk := s.moveBlk[mv.at : int(mv.at)+ng]
		for g, b := range blk {
			if b < 0 || int(b) >= c.host[g].Total() {
				bad("seq %d: move holds host block %d out of range [0, %d)", id, b, c.host[g].Total())
				continue
			}
			if holds != nil {
				holds[g][b]++
			}
		}
		n := mv.n
		live := n.h.n > 0 && slices.Equal(n.hpages(), blk)
		switch {
		case mv.promote && (!live || n.nPages == 0 || !s.created || !slices.Contains(s.path, n)):
			bad("seq %d: pending promotion of a node that is not on both tiers on its new path", id)
		case mv.promote:
			n.h.chkPend++
		case live && n.nPages > 0:
			bad("seq %d: pending offload of a node on the device", id)
		case live:
			n.h.chkPend++
		}
	}
}

// checkHostTree is the host tier's part of the deep self-check, run after
// Tree.Check (whose pass marked the attached nodes): for every attached
// node, its host pages are owned by it in their pools, all or none; it holds
// its block on one tier, or both while a promotion is pending; a device
// node's parent is on the device and a stored node's parent is stored; the
// pending moves naming it (chkPend) equal its count; host-only kids, the host
// evictable count and the host heap (exactly the host leaves, heap-ordered)
// are right.
func (c *Core) checkHostTree(bad func(string, ...any)) {
	t := c.tree
	if !c.hostReuse() {
		return
	}
	evictable, leaves := 0, 0
	for _, n := range t.all {
		if n.chkFlags&chkSeen != 0 && n.OnHost() {
			n.parent.h.chkKids++
		}
	}
	for _, n := range t.all {
		if n.chkFlags&chkSeen == 0 {
			continue
		}
		t.checkHostPages(n, bad)
		t.checkHostNode(n, n.h.chkPend, bad)
		if n.h.kids != n.h.chkKids {
			bad("tree: node %p: %d host-only children, recounted %d", n, n.h.kids, n.h.chkKids)
		}
		if n.OnHost() {
			if n.pins != 0 {
				bad("tree: node %p: on the host tier with %d pins", n, n.pins)
			}
		}
		want := n.OnHost() && n.pins == 0 && n.h.pend == 0
		if want != n.h.counted {
			bad("tree: node %p: host evictable %v, recomputed %v", n, n.h.counted, want)
		}
		if want {
			evictable++
		}
		if leaf := want && n.liveKids == 0 && n.h.kids == 0; leaf != (n.h.hidx > 0) {
			bad("tree: node %p: host leaf %v, in the host heap %v", n, leaf, n.h.hidx > 0)
		} else if leaf {
			leaves++
		}
	}
	if t.root.h.kids != t.root.h.chkKids {
		bad("tree: root: %d host-only children, recounted %d", t.root.h.kids, t.root.h.chkKids)
	}
	if evictable != t.ht.evictable {
		bad("tree: host evictable %d, recomputed %d", t.ht.evictable, evictable)
	}
	if leaves != len(t.ht.heap) {
		bad("tree: host heap has %d nodes, %d host leaves", len(t.ht.heap), leaves)
	}
	for i, n := range t.ht.heap {
		if int(n.h.hidx) != i+1 {
			bad("tree: host heap entry %d records index %d", i, n.h.hidx-1)
		}
		if i > 0 && t.less(n, t.ht.heap[(i-1)/2]) {
			bad("tree: host heap order broken at %d", i)
		}
	}
}

// checkHostPages checks, for both deep checks, that n's host pages are
// owned by n in their pools and that n counts them (all groups or none).
func (t *Tree) checkHostPages(n *Node, bad func(string, ...any)) {
	got := int32(0)
	for g, b := range n.hpages() {
		if b == NoBlock {
			continue
		}
		got++
		if b < 0 || int(b) >= t.ht.pools[g].Total() || t.ht.pools[g].owner[b] != n {
			bad("tree: node %p: host page %d in pool %d not owned by it", n, b, t.ht.pools[g].id)
		}
	}
	if got != n.h.n || got != 0 && int(got) != len(n.hpages()) {
		bad("tree: node %p: %d host pages, counted %d of %d", n, n.h.n, got, len(n.hpages()))
	}
}

// keepParents takes off the device heap's top, for the eviction evictOne is
// about to make, the nodes whose children another reservation is offloading
// (pending), and returns them; the caller pushes them back after the
// eviction. Evicting such a node would leave that reservation, if it is
// undone (one pipeline stage grants, another denies), with a child that can
// neither stay on the host (its copy never ran) nor come back below a parent
// that left the device, and the child's host subtree would be lost. When
// every candidate is such a node, nothing is skipped.
func (c *Core) keepParents() []*Node {
	t := c.tree
	var skipped []*Node
	for len(t.heap) > 0 {
		n := t.heap[0]
		if n.h.pendKids == 0 || n.h.pendSeq == c.cur {
			return skipped
		}
		t.heapRemove(n)
		skipped = append(skipped, n)
	}
	for _, k := range skipped {
		t.heapPush(k)
	}
	return nil
}

// checkHostNode checks, for both deep checks, n's tier rules (H3-H5): its
// pending count against pend (recounted from the moves), one tier unless a
// promotion is pending, filled only while pending, a device node below a
// device node, content below content.
func (t *Tree) checkHostNode(n *Node, pend int32, bad func(string, ...any)) {
	if n.h.pend != pend {
		bad("tree: node %p: %d pending moves, recounted %d", n, n.h.pend, pend)
	}
	if n.nPages > 0 && n.h.n > 0 && n.h.pend == 0 {
		bad("tree: node %p: on both tiers without a pending promotion", n)
	}
	if n.h.filled && n.h.pend == 0 {
		bad("tree: node %p: promotion filled but not pending", n)
	}
	p := n.parent
	if n.nPages > 0 && p != t.root && p.nPages == 0 {
		bad("tree: node %p: on the device below a node that is not", n)
	}
	if n.Stored() && p != t.root && !p.Stored() {
		bad("tree: node %p: holds content below a node that holds none", n)
	}
	// H8: with KV events, a host BlockStored announced exactly the settled
	// host content (a pending offload's is not yet settled).
	if settled := n.h.n > 0 && (n.nPages > 0 || n.h.pend == 0); n.h.told != (settled && t.ev != nil) {
		bad("tree: node %p: host content announced %v, settled %v (pending %d, device pages %d, events on %v)", n, n.h.told, settled, n.h.pend, n.nPages, t.ev != nil)
	}
}
