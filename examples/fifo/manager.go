package main

import (
	"context"
	"encoding/binary"
	"fmt"
	"slices"

	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
	"github.com/kvx-dev/kvx/plugins/v1/spec"
)

// maxBlocks bounds the pool, so that a tiny model on a large simulated
// device does not allocate metadata for billions of blocks.
const maxBlocks = 1 << 22

// Manager is one pipeline stage's FIFO cache manager. Like every manager it
// is called from one goroutine at a time and needs no locks.
//
// Every block is in one of three states: free (refs 0, holds nothing),
// cached (refs 0, holds a prompt block that Lookup can find; evictable) or
// in use (refs > 0). A cached or in-use block that holds a prompt block is
// registered: it has a stamp, an entry in index and a place in queue.
type Manager struct {
	cfg kvcache.Config
	tpb int

	blocks []block
	free   []kvcache.BlockID // free blocks, a stack
	idle   int               // cached blocks: registered with refs 0

	index map[key]kvcache.BlockID // registered blocks by content
	queue []kvcache.BlockID       // registered blocks, oldest first: the eviction order
	stamp uint64                  // the last stamp given

	seqs  map[kvcache.SeqID]*seq
	stats kvcache.Stats
}

var _ kvcache.Manager = (*Manager)(nil)

type block struct {
	refs  int32  // sequences whose table holds the block
	stamp uint64 // != 0: registered, under key
	key   key
}

// key names a prompt block by its content and everything before it: the
// stamp of the previous block of the prefix (0 for the first block) and the
// block's own tokens. Stamps are never reused, so a key is exact: no hash
// can collide, and when a block is evicted the keys that follow it can no
// longer be reached from the start of a prompt (their blocks stay cached,
// unreachable, until their turn in the queue comes).
type key struct {
	parent uint64
	tokens string
}

// seq is one sequence's ledger.
type seq struct {
	history, capacity, hold int
	table                   []kvcache.BlockID

	// The outstanding reservation, and what Unreserve restores.
	reserved, created bool
	tokens, draft     int
	undoCapacity      int
	undoHold          int
	undoLen           int

	// Prefix registration (block reuse on): the prompt, how many of its
	// blocks were registered (or found registered), and the stamp of the
	// last of them.
	prompt     []int32
	registered int
	chain      uint64
}

// New returns an unconfigured manager.
func New() *Manager { return &Manager{} }

// Info implements kvcache.Manager. The capabilities are the promise the
// engine checks against the model: paged attention layers only, prefix
// reuse, no host tier, no SSM state.
func (m *Manager) Info(context.Context) (kvcache.Info, error) {
	return kvcache.Info{
		Name:      "fifo",
		Version:   "0.1.0",
		Protocols: []int{kvcache.ProtocolVersion},
		Capabilities: kvcache.Capabilities{
			Mixers:      []spec.Mixer{spec.MixerGQA, spec.MixerMLA, spec.MixerDSA},
			PrefixReuse: true,
		},
	}, nil
}

