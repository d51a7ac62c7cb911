package pluginrpc

// Converters between the contract's Go types and the generated messages: one
// small function per message and direction. Rules:
//
//   - fromProto* accept nil and return the zero value.
//   - Empty slices travel as nothing and come back nil.
//   - Slices whose element types match on both sides ([]int32 tokens,
//     []float32 logits, []string, ...) are shared, not copied: a message is
//     marshalled before the call returns and a decoded message is owned by
//     whoever decoded it, so no slice outlives its owner's contract.
//   - Per-step messages are columnar (columns.go): no allocation per item in
//     either direction; nested slices of the items are carved out of one
//     allocation per column, with capped capacity.

import (
	"encoding/json"
	"fmt"

	"github.com/kvx-dev/kvx/plugins/internal/kvxpb"
	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
	"github.com/kvx-dev/kvx/plugins/v1/pipeline"
	"github.com/kvx-dev/kvx/plugins/v1/spec"
)

type integer interface {
	~int | ~int32 | ~int64 | ~uint64
}

// ints converts an integer slice element by element; nil when empty.
func ints[D, S integer](s []S) []D {
	if len(s) == 0 {
		return nil
	}
	d := make([]D, len(s))
	for i, v := range s {
		d[i] = D(v)
	}
	return d
}

// strs converts a string-typed slice; nil when empty.
func strs[D, S ~string](s []S) []D {
	if len(s) == 0 {
		return nil
	}
	d := make([]D, len(s))
	for i, v := range s {
		d[i] = D(v)
	}
	return d
}

// share returns s, or nil when it is empty.
func share[T any](s []T) []T {
	if len(s) == 0 {
		return nil
	}
	return s
}

func fromSeqIDs(s []kvcache.SeqID) []uint64 { return ints[uint64](s) }
func toSeqIDs(s []uint64) []kvcache.SeqID   { return ints[kvcache.SeqID](s) }

// ptrs returns pointers to each element of msgs, which must not move.
func ptrs[T any](msgs []T) []*T {
	if len(msgs) == 0 {
		return nil
	}
	p := make([]*T, len(msgs))
	for i := range msgs {
		p[i] = &msgs[i]
	}
	return p
}

// --- Info and Capabilities ---

func toProtoCapabilities(c kvcache.Capabilities) *kvxpb.Capabilities {
	return &kvxpb.Capabilities{
		Mixers:      strs[string](c.Mixers),
		PrefixReuse: c.PrefixReuse,
		HostTier:    c.HostTier,
		SsmState:    c.SSMState,
		SsmReuse:    c.SSMReuse,
		CacheSalt:   c.CacheSalt,
		KvEvents:    c.KVEvents,
		Explain:     c.Explain,
		Retention:   c.Retention,
		Fork:        c.Fork,

		EvictionPolicies: share(c.EvictionPolicies),
	}
}

func fromProtoCapabilities(p *kvxpb.Capabilities) kvcache.Capabilities {
	return kvcache.Capabilities{
		Mixers:      strs[spec.Mixer](p.GetMixers()),
		PrefixReuse: p.GetPrefixReuse(),
		HostTier:    p.GetHostTier(),
		SSMState:    p.GetSsmState(),
		SSMReuse:    p.GetSsmReuse(),
		CacheSalt:   p.GetCacheSalt(),
		KVEvents:    p.GetKvEvents(),
		Explain:     p.GetExplain(),
		Retention:   p.GetRetention(),
		Fork:        p.GetFork(),

		EvictionPolicies: share(p.GetEvictionPolicies()),
	}
}

func toProtoManagerInfo(in kvcache.Info) *kvxpb.ManagerInfo {
	return &kvxpb.ManagerInfo{
		Name:         in.Name,
		Version:      in.Version,
		Protocols:    ints[int64](in.Protocols),
		Capabilities: toProtoCapabilities(in.Capabilities),
	}
}

func fromProtoManagerInfo(p *kvxpb.ManagerInfo) kvcache.Info {
	return kvcache.Info{
		Name:         p.GetName(),
		Version:      p.GetVersion(),
		Protocols:    ints[int](p.GetProtocols()),
		Capabilities: fromProtoCapabilities(p.GetCapabilities()),
	}
}

// --- Configure ---

func toProtoSnapshotConfig(c kvcache.SnapshotConfig) *kvxpb.SnapshotConfig {
	return &kvxpb.SnapshotConfig{Interval: int64(c.Interval), OffsetsFromEnd: ints[int64](c.OffsetsFromEnd)}
}

