package cachemgrv2

import (
	"iter"
	"unsafe"

	"github.com/zeebo/xxh3"

	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
)

// DefaultPriority is the eviction priority of a node whose sequences asked
// for none (kvcache.DefaultPriority); lower priorities are evicted first,
// then the eviction policy decides (explain.go, Retention).
const DefaultPriority int8 = kvcache.DefaultPriority

// Node is one committed full block of tokens in the radix tree, keyed by its
// token content under its parent. It holds one page per pool group (NoBlock
// where it holds none) in that group's device pool, or, evicted to the host
// tier, in its host pool (Node.h, hostreuse.go).
//
// A node is pinned while any live sequence relies on it (its path passes
// through it, or it is the source of a pending copy-on-write). Pins cover the
// whole path from the root, so every ancestor of a pinned node is pinned.
// Pinned nodes are never evicted and never pruned.
type Node struct {
	parent   *Node
	hash     uint64
	tokens   []int32
	children kids
	pages    []kvcache.BlockID
	nPages   int
	pins     int32
	liveKids int32 // children that hold at least one page
	prio     int8  // retention priority, the eviction heap's first key (see below)
	// dirty: on Tree.ck.dirty for the next deep check (dirty.go); here,
	// with ref, beside the fields every mutation writes, so that marking a
	// node (Tree.touch, at every mutation) reads no other cache line.
	dirty bool
	// ref names the node for good (nodeSlab: its place in the slab; 1 for
	// the root): the deep check's shadows hold refs, not pointers, so the
	// GC has none of theirs to follow (Tree.nodeAt).
	ref int32
	// salt is the cache salt of a child of the root (its key mixes it in);
	// "" elsewhere. Deeper nodes inherit their ancestor's by position.
	salt string
	// chain is the node's prefix hash for KV events (the salt and every
	// block from the root); computed only with events on.
	chain   uint64
	tick    uint64 // LRU key: when the last pin went away
	heapIdx int32  // position in the eviction heap; -1 when not in it
	queued  bool   // in the prune queue
	allIdx  int32  // position in Tree.all while attached
	gen     uint32 // bumped each time the node is (re)used for a block (newNode)
	// depth is the number of blocks from the root to the node, its own
	// included (0 for the root), set with its parent by newNode; the deep
	// check proves it is its parent's plus one (Tree.Placed).
	depth int32

	// h is the node's host tier state (hostreuse.go); zero without reuse
	// offload.
	h hostNode

	// Scratch of the deep self-check (Tree.Check), valid while chkEpoch is
	// the tree's check epoch: recounting in the nodes themselves instead of
	// in maps keeps a check of a large tree cheap.
	chkEpoch uint32
	chkPins  int32 // pins recounted from the sequences (CountPin)
	chkLive  int32 // children with pages, recounted
	chkFlags uint8 // chkSeen, chkLeaf

	ck nodeCheck // the incremental deep check's shadow and recounts (dirty.go)
	// Retention (explain.go), kept off the cache lines a lookup reads: prio
	// above is the node's effective priority until until, when it falls
	// back to DefaultPriority (0: never; else expIdx is its place in the
	// expiry heap, -1 when not in it); hits counts its reuses since it was
	// stored (the LFU key); pos hashes the block's position (the chain of
	// keys from the root: the salt and every block before it) for the ghost
	// record of evictions.
	until  int64
	expIdx int32
	hits   uint32
	pos    uint64
}

const (
	chkSeen   = 1 << iota // attached: the node reaches the root through linked nodes
	chkLeaf               // an unpinned leaf with pages
	chkLinked             // its parent lists it under its hash
)

// kids is a node's children, each under its key (Node.hash): the first
// one in first and any others in more, so that the common node, a block
// followed by at most one other, has no map of its own (a map a node was
// a cost of Commit and of every mark phase of the GC in a tree of
// hundreds of thousands of nodes). Iteration order is unspecified, as a
// map's.
type kids struct {
	first *Node
	more  map[uint64]*Node
}

// get is the child under key h, or nil.
func (k *kids) get(h uint64) *Node {
	if k.first != nil && k.first.hash == h {
		return k.first
	}
	if k.more == nil {
		return nil
	}
	return k.more[h]
}

// put adds c under its key, which no child holds.
func (k *kids) put(c *Node) {
	if k.first == nil {
		k.first = c
		return
	}
	if k.more == nil {
		k.more = make(map[uint64]*Node, 1)
	}
	k.more[c.hash] = c
}

