package cachemgrv2

import (
	"bytes"
	"fmt"
	"math"
	"unsafe"

	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
)

// The deep self-check, incrementally (inspect.go's check chooses).
//
// The full check (checkFull) recomputes every count from all sequences,
// blocks and nodes: on a large tree that is most of a run's time when the
// engine asks for it every few dozen steps. The incremental check proves the
// same properties (listed at checkFull) over what changed since the last
// check, plus the context each property needs, and checks the global
// counters as totals:
//
//   - Every mutation marks what it touches dirty, with one call at the place
//     it happens: Tree.touch(n) for a node whose fields, child map, heap
//     position or list position change; BlockPool.touch(b) for a block whose
//     reference count, owner or free-stack presence changes; Core.touch(s)
//     for a sequence whose ledger, tables, host tables, path, copy-on-write
//     source or suspension changes (and at recycle).
//   - For each object the check keeps a shadow (what it was at the last
//     check) and the recounts derived from the shadows: per block the
//     references of the sequences' tables and the path node that must own it,
//     per node the pins of the sequences' paths, its children with pages and
//     its pinned children, per tree the child-map census, the evictable
//     nodes and the evictable leaves, per pool the cached blocks and the free
//     stack's membership. A dirty object's shadow is compared with the object
//     and the difference moves the recounts, which marks the objects on the
//     other side of each relation (a sequence's changed entries mark their
//     blocks and path nodes; a node whose parent, pages or pins changed marks
//     its old and new parent and its old and new pages; a block whose owner
//     changed marks the old and the new owner), until nothing new is marked.
//   - Then every marked block and node is verified against its recounts and
//     neighbours exactly as the full check verifies it (a node walks up to
//     the root through linked parents, memoised within the check), and the
//     totals are compared with the recounts.
//
// An unmarked object is as the last check saw it, so its properties still
// hold; a relation changes only when one of its ends is marked. The state is
// rebuilt from scratch by every full check (resync); a check that finds
// anything makes the next one full, and so does as much incremental work as
// a full check's (Core.check).
//
// For the branches that add state (merge notes): the rule is "mark what you
// write". New node state (host pages, priority, frequency, retention) is
// covered by t.touch(n) wherever it changes, and checked in verifyNode next
// to its rule in Tree.Check; if a rule relates the node to another object
// (its host pages to the host pool's owners), keep the old value in
// nodeCheck and touch the other object when it changes, as nodeDelta does
// for device pages. A changed child map marks the parent and the child. New
// block state: p.touch(b), checked in verifyBlock next to its rule in
// recount; in particular, once nodes own host-pool blocks, P5 ("an owned
// block is a device block its owner holds") changes in recount and
// verifyBlock alike. New code that pops the free stack or rewrites it
// below its top calls p.lowFree (a push needs nothing). New sequence state: c.touch(s), checked in seqCount
// from ck.from on. The eviction heap's less must depend only on fields that
// are changed through touch (a key that moves with time alone would break
// the heap itself): verifyNode checks a touched node against its heap
// parent and children. A rule written only in recount runs at every full
// check (Core.check says when), so nothing is lost, only found later;
// TestIncrementalCheckAgrees proves the two agree, so add a corruption for
// each new rule there.
//
// The host tier for reuse (hostreuse.go) follows these notes: a host pool's
// block is marked where its owner, holds or free-stack presence change
// (takeFor, hold, unhold, disown, the host put-back), and verifyBlock checks
// it as recount does (P5 for host pages, P6: free means unreferenced,
// unowned and unheld; cached means unreferenced and owned or held; holds
// equal the recount from the sequences' shadows of their pending moves'
// blocks, seqCheck.moveBlk). A node is marked wherever its host state
// changes (hostFix, the host heap's push, remove and swaps, promote, settle,
// the put-back); nodeDelta keeps its host pages' shadow (marking the old
// and new blocks) and its host-only state, from which the parents' host-only
// children are recounted, and verifyHost checks H2-H7 against them: its
// pending count equals the holds of its host pages (every hold of an owned
// host block is a live move of its owner, and verifyBlock marks the owner
// of a verified host block), and the host heap as the device heap.

// seqCheck is a sequence's part of the incremental check; Core.recycle
// keeps it (the shadow is what the struct contributed, whoever it is now).
type seqCheck struct {
	dirty bool // on Core.ck.seqs
	reset bool // recycled since the last check: compare from entry 0
	// shadow: the sequence as the last check counted it (empty when it was
	// not live)
	tables, host [][]kvcache.BlockID
	path         []*Node
	cow          *Node
	suspended    bool
	from         int // where the shadow and the sequence first differ (seqUncount)
	// moveBlk is the shadow of Seq.moveBlk: the host blocks its pending
	// moves hold (host tier for reuse), counted whole (a few per step).
	moveBlk []kvcache.BlockID
}

