package conformance

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
	"github.com/kvx-dev/kvx/plugins/v1/spec"
)

// ManagerOptions shape the configuration the manager checks use. The zero
// value is a good default: the suite's small model, 16 tokens per block and
// a device budget of about 160 blocks.
type ManagerOptions struct {
	// Layers are the stage's layers. nil: SmallModel of the first of dsa,
	// mla and gqa that Info's Capabilities.Mixers lists (dsa has an MTP
	// layer, as in seed A).
	Layers []spec.Layer
	// TokensPerBlock; 0: 16.
	TokensPerBlock int
	// DeviceBytes of the stage's cache; 0: 160 blocks of Layers.
	DeviceBytes int64
	// HostBytes of the host tier, used only when Info says HostTier; 0:
	// half of DeviceBytes.
	HostBytes int64
	// MaxSeqLen, MaxNumTokens, MaxBatchSize and MaxDraftTokens of the
	// config; 0: 1024, 256, 8 and 2. Draft tokens are part of most checks
	// (seed A), so MaxDraftTokens is at least 1.
	MaxSeqLen, MaxNumTokens, MaxBatchSize, MaxDraftTokens int
	// Reuse, when Info says PrefixReuse, turns EnableBlockReuse on where it
	// matters (Configure, Lookup, Ownership, Stats, EmptyCalls, Random) and
	// runs the Reuse and UnreserveEviction checks, which are skipped
	// otherwise.
	Reuse bool
	// Seed of the random driver; 0: 1. RandomOps is its number of
	// operations; 0: 2000.
	Seed      uint64
	RandomOps int
	// Checks runs only the named checks (see ManagerChecks); nil: all.
	Checks []string
	// CheckTimeout bounds each check; 0: none.
	CheckTimeout time.Duration
	// Logf, when set, receives one line per run of the random driver with
	// its seed.
	Logf func(format string, args ...any)
}

// CheckManager runs every manager check (ManagerChecks), each on a fresh
// manager from factory, and returns errors.Join of one *Violation per failed
// check (nil when all pass). Use Violations to get them back. An error
// that is not a violation means the options are wrong (an unknown check
// name, layers without a built-in model). See the package doc for what the
// factory may return.
func CheckManager(ctx context.Context, factory func() kvcache.Manager, opts ManagerOptions) error {
	return runChecks(managerChecks, opts.Checks, func(c check[*mh]) *Violation {
		return runManagerCheck(ctx, factory, opts, c)
	})
}

// TestManager runs CheckManager and reports each violation with t.Error.
func TestManager(t *testing.T, factory func() kvcache.Manager, opts ManagerOptions) {
	t.Helper()
	if opts.Logf == nil {
		opts.Logf = t.Logf
	}
	testReport(t, CheckManager(context.Background(), factory, opts))
}

// ManagerChecks lists the names of the manager checks in the order they run
// (ManagerCheckDocs gives each one's rule).
func ManagerChecks() []string {
	return checkNames(managerChecks)
}

// ManagerCheckDocs returns each manager check's one-line rule by name.
func ManagerCheckDocs() map[string]string {
	return checkDocs(managerChecks)
}

func runManagerCheck(ctx context.Context, factory func() kvcache.Manager, opts ManagerOptions, c check[*mh]) *Violation {
	ctx, cancel := checkCtx(ctx, opts.CheckTimeout)
	defer cancel()
	var m kvcache.Manager
	defer func() { closeIfCloser(m) }()
	return runOne(c.name, func() {
		m = factory()
		if m == nil {
			panic(failure{&Violation{Call: "factory()", Got: "nil", Want: "a kvcache.Manager"}})
		}
		sp, _ := m.(kvcache.Suspender)
		c.run(&mh{ctx: ctx, m: m, sp: sp, o: opts, check: c.name})
	})
}

// mh is the harness of one check on one manager.
type mh struct {
	ctx   context.Context
	m     kvcache.Manager
	sp    kvcache.Suspender // m, when it implements one; nil: no suspend checks
	o     ManagerOptions    // defaults filled in by setup
	check string

	info   kvcache.Info
	cfg    kvcache.Config
	layout kvcache.Layout
	tpb    int
	idx    map[int]int // pool id -> index in layout.Pools
	full   []int       // indexes of full-attention device pools

	// shadow is the worker's view of each sequence's tables (by pool index):
	// the deltas of the grants that were committed. pending holds the deltas
	// of outstanding grants: Unreserve drops them (the core rolls a step back
	// before any forward), Commit applies them.
	shadow  map[kvcache.SeqID][][]kvcache.BlockID
	pending map[kvcache.SeqID][]kvcache.TableDelta

	snap   kvcache.Snapshot // the last deep Inspect
	last   string           // the last call that changed the manager
	nextID kvcache.SeqID
}