// del removes c, a child under its key.
func (k *kids) del(c *Node) {
	if k.first == c {
		k.first = nil
		return
	}
	delete(k.more, c.hash)
}

// len is the number of children.
func (k *kids) len() int {
	n := len(k.more)
	if k.first != nil {
		n++
	}
	return n
}

// all yields every child.
func (k *kids) all() iter.Seq[*Node] {
	return func(yield func(*Node) bool) {
		if k.first != nil && !yield(k.first) {
			return
		}
		for _, c := range k.more {
			if !yield(c) {
				return
			}
		}
	}
}

// Pages returns the node's page per pool group (NoBlock where absent); the
// slice belongs to the node and must not be modified.
func (n *Node) Pages() []kvcache.BlockID { return n.pages }

// Pins is the number of pins on the node.
func (n *Node) Pins() int { return int(n.pins) }

// Parent is the node's parent; nil for the root.
func (n *Node) Parent() *Node { return n.parent }

// Tokens are the block's tokens; the slice must not be modified (it is
// the prompt copy of the sequence that stored the block: Seq.PromptBlock).
func (n *Node) Tokens() []int32 { return n.tokens }

// complete reports whether the node holds a page in every pool group, so a
// sequence may take the whole block from the cache.
func (n *Node) complete() bool { return n.nPages == len(n.pages) }

// Tree is a radix tree of committed full blocks with pins, leaf-first
// eviction (retention priority, then the eviction policy: LRU or LFU) and
// deferred pruning.
//
// Eviction (EvictOne) frees pages only: an evicted node stays attached to its
// parent, without pages, until Prune removes it. Call Prune only at a safe
// point, when no caller holds a *Node obtained from a walk that it has not
// pinned: the Manager prunes at the start of a Reserve batch and at the end
// of Commit, Suspend and Resume batches, never inside an allocation or a
// commit walk. A pinned node and its ancestors are never detached, so a live
// sequence's path is always attached to the root.
//
// Not safe for concurrent use.
type Tree struct {
	root      *Node
	tpb       int
	pools     []*BlockPool // device pool per group
	heap      []*Node      // evictable leaves: unpinned, with pages, no live kids
	evictable int          // unpinned nodes with pages (all of them can be evicted, leaves first)
	pruneQ    []*Node
	tick      uint64
	nodes     int
	all       []*Node // every attached node (root excluded), Node.allIdx its index
	spare     []*Node
	epoch     uint32  // of the current deep self-check (BeginCheck)
	counted   []int32 // refs of the nodes CountPin counted in this check (no pointers: no write barriers)
	ev        *events // KV events; nil when off

	// ht is the host tier of cached nodes (hostreuse.go); zero without one.
	ht hostTree
	ck treeCheck

	// undo records what a reservation's allocation evicts (undo.go).
	undo undoHook
	ret  retention
	slab nodeSlab
	// hot is, by node ref (Node.Ref), whether the node is pinned
	// (hotPinned) and its retention priority (the low bits, 1..100): what
	// a hook that orders its own per-node state by them reads for many
	// nodes at a time (mamba's victim queue, at every prefill chunk)
	// without a cache miss on each node (PinnedPriority). Pin, Unpin and
	// the writes of a priority keep it (setHot); the deep check proves it.
	hot []uint8
}

// nodeSlab hands out new nodes and their arrays (pages, host pages and the
// deep check's shadows of both) from chunks (a node's tokens are a slice of
// its sequence's prompt copy, Tree.extend). A tree never frees a
// node (a pruned one waits on spare for reuse), so a chunk is garbage only
// with the whole tree; meanwhile the GC marks one object per chunk instead
// of five or six per node, and a tree of hundreds of thousands of nodes is
// most of a manager's heap (each mark phase walks it). A node's four block
// arrays are one: Node.pages, whose capacity holds the other three
// (Node.hpages, ckPages, ckHPages), so a node has one pointer for them, not
// four (the GC follows each of every node's pointers at every cycle: with
// tens of thousands of nodes, most of a run's GC time).
type nodeSlab struct {
	nodes  []Node
	chunks [][]Node // every chunk, in order: a node's ref finds it (Tree.nodeAt)
	blocks []kvcache.BlockID
}

// slabChunk is the number of nodes per chunk.
const slabChunk = 64

