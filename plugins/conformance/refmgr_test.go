package conformance_test

import (
	"context"
	"fmt"
	"slices"

	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
	"github.com/kvx-dev/kvx/plugins/v1/spec"
)

// refManager is the smallest manager that keeps the contract: one device
// pool for every paged layer, no prefix reuse, no host tier. With a fault
// set it breaks one rule on purpose, so the self-tests can show that the
// suite catches it.
type refManager struct {
	fault fault

	cfg    kvcache.Config
	tpb    int
	blocks int
	free   []kvcache.BlockID // stack
	refs   []int32
	seqs   map[kvcache.SeqID]*refSeq
	stats  kvcache.Stats
}

type fault int

const (
	noFault           fault = iota
	widthCommit             // Commit rewinds to a width recomputed from Tokens, not the ledger (seed A)
	leakUnreserve           // Unreserve of an existing sequence drops its new blocks from the table but never frees them
	seqlessItemErrors       // item errors carry no Seqs
	aliasRefCounts          // Inspect returns its own reference counts, not a copy
)

type refSeq struct {
	history, capacity, hold int
	reserved, created       bool
	tokens, draft           int
	table                   []kvcache.BlockID
	undoCap, undoHold       int
	undoLen                 int
}

var _ kvcache.Manager = (*refManager)(nil)

func (m *refManager) Info(ctx context.Context) (kvcache.Info, error) {
	return kvcache.Info{Name: "ref", Version: "0", Protocols: []int{kvcache.ProtocolVersion},
		Capabilities: kvcache.Capabilities{Mixers: []spec.Mixer{spec.MixerGQA, spec.MixerMLA, spec.MixerDSA}}}, nil
}

func (m *refManager) Configure(ctx context.Context, cfg kvcache.Config) (kvcache.Layout, error) {
	var bpt int64
	var layers []int
	for _, l := range cfg.Layers {
		for _, b := range l.Buffers {
			bpt += b.BytesPerToken
		}
		if l.HasCache() {
			layers = append(layers, l.Index)
		}
	}
	if bpt == 0 || cfg.TokensPerBlock <= 0 {
		return kvcache.Layout{}, kvcache.Errorf(kvcache.KindInvalidConfig, "ref: %d bytes per token, tokens_per_block %d: both must be > 0", bpt, cfg.TokensPerBlock)
	}
	tpb := cfg.TokensPerBlock
	n := int(cfg.DeviceBytes / (bpt * int64(tpb)))
	if need := (cfg.MaxSeqLen + cfg.MaxDraftTokens + tpb - 1) / tpb; n < need {
		return kvcache.Layout{}, kvcache.Errorf(kvcache.KindInvalidConfig,
			"ref: device_bytes %d hold %d blocks; max_seq_len %d + %d drafts need %d: raise the budget", cfg.DeviceBytes, n, cfg.MaxSeqLen, cfg.MaxDraftTokens, need)
	}
	if need := (cfg.MaxNumTokens + tpb - 1) / tpb; n < need {
		return kvcache.Layout{}, kvcache.Errorf(kvcache.KindInvalidConfig,
			"ref: device_bytes %d hold %d blocks; one max_num_tokens %d chunk needs %d", cfg.DeviceBytes, n, cfg.MaxNumTokens, need)
	}
	*m = refManager{fault: m.fault, cfg: cfg, tpb: tpb, blocks: n, refs: make([]int32, n), seqs: map[kvcache.SeqID]*refSeq{}}
	m.cfg.Layers = nil
	for b := n - 1; b >= 0; b-- {
		m.free = append(m.free, kvcache.BlockID(b))
	}
	return kvcache.Layout{
		Pools:        []kvcache.Pool{{ID: 0, Name: "full", Tier: kvcache.TierDevice, Layers: layers, TokensPerBlock: tpb, BlockBytes: bpt * int64(tpb), Blocks: n}},
		MaxSeqTokens: min(n*tpb, cfg.MaxSeqLen+cfg.MaxDraftTokens),
	}, nil
}

func (m *refManager) Lookup(ctx context.Context, items []kvcache.LookupItem) ([]int, error) {
	for _, it := range items {
		m.stats.LookupTokens += int64(len(it.Prompt))
	}
	return make([]int, len(items)), nil
}

func (m *refManager) alloc() kvcache.BlockID {
	b := m.free[len(m.free)-1]
	m.free = m.free[:len(m.free)-1]
	m.refs[b]++
	return b
}

func (m *refManager) unref(b kvcache.BlockID) {
	m.refs[b]--
	if m.refs[b] == 0 {
		m.free = append(m.free, b)
	}
}