// failf stops the check with a violation.
func (h *mh) failf(call, want, format string, args ...any) {
	panic(failure{&Violation{Call: call, Got: fmt.Sprintf(format, args...), Want: want}})
}

// callInfo calls Info, which must not fail.
func (h *mh) callInfo() kvcache.Info {
	info, err := h.m.Info(h.ctx)
	if err != nil {
		h.failf("Info()", "Info answers first, before Configure, without error", "error %v", err)
	}
	return info
}

// setup calls Info, fills the options' defaults and configures the manager.
// reuse asks for EnableBlockReuse (when the manager has PrefixReuse and the
// options ask for reuse). edit, when set, changes the config first.
func (h *mh) setup(reuse bool, edit func(*kvcache.Config)) {
	h.info = h.callInfo()
	h.cfg = h.config(reuse)
	if edit != nil {
		edit(&h.cfg)
	}
	layout, err := h.m.Configure(h.ctx, h.cfg)
	if err != nil {
		h.failf("Configure("+fmtConfig(h.cfg)+")", "a budget that holds one max_seq_len request and one max_num_tokens chunk configures",
			"error %v", err)
	}
	h.useLayout(layout)
	h.last = "Configure(" + fmtConfig(h.cfg) + ")"
	h.inspect()
}

// config returns the check's config, with the options' defaults.
func (h *mh) config(reuse bool) kvcache.Config {
	o := &h.o
	if o.Layers == nil {
		mx := pickMixer(h.info.Capabilities.Mixers, spec.MixerDSA, spec.MixerMLA, spec.MixerGQA)
		if mx == "" {
			h.failf("Info()", "ManagerOptions.Layers set, or Capabilities.Mixers listing one of dsa, mla, gqa (the built-in models)",
				"Capabilities.Mixers %v", h.info.Capabilities.Mixers)
		}
		m, _ := SmallModel(mx)
		o.Layers = m.Layers
	}
	if o.TokensPerBlock == 0 {
		o.TokensPerBlock = 16
	}
	if o.MaxSeqLen == 0 {
		o.MaxSeqLen = 1024
	}
	if o.MaxNumTokens == 0 {
		o.MaxNumTokens = 256
	}
	if o.MaxBatchSize == 0 {
		o.MaxBatchSize = 8
	}
	if o.MaxDraftTokens == 0 {
		o.MaxDraftTokens = 2
	}
	if o.DeviceBytes == 0 {
		o.DeviceBytes = 160 * int64(o.TokensPerBlock) * bytesPerToken(o.Layers)
	}
	if o.HostBytes == 0 {
		o.HostBytes = o.DeviceBytes / 2
	}
	if o.Seed == 0 {
		o.Seed = 1
	}
	if o.RandomOps == 0 {
		o.RandomOps = 2000
	}
	cfg := kvcache.Config{
		Stage: 0, Stages: 1,
		Layers:         slices.Clone(o.Layers),
		TokensPerBlock: o.TokensPerBlock,
		DeviceBytes:    o.DeviceBytes,
		MaxBatchSize:   o.MaxBatchSize,
		MaxNumTokens:   o.MaxNumTokens,
		MaxSeqLen:      o.MaxSeqLen,
		MaxDraftTokens: o.MaxDraftTokens,
	}
	if h.info.Capabilities.HostTier {
		cfg.HostBytes = o.HostBytes
	}
	cfg.EnableBlockReuse = reuse && h.reuseOn()
	return cfg
}

// reuseOn reports whether the prefix-reuse checks run.
func (h *mh) reuseOn() bool { return h.o.Reuse && h.info.Capabilities.PrefixReuse }

func (h *mh) useLayout(l kvcache.Layout) {
	l.Pools = slices.Clone(l.Pools)
	for i := range l.Pools {
		l.Pools[i].Layers = slices.Clone(l.Pools[i].Layers)
	}
	h.layout = l
	h.tpb = h.cfg.TokensPerBlock
	h.idx = map[int]int{}
	h.full = nil
	for i, p := range l.Pools {
		h.idx[p.ID] = i
		if p.Tier == kvcache.TierDevice && p.Window == 0 && p.TokensPerBlock > 0 {
			h.full = append(h.full, i)
		}
	}
	h.shadow = map[kvcache.SeqID][][]kvcache.BlockID{}
	h.pending = map[kvcache.SeqID][]kvcache.TableDelta{}
	if len(h.full) == 0 {
		h.failf("Configure("+fmtConfig(h.cfg)+")", "a layout with a full-attention device pool for the suite's full-attention layers",
			"pools %s", fmtPools(l.Pools))
	}
}