// node returns a zero node whose pages (groups of them) are NoBlock, and,
// with hostGroups > 0, whose host pages are allocated (initHost sets them);
// the deep check's shadows of both are allocated and NoBlock (nothing
// counted yet). Pages are capped at the node's four arrays (nothing appends
// to pages), so an append never writes into a neighbour.
func (s *nodeSlab) node(groups, hostGroups int) *Node {
	if len(s.nodes) == 0 {
		s.nodes = make([]Node, slabChunk)
		s.chunks = append(s.chunks, s.nodes)
	}
	n := &s.nodes[0]
	n.ref = int32((len(s.chunks)-1)*slabChunk+slabChunk-len(s.nodes)) + firstSlabRef
	s.nodes = s.nodes[1:]
	nb := 2 * (groups + hostGroups)
	if len(s.blocks) < nb {
		s.blocks = make([]kvcache.BlockID, nb*slabChunk)
	}
	b := s.blocks[:nb:nb]
	s.blocks = s.blocks[nb:]
	for i := range b {
		b[i] = NoBlock
	}
	n.pages = b[:groups]
	return n
}

// Node refs: 0 is no node, rootRef the root, and a slab node's is its
// index in the slab plus firstSlabRef.
const (
	rootRef      = 1
	firstSlabRef = 2
)

// refOf is n's ref, 0 for nil.
func refOf(n *Node) int32 {
	if n == nil {
		return 0
	}
	return n.ref
}

// nodeAt is the node of ref r (refOf's inverse over the tree's nodes).
func (t *Tree) nodeAt(r int32) *Node {
	switch r {
	case 0:
		return nil
	case rootRef:
		return t.root
	}
	i := int(r - firstSlabRef)
	return &t.slab.chunks[i/slabChunk][i%slabChunk]
}

// The block arrays of a slab node, in Node.pages's capacity: pages (g
// entries), their shadow, the host pages (hg entries), their shadow.

// hpages is n's host page per group (hostreuse.go; NoBlock where absent):
// the third of its block arrays, nil without a host tier for reuse.
func (n *Node) hpages() []kvcache.BlockID {
	g, hg := len(n.pages), n.hostGroups()
	if hg == 0 {
		return nil
	}
	return n.pages[2*g : 2*g+hg : 2*g+hg]
}

// hostGroups is the length of n's host page arrays: what pages's capacity
// holds past the device pages and their shadow, in two halves.
func (n *Node) hostGroups() int { return max((cap(n.pages)-2*len(n.pages))/2, 0) }

// ckPages is the deep check's shadow of n.pages (dirty.go): the second of
// its block arrays.
func (n *Node) ckPages() []kvcache.BlockID {
	g := len(n.pages)
	return n.pages[g : 2*g : 2*g]
}

// ckHPages is the deep check's shadow of n.hpages(): the fourth of its
// block arrays (empty without a host tier for reuse).
func (n *Node) ckHPages() []kvcache.BlockID {
	g, hg := len(n.pages), n.hostGroups()
	return n.pages[2*g+hg : 2*g+2*hg : 2*g+2*hg]
}

// NewTree returns an empty tree of blocks of tpb tokens whose nodes hold one
// page in each of pools (one device pool per pool group).
func NewTree(tpb int, pools []*BlockPool) *Tree {
	t := &Tree{tpb: tpb, pools: pools}
	t.root = &Node{heapIdx: -1, expIdx: -1, ref: rootRef}
	t.hot = make([]uint8, firstSlabRef)
	if len(pools) > 0 {
		// Room for a node per device block up front: the list is the
		// tree's, grown node by node as prompts are committed, and each
		// doubling of a slice of pointers copies it under the GC's write
		// barrier.
		t.all = make([]*Node, 0, pools[0].Total())
		// The deep check's dirty list too: until a check, every node a
		// prompt's Commit creates is on it.
		t.ck.dirty = make([]int32, 0, pools[0].Total())
	}
	return t
}

// Root is the tree's root; it holds no tokens and no pages.
func (t *Tree) Root() *Node { return t.root }

// Nodes is the number of nodes attached or awaiting pruning, root excluded.
func (t *Tree) Nodes() int { return t.nodes }

// Evictable is the number of unpinned nodes holding pages: EvictOne succeeds
// that many times in a row.
func (t *Tree) Evictable() int { return t.evictable }

