package cachemgrv2

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
	"github.com/kvx-dev/kvx/plugins/v1/spec"
)

// Version is the manager's version, reported by Info.
const Version = "0.1.0"

var _ kvcache.Manager = (*Manager)(nil)

// Manager is a TensorRT-LLM "KV cache manager V2" style cache manager for one
// pipeline stage: pool groups by life cycle, a device and a host tier with
// suspend/resume, a radix tree of committed prompt blocks with pins and
// deferred pruning, and a per-sequence Ledger. See the package doc.
//
// The core calls it from one goroutine at a time (kvcache package doc); it
// does no locking.
type Manager struct {
	cfg       kvcache.Config
	tpb       int
	maxTokens int // MaxSeqLen + MaxDraftTokens: the most capacity one sequence may ask for

	groups []*PoolGroup
	dev    []*BlockPool // device pool per group (pool ids 0..G-1)
	host   []*BlockPool // host pool per group (pool ids G..2G-1); nil without a host tier
	pools  []*BlockPool // all pools in Layout order
	tree   *Tree

	seqs  map[kvcache.SeqID]*sequence
	spare []*sequence
	stats kvcache.Stats

	// partial turns on partial-block reuse (Lookup returns any length, Reserve
	// copies the partly matched block). Off: the v1 contract says Lookup
	// returns a multiple of TokensPerBlock.
	partial bool

	// per-call scratch, reused so that the step path does not allocate
	pages   []kvcache.BlockID
	pending []pendingDelta
	copies  []kvcache.Copy
	copyAt  []copyRange
	// the deep self-check's recounts, per pool (check)
	checkRefs [][]int32
	checkFree []bool
}

// sequence is one request's state on this stage.
type sequence struct {
	id  kvcache.SeqID
	led Ledger
	// tables[g] is the block table in group g's device pool, one block per
	// tpb tokens of capacity; NoBlock where the block is on the host tier.
	tables [][]kvcache.BlockID
	// host[g] holds, while suspended, the host block of each table entry that
	// moved (NoBlock where the block stayed on device); empty otherwise.
	host      [][]kvcache.BlockID
	suspended bool

	prompt  []int32 // the prompt's full blocks, kept when block reuse is on
	path    []*Node // pinned: path[i] holds prompt block i (table block i is its page, or private)
	regStop bool    // a hash collision stopped registration
	cow     *Node   // pinned source of a copy-on-write, until the next Commit

	// What the worker knows: its table entries [0, sent) are right and it has
	// told entries (-1: unknown). The next grant replaces its tail from sent.
	sent, told int

	// Undo record of the outstanding reservation.
	created              bool
	undoBlocks, undoSent int
}

// pendingDelta is a grant whose table deltas are built at the end of Reserve.
type pendingDelta struct {
	grant int
	seq   *sequence
}

// copyRange is a grant's share of the batch's copies.
type copyRange struct{ grant, lo, hi int }

// New returns an unconfigured manager.
func New() *Manager { return &Manager{} }

// Info implements kvcache.Manager.
func (m *Manager) Info(ctx context.Context) (kvcache.Info, error) {
	if err := ctx.Err(); err != nil {
		return kvcache.Info{}, err
	}
	return kvcache.Info{
		Name:      "cachemgr_v2",
		Version:   Version,
		Protocols: []int{kvcache.ProtocolVersion},
		Capabilities: kvcache.Capabilities{
			Mixers:      []spec.Mixer{spec.MixerGQA, spec.MixerMLA, spec.MixerDSA},
			PrefixReuse: true,
			HostTier:    true,
		},
	}, nil
}

