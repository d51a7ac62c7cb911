package cachemgrv2

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"unsafe"

	"github.com/zeebo/xxh3"

	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
)

// Core is the sequence life cycle of one pipeline stage, the part that
// cachemgr_v2's Manager and the mamba manager share: per sequence a Ledger
// and one block table per pool group; Reserve, Unreserve, Commit and Release
// with the undo record; registration of committed prompt blocks in the Tree
// (with pins and deferred pruning) and reuse of them, partial reuse with a
// copy-on-write; the host tier (Suspend and Resume, and the cached blocks
// the device evicts, hostreuse.go); Stats, Inspect and the
// deep self-check of all of it. A manager embeds a Core, calls Init from its
// Configure, and adds its own life cycles through Hooks.
//
// Core implements every kvcache.Manager method but Info and Configure. The
// core calls it from one goroutine at a time (kvcache package doc); it does
// no locking.
type Core struct {
	name      string // in errors: "cachemgr_v2", "mamba"
	cfg       kvcache.Config
	tpb       int
	maxTokens int    // MaxSeqLen + MaxDraftTokens: the most capacity one sequence may ask for
	reuse     bool   // prefix reuse: prompts are kept, registered and looked up
	reuseOff  string // why reuse is off, for the denial of a Reuse
	hostTier  bool   // Suspend and Resume work

	groups []*PoolGroup
	dev    []*BlockPool // device pool per group
	host   []*BlockPool // host pool per group; nil without a host tier
	pools  []*BlockPool // dev then host: the core's pools in Layout order
	tree   *Tree
	hooks  Hooks // nil: attention blocks only

	seqs  map[kvcache.SeqID]*Seq
	spare []*Seq
	stats kvcache.Stats

	// partial turns on partial-block reuse (Lookup returns any length, Reserve
	// copies the partly matched block). Off: the v1 contract says Lookup
	// returns a multiple of TokensPerBlock. Init keeps it.
	partial bool

	// host tier for reuse (hostreuse.go): the sequence whose reservation
	// makes the current moves (nil outside Reserve: Resume's moves are not
	// pending), and the blocks moved so far
	cur                 *Seq
	offloaded, promoted int64
	moving              int // pending moves of all sequences
	srcPages            []kvcache.BlockID

	// per-call scratch, reused so that the step path does not allocate
	pages   []kvcache.BlockID
	pending []pendingDelta
	copies  []kvcache.Copy
	copyAt  []copyRange
	ids     []kvcache.SeqID // Inspect's (the snapshot does not keep it)
	// hint is the path the last walk matched, hint[i] the node of prompt
	// block i: the next walk or Reserve of the same prompt (an Explain, its
	// Reserve, a request explained at every step while it waits) confirms
	// each block against it (Tree.childVia) instead of hashing the block
	// again. Its nodes are only guesses: each is checked as Tree.child
	// would find it, so a stale one costs a hash and nothing else.
	hint []*Node
	// resuming: Resume is making room (evictOne offloads, settled at once).
	resuming bool
	// the deep self-check's recounts, per pool (check)
	checkRefs  [][]int32
	checkFree  []bool
	checkHolds [][]int32 // host pools' holds recounted from the pending moves
	ck         coreCheck // the incremental deep check (dirty.go)

	undo undoState // Unreserve's put-back of evicted nodes (undo.go)

	// layout is the layout's pools (CoreConfig.Layout) for Seal; seal the
	// scratch that Snapshot hands out for it (inspect.go).
	layout []kvcache.Pool
	seal   sealScratch
}

// NewCore returns an unconfigured core of the manager name (in errors);
// every call but Init fails until Init.
func NewCore(name string) Core { return Core{name: name} }

// CoreConfig is what Init lays out.
type CoreConfig struct {
	Name   string         // the manager's name, in errors
	Config kvcache.Config // Layers is not kept; slices are copied
	Groups []*PoolGroup   // paged pool groups (none on a stage of state layers only)
	// DevBlocks and HostBlocks are the blocks of each group's device and
	// host pool; HostBlocks nil means no host tier. Device pools take ids
	// 0..len(Groups)-1, host pools HostID, HostID+1, ...
	DevBlocks, HostBlocks []int
	HostID                int
	Reuse                 bool   // prefix reuse on (usually Config.EnableBlockReuse)
	ReuseOff              string // why not, when off: "enable_block_reuse is off"
	Hooks                 Hooks  // nil for none
	// Layout is the layout's pools, all of them (the Hooks' too), in Layout
	// order; Inspect checks a deep snapshot's tables against its reference
	// counts over them (Seal). Nil: the caller checks them.
	Layout []kvcache.Pool
}