// nodeCheck is a node's part of the incremental check.
type nodeCheck struct {
	seen uint32 // == Tree.ck.epoch: reaches the root (this check); the mark is Node.dirty
	// shadow: the node as the last check counted it
	in                        bool  // listed in Tree.all
	parent                    int32 // Node.ref
	allIdx                    int32 // (the shadow pages are Node.ckPages)
	kids                      int32 // len(children) while listed
	live, pinned, evict, leaf bool
	// recounts from the shadows
	pins       int32 // sequences' paths and copy-on-write sources through it
	liveKids   int32 // listed children with pages
	pinnedKids int32 // listed children with pins

	// the host tier for reuse: shadow host pages, host-only, host evictable,
	// host leaf (as verifyNode last found it); the recount of host-only
	// listed children (the shadow host pages are Node.ckHPages)
	onHost, hevict bool
	hleaf          bool
	hostKids       int32
}

// treeCheck is the tree's part of the incremental check.
type treeCheck struct {
	// dirty holds the marked nodes' refs (Node.ref, Tree.nodeAt), not
	// pointers: a mark is an append on every mutation, and a pointer's
	// would be a write barrier while the GC marks.
	dirty                     []int32
	epoch                     uint32
	listed, evictable, leaves int // recounts: child-map census, evictable nodes, evictable leaves
	hevictable, hleaves       int // recounts of the host tier for reuse: host evictable nodes, host leaves
}

// poolCheck is a pool's part of the incremental check.
type poolCheck struct {
	mark   []bool // on dirty
	dirty  []kvcache.BlockID
	refs   []int32           // references recounted from the sequences' shadows
	inFree []bool            // on the free stack (as of free)
	free   []kvcache.BlockID // shadow of the free stack
	owner  []int32           // shadow owners (Node.ref)
	cached []bool            // shadow: counted cached
	ncache int               // recount of cached
	exp    []int32           // the path node (Node.ref) whose table entry names the block (device pools)
	expN   []int32           // how many path entries name it
	holds  []int32           // pending moves holding the block, recounted from the sequences' shadows (host pools, host tier for reuse)
	// low is the least length of the free stack since the last check: its
	// entries below low are as the shadow (free) has them, since the stack
	// changes only at its top, and every pop or rewrite lowers low
	// (BlockPool.lowFree: Take, takeFor, unfree). freeDelta compares from
	// there, not the whole stack (a host pool's is some 10^5 blocks).
	low int
}

// coreCheck is the core's part of the incremental check.
type coreCheck struct {
	seqs      []*Seq
	valid     bool                // the shadows were built (by a full check)
	fullNext  bool                // the last check found something
	count     int                 // deep checks so far
	fulls     int                 // full ones among them
	fullEvery int                 // 0: by work (Core.check); 1: every check is full; n: one in n
	work      int                 // objects the incremental checks verified since the last full one
	size      int                 // objects that one verified
	noTables  [][]kvcache.BlockID // a released sequence's tables: none per group
	// skip makes Inspect's check find nothing and change nothing, for tests
	// that run checkFull and checkIncremental themselves.
	skip bool
}

// touch marks n dirty for the next deep check.
func (t *Tree) touch(n *Node) {
	if n != nil && !n.dirty {
		n.dirty = true
		t.ck.dirty = append(t.ck.dirty, n.ref)
	}
}

// touch marks block b dirty for the next deep check.
func (p *BlockPool) touch(b kvcache.BlockID) {
	if b >= 0 && int(b) < len(p.ck.mark) && !p.ck.mark[b] {
		p.ck.mark[b] = true
		p.ck.dirty = append(p.ck.dirty, b)
	}
}

// touch marks s dirty for the next deep check.
func (c *Core) touch(s *Seq) {
	if !s.ck.dirty {
		s.ck.dirty = true
		c.ck.seqs = append(c.ck.seqs, s)
	}
}

// SetFullCheckEvery makes one deep check (Inspect with Tables) in n a full
// recount (n <= 1: every one); the others are incremental. A check that
// found a violation is always followed by a full one. By default the period
// follows the work instead (Core.check).
func (c *Core) SetFullCheckEvery(n int) { c.ck.fullEvery = max(n, 1) }

// b2i is 1 for true.
func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// contrib is the tier a table entry counts on: (block, pool index in
// c.pools) or pool -1 for none. The rule is checkFull's: a device block
// when the entry has one and is not on the host; a host block when the entry
// has no device block and one on the host; out-of-range blocks count
// nowhere (they are reported).
func (c *Core) contrib(g int, tables, host [][]kvcache.BlockID, j int) (kvcache.BlockID, int) {
	b := tables[g][j]
	onHost := j < len(host[g]) && host[g][j] != NoBlock
	switch {
	case b != NoBlock && !onHost:
		if b >= 0 && int(b) < c.dev[g].Total() {
			return b, g
		}
	case b == NoBlock && onHost && c.host != nil:
		if h := host[g][j]; h >= 0 && int(h) < c.host[g].Total() {
			return h, len(c.dev) + g
		}
	}
	return NoBlock, -1
}