// hashTokens hashes a block's tokens; children are keyed by it, and a hit is
// confirmed by comparing the tokens, so a collision never gives a false match.
func hashTokens(tokens []int32) uint64 {
	if len(tokens) == 0 {
		return 0
	}
	return xxh3.Hash(unsafe.Slice((*byte)(unsafe.Pointer(&tokens[0])), 4*len(tokens)))
}

// sameTokens is slices.Equal(a, b) on blocks of tokens, compared as bytes
// by the runtime's memequal: a lookup compares one block per node, and the
// generic loop cost it 40% more (and a speed that moved with code layout).
// TestSameTokens pins it to slices.Equal.
func sameTokens(a, b []int32) bool {
	if len(a) != len(b) {
		return false
	}
	if len(a) == 0 {
		return true
	}
	return string(unsafe.Slice((*byte)(unsafe.Pointer(&a[0])), 4*len(a))) ==
		string(unsafe.Slice((*byte)(unsafe.Pointer(&b[0])), 4*len(b)))
}

// saltKey is the key, under the root, of a first block whose token hash is
// h under cache salt salt: h itself for "" (the unsalted tree is keyed as it
// always was), else h mixed with a hash of the salt. A hit is confirmed by
// comparing the tokens and the salt, so two salts never share a node.
func saltKey(h uint64, salt string) uint64 {
	if salt == "" {
		return h
	}
	return h ^ xxh3.HashString("kvx/cache_salt\x00"+salt)
}

// key is the key of parent's child holding tokens under salt.
func (t *Tree) key(parent *Node, salt string, tokens []int32) uint64 {
	h := hashTokens(tokens)
	if parent == t.root {
		h = saltKey(h, salt)
	}
	return h
}

// child returns parent's child holding exactly tokens (under salt, when
// parent is the root), or nil: the child under the key of tokens, when it
// holds them. A parent with one child at most (most nodes: a prompt's blocks
// are a chain) needs no key: its child, if any, is under the key of its own
// tokens (newNode keyed it by them, and they change only there), so it is
// the answer exactly when it holds tokens. TestChildIsKeyLookup pins this to
// the lookup by key.
func (t *Tree) child(parent *Node, salt string, tokens []int32) *Node {
	if c := t.onlyChild(parent, salt, tokens); c != nil || parent.children.more == nil {
		return c
	}
	c := parent.children.get(t.key(parent, salt, tokens))
	if c == nil || !sameTokens(c.tokens, tokens) || c.salt != salt && parent == t.root {
		return nil
	}
	return c
}

// onlyChild is parent's first child when it holds tokens (under salt at the
// root), else nil; with no other children (kids.more nil) it is what child
// returns.
func (t *Tree) onlyChild(parent *Node, salt string, tokens []int32) *Node {
	c := parent.children.first
	if c == nil || !sameTokens(c.tokens, tokens) || c.salt != salt && parent == t.root {
		return nil
	}
	return c
}

// childVia is child(parent, salt, tokens) found through guess, a node an
// earlier walk found there (nil: none), when guess still is that child:
// listed by parent under its key, holding exactly tokens, under salt at the
// root. Then the block needs no hash: a node's key is the hash of its
// tokens (and salt) as newNode wrote them, and its tokens change only there,
// so child would find guess. Otherwise it is child.
func (t *Tree) childVia(guess, parent *Node, salt string, tokens []int32) *Node {
	if guess != nil && guess.parent == parent && parent.children.get(guess.hash) == guess &&
		sameTokens(guess.tokens, tokens) && (parent != t.root || guess.salt == salt) {
		return guess
	}
	return t.child(parent, salt, tokens)
}

// Match walks the tree from the root with tokens, one full block at a time, up
// to maxBlocks blocks, and appends each matched node that holds all its pages
// to path. It changes nothing; the nodes are not pinned.
func (t *Tree) Match(tokens []int32, maxBlocks int, path []*Node) []*Node {
	return t.match("", tokens, maxBlocks, path)
}

// match is Match under cache salt salt.
func (t *Tree) match(salt string, tokens []int32, maxBlocks int, path []*Node) []*Node {
	n := t.root
	for i := 0; i < maxBlocks; i++ {
		c := t.child(n, salt, tokens[i*t.tpb:(i+1)*t.tpb])
		if c == nil || !c.complete() {
			break
		}
		path = append(path, c)
		n = c
	}
	return path
}