// Configure implements kvcache.Manager. It groups the stage's paged buffers
// into pool groups by attention window, splits DeviceBytes between them from
// a typical step (AvgSeqLen, else MaxSeqLen; PoolRatio overrides: hints that
// change speed only) with at least one MaxSeqLen+MaxDraftTokens request and
// one MaxNumTokens chunk per group, and splits HostBytes in the same
// proportions. Models with state buffers are refused (ErrInvalidConfig).
// Configure resets all state.
func (m *Manager) Configure(ctx context.Context, cfg kvcache.Config) (kvcache.Layout, error) {
	if err := ctx.Err(); err != nil {
		return kvcache.Layout{}, err
	}
	groups, lay, devBlocks, hostBlocks, err := planLayout(&cfg)
	if err != nil {
		return kvcache.Layout{}, err
	}
	cfg.Layers = nil // not needed after planning; the caller owns it
	cfg.PoolRatio = slices.Clone(cfg.PoolRatio)
	cfg.Snapshots.OffsetsFromEnd = slices.Clone(cfg.Snapshots.OffsetsFromEnd)
	*m = Manager{
		cfg:       cfg,
		tpb:       cfg.TokensPerBlock,
		maxTokens: cfg.MaxSeqLen + cfg.MaxDraftTokens,
		groups:    groups,
		seqs:      map[kvcache.SeqID]*sequence{},
		partial:   m.partial,
		pages:     make([]kvcache.BlockID, len(groups)),
	}
	for g, pg := range groups {
		pg.Dev = NewBlockPool(g, kvcache.TierDevice, devBlocks[g])
		m.dev = append(m.dev, pg.Dev)
	}
	m.pools = append(m.pools, m.dev...)
	if hostBlocks != nil {
		for g, pg := range groups {
			pg.Host = NewBlockPool(len(groups)+g, kvcache.TierHost, hostBlocks[g])
			m.host = append(m.host, pg.Host)
		}
		m.pools = append(m.pools, m.host...)
	}
	m.tree = NewTree(m.tpb, m.dev)
	return cloneLayout(lay), nil
}

func cloneLayout(l kvcache.Layout) kvcache.Layout {
	l.Pools = slices.Clone(l.Pools)
	for i := range l.Pools {
		l.Pools[i].Layers = slices.Clone(l.Pools[i].Layers)
	}
	l.Warnings = slices.Clone(l.Warnings)
	return l
}

func (m *Manager) ready(ctx context.Context, op string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if m.tree == nil {
		return kvcache.Errorf(kvcache.KindInvalidArg, "cachemgr_v2: %s before Configure", op)
	}
	return nil
}

// Lookup implements kvcache.Manager: per item, the number of leading prompt
// tokens held by full cached blocks, at most len(Prompt)-1, a multiple of
// TokensPerBlock. It changes nothing (only the LookupTokens counter).
func (m *Manager) Lookup(ctx context.Context, items []kvcache.LookupItem) ([]int, error) {
	if err := m.ready(ctx, "Lookup"); err != nil {
		return nil, err
	}
	out := make([]int, len(items))
	for i := range items {
		p := items[i].Prompt
		m.stats.LookupTokens += int64(len(p))
		if m.cfg.EnableBlockReuse && len(p) > 1 {
			out[i] = m.lookup(p)
		}
	}
	return out, nil
}

func (m *Manager) lookup(p []int32) int {
	limit := len(p) - 1
	if !m.partial {
		return m.tree.MatchLen(p, limit/m.tpb) * m.tpb
	}
	path := m.tree.Match(p, limit/m.tpb, nil)
	n := len(path) * m.tpb
	parent := m.tree.root
	if len(path) > 0 {
		parent = path[len(path)-1]
	}
	_, k := m.tree.MatchPartial(parent, p[n:min(n+m.tpb, limit)])
	return n + k
}

// Reserve implements kvcache.Manager. For each item in order it computes
// need = max(history+Tokens+Draft, Hold) and grants ceil(need/tpb) blocks in
// every pool group, evicting cached unpinned blocks when the free lists are
// short, or denies with a Reason and leaves no trace. Invalid items are
// denied with a Reason starting "invalid: ". A suspended sequence is denied
// until resumed. A grant's Tables replace the worker's table tail from the
// first entry it does not know (after a Resume, from the first moved block).
func (m *Manager) Reserve(ctx context.Context, items []kvcache.ReserveItem) ([]kvcache.Grant, error) {
	if err := m.ready(ctx, "Reserve"); err != nil {
		return nil, err
	}
	m.tree.Prune() // safe point: no walk in progress
	grants := make([]kvcache.Grant, len(items))
	m.pending = m.pending[:0]
	m.copies = m.copies[:0]
	m.copyAt = m.copyAt[:0]
	for i := range items {
		it := &items[i]
		grants[i].Seq = it.Seq
		if reason := m.reserve(it, i); reason != "" {
			grants[i].Reason = reason
			m.stats.ReserveDenials++
			continue
		}
		grants[i].OK = true
	}
	m.flushDeltas(grants)
	return grants, nil
}

