package mamba

import (
	"context"
	"fmt"
	"slices"
	"strings"

	cachemgrv2 "github.com/kvx-dev/kvx/cachemgr_v2"
	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
	"github.com/kvx-dev/kvx/plugins/v1/spec"
)

// Name and Version identify the manager in Info.
const (
	Name    = "mamba"
	Version = "0.1.0"
)

// NoBlock marks an absent block or slot.
const NoBlock = cachemgrv2.NoBlock

var _ kvcache.Manager = (*Manager)(nil)

// Manager is the hybrid (Mamba) cache manager of one pipeline stage; see the
// package doc. The zero value is not usable: call New, then Configure. The
// core calls it from one goroutine at a time; it does no locking.
type Manager struct {
	cfg       kvcache.Config
	tpb       int
	maxTokens int // MaxSeqLen + MaxDraftTokens

	groups []*cachemgrv2.PoolGroup
	dev    []*cachemgrv2.BlockPool // one per attention group, pool ids 0..G-1
	tree   *cachemgrv2.Tree
	reuse  bool // Lookup can return > 0

	ssm      *slots // the state pool (pool id G); nil without state layers
	live     int    // live slots: MaxBatchSize × Stages
	liveUsed int
	snapCap  int // slots for snapshots: the pool's slots beyond the live ones
	nSnaps   int // installed snapshots plus slots being written
	snapOn   bool
	step     int
	offsets  []int
	snaps    map[*cachemgrv2.Node]*snapshot
	snapSeq  uint64

	seqs  map[kvcache.SeqID]*sequence
	stats kvcache.Stats
	tick  uint64

	pages  []kvcache.BlockID
	bounds []int
}

// snapshot is an SSM state installed on the tree node of the block that ends
// at pos.
type snapshot struct {
	node  *cachemgrv2.Node
	slot  kvcache.BlockID
	pos   int
	level int
	tick  uint64 // LRU key: install, reuse, release of a sequence on its path
	id    uint64 // creation order, the last tie-break
	pins  int32  // sequences whose grant copies it into their live slot
}

// pendingSnap is a snapshot slot the outstanding step writes at pos.
type pendingSnap struct {
	pos  int
	slot kvcache.BlockID
}

// sequence is one request's state on this stage.
type sequence struct {
	id      kvcache.SeqID
	led     cachemgrv2.Ledger
	tables  [][]kvcache.BlockID // per attention group
	live    kvcache.BlockID     // live state slot; NoBlock without a state pool
	pend    []pendingSnap
	src     *snapshot // pinned reuse source until the first Commit
	prompt  []int32   // the prompt's full blocks (block reuse on)
	plen    int       // the prompt's length
	path    []*cachemgrv2.Node
	regStop bool
	sent    int // attention table entries [0, sent) the worker knows

	created              bool
	undoBlocks, undoSent int
}

// New returns an unconfigured manager.
func New() *Manager { return &Manager{} }

// Info implements kvcache.Manager.
func (m *Manager) Info(ctx context.Context) (kvcache.Info, error) {
	if err := ctx.Err(); err != nil {
		return kvcache.Info{}, err
	}
	return kvcache.Info{
		Name:      Name,
		Version:   Version,
		Protocols: []int{kvcache.ProtocolVersion},
		Capabilities: kvcache.Capabilities{
			Mixers:      []spec.Mixer{spec.MixerGQA, spec.MixerMLA, spec.MixerDSA, spec.MixerMamba},
			PrefixReuse: true,
			SSMState:    true,
			SSMReuse:    true,
		},
	}, nil
}