// matchVia is match with hint[i] the guess for block i (childVia): the
// same nodes, without hashing the blocks an earlier walk matched.
func (t *Tree) matchVia(hint []*Node, salt string, tokens []int32, maxBlocks int, path []*Node) []*Node {
	n := t.root
	for i := 0; i < maxBlocks; i++ {
		var g *Node
		if i < len(hint) {
			g = hint[i]
		}
		c := t.childVia(g, n, salt, tokens[i*t.tpb:(i+1)*t.tpb])
		if c == nil || !c.complete() {
			break
		}
		path = append(path, c)
		n = c
	}
	return path
}

// MatchLen is Match that only counts the matched blocks.
func (t *Tree) MatchLen(tokens []int32, maxBlocks int) int {
	return t.matchLen("", tokens, maxBlocks)
}

// matchLen is MatchLen under cache salt salt.
func (t *Tree) matchLen(salt string, tokens []int32, maxBlocks int) int {
	n := t.root
	i := 0
	for ; i < maxBlocks; i++ {
		c := t.child(n, salt, tokens[i*t.tpb:(i+1)*t.tpb])
		if c == nil || !c.complete() {
			break
		}
		n = c
	}
	return i
}

// MatchPartial returns the child of parent, holding all its pages, whose
// tokens share the longest common prefix with tokens, and that length. It is
// the partial-reuse primitive: the matched tokens of the returned node's
// block can be copied into a private block (copy-on-write). It changes
// nothing. len(tokens) may be shorter than a block.
func (t *Tree) MatchPartial(parent *Node, tokens []int32) (*Node, int) {
	return t.matchPartial(parent, "", tokens)
}

// matchPartial is MatchPartial under cache salt salt (which matters when
// parent is the root).
func (t *Tree) matchPartial(parent *Node, salt string, tokens []int32) (*Node, int) {
	var best *Node
	bestN := 0
	for c := range parent.children.all() {
		if !c.complete() || c.h.pend > 0 || parent == t.root && c.salt != salt {
			continue
		}
		n := 0
		for n < len(tokens) && n < len(c.tokens) && c.tokens[n] == tokens[n] {
			n++
		}
		// Ties go to the lower hash so the answer does not depend on map order.
		if n > bestN || (n == bestN && n > 0 && c.hash < best.hash) {
			best, bestN = c, n
		}
	}
	return best, bestN
}

// Extend continues a sequence's path below parent (pinned by the caller) with
// a copy of the block tokens (which a new node keeps) whose KV sits in pages (one block per pool group, each
// referenced by the sequence). It returns the node now pinned for the path:
//
//   - a new node, which adopts pages (adopted true);
//   - an existing node without pages (evicted, awaiting pruning), which adopts
//     pages and is thereby re-attached to the cache (adopted true);
//   - an existing node with pages: it is pinned, but its pages are another
//     copy of the same content (adopted false). The Core then keeps one of
//     the two copies (Core.register), so that the sequence does not hold two
//     blocks for one.
//
// It returns nil when a different block has the same hash (never in
// practice): the caller stops registering that sequence's blocks. Extend
// never allocates blocks, never evicts and never prunes.
func (t *Tree) Extend(parent *Node, tokens []int32, pages []kvcache.BlockID) (n *Node, adopted bool) {
	return t.extend(parent, "", cloneTokens(tokens), pages)
}

// extend is Extend under cache salt salt (which matters when parent is the
// root), whose new node keeps tokens itself, not a copy: the caller never
// writes them again, and their capacity ends with the block (Seq.PromptBlock).
// With KV events on, a node that adopts pages is reported stored.
func (t *Tree) extend(parent *Node, salt string, tokens []int32, pages []kvcache.BlockID) (n *Node, adopted bool) {
	var h uint64
	c := t.onlyChild(parent, salt, tokens) // child's shortcut: no key to compute
	if c == nil {
		h = t.key(parent, salt, tokens)
		c = parent.children.get(h)
	}
	switch {
	case c == nil:
		c = t.newNode(parent, h, tokens)
		if parent == t.root {
			c.salt = salt
		}
		if t.ev != nil {
			c.chain = t.ev.chain(parent, c, salt)
		}
		parent.children.put(c)
		t.touch(parent)
	case !sameTokens(c.tokens, tokens) || parent == t.root && c.salt != salt:
		return nil, false
	}
	t.Pin(c)
	if c.nPages > 0 {
		return c, false
	}
	for g, b := range pages {
		c.pages[g] = b
		t.pools[g].adopt(b, c)
	}
	c.nPages = len(pages)
	t.touch(c)
	if c.h.n > 0 {
		t.leaveHost(c) // the sequence's device copy replaces the host one
	}
	t.addLiveKid(parent)
	if t.ev != nil {
		t.ev.stored(t, c)
	}
	return c, true
}