// id returns a fresh sequence id.
func (h *mh) id() kvcache.SeqID {
	h.nextID++
	return 1000 + h.nextID
}

// inspect takes a deep Inspect, checks the invariants and keeps it in h.snap.
func (h *mh) inspect() kvcache.Snapshot {
	s, err := h.m.Inspect(h.ctx, kvcache.InspectOptions{Tables: true})
	if err != nil {
		h.failf("Inspect(Tables) after "+h.last, "Inspect answers", "error %v", err)
	}
	if bad := h.invariants(s); len(bad) > 0 {
		h.failf(h.last+", then Inspect(Tables)", "the ledger and pool invariants hold at every observable point",
			"%s", strings.Join(bad, "; "))
	}
	h.snap = s
	return s
}

// seqOf returns id's state in s, nil when absent.
func seqOf(s kvcache.Snapshot, id kvcache.SeqID) *kvcache.SeqState {
	for i := range s.Seqs {
		if s.Seqs[i].Seq == id {
			return &s.Seqs[i]
		}
	}
	return nil
}

// mustSeq returns id's state in the last snapshot or fails.
func (h *mh) mustSeq(id kvcache.SeqID) *kvcache.SeqState {
	st := seqOf(h.snap, id)
	if st == nil {
		h.failf(h.last+", then Inspect", "a live sequence is listed by Inspect", "seq %d missing; Inspect lists %s", id, fmtSeqIDs(h.snap))
	}
	return st
}

// reserveRaw calls Reserve and checks the answer's shape and table deltas;
// it applies nothing to the shadow.
func (h *mh) reserveRaw(items []kvcache.ReserveItem) ([]kvcache.Grant, error) {
	h.last = "Reserve(" + fmtReserve(items) + ")"
	gs, err := h.m.Reserve(h.ctx, items)
	if err != nil {
		return gs, err
	}
	if len(gs) != len(items) {
		h.failf(h.last, "one Grant per item, in order", "%d grants for %d items", len(gs), len(items))
	}
	for i, g := range gs {
		if g.Seq != items[i].Seq {
			h.failf(h.last, "one Grant per item, in order", "grant %d is for seq %d, item %d is seq %d", i, g.Seq, i, items[i].Seq)
		}
		if !g.OK && (len(g.Tables) > 0 || len(g.Copies) > 0) {
			h.failf(h.last, "a denial leaves no trace in the manager (and tells the worker nothing)",
				"seq %d denied (%q) with %d table deltas and %d copies", g.Seq, g.Reason, len(g.Tables), len(g.Copies))
		}
		if !g.OK && !strings.ContainsAny(g.Reason, "0123456789") {
			h.failf(h.last, "a denial says why, with the numbers (Grant.Reason)", "seq %d denied with Reason %q", g.Seq, g.Reason)
		}
		for _, c := range g.Copies {
			h.checkCopy(c, "Grant.Copies of seq "+fmt.Sprint(g.Seq))
		}
		h.checkSnapshotSlots(g)
	}
	return gs, nil
}

// checkSnapshotSlots: a grant's state saves name blocks of state pools of
// the layout, at increasing positions; a denial names none.
func (h *mh) checkSnapshotSlots(g kvcache.Grant) {
	const want = "Grant.Snapshots name blocks of state pools (TokensPerBlock 0) of the layout, at increasing positions > 0; a denial has none"
	if !g.OK && len(g.Snapshots) > 0 {
		h.failf(h.last, want, "seq %d denied with snapshot slots %v", g.Seq, g.Snapshots)
		return
	}
	for k, ss := range g.Snapshots {
		i := slices.IndexFunc(h.layout.Pools, func(p kvcache.Pool) bool { return p.ID == ss.Pool })
		switch {
		case i < 0:
			h.failf(h.last, want, "seq %d: snapshot slot %d names pool %d, not in the layout", g.Seq, k, ss.Pool)
		case h.layout.Pools[i].TokensPerBlock != 0:
			h.failf(h.last, want, "seq %d: snapshot slot %d names pool %d (%s), a paged pool", g.Seq, k, ss.Pool, h.layout.Pools[i].Name)
		case ss.Block < 0 || int(ss.Block) >= h.layout.Pools[i].Blocks:
			h.failf(h.last, want, "seq %d: snapshot slot %d: block %d outside pool %d of %d blocks", g.Seq, k, ss.Block, ss.Pool, h.layout.Pools[i].Blocks)
		case ss.Pos <= 0 || (k > 0 && ss.Pos <= g.Snapshots[k-1].Pos):
			h.failf(h.last, want, "seq %d: snapshot positions %v", g.Seq, g.Snapshots)
		}
	}
}