// Init resets c to an empty stage laid out by cc: its pools (each group's
// Dev and Host set), an empty tree and no sequence. The partial-reuse switch
// is kept.
func (c *Core) Init(cc CoreConfig) {
	cfg := cc.Config
	cfg.Layers = nil // not needed after planning; the caller owns it
	cfg.PoolRatio = slices.Clone(cfg.PoolRatio)
	cfg.Snapshots.OffsetsFromEnd = slices.Clone(cfg.Snapshots.OffsetsFromEnd)
	*c = Core{
		name:      cc.Name,
		cfg:       cfg,
		tpb:       cfg.TokensPerBlock,
		maxTokens: cfg.MaxSeqLen + cfg.MaxDraftTokens,
		reuse:     cc.Reuse,
		reuseOff:  cc.ReuseOff,
		hostTier:  cc.HostBlocks != nil,
		groups:    cc.Groups,
		hooks:     cc.Hooks,
		seqs:      map[kvcache.SeqID]*Seq{},
		partial:   c.partial,
		pages:     make([]kvcache.BlockID, len(cc.Groups)),
		layout:    layoutPools(cc.Layout),
	}
	for g, pg := range cc.Groups {
		pg.Dev = NewBlockPool(g, kvcache.TierDevice, cc.DevBlocks[g])
		c.dev = append(c.dev, pg.Dev)
	}
	c.pools = append(c.pools, c.dev...)
	if cc.HostBlocks != nil && len(cc.Groups) > 0 {
		for g, pg := range cc.Groups {
			pg.Host = NewBlockPool(cc.HostID+g, kvcache.TierHost, cc.HostBlocks[g])
			c.host = append(c.host, pg.Host)
		}
		c.pools = append(c.pools, c.host...)
	}
	c.tree = NewTree(c.tpb, c.dev)
	if c.reuse && c.host != nil {
		c.tree.ht.pools = c.host
		for _, hp := range c.host {
			hp.holds = make([]int32, hp.Total())
		}
	}
	c.tree.ret.configure(cfg.EvictionPolicy, cc.DevBlocks)
	if cfg.KVEvents && c.reuse {
		c.tree.ev = &events{}
		c.tree.ev.Cleared()
	}
}

// layoutPools is pools without their layers (Seal needs names and sizes).
func layoutPools(pools []kvcache.Pool) []kvcache.Pool {
	if pools == nil {
		return nil
	}
	out := slices.Clone(pools)
	for i := range out {
		out[i].Layers = nil
	}
	return out
}

// SetPartialReuse turns partial-block reuse on or off (see the package doc,
// Reuse); it survives Init. Off by default: the v1 contract asks Lookup for
// multiples of TokensPerBlock.
func (c *Core) SetPartialReuse(on bool) { c.partial = on }

// Tree is the stage's radix tree; nil before Init. Callers only read it.
func (c *Core) Tree() *Tree { return c.tree }

// DevicePools and HostPools are the groups' pools (HostPools nil without a
// host tier), in group order; callers only read them.
func (c *Core) DevicePools() []*BlockPool { return c.dev }
func (c *Core) HostPools() []*BlockPool   { return c.host }

// HostTier reports whether Suspend and Resume work.
func (c *Core) HostTier() bool { return c.hostTier }

// Seq is one request's sequence on a stage, as the Core keeps it. Its
// accessors are for Hooks, which must not change what they return.
type Seq struct {
	id  kvcache.SeqID
	led Ledger
	// tables[g] is the block table in group g's device pool, one block per
	// tpb tokens of capacity; NoBlock where the block is on the host tier.
	tables [][]kvcache.BlockID
	// host[g] holds, while suspended, the host block of each table entry that
	// moved (NoBlock where the block stayed on device); empty otherwise.
	host      [][]kvcache.BlockID
	suspended bool

	// The prompt's full blocks, kept when block reuse is on (PromptBlock).
	// The first split blocks, those reused at Reserve, are the tokens of
	// their path nodes (path[i] was matched against prompt block i), so
	// they are not copied: headSum keeps only each one's checksum, taken
	// from the caller's prompt, for the deep check (S10, holdsPromptBlock).
	// The others are in tail, a copy of the caller's (kvcache: slices passed
	// in are not retained) made once per request and never written after.
	// The tree nodes that s's Commits create hold their blocks' tokens as
	// slices of tail (register, Tree.extend), so a block is stored once, not
	// copied into every node. A fork shares both.
	headSum     []blockSum
	tail        []int32
	split, nblk int     // reused blocks (in headSum); blocks in all
	plen        int     // the prompt's length, when its blocks are kept
	salt        string  // the cache salt its blocks are stored under, with them
	path        []*Node // pinned: path[i] holds prompt block i, and table block i is its page
	regStop     bool    // a hash collision (or a pending promotion) stopped registration
	cow         *Node   // pinned source of a copy-on-write, until the next Commit

	// chkPath[i] is path[i] as the last deep check found it holding prompt
	// block i (node and generation), so a check compares a path block's
	// tokens once, not at every check.
	chkPath []pathMark
	ck      seqCheck // the incremental deep check's shadow; recycle keeps it

	// What the worker knows: its table entries [0, sent) are right and it has
	// told entries (-1: unknown). The next grant replaces its tail from sent.
	sent, told int

	// Undo record of the outstanding reservation.
	created              bool
	undoBlocks, undoSent int
	undo                 undoRec // the cached nodes its allocation evicted (undo.go)
	// moves are the host tier moves the outstanding reservation made, pending
	// until it settles; moveBlk the host blocks they hold (hostreuse.go).
	moves   []hostMove
	moveBlk []kvcache.BlockID

	// Ext is the Hooks' own state of the sequence; the core never reads it
	// and drops it when the sequence ends.
	Ext any

	// Retention (explain.go), after the fields of every step: the priority
	// of the blocks s stores and reuses, until when (0: for ever), and how
	// many reused path nodes have yet to count the reuse (at the first
	// Commit); posh caches the position hashes of s's prompt blocks,
	// computed by Explain only (inFlight).
	prio      int8
	reusePend int32
	until     int64
	posh      []uint64
}