// pathPage is table entry i's device block when it is a path entry that
// names a block in range (the block its path node must own), else NoBlock.
func (c *Core) pathPage(g int, tables [][]kvcache.BlockID, path []*Node, i int) kvcache.BlockID {
	if i >= len(path) || i >= len(tables[g]) {
		return NoBlock
	}
	if b := tables[g][i]; b >= 0 && int(b) < c.dev[g].Total() {
		return b
	}
	return NoBlock
}

// commonPrefix is the length of the common prefix of a and b. T must be a
// type whose == is bit equality (block ids, pointers): the usual case, equal
// prefixes of thousands of entries, is one memory comparison.
func commonPrefix[T comparable](a, b []T) int {
	n := min(len(a), len(b))
	if n == 0 {
		return 0
	}
	size := int(unsafe.Sizeof(a[0]))
	if bytes.Equal(unsafe.Slice((*byte)(unsafe.Pointer(&a[0])), n*size), unsafe.Slice((*byte)(unsafe.Pointer(&b[0])), n*size)) {
		return n
	}
	for i := 0; i < n; i++ {
		if a[i] != b[i] {
			return i
		}
	}
	return n
}

// seqNow is what s contributes now: its tables, host tables, path and
// copy-on-write source while it is live, nothing once released.
func (c *Core) seqNow(s *Seq) (live bool, tables, host [][]kvcache.BlockID, path []*Node, cow *Node) {
	if c.seqs[s.id] == s {
		return true, s.tables, s.host, s.path, s.cow
	}
	if len(c.ck.noTables) != len(c.dev) {
		c.ck.noTables = make([][]kvcache.BlockID, len(c.dev))
	}
	return false, c.ck.noTables, c.ck.noTables, nil, nil
}

// firstDiff is the first index where a and b differ (one of them ended
// there, or the entries differ); math.MaxInt when they are equal.
func firstDiff[T comparable](a, b []T) int {
	n := commonPrefix(a, b)
	if n == len(a) && n == len(b) {
		return math.MaxInt
	}
	return n
}

// seqUncount takes s's shadow's contributions out of the recounts from the
// first entry where s differs from it (kept in ck.from for seqCount). All
// dirty sequences are uncounted before any is counted again, so that a
// block that went from one sequence's path node to another's is never
// claimed twice.
func (c *Core) seqUncount(s *Seq) {
	k := &s.ck
	live, tables, host, path, cow := c.seqNow(s)
	ng := len(c.dev)
	if len(k.tables) != ng {
		k.tables, k.host = make([][]kvcache.BlockID, ng), make([][]kvcache.BlockID, ng)
	}
	d := firstDiff(k.path, path)
	for g := 0; g < ng; g++ {
		d = min(d, firstDiff(k.tables[g], tables[g]), firstDiff(k.host[g], host[g]))
	}
	if k.reset || k.suspended != (live && s.suspended) {
		d = 0
	}
	k.from = d

	for g := 0; g < ng; g++ {
		for j := d; j < len(k.tables[g]); j++ {
			if b, pi := c.contrib(g, k.tables, k.host, j); pi >= 0 {
				c.pools[pi].ck.refs[b]--
				c.pools[pi].touch(b)
			}
			if b := c.pathPage(g, k.tables, k.path, j); b != NoBlock {
				ck := &c.dev[g].ck
				if ck.expN[b]--; ck.expN[b] == 0 {
					ck.exp[b] = 0
				}
				c.dev[g].touch(b)
			}
		}
	}
	for _, n := range k.path[min(d, len(k.path)):] {
		n.ck.pins--
		c.tree.touch(n)
	}
	if len(k.moveBlk) > 0 {
		for j, b := range k.moveBlk {
			if hp := c.host[j%len(c.host)]; b >= 0 && int(b) < hp.Total() {
				hp.ck.holds[b]--
				hp.touch(b)
			}
		}
	}
	if k.cow != cow {
		if k.cow != nil {
			k.cow.ck.pins--
			c.tree.touch(k.cow)
		}
		if cow != nil {
			cow.ck.pins++
			c.tree.touch(cow)
		}
	}
}