// Configure implements kvcache.Manager: it lays out the attention pool groups
// and the ssm pool (package doc, Sizing) and resets all state. It fails with
// ErrInvalidConfig, naming the numbers and the fix, when one MaxSeqLen
// request with its states, the live states of every resident sequence, or
// one MaxNumTokens chunk cannot fit.
func (m *Manager) Configure(ctx context.Context, cfg kvcache.Config) (kvcache.Layout, error) {
	if err := ctx.Err(); err != nil {
		return kvcache.Layout{}, err
	}
	p, err := planLayout(&cfg)
	if err != nil {
		return kvcache.Layout{}, err
	}
	cfg.Layers = nil
	cfg.PoolRatio = slices.Clone(cfg.PoolRatio)
	cfg.Snapshots.OffsetsFromEnd = slices.Clone(cfg.Snapshots.OffsetsFromEnd)
	*m = Manager{
		cfg:       cfg,
		tpb:       cfg.TokensPerBlock,
		maxTokens: cfg.MaxSeqLen + cfg.MaxDraftTokens,
		groups:    p.groups,
		live:      p.live,
		snapOn:    p.snapshots,
		step:      p.step,
		offsets:   p.offsets,
		snaps:     map[*cachemgrv2.Node]*snapshot{},
		seqs:      map[kvcache.SeqID]*sequence{},
		pages:     make([]kvcache.BlockID, len(p.groups)),
	}
	for g, pg := range p.groups {
		pg.Dev = cachemgrv2.NewBlockPool(g, kvcache.TierDevice, p.devBlocks[g])
		m.dev = append(m.dev, pg.Dev)
	}
	m.tree = cachemgrv2.NewTree(m.tpb, m.dev)
	if p.stateBytes > 0 {
		m.ssm = newSlots(len(p.groups), p.ssmBlocks)
		m.snapCap = p.ssmBlocks - p.live
	}
	m.reuse = cfg.EnableBlockReuse && len(m.dev) > 0 && (m.ssm == nil || m.snapOn)
	lay := p.layout
	lay.Pools = slices.Clone(lay.Pools)
	lay.Warnings = slices.Clone(lay.Warnings)
	return lay, nil
}

func (m *Manager) ready(ctx context.Context, op string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if m.tree == nil {
		return kvcache.Errorf(kvcache.KindInvalidArg, "mamba: %s before Configure", op)
	}
	return nil
}

// Lookup implements kvcache.Manager: per item, the largest block boundary b
// <= len(Prompt)-1 such that every full block up to b is cached with all its
// pages and, on a stage with state layers, a snapshot sits at b. It changes
// nothing but the LookupTokens counter.
func (m *Manager) Lookup(ctx context.Context, items []kvcache.LookupItem) ([]int, error) {
	if err := m.ready(ctx, "Lookup"); err != nil {
		return nil, err
	}
	out := make([]int, len(items))
	for i := range items {
		p := items[i].Prompt
		m.stats.LookupTokens += int64(len(p))
		if m.reuse && len(p) > 1 {
			out[i] = m.lookup(p)
		}
	}
	return out, nil
}

func (m *Manager) lookup(p []int32) int {
	limit := (len(p) - 1) / m.tpb
	if m.ssm == nil {
		return m.tree.MatchLen(p, limit) * m.tpb
	}
	n := m.tree.Root()
	best := 0
	for i := 0; i < limit; i++ {
		c := m.tree.Child(n, p[i*m.tpb:(i+1)*m.tpb])
		if c == nil || !c.Complete() {
			break
		}
		if m.snaps[c] != nil {
			best = i + 1
		}
		n = c
	}
	return best * m.tpb
}