// Configure implements kvcache.Manager: one pool of equal blocks for every
// layer with a paged buffer. It forgets everything from before.
func (m *Manager) Configure(_ context.Context, cfg kvcache.Config) (kvcache.Layout, error) {
	bad := func(format string, args ...any) (kvcache.Layout, error) {
		return kvcache.Layout{}, kvcache.Errorf(kvcache.KindInvalidConfig, "fifo: stage %d: "+format, append([]any{cfg.Stage}, args...)...)
	}
	if cfg.TokensPerBlock <= 0 || cfg.MaxSeqLen <= 0 || cfg.MaxNumTokens <= 0 || cfg.MaxDraftTokens < 0 {
		return bad("tokens_per_block %d, max_seq_len %d and max_num_tokens %d must be > 0, max draft tokens %d >= 0",
			cfg.TokensPerBlock, cfg.MaxSeqLen, cfg.MaxNumTokens, cfg.MaxDraftTokens)
	}
	var warnings []string
	var layers []int
	var bytesPerToken int64
	for _, l := range cfg.Layers {
		for _, b := range l.Buffers {
			if b.BytesPerSeq > 0 {
				return bad("layer %d (%s) keeps per-sequence state (buffer %s, %d bytes); fifo manages paged attention only",
					l.Index, l.Mixer, b.Role, b.BytesPerSeq)
			}
			bytesPerToken += b.BytesPerToken
		}
		if l.HasCache() {
			layers = append(layers, l.Index)
		}
		if l.Window > 0 && l.HasCache() {
			warnings = append(warnings, fmt.Sprintf("stage %d: layer %d has a %d-token window; fifo keeps all its blocks like full attention", cfg.Stage, l.Index, l.Window))
		}
	}
	if bytesPerToken == 0 {
		return bad("none of the %d layers has a paged cache buffer", len(cfg.Layers))
	}
	tpb := cfg.TokensPerBlock
	blockBytes := bytesPerToken * int64(tpb)
	n := cfg.DeviceBytes / blockBytes
	if n > maxBlocks {
		warnings = append(warnings, fmt.Sprintf("stage %d: %d blocks fit; fifo uses %d", cfg.Stage, n, maxBlocks))
		n = maxBlocks
	}
	limit := cfg.MaxSeqLen + cfg.MaxDraftTokens
	if need := kvcache.BlocksFor(limit, tpb); n < int64(need) {
		return bad("%d bytes hold %d blocks of %d tokens (%d bytes each); one max_seq_len request (%d + %d draft tokens) needs %d: raise kv_cache_config.free_gpu_memory_fraction or lower max_seq_len",
			cfg.DeviceBytes, n, tpb, blockBytes, cfg.MaxSeqLen, cfg.MaxDraftTokens, need)
	}
	if need := kvcache.BlocksFor(cfg.MaxNumTokens, tpb); n < int64(need) {
		return bad("%d blocks of %d tokens cannot hold one max_num_tokens chunk of %d tokens (%d blocks): lower max_num_tokens",
			n, tpb, cfg.MaxNumTokens, need)
	}
	if cfg.HostBytes > 0 {
		warnings = append(warnings, fmt.Sprintf("stage %d: host_cache_size ignored: fifo has no host tier", cfg.Stage))
	}

	cfg.Layers = nil // not needed past here, and not ours to keep
	*m = Manager{cfg: cfg, tpb: tpb, blocks: make([]block, n), index: map[key]kvcache.BlockID{}, seqs: map[kvcache.SeqID]*seq{}}
	for b := n - 1; b >= 0; b-- {
		m.free = append(m.free, kvcache.BlockID(b))
	}
	return kvcache.Layout{
		Pools: []kvcache.Pool{{ID: 0, Name: "full", Tier: kvcache.TierDevice, Layers: layers,
			TokensPerBlock: tpb, BlockBytes: blockBytes, Blocks: int(n)}},
		MaxSeqTokens: min(int(n)*tpb, limit),
		Warnings:     warnings,
	}, nil
}

// Lookup implements kvcache.Manager: the registered full blocks at the
// start of each prompt, at most len(Prompt)-1 tokens (the last prompt
// token is always computed, to sample from).
func (m *Manager) Lookup(_ context.Context, items []kvcache.LookupItem) ([]int, error) {
	out := make([]int, len(items))
	for i, it := range items {
		m.stats.LookupTokens += int64(len(it.Prompt))
		if m.cfg.EnableBlockReuse && len(it.Prompt) > 1 {
			found, _ := m.match(it.Prompt, (len(it.Prompt)-1)/m.tpb)
			out[i] = len(found) * m.tpb
		}
	}
	return out, nil
}