// seqCount puts s's contributions from ck.from into the recounts, checks
// them as checkFull does, and makes s's shadow s.
func (c *Core) seqCount(s *Seq, bad func(string, ...any)) {
	k := &s.ck
	live, tables, host, path, cow := c.seqNow(s)
	ng, d, tpb := len(c.dev), k.from, c.tpb
	if live {
		c.seqOwn(s, bad)
		c.countMoves(s, bad)
		id := s.id
		for g := 0; g < ng; g++ {
			name := c.groups[g].Name
			for j := d; j < len(tables[g]); j++ {
				b := tables[g][j]
				onHost := j < len(host[g]) && host[g][j] != NoBlock
				switch {
				case b == NoBlock && !onHost:
					bad("seq %d: pool %s: table entry %d is on no tier", id, name, j)
				case b != NoBlock && onHost:
					bad("seq %d: pool %s: table entry %d is on both tiers", id, name, j)
				case b != NoBlock && (b < 0 || int(b) >= c.dev[g].Total()):
					bad("seq %d: pool %s: block %d out of range [0, %d)", id, name, b, c.dev[g].Total())
				case b == NoBlock && (c.host == nil || host[g][j] < 0 || int(host[g][j]) >= c.host[g].Total()):
					bad("seq %d: host pool %s: block %d out of range", id, name, host[g][j])
				}
				if b, pi := c.contrib(g, tables, host, j); pi >= 0 {
					c.pools[pi].ck.refs[b]++
					c.pools[pi].touch(b)
				}
			}
		}
		parent := c.tree.root
		if d > 0 && d <= len(path) {
			parent = path[d-1]
		}
		s.sizeMarks()
		// (d beyond the path: the loop below does nothing.)
		for i := d; i < len(path); i++ {
			n := path[i]
			if n.parent != parent {
				bad("seq %d: path node %d is not a child of path node %d", id, i, i-1)
			}
			if i < s.nblk && !s.holdsPromptBlock(i, tpb) {
				bad("seq %d: path node %d holds other tokens than prompt block %d", id, i, i)
			}
			for g := 0; g < ng; g++ {
				b := NoBlock
				if i < len(tables[g]) {
					b = tables[g][i]
				}
				pb := c.pathPage(g, tables, path, i)
				if pb == NoBlock {
					bad("seq %d: pool %s: table block %d (%d) is not the page of its path node", id, c.groups[g].Name, i, b)
					continue
				}
				ck := &c.dev[g].ck
				if ck.expN[pb] > 0 && ck.exp[pb] != n.ref {
					bad("seq %d: pool %s: table block %d (%d) is the page of two path nodes", id, c.groups[g].Name, i, pb)
				}
				ck.exp[pb] = n.ref
				ck.expN[pb]++
				c.dev[g].touch(pb)
			}
			n.ck.pins++
			c.tree.touch(n)
			parent = n
		}
	}

	// s is the shadow now.
	for g := 0; g < ng; g++ {
		e := min(d, len(tables[g]), len(k.tables[g]))
		k.tables[g] = append(k.tables[g][:e], tables[g][e:]...)
		e = min(d, len(host[g]), len(k.host[g]))
		k.host[g] = append(k.host[g][:e], host[g][e:]...)
	}
	e := min(d, len(path), len(k.path))
	k.path = append(k.path[:e], path[e:]...)
	if live {
		k.moveBlk = append(k.moveBlk[:0], s.moveBlk...)
	} else {
		k.moveBlk = k.moveBlk[:0]
	}
	k.cow, k.suspended, k.reset = cow, live && s.suspended, false
}

// seqOwn checks s's own numbers (checkFull's per-sequence rules that need
// no other object).
func (c *Core) seqOwn(s *Seq, bad func(string, ...any)) {
	id, l, tpb := s.id, &s.led, c.tpb
	if l.History < 0 || l.History > l.Capacity || l.Capacity > c.maxTokens {
		bad("seq %d: history %d, capacity %d: want 0 <= history <= capacity <= %d", id, l.History, l.Capacity, c.maxTokens)
	}
	if !l.Reserved && l.Capacity != max(l.History, l.Hold) {
		bad("seq %d: capacity %d without a reservation, want max(history %d, hold %d)", id, l.Capacity, l.History, l.Hold)
	}
	if s.suspended && l.Reserved {
		bad("seq %d: suspended with a reservation outstanding", id)
	}
	want := kvcache.BlocksFor(l.Capacity, tpb)
	for g := range c.dev {
		if len(s.tables[g]) != want {
			bad("seq %d: pool %s: %d table entries, want ceil(capacity %d / %d) = %d", id, c.groups[g].Name, len(s.tables[g]), l.Capacity, tpb, want)
		}
		if s.suspended && len(s.host[g]) != len(s.tables[g]) {
			bad("seq %d: pool %s: %d host entries for %d table entries", id, c.groups[g].Name, len(s.host[g]), len(s.tables[g]))
		}
		if !s.suspended && len(s.host[g]) != 0 {
			bad("seq %d: resident with %d host entries", id, len(s.host[g]))
		}
	}
	if len(s.path) > l.History/tpb || len(s.path) > s.nblk {
		bad("seq %d: tree path of %d blocks beyond history %d / prompt %d", id, len(s.path), l.History, s.nblk*tpb)
	}
}

// countMoves puts the holds of s's pending moves into the host pools'
// recounts and checks the moves as checkFull does (checkMoves; the per-node
// count of live moves is verifyNode's, from the holds).
func (c *Core) countMoves(s *Seq, bad func(string, ...any)) {
	if len(s.moves) == 0 && len(s.moveBlk) == 0 {
		return
	}
	c.checkMoves(s, nil, bad)
	if c.host == nil {
		return
	}
	for j, b := range s.moveBlk {
		if hp := c.host[j%len(c.host)]; b >= 0 && int(b) < hp.Total() && hp.ck.holds != nil {
			hp.ck.holds[b]++
			hp.touch(b)
		}
	}
}