// Reserve implements kvcache.Manager. Per item, in order: need =
// max(history+Tokens+Draft, Hold) is granted as ceil(need/tpb) blocks in
// every attention group (evicting cached unpinned blocks, and the snapshots
// on them, when the free lists are short) and, for a new sequence, a live
// state slot; or the item is denied with a Reason and leaves no trace.
// Invalid items are denied with a Reason starting "invalid: ". A granted
// step that crosses snapshot boundaries of the prompt then gets its snapshot
// slots, best-effort (package doc). Reuse copies the snapshot at Reuse into
// the live slot (Grant.Copies).
func (m *Manager) Reserve(ctx context.Context, items []kvcache.ReserveItem) ([]kvcache.Grant, error) {
	if err := m.ready(ctx, "Reserve"); err != nil {
		return nil, err
	}
	m.tree.Prune() // safe point: no walk in progress
	m.tick++
	grants := make([]kvcache.Grant, len(items))
	for i := range items {
		grants[i].Seq = items[i].Seq
		if reason := m.reserve(&items[i], &grants[i]); reason != "" {
			grants[i].Reason = reason
			m.stats.ReserveDenials++
			continue
		}
		grants[i].OK = true
	}
	return grants, nil
}

func (m *Manager) reserve(it *kvcache.ReserveItem, g *kvcache.Grant) string {
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
		return m.reserveNew(it, g)
	}
	switch {
	case s == nil:
		return fmt.Sprintf("invalid: seq %d: unknown sequence (New not set)", it.Seq)
	case it.Reuse > 0:
		return fmt.Sprintf("invalid: seq %d: reuse %d on an existing sequence", it.Seq, it.Reuse)
	case s.led.Reserved:
		return fmt.Sprintf("invalid: seq %d: reservation of tokens %d + draft %d outstanding: Commit or Unreserve it first",
			it.Seq, s.led.Tokens, s.led.Draft)
	}
	need := s.led.Need(it.Tokens, it.Draft, it.Hold)
	if need > m.maxTokens {
		return fmt.Sprintf("invalid: seq %d: needs %d tokens (history %d + tokens %d + draft %d, hold %d) > max_seq_len %d + max_draft_tokens %d",
			it.Seq, need, s.led.History, it.Tokens, it.Draft, max(s.led.Hold, it.Hold), m.cfg.MaxSeqLen, m.cfg.MaxDraftTokens)
	}
	have := m.held(s)
	nb := m.blocksFor(need) - have
	if r := m.roomFor(nb); r != "" {
		return fmt.Sprintf("no capacity: seq %d needs %d tokens (capacity %d): %s", it.Seq, need, s.led.Capacity, r)
	}
	s.created = false
	s.undoBlocks, s.undoSent = have, s.sent
	m.grow(s, nb)
	s.led.Reserve(it.Tokens, it.Draft, it.Hold)
	m.planSnaps(s, it.Tokens)
	m.deltas(s, g, false)
	return ""
}