// ID is the sequence's id.
func (s *Seq) ID() kvcache.SeqID { return s.id }

// Ledger is a copy of the sequence's ledger.
func (s *Seq) Ledger() Ledger { return s.led }

// New reports whether the outstanding (or last) reservation created s.
func (s *Seq) New() bool { return s.created }

// Suspended reports whether s is on the host tier.
func (s *Seq) Suspended() bool { return s.suspended }

// PromptBlocks is the number of the prompt's full blocks that s keeps (0
// when block reuse is off or the prompt is shorter than a block) and
// PromptLen the prompt's length (0 then).
func (s *Seq) PromptBlocks() int { return s.nblk }
func (s *Seq) PromptLen() int    { return s.plen }

// PromptBlock is the tokens of prompt block i, 0 <= i < PromptBlocks; the
// slice belongs to s (a reused block's to its path node), must not be
// modified, and its capacity ends with the block.
func (s *Seq) PromptBlock(i, tpb int) []int32 {
	if i < s.split {
		return s.path[i].tokens
	}
	j := i - s.split
	return s.tail[j*tpb : (j+1)*tpb : (j+1)*tpb]
}

// keepPrompt keeps p's full blocks: the first split of them, which s's
// path holds (reused), as checksums (Seq.headSum), the others as a copy.
func (s *Seq) keepPrompt(p []int32, split, tpb int) {
	s.nblk = len(p) / tpb
	s.split = min(split, s.nblk)
	s.headSum = make([]blockSum, s.split)
	for i := range s.headSum {
		s.headSum[i] = sumTokens(p[i*tpb : (i+1)*tpb])
	}
	s.tail = cloneTokens(p[s.split*tpb : s.nblk*tpb])
}

// blockSum is a 128-bit checksum of a block's tokens: what a sequence keeps
// of a prompt block its path holds, for the deep check to compare the
// node's tokens with (two different blocks share one with probability
// 2^-128).
type blockSum = xxh3.Uint128

// sumTokens is the checksum of a block's tokens.
func sumTokens(tokens []int32) blockSum {
	if len(tokens) == 0 {
		return xxh3.Hash128(nil)
	}
	return xxh3.Hash128(unsafe.Slice((*byte)(unsafe.Pointer(&tokens[0])), 4*len(tokens)))
}

// cloneTokens is a copy of p in an array of its own, capped at len(p) (nil
// when p is empty: slices.Clone's empty result would point into p's). It
// appends to nil, as slices.Clone does, so that the runtime does not clear
// the array before the copy overwrites it (make does: a prompt of a million
// tokens is megabytes).
func cloneTokens(p []int32) []int32 {
	if len(p) == 0 {
		return nil
	}
	c := append([]int32(nil), p...)
	return c[:len(p):len(p)]
}

// Salt is the cache salt s's prompt blocks are stored under ("" for none).
func (s *Seq) Salt() string { return s.salt }

// Path is s's pinned tree path: Path()[i] holds prompt block i. The slice
// belongs to s and changes at Commit.
func (s *Seq) Path() []*Node { return s.path }

// pendingDelta is a grant whose table deltas are built at the end of Reserve.
type pendingDelta struct {
	grant int
	seq   *Seq
}

// copyRange is a grant's share of the batch's copies.
type copyRange struct{ grant, lo, hi int }

func (c *Core) ready(ctx context.Context, op string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if c.tree == nil {
		return kvcache.Errorf(kvcache.KindInvalidArg, "%s: %s before Configure", c.name, op)
	}
	return nil
}

// held is the number of blocks s holds in every pool group.
func (c *Core) held(s *Seq) int {
	if len(s.tables) == 0 {
		return 0
	}
	return len(s.tables[0])
}

// blocks is the number of blocks per group that back n token slots (0 on a
// stage without pool groups).
func (c *Core) blocks(n int) int {
	if len(c.dev) == 0 {
		return 0
	}
	return kvcache.BlocksFor(n, c.tpb)
}

// Lookup implements kvcache.Manager: per item, the number of leading prompt
// tokens a new sequence could take from the cache now, at most
// len(Prompt)-1: held by full cached blocks (a multiple of TokensPerBlock
// unless partial reuse is on) and Reusable by the Hooks. It changes nothing
// (only the LookupTokens counter, and the manager clock moves to the latest
// Now). Explain (explain.go) answers the same with its reasons.
func (c *Core) Lookup(ctx context.Context, items []kvcache.LookupItem) ([]int, error) {
	if err := c.ready(ctx, "Lookup"); err != nil {
		return nil, err
	}
	out := make([]int, len(items))
	for i := range items {
		p := items[i].Prompt
		c.tree.observe(items[i].Now)
		c.stats.LookupTokens += int64(len(p))
		if c.reuse && len(p) > 1 {
			out[i], _, _ = c.walk(items[i].CacheSalt, p)
		}
	}
	return out, nil
}