// listed reports whether n is in t.all at its recorded position.
func (t *Tree) listed(n *Node) bool {
	return n != t.root && n.allIdx >= 0 && int(n.allIdx) < len(t.all) && t.all[n.allIdx] == n
}

// nodeDelta moves the recounts from n's shadow to n as it is now and makes
// n's shadow n; what changed marks the other ends of n's relations.
func (t *Tree) nodeDelta(n *Node, bad func(string, ...any)) {
	k := &n.ck
	if n == t.root {
		kids := int32(n.children.len())
		t.ck.listed += int(kids - k.kids)
		k.kids = kids
		return
	}
	for _, pos := range [2]int32{n.allIdx, k.allIdx} {
		if pos >= 0 && int(pos) < len(t.all) && t.all[pos].allIdx != pos {
			bad("tree: node %p: at list position %d, records %d", t.all[pos], pos, t.all[pos].allIdx)
		}
	}
	in := t.listed(n)
	var parent *Node
	var kids int32
	live, pinned, evict := false, false, false
	onHost, hevict := false, false
	if in {
		parent, kids = n.parent, int32(n.children.len())
		live, pinned, evict = n.nPages > 0, n.pins > 0, n.pins == 0 && n.nPages > 0
		onHost = n.OnHost()
		hevict = onHost && n.pins == 0 && n.h.pend == 0
	}
	if k.in != in || k.parent != refOf(parent) || k.live != live || k.pinned != pinned || k.onHost != onHost {
		if p := t.nodeAt(k.parent); k.in && p != nil {
			p.ck.liveKids -= int32(b2i(k.live))
			p.ck.pinnedKids -= int32(b2i(k.pinned))
			p.ck.hostKids -= int32(b2i(k.onHost))
			t.touch(p)
		}
		if parent != nil {
			parent.ck.liveKids += int32(b2i(live))
			parent.ck.pinnedKids += int32(b2i(pinned))
			parent.ck.hostKids += int32(b2i(onHost))
			t.touch(parent)
		}
	}
	t.ck.listed += int(kids) - int(k.kids)
	t.ck.evictable += b2i(evict) - b2i(k.evict)
	t.ck.hevictable += b2i(hevict) - b2i(k.hevict)
	shadow := n.ckHPages()
	for g, b := range n.hpages() {
		if old := shadow[g]; old != b {
			t.ht.pools[g].touch(old)
			t.ht.pools[g].touch(b)
			shadow[g] = b
		}
	}
	k.onHost, k.hevict = onHost, hevict
	shadow = n.ckPages()
	for g, b := range n.pages {
		if old := shadow[g]; old != b {
			t.pools[g].touch(old)
			t.pools[g].touch(b)
			shadow[g] = b
		}
	}
	k.in, k.parent, k.allIdx, k.kids = in, refOf(parent), n.allIdx, kids
	k.live, k.pinned, k.evict = live, pinned, evict
}

// verifyNode checks n as checkFull's tree pass checks it, against the
// recounts (all deltas applied).
func (t *Tree) verifyNode(n *Node, bad func(string, ...any)) {
	k := &n.ck
	if n == t.root {
		if n.liveKids != k.liveKids {
			bad("tree: node %p: live kids %d, recomputed %d", n, n.liveKids, k.liveKids)
		}
		if t.ht.pools != nil && n.h.kids != k.hostKids {
			bad("tree: root: %d host-only children, recounted %d", n.h.kids, k.hostKids)
		}
		return
	}
	leaf, hleaf := false, false
	defer func() {
		t.ck.leaves += b2i(leaf) - b2i(k.leaf)
		k.leaf = leaf
		t.ck.hleaves += b2i(hleaf) - b2i(k.hleaf)
		k.hleaf = hleaf
	}()
	if !k.in {
		if k.pins > 0 {
			bad("tree: node %p: pinned %d times by sequences but not attached to the tree", n, k.pins)
		}
		return
	}
	if !t.reachesRoot(n) {
		bad("tree: node %p: parent link or hash key wrong, or does not reach the root through its parents", n)
		return
	}
	if n.depth != n.parent.depth+1 {
		bad("tree: node %p: depth %d under a parent at depth %d", n, n.depth, n.parent.depth)
	}
	t.checkNodeCounts(n, k.liveKids, k.pins, bad)
	t.checkHot(n, bad)
	if n.pins == 0 && k.pinnedKids > 0 {
		bad("tree: node %p: not pinned but %d of its children are", n, k.pinnedKids)
	}
	leaf = n.pins == 0 && n.nPages > 0 && k.liveKids == 0
	i := int(n.heapIdx)
	inHeap := i >= 0 && i < len(t.heap) && t.heap[i] == n
	if leaf != inHeap {
		bad("tree: node %p: evictable leaf %v, in the eviction heap %v", n, leaf, inHeap)
	}
	if inHeap {
		if i > 0 && t.less(n, t.heap[(i-1)/2]) {
			bad("tree: heap order broken at %d", i)
		}
		for _, ch := range [2]int{2*i + 1, 2*i + 2} {
			if ch < len(t.heap) && t.less(t.heap[ch], n) {
				bad("tree: heap order broken at %d", ch)
			}
		}
	}
	if t.ht.pools != nil {
		hleaf = t.verifyHost(n, bad)
	}
}