// match returns the registered blocks of the first n blocks of prompt, as
// far as they go, and the stamp of the last one found.
func (m *Manager) match(prompt []int32, n int) ([]kvcache.BlockID, uint64) {
	var found []kvcache.BlockID
	var parent uint64
	for i := range n {
		b, ok := m.index[key{parent, tokensKey(prompt[i*m.tpb : (i+1)*m.tpb])}]
		if !ok {
			break
		}
		found = append(found, b)
		parent = m.blocks[b].stamp
	}
	return found, parent
}

// Reserve implements kvcache.Manager. Each item is granted or denied on its
// own, in order; a denial changes nothing.
func (m *Manager) Reserve(_ context.Context, items []kvcache.ReserveItem) ([]kvcache.Grant, error) {
	if m.tpb == 0 {
		return nil, kvcache.Errorf(kvcache.KindInvalidArg, "fifo: Reserve before Configure")
	}
	gs := make([]kvcache.Grant, len(items))
	for i, it := range items {
		gs[i] = m.reserve(it)
		if !gs[i].OK {
			m.stats.ReserveDenials++
		}
	}
	return gs, nil
}

func (m *Manager) reserve(it kvcache.ReserveItem) kvcache.Grant {
	deny := func(format string, args ...any) kvcache.Grant {
		return kvcache.Grant{Seq: it.Seq, Reason: fmt.Sprintf(format, args...)}
	}
	s := m.seqs[it.Seq]
	limit := m.cfg.MaxSeqLen + m.cfg.MaxDraftTokens
	switch {
	case it.Tokens < 0 || it.Draft < 0 || it.Hold < 0 || it.Draft > m.cfg.MaxDraftTokens:
		return deny("invalid: seq %d: tokens %d, draft %d (max %d), hold %d", it.Seq, it.Tokens, it.Draft, m.cfg.MaxDraftTokens, it.Hold)
	case it.New != (s == nil):
		return deny("invalid: seq %d: New is %v but the sequence exists: %v", it.Seq, it.New, s != nil)
	case s != nil && s.reserved:
		return deny("invalid: seq %d: a reservation of %d tokens is outstanding", it.Seq, s.tokens+s.draft)
	case it.Reuse != 0 && (!it.New || !m.cfg.EnableBlockReuse || it.Reuse%m.tpb != 0 || it.Reuse > len(it.Prompt)-1):
		return deny("invalid: seq %d: reuse %d of a %d-token prompt (new %v, block reuse %v, %d tokens per block)",
			it.Seq, it.Reuse, len(it.Prompt), it.New, m.cfg.EnableBlockReuse, m.tpb)
	}

	var reused []kvcache.BlockID
	var chain uint64
	if s == nil {
		reused, chain = m.match(it.Prompt, it.Reuse/m.tpb)
		if len(reused)*m.tpb < it.Reuse {
			return deny("invalid: seq %d: reuse %d tokens, only %d are cached", it.Seq, it.Reuse, len(reused)*m.tpb)
		}
		s = &seq{history: it.Reuse, created: true}
	}
	need := max(s.capacity, s.history+it.Tokens+it.Draft, s.hold, it.Hold)
	if need > limit {
		return deny("invalid: seq %d needs %d tokens, more than max_seq_len + drafts %d", it.Seq, need, limit)
	}
	// Take the reused blocks first, so that they cannot be evicted to make
	// room for the rest; give them back if the rest does not fit.
	for _, b := range reused {
		m.ref(b)
	}
	have := len(s.table) + len(reused)
	more := kvcache.BlocksFor(need, m.tpb) - have
	if more > len(m.free)+m.idle {
		for _, b := range reused {
			m.unref(b)
		}
		return deny("seq %d needs %d more blocks; %d free and %d cached of %d", it.Seq, more, len(m.free), m.idle, len(m.blocks))
	}

	from := len(s.table)
	s.undoCapacity, s.undoHold, s.undoLen = s.capacity, s.hold, len(s.table)
	s.table = append(s.table, reused...)
	for range more {
		s.table = append(s.table, m.alloc())
	}
	s.capacity, s.hold = need, max(s.hold, it.Hold)
	s.reserved, s.tokens, s.draft = true, it.Tokens, it.Draft
	if s.created {
		if m.cfg.EnableBlockReuse {
			s.prompt = slices.Clone(it.Prompt)
			s.registered, s.chain = len(reused), chain
		}
		m.stats.ReusedTokens += int64(it.Reuse)
		m.seqs[it.Seq] = s
	}
	delta := kvcache.TableDelta{Pool: 0, From: from, Blocks: slices.Clone(s.table[from:])}
	return kvcache.Grant{Seq: it.Seq, OK: true, Tables: []kvcache.TableDelta{delta}}
}