// walk is the one walk of Lookup and Explain (so they cannot disagree) over
// prompt p under salt (len(p) > 1): best is what Lookup returns, blocks the
// full blocks matched with all their pages, on either tier with a host tier
// for reuse (at most (len(p)-1)/tpb; best <
// blocks*tpb when the Hooks allow no reuse that far), end the node of the
// last of them (the root when none).
func (c *Core) walk(salt string, p []int32) (best, blocks int, end *Node) {
	limit, tpb := len(p)-1, c.tpb
	n, i := c.tree.root, 0
	hint := c.hint
	switch {
	case c.hooks == nil && !c.hostReuse(): // every cached prefix is reusable: the tight loop
		for ; i < limit/tpb; i++ {
			ch := c.tree.childVia(guess(hint, i), n, salt, p[i*tpb:(i+1)*tpb])
			if ch == nil || !ch.complete() {
				break
			}
			n, hint = ch, note(hint, i, ch)
		}
		best = i * tpb
	case !c.hostReuse():
		for ; i < limit/tpb; i++ {
			ch := c.tree.childVia(guess(hint, i), n, salt, p[i*tpb:(i+1)*tpb])
			if ch == nil || !ch.complete() {
				break
			}
			n, hint = ch, note(hint, i, ch)
			if c.hooks.Reusable(n, (i+1)*tpb) {
				best = (i + 1) * tpb
			}
		}
	default: // a host tier for reuse: settled nodes on either tier (pending ones are not visible)
		for ; i < limit/tpb; i++ {
			ch := c.tree.childVia(guess(hint, i), n, salt, p[i*tpb:(i+1)*tpb])
			if ch == nil || !ch.settled() {
				break
			}
			n, hint = ch, note(hint, i, ch)
			if c.reusable(n, (i+1)*tpb) {
				best = (i + 1) * tpb
			}
		}
	}
	clear(hint[i:])
	c.hint = hint[:i]
	if c.partial && best == i*tpb {
		if _, k := c.tree.matchPartial(n, salt, p[i*tpb:min((i+1)*tpb, limit)]); k > 0 && c.reusable(n, i*tpb+k) {
			best = i*tpb + k
		}
	}
	return best, i, n
}

// guess is hint[i], nil beyond it.
func guess(hint []*Node, i int) *Node {
	if i < len(hint) {
		return hint[i]
	}
	return nil
}

// note sets hint[i] (i <= len(hint)) to n.
func note(hint []*Node, i int, n *Node) []*Node {
	if i < len(hint) {
		if hint[i] != n {
			hint[i] = n
		}
		return hint
	}
	return append(hint, n)
}

func (c *Core) reusable(end *Node, tokens int) bool {
	return c.hooks == nil || c.hooks.Reusable(end, tokens)
}

// Reserve implements kvcache.Manager. For each item in order it computes
// need = max(history+Tokens+Draft, Hold) and grants ceil(need/tpb) blocks in
// every pool group, evicting cached unpinned blocks when the free lists are
// short (to the host tier, with a copy in the grant, when it has room), or
// denies with a Reason and leaves no trace. A new sequence's Reuse may cover
// blocks the host tier holds: they count in its need, come back with a
// host-to-device copy each, and Grant.HostReused says how many tokens they
// hold (package doc, Tiers). Invalid items are denied with a Reason starting
// "invalid: " (a Priority outside 1..100 among them). The manager clock
// moves to each item's Now (when later) and the priorities it has passed
// fall back to the default before the item is served (package doc,
// Retention), so its evictions see them. A suspended sequence is denied
// until resumed. A grant's Tables replace the worker's table tail from the
// first entry it does not know (after a Resume, from the first moved block;
// after a Commit that adopted cached blocks, from the first adopted one).
func (c *Core) Reserve(ctx context.Context, items []kvcache.ReserveItem) ([]kvcache.Grant, error) {
	if err := c.ready(ctx, "Reserve"); err != nil {
		return nil, err
	}
	c.tree.Prune() // safe point: no walk in progress
	c.tree.ht.call++
	c.tree.expire()
	grants := make([]kvcache.Grant, len(items))
	c.pending = c.pending[:0]
	c.copies = c.copies[:0]
	c.copyAt = c.copyAt[:0]
	for i := range items {
		it := &items[i]
		if it.Now > c.tree.ret.now {
			c.tree.observe(it.Now)
			c.tree.expire()
		}
		grants[i].Seq = it.Seq
		lo := len(c.copies)
		reason := c.reserve(it, i, &grants[i])
		c.cur = nil
		if reason != "" {
			grants[i].Reason = reason
			c.stats.ReserveDenials++
			continue
		}
		grants[i].OK = true
		if len(c.copies) > lo {
			c.copyAt = append(c.copyAt, copyRange{i, lo, len(c.copies)})
		}
	}
	c.flushDeltas(grants)
	return grants, nil
}