func fromProtoSnapshotConfig(p *kvxpb.SnapshotConfig) kvcache.SnapshotConfig {
	return kvcache.SnapshotConfig{Interval: int(p.GetInterval()), OffsetsFromEnd: ints[int](p.GetOffsetsFromEnd())}
}

// toProtoManagerConfig fails only when the layers cannot be JSON-encoded.
func toProtoManagerConfig(c kvcache.Config) (*kvxpb.ManagerConfig, error) {
	var layers []byte
	if len(c.Layers) > 0 {
		var err error
		if layers, err = json.Marshal(c.Layers); err != nil {
			return nil, fmt.Errorf("encode Config.Layers: %w", err)
		}
	}
	return &kvxpb.ManagerConfig{
		Stage:            int64(c.Stage),
		Stages:           int64(c.Stages),
		LayersJson:       layers,
		TokensPerBlock:   int64(c.TokensPerBlock),
		DeviceBytes:      c.DeviceBytes,
		HostBytes:        c.HostBytes,
		MaxBatchSize:     int64(c.MaxBatchSize),
		MaxNumTokens:     int64(c.MaxNumTokens),
		MaxSeqLen:        int64(c.MaxSeqLen),
		MaxDraftTokens:   int64(c.MaxDraftTokens),
		EnableBlockReuse: c.EnableBlockReuse,
		AvgSeqLen:        int64(c.AvgSeqLen),
		PoolRatio:        share(c.PoolRatio),
		Snapshots:        toProtoSnapshotConfig(c.Snapshots),
		KvEvents:         c.KVEvents,
		EvictionPolicy:   c.EvictionPolicy,
	}, nil
}

// fromProtoManagerConfig fails with KindInvalidConfig when layers_json does
// not decode.
func fromProtoManagerConfig(p *kvxpb.ManagerConfig) (kvcache.Config, error) {
	var layers []spec.Layer
	if b := p.GetLayersJson(); len(b) > 0 {
		if err := json.Unmarshal(b, &layers); err != nil {
			return kvcache.Config{}, kvcache.Errorf(kvcache.KindInvalidConfig,
				"Config.Layers: layers_json (%d bytes) is not the JSON of []spec.Layer: %v", len(b), err)
		}
	}
	return kvcache.Config{
		Stage:            int(p.GetStage()),
		Stages:           int(p.GetStages()),
		Layers:           share(layers),
		TokensPerBlock:   int(p.GetTokensPerBlock()),
		DeviceBytes:      p.GetDeviceBytes(),
		HostBytes:        p.GetHostBytes(),
		MaxBatchSize:     int(p.GetMaxBatchSize()),
		MaxNumTokens:     int(p.GetMaxNumTokens()),
		MaxSeqLen:        int(p.GetMaxSeqLen()),
		MaxDraftTokens:   int(p.GetMaxDraftTokens()),
		EnableBlockReuse: p.GetEnableBlockReuse(),
		AvgSeqLen:        int(p.GetAvgSeqLen()),
		PoolRatio:        share(p.GetPoolRatio()),
		Snapshots:        fromProtoSnapshotConfig(p.GetSnapshots()),
		KVEvents:         p.GetKvEvents(),
		EvictionPolicy:   p.GetEvictionPolicy(),
	}, nil
}

func fillProtoPool(m *kvxpb.Pool, p *kvcache.Pool) {
	m.Id = int64(p.ID)
	m.Name = p.Name
	m.Tier = string(p.Tier)
	m.Window = int64(p.Window)
	m.Layers = ints[int64](p.Layers)
	m.TokensPerBlock = int64(p.TokensPerBlock)
	m.BlockBytes = p.BlockBytes
	m.Blocks = int64(p.Blocks)
}

func fromProtoPool(m *kvxpb.Pool) kvcache.Pool {
	return kvcache.Pool{
		ID:             int(m.GetId()),
		Name:           m.GetName(),
		Tier:           kvcache.Tier(m.GetTier()),
		Window:         int(m.GetWindow()),
		Layers:         ints[int](m.GetLayers()),
		TokensPerBlock: int(m.GetTokensPerBlock()),
		BlockBytes:     m.GetBlockBytes(),
		Blocks:         int(m.GetBlocks()),
	}
}

func toProtoLayout(l kvcache.Layout) *kvxpb.Layout {
	pools := make([]kvxpb.Pool, len(l.Pools))
	for i := range l.Pools {
		fillProtoPool(&pools[i], &l.Pools[i])
	}
	return &kvxpb.Layout{
		Pools:        ptrs(pools),
		MaxSeqTokens: int64(l.MaxSeqTokens),
		MaxSequences: int64(l.MaxSequences),
		Warnings:     share(l.Warnings),
	}
}