// repage gives node n, whose pages no sequence references, pages instead: a
// copy of the same content that a sequence references (Core.register). Its
// old pages are freed. It never allocates and never evicts content.
func (t *Tree) repage(n *Node, pages []kvcache.BlockID) {
	t.touch(n)
	for g, b := range pages {
		t.pools[g].drop(n.pages[g])
		n.pages[g] = b
		t.pools[g].adopt(b, n)
	}
}

func (t *Tree) newNode(parent *Node, h uint64, tokens []int32) *Node {
	var n *Node
	if k := len(t.spare); k > 0 {
		n = t.spare[k-1]
		t.spare = t.spare[:k-1]
	} else {
		n = t.slab.node(len(t.pools), len(t.ht.pools))
	}
	n.parent, n.hash, n.heapIdx = parent, h, -1
	n.depth = parent.depth + 1
	n.prio, n.until, n.expIdx, n.hits = DefaultPriority, 0, -1, 0
	if int(n.ref) >= len(t.hot) {
		t.hot = append(t.hot, make([]uint8, int(n.ref)+1-len(t.hot))...)
	}
	t.setHot(n)
	n.h.pendKids, n.h.pendSeq = 0, nil
	n.pos = mixPos(parent.pos, h)
	n.tokens = tokens
	for g := range n.pages {
		n.pages[g] = NoBlock
	}
	n.gen++
	t.touch(n)
	t.initHost(n)
	n.allIdx = int32(len(t.all))
	t.all = append(t.all, n)
	t.nodes++
	if parent == t.root {
		t.indexFirst(n)
	}
	return n
}

func (t *Tree) addLiveKid(p *Node) {
	t.touch(p)
	p.liveKids++
	if p.heapIdx >= 0 {
		t.heapRemove(p)
	}
}

// Pin adds a pin. The caller pins a path from the root down, so that pins
// cover the whole path.
func (t *Tree) Pin(n *Node) {
	t.touch(n)
	if n.pins == 0 && n.nPages > 0 {
		t.evictable--
		if n.heapIdx >= 0 {
			t.heapRemove(n)
		}
	}
	n.pins++
	t.setHot(n)
	if n.h.counted {
		t.hostFix(n) // a host node a new sequence is about to promote
	}
}

// hotPinned is the pinned bit of a Tree.hot entry.
const hotPinned = 0x80

// hotOf is n's Tree.hot entry as n's own fields have it.
func hotOf(n *Node) uint8 {
	h := uint8(n.prio) &^ hotPinned
	if n.pins > 0 {
		h |= hotPinned
	}
	return h
}

// setHot writes n's Tree.hot entry; every write of n.pins or n.prio is
// followed by one.
func (t *Tree) setHot(n *Node) { t.hot[n.ref] = hotOf(n) }

// PinnedPriority is Pins() > 0 and Priority() of the node whose Ref is ref,
// from the tree's index of them: a read of a dense byte array instead of
// the node. ref must name a node of the tree.
func (t *Tree) PinnedPriority(ref int32) (pinned bool, prio int) {
	h := t.hot[ref]
	return h&hotPinned != 0, int(h &^ hotPinned)
}

// Unpin drops a pin. touch marks the node as used now (its LRU key); undoing
// a pin taken moments ago (a denied or unreserved reservation) passes false so
// that the eviction order is exactly as before.
func (t *Tree) Unpin(n *Node, touch bool) {
	t.touch(n)
	n.pins--
	if n.pins > 0 {
		return
	}
	t.setHot(n)
	if touch {
		t.tick++
		n.tick = t.tick
	}
	if n.nPages == 0 {
		if n.h.n > 0 {
			t.hostFix(n) // back to the host tier's LRU
			return
		}
		t.queuePrune(n)
		return
	}
	t.evictable++
	if n.liveKids == 0 {
		t.heapPush(n)
	}
}