func (c *Core) reserve(it *kvcache.ReserveItem, gi int, g *kvcache.Grant) string {
	switch {
	case it.Tokens < 0 || it.Draft < 0 || it.Hold < 0 || it.Reuse < 0:
		return fmt.Sprintf("invalid: seq %d: tokens %d, draft %d, hold %d, reuse %d must be >= 0", it.Seq, it.Tokens, it.Draft, it.Hold, it.Reuse)
	case it.Draft > c.cfg.MaxDraftTokens:
		return fmt.Sprintf("invalid: seq %d: draft %d > max_draft_tokens %d", it.Seq, it.Draft, c.cfg.MaxDraftTokens)
	case it.Hold > c.maxTokens:
		return fmt.Sprintf("invalid: seq %d: hold %d > max_seq_len %d + max_draft_tokens %d", it.Seq, it.Hold, c.cfg.MaxSeqLen, c.cfg.MaxDraftTokens)
	}
	if it.Priority != 0 || it.PriorityDuration != 0 {
		if r := checkPriority(it); r != "" {
			return r
		}
	}
	s := c.seqs[it.Seq]
	if it.New {
		if s != nil {
			return fmt.Sprintf("invalid: seq %d: New set but the sequence exists", it.Seq)
		}
		return c.reserveNew(it, gi, g)
	}
	switch {
	case s == nil:
		return fmt.Sprintf("invalid: seq %d: unknown sequence (New not set)", it.Seq)
	case it.Reuse > 0:
		return fmt.Sprintf("invalid: seq %d: reuse %d on an existing sequence", it.Seq, it.Reuse)
	case s.led.Reserved:
		return fmt.Sprintf("invalid: seq %d: reservation of tokens %d + draft %d outstanding: Commit or Unreserve it first",
			it.Seq, s.led.Tokens, s.led.Draft)
	case s.suspended:
		return fmt.Sprintf("suspended: seq %d is on the host tier: Resume it first", it.Seq)
	}
	need := s.led.Need(it.Tokens, it.Draft, it.Hold)
	if need > c.maxTokens {
		return fmt.Sprintf("invalid: seq %d: needs %d tokens (history %d + tokens %d + draft %d, hold %d) > max_seq_len %d + max_draft_tokens %d",
			it.Seq, need, s.led.History, it.Tokens, it.Draft, max(s.led.Hold, it.Hold), c.cfg.MaxSeqLen, c.cfg.MaxDraftTokens)
	}
	have := c.held(s)
	nb := c.blocks(need) - have
	if r := c.roomFor(nb); r != "" {
		return fmt.Sprintf("no capacity: seq %d needs %d tokens (capacity %d): %s", it.Seq, need, s.led.Capacity, r)
	}
	c.touch(s)
	s.created = false
	s.undoBlocks, s.undoSent = have, s.sent
	c.cur = s
	s.undo.reset()
	c.grow(s, nb)
	s.led.Reserve(it.Tokens, it.Draft, it.Hold)
	if c.hooks != nil {
		c.hooks.Reserved(s, it, g)
	}
	c.pend(gi, s)
	return ""
}

func (c *Core) reserveNew(it *kvcache.ReserveItem, gi int, g *kvcache.Grant) string {
	reuse, tpb := it.Reuse, c.tpb
	if reuse > 0 {
		switch {
		case !c.reuse:
			return fmt.Sprintf("invalid: seq %d: reuse %d but prefix reuse is off (%s)", it.Seq, reuse, c.reuseOff)
		case reuse > len(it.Prompt)-1:
			return fmt.Sprintf("invalid: seq %d: reuse %d > len(prompt)-1 = %d", it.Seq, reuse, len(it.Prompt)-1)
		case reuse%tpb != 0 && !c.partial:
			return fmt.Sprintf("invalid: seq %d: reuse %d is not a multiple of tokens_per_block %d", it.Seq, reuse, tpb)
		}
	}
	need := max(reuse+it.Tokens+it.Draft, it.Hold)
	if need > c.maxTokens {
		return fmt.Sprintf("invalid: seq %d: needs %d tokens (reuse %d + tokens %d + draft %d, hold %d) > max_seq_len %d + max_draft_tokens %d",
			it.Seq, need, reuse, it.Tokens, it.Draft, it.Hold, c.cfg.MaxSeqLen, c.cfg.MaxDraftTokens)
	}
	if c.hooks != nil {
		if r := c.hooks.Admit(it); r != "" {
			return r
		}
	}
	s := c.newSeq(it.Seq)
	if c.reuse {
		// The path grows to the prompt's full blocks (reused here, then
		// registered at each Commit): one allocation, not a doubling at each.
		s.path = slices.Grow(s.path, len(it.Prompt)/tpb)
	}
	full, rem := reuse/tpb, reuse%tpb
	if reuse > 0 {
		if c.hostReuse() {
			s.path = c.matchReserve(it.CacheSalt, it.Prompt, full, s.path)
		} else {
			s.path = c.tree.matchVia(c.hint, it.CacheSalt, it.Prompt, full, s.path)
		}
		got := len(s.path) * tpb
		end := c.tree.root
		if len(s.path) > 0 {
			end = s.path[len(s.path)-1]
		}
		if len(s.path) == full && rem > 0 {
			src, k := c.tree.matchPartial(end, it.CacheSalt, it.Prompt[full*tpb:min((full+1)*tpb, len(it.Prompt)-1)])
			if k >= rem {
				s.cow = src
			}
			got += min(k, rem)
		}
		if got < reuse {
			c.recycle(s)
			return fmt.Sprintf("reuse %d tokens no longer cached (%d now): seq %d: Lookup again", reuse, got, it.Seq)
		}
		if !c.reusable(end, reuse) {
			c.recycle(s)
			return fmt.Sprintf("reuse %d tokens cached but no longer reusable (%s state): seq %d: Lookup again", reuse, c.name, it.Seq)
		}
		for _, n := range s.path {
			c.tree.Pin(n)
		}
		if s.cow != nil {
			c.tree.Pin(s.cow)
		}
	}
	nb := c.blocks(need) - full
	promo := c.toPromote(s.path) // host blocks to bring back: fresh device blocks each
	if r := c.roomFor(nb + promo); r != "" {
		c.unpinAll(s, false)
		c.recycle(s)
		if promo > 0 {
			r += fmt.Sprintf(" (%d of them to bring %d reused blocks back from the host tier)", promo, promo)
		}
		return fmt.Sprintf("no capacity: new seq %d needs %d tokens (reuse %d): %s", it.Seq, need, reuse, r)
	}
	c.cur = s
	s.undo.reset()
	if c.hostReuse() && len(s.path) > 0 {
		g.HostReused = c.promote(s, nb+promo) * tpb
	}
	for g, pool := range c.dev {
		for _, n := range s.path {
			b := n.pages[g]
			pool.Ref(b)
			s.tables[g] = append(s.tables[g], b)
		}
	}
	c.grow(s, nb)
	if s.cow != nil {
		for g, pool := range c.dev {
			c.copies = append(c.copies, kvcache.Copy{
				SrcPool: pool.id, SrcBlock: s.cow.pages[g], DstPool: pool.id, DstBlock: s.tables[g][full],
			})
		}
	}
	if c.reuse && len(it.Prompt) >= tpb {
		s.keepPrompt(it.Prompt, full, tpb)
		s.plen = len(it.Prompt)
		s.salt = it.CacheSalt
	}
	s.led = Ledger{History: reuse, Capacity: reuse}
	s.led.Reserve(it.Tokens, it.Draft, it.Hold)
	s.created = true
	s.prio, s.until = seqRetention(it)
	s.reusePend = int32(len(s.path))
	c.seqs[s.id] = s
	c.touch(s)
	c.stats.ReusedTokens += int64(reuse)
	if c.hooks != nil {
		c.hooks.Reserved(s, it, g)
	}
	c.pend(gi, s)
	return ""
}