// verifyHost checks listed node n's host tier state as checkHostTree does
// (H2-H7 of checkFull), against the recounts, and reports whether n is a
// host leaf. Its pending count is checked against the holds of its host
// pages: every hold of an owned host block is a live move of its owner
// (verifyBlock proves the holds against the sequences' moves and marks the
// owner).
func (t *Tree) verifyHost(n *Node, bad func(string, ...any)) bool {
	k := &n.ck
	t.checkHostPages(n, bad)
	pend := int32(0)
	if n.h.n > 0 && len(n.hpages()) > 0 {
		if b := n.hpages()[0]; b >= 0 && int(b) < t.ht.pools[0].Total() {
			pend = t.ht.pools[0].held(int(b))
		}
	}
	t.checkHostNode(n, pend, bad)
	if !n.Stored() && k.hostKids > 0 {
		bad("tree: node %p: no content but %d host-only children", n, k.hostKids)
	}
	if n.h.kids != k.hostKids {
		bad("tree: node %p: %d host-only children, recounted %d", n, n.h.kids, k.hostKids)
	}
	if n.OnHost() && n.pins != 0 {
		bad("tree: node %p: on the host tier with %d pins", n, n.pins)
	}
	want := n.OnHost() && n.pins == 0 && n.h.pend == 0
	if want != n.h.counted {
		bad("tree: node %p: host evictable %v, recomputed %v", n, n.h.counted, want)
	}
	leaf := want && n.liveKids == 0 && k.hostKids == 0
	i := int(n.h.hidx) - 1
	inHeap := i >= 0 && i < len(t.ht.heap) && t.ht.heap[i] == n
	if leaf != inHeap || n.h.hidx != 0 && !inHeap {
		bad("tree: node %p: host leaf %v, in the host heap %v", n, leaf, n.h.hidx > 0)
	}
	if inHeap {
		h := t.ht.heap
		if i > 0 && t.less(n, h[(i-1)/2]) {
			bad("tree: host heap order broken at %d", i)
		}
		for _, ch := range [2]int{2*i + 1, 2*i + 2} {
			if ch < len(h) && t.less(h[ch], n) {
				bad("tree: host heap order broken at %d", ch)
			}
		}
	}
	return leaf
}

// reachesRoot reports whether n reaches the root through listed nodes each
// listed under its hash by its parent, memoised for this check (ck.seen).
func (t *Tree) reachesRoot(n *Node) bool {
	steps := 0
	m := n
	for m != t.root && m.ck.seen != t.ck.epoch {
		p := m.parent
		if !t.listed(m) || p == nil || p.children.get(m.hash) != m {
			return false
		}
		if steps++; steps > len(t.all) {
			return false // a cycle
		}
		m = p
	}
	for m = n; m != t.root && m.ck.seen != t.ck.epoch; m = m.parent {
		m.ck.seen = t.ck.epoch
	}
	return true
}

// verifyBlock checks block b of pool pi (index in c.pools) as checkFull's
// pool pass checks it, against the recounts, and makes its shadow the block.
func (c *Core) verifyBlock(pi int, b kvcache.BlockID, bad func(string, ...any)) {
	p := c.pools[pi]
	k := &p.ck
	r, o, held := p.refs[b], p.owner[b], p.held(int(b))
	host := pi >= len(c.dev)
	if r != k.refs[b] {
		bad("pool %d: block %d: refcount %d, recomputed %d", p.id, b, r, k.refs[b])
	}
	if free := r == 0 && o == nil && held == 0; free != k.inFree[b] {
		bad("pool %d: block %d: unreferenced, unowned and unheld %v, on the free stack %v", p.id, b, free, k.inFree[b])
	}
	if cached := r == 0 && (o != nil || held > 0); cached != k.cached[b] {
		k.ncache += b2i(cached) - b2i(k.cached[b])
		k.cached[b] = cached
	}
	switch {
	case o == nil:
	case !host && o.pages[pi] != b,
		host && (o.hpages() == nil || o.hpages()[pi-len(c.dev)] != b):
		bad("pool %d: block %d owned by a node that does not hold it", p.id, b)
	}
	if host && k.holds != nil {
		if held != k.holds[b] {
			bad("pool %d: block %d: held by %d pending moves, recomputed %d", p.id, b, held, k.holds[b])
		}
		if r > 0 && (o != nil || held > 0) {
			bad("pool %d: block %d is both a suspended sequence's and a cached node's (or a pending move's)", p.id, b)
		}
		c.tree.touch(o) // its pending count is its host pages' holds (verifyNode)
	}
	if r := refOf(o); r != k.owner[b] {
		c.tree.touch(c.tree.nodeAt(k.owner[b]))
		c.tree.touch(o)
		k.owner[b] = r
	}
	if pi < len(c.dev) && k.expN[b] > 0 && refOf(o) != k.exp[b] {
		bad("pool %s: block %d is a table block of a path node that is not its owner", c.groups[pi].Name, b)
	}
}