func (m *Manager) reserve(it *kvcache.ReserveItem, gi int) string {
	switch {
	case it.Tokens < 0 || it.Draft < 0 || it.Hold < 0 || it.Reuse < 0:
		return fmt.Sprintf("invalid: seq %d: tokens %d, draft %d, hold %d, reuse %d must be >= 0", it.Seq, it.Tokens, it.Draft, it.Hold, it.Reuse)
	case it.Draft > m.cfg.MaxDraftTokens:
		return fmt.Sprintf("invalid: seq %d: draft %d > max_draft_tokens %d", it.Seq, it.Draft, m.cfg.MaxDraftTokens)
	case it.Hold > m.maxTokens:
		return fmt.Sprintf("invalid: seq %d: hold %d > max_seq_len %d + max_draft_tokens %d", it.Seq, it.Hold, m.cfg.MaxSeqLen, m.cfg.MaxDraftTokens)
	}
	s := m.seqs[it.Seq]
	if it.New {
		if s != nil {
			return fmt.Sprintf("invalid: seq %d: New set but the sequence exists", it.Seq)
		}
		return m.reserveNew(it, gi)
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
	if need > m.maxTokens {
		return fmt.Sprintf("invalid: seq %d: needs %d tokens (history %d + tokens %d + draft %d, hold %d) > max_seq_len %d + max_draft_tokens %d",
			it.Seq, need, s.led.History, it.Tokens, it.Draft, max(s.led.Hold, it.Hold), m.cfg.MaxSeqLen, m.cfg.MaxDraftTokens)
	}
	have := len(s.tables[0])
	nb := blocksFor(need, m.tpb) - have
	if r := m.roomFor(nb); r != "" {
		return fmt.Sprintf("no capacity: seq %d needs %d tokens (capacity %d): %s", it.Seq, need, s.led.Capacity, r)
	}
	s.created = false
	s.undoBlocks, s.undoSent = have, s.sent
	m.grow(s, nb)
	s.led.Reserve(it.Tokens, it.Draft, it.Hold)
	m.pend(gi, s)
	return ""
}

func (m *Manager) reserveNew(it *kvcache.ReserveItem, gi int) string {
	reuse, tpb := it.Reuse, m.tpb
	if reuse > 0 {
		switch {
		case !m.cfg.EnableBlockReuse:
			return fmt.Sprintf("invalid: seq %d: reuse %d but enable_block_reuse is off", it.Seq, reuse)
		case reuse > len(it.Prompt)-1:
			return fmt.Sprintf("invalid: seq %d: reuse %d > len(prompt)-1 = %d", it.Seq, reuse, len(it.Prompt)-1)
		case reuse%tpb != 0 && !m.partial:
			return fmt.Sprintf("invalid: seq %d: reuse %d is not a multiple of tokens_per_block %d", it.Seq, reuse, tpb)
		}
	}
	need := max(reuse+it.Tokens+it.Draft, it.Hold)
	if need > m.maxTokens {
		return fmt.Sprintf("invalid: seq %d: needs %d tokens (reuse %d + tokens %d + draft %d, hold %d) > max_seq_len %d + max_draft_tokens %d",
			it.Seq, need, reuse, it.Tokens, it.Draft, it.Hold, m.cfg.MaxSeqLen, m.cfg.MaxDraftTokens)
	}
	s := m.newSeq(it.Seq)
	full, rem := reuse/tpb, reuse%tpb
	if reuse > 0 {
		s.path = m.tree.Match(it.Prompt, full, s.path)
		got := len(s.path) * tpb
		if len(s.path) == full && rem > 0 {
			parent := m.tree.root
			if full > 0 {
				parent = s.path[full-1]
			}
			src, k := m.tree.MatchPartial(parent, it.Prompt[full*tpb:min((full+1)*tpb, len(it.Prompt)-1)])
			if k >= rem {
				s.cow = src
			}
			got += min(k, rem)
		}
		if got < reuse {
			m.recycle(s)
			return fmt.Sprintf("reuse %d tokens no longer cached (%d now): seq %d: Lookup again", reuse, got, it.Seq)
		}
		for _, n := range s.path {
			m.tree.Pin(n)
		}
		if s.cow != nil {
			m.tree.Pin(s.cow)
		}
	}
	nb := blocksFor(need, tpb) - full
	if r := m.roomFor(nb); r != "" {
		m.unpinAll(s, false)
		m.recycle(s)
		return fmt.Sprintf("no capacity: new seq %d needs %d tokens (reuse %d): %s", it.Seq, need, reuse, r)
	}
	for g, pool := range m.dev {
		for _, n := range s.path {
			b := n.pages[g]
			pool.Ref(b)
			s.tables[g] = append(s.tables[g], b)
		}
	}
	m.grow(s, nb)
	if s.cow != nil {
		lo := len(m.copies)
		for g, pool := range m.dev {
			m.copies = append(m.copies, kvcache.Copy{
				SrcPool: pool.id, SrcBlock: s.cow.pages[g], DstPool: pool.id, DstBlock: s.tables[g][full],
			})
		}
		m.copyAt = append(m.copyAt, copyRange{gi, lo, len(m.copies)})
	}
	if m.cfg.EnableBlockReuse && len(it.Prompt) >= tpb {
		s.prompt = append(s.prompt, it.Prompt[:len(it.Prompt)/tpb*tpb]...)
	}
	s.led = Ledger{History: reuse, Capacity: reuse}
	s.led.Reserve(it.Tokens, it.Draft, it.Hold)
	s.created = true
	m.seqs[s.id] = s
	m.stats.ReusedTokens += int64(reuse)
	m.pend(gi, s)
	return ""
}

// roomFor says why nb more blocks per group cannot be had; "" when they can
// (free blocks plus evictable cached nodes, each of which frees one block in
// every group).
func (m *Manager) roomFor(nb int) string {
	ev := m.tree.Evictable()
	for g, pool := range m.dev {
		if pool.Free()+ev < nb {
			return fmt.Sprintf("%d more blocks in pool %s, %d free + %d evictable", nb, m.groups[g].Name, pool.Free(), ev)
		}
	}
	return ""
}

// makeRoom evicts cached nodes until every device pool has nb free blocks;
// roomFor(nb) must have said yes.
func (m *Manager) makeRoom(nb int) {
	for g := 0; g < len(m.dev); {
		if m.dev[g].Free() >= nb {
			g++
			continue
		}
		if !m.tree.EvictOne() {
			panic(fmt.Sprintf("cachemgr_v2: pool %s short of %d blocks with nothing evictable", m.groups[g].Name, nb))
		}
		m.stats.Evictions += int64(len(m.dev))
		g = 0
	}
}

// grow appends nb fresh private blocks to every table of s.
func (m *Manager) grow(s *sequence, nb int) {
	if nb <= 0 {
		return
	}
	m.makeRoom(nb)
	for g, pool := range m.dev {
		s.tables[g] = pool.Take(s.tables[g], nb)
	}
}

func (m *Manager) pend(gi int, s *sequence) {
	if s.sent < len(s.tables[0]) || s.told != len(s.tables[0]) {
		m.pending = append(m.pending, pendingDelta{grant: gi, seq: s})
	}
}

// flushDeltas builds the pending grants' table deltas and copies in two fresh
// arrays, which the caller then owns.
func (m *Manager) flushDeltas(grants []kvcache.Grant) {
	if len(m.copies) > 0 {
		own := slices.Clone(m.copies)
		for _, r := range m.copyAt {
			grants[r.grant].Copies = own[r.lo:r.hi:r.hi]
		}
	}
	if len(m.pending) == 0 {
		return
	}
	nBlocks := 0
	for _, p := range m.pending {
		nBlocks += (len(p.seq.tables[0]) - p.seq.sent) * len(m.dev)
	}
	deltas := make([]kvcache.TableDelta, len(m.pending)*len(m.dev))
	blocks := make([]kvcache.BlockID, 0, nBlocks)
	for i, p := range m.pending {
		s := p.seq
		d := deltas[i*len(m.dev) : (i+1)*len(m.dev) : (i+1)*len(m.dev)]
		for g, pool := range m.dev {
			start := len(blocks)
			blocks = append(blocks, s.tables[g][s.sent:]...)
			d[g] = kvcache.TableDelta{Pool: pool.id, From: s.sent, Blocks: blocks[start:len(blocks):len(blocks)]}
		}
		grants[p.grant].Tables = d
		s.sent, s.told = len(s.tables[0]), len(s.tables[0])
	}
}

// Unreserve implements kvcache.Manager: each sequence's outstanding
// reservation is undone exactly (a new sequence disappears, its pins are
// dropped without touching the LRU order). Cached blocks evicted to make room
// stay evicted. A sequence without an outstanding reservation is an item error.
func (m *Manager) Unreserve(ctx context.Context, seqs []kvcache.SeqID) error {
	if err := m.ready(ctx, "Unreserve"); err != nil {
		return err
	}
	var bad itemErrors
	for _, id := range seqs {
		s := m.seqs[id]
		switch {
		case s == nil:
			bad.add(id, "seq %d: unknown sequence", id)
			continue
		case !s.led.Reserved:
			bad.add(id, "seq %d: no outstanding reservation", id)
			continue
		}
		if s.created {
			m.drop(s, false)
			continue
		}
		for g, pool := range m.dev {
			for _, b := range s.tables[g][s.undoBlocks:] {
				pool.Unref(b)
			}
			s.tables[g] = s.tables[g][:s.undoBlocks]
		}
		// The worker may or may not have applied the undone grant: the next
		// grant replaces its table from what is still known to be right.
		s.sent, s.told = min(s.undoSent, s.undoBlocks), -1
		s.led.Unreserve()
	}
	return bad.err("Unreserve")
}

// Commit implements kvcache.Manager. Per item it checks Tokens <= Accepted <=
// Tokens+Draft against the recorded reservation, advances history, shrinks
// capacity to max(history, Hold) and frees the tail blocks (the rejected
// drafts), then registers the prompt blocks that history passed in the tree.
// It never allocates a block and never evicts; invalid items are skipped and
// reported as one item-scoped error after the valid ones are applied. The
// tree is pruned at the end (a safe point).
func (m *Manager) Commit(ctx context.Context, items []kvcache.CommitItem) (kvcache.CommitResult, error) {
	if err := m.ready(ctx, "Commit"); err != nil {
		return kvcache.CommitResult{}, err
	}
	var bad itemErrors
	for i := range items {
		it := &items[i]
		s := m.seqs[it.Seq]
		if s == nil {
			bad.add(it.Seq, "seq %d: unknown sequence", it.Seq)
			continue
		}
		if r := s.led.CheckCommit(it.Accepted); r != "" {
			bad.add(it.Seq, "seq %d: %s", it.Seq, r)
			continue
		}
		nb := blocksFor(s.led.Commit(it.Accepted), m.tpb)
		if nb < len(s.tables[0]) {
			for g, pool := range m.dev {
				for _, b := range s.tables[g][nb:] {
					pool.Unref(b)
				}
				s.tables[g] = s.tables[g][:nb]
			}
			s.sent = min(s.sent, nb)
		}
		if s.cow != nil {
			m.tree.Unpin(s.cow, true)
			s.cow = nil
		}
		if len(s.path) < len(s.prompt)/m.tpb && !s.regStop {
			m.register(s)
		}
	}
	m.tree.Prune()
	return kvcache.CommitResult{}, bad.err("Commit")
}

// register extends s's tree path with the prompt blocks that history passed.
func (m *Manager) register(s *sequence) {
	limit := min(s.led.History, len(s.prompt)) / m.tpb
	for i := len(s.path); i < limit && !s.regStop; i++ {
		parent := m.tree.root
		if i > 0 {
			parent = s.path[i-1]
		}
		for g := range m.pages {
			m.pages[g] = s.tables[g][i]
		}
		n := m.tree.Register(parent, s.prompt[i*m.tpb:(i+1)*m.tpb], m.pages)
		if n == nil {
			s.regStop = true
			return
		}
		s.path = append(s.path, n)
	}
}

// Release implements kvcache.Manager: it frees each sequence's private
// blocks (device and host), drops its references to shared pages, which stay
// cached for reuse, and unpins its tree path. An outstanding reservation is
// released too. Unknown sequences are item errors.
func (m *Manager) Release(ctx context.Context, seqs []kvcache.SeqID) error {
	if err := m.ready(ctx, "Release"); err != nil {
		return err
	}
	var bad itemErrors
	for _, id := range seqs {
		s := m.seqs[id]
		if s == nil {
			bad.add(id, "seq %d: unknown sequence", id)
			continue
		}
		m.drop(s, true)
	}
	return bad.err("Release")
}

// drop frees everything s holds and forgets it. touch says whether its pins
// count as a use for LRU (false when undoing a reservation).
func (m *Manager) drop(s *sequence, touch bool) {
	for g, pool := range m.dev {
		for _, b := range s.tables[g] {
			if b != NoBlock {
				pool.Unref(b)
			}
		}
		if s.suspended {
			for _, b := range s.host[g] {
				if b != NoBlock {
					m.host[g].Unref(b)
				}
			}
		}
	}
	m.unpinAll(s, touch)
	delete(m.seqs, s.id)
	m.recycle(s)
}

// unpinAll drops s's pins, deepest first.
func (m *Manager) unpinAll(s *sequence, touch bool) {
	if s.cow != nil {
		m.tree.Unpin(s.cow, touch)
		s.cow = nil
	}
	for i := len(s.path) - 1; i >= 0; i-- {
		m.tree.Unpin(s.path[i], touch)
	}
	s.path = s.path[:0]
}

func (m *Manager) newSeq(id kvcache.SeqID) *sequence {
	var s *sequence
	if k := len(m.spare); k > 0 {
		s = m.spare[k-1]
		m.spare = m.spare[:k-1]
	} else {
		s = &sequence{tables: make([][]kvcache.BlockID, len(m.dev)), host: make([][]kvcache.BlockID, len(m.dev))}
	}
	s.id = id
	return s
}

// recycle resets s (keeping its slices' capacity) for a later newSeq.
func (m *Manager) recycle(s *sequence) {
	for g := range s.tables {
		s.tables[g] = s.tables[g][:0]
		s.host[g] = s.host[g][:0]
	}
	clear(s.path[:cap(s.path)])
	*s = sequence{tables: s.tables, host: s.host, prompt: s.prompt[:0], path: s.path[:0]}
	m.spare = append(m.spare, s)
}

// Stats implements kvcache.Manager.
func (m *Manager) Stats(ctx context.Context) (kvcache.Stats, error) {
	if err := m.ready(ctx, "Stats"); err != nil {
		return kvcache.Stats{}, err
	}
	st := m.stats
	st.Pools = make([]kvcache.PoolStats, len(m.pools))
	for i, p := range m.pools {
		st.Pools[i] = p.Stats()
	}
	st.Sequences = len(m.seqs)
	for _, s := range m.seqs {
		if s.suspended {
			st.SuspendedSeqs++
		}
	}
	return st, nil
}

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

func (e *itemErrors) err(op string) error {
	if len(e.seqs) == 0 {
		return nil
	}
	return kvcache.ItemErrorf(e.seqs, "cachemgr_v2: %s: %s", op, strings.Join(e.msgs, "; "))
}