// Unreserve implements kvcache.Manager. Cached blocks that Reserve evicted
// stay evicted: they come back free.
func (m *Manager) Unreserve(_ context.Context, ids []kvcache.SeqID) error {
	var bad []kvcache.SeqID
	for _, id := range ids {
		s := m.seqs[id]
		switch {
		case s == nil || !s.reserved:
			bad = append(bad, id)
		case s.created:
			m.drop(id)
		default:
			m.trim(s, s.undoLen)
			s.capacity, s.hold = s.undoCapacity, s.undoHold
			s.reserved, s.tokens, s.draft = false, 0, 0
		}
	}
	return itemErr("Unreserve", bad)
}

// Commit implements kvcache.Manager. The rejected drafts are released from
// what the ledger reserved, and the prompt blocks that history now covers
// are registered for reuse. It allocates nothing.
func (m *Manager) Commit(_ context.Context, items []kvcache.CommitItem) (kvcache.CommitResult, error) {
	var bad []kvcache.SeqID
	for _, it := range items {
		s := m.seqs[it.Seq]
		if s == nil || !s.reserved || it.Accepted < s.tokens || it.Accepted > s.tokens+s.draft {
			bad = append(bad, it.Seq)
			continue
		}
		s.history += it.Accepted
		s.capacity = max(s.history, s.hold)
		m.trim(s, kvcache.BlocksFor(s.capacity, m.tpb))
		s.reserved, s.created, s.tokens, s.draft = false, false, 0, 0
		m.register(s)
	}
	return kvcache.CommitResult{}, itemErr("Commit", bad)
}

// register registers the full prompt blocks of s that history covers. A
// block whose content is registered already (another sequence computed the
// same prefix) is not registered twice: the chain goes on from the one that
// was there first.
func (m *Manager) register(s *seq) {
	for i := s.registered; i < min(s.history, len(s.prompt))/m.tpb; i++ {
		k := key{s.chain, tokensKey(s.prompt[i*m.tpb : (i+1)*m.tpb])}
		if b, ok := m.index[k]; ok {
			s.chain = m.blocks[b].stamp
		} else {
			m.stamp++
			b := s.table[i]
			m.blocks[b].stamp, m.blocks[b].key = m.stamp, k
			m.index[k] = b
			m.queue = append(m.queue, b)
			s.chain = m.stamp
		}
		s.registered = i + 1
	}
}

// Release implements kvcache.Manager. Registered blocks stay cached.
func (m *Manager) Release(_ context.Context, ids []kvcache.SeqID) error {
	var bad []kvcache.SeqID
	for _, id := range ids {
		if m.seqs[id] == nil {
			bad = append(bad, id)
			continue
		}
		m.drop(id)
	}
	return itemErr("Release", bad)
}

// Stats implements kvcache.Manager.
func (m *Manager) Stats(context.Context) (kvcache.Stats, error) {
	st := m.stats
	st.Pools = m.poolStats()
	st.Sequences = len(m.seqs)
	return st, nil
}