func fromProtoLayout(p *kvxpb.Layout) kvcache.Layout {
	var pools []kvcache.Pool
	if ps := p.GetPools(); len(ps) > 0 {
		pools = make([]kvcache.Pool, len(ps))
		for i, m := range ps {
			pools[i] = fromProtoPool(m)
		}
	}
	return kvcache.Layout{
		Pools:        pools,
		MaxSeqTokens: int(p.GetMaxSeqTokens()),
		MaxSequences: int(p.GetMaxSequences()),
		Warnings:     share(p.GetWarnings()),
	}
}

// --- Lookup ---

// toProtoLookupRequest: with raw, the prompts travel as raw tokens
// (FeatureRawTokens).
func toProtoLookupRequest(items []kvcache.LookupItem, explain, raw bool) *kvxpb.LookupRequest {
	msgs := make([]kvxpb.LookupItem, len(items))
	for i := range items {
		msgs[i].Seq = uint64(items[i].Seq)
		if raw {
			msgs[i].PromptRaw = rawTokens(items[i].Prompt)
		} else {
			msgs[i].Prompt = share(items[i].Prompt)
		}
		msgs[i].CacheSalt = items[i].CacheSalt
		msgs[i].Now = items[i].Now
	}
	return &kvxpb.LookupRequest{Items: ptrs(msgs), Explain: explain}
}

func fromProtoLookupRequest(p *kvxpb.LookupRequest) ([]kvcache.LookupItem, error) {
	ms := p.GetItems()
	if len(ms) == 0 {
		return nil, nil
	}
	items := make([]kvcache.LookupItem, len(ms))
	for i, m := range ms {
		prompt, err := promptColumn(fmt.Sprintf("LookupRequest: items[%d]", i), "prompt", m.GetPrompt(), m.GetPromptRaw())
		if err != nil {
			return nil, err
		}
		items[i] = kvcache.LookupItem{Seq: kvcache.SeqID(m.GetSeq()), Prompt: prompt, CacheSalt: m.GetCacheSalt(), Now: m.GetNow()}
	}
	return items, nil
}

func toProtoLookupResponse(tokens []int) *kvxpb.LookupResponse {
	return &kvxpb.LookupResponse{Tokens: ints[int64](tokens)}
}

func fromProtoLookupResponse(p *kvxpb.LookupResponse) []int {
	return ints[int](p.GetTokens())
}

func toProtoExplainResponse(ex []kvcache.Explanation) *kvxpb.LookupResponse {
	n := len(ex)
	return &kvxpb.LookupResponse{
		Tokens:      tokensOf(ex),
		HostTokens:  column(n, func(i int) int64 { return int64(ex[i].HostTokens) }),
		Miss:        column(n, func(i int) int32 { return int32(ex[i].Miss) }),
		EvictedTier: column(n, func(i int) string { return string(ex[i].EvictedTier) }),
		EvictedBy:   column(n, func(i int) string { return ex[i].EvictedBy }),
		EvictedAt:   column(n, func(i int) int64 { return ex[i].EvictedAt }),
	}
}

func fromProtoExplainResponse(p *kvxpb.LookupResponse) ([]kvcache.Explanation, error) {
	const msg = "LookupResponse"
	tokens := p.GetTokens()
	n := len(tokens)
	host, err1 := optional(msg, "host_tokens", p.GetHostTokens(), n)
	miss, err2 := optional(msg, "miss", p.GetMiss(), n)
	tier, err3 := optional(msg, "evicted_tier", p.GetEvictedTier(), n)
	by, err4 := optional(msg, "evicted_by", p.GetEvictedBy(), n)
	when, err5 := optional(msg, "evicted_at", p.GetEvictedAt(), n)
	if err := firstErr(err1, err2, err3, err4, err5); err != nil || n == 0 {
		return nil, err
	}
	ex := make([]kvcache.Explanation, n)
	for i := range ex {
		ex[i] = kvcache.Explanation{
			Tokens:      int(tokens[i]),
			HostTokens:  int(at(host, i)),
			Miss:        kvcache.MissReason(at(miss, i)),
			EvictedTier: kvcache.Tier(at(tier, i)),
			EvictedBy:   at(by, i),
			EvictedAt:   at(when, i),
		}
	}
	return ex, nil
}

// --- Reserve ---