// roomFor says why nb more blocks per group cannot be had; "" when they can
// (free blocks plus evictable cached nodes, each of which frees one block in
// every group, whether its content goes to the host tier or vanishes).
func (c *Core) roomFor(nb int) string {
	ev := c.tree.Evictable()
	for g, pool := range c.dev {
		if pool.Free()+ev < nb {
			return fmt.Sprintf("%d more blocks in pool %s, %d free + %d evictable", nb, c.groups[g].Name, pool.Free(), ev)
		}
	}
	return ""
}

// makeRoom evicts cached nodes until every device pool has nb free blocks,
// telling the Hooks of each; roomFor(nb) must have said yes.
func (c *Core) makeRoom(nb int) {
	for g := 0; g < len(c.dev); {
		if c.dev[g].Free() >= nb {
			g++
			continue
		}
		n, kept := c.evictOne()
		if n == nil {
			panic(fmt.Sprintf("%s: pool %s short of %d blocks with nothing evictable", c.name, c.groups[g].Name, nb))
		}
		c.stats.Evictions += int64(len(c.dev))
		if c.hooks != nil && !kept {
			c.hooks.Evicted(n)
		}
		g = 0
	}
}

// grow appends nb fresh private blocks to every table of s, recording its
// evictions in s.undo (which the caller reset, before a promotion that
// records its own: promote) and, after the last Take of the reservation,
// the allocation generation of every recorded page.
func (c *Core) grow(s *Seq, nb int) {
	if nb > 0 {
		c.tree.undo.rec = &s.undo
		c.makeRoom(nb)
		c.tree.undo.rec = nil
		for g, pool := range c.dev {
			s.tables[g] = pool.Take(s.tables[g], nb)
		}
	}
	s.undo.taken(c.dev, c.host)
}

func (c *Core) pend(gi int, s *Seq) {
	if n := c.held(s); c.hooks != nil || s.sent < n || s.told != n {
		c.pending = append(c.pending, pendingDelta{grant: gi, seq: s})
	}
}

// flushDeltas builds the pending grants' table deltas and copies in fresh
// arrays, which the caller then owns; the Hooks append theirs.
func (c *Core) flushDeltas(grants []kvcache.Grant) {
	if len(c.copies) > 0 {
		own := slices.Clone(c.copies)
		for _, r := range c.copyAt {
			g := &grants[r.grant]
			g.Copies = append(g.Copies, own[r.lo:r.hi:r.hi]...)
		}
	}
	if len(c.pending) == 0 {
		return
	}
	ng := len(c.dev)
	nBlocks := 0
	for _, p := range c.pending {
		nBlocks += (c.held(p.seq) - p.seq.sent) * ng
	}
	deltas := make([]kvcache.TableDelta, len(c.pending)*ng)
	blocks := make([]kvcache.BlockID, 0, nBlocks)
	for i, p := range c.pending {
		s := p.seq
		d := deltas[i*ng : (i+1)*ng : (i+1)*ng]
		for g, pool := range c.dev {
			start := len(blocks)
			blocks = append(blocks, s.tables[g][s.sent:]...)
			d[g] = kvcache.TableDelta{Pool: pool.id, From: s.sent, Blocks: blocks[start:len(blocks):len(blocks)]}
		}
		if ng > 0 {
			grants[p.grant].Tables = d
		}
		if c.hooks != nil {
			grants[p.grant].Tables = c.hooks.Tables(s, grants[p.grant].Tables)
		}
		s.sent, s.told = c.held(s), c.held(s)
	}
}