func (m *Manager) reserveNew(it *kvcache.ReserveItem, g *kvcache.Grant) string {
	reuse, tpb := it.Reuse, m.tpb
	if reuse > 0 {
		switch {
		case !m.reuse:
			return fmt.Sprintf("invalid: seq %d: reuse %d but prefix reuse is off on this stage (enable_block_reuse %v, snapshots %v)",
				it.Seq, reuse, m.cfg.EnableBlockReuse, m.snapOn)
		case reuse > len(it.Prompt)-1:
			return fmt.Sprintf("invalid: seq %d: reuse %d > len(prompt)-1 = %d", it.Seq, reuse, len(it.Prompt)-1)
		case reuse%tpb != 0:
			return fmt.Sprintf("invalid: seq %d: reuse %d is not a multiple of tokens_per_block %d", it.Seq, reuse, tpb)
		}
	}
	need := max(reuse+it.Tokens+it.Draft, it.Hold)
	if need > m.maxTokens {
		return fmt.Sprintf("invalid: seq %d: needs %d tokens (reuse %d + tokens %d + draft %d, hold %d) > max_seq_len %d + max_draft_tokens %d",
			it.Seq, need, reuse, it.Tokens, it.Draft, it.Hold, m.cfg.MaxSeqLen, m.cfg.MaxDraftTokens)
	}
	if m.ssm != nil && m.liveUsed >= m.live {
		return fmt.Sprintf("no capacity: new seq %d: all %d live state slots (max_batch_size %d × pipeline_parallel_size %d) are held by resident sequences",
			it.Seq, m.live, m.cfg.MaxBatchSize, max(m.cfg.Stages, 1))
	}
	s := &sequence{id: it.Seq, tables: make([][]kvcache.BlockID, len(m.dev)), live: NoBlock}
	full := reuse / tpb
	var src *snapshot
	if reuse > 0 {
		s.path = m.tree.Match(it.Prompt, full, nil)
		if len(s.path) < full {
			return fmt.Sprintf("reuse %d tokens no longer cached (%d now): seq %d: Lookup again", reuse, len(s.path)*tpb, it.Seq)
		}
		if m.ssm != nil {
			if src = m.snaps[s.path[full-1]]; src == nil {
				return fmt.Sprintf("reuse %d tokens: no SSM snapshot at %d any more: seq %d: Lookup again", reuse, reuse, it.Seq)
			}
		}
		for _, n := range s.path {
			m.tree.Pin(n)
		}
	}
	nb := m.blocksFor(need) - full
	if len(m.dev) == 0 {
		nb = 0
	}
	if r := m.roomFor(nb); r != "" {
		for i := len(s.path) - 1; i >= 0; i-- {
			m.tree.Unpin(s.path[i], false)
		}
		return fmt.Sprintf("no capacity: new seq %d needs %d tokens (reuse %d): %s", it.Seq, need, reuse, r)
	}
	for gi, pool := range m.dev {
		for _, n := range s.path {
			b := n.Pages()[gi]
			pool.Ref(b)
			s.tables[gi] = append(s.tables[gi], b)
		}
	}
	m.grow(s, nb)
	if m.ssm != nil {
		s.live = m.ssm.take()
		m.liveUsed++
		if src != nil {
			src.pins++
			src.tick = m.tick
			s.src = src
			g.Copies = []kvcache.Copy{{SrcPool: m.ssm.id, SrcBlock: src.slot, DstPool: m.ssm.id, DstBlock: s.live}}
			m.stats.Snapshots.ReusedTokens += int64(reuse)
		}
	}
	if m.reuse && len(it.Prompt) >= tpb {
		s.prompt = slices.Clone(it.Prompt[:len(it.Prompt)/tpb*tpb])
		s.plen = len(it.Prompt)
	}
	s.led = cachemgrv2.Ledger{History: reuse, Capacity: reuse}
	s.led.Reserve(it.Tokens, it.Draft, it.Hold)
	s.created = true
	m.seqs[s.id] = s
	m.stats.ReusedTokens += int64(reuse)
	m.planSnaps(s, it.Tokens)
	m.deltas(s, g, true)
	return ""
}

// held is the number of blocks s holds in each attention group.
func (m *Manager) held(s *sequence) int {
	if len(s.tables) == 0 {
		return 0
	}
	return len(s.tables[0])
}

// blocksFor is the number of attention blocks that back n token slots (0 on
// a stage without attention groups).
func (m *Manager) blocksFor(n int) int {
	if len(m.dev) == 0 {
		return 0
	}
	return ceilDiv(n, m.tpb)
}

// roomFor says why nb more blocks per group cannot be had; "" when they can.
func (m *Manager) roomFor(nb int) string {
	ev := m.tree.Evictable()
	for g, pool := range m.dev {
		if pool.Free()+ev < nb {
			return fmt.Sprintf("%d more blocks in pool %s, %d free + %d evictable", nb, m.groups[g].Name, pool.Free(), ev)
		}
	}
	return ""
}