// reserve calls Reserve, which must not fail; it records the grants'
// deltas as pending, takes a deep Inspect and checks that every granted,
// resident sequence's tables (what the worker learns from the deltas) equal
// the manager's in every full-attention device pool.
func (h *mh) reserve(items ...kvcache.ReserveItem) []kvcache.Grant {
	gs, err := h.reserveRaw(items)
	if err != nil {
		h.failf(h.last, "Reserve fails only when the plugin is gone; a denial is OK=false with a Reason, never an error", "error %v", err)
	}
	for _, g := range gs {
		if g.OK {
			h.pending[g.Seq] = cloneDeltas(g.Tables)
		}
	}
	h.inspect()
	for _, g := range gs {
		if !g.OK {
			continue
		}
		st := h.mustSeq(g.Seq)
		if st.Suspended {
			h.failf(h.last, "a granted sequence is resident", "seq %d granted while Inspect says it is suspended", g.Seq)
		}
		tables := h.workerTables(g.Seq)
		for _, p := range h.full {
			if !slices.Equal(tables[p], st.Tables[p]) {
				h.failf(h.last, "the worker's table (the committed grants' deltas, then this grant's: table = table[:From] ++ Blocks) equals the manager's",
					"seq %d pool %d: worker's table %v, Inspect's table %v (deltas %s)", g.Seq, h.layout.Pools[p].ID, tables[p], st.Tables[p], fmtDeltas(g.Tables))
			}
		}
	}
	return gs
}

func cloneDeltas(ds []kvcache.TableDelta) []kvcache.TableDelta {
	out := slices.Clone(ds)
	for i := range out {
		out[i].Blocks = slices.Clone(out[i].Blocks)
	}
	return out
}

// grant reserves one item that must be granted and returns its state.
func (h *mh) grant(it kvcache.ReserveItem) (kvcache.Grant, *kvcache.SeqState) {
	g := h.reserve(it)[0]
	if !g.OK {
		h.failf(h.last, "a reservation that fits in free blocks is granted (the layout's guarantee)",
			"denied: %q; pools before: %s", g.Reason, fmtPoolStats(h.snap.Pools))
	}
	return g, h.mustSeq(it.Seq)
}

// workerTables applies seq's pending deltas to a copy of its shadow tables,
// failing on a delta the worker could not apply.
func (h *mh) workerTables(id kvcache.SeqID) [][]kvcache.BlockID {
	t := make([][]kvcache.BlockID, len(h.layout.Pools))
	for i, b := range h.shadow[id] {
		t[i] = slices.Clone(b)
	}
	for _, d := range h.pending[id] {
		p, ok := h.idx[d.Pool]
		if !ok {
			h.failf(h.last, "TableDelta.Pool is a pool of the layout", "seq %d: delta for pool %d; the layout has %s", id, d.Pool, fmtPools(h.layout.Pools))
		}
		if d.From < 0 || d.From > len(t[p]) {
			h.failf(h.last, "TableDelta.From is within the table the worker holds (table = table[:From] ++ Blocks)",
				"seq %d pool %d: From %d, the worker's table has %d blocks (%v)", id, d.Pool, d.From, len(t[p]), t[p])
		}
		t[p] = append(t[p][:d.From], d.Blocks...)
	}
	return t
}

// commitRaw calls Commit and returns its error; on success of an item the
// pending deltas of its sequence become the worker's.
func (h *mh) commitRaw(items []kvcache.CommitItem) (kvcache.CommitResult, error) {
	h.last = "Commit(" + fmtCommit(items) + ")"
	res, err := h.m.Commit(h.ctx, items)
	var bad []kvcache.SeqID
	if err != nil {
		var e *kvcache.Error
		if errors.As(err, &e) {
			bad = e.Seqs
		}
	}
	for _, it := range items {
		if _, ok := h.pending[it.Seq]; ok && !slices.Contains(bad, it.Seq) {
			h.shadow[it.Seq] = h.workerTables(it.Seq)
			delete(h.pending, it.Seq)
		}
	}
	for _, c := range res.Copies {
		h.checkCopy(c, "CommitResult.Copies")
	}
	return res, err
}

// commit calls Commit, which must not fail, and inspects.
func (h *mh) commit(items ...kvcache.CommitItem) kvcache.CommitResult {
	before := h.snap
	res, err := h.commitRaw(items)
	if err != nil {
		h.failf(h.last, "Commit of reserved sequences with Tokens <= Accepted <= Tokens+Draft cannot fail", "error %v", err)
	}
	h.inspect()
	h.noAlloc(before)
	return res
}