// Unreserve implements kvcache.Manager: each sequence's outstanding
// reservation is undone exactly (a new sequence disappears, its pins are
// dropped without touching the LRU order). The cached nodes its allocation
// evicted to make room get their pages back, as cached content in their old
// eviction order, when nothing can have overwritten them and the tree or the
// KV events have not moved on (undo.go); others stay evicted. A sequence
// without an outstanding reservation is an item error.
func (c *Core) Unreserve(ctx context.Context, seqs []kvcache.SeqID) error {
	if err := c.ready(ctx, "Unreserve"); err != nil {
		return err
	}
	var bad itemErrors
	for _, id := range seqs {
		s := c.seqs[id]
		switch {
		case s == nil:
			bad.add(id, "seq %d: unknown sequence", id)
			continue
		case !s.led.Reserved:
			bad.add(id, "seq %d: no outstanding reservation", id)
			continue
		}
		c.undo.collect(&s.undo)
		if s.created {
			c.drop(s, false)
			continue
		}
		c.touch(s)
		for g, pool := range c.dev {
			for _, b := range s.tables[g][s.undoBlocks:] {
				pool.Unref(b)
			}
			s.tables[g] = s.tables[g][:s.undoBlocks]
		}
		c.settle(s, false)
		if c.hooks != nil {
			c.hooks.Unreserved(s)
		}
		// The worker may or may not have applied the undone grant: the next
		// grant replaces its table from what is still known to be right.
		s.sent, s.told = min(s.undoSent, s.undoBlocks), -1
		s.led.Unreserve()
	}
	c.putBack()
	return bad.err(c.name, "Unreserve")
}

// Commit implements kvcache.Manager. Per item it checks Tokens <= Accepted <=
// Tokens+Draft against the recorded reservation, advances history, shrinks
// capacity to max(history, Hold) and frees the tail blocks (the rejected
// drafts), then registers the prompt blocks that history passed in the tree
// (see register). It never allocates a block and never evicts; invalid items
// are skipped and reported as one item-scoped error after the valid ones are
// applied. The tree is pruned at the end (a safe point).
func (c *Core) Commit(ctx context.Context, items []kvcache.CommitItem) (kvcache.CommitResult, error) {
	if err := c.ready(ctx, "Commit"); err != nil {
		return kvcache.CommitResult{}, err
	}
	var bad itemErrors
	for i := range items {
		it := &items[i]
		s := c.seqs[it.Seq]
		if s == nil {
			bad.add(it.Seq, "seq %d: unknown sequence", it.Seq)
			continue
		}
		if r := s.led.CheckCommit(it.Accepted); r != "" {
			bad.add(it.Seq, "seq %d: %s", it.Seq, r)
			continue
		}
		c.settle(s, true) // the forward ran the grant's copies
		c.touch(s)
		nb := c.blocks(s.led.Commit(it.Accepted))
		if nb < c.held(s) {
			for g, pool := range c.dev {
				for _, b := range s.tables[g][nb:] {
					pool.Unref(b)
				}
				s.tables[g] = s.tables[g][:nb]
			}
			s.sent = min(s.sent, nb)
		}
		if s.cow != nil {
			c.tree.Unpin(s.cow, true)
			s.cow = nil
		}
		if s.created && s.reusePend > 0 { // created first: the hot fields
			c.reused(s)
		}
		if len(s.path) < s.nblk && !s.regStop {
			c.register(s)
		}
		if c.hooks != nil {
			c.hooks.Committed(s)
		}
	}
	c.tree.Prune()
	return kvcache.CommitResult{}, bad.err(c.name, "Commit")
}

// register extends s's tree path with the prompt blocks that history passed.
// A block the tree does not hold yet is adopted from s's table (its page is
// now the node's, shared). A block the tree already holds with another copy's
// pages (another sequence computed the same prefix beside s) does not stop
// registration: the cache keeps one copy per content and s goes on with its
// later blocks under that node. When a live sequence references the node's
// pages, s's table takes them and s's own copy is freed; when none does (the
// node is only cached), the node takes s's copy and its old pages are freed,
// so that Commit references no block that was unreferenced. Either way s
// holds no more blocks than before (one max_seq_len request still fits
// alone), and its path block i is its table block i. The two copies hold the
// same KV: a node is keyed by its block's tokens under its parent, so it
// stands for the whole prefix, and a kernel's output at a position depends
// only on the tokens up to it. When s's table changes, the worker learns it
// from s's next grant (sent moves back): it reads s's table only in a
// forward of s, which needs that grant.
func (c *Core) register(s *Seq) {
	limit := min(s.led.History/c.tpb, s.nblk)
	for i := len(s.path); i < limit; i++ {
		parent := c.tree.root
		if i > 0 {
			parent = s.path[i-1]
		}
		for g := range c.pages {
			c.pages[g] = s.tables[g][i]
		}
		n, adopted := c.tree.extend(parent, s.salt, s.PromptBlock(i, c.tpb), c.pages)
		switch {
		case n == nil:
			s.regStop = true
			return
		case !adopted && n.h.pend > 0:
			// A promotion another reservation has not settled: its pages
			// may never be filled, so s keeps its copy and registers no
			// further.
			c.tree.Unpin(n, false)
			s.regStop = true
			return
		case adopted:
		case c.dev[0].Refs(n.pages[0]) == 0:
			c.tree.repage(n, c.pages)
		default:
			for g, pool := range c.dev {
				pool.Ref(n.pages[g])
				pool.Unref(s.tables[g][i])
				s.tables[g][i] = n.pages[g]
			}
			s.sent = min(s.sent, i)
		}
		c.tree.retain(n, s.prio, s.until, adopted)
		s.path = append(s.path, n)
	}
}