// grow appends nb fresh private blocks to every table of s, evicting cached
// nodes (and the snapshots on them) first when needed; roomFor(nb) said yes.
func (m *Manager) grow(s *sequence, nb int) {
	if nb <= 0 {
		return
	}
	for g := 0; g < len(m.dev); {
		if m.dev[g].Free() >= nb {
			g++
			continue
		}
		n := m.tree.EvictLeaf()
		if n == nil {
			panic(fmt.Sprintf("mamba: pool %s short of %d blocks with nothing evictable", m.groups[g].Name, nb))
		}
		m.stats.Evictions += int64(len(m.dev))
		if sn := m.snaps[n]; sn != nil {
			m.dropSnap(sn)
		}
		g = 0
	}
	for g, pool := range m.dev {
		s.tables[g] = pool.Take(s.tables[g], nb)
	}
}

// dropSnap evicts an installed, unpinned snapshot: its slot becomes free; the
// tree is not touched.
func (m *Manager) dropSnap(sn *snapshot) {
	delete(m.snaps, sn.node)
	m.ssm.evict(sn.slot)
	m.nSnaps--
	m.stats.Snapshots.Evicted++
}

// planSnaps gives the outstanding step of s (tokens after history) a slot
// for each snapshot boundary it crosses, best-effort.
func (m *Manager) planSnaps(s *sequence, tokens int) {
	if !m.snapOn || s.prompt == nil {
		return
	}
	lo, hi := s.led.History, min(s.led.History+tokens, len(s.prompt))
	if hi <= lo {
		return
	}
	tpb := m.tpb
	bs := m.bounds[:0]
	if m.step > 0 {
		for b := (lo/m.step + 1) * m.step; b <= hi; b += m.step {
			bs = append(bs, b)
		}
	}
	for _, off := range m.offsets {
		b := (s.plen - off) / tpb * tpb
		if b > lo && b <= hi && !slices.Contains(bs, b) {
			bs = append(bs, b)
		}
	}
	m.bounds = bs
	if len(bs) == 0 {
		return
	}
	slices.Sort(bs)
	node, depth := m.tree.Root(), 0
	if len(s.path) > 0 {
		node, depth = s.path[len(s.path)-1], len(s.path)
	}
	for _, b := range bs {
		d := b / tpb
		for node != nil && depth < d {
			depth++
			if depth <= len(s.path) {
				node = s.path[depth-1]
			} else {
				node = m.tree.Child(node, s.prompt[(depth-1)*tpb:depth*tpb])
			}
		}
		if node != nil && node.Complete() && m.snaps[node] != nil {
			continue // already held by the cache
		}
		slot, ok := m.snapSlot(boundaryLevel(b, m.step))
		if !ok {
			m.stats.Snapshots.Skipped++
			continue
		}
		s.pend = append(s.pend, pendingSnap{pos: b, slot: slot})
	}
}

// snapSlot takes a slot for a snapshot of level: a free one while fewer than
// snapCap snapshots exist, else one freed by evicting a victim (package doc,
// retention); false when there is none and the snapshot is skipped.
func (m *Manager) snapSlot(level int) (kvcache.BlockID, bool) {
	if m.nSnaps >= m.snapCap {
		v := m.victim(level)
		if v == nil {
			return NoBlock, false
		}
		m.dropSnap(v)
	}
	m.nSnaps++
	return m.ssm.take(), true
}

// victim is the snapshot to evict for a new one of level: the coldest
// (least recently used lineage, then lowest level) snapshot on no live path;
// else the lowest-level unpinned snapshot on a live path, if its level is
// below level; else nil.
func (m *Manager) victim(level int) *snapshot {
	var cold, hot *snapshot
	for _, sn := range m.snaps {
		if sn.pins > 0 {
			continue
		}
		if sn.node.Pins() == 0 {
			if cold == nil || coldLess(sn, cold) {
				cold = sn
			}
		} else if hot == nil || hotLess(sn, hot) {
			hot = sn
		}
	}
	if cold != nil {
		return cold
	}
	if hot != nil && hot.level < level {
		return hot
	}
	return nil
}

func coldLess(a, b *snapshot) bool {
	if a.tick != b.tick {
		return a.tick < b.tick
	}
	if a.level != b.level {
		return a.level < b.level
	}
	return a.id < b.id
}