// EvictOne frees the pages of the least valuable evictable leaf (lowest
// priority, then least recently used) and queues the node for pruning. It
// reports false when nothing is evictable.
func (t *Tree) EvictOne() bool { return t.evictLeaf() != nil }

// evictLeaf is EvictOne that returns the evicted node (nil when nothing is
// evictable).
func (t *Tree) evictLeaf() *Node {
	if len(t.heap) == 0 {
		return nil
	}
	n := t.heap[0]
	t.heapRemove(n)
	t.touch(n)
	t.undo.note(n)
	for g, b := range n.pages {
		if b != NoBlock {
			t.pools[g].drop(b)
			n.pages[g] = NoBlock
		}
	}
	n.nPages = 0
	t.evictable--
	t.evicted(n, kvcache.TierDevice)
	if t.ev != nil {
		t.ev.Removed(kvcache.TierDevice, n.chain)
	}
	p := n.parent
	t.touch(p)
	p.liveKids--
	if p != t.root && p.liveKids == 0 && p.pins == 0 && p.nPages > 0 {
		t.heapPush(p)
	}
	t.queuePrune(n)
	return n
}

func (t *Tree) queuePrune(n *Node) {
	t.touch(n)
	if !n.queued {
		n.queued = true
		t.pruneQ = append(t.pruneQ, n)
	}
}

// Prune detaches queued nodes that hold no pages, no pins and no children,
// then their ancestors that became so. Call it only at a safe point (see Tree).
func (t *Tree) Prune() {
	for len(t.pruneQ) > 0 {
		n := t.pruneQ[len(t.pruneQ)-1]
		t.pruneQ = t.pruneQ[:len(t.pruneQ)-1]
		n.queued = false
		t.touch(n)
		for n != t.root && !n.queued && n.pins == 0 && n.nPages == 0 && n.h.n == 0 && n.children.len() == 0 {
			p := n.parent
			p.children.del(n)
			t.touch(p)
			t.recycle(n)
			n = p
		}
	}
}

func (t *Tree) recycle(n *Node) {
	t.forget(n)
	n.parent, n.salt, n.chain = nil, "", 0
	n.tokens = nil // its sequence's prompt copy may go; children is empty and kept for reuse
	last := t.all[len(t.all)-1]
	t.touch(n)
	t.touch(last)
	t.all[n.allIdx], last.allIdx = last, n.allIdx
	t.all = t.all[:len(t.all)-1]
	n.allIdx = -1
	t.nodes--
	t.spare = append(t.spare, n)
}

// ---- eviction heap: min-heap on (prio, [hits under LFU,] tick), intrusive index ----

func (t *Tree) less(a, b *Node) bool {
	if a.prio != b.prio {
		return a.prio < b.prio
	}
	if t.ret.lfu && a.hits != b.hits {
		return a.hits < b.hits
	}
	return a.tick < b.tick
}

func (t *Tree) heapPush(n *Node) {
	t.touch(n)
	t.ret.heapPrio[n.prio]++
	n.heapIdx = int32(len(t.heap))
	t.heap = append(t.heap, n)
	t.up(int(n.heapIdx))
}

func (t *Tree) heapRemove(n *Node) {
	t.touch(n)
	t.ret.heapPrio[n.prio]--
	i := int(n.heapIdx)
	last := len(t.heap) - 1
	if i != last {
		t.swap(i, last)
	}
	t.heap[last] = nil
	t.heap = t.heap[:last]
	n.heapIdx = -1
	if i != last {
		t.down(i)
		t.up(i)
	}
}

func (t *Tree) swap(i, j int) {
	t.heap[i], t.heap[j] = t.heap[j], t.heap[i]
	t.touch(t.heap[i])
	t.touch(t.heap[j])
	t.heap[i].heapIdx = int32(i)
	t.heap[j].heapIdx = int32(j)
}

func (t *Tree) up(i int) {
	for i > 0 {
		p := (i - 1) / 2
		if !t.less(t.heap[i], t.heap[p]) {
			return
		}
		t.swap(i, p)
		i = p
	}
}

func (t *Tree) down(i int) {
	n := len(t.heap)
	for {
		l := 2*i + 1
		if l >= n {
			return
		}
		m := l
		if r := l + 1; r < n && t.less(t.heap[r], t.heap[l]) {
			m = r
		}
		if !t.less(t.heap[m], t.heap[i]) {
			return
		}
		t.swap(i, m)
		i = m
	}
}