// Release implements kvcache.Manager: it frees each sequence's private
// blocks (device and host), drops its references to shared pages, which stay
// cached for reuse, and unpins its tree path. An outstanding reservation is
// released too. Unknown sequences are item errors.
func (c *Core) Release(ctx context.Context, seqs []kvcache.SeqID) error {
	if err := c.ready(ctx, "Release"); err != nil {
		return err
	}
	var bad itemErrors
	for _, id := range seqs {
		s := c.seqs[id]
		if s == nil {
			bad.add(id, "seq %d: unknown sequence", id)
			continue
		}
		c.drop(s, true)
	}
	return bad.err(c.name, "Release")
}

// drop frees everything s holds and forgets it. touch says whether its pins
// count as a use for LRU (false when undoing a reservation).
func (c *Core) drop(s *Seq, touch bool) {
	c.touch(s)
	if touch && s.reusePend > 0 {
		c.reused(s)
	}
	if c.hooks != nil {
		c.hooks.Dropped(s, touch)
	}
	for g, pool := range c.dev {
		for _, b := range s.tables[g] {
			if b != NoBlock {
				pool.Unref(b)
			}
		}
		if s.suspended {
			for _, b := range s.host[g] {
				if b != NoBlock {
					c.host[g].Unref(b)
				}
			}
		}
	}
	c.unpinAll(s, touch)
	c.settle(s, touch) // released: the copies were handed over; unreserved: they never ran
	delete(c.seqs, s.id)
	c.recycle(s)
}

// unpinAll drops s's pins, deepest first.
func (c *Core) unpinAll(s *Seq, touch bool) {
	if s.cow != nil {
		c.tree.Unpin(s.cow, touch)
		s.cow = nil
	}
	for i := len(s.path) - 1; i >= 0; i-- {
		c.tree.Unpin(s.path[i], touch)
	}
	clear(s.path)
	s.path = s.path[:0]
}

func (c *Core) newSeq(id kvcache.SeqID) *Seq {
	var s *Seq
	if k := len(c.spare); k > 0 {
		s = c.spare[k-1]
		c.spare = c.spare[:k-1]
	} else {
		s = &Seq{tables: make([][]kvcache.BlockID, len(c.dev)), host: make([][]kvcache.BlockID, len(c.dev))}
	}
	s.id = id
	return s
}

// recycle resets s (keeping its slices' capacity) for a later newSeq.
func (c *Core) recycle(s *Seq) {
	for g := range s.tables {
		s.tables[g] = s.tables[g][:0]
		s.host[g] = s.host[g][:0]
	}
	// Only the entries in use hold anything: beyond their length these
	// slices are cleared where they shrink (unpinAll, settle), and recount
	// clears the chkPath entries it exposes. Clearing whole capacities (a
	// max_seq_len path is thousands of entries) at every release cost more
	// than the rest of it under the GC's write barrier.
	clear(s.path)
	clear(s.chkPath)
	clear(s.moves)
	*s = Seq{tables: s.tables, host: s.host, path: s.path[:0], chkPath: s.chkPath[:0], ck: s.ck, undo: s.undo.emptied(), posh: s.posh[:0],
		moves: s.moves[:0], moveBlk: s.moveBlk[:0]}
	s.ck.reset = true
	c.touch(s)
	c.spare = append(c.spare, s)
}

// Stats implements kvcache.Manager: the core's counters and its pools.
func (c *Core) Stats(ctx context.Context) (kvcache.Stats, error) {
	if err := c.ready(ctx, "Stats"); err != nil {
		return kvcache.Stats{}, err
	}
	st := c.stats
	st.Pools = make([]kvcache.PoolStats, len(c.pools))
	for i, p := range c.pools {
		st.Pools[i] = p.Stats()
	}
	st.Sequences = len(c.seqs)
	for _, s := range c.seqs {
		if s.suspended {
			st.SuspendedSeqs++
		}
	}
	return st, nil
}

// EachSeq calls f for every sequence, in SeqID order. f must not change the
// core.
func (c *Core) EachSeq(f func(s *Seq)) {
	for _, id := range c.seqIDs() {
		f(c.seqs[id])
	}
}

// Seq returns the sequence id; nil when there is none.
func (c *Core) Seq(id kvcache.SeqID) *Seq { return c.seqs[id] }

// itemErrors collects per-item problems of one call into one item-scoped
// *kvcache.Error (kind KindInvalidArg) naming every bad sequence.
type itemErrors struct {
	seqs []kvcache.SeqID
	msgs []string
}

func (e *itemErrors) add(id kvcache.SeqID, format string, args ...any) {
	e.seqs = append(e.seqs, id)
	e.msgs = append(e.msgs, fmt.Sprintf(format, args...))
}

func (e *itemErrors) err(name, op string) error {
	if len(e.seqs) == 0 {
		return nil
	}
	return kvcache.ItemErrorf(e.seqs, "%s: %s: %s", name, op, strings.Join(e.msgs, "; "))
}