func hotLess(a, b *snapshot) bool {
	if a.level != b.level {
		return a.level < b.level
	}
	if a.tick != b.tick {
		return a.tick < b.tick
	}
	return a.id < b.id
}

// deltas fills g.Tables: each attention group's table from the first entry
// the worker may not know, and the ssm table (the live slot, then this
// step's snapshot slots); and g.Snapshots: where each snapshot slot is
// written (the position its state covers).
func (m *Manager) deltas(s *sequence, g *kvcache.Grant, isNew bool) {
	n := len(m.dev)
	if m.ssm != nil {
		n++
	}
	if n == 0 {
		return
	}
	g.Tables = make([]kvcache.TableDelta, 0, n)
	for gi, pool := range m.dev {
		g.Tables = append(g.Tables, kvcache.TableDelta{Pool: pool.ID(), From: s.sent, Blocks: slices.Clone(s.tables[gi][s.sent:])})
	}
	s.sent = m.held(s)
	if m.ssm != nil {
		d := kvcache.TableDelta{Pool: m.ssm.id, From: 1}
		if isNew {
			d.From = 0
			d.Blocks = append(d.Blocks, s.live)
		}
		for _, p := range s.pend {
			d.Blocks = append(d.Blocks, p.slot)
			g.Snapshots = append(g.Snapshots, kvcache.SnapshotSlot{Pos: p.pos, Pool: m.ssm.id, Block: p.slot})
		}
		g.Tables = append(g.Tables, d)
	}
}

// Unreserve implements kvcache.Manager: each sequence's outstanding
// reservation is undone exactly (a new sequence disappears; its snapshot
// slots are freed). Cached blocks and snapshots evicted to make room stay
// evicted. A sequence without an outstanding reservation is an item error.
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
		m.freePending(s)
		s.sent = min(s.undoSent, s.undoBlocks)
		s.led.Unreserve()
	}
	return bad.err("Unreserve")
}

func (m *Manager) freePending(s *sequence) {
	for _, p := range s.pend {
		m.ssm.unref(p.slot)
		m.nSnaps--
	}
	s.pend = s.pend[:0]
}

// Commit implements kvcache.Manager. Per item it checks Tokens <= Accepted
// <= Tokens+Draft against the recorded reservation, advances history,
// shrinks capacity to max(history, Hold) (freeing the rejected drafts'
// blocks), ends the pin of a reuse source, registers the prompt blocks that
// history passed in the tree and installs the snapshots the step wrote on
// their nodes. It never allocates, never evicts and prunes only at the end.
// Invalid items are skipped and reported as one item-scoped error after the
// valid ones are applied.
func (m *Manager) Commit(ctx context.Context, items []kvcache.CommitItem) (kvcache.CommitResult, error) {
	if err := m.ready(ctx, "Commit"); err != nil {
		return kvcache.CommitResult{}, err
	}
	m.tick++
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
		nb := m.blocksFor(s.led.Commit(it.Accepted))
		if nb < m.held(s) {
			for g, pool := range m.dev {
				for _, b := range s.tables[g][nb:] {
					pool.Unref(b)
				}
				s.tables[g] = s.tables[g][:nb]
			}
			s.sent = min(s.sent, nb)
		}
		if s.src != nil {
			s.src.pins--
			s.src = nil
		}
		if len(s.path) < len(s.prompt)/m.tpb && !s.regStop {
			m.register(s)
		}
		m.install(s)
	}
	m.tree.Prune() // safe point: the walks are done
	return kvcache.CommitResult{}, bad.err("Commit")
}