// toProtoReserveRequest: with raw, the prompt column travels as raw tokens
// (FeatureRawTokens).
func toProtoReserveRequest(items []kvcache.ReserveItem, raw bool) *kvxpb.ReserveRequest {
	n := len(items)
	m := &kvxpb.ReserveRequest{
		Seq:    make([]uint64, n),
		Tokens: column(n, func(i int) int64 { return int64(items[i].Tokens) }),
		Draft:  column(n, func(i int) int64 { return int64(items[i].Draft) }),
		Hold:   column(n, func(i int) int64 { return int64(items[i].Hold) }),
		New:    column(n, func(i int) bool { return items[i].New }),
		Reuse:  column(n, func(i int) int64 { return int64(items[i].Reuse) }),

		Priority:         column(n, func(i int) int64 { return int64(items[i].Priority) }),
		PriorityDuration: column(n, func(i int) int64 { return items[i].PriorityDuration }),
		Now:              column(n, func(i int) int64 { return items[i].Now }),
	}
	for i := range items {
		m.Seq[i] = uint64(items[i].Seq) // the count column is never left out
		if items[i].CacheSalt != "" {
			m.SaltItem = append(m.SaltItem, int32(i))
			m.Salt = append(m.Salt, items[i].CacheSalt)
		}
	}
	m.Seq = share(m.Seq)
	m.PromptLen, m.Prompt = concat(n, func(i int) []int32 { return items[i].Prompt })
	if raw {
		m.PromptRaw, m.Prompt = rawTokens(m.Prompt), nil // a view of the column concat made
	}
	return m
}

func fromProtoReserveRequest(p *kvxpb.ReserveRequest) ([]kvcache.ReserveItem, error) {
	const msg = "ReserveRequest"
	seq := p.GetSeq()
	n := len(seq)
	tokens, err1 := optional(msg, "tokens", p.GetTokens(), n)
	draft, err2 := optional(msg, "draft", p.GetDraft(), n)
	hold, err3 := optional(msg, "hold", p.GetHold(), n)
	isNew, err4 := optional(msg, "new", p.GetNew(), n)
	reuse, err5 := optional(msg, "reuse", p.GetReuse(), n)
	promptCol, err6 := promptColumn(msg, "prompt", p.GetPrompt(), p.GetPromptRaw())
	if err6 != nil {
		return nil, err6
	}
	prompt, err6 := newSplitter(msg, "prompt_len", "prompt", p.GetPromptLen(), promptCol, n)
	prio, err7 := optional(msg, "priority", p.GetPriority(), n)
	dur, err8 := optional(msg, "priority_duration", p.GetPriorityDuration(), n)
	now, err9 := optional(msg, "now", p.GetNow(), n)
	if err := firstErr(err1, err2, err3, err4, err5, err6, err7, err8, err9); err != nil || n == 0 {
		return nil, err
	}
	items := make([]kvcache.ReserveItem, n)
	for i := range items {
		items[i] = kvcache.ReserveItem{
			Seq:    kvcache.SeqID(seq[i]),
			Tokens: int(at(tokens, i)),
			Draft:  int(at(draft, i)),
			Hold:   int(at(hold, i)),
			New:    at(isNew, i),
			Prompt: prompt.part(i),
			Reuse:  int(at(reuse, i)),

			Priority:         int(at(prio, i)),
			PriorityDuration: at(dur, i),
			Now:              at(now, i),
		}
	}
	saltItem, salt := p.GetSaltItem(), p.GetSalt()
	if len(saltItem) != len(salt) {
		return nil, colError("%s: %d salt_item values for %d salts, want equal", msg, len(saltItem), len(salt))
	}
	for k, it := range saltItem {
		if it < 0 || int(it) >= n || (k > 0 && it <= saltItem[k-1]) {
			return nil, colError("%s: salt_item[%d] = %d, want 0..%d and increasing", msg, k, it, n-1)
		}
		items[it].CacheSalt = salt[k]
	}
	return items, nil
}