func (m *refManager) Reserve(ctx context.Context, items []kvcache.ReserveItem) ([]kvcache.Grant, error) {
	gs := make([]kvcache.Grant, len(items))
	for i, it := range items {
		gs[i].Seq = it.Seq
		s := m.seqs[it.Seq]
		deny := func(format string, args ...any) {
			gs[i].Reason = fmt.Sprintf(format, args...)
			m.stats.ReserveDenials++
		}
		switch {
		case it.Tokens < 0 || it.Draft < 0 || it.Hold < 0 || it.Reuse != 0 || it.Draft > m.cfg.MaxDraftTokens:
			deny("invalid item %+v", it)
			continue
		case it.New == (s != nil):
			deny("invalid: seq %d: New %v, exists %v", it.Seq, it.New, s != nil)
			continue
		case s != nil && s.reserved:
			deny("invalid: seq %d: reservation outstanding", it.Seq)
			continue
		}
		if s == nil {
			s = &refSeq{created: true}
		} else {
			s.created = false
		}
		need := max(s.capacity, s.history+it.Tokens+it.Draft, s.hold, it.Hold)
		if need > m.cfg.MaxSeqLen+m.cfg.MaxDraftTokens {
			deny("invalid: seq %d needs %d tokens > %d", it.Seq, need, m.cfg.MaxSeqLen+m.cfg.MaxDraftTokens)
			continue
		}
		nb := (need+m.tpb-1)/m.tpb - len(s.table)
		if nb > len(m.free) {
			deny("seq %d needs %d more blocks, %d free of %d", it.Seq, nb, len(m.free), m.blocks)
			continue
		}
		s.undoCap, s.undoHold, s.undoLen = s.capacity, s.hold, len(s.table)
		for range nb {
			s.table = append(s.table, m.alloc())
		}
		s.capacity, s.hold = need, max(s.hold, it.Hold)
		s.reserved, s.tokens, s.draft = true, it.Tokens, it.Draft
		m.seqs[it.Seq] = s
		gs[i].OK = true
		gs[i].Tables = []kvcache.TableDelta{{Pool: 0, From: 0, Blocks: slices.Clone(s.table)}}
	}
	return gs, nil
}

// itemErr is the one item-scoped error of a call with bad items.
func (m *refManager) itemErr(op string, bad []kvcache.SeqID) error {
	if len(bad) == 0 {
		return nil
	}
	if m.fault == seqlessItemErrors {
		return kvcache.Errorf(kvcache.KindInvalidArg, "ref: %s: bad items", op)
	}
	return kvcache.ItemErrorf(bad, "ref: %s: bad sequences %v", op, bad)
}

func (m *refManager) Unreserve(ctx context.Context, seqs []kvcache.SeqID) error {
	var bad []kvcache.SeqID
	for _, id := range seqs {
		s := m.seqs[id]
		if s == nil || !s.reserved {
			bad = append(bad, id)
			continue
		}
		if s.created {
			m.drop(id)
			continue
		}
		for len(s.table) > s.undoLen {
			if m.fault != leakUnreserve {
				m.unref(s.table[len(s.table)-1])
			}
			s.table = s.table[:len(s.table)-1]
		}
		s.capacity, s.hold = s.undoCap, s.undoHold
		s.reserved, s.tokens, s.draft = false, 0, 0
	}
	return m.itemErr("Unreserve", bad)
}

func (m *refManager) Commit(ctx context.Context, items []kvcache.CommitItem) (kvcache.CommitResult, error) {
	var bad []kvcache.SeqID
	for _, it := range items {
		s := m.seqs[it.Seq]
		if s == nil || !s.reserved || it.Accepted < s.tokens || it.Accepted > s.tokens+s.draft {
			bad = append(bad, it.Seq)
			continue
		}
		if m.fault == widthCommit {
			// Seed A: the rewind is re-derived from the step's width
			// (the non-draft tokens), not from what the ledger reserved.
			s.capacity = max(s.history+s.tokens, s.hold)
		}
		s.history += it.Accepted
		if m.fault != widthCommit {
			s.capacity = max(s.history, s.hold)
		}
		for want := (s.capacity + m.tpb - 1) / m.tpb; len(s.table) > want; {
			m.unref(s.table[len(s.table)-1])
			s.table = s.table[:len(s.table)-1]
		}
		s.reserved, s.created, s.tokens, s.draft = false, false, 0, 0
	}
	return kvcache.CommitResult{}, m.itemErr("Commit", bad)
}

func (m *refManager) drop(id kvcache.SeqID) {
	s := m.seqs[id]
	for i := len(s.table) - 1; i >= 0; i-- {
		m.unref(s.table[i])
	}
	delete(m.seqs, id)
}

func (m *refManager) Release(ctx context.Context, seqs []kvcache.SeqID) error {
	var bad []kvcache.SeqID
	for _, id := range seqs {
		if m.seqs[id] == nil {
			bad = append(bad, id)
			continue
		}
		m.drop(id)
	}
	return m.itemErr("Release", bad)
}

func (m *refManager) poolStats() []kvcache.PoolStats {
	used := 0
	for _, r := range m.refs {
		if r > 0 {
			used++
		}
	}
	return []kvcache.PoolStats{{Pool: 0, Total: m.blocks, Free: m.blocks - used, InUse: used}}
}

func (m *refManager) Stats(ctx context.Context) (kvcache.Stats, error) {
	st := m.stats
	st.Pools = m.poolStats()
	st.Sequences = len(m.seqs)
	return st, nil
}

func (m *refManager) Inspect(ctx context.Context, opts kvcache.InspectOptions) (kvcache.Snapshot, error) {
	snap := kvcache.Snapshot{Pools: m.poolStats()}
	ids := make([]kvcache.SeqID, 0, len(m.seqs))
	for id := range m.seqs {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	for _, id := range ids {
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
		snap.RefCounts = [][]int32{slices.Clone(m.refs)}
		if m.fault == aliasRefCounts {
			snap.RefCounts[0] = m.refs
		}
	}
	return snap, nil
}
