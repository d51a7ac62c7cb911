package cachemgrv2

import (
	"context"
	"fmt"
	"slices"

	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
)

// Inspect implements kvcache.Manager. Sequences come in SeqID order. With
// Tables, each device pool's table lists the sequence's device blocks in
// logical order (blocks on the host tier left out) and each host pool's table
// its host blocks; RefCounts are the pools' reference counts. Violations come
// from the deep self-check (see check: a full recount, or the same
// properties over what changed since the last one). With Tables and
// CheckTables the core checks the tables against the reference counts
// itself (Seal), so a deep check copies no pool's counts into the snapshot.
func (c *Core) Inspect(ctx context.Context, opts kvcache.InspectOptions) (kvcache.Snapshot, error) {
	snap, err := c.Snapshot(ctx, opts)
	if err != nil {
		return snap, err
	}
	c.Seal(opts, &snap)
	return snap, nil
}

// Snapshot is Inspect before Seal. When Seal will check the tables (opts
// Tables and CheckTables, and a layout given to Init), the snapshot's
// tables and reference counts are the core's scratch, valid until the next
// Snapshot: a manager built on Core appends its own pools' tables and
// counts (its scratch too, if it likes) and then calls Seal, which checks
// and drops them. Otherwise they are the caller's, as Inspect's.
func (c *Core) Snapshot(ctx context.Context, opts kvcache.InspectOptions) (kvcache.Snapshot, error) {
	if err := c.ready(ctx, "Inspect"); err != nil {
		return kvcache.Snapshot{}, err
	}
	scratch := c.sealing(opts)
	var snap kvcache.Snapshot
	snap.Pools = make([]kvcache.PoolStats, 0, len(c.pools))
	for _, p := range c.pools {
		snap.Pools = append(snap.Pools, p.Stats())
	}
	c.ids = c.appendSeqIDs(c.ids[:0])
	ids := c.ids
	snap.Seqs = make([]kvcache.SeqState, 0, len(ids))
	blocks := make([]int, len(ids)*len(c.pools)) // one allocation: Inspect runs after every step
	np := len(c.pools)
	if scratch {
		c.seal.tables = slices.Grow(c.seal.tables[:0], len(ids)*np)[:len(ids)*np]
		c.seal.entries = c.seal.entries[:0]
	}
	for i, id := range ids {
		s := c.seqs[id]
		st := kvcache.SeqState{
			Seq: id, History: s.led.History, Capacity: s.led.Capacity, Hold: s.led.Hold,
			Suspended: s.suspended, Blocks: blocks[i*np : (i+1)*np : (i+1)*np],
		}
		if s.led.Reserved {
			st.Reserved, st.Draft = s.led.Tokens+s.led.Draft, s.led.Draft
		}
		if opts.Tables {
			if scratch {
				// capped: a manager appending its own pools' tables
				// reallocates instead of writing into the next sequence's
				st.Tables = c.seal.tables[i*np : (i+1)*np : (i+1)*np]
			} else {
				st.Tables = make([][]kvcache.BlockID, np)
			}
		}
		table := func(t []kvcache.BlockID) []kvcache.BlockID {
			if !scratch {
				return present(t)
			}
			from := len(c.seal.entries)
			c.seal.entries = appendPresent(c.seal.entries, t)
			return c.seal.entries[from:len(c.seal.entries):len(c.seal.entries)]
		}
		for g := range c.dev {
			// Only a suspended sequence has holes (blocks on the host tier);
			// the deep self-check verifies that.
			if s.suspended {
				st.Blocks[g] = countPresent(s.tables[g])
			} else {
				st.Blocks[g] = len(s.tables[g])
			}
			if opts.Tables {
				st.Tables[g] = table(s.tables[g])
			}
			if c.host != nil {
				st.Blocks[len(c.dev)+g] = countPresent(s.host[g])
				if opts.Tables {
					st.Tables[len(c.dev)+g] = table(s.host[g])
				}
			}
		}
		snap.Seqs = append(snap.Seqs, st)
	}
	if opts.Tables {
		if scratch && len(c.seal.refs) != np {
			c.seal.refs = make([][]int32, np)
		}
		for i, p := range c.pools {
			if scratch {
				c.seal.refs[i] = append(c.seal.refs[i][:0], p.refs...)
				snap.RefCounts = append(snap.RefCounts, c.seal.refs[i])
			} else {
				snap.RefCounts = append(snap.RefCounts, slices.Clone(p.refs))
			}
		}
		snap.Violations = c.check()
	}
	return snap, nil
}