// freeDelta moves pool p's free-stack membership from its shadow to the
// stack as it is now (a stack: only its top changes, above ck.low).
func (p *BlockPool) freeDelta(bad func(string, ...any)) {
	k := &p.ck
	d := min(k.low, len(k.free), len(p.free))
	d += commonPrefix(k.free[d:], p.free[d:])
	for _, b := range k.free[d:] {
		k.inFree[b] = false
		p.touch(b)
	}
	for _, b := range p.free[d:] {
		if b < 0 || int(b) >= p.Total() {
			bad("pool %d: block %d on the free stack out of range", p.id, b)
			continue
		}
		if k.inFree[b] {
			bad("pool %d: block %d twice on the free stack", p.id, b)
		}
		k.inFree[b] = true
		p.touch(b)
	}
	k.free = append(k.free[:d], p.free[d:]...)
	k.low = len(p.free)
}

// checkIncremental is the deep self-check over what changed since the last
// one (see the top of this file); the shadows must be valid.
func (c *Core) checkIncremental() []string {
	var v []string
	bad := func(format string, args ...any) { v = append(v, fmt.Sprintf(format, args...)) }
	t := c.tree
	t.ck.epoch++
	for _, s := range c.ck.seqs {
		c.seqUncount(s)
	}
	for _, s := range c.ck.seqs {
		c.seqCount(s, bad)
		s.ck.dirty = false
	}
	c.ck.work += len(c.ck.seqs)
	c.ck.seqs = c.ck.seqs[:0]
	for _, p := range c.pools {
		p.freeDelta(bad)
	}
	// Deltas mark the other ends of relations; go on until nothing new.
	ni, bi := 0, make([]int, len(c.pools))
	for more := true; more; {
		more = false
		for ; ni < len(t.ck.dirty); ni++ {
			t.nodeDelta(t.nodeAt(t.ck.dirty[ni]), bad)
			more = true
		}
		for pi, p := range c.pools {
			for ; bi[pi] < len(p.ck.dirty); bi[pi]++ {
				c.verifyBlock(pi, p.ck.dirty[bi[pi]], bad)
				more = true
			}
		}
	}
	c.ck.work += ni
	for _, k := range bi {
		c.ck.work += k
	}
	for _, r := range t.ck.dirty {
		n := t.nodeAt(r)
		t.verifyNode(n, bad)
		n.dirty = false
	}
	t.ck.dirty = t.ck.dirty[:0]
	for _, p := range c.pools {
		for _, b := range p.ck.dirty {
			p.ck.mark[b] = false
		}
		p.ck.dirty = p.ck.dirty[:0]
		st := p.Stats()
		if p.ck.ncache != p.cached || st.Free+st.Cached+st.InUse != st.Total || st.InUse < 0 {
			bad("pool %d: free %d + cached %d (recomputed %d) + in use %d != total %d", p.id, st.Free, st.Cached, p.ck.ncache, st.InUse, st.Total)
		}
	}
	if len(t.all) != t.nodes {
		bad("tree: %d nodes attached, counted %d", len(t.all), t.nodes)
	}
	if t.ck.listed != len(t.all) {
		bad("tree: child maps hold %d nodes, %d attached", t.ck.listed, len(t.all))
	}
	if t.ck.evictable != t.evictable {
		bad("tree: evictable %d, recomputed %d", t.evictable, t.ck.evictable)
	}
	if t.ck.leaves != len(t.heap) {
		bad("tree: eviction heap has %d nodes, %d evictable leaves", len(t.heap), t.ck.leaves)
	}
	if t.ht.pools != nil {
		if t.ck.hevictable != t.ht.evictable {
			bad("tree: host evictable %d, recomputed %d", t.ht.evictable, t.ck.hevictable)
		}
		if t.ck.hleaves != len(t.ht.heap) {
			bad("tree: host heap has %d nodes, %d host leaves", len(t.ht.heap), t.ck.hleaves)
		}
		moves := 0
		for _, s := range c.seqs {
			moves += len(s.moves)
		}
		if moves != c.moving {
			bad("host tier: %d pending moves, counted %d", moves, c.moving)
		}
	}
	return v
}