// Inspect implements kvcache.Manager.
func (m *Manager) Inspect(_ context.Context, opts kvcache.InspectOptions) (kvcache.Snapshot, error) {
	snap := kvcache.Snapshot{Pools: m.poolStats()}
	for _, id := range sortedKeys(m.seqs) {
		s := m.seqs[id]
		st := kvcache.SeqState{Seq: id, History: s.history, Capacity: s.capacity, Hold: s.hold, Blocks: []int{len(s.table)}}
		if s.reserved {
			st.Reserved, st.Draft = s.tokens+s.draft, s.draft
		}
		if opts.Tables {
			st.Tables = [][]kvcache.BlockID{slices.Clone(s.table)}
		}
		snap.Seqs = append(snap.Seqs, st)
	}
	if opts.Tables {
		refs := make([]int32, len(m.blocks))
		for i, b := range m.blocks {
			refs[i] = b.refs
		}
		snap.RefCounts = [][]int32{refs}
	}
	return snap, nil
}

// alloc takes a free block, or evicts the oldest cached one. The caller has
// checked that there is one.
func (m *Manager) alloc() kvcache.BlockID {
	var b kvcache.BlockID
	if n := len(m.free); n > 0 {
		b, m.free = m.free[n-1], m.free[:n-1]
	} else {
		b = m.evict()
	}
	m.blocks[b].refs = 1
	return b
}

// evict unregisters the cached block that was registered first and returns
// it. Blocks in use keep their place in the queue. The scan is linear in the
// blocks in use ahead of the first cached one: simple, and fast enough for
// an example; a production manager would keep the cached blocks in a heap
// ordered by stamp.
func (m *Manager) evict() kvcache.BlockID {
	for i, b := range m.queue {
		if m.blocks[b].refs > 0 {
			continue
		}
		m.queue = slices.Delete(m.queue, i, i+1)
		delete(m.index, m.blocks[b].key)
		m.blocks[b] = block{}
		m.idle--
		m.stats.Evictions++
		return b
	}
	panic("fifo: evict with no cached block") // alloc's caller checked
}

func (m *Manager) ref(b kvcache.BlockID) {
	if m.blocks[b].refs == 0 && m.blocks[b].stamp != 0 {
		m.idle--
	}
	m.blocks[b].refs++
}

func (m *Manager) unref(b kvcache.BlockID) {
	m.blocks[b].refs--
	switch {
	case m.blocks[b].refs > 0:
	case m.blocks[b].stamp != 0:
		m.idle++ // stays cached
	default:
		m.free = append(m.free, b)
	}
}

// trim shortens the table of s to n blocks.
func (m *Manager) trim(s *seq, n int) {
	for len(s.table) > n {
		m.unref(s.table[len(s.table)-1])
		s.table = s.table[:len(s.table)-1]
	}
}

func (m *Manager) drop(id kvcache.SeqID) {
	m.trim(m.seqs[id], 0)
	delete(m.seqs, id)
}

func (m *Manager) poolStats() []kvcache.PoolStats {
	total := len(m.blocks)
	return []kvcache.PoolStats{{Pool: 0, Total: total, Free: len(m.free), Cached: m.idle, InUse: total - len(m.free) - m.idle}}
}

// itemErr is the one item-scoped error of a call with refused items.
func itemErr(op string, bad []kvcache.SeqID) error {
	if len(bad) == 0 {
		return nil
	}
	return kvcache.ItemErrorf(bad, "fifo: %s refused sequences %v: unknown, without a reservation, or accepting outside it", op, bad)
}

// tokensKey is tokens as a string, usable in a map key.
func tokensKey(tokens []int32) string {
	b := make([]byte, 0, 4*len(tokens))
	for _, t := range tokens {
		b = binary.LittleEndian.AppendUint32(b, uint32(t))
	}
	return string(b)
}

func sortedKeys(seqs map[kvcache.SeqID]*seq) []kvcache.SeqID {
	ids := make([]kvcache.SeqID, 0, len(seqs))
	for id := range seqs {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids
}