// register extends s's tree path with the prompt blocks that history passed.
func (m *Manager) register(s *sequence) {
	limit := min(s.led.History, len(s.prompt)) / m.tpb
	for i := len(s.path); i < limit && !s.regStop; i++ {
		parent := m.tree.Root()
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

// install puts the snapshots the committed step wrote on the tree nodes of
// their boundaries (pinned by s's path). A boundary whose node already holds
// a snapshot, or that registration could not reach, frees its slot.
func (m *Manager) install(s *sequence) {
	for _, p := range s.pend {
		d := p.pos / m.tpb
		if d < 1 || d > len(s.path) || m.snaps[s.path[d-1]] != nil {
			if d < 1 || d > len(s.path) {
				m.stats.Snapshots.Skipped++
			}
			m.ssm.unref(p.slot)
			m.nSnaps--
			continue
		}
		n := s.path[d-1]
		m.snapSeq++
		sn := &snapshot{node: n, slot: p.slot, pos: p.pos, level: boundaryLevel(p.pos, m.step), tick: m.tick, id: m.snapSeq}
		m.snaps[n] = sn
		m.ssm.install(p.slot, sn)
		m.stats.Snapshots.Taken++
	}
	s.pend = s.pend[:0]
}

// Release implements kvcache.Manager: it frees each sequence's private
// blocks, live slot and unwritten snapshot slots, drops its references to
// shared pages (which stay cached, with their snapshots, for reuse) and
// unpins its tree path, marking the path's snapshots as used now. Unknown
// sequences are item errors.
func (m *Manager) Release(ctx context.Context, seqs []kvcache.SeqID) error {
	if err := m.ready(ctx, "Release"); err != nil {
		return err
	}
	m.tick++
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

// drop frees everything s holds and forgets it. touch says whether its use
// counts for LRU (false when undoing a reservation).
func (m *Manager) drop(s *sequence, touch bool) {
	for g, pool := range m.dev {
		for _, b := range s.tables[g] {
			pool.Unref(b)
		}
	}
	if s.live != NoBlock {
		m.ssm.unref(s.live)
		m.liveUsed--
	}
	if m.ssm != nil {
		m.freePending(s)
	}
	if s.src != nil {
		s.src.pins--
		s.src = nil
	}
	for i := len(s.path) - 1; i >= 0; i-- {
		n := s.path[i]
		if sn := m.snaps[n]; sn != nil && touch {
			sn.tick = m.tick
		}
		m.tree.Unpin(n, touch)
	}
	delete(m.seqs, s.id)
}

// Suspend implements kvcache.Manager: the mamba manager has no host tier
// (ErrUnsupported).
func (m *Manager) Suspend(ctx context.Context, seqs []kvcache.SeqID) ([]bool, []kvcache.Copy, error) {
	if err := m.ready(ctx, "Suspend"); err != nil {
		return nil, nil, err
	}
	return nil, nil, kvcache.Errorf(kvcache.KindUnsupported, "mamba: Suspend: no host tier")
}

// Resume implements kvcache.Manager: ErrUnsupported, as Suspend.
func (m *Manager) Resume(ctx context.Context, seqs []kvcache.SeqID) ([]bool, []kvcache.Copy, error) {
	if err := m.ready(ctx, "Resume"); err != nil {
		return nil, nil, err
	}
	return nil, nil, kvcache.Errorf(kvcache.KindUnsupported, "mamba: Resume: no host tier")
}

// Stats implements kvcache.Manager.
func (m *Manager) Stats(ctx context.Context) (kvcache.Stats, error) {
	if err := m.ready(ctx, "Stats"); err != nil {
		return kvcache.Stats{}, err
	}
	st := m.stats
	st.Pools = m.poolStats()
	st.Sequences = len(m.seqs)
	return st, nil
}

func (m *Manager) poolStats() []kvcache.PoolStats {
	out := make([]kvcache.PoolStats, 0, len(m.dev)+1)
	for _, p := range m.dev {
		out = append(out, p.Stats())
	}
	if m.ssm != nil {
		out = append(out, m.ssm.stats())
	}
	return out
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
	return kvcache.ItemErrorf(e.seqs, "mamba: %s: %s", op, strings.Join(e.msgs, "; "))
}