func firstErr(errs ...error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// --- Grants ---

func toProtoReserveResponse(gs []kvcache.Grant) *kvxpb.ReserveResponse {
	n := len(gs)
	if n == 0 {
		return &kvxpb.ReserveResponse{}
	}
	m := &kvxpb.ReserveResponse{Seq: make([]uint64, n), Ok: make([]bool, n)}
	for i := range gs {
		g := &gs[i]
		m.Seq[i] = uint64(g.Seq)
		m.Ok[i] = g.OK
		if g.Reason != "" {
			m.ReasonItem = append(m.ReasonItem, int32(i))
			m.Reason = append(m.Reason, g.Reason)
		}
	}
	m.Ok = trimZero(m.Ok)
	m.HostReused = column(n, func(i int) int64 { return int64(gs[i].HostReused) })
	m.Tables = toProtoTableDeltas(n, func(i int) []kvcache.TableDelta { return gs[i].Tables })
	m.Copies = toProtoCopies(n, func(i int) []kvcache.Copy { return gs[i].Copies })
	m.Snapshots = toProtoSnapshotSlots(n, func(i int) []kvcache.SnapshotSlot { return gs[i].Snapshots })
	return m
}

func fromProtoReserveResponse(p *kvxpb.ReserveResponse) ([]kvcache.Grant, error) {
	const msg = "ReserveResponse"
	seq := p.GetSeq()
	n := len(seq)
	ok, err := optional(msg, "ok", p.GetOk(), n)
	if err != nil {
		return nil, err
	}
	hostReused, err := optional(msg, "host_reused", p.GetHostReused(), n)
	if err != nil {
		return nil, err
	}
	reasonItem, reason := p.GetReasonItem(), p.GetReason()
	if len(reasonItem) != len(reason) {
		return nil, colError("%s: %d reason_item values for %d reasons, want equal", msg, len(reasonItem), len(reason))
	}
	gs := make([]kvcache.Grant, n)
	for i := range gs {
		gs[i] = kvcache.Grant{Seq: kvcache.SeqID(seq[i]), OK: at(ok, i), HostReused: int(at(hostReused, i))}
	}
	for k, it := range reasonItem {
		if it < 0 || int(it) >= n || (k > 0 && it <= reasonItem[k-1]) {
			return nil, colError("%s: reason_item[%d] = %d, want 0..%d and increasing", msg, k, it, n-1)
		}
		gs[it].Reason = reason[k]
	}
	if err := fromProtoTableDeltas(msg, p.GetTables(), n, func(i int, ds []kvcache.TableDelta) { gs[i].Tables = ds }); err != nil {
		return nil, err
	}
	if err := fromProtoCopies(msg, p.GetCopies(), n, func(i int, cs []kvcache.Copy) { gs[i].Copies = cs }); err != nil {
		return nil, err
	}
	if err := fromProtoSnapshotSlots(msg, p.GetSnapshots(), n, func(i int, ss []kvcache.SnapshotSlot) { gs[i].Snapshots = ss }); err != nil {
		return nil, err
	}
	return share(gs), nil
}

// --- Seqs, Commit, Suspend/Resume ---

func toProtoSeqs(seqs []kvcache.SeqID) *kvxpb.Seqs { return &kvxpb.Seqs{Seqs: fromSeqIDs(seqs)} }

func fromProtoSeqs(p *kvxpb.Seqs) []kvcache.SeqID { return toSeqIDs(p.GetSeqs()) }

func toProtoCommitRequest(items []kvcache.CommitItem) *kvxpb.CommitRequest {
	n := len(items)
	m := &kvxpb.CommitRequest{
		Seq:      make([]uint64, n),
		Accepted: column(n, func(i int) int64 { return int64(items[i].Accepted) }),
	}
	for i := range items {
		m.Seq[i] = uint64(items[i].Seq)
	}
	m.Seq = share(m.Seq)
	return m
}

func fromProtoCommitRequest(p *kvxpb.CommitRequest) ([]kvcache.CommitItem, error) {
	seq := p.GetSeq()
	accepted, err := optional("CommitRequest", "accepted", p.GetAccepted(), len(seq))
	if err != nil || len(seq) == 0 {
		return nil, err
	}
	items := make([]kvcache.CommitItem, len(seq))
	for i, s := range seq {
		items[i] = kvcache.CommitItem{Seq: kvcache.SeqID(s), Accepted: int(at(accepted, i))}
	}
	return items, nil
}

func toProtoCommitResult(r kvcache.CommitResult) *kvxpb.CommitResult {
	return &kvxpb.CommitResult{Copies: toProtoCopyList(r.Copies)}
}

func fromProtoCommitResult(p *kvxpb.CommitResult) (kvcache.CommitResult, error) {
	cs, err := fromProtoCopyList("CommitResult", p.GetCopies())
	return kvcache.CommitResult{Copies: cs}, err
}

func toProtoMoveResult(ok []bool, copies []kvcache.Copy) *kvxpb.MoveResult {
	return &kvxpb.MoveResult{Ok: share(ok), Copies: toProtoCopyList(copies)}
}

func fromProtoMoveResult(p *kvxpb.MoveResult) ([]bool, []kvcache.Copy, error) {
	cs, err := fromProtoCopyList("MoveResult", p.GetCopies())
	return share(p.GetOk()), cs, err
}

// --- Stats and Inspect ---

func fillProtoPoolStats(m *kvxpb.PoolStats, s *kvcache.PoolStats) {
	m.Pool = int64(s.Pool)
	m.Total = int64(s.Total)
	m.Free = int64(s.Free)
	m.Cached = int64(s.Cached)
	m.InUse = int64(s.InUse)
}

func fromProtoPoolStats(m *kvxpb.PoolStats) kvcache.PoolStats {
	return kvcache.PoolStats{
		Pool:   int(m.GetPool()),
		Total:  int(m.GetTotal()),
		Free:   int(m.GetFree()),
		Cached: int(m.GetCached()),
		InUse:  int(m.GetInUse()),
	}
}

func protoPoolStats(ss []kvcache.PoolStats) []*kvxpb.PoolStats {
	msgs := make([]kvxpb.PoolStats, len(ss))
	for i := range ss {
		fillProtoPoolStats(&msgs[i], &ss[i])
	}
	return ptrs(msgs)
}

func goPoolStats(ms []*kvxpb.PoolStats) []kvcache.PoolStats {
	if len(ms) == 0 {
		return nil
	}
	ss := make([]kvcache.PoolStats, len(ms))
	for i, m := range ms {
		ss[i] = fromProtoPoolStats(m)
	}
	return ss
}

func toProtoSnapshotStats(s kvcache.SnapshotStats) *kvxpb.SnapshotStats {
	return &kvxpb.SnapshotStats{Taken: s.Taken, Skipped: s.Skipped, Evicted: s.Evicted, ReusedTokens: s.ReusedTokens}
}

func fromProtoSnapshotStats(p *kvxpb.SnapshotStats) kvcache.SnapshotStats {
	return kvcache.SnapshotStats{
		Taken:        p.GetTaken(),
		Skipped:      p.GetSkipped(),
		Evicted:      p.GetEvicted(),
		ReusedTokens: p.GetReusedTokens(),
	}
}

func toProtoStats(s kvcache.Stats) *kvxpb.ManagerStats {
	return &kvxpb.ManagerStats{
		Pools:          protoPoolStats(s.Pools),
		Sequences:      int64(s.Sequences),
		LookupTokens:   s.LookupTokens,
		ReusedTokens:   s.ReusedTokens,
		Evictions:      s.Evictions,
		Snapshots:      toProtoSnapshotStats(s.Snapshots),
		SuspendedSeqs:  int64(s.SuspendedSeqs),
		ReserveDenials: s.ReserveDenials,
	}
}

func fromProtoStats(p *kvxpb.ManagerStats) kvcache.Stats {
	return kvcache.Stats{
		Pools:          goPoolStats(p.GetPools()),
		Sequences:      int(p.GetSequences()),
		LookupTokens:   p.GetLookupTokens(),
		ReusedTokens:   p.GetReusedTokens(),
		Evictions:      p.GetEvictions(),
		Snapshots:      fromProtoSnapshotStats(p.GetSnapshots()),
		SuspendedSeqs:  int(p.GetSuspendedSeqs()),
		ReserveDenials: p.GetReserveDenials(),
	}
}

func toProtoInspectOptions(o kvcache.InspectOptions) *kvxpb.InspectOptions {
	return &kvxpb.InspectOptions{Tables: o.Tables, CheckTables: o.CheckTables}
}

func fromProtoInspectOptions(p *kvxpb.InspectOptions) kvcache.InspectOptions {
	return kvcache.InspectOptions{Tables: p.GetTables(), CheckTables: p.GetCheckTables()}
}

func toProtoSeqState(s *kvcache.SeqState) *kvxpb.SeqState {
	m := &kvxpb.SeqState{
		Seq:       uint64(s.Seq),
		History:   int64(s.History),
		Capacity:  int64(s.Capacity),
		Reserved:  int64(s.Reserved),
		Draft:     int64(s.Draft),
		Hold:      int64(s.Hold),
		Suspended: s.Suspended,
		Blocks:    ints[int64](s.Blocks),
	}
	if len(s.Tables) > 0 {
		tables := make([]kvxpb.BlockTable, len(s.Tables))
		for i, t := range s.Tables {
			tables[i].Blocks = ints[int32](t)
		}
		m.Tables = ptrs(tables)
	}
	return m
}

func fromProtoSeqState(m *kvxpb.SeqState) kvcache.SeqState {
	s := kvcache.SeqState{
		Seq:       kvcache.SeqID(m.GetSeq()),
		History:   int(m.GetHistory()),
		Capacity:  int(m.GetCapacity()),
		Reserved:  int(m.GetReserved()),
		Draft:     int(m.GetDraft()),
		Hold:      int(m.GetHold()),
		Suspended: m.GetSuspended(),
		Blocks:    ints[int](m.GetBlocks()),
	}
	if ts := m.GetTables(); len(ts) > 0 {
		s.Tables = make([][]kvcache.BlockID, len(ts))
		for i, t := range ts {
			s.Tables[i] = ints[kvcache.BlockID](t.GetBlocks())
		}
	}
	return s
}

func toProtoSnapshot(s kvcache.Snapshot) *kvxpb.Snapshot {
	m := &kvxpb.Snapshot{Pools: protoPoolStats(s.Pools), Violations: share(s.Violations), TablesChecked: s.TablesChecked}
	// Columns hold sequences without tables that all count blocks in the
	// same number of pools (every real snapshot); anything else goes as
	// messages.
	asMessages := false
	for i := range s.Seqs {
		asMessages = asMessages || len(s.Seqs[i].Tables) > 0 || len(s.Seqs[i].Blocks) != len(s.Seqs[0].Blocks)
	}
	switch {
	case asMessages:
		m.Seqs = make([]*kvxpb.SeqState, len(s.Seqs))
		for i := range s.Seqs {
			m.Seqs[i] = toProtoSeqState(&s.Seqs[i])
		}
	case len(s.Seqs) > 0:
		m.SeqColumns = toProtoSeqColumns(s.Seqs)
	}
	if len(s.RefCounts) > 0 {
		rc := make([]kvxpb.RefCounts, len(s.RefCounts))
		for i, c := range s.RefCounts {
			rc[i].Counts = share(c)
		}
		m.RefCounts = ptrs(rc)
	}
	return m
}

// toProtoSeqColumns encodes sequences without tables, each with as many
// block counts as the first, as columns.
func toProtoSeqColumns(seqs []kvcache.SeqState) *kvxpb.SeqColumns {
	n := len(seqs)
	pools := len(seqs[0].Blocks)
	c := &kvxpb.SeqColumns{
		Seq:       make([]uint64, n),
		History:   make([]int64, n),
		Capacity:  make([]int64, n),
		Reserved:  column(n, func(i int) int64 { return int64(seqs[i].Reserved) }),
		Draft:     column(n, func(i int) int64 { return int64(seqs[i].Draft) }),
		Hold:      column(n, func(i int) int64 { return int64(seqs[i].Hold) }),
		Suspended: column(n, func(i int) bool { return seqs[i].Suspended }),
		Pools:     uint32(pools),
	}
	if pools > 0 {
		c.Blocks = make([]int64, n*pools)
	}
	for i := range seqs {
		s := &seqs[i]
		c.Seq[i], c.History[i], c.Capacity[i] = uint64(s.Seq), int64(s.History), int64(s.Capacity)
		for p, b := range s.Blocks {
			c.Blocks[i*pools+p] = int64(b)
		}
	}
	return c
}

// fromProtoSeqColumns decodes toProtoSeqColumns' columns.
func fromProtoSeqColumns(c *kvxpb.SeqColumns) ([]kvcache.SeqState, error) {
	const msg = "Snapshot.seq_columns"
	n := len(c.GetSeq())
	if len(c.GetHistory()) != n || len(c.GetCapacity()) != n {
		return nil, colError("%s: %d seq, %d history and %d capacity values, want one each per sequence", msg, n, len(c.GetHistory()), len(c.GetCapacity()))
	}
	reserved, err := optional(msg, "reserved", c.GetReserved(), n)
	if err != nil {
		return nil, err
	}
	draft, err := optional(msg, "draft", c.GetDraft(), n)
	if err != nil {
		return nil, err
	}
	hold, err := optional(msg, "hold", c.GetHold(), n)
	if err != nil {
		return nil, err
	}
	suspended, err := optional(msg, "suspended", c.GetSuspended(), n)
	if err != nil {
		return nil, err
	}
	pools := int(c.GetPools())
	if pools > 1<<16 || len(c.GetBlocks()) != n*pools {
		return nil, colError("%s: %d blocks values for %d sequences of %d pools", msg, len(c.GetBlocks()), n, pools)
	}
	seqs := make([]kvcache.SeqState, n)
	blocks := make([]int, n*pools)
	for i, b := range c.GetBlocks() {
		blocks[i] = int(b)
	}
	for i := range seqs {
		seqs[i] = kvcache.SeqState{
			Seq: kvcache.SeqID(c.Seq[i]), History: int(c.History[i]), Capacity: int(c.Capacity[i]),
			Reserved: int(at(reserved, i)), Draft: int(at(draft, i)), Hold: int(at(hold, i)), Suspended: at(suspended, i),
		}
		if pools > 0 {
			seqs[i].Blocks = blocks[i*pools : (i+1)*pools : (i+1)*pools]
		}
	}
	return seqs, nil
}

func fromProtoSnapshot(p *kvxpb.Snapshot) (kvcache.Snapshot, error) {
	s := kvcache.Snapshot{Pools: goPoolStats(p.GetPools()), Violations: share(p.GetViolations()), TablesChecked: p.GetTablesChecked()}
	if ms := p.GetSeqs(); len(ms) > 0 {
		s.Seqs = make([]kvcache.SeqState, len(ms))
		for i, m := range ms {
			s.Seqs[i] = fromProtoSeqState(m)
		}
	}
	if c := p.GetSeqColumns(); c != nil {
		if len(s.Seqs) > 0 {
			return s, colError("Snapshot: sequences both as messages and as columns")
		}
		seqs, err := fromProtoSeqColumns(c)
		if err != nil {
			return s, err
		}
		s.Seqs = seqs
	}
	if rc := p.GetRefCounts(); len(rc) > 0 {
		s.RefCounts = make([][]int32, len(rc))
		for i, c := range rc {
			s.RefCounts[i] = share(c.GetCounts())
		}
	}
	return s, nil
}

func toProtoEndStepRequest(r pipeline.EndStepRequest) *kvxpb.EndStepRequest {
	p := &kvxpb.EndStepRequest{Commit: toProtoCommitRequest(r.Commits), Release: toProtoSeqs(r.Release)}
	if r.Inspect != nil {
		p.Inspect = toProtoInspectOptions(*r.Inspect)
	}
	return p
}

func fromProtoEndStepRequest(p *kvxpb.EndStepRequest) (pipeline.EndStepRequest, error) {
	commits, err := fromProtoCommitRequest(p.GetCommit())
	if err != nil {
		return pipeline.EndStepRequest{}, err
	}
	r := pipeline.EndStepRequest{Commits: commits, Release: fromProtoSeqs(p.GetRelease())}
	if p.GetInspect() != nil {
		o := fromProtoInspectOptions(p.GetInspect())
		r.Inspect = &o
	}
	return r, nil
}

func toProtoEndStepResult(r pipeline.EndStepResult) *kvxpb.EndStepResult {
	p := &kvxpb.EndStepResult{Commit: toProtoCommitResult(r.Commit)}
	if r.Snapshot != nil {
		p.Snapshot = toProtoSnapshot(*r.Snapshot)
	}
	return p
}

func fromProtoEndStepResult(p *kvxpb.EndStepResult) (pipeline.EndStepResult, error) {
	c, err := fromProtoCommitResult(p.GetCommit())
	if err != nil {
		return pipeline.EndStepResult{}, err
	}
	r := pipeline.EndStepResult{Commit: c}
	if p.GetSnapshot() != nil {
		s, err := fromProtoSnapshot(p.GetSnapshot())
		r.Snapshot = &s
		if err != nil {
			return r, err
		}
	}
	return r, nil
}

// --- KV events ---

func toProtoEvents(evs []kvcache.Event) *kvxpb.EventList {
	if len(evs) == 0 {
		return &kvxpb.EventList{}
	}
	msgs := make([]kvxpb.Event, len(evs))
	for i, e := range evs {
		msgs[i] = kvxpb.Event{
			Kind: int32(e.Kind), Hashes: share(e.Hashes), Parent: e.Parent, HasParent: e.HasParent,
			Tokens: share(e.Tokens), BlockSize: int64(e.BlockSize), Tier: string(e.Tier),
		}
	}
	return &kvxpb.EventList{Events: ptrs(msgs)}
}

func fromProtoEvents(p *kvxpb.EventList) []kvcache.Event {
	ms := p.GetEvents()
	if len(ms) == 0 {
		return nil
	}
	evs := make([]kvcache.Event, len(ms))
	for i, m := range ms {
		evs[i] = kvcache.Event{
			Kind: kvcache.EventKind(m.GetKind()), Hashes: share(m.GetHashes()), Parent: m.GetParent(), HasParent: m.GetHasParent(),
			Tokens: share(m.GetTokens()), BlockSize: int(m.GetBlockSize()), Tier: kvcache.Tier(m.GetTier()),
		}
	}
	return evs
}

// tokensOf is the tokens column of an explained lookup: always complete.
func tokensOf(ex []kvcache.Explanation) []int64 {
	out := make([]int64, len(ex))
	for i := range ex {
		out[i] = int64(ex[i].Tokens)
	}
	return out
}