// resync rebuilds every shadow and recount of the incremental check from
// the state as it is (after a full check) and clears the marks.
func (c *Core) resync() {
	t := c.tree
	// Forget the marks.
	for _, s := range c.ck.seqs {
		s.ck.dirty = false
	}
	c.ck.seqs = c.ck.seqs[:0]
	resetNode := func(n *Node) {
		n.ck = nodeCheck{allIdx: -1}
		n.dirty = false
		pages, hpages := n.ckPages(), n.ckHPages()
		for g := range pages {
			pages[g] = NoBlock
		}
		for g := range hpages {
			hpages[g] = NoBlock
		}
	}
	for _, r := range t.ck.dirty {
		resetNode(t.nodeAt(r))
	}
	t.ck.dirty = t.ck.dirty[:0]
	for _, n := range t.all {
		resetNode(n)
	}
	for _, n := range t.spare {
		resetNode(n)
	}
	resetNode(t.root)
	for _, s := range c.seqs {
		for _, n := range s.path {
			resetNode(n)
		}
		if s.cow != nil {
			resetNode(s.cow)
		}
	}
	for pi, p := range c.pools {
		k := &p.ck
		n := p.Total()
		if len(k.mark) != n {
			k.mark = make([]bool, n)
		}
		clear(k.mark)
		k.dirty = k.dirty[:0]
		k.refs = resized(k.refs, n)
		k.inFree = resized(k.inFree, n)
		k.cached = resized(k.cached, n)
		k.owner = resized(k.owner, n)
		for b, o := range p.owner {
			k.owner[b] = refOf(o)
		}
		k.free = append(k.free[:0], p.free...)
		k.low = len(p.free)
		for _, b := range p.free {
			if b >= 0 && int(b) < n {
				k.inFree[b] = true
			}
		}
		k.ncache = 0
		for b := range n {
			if p.refs[b] == 0 && (p.owner[b] != nil || p.held(b) > 0) {
				k.cached[b] = true
				k.ncache++
			}
		}
		if pi < len(c.dev) {
			k.exp = resized(k.exp, n)
			k.expN = resized(k.expN, n)
		} else if p.holds != nil {
			k.holds = resized(k.holds, n) // recounted by seqCount below
		}
	}
	t.ck.listed, t.ck.evictable, t.ck.leaves = 0, 0, 0
	t.ck.hevictable, t.ck.hleaves = 0, 0
	t.nodeDelta(t.root, nil) // listed += root's children
	nobad := func(string, ...any) {}
	for _, n := range t.all {
		t.nodeDelta(n, nobad) // shadows and parents' recounts from zero
	}
	for _, r := range t.ck.dirty {
		t.nodeAt(r).dirty = false // nodeDelta marked the parents
	}
	t.ck.dirty = t.ck.dirty[:0]
	for _, n := range t.all {
		if n.pins == 0 && n.nPages > 0 && n.ck.liveKids == 0 {
			n.ck.leaf = true
			t.ck.leaves++
		}
		if n.ck.hevict && n.liveKids == 0 && n.ck.hostKids == 0 {
			n.ck.hleaf = true
			t.ck.hleaves++
		}
	}
	// The sequences: spare ones contribute nothing; live ones everything.
	for _, s := range c.spare {
		s.ck = seqCheck{tables: s.ck.tables, host: s.ck.host, path: s.ck.path[:0], moveBlk: s.ck.moveBlk[:0]}
		for g := range s.ck.tables {
			s.ck.tables[g], s.ck.host[g] = s.ck.tables[g][:0], s.ck.host[g][:0]
		}
	}
	for _, s := range c.seqs {
		s.ck = seqCheck{tables: s.ck.tables, host: s.ck.host, path: s.ck.path[:0], moveBlk: s.ck.moveBlk[:0], reset: true}
		for g := range s.ck.tables {
			s.ck.tables[g], s.ck.host[g] = s.ck.tables[g][:0], s.ck.host[g][:0]
		}
		c.seqUncount(s)
		c.seqCount(s, nobad)
	}
	for _, p := range c.pools {
		for _, b := range p.ck.dirty {
			p.ck.mark[b] = false
		}
		p.ck.dirty = p.ck.dirty[:0]
	}
	for _, r := range t.ck.dirty {
		t.nodeAt(r).dirty = false
	}
	t.ck.dirty = t.ck.dirty[:0]
	c.ck.valid = true
}

// unmark forgets every mark and drops the shadows: the next check is full
// (check, when a full one did not resync), and a resync rebuilds every
// shadow from scratch, the spare nodes' and sequences' included.
func (c *Core) unmark() {
	for _, s := range c.ck.seqs {
		s.ck.dirty = false
	}
	c.ck.seqs = c.ck.seqs[:0]
	t := c.tree
	for _, r := range t.ck.dirty {
		t.nodeAt(r).dirty = false
	}
	t.ck.dirty = t.ck.dirty[:0]
	for _, p := range c.pools {
		for _, b := range p.ck.dirty {
			p.ck.mark[b] = false
		}
		p.ck.dirty = p.ck.dirty[:0]
	}
	c.ck.valid = false
}

// resized is s with length n, all zero.
func resized[T any](s []T, n int) []T {
	if cap(s) < n {
		return make([]T, n)
	}
	s = s[:n]
	clear(s)
	return s
}