// noAlloc checks that no block unreferenced in before is referenced now:
// Commit never allocates.
func (h *mh) noAlloc(before kvcache.Snapshot) {
	for p := range before.RefCounts {
		for b, r := range before.RefCounts[p] {
			if r == 0 && h.snap.RefCounts[p][b] > 0 {
				h.failf(h.last, "Commit never allocates", "pool %d block %d was unreferenced before and is referenced after", h.layout.Pools[p].ID, b)
			}
		}
	}
}

// unreserve calls Unreserve, which must not fail, and inspects.
func (h *mh) unreserve(seqs ...kvcache.SeqID) {
	h.last = fmt.Sprintf("Unreserve(%v)", seqs)
	if err := h.m.Unreserve(h.ctx, seqs); err != nil {
		h.failf(h.last, "Unreserve of sequences with an outstanding reservation succeeds", "error %v", err)
	}
	h.dropPending(seqs)
	h.inspect()
}

func (h *mh) dropPending(seqs []kvcache.SeqID) {
	for _, s := range seqs {
		delete(h.pending, s)
		if len(h.shadow[s]) == 0 {
			delete(h.shadow, s)
		}
	}
}

// release calls Release, which must not fail, and inspects.
func (h *mh) release(seqs ...kvcache.SeqID) {
	h.last = fmt.Sprintf("Release(%v)", seqs)
	if err := h.m.Release(h.ctx, seqs); err != nil {
		h.failf(h.last, "Release of live sequences succeeds", "error %v", err)
	}
	for _, s := range seqs {
		delete(h.pending, s)
		delete(h.shadow, s)
	}
	h.inspect()
	for _, s := range seqs {
		if seqOf(h.snap, s) != nil {
			h.failf(h.last, "Release frees the sequence", "seq %d still listed by Inspect: %s", s, fmtSeq(*seqOf(h.snap, s)))
		}
	}
}

// prefill creates a sequence and commits n > 0 tokens in chunks of at most
// MaxNumTokens; it returns the sequence's state.
func (h *mh) prefill(id kvcache.SeqID, prompt []int32, n int) *kvcache.SeqState {
	for done := 0; done < n; {
		chunk := min(n-done, h.cfg.MaxNumTokens)
		it := kvcache.ReserveItem{Seq: id, Tokens: chunk}
		if done == 0 {
			it.New = true
			if h.cfg.EnableBlockReuse {
				it.Prompt = prompt
			}
		}
		h.grant(it)
		h.commit(kvcache.CommitItem{Seq: id, Accepted: chunk})
		done += chunk
	}
	return h.mustSeq(id)
}

// stats calls Stats, which must not fail.
func (h *mh) stats() kvcache.Stats {
	st, err := h.m.Stats(h.ctx)
	if err != nil {
		h.failf("Stats() after "+h.last, "Stats answers", "error %v", err)
	}
	return st
}

// checkCopy checks that c names pools of the layout and blocks inside them.
func (h *mh) checkCopy(c kvcache.Copy, where string) {
	for _, end := range []struct {
		pool  int
		block kvcache.BlockID
	}{{c.SrcPool, c.SrcBlock}, {c.DstPool, c.DstBlock}} {
		p, ok := h.idx[end.pool]
		if !ok || end.block < 0 || int(end.block) >= h.layout.Pools[p].Blocks {
			h.failf(h.last, "copies name pools of the layout and blocks inside them", "%s: %+v", where, c)
		}
	}
}

// itemErr checks that err is an item-scoped KindInvalidArg error naming every
// seq of bad and none of good.
func (h *mh) itemErr(err error, bad, good []kvcache.SeqID, want string) {
	if err == nil {
		h.failf(h.last, want, "nil error")
	}
	var e *kvcache.Error
	if !errors.As(err, &e) || e.Kind != kvcache.KindInvalidArg {
		h.failf(h.last, want+" (a *kvcache.Error of kind KindInvalidArg)", "error %v (kind %v)", err, kvcache.KindOf(err))
	}
	for _, s := range bad {
		if !slices.Contains(e.Seqs, s) {
			h.failf(h.last, want+" (Error.Seqs names every bad sequence)", "Seqs %v lack seq %d; error %q", e.Seqs, s, err.Error())
		}
	}
	for _, s := range good {
		if slices.Contains(e.Seqs, s) {
			h.failf(h.last, want+" (Error.Seqs names only the bad sequences)", "Seqs %v name the valid seq %d; error %q", e.Seqs, s, err.Error())
		}
	}
}