// Seal does what opts.CheckTables asks of the side that holds the tables
// (kvcache.SealTables over the layout's pools given to Init): it checks
// snap's tables against its reference counts, adds the findings to
// Violations and drops both. It does nothing unless opts asks for it and
// Init was given the layout.
func (c *Core) Seal(opts kvcache.InspectOptions, snap *kvcache.Snapshot) {
	if c.sealing(opts) {
		kvcache.SealTables(c.layout, opts, snap)
	}
}

// sealing reports whether Seal checks the tables of a snapshot taken with
// opts (and Snapshot may hand them out as scratch).
func (c *Core) sealing(opts kvcache.InspectOptions) bool {
	return opts.Tables && opts.CheckTables && c.layout != nil
}

// sealScratch is what Snapshot hands out for Seal to check and drop:
// reference counts per pool, the sequences' tables (len(pools) per
// sequence) and their entries.
type sealScratch struct {
	refs    [][]int32
	tables  [][]kvcache.BlockID
	entries []kvcache.BlockID
}

// seqIDs is the sequences' ids in order, in a new slice.
func (c *Core) seqIDs() []kvcache.SeqID {
	return c.appendSeqIDs(make([]kvcache.SeqID, 0, len(c.seqs)))
}

// appendSeqIDs appends the sequences' ids to ids and sorts them.
func (c *Core) appendSeqIDs(ids []kvcache.SeqID) []kvcache.SeqID {
	for id := range c.seqs {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids
}

// countPresent counts the entries of t that are not NoBlock, without the
// copy present makes: a shallow Inspect runs after every step.
func countPresent(t []kvcache.BlockID) int {
	n := 0
	for _, b := range t {
		if b != NoBlock {
			n++
		}
	}
	return n
}

// present returns the entries of t that are not NoBlock, in a new slice.
func present(t []kvcache.BlockID) []kvcache.BlockID {
	return appendPresent(make([]kvcache.BlockID, 0, len(t)), t)
}

// appendPresent appends the entries of t that are not NoBlock to dst.
func appendPresent(dst, t []kvcache.BlockID) []kvcache.BlockID {
	for _, b := range t {
		if b != NoBlock {
			dst = append(dst, b)
		}
	}
	return dst
}

// check is the deep self-check behind Inspect's Violations. The first one,
// the one after a check that found something, and then one whenever the
// incremental checks since the last full one have verified as many objects
// (nodes, blocks, sequences) as a full check does are full (checkFull:
// every count recomputed from first principles); the others are
// incremental (checkIncremental, dirty.go: the same properties over what
// changed since the last check, global counters as totals). So the full
// checks cost at most what the incremental ones do, in proportion to what
// changed, however large the tree and the host tier grow; a small tree is
// checked in full often. SetFullCheckEvery fixes the period instead. Tests
// compare the two verdicts on random operation sequences and corruptions
// (dirty_test.go).
//
// When at least half of the objects changed since the last check
// (resyncPays), the check is full (unless SetFullCheckEvery fixes the
// period): an incremental one would verify about as many objects, at a
// higher cost each. A full check rebuilds the incremental check's shadows
// (resync, as much work again as its recount) only when fewer than half
// changed: when more did, the next interval will likely change as much,
// so the shadows are dropped instead and the next check is full too. A
// prefill of long prompts changes nearly every block and node between two
// checks 64 steps apart (seed-b.yaml: all 16,000 nodes and blocks), where
// the resync and an incremental check over everything were two thirds of
// the checks' time.
func (c *Core) check() []string {
	if c.ck.skip {
		return nil
	}
	c.ck.count++
	every := c.ck.fullEvery
	size := c.checkSize()
	pays := c.resyncPays(size)
	var full bool
	switch {
	case !c.ck.valid || c.ck.fullNext || every == 1:
		full = true
	case every > 1:
		full = c.ck.count%every == 0
	default:
		full = c.ck.work >= c.ck.size || !pays
	}
	var v []string
	if full {
		if pays {
			v = c.checkFull()
		} else {
			v = c.recount()
			c.unmark()
		}
		c.ck.fulls++
		c.ck.work, c.ck.size = 0, size
	} else {
		v = c.checkIncremental()
	}
	c.ck.fullNext = len(v) > 0
	return v
}

// resyncPays reports whether a full check of size objects (checkSize)
// should rebuild the shadows for the next check to be incremental: fewer
// than half of them are marked as changed since the last check (dirty.go).
func (c *Core) resyncPays(size int) bool {
	marked := len(c.ck.seqs)
	if c.tree != nil {
		marked += len(c.tree.ck.dirty)
	}
	for _, p := range c.pools {
		marked += len(p.ck.dirty)
	}
	return 2*marked < size
}

// checkSize is the number of objects a full check verifies: the attached
// nodes, every block of every pool, the sequences.
func (c *Core) checkSize() int {
	n := len(c.seqs)
	if c.tree != nil {
		n += len(c.tree.all)
	}
	for _, p := range c.pools {
		n += p.Total()
	}
	return n
}

// checkFull is the full deep self-check: every count the manager keeps
// incrementally is recomputed from first principles. Then it rebuilds the
// incremental check's shadows (resync). What it proves, and what the
// incremental check proves again on every changed part:
//
// Per sequence (S):
//
//	S1 0 <= history <= capacity <= max_seq_len+max_draft
//	S2 capacity == max(history, hold) without a reservation
//	S3 a suspended sequence holds no reservation
//	S4 blocks == ceil(capacity/tpb) in every group
//	S5 suspended: one host entry per table entry; resident: no host entries
//	S6 every table entry is on exactly one tier, its block in range
//	S7 (with P2) the pools' reference counts equal the references
//	   recomputed from all device and host tables
//	S8 the tree path is no longer than history/tpb and prompt/tpb
//	S9 path node i is the child of path node i-1 (the root for 0)
//	S10 path node i holds prompt block i (compared once per node
//	   generation: a node's tokens are written only when newNode gives it a
//	   block)
//	S11 table block i is path node i's page (a sequence never holds a
//	   private copy of a cached block)
//	S12 (with T7) the sequences' paths and copy-on-write sources are the
//	   nodes' pins
//
// Per pool (P):
//
//	P1 no block twice on the free stack
//	P2 reference counts equal the recount (S7)
//	P3 the free stack holds exactly the unreferenced unowned blocks
//	P4 cached recount == cached; free + cached + in use == total; in use >= 0
//	P5 an owned block is one its owner holds as its page: a device page,
//	   or (a host tier for reuse) a host page
//	P6 (host pools with a host tier for reuse) a block's holds equal the
//	   pending moves holding it; the free stack holds the unreferenced,
//	   unowned, unheld blocks and the cached ones are the unreferenced owned
//	   or held; no block is both a suspended sequence's and a node's or a
//	   move's
//
// Tree (T, Tree.Check):
//
//	T1 every listed node is at its recorded list position
//	T2 a listed node's parent lists it under its hash
//	T3 the child maps hold exactly the listed nodes (census)
//	T4 the root's live kids are recounted
//	T5 every listed node reaches the root through linked parents (no cycle)
//	T6 live-kid counts equal the recount
//	T7 pins equal the recount from the sequences (S12)
//	T8 a node's pages are owned by it in their pools; its page count is right
//	T9 a pinned node holds all its pages (never evicted while pinned)
//	T10 a pinned node's parent is pinned (or the root)
//	T11 a node without pages has no children with pages
//	T12 the evictable count and the eviction heap's size (exactly the
//	   unpinned leaves with pages) are recounted
//	T13 an empty unpinned childless node is queued for pruning
//	T14 a node the sequences pin is attached
//	T15 the attached nodes are the node count
//	T16 heap entries are evictable leaves at their index, in heap order
//
// Host tier for reuse (H, checkMoves and checkHostTree):
//
//	H1 pending moves only with a reservation and a host tier for reuse;
//	   a promotion's node is on both tiers on its sequence's new path, an
//	   offload's on the host only
//	H2 a node's host pages are owned by it in their pools, all or none
//	H3 a node's pending count equals the live moves naming it (the holds of
//	   its host pages)
//	H4 a node holds its block on one tier, or on both while a promotion is
//	   pending; filled only while pending
//	H5 a device node's parent is on the device, a stored node's parent is
//	   stored (or the root)
//	H6 host-only children are recounted; a host-only node is unpinned
//	H7 the host evictable count and the host heap (exactly the host leaves,
//	   at their index, in heap order) are recounted
func (c *Core) checkFull() []string {
	v := c.recount()
	c.resync()
	return v
}

// pathMark is a path node as a deep check verified it (Seq.chkPath).
type pathMark struct {
	ref int32 // Node.ref: no pointer for the GC to follow
	gen uint32
}

// sizeMarks gives s.chkPath one entry per path node. Entries beyond the
// last check's are not trusted (a mark of an earlier, longer path): they
// are cleared, so they compare again.
func (s *Seq) sizeMarks() {
	was := len(s.chkPath)
	s.chkPath = slices.Grow(s.chkPath[:0], len(s.path))[:len(s.path)]
	if was < len(s.chkPath) {
		clear(s.chkPath[was:])
	}
}

// holdsPromptBlock reports whether path node i holds prompt block i (S10;
// s.chkPath sized by sizeMarks): its tokens are the block's copy, or, for
// a reused block (i < split, whose tokens s takes from the node), their
// checksum is the one taken from the caller's prompt (Seq.headSum). A
// node's tokens are set once per generation (newNode), and a sequence's
// prompt never changes, so a (node, generation) already found holding
// prompt block i, by a full or an incremental check, needs no second
// comparison.
func (s *Seq) holdsPromptBlock(i, tpb int) bool {
	n := s.path[i]
	mark := pathMark{n.ref, n.gen}
	if s.chkPath[i] == mark {
		return true
	}
	if i < s.split && len(n.tokens) == tpb && sumTokens(n.tokens) == s.headSum[i] ||
		i >= s.split && sameTokens(n.tokens, s.PromptBlock(i, tpb)) {
		s.chkPath[i] = mark
		return true
	}
	s.chkPath[i] = pathMark{}
	return false
}

// recount is checkFull's check proper.
func (c *Core) recount() []string {
	var v []string
	bad := func(format string, args ...any) { v = append(v, fmt.Sprintf(format, args...)) }
	tpb := c.tpb

	// The recounts are scratch kept across checks: a deep check every few
	// dozen steps of pools with tens of thousands of blocks would otherwise
	// allocate (and the GC scan) megabytes each time.
	if len(c.checkRefs) != len(c.pools) {
		c.checkRefs = make([][]int32, len(c.pools))
	}
	refs := c.checkRefs
	for i, p := range c.pools {
		refs[i] = slices.Grow(refs[i][:0], p.Total())[:p.Total()]
		clear(refs[i])
	}
	// Pending host moves: their holds per host pool, their count per node.
	var holds [][]int32
	moves := 0
	for _, s := range c.seqs {
		moves += len(s.moves)
	}
	if moves != c.moving {
		bad("host tier: %d pending moves, counted %d", moves, c.moving)
	}
	if c.hostReuse() {
		if len(c.checkHolds) != len(c.host) {
			c.checkHolds = make([][]int32, len(c.host))
		}
		holds = c.checkHolds
		for g, hp := range c.host {
			holds[g] = slices.Grow(holds[g][:0], hp.Total())[:hp.Total()]
			clear(holds[g])
		}
		c.beginHostCheck()
	}
	c.tree.BeginCheck()
	for _, id := range c.seqIDs() {
		s := c.seqs[id]
		c.seqOwn(s, bad) // S1-S5 and S8, as the incremental check runs them
		for g, pool := range c.dev {
			if len(s.host[g]) == 0 {
				// Resident with nothing on the host: every entry is a
				// device block (the common case, kept tight).
				total, r := pool.Total(), refs[pool.id]
				for j, b := range s.tables[g] {
					switch {
					case b == NoBlock:
						bad("seq %d: pool %s: table entry %d is on no tier", id, c.groups[g].Name, j)
					case b < 0 || int(b) >= total:
						bad("seq %d: pool %s: block %d out of range [0, %d)", id, c.groups[g].Name, b, total)
					default:
						r[b]++
					}
				}
				continue
			}
			for j, b := range s.tables[g] {
				onHost := j < len(s.host[g]) && s.host[g][j] != NoBlock
				switch {
				case b == NoBlock && !onHost:
					bad("seq %d: pool %s: table entry %d is on no tier", id, c.groups[g].Name, j)
				case b != NoBlock && onHost:
					bad("seq %d: pool %s: table entry %d is on both tiers", id, c.groups[g].Name, j)
				case b != NoBlock && (b < 0 || int(b) >= pool.Total()):
					bad("seq %d: pool %s: block %d out of range [0, %d)", id, c.groups[g].Name, b, pool.Total())
				case b != NoBlock:
					refs[pool.id][b]++
				case onHost:
					h := s.host[g][j]
					if h < 0 || int(h) >= c.host[g].Total() {
						bad("seq %d: host pool %s: block %d out of range", id, c.groups[g].Name, h)
					} else {
						refs[c.host[g].id][h]++
					}
				}
			}
		}
		parent := c.tree.root
		s.sizeMarks()
		for i, n := range s.path {
			c.tree.CountPin(n)
			if n.parent != parent {
				bad("seq %d: path node %d is not a child of path node %d", id, i, i-1)
			}
			if i < s.nblk && !s.holdsPromptBlock(i, tpb) {
				bad("seq %d: path node %d holds other tokens than prompt block %d", id, i, i)
			}
			for g, pool := range c.dev {
				if b := s.tables[g][i]; b == NoBlock || pool.owner[b] != n {
					bad("seq %d: pool %s: table block %d (%d) is not the page of its path node", id, c.groups[g].Name, i, b)
				}
			}
			parent = n
		}
		if s.cow != nil {
			c.tree.CountPin(s.cow)
		}
		c.checkMoves(s, holds, bad)
	}

	for i, p := range c.pools {
		c.checkFree = slices.Grow(c.checkFree[:0], p.Total())[:p.Total()]
		inFree := c.checkFree
		clear(inFree)
		for _, b := range p.free {
			if inFree[b] {
				bad("pool %d: block %d twice on the free stack", p.id, b)
			}
			inFree[b] = true
		}
		cached := 0
		host := i >= len(c.dev)
		for b := range p.refs {
			if p.refs[b] != refs[i][b] {
				bad("pool %d: block %d: refcount %d, recomputed %d", p.id, b, p.refs[b], refs[i][b])
			}
			held := p.held(b)
			if host && holds != nil && held != holds[i-len(c.dev)][b] {
				bad("pool %d: block %d: held by %d pending moves, recomputed %d", p.id, b, held, holds[i-len(c.dev)][b])
			}
			free := p.refs[b] == 0 && p.owner[b] == nil && held == 0
			if free != inFree[b] {
				bad("pool %d: block %d: unreferenced, unowned and unheld %v, on the free stack %v", p.id, b, free, inFree[b])
			}
			if p.refs[b] == 0 && (p.owner[b] != nil || held > 0) {
				cached++
			}
			o := p.owner[b]
			switch {
			case o == nil:
			case !host && o.pages[i] != kvcache.BlockID(b),
				host && (o.hpages() == nil || o.hpages()[i-len(c.dev)] != kvcache.BlockID(b)):
				bad("pool %d: block %d owned by a node that does not hold it", p.id, b)
			}
			if host && p.refs[b] > 0 && (o != nil || held > 0) {
				bad("pool %d: block %d is both a suspended sequence's and a cached node's (or a pending move's)", p.id, b)
			}
		}
		st := p.Stats()
		if cached != p.cached || st.Free+st.Cached+st.InUse != st.Total || st.InUse < 0 {
			bad("pool %d: free %d + cached %d (recomputed %d) + in use %d != total %d", p.id, st.Free, st.Cached, cached, st.InUse, st.Total)
		}
	}

	// Walk the tree.
	v = append(v, c.tree.Check()...)
	c.checkHostTree(bad)
	v = append(v, c.tree.checkRetention()...)
	return v
}
