package conformance

import (
	"errors"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
	"github.com/kvx-dev/kvx/plugins/v1/spec"
)

// managerChecks are the manager checks in the order they run. Each rule is
// quoted or derived from a doc comment of plugins/v1/kvcache.
var managerChecks = []check[*mh]{
	{"Info", "Info answers first, before Configure: a name, a version, Protocols containing 1, the mixers it manages", checkInfo},
	{"Configure", "Configure lays out pools with blocks for every cache layer, and MaxSeqTokens >= MaxSeqLen + MaxDraftTokens; Stats start at zero", checkConfigure},
	{"ConfigureImpossible", "Configure fails with ErrInvalidConfig, naming the numbers, when the budget cannot hold one MaxSeqLen request or one MaxNumTokens chunk", checkConfigureImpossible},
	{"MaxSeqTokens", "one sequence alone in the cache can grow to Layout.MaxSeqTokens, the guaranteed capacity", checkMaxSeqTokens},
	{"ReserveNew", "Reserve{Tokens n, Draft d} grants capacity >= history+n+d; the grant's TableDeltas give the worker ceil((history+n+d)/tpb) blocks per full-attention device pool, the manager's own table", checkReserveNew},
	{"CommitLedger", "Commit{Accepted a}: history += a, rejected drafts released from the ledger (seed A: capacity exactly at history, drafts rejected, never history > capacity)", checkCommitLedger},
	{"CommitBadItems", "Commit with Accepted outside [Tokens, Tokens+Draft] or an unknown sequence is an item-scoped KindInvalidArg error after the valid items were applied; the bad items change nothing", checkCommitBadItems},
	{"Unreserve", "Unreserve restores the state before Reserve exactly (a new sequence disappears); unknown sequences are item errors", checkUnreserve},
	{"Denial", "a denial is OK=false with a Reason and no error, leaves no trace (Inspect identical) and counts in ReserveDenials", checkDenial},
	{"ReserveOrder", "Reserve is atomic per item, in order: an earlier grant may cause a later denial, a denial does not stop later items", checkReserveOrder},
	{"Release", "Release frees the sequences' blocks (InUse back to 0); an unknown sequence is an item error after the others were released", checkRelease},
	{"Lookup", "Lookup changes nothing and returns per item a multiple of TokensPerBlock, at most len(Prompt)-1 (0 without PrefixReuse)", checkLookup},
	{"Reuse", "with block reuse: committed prompt blocks stay cached after Release; Lookup finds them; Reserve{New, Reuse} starts at history = Reuse on the same blocks, shared (RefCount 2); ReusedTokens counts them", checkReuse},
	{"CacheSalt", "with block reuse and Capabilities.CacheSalt: the CacheSalt of LookupItem and ReserveItem enters every prefix key, so two salts never share a block; within one salt reuse is as without salts", checkCacheSalt},
	{"KVEvents", "with block reuse and Capabilities.KVEvents: the manager is a kvcache.EventReporter; with Config.KVEvents, Configure reports AllBlocksCleared, a commit past full prompt blocks reports them BlockStored (a chain with their tokens), an eviction reports BlockRemoved of stored hashes; without it, no events", checkKVEvents},
	{"UnreserveEviction", "with block reuse: Unreserve after a Reserve that evicted cached blocks restores every sequence exactly and the blocks in use; the evicted blocks are free or cached again, and Lookup never finds more than before", checkUnreserveEviction},
	{"Hold", "Hold keeps capacity until Release, whatever Commit does", checkHold},
	{"SuspendResume", "Info says HostTier only for a kvcache.Suspender; a Suspender's Suspend and Resume fail with ErrUnsupported without HostTier, with it they round-trip a sequence through the host tier with Copies", checkSuspendResume},
	{"Fork", forkRule, checkFork},
	{"Ownership", "slices passed in are not retained (the caller reuses its buffers); slices returned are the caller's (scribbling on them changes nothing)", checkOwnership},
	{"Stats", "Stats counters are non-negative, count since Configure, and agree with Inspect", checkStats},
	{"EmptyCalls", "batch calls with nil or empty slices succeed, return nothing and change nothing", checkEmptyCalls},
	{"Random", "a seeded random driver (reserve, commit, unreserve, release, lookup, suspend, resume) keeps every invariant and the ledger after each call", checkRandom},
}

// prompt returns n deterministic tokens; different salts give different
// first tokens.
func prompt(n, salt int) []int32 {
	p := make([]int32, n)
	for i := range p {
		p[i] = int32((salt*7919+i*31)%30000 + 1)
	}
	return p
}

// roundUp is n rounded up to a multiple of tpb.
func (h *mh) roundUp(n int) int { return kvcache.BlocksFor(n, h.tpb) * h.tpb }

// afterCommit checks the ledger of st right after a commit that left
// history at wantHistory: no reservation, and capacity between history and
// the blocks that max(history, hold) needs (the rejected drafts released).
func (h *mh) afterCommit(st *kvcache.SeqState, wantHistory, hold int) {
	if st.History != wantHistory || st.Reserved != 0 || st.Draft != 0 {
		h.failf(h.last, "Commit{Accepted a}: history += a and the reservation ends", "%s, want history %d and Reserved 0", fmtSeq(*st), wantHistory)
	}
	if limit := h.roundUp(max(st.History, hold)); st.Capacity > limit {
		h.failf(h.last, "Commit releases rejected drafts from the ledger: capacity shrinks to what history (and Hold) still need",
			"%s, want capacity <= %d (blocks for max(history %d, hold %d))", fmtSeq(*st), limit, st.History, hold)
	}
	for _, p := range h.full {
		if want := kvcache.BlocksFor(max(st.History, hold), h.tpb); len(st.Tables[p]) > want {
			h.failf(h.last, "Commit frees the blocks of rejected drafts", "%s: pool %d holds %d blocks, want %d for max(history %d, hold %d)",
				fmtSeq(*st), h.layout.Pools[p].ID, len(st.Tables[p]), want, st.History, hold)
		}
	}
}

// afterReserve checks the ledger of a granted sequence.
func (h *mh) afterReserve(st *kvcache.SeqState, history, tokens, draft int) {
	if st.History != history || st.Reserved != tokens+draft || st.Draft != draft || st.Capacity < history+tokens+draft {
		h.failf(h.last, "Reserve{Tokens n, Draft d}: capacity >= history + n + d, Reserved = n + d, Draft = d, history unchanged",
			"%s, want history %d, Reserved %d, Draft %d, capacity >= %d", fmtSeq(*st), history, tokens+draft, draft, history+tokens+draft)
	}
}

func checkInfo(h *mh) {
	info := h.callInfo()
	if info.Name == "" || info.Version == "" || !slices.Contains(info.Protocols, kvcache.ProtocolVersion) {
		h.failf("Info()", "Info describes the manager: Name, Version and Protocols containing 1", "%+v", info)
	}
	if len(info.Capabilities.Mixers) == 0 {
		h.failf("Info()", "Capabilities.Mixers lists the layer mixers whose buffers it can manage", "no mixers: %+v", info.Capabilities)
	}
}

func checkConfigure(h *mh) {
	h.setup(h.o.Reuse, nil)
	l, cfg := h.layout, h.cfg
	call := "Configure(" + fmtConfig(cfg) + ")"
	if len(l.Pools) == 0 {
		h.failf(call, "Configure lays out the pools", "no pools")
	}
	if want := cfg.MaxSeqLen + cfg.MaxDraftTokens; l.MaxSeqTokens < want {
		h.failf(call, "Layout.MaxSeqTokens, the guaranteed capacity, holds one MaxSeqLen request with its drafts",
			"MaxSeqTokens %d < MaxSeqLen %d + MaxDraftTokens %d", l.MaxSeqTokens, cfg.MaxSeqLen, cfg.MaxDraftTokens)
	}
	ids := map[int]bool{}
	layers := map[int]bool{}
	for _, p := range l.Pools {
		if ids[p.ID] {
			h.failf(call, "pool ids are unique", "pool id %d twice in %s", p.ID, fmtPools(l.Pools))
		}
		ids[p.ID] = true
		if p.Blocks <= 0 || p.BlockBytes <= 0 {
			h.failf(call, "every pool has Blocks > 0 and BlockBytes > 0", "pool %s", fmtPools([]kvcache.Pool{p}))
		}
		if p.Tier != kvcache.TierDevice && p.Tier != kvcache.TierHost {
			h.failf(call, "a pool's Tier is device or host", "pool %d tier %q", p.ID, p.Tier)
		}
		if p.TokensPerBlock != 0 && p.TokensPerBlock != cfg.TokensPerBlock {
			h.failf(call, "paged pools hold Config.TokensPerBlock tokens per block (state pools 0)", "pool %d: %d tokens per block, config %d",
				p.ID, p.TokensPerBlock, cfg.TokensPerBlock)
		}
		for _, li := range p.Layers {
			if !slices.ContainsFunc(cfg.Layers, func(x spec.Layer) bool { return x.Index == li }) {
				h.failf(call, "Pool.Layers are Index values of Config.Layers", "pool %d lists layer %d", p.ID, li)
			}
			if p.Tier == kvcache.TierDevice {
				layers[li] = true
			}
		}
	}
	for _, x := range cfg.Layers {
		if x.HasCache() && !layers[x.Index] {
			h.failf(call, "every layer with a cache buffer is in a device pool", "layer %d (%s) is in none: %s", x.Index, x.Mixer, fmtPools(l.Pools))
		}
	}
	if len(h.snap.Seqs) != 0 {
		h.failf(call+", then Inspect", "a configured manager holds no sequence", "sequences %s", fmtSeqIDs(h.snap))
	}
	for _, p := range h.snap.Pools {
		if p.InUse != 0 || p.Cached != 0 {
			h.failf(call+", then Inspect", "a configured manager's blocks are all free", "%s", fmtPoolStats(h.snap.Pools))
		}
	}
	st := h.stats()
	if st.Sequences != 0 || st.LookupTokens != 0 || st.ReusedTokens != 0 || st.Evictions != 0 || st.ReserveDenials != 0 || st.SuspendedSeqs != 0 {
		h.failf(call+", then Stats()", "Stats are cumulative counters since Configure: zero right after it", "%+v", st)
	}
}

// numberIn reports whether msg names n: plainly, or with its digits grouped
// by commas, underscores, spaces or apostrophes.
func numberIn(msg string, n int64) bool {
	plain := strconv.FormatInt(n, 10)
	if regexp.MustCompile(`(^|[^0-9])` + plain + `($|[^0-9])`).MatchString(msg) {
		return true
	}
	var groups []string
	for len(plain) > 3 {
		groups = append([]string{plain[len(plain)-3:]}, groups...)
		plain = plain[:len(plain)-3]
	}
	groups = append([]string{plain}, groups...)
	for _, sep := range []string{",", "_", " ", "'"} {
		if strings.Contains(msg, strings.Join(groups, sep)) {
			return true
		}
	}
	return false
}

// byteUnits matches a size written with a unit (2.5 MiB, 3GB).
var byteUnits = regexp.MustCompile(`[0-9](\.[0-9]+)? ?[KMGT]i?B\b`)

func checkConfigureImpossible(h *mh) {
	h.info = h.callInfo()
	cfg := h.config(false)
	bpt := bytesPerToken(cfg.Layers)
	need := kvcache.BlocksFor(cfg.MaxSeqLen+cfg.MaxDraftTokens, cfg.TokensPerBlock)
	cfg.DeviceBytes = int64(need/2) * int64(cfg.TokensPerBlock) * bpt
	call := "Configure(" + fmtConfig(cfg) + ")"
	_, err := h.m.Configure(h.ctx, cfg)
	want := fmt.Sprintf("ErrInvalidConfig naming the numbers (max_seq_len %d, the budget %d) and the fix: %d blocks cannot hold one MaxSeqLen request of %d blocks",
		cfg.MaxSeqLen, cfg.DeviceBytes, need/2, need)
	if !errors.Is(err, kvcache.ErrInvalidConfig) {
		h.failf(call, want, "error %v (kind %v)", err, kvcache.KindOf(err))
	}
	if msg := err.Error(); !numberIn(msg, int64(cfg.MaxSeqLen)) || !(numberIn(msg, cfg.DeviceBytes) || byteUnits.MatchString(msg)) {
		h.failf(call, want, "message %q", msg)
	}

	// A chunk larger than the budget, with a request that fits.
	cfg = h.config(false)
	cfg.MaxSeqLen = 4 * cfg.TokensPerBlock
	cfg.MaxNumTokens = 64 * cfg.TokensPerBlock
	cfg.DeviceBytes = 16 * int64(cfg.TokensPerBlock) * bpt
	call = "Configure(" + fmtConfig(cfg) + ")"
	_, err = h.m.Configure(h.ctx, cfg)
	want = fmt.Sprintf("ErrInvalidConfig naming the numbers (max_num_tokens %d): 16 blocks cannot hold one MaxNumTokens chunk of 64 blocks", cfg.MaxNumTokens)
	if !errors.Is(err, kvcache.ErrInvalidConfig) {
		h.failf(call, want, "error %v (kind %v)", err, kvcache.KindOf(err))
	}
	if msg := err.Error(); !numberIn(msg, int64(cfg.MaxNumTokens)) {
		h.failf(call, want, "message %q", msg)
	}
}

func checkMaxSeqTokens(h *mh) {
	h.setup(false, nil)
	a := h.id()
	d := h.cfg.MaxDraftTokens
	// Grow one sequence, alone in the cache, to Layout.MaxSeqTokens: chunks
	// up to MaxSeqTokens - 1 - d, then one token and d drafts. (A layout
	// promising more than 4096 chunks is checked up to MaxSeqLen only.)
	total := h.layout.MaxSeqTokens
	if (total-1-d)/h.cfg.MaxNumTokens > 4096 {
		total = h.cfg.MaxSeqLen + d
	}
	hist := total - 1 - d
	for done := 0; done < hist; {
		chunk := min(hist-done, h.cfg.MaxNumTokens)
		g := h.reserve(kvcache.ReserveItem{Seq: a, New: done == 0, Tokens: chunk})[0]
		if !g.OK {
			h.failf(h.last, "Layout.MaxSeqTokens is the guaranteed capacity: the most tokens (history plus reservation) one sequence can hold when it is alone in the cache",
				"denied at history %d of MaxSeqTokens %d: %q", done, h.layout.MaxSeqTokens, g.Reason)
		}
		h.commit(kvcache.CommitItem{Seq: a, Accepted: chunk})
		done += chunk
	}
	g := h.reserve(kvcache.ReserveItem{Seq: a, Tokens: 1, Draft: d})[0]
	if !g.OK {
		h.failf(h.last, "Layout.MaxSeqTokens is the guaranteed capacity: the most tokens (history plus reservation) one sequence can hold when it is alone in the cache",
			"denied at history %d + 1 + %d drafts = MaxSeqTokens %d: %q", hist, d, total, g.Reason)
	}
	h.afterReserve(h.mustSeq(a), hist, 1, d)
	h.commit(kvcache.CommitItem{Seq: a, Accepted: 1})
	h.afterCommit(h.mustSeq(a), hist+1, 0)
}

func checkReserveNew(h *mh) {
	h.setup(false, nil)
	d := h.cfg.MaxDraftTokens
	a := h.id()
	n := min(2*h.tpb+3, h.cfg.MaxNumTokens)
	g, st := h.grant(kvcache.ReserveItem{Seq: a, New: true, Tokens: n, Draft: d})
	h.afterReserve(st, 0, n, d)
	h.covers(a, g, n+d)

	h.commit(kvcache.CommitItem{Seq: a, Accepted: n})
	hist := h.mustSeq(a).History
	g, st = h.grant(kvcache.ReserveItem{Seq: a, Tokens: 1, Draft: d})
	h.afterReserve(st, hist, 1, d)
	h.covers(a, g, hist+1+d)

	// A second new sequence in the same call as a step of the first.
	h.commit(kvcache.CommitItem{Seq: a, Accepted: 1 + d})
	b := h.id()
	hist = h.mustSeq(a).History
	gs := h.reserve(kvcache.ReserveItem{Seq: a, Tokens: 1, Draft: d}, kvcache.ReserveItem{Seq: b, New: true, Tokens: h.tpb})
	if !gs[0].OK || !gs[1].OK {
		h.failf(h.last, "reservations that fit are granted", "grants %+v; pools %s", gs, fmtPoolStats(h.snap.Pools))
	}
	h.afterReserve(h.mustSeq(a), hist, 1, d)
	h.afterReserve(h.mustSeq(b), 0, h.tpb, 0)
	h.covers(a, gs[0], hist+1+d)
	h.covers(b, gs[1], h.tpb)
}

// covers checks that the worker's tables of seq, after grant g, hold
// ceil(tokens/tpb) blocks in every full-attention device pool.
func (h *mh) covers(seq kvcache.SeqID, g kvcache.Grant, tokens int) {
	t := h.workerTables(seq)
	for _, p := range h.full {
		if want := kvcache.BlocksFor(tokens, h.tpb); len(t[p]) < want {
			h.failf(h.last, "the grant's TableDeltas cover ceil((history+Tokens+Draft)/TokensPerBlock) blocks in every full-attention device pool",
				"seq %d pool %d: the worker's table has %d blocks %v after deltas %s, want %d for %d tokens",
				seq, h.layout.Pools[p].ID, len(t[p]), t[p], fmtDeltas(g.Tables), want, tokens)
		}
	}
}

func checkCommitLedger(h *mh) {
	h.setup(false, nil)
	d := h.cfg.MaxDraftTokens
	a := h.id()
	st := h.prefill(a, nil, 2*h.tpb-1)
	h.afterCommit(st, 2*h.tpb-1, 0)
	// Seed A: capacity at history one token before a block boundary, one
	// token + d drafts reserved across it, every draft rejected. Then every
	// acceptance count in turn.
	accept := []int{0, d, 0}
	for k := 1; k < d; k++ {
		accept = append(accept, k)
	}
	accept = append(accept, d, 0, d)
	for _, k := range accept {
		before := h.mustSeq(a).History
		_, st := h.grant(kvcache.ReserveItem{Seq: a, Tokens: 1, Draft: d})
		h.afterReserve(st, before, 1, d)
		h.commit(kvcache.CommitItem{Seq: a, Accepted: 1 + k})
		h.afterCommit(h.mustSeq(a), before+1+k, 0)
	}
	// A prefill chunk that ends exactly at a block boundary, then a draft
	// step from capacity == history.
	before := h.mustSeq(a).History
	chunk := h.roundUp(before+1) - before
	h.grant(kvcache.ReserveItem{Seq: a, Tokens: chunk})
	h.commit(kvcache.CommitItem{Seq: a, Accepted: chunk})
	h.afterCommit(h.mustSeq(a), before+chunk, 0)
	before += chunk
	h.grant(kvcache.ReserveItem{Seq: a, Tokens: 1, Draft: d})
	h.commit(kvcache.CommitItem{Seq: a, Accepted: 1})
	h.afterCommit(h.mustSeq(a), before+1, 0)
}

func checkCommitBadItems(h *mh) {
	h.setup(false, nil)
	d := h.cfg.MaxDraftTokens
	ids := []kvcache.SeqID{h.id(), h.id(), h.id(), h.id()}
	for _, id := range ids {
		h.prefill(id, nil, h.tpb+3)
	}
	var items []kvcache.ReserveItem
	for _, id := range ids {
		items = append(items, kvcache.ReserveItem{Seq: id, Tokens: 1, Draft: d})
	}
	for _, g := range h.reserve(items...) {
		if !g.OK {
			h.failf(h.last, "reservations that fit are granted", "seq %d denied: %q", g.Seq, g.Reason)
		}
	}
	before := h.snap
	a, b, c, e := ids[0], ids[1], ids[2], ids[3]
	unknown := h.id()
	_, err := h.commitRaw([]kvcache.CommitItem{
		{Seq: a, Accepted: 1 + d},     // valid: every draft accepted
		{Seq: b, Accepted: 1 + d + 1}, // more than reserved
		{Seq: c, Accepted: 1},         // valid: every draft rejected
		{Seq: e, Accepted: 0},         // fewer than Tokens: only drafts may be rejected
		{Seq: unknown, Accepted: 1},   // no such sequence
	})
	h.itemErr(err, []kvcache.SeqID{b, e, unknown}, []kvcache.SeqID{a, c},
		"Commit items with Accepted > Tokens+Draft, Accepted < Tokens or an unknown sequence are an item-scoped error")
	h.inspect()
	h.afterCommit(h.mustSeq(a), seqOf(before, a).History+1+d, 0)
	h.afterCommit(h.mustSeq(c), seqOf(before, c).History+1, 0)
	for _, id := range []kvcache.SeqID{b, e} {
		if diff := diffSeq(*seqOf(before, id), *h.mustSeq(id)); diff != "" {
			h.failf(h.last, "a bad Commit item changes nothing for its sequence (its reservation stays outstanding)", "seq %d: %s", id, diff)
		}
	}
	if seqOf(h.snap, unknown) != nil {
		h.failf(h.last, "a bad Commit item changes nothing", "unknown seq %d now listed", unknown)
	}
	// The untouched reservations still commit.
	h.commit(kvcache.CommitItem{Seq: b, Accepted: 1 + d}, kvcache.CommitItem{Seq: e, Accepted: 1})
	h.afterCommit(h.mustSeq(b), seqOf(before, b).History+1+d, 0)
	h.afterCommit(h.mustSeq(e), seqOf(before, e).History+1, 0)
}

func checkUnreserve(h *mh) {
	h.setup(false, nil)
	d := h.cfg.MaxDraftTokens
	same := func(before kvcache.Snapshot, what string) {
		if diff := diffSnap(before, h.snap); diff != "" {
			h.failf(h.last, "Unreserve undoes the reservation exactly: "+what, "Inspect before Reserve and after Unreserve differ: %s", diff)
		}
	}
	s0 := h.snap
	n := h.id()
	h.grant(kvcache.ReserveItem{Seq: n, New: true, Tokens: 2*h.tpb + 3, Draft: d})
	h.unreserve(n)
	same(s0, "a new sequence disappears")

	e := h.id()
	h.prefill(e, nil, 2*h.tpb-1)
	s1 := h.snap
	h.grant(kvcache.ReserveItem{Seq: e, Tokens: 1, Draft: d})
	h.unreserve(e)
	same(s1, "an existing sequence gets its capacity and tables back")

	h.grant(kvcache.ReserveItem{Seq: e, Tokens: min(3*h.tpb, h.cfg.MaxNumTokens), Hold: 6 * h.tpb})
	h.unreserve(e)
	same(s1, "an existing sequence gets its hold back")

	// Several in one call, with an unknown sequence among them.
	n2, unknown := h.id(), h.id()
	gs := h.reserve(kvcache.ReserveItem{Seq: e, Tokens: 1, Draft: d}, kvcache.ReserveItem{Seq: n2, New: true, Tokens: h.tpb})
	if !gs[0].OK || !gs[1].OK {
		h.failf(h.last, "reservations that fit are granted", "grants %+v", gs)
	}
	h.last = fmt.Sprintf("Unreserve(%v)", []kvcache.SeqID{e, unknown, n2})
	err := h.m.Unreserve(h.ctx, []kvcache.SeqID{e, unknown, n2})
	h.itemErr(err, []kvcache.SeqID{unknown}, []kvcache.SeqID{e, n2}, "Unreserve of an unknown sequence is an item-scoped error")
	h.dropPending([]kvcache.SeqID{e, n2})
	h.inspect()
	same(s1, "the valid items of a call with a bad one are applied")

	// The next grant tells the worker the right table.
	h.grant(kvcache.ReserveItem{Seq: e, Tokens: 1, Draft: d})
	h.commit(kvcache.CommitItem{Seq: e, Accepted: 1})
	h.afterCommit(h.mustSeq(e), 2*h.tpb, 0)
}

// minFree is the fewest free plus cached blocks of the full-attention device
// pools in the last snapshot.
func (h *mh) minFree() int {
	free := -1
	for _, p := range h.full {
		ps := h.snap.Pools[p]
		if f := ps.Free + ps.Cached; free < 0 || f < free {
			free = f
		}
	}
	return free
}

func checkDenial(h *mh) {
	h.setup(false, nil)
	chunk := h.cfg.MaxNumTokens
	limit := h.minFree()/kvcache.BlocksFor(chunk, h.tpb) + 2
	var granted []kvcache.SeqID
	denied := false
	for range limit {
		before := h.snap
		id := h.id()
		g := h.reserve(kvcache.ReserveItem{Seq: id, New: true, Tokens: chunk})[0]
		if g.OK {
			h.commit(kvcache.CommitItem{Seq: id, Accepted: chunk})
			granted = append(granted, id)
			continue
		}
		denied = true
		if diff := diffSnap(before, h.snap); diff != "" {
			h.failf(h.last, "a denial leaves no trace in the manager", "Inspect changed: %s", diff)
		}
		break
	}
	if !denied {
		h.failf(h.last, "a reservation for more than the pool holds is denied", "%d sequences of %d tokens granted; pools %s",
			len(granted), chunk, fmtPoolStats(h.snap.Pools))
	}
	if len(granted) == 0 {
		h.failf(h.last, "a reservation of one MaxNumTokens chunk fits a configured manager", "the first one was denied")
	}
	// An existing sequence asking for more than is left.
	before := h.snap
	x := granted[0]
	g := h.reserve(kvcache.ReserveItem{Seq: x, Tokens: chunk})[0]
	if g.OK {
		h.failf(h.last, "a reservation for more than the pool holds is denied", "granted with pools %s", fmtPoolStats(before.Pools))
	}
	if diff := diffSnap(before, h.snap); diff != "" {
		h.failf(h.last, "a denial leaves no trace in the manager", "Inspect changed: %s", diff)
	}
	if st := h.stats(); st.ReserveDenials != 2 {
		h.failf("Stats() after two denials", "Stats.ReserveDenials counts denied items", "ReserveDenials %d, want 2", st.ReserveDenials)
	}
}

func checkReserveOrder(h *mh) {
	h.setup(false, nil)
	tpb := h.tpb
	const k = 2 // blocks each probe needs
	maxChunk := h.cfg.MaxNumTokens / tpb
	for range 10000 {
		free := h.minFree()
		if free < 2*k {
			break
		}
		blocks := min(maxChunk, free-(2*k-1))
		id := h.id()
		h.grant(kvcache.ReserveItem{Seq: id, New: true, Tokens: blocks * tpb})
		h.commit(kvcache.CommitItem{Seq: id, Accepted: blocks * tpb})
	}
	free := h.minFree()
	if free < k || free >= 2*k {
		h.failf(h.last, "each reservation of n blocks' tokens takes n blocks", "could not leave %d..%d free blocks: %s", k, 2*k-1, fmtPoolStats(h.snap.Pools))
	}

	// A denial does not stop later items.
	x, y := h.id(), h.id()
	gs := h.reserve(kvcache.ReserveItem{Seq: x, New: true, Tokens: (free + 1) * tpb}, kvcache.ReserveItem{Seq: y, New: true, Tokens: tpb})
	if gs[0].OK || !gs[1].OK {
		h.failf(h.last, "items are processed in order, each atomically: one asking more than is free is denied, a later one that fits is granted",
			"granted %v, %v with %d free blocks", gs[0].OK, gs[1].OK, free)
	}
	if seqOf(h.snap, x) != nil {
		h.failf(h.last, "a denied new sequence leaves no trace", "seq %d listed: %s", x, fmtSeq(*seqOf(h.snap, x)))
	}
	h.unreserve(y)

	// An earlier grant causes a later denial.
	x, y = h.id(), h.id()
	gs = h.reserve(kvcache.ReserveItem{Seq: x, New: true, Tokens: k * tpb}, kvcache.ReserveItem{Seq: y, New: true, Tokens: k * tpb})
	if !gs[0].OK || gs[1].OK {
		h.failf(h.last, "items are processed in order, each atomically: with room for one of two equal items the first is granted and the second denied",
			"granted %v, %v with %d free blocks", gs[0].OK, gs[1].OK, free)
	}
	if seqOf(h.snap, y) != nil {
		h.failf(h.last, "a denied new sequence leaves no trace", "seq %d listed: %s", y, fmtSeq(*seqOf(h.snap, y)))
	}
}

func checkRelease(h *mh) {
	h.setup(false, nil)
	d := h.cfg.MaxDraftTokens
	a, b, c := h.id(), h.id(), h.id()
	for _, id := range []kvcache.SeqID{a, b, c} {
		h.prefill(id, nil, 2*h.tpb+3)
	}
	h.grant(kvcache.ReserveItem{Seq: c, Tokens: 1, Draft: d})
	cState := *h.mustSeq(c)
	unknown := h.id()
	h.last = fmt.Sprintf("Release(%v)", []kvcache.SeqID{a, unknown, b})
	err := h.m.Release(h.ctx, []kvcache.SeqID{a, unknown, b})
	h.itemErr(err, []kvcache.SeqID{unknown}, []kvcache.SeqID{a, b}, "Release of an unknown sequence is an item-scoped error")
	delete(h.shadow, a)
	delete(h.shadow, b)
	h.inspect()
	if seqOf(h.snap, a) != nil || seqOf(h.snap, b) != nil {
		h.failf(h.last, "the valid items of a Release with a bad one are released", "Inspect lists %s", fmtSeqIDs(h.snap))
	}
	if diff := diffSeq(cState, *h.mustSeq(c)); diff != "" {
		h.failf(h.last, "Release changes only the released sequences", "seq %d: %s", c, diff)
	}
	for _, p := range h.full {
		if got, want := h.snap.Pools[p].InUse, len(cState.Tables[p]); got != want {
			h.failf(h.last, "Release frees the sequences' blocks", "pool %d: InUse %d, the one live sequence holds %d", h.layout.Pools[p].ID, got, want)
		}
	}
	h.commit(kvcache.CommitItem{Seq: c, Accepted: 1})
	h.release(c)
	for _, p := range h.snap.Pools {
		if p.InUse != 0 {
			h.failf(h.last, "Release frees the sequences' blocks: no sequence, nothing in use", "%s", fmtPoolStats(h.snap.Pools))
		}
	}
}

// lookup calls Lookup and checks what it returns against the contract and
// that it changed nothing.
func (h *mh) lookup(items ...kvcache.LookupItem) []int {
	before := h.snap
	parts := make([]string, len(items))
	for i, it := range items {
		parts[i] = fmt.Sprintf("{Seq %d Prompt [%d tokens]}", it.Seq, len(it.Prompt))
	}
	call := "Lookup(" + strings.Join(parts, ", ") + ")"
	got, err := h.m.Lookup(h.ctx, items)
	if err != nil {
		h.failf(call, "Lookup answers", "error %v", err)
	}
	if len(got) != len(items) {
		h.failf(call, "one answer per item", "%d answers for %d items", len(got), len(items))
	}
	for i, n := range got {
		limit := max(len(items[i].Prompt)-1, 0)
		if n < 0 || n > limit || n%h.tpb != 0 {
			h.failf(call, "a multiple of TokensPerBlock, at most len(Prompt)-1", "item %d (%d tokens): %d", i, len(items[i].Prompt), n)
		}
		if n > 0 && !h.info.Capabilities.PrefixReuse {
			h.failf(call, "Lookup returns > 0 only with Capabilities.PrefixReuse", "item %d: %d", i, n)
		}
	}
	h.last = call
	h.inspect()
	if diff := diffSnap(before, h.snap); diff != "" {
		h.failf(call, "Lookup changes nothing", "Inspect changed: %s", diff)
	}
	return got
}

func checkLookup(h *mh) {
	h.setup(true, nil)
	tpb := h.tpb
	items := []kvcache.LookupItem{
		{Seq: h.id()},
		{Seq: h.id(), Prompt: prompt(1, 1)},
		{Seq: h.id(), Prompt: prompt(tpb, 2)},
		{Seq: h.id(), Prompt: prompt(3*tpb+1, 3)},
	}
	h.lookup(items...)
	// With a live sequence holding committed prompt blocks.
	p := prompt(3*tpb+1, 3)
	h.prefill(h.id(), p, len(p))
	h.lookup(items...)
	h.lookup(kvcache.LookupItem{Seq: h.id(), Prompt: p[:2*tpb]}, kvcache.LookupItem{Seq: h.id(), Prompt: p})
}

func checkReuse(h *mh) {
	h.info = h.callInfo()
	if !h.reuseOn() {
		return // reuse not asked for, or no PrefixReuse: nothing to check
	}
	h.setup(true, nil)
	tpb := h.tpb
	p := prompt(3*tpb+tpb/2, 7)
	full := 3 * tpb // the full blocks of p, all within len(p)-1

	// Prompt blocks are committed for reuse as history passes them: a live
	// sequence's blocks are found and shared.
	a := h.id()
	h.grant(kvcache.ReserveItem{Seq: a, New: true, Prompt: p, Tokens: tpb + 3})
	h.commit(kvcache.CommitItem{Seq: a, Accepted: tpb + 3})
	if got := h.lookup(kvcache.LookupItem{Seq: h.id(), Prompt: p}); got[0] != tpb {
		h.failf(h.last, "full prompt blocks are committed for reuse as history passes them (ReserveItem.Prompt)",
			"history %d of a %d-token prompt: Lookup %v, want [%d]", tpb+3, len(p), got, tpb)
	}
	h.grant(kvcache.ReserveItem{Seq: a, Tokens: len(p) - tpb - 3})
	st := h.commit1(a, len(p)-tpb-3)
	blocksA := make([][]kvcache.BlockID, len(h.layout.Pools))
	for _, i := range h.full {
		blocksA[i] = slices.Clone(st.Tables[i][:3])
	}
	if got := h.lookup(kvcache.LookupItem{Seq: h.id(), Prompt: p}); got[0] != full {
		h.failf(h.last, "full prompt blocks are committed for reuse as history passes them (ReserveItem.Prompt)",
			"history %d of a %d-token prompt: Lookup %v, want [%d]", len(p), len(p), got, full)
	}
	live := h.id()
	_, st = h.grant(kvcache.ReserveItem{Seq: live, New: true, Prompt: p, Reuse: full, Tokens: len(p) - full})
	h.afterReserve(st, full, len(p)-full, 0)
	for _, i := range h.full {
		if !slices.Equal(st.Tables[i][:3], blocksA[i]) {
			h.failf(h.last, "Reserve{New, Reuse} shares the blocks of the live sequence that committed them", "pool %d: table %v, the prompt's blocks are %v",
				h.layout.Pools[i].ID, st.Tables[i], blocksA[i])
		}
		for _, blk := range blocksA[i] {
			if r := h.snap.RefCounts[i][blk]; r != 2 {
				h.failf(h.last, "a block shared by two sequences has RefCount 2", "pool %d block %d: RefCount %d", h.layout.Pools[i].ID, blk, r)
			}
		}
	}
	h.commit(kvcache.CommitItem{Seq: live, Accepted: len(p) - full})
	h.release(a, live)

	other := slices.Clone(p)
	other[0]++
	got := h.lookup(kvcache.LookupItem{Seq: h.id(), Prompt: p}, kvcache.LookupItem{Seq: h.id(), Prompt: other},
		kvcache.LookupItem{Seq: h.id(), Prompt: prompt(2*tpb, 8)})
	if got[0] != full || got[1] != 0 || got[2] != 0 {
		h.failf(h.last, "after Commit and Release of a prompt, Lookup finds its full blocks (and nothing for prompts that differ in the first block)",
			"%v, want [%d 0 0]", got, full)
	}
	ru0 := h.stats().ReusedTokens

	b := h.id()
	_, st = h.grant(kvcache.ReserveItem{Seq: b, New: true, Prompt: p, Reuse: full, Tokens: len(p) - full})
	h.afterReserve(st, full, len(p)-full, 0)
	for _, i := range h.full {
		if !slices.Equal(st.Tables[i][:3], blocksA[i]) {
			h.failf(h.last, "Reserve{New, Reuse} takes the cached blocks", "pool %d: table %v, the released prompt's blocks were %v",
				h.layout.Pools[i].ID, st.Tables[i], blocksA[i])
		}
	}
	if ru := h.stats().ReusedTokens; ru != ru0+int64(full) {
		h.failf("Stats() after "+h.last, "ReusedTokens counts the prompt tokens Reserve took from the cache", "ReusedTokens %d, want %d", ru, ru0+int64(full))
	}
	c := h.id()
	_, st = h.grant(kvcache.ReserveItem{Seq: c, New: true, Prompt: p, Reuse: full, Tokens: len(p) - full})
	h.afterReserve(st, full, len(p)-full, 0)
	for _, i := range h.full {
		if !slices.Equal(st.Tables[i][:3], blocksA[i]) {
			h.failf(h.last, "two sequences that reuse one prefix share its blocks", "pool %d: table %v, the cached blocks are %v",
				h.layout.Pools[i].ID, st.Tables[i], blocksA[i])
		}
		for _, blk := range blocksA[i] {
			if r := h.snap.RefCounts[i][blk]; r != 2 {
				h.failf(h.last, "a block shared by two sequences has RefCount 2", "pool %d block %d: RefCount %d", h.layout.Pools[i].ID, blk, r)
			}
		}
	}
	if ru := h.stats().ReusedTokens; ru != ru0+2*int64(full) {
		h.failf("Stats() after "+h.last, "ReusedTokens counts the prompt tokens Reserve took from the cache", "ReusedTokens %d, want %d", ru, ru0+2*int64(full))
	}
	h.commit(kvcache.CommitItem{Seq: b, Accepted: len(p) - full}, kvcache.CommitItem{Seq: c, Accepted: len(p) - full})
	h.release(b, c)
	for _, ps := range h.snap.Pools {
		if ps.InUse != 0 {
			h.failf(h.last, "Release frees every block", "%s", fmtPoolStats(h.snap.Pools))
		}
	}
	if got := h.lookup(kvcache.LookupItem{Seq: h.id(), Prompt: p}); got[0] != full {
		h.failf(h.last, "committed prompt blocks stay cached after Release", "Lookup %v, want [%d]", got, full)
	}

	// A prompt of exactly two blocks: one can be reused, one token is left.
	q := prompt(2*tpb, 9)
	e := h.id()
	h.prefill(e, q, len(q))
	h.release(e)
	if got := h.lookup(kvcache.LookupItem{Seq: h.id(), Prompt: q}); got[0] != tpb {
		h.failf(h.last, "Lookup returns at most len(Prompt)-1 tokens, in full blocks", "prompt of %d tokens: %v, want [%d]", len(q), got, tpb)
	}
}

func checkUnreserveEviction(h *mh) {
	h.info = h.callInfo()
	if !h.reuseOn() {
		return
	}
	h.setup(true, nil)
	tpb := h.tpb
	// Cache four prompts of four full blocks each.
	var looks []kvcache.LookupItem
	for i := range 4 {
		p := prompt(4*tpb+1, 20+i)
		id := h.id()
		h.prefill(id, p, len(p))
		h.release(id)
		looks = append(looks, kvcache.LookupItem{Seq: h.id(), Prompt: p})
	}
	cached := h.snap.Pools[h.full[0]].Cached
	if cached < 8 {
		h.failf(h.last, "committed prompt blocks stay cached after Release", "%s", fmtPoolStats(h.snap.Pools))
	}
	// Fill the free blocks (without evicting) but two.
	maxChunk := h.cfg.MaxNumTokens / tpb
	for range 10000 {
		free := -1
		for _, p := range h.full {
			if f := h.snap.Pools[p].Free; free < 0 || f < free {
				free = f
			}
		}
		if free <= 2 {
			break
		}
		id := h.id()
		n := min(maxChunk, free-2) * tpb
		h.grant(kvcache.ReserveItem{Seq: id, New: true, Tokens: n})
		h.commit(kvcache.CommitItem{Seq: id, Accepted: n})
	}
	before := h.snap
	l0 := h.lookup(looks...)
	x := h.id()
	h.grant(kvcache.ReserveItem{Seq: x, New: true, Tokens: 8 * tpb})
	if h.snap.Pools[h.full[0]].Cached >= cached {
		return // nothing was evicted: nothing to check
	}
	h.unreserve(x)
	// The contract: the ledger and table are as before Reserve; cached blocks
	// evicted to make room may stay evicted (as free blocks).
	seqsBefore, seqsAfter := before, h.snap
	seqsBefore.Pools, seqsAfter.Pools = nil, nil
	seqsBefore.RefCounts, seqsAfter.RefCounts = nil, nil
	if diff := diffSnap(seqsBefore, seqsAfter); diff != "" {
		h.failf(h.last, "Unreserve undoes the reservation exactly: every ledger and block table as before Reserve",
			"after a Reserve that evicted cached blocks, sequences before Reserve and after Unreserve differ: %s", diff)
	}
	for i, p := range before.Pools {
		a := h.snap.Pools[i]
		if a.InUse != p.InUse || a.Free+a.Cached != p.Free+p.Cached || a.Cached > p.Cached {
			h.failf(h.last, "Unreserve returns every block it took: in use as before, evicted blocks free",
				"pool %d before Reserve %+v, after Unreserve %+v", i, p, a)
		}
	}
	l1 := h.lookup(looks...)
	for i := range l0 {
		if l1[i] > l0[i] {
			h.failf(h.last, "Unreserve cannot make the cache hold more than before",
				"Lookup of the cached prompts %v before Reserve, %v after Unreserve", l0, l1)
			break
		}
	}
}

// commit1 commits one sequence and returns its state.
func (h *mh) commit1(id kvcache.SeqID, accepted int) *kvcache.SeqState {
	h.commit(kvcache.CommitItem{Seq: id, Accepted: accepted})
	return h.mustSeq(id)
}

func checkHold(h *mh) {
	h.setup(false, nil)
	d := h.cfg.MaxDraftTokens
	hold := 4 * h.tpb
	a := h.id()
	_, st := h.grant(kvcache.ReserveItem{Seq: a, New: true, Tokens: h.tpb, Hold: hold})
	if st.Capacity < hold {
		h.failf(h.last, "Reserve{Hold h}: capacity >= h", "%s, want capacity >= %d", fmtSeq(*st), hold)
	}
	h.commit(kvcache.CommitItem{Seq: a, Accepted: h.tpb})
	for step := 0; ; step++ {
		st := h.mustSeq(a)
		if st.Capacity < hold {
			h.failf(h.last, "Hold keeps capacity until Release, whatever Commit does", "%s, want capacity >= hold %d", fmtSeq(*st), hold)
		}
		h.afterCommit(st, st.History, hold)
		if st.History > hold+h.tpb || step > 100 {
			break
		}
		h.grant(kvcache.ReserveItem{Seq: a, Tokens: 1, Draft: d})
		h.commit(kvcache.CommitItem{Seq: a, Accepted: 1 + step%(d+1)})
	}
	h.release(a)
	for _, ps := range h.snap.Pools {
		if ps.InUse != 0 {
			h.failf(h.last, "Release frees held capacity", "%s", fmtPoolStats(h.snap.Pools))
		}
	}
}

func checkSuspendResume(h *mh) {
	h.info = h.callInfo()
	if h.sp == nil {
		if h.info.Capabilities.HostTier {
			h.failf("Info()", "Capabilities.HostTier only for a manager that implements kvcache.Suspender",
				"HostTier true on %T, which has no Suspend and Resume", h.m)
		}
		return // no Suspender: nothing to suspend
	}
	h.setup(false, nil)
	d := h.cfg.MaxDraftTokens
	a := h.id()
	h.prefill(a, nil, 2*h.tpb+3)
	before := h.snap
	if !h.info.Capabilities.HostTier {
		for _, name := range []string{"Suspend", "Resume"} {
			call := name + "(" + fmt.Sprint([]kvcache.SeqID{a}) + ")"
			var err error
			if name == "Suspend" {
				_, _, err = h.sp.Suspend(h.ctx, []kvcache.SeqID{a})
			} else {
				_, _, err = h.sp.Resume(h.ctx, []kvcache.SeqID{a})
			}
			if !errors.Is(err, kvcache.ErrUnsupported) {
				h.failf(call, "without Capabilities.HostTier, Suspend and Resume fail with ErrUnsupported", "error %v (kind %v)", err, kvcache.KindOf(err))
			}
			h.last = call
			h.inspect()
			if diff := diffSnap(before, h.snap); diff != "" {
				h.failf(call, "an unsupported call changes nothing", "Inspect changed: %s", diff)
			}
		}
		return
	}
	host := false
	for _, p := range h.layout.Pools {
		host = host || p.Tier == kvcache.TierHost
	}
	if !host {
		h.failf("Configure("+fmtConfig(h.cfg)+")", "with HostTier and HostBytes > 0 the layout has host pools", "pools %s", fmtPools(h.layout.Pools))
	}
	tier := func(pool int) kvcache.Tier { return h.layout.Pools[h.idx[pool]].Tier }
	stA := *h.mustSeq(a)

	h.last = fmt.Sprintf("Suspend(%v)", []kvcache.SeqID{a})
	ok, out, err := h.sp.Suspend(h.ctx, []kvcache.SeqID{a})
	if err != nil || len(ok) != 1 || !ok[0] || len(out) == 0 {
		h.failf(h.last, "Suspend moves a resident sequence that fits the host tier there, with Copies", "ok %v, %d copies, error %v", ok, len(out), err)
	}
	moved := map[[2]int]bool{}
	for _, c := range out {
		h.checkCopy(c, "Suspend copies")
		if tier(c.SrcPool) != kvcache.TierDevice || tier(c.DstPool) != kvcache.TierHost {
			h.failf(h.last, "Suspend copies go from device to host", "copy %+v", c)
		}
		moved[[2]int{c.DstPool, int(c.DstBlock)}] = true
	}
	devBefore := h.snap.Pools
	h.inspect()
	for i, p := range h.layout.Pools {
		if p.Tier == kvcache.TierDevice && h.snap.Pools[i].InUse > devBefore[i].InUse {
			h.failf(h.last, "Suspend moves blocks off the device", "%s, before %s", fmtPoolStats(h.snap.Pools), fmtPoolStats(devBefore))
		}
	}
	if h.snap.Pools[h.full[0]].InUse >= devBefore[h.full[0]].InUse {
		h.failf(h.last, "Suspend moves the sequence's blocks off the device", "%s, before %s", fmtPoolStats(h.snap.Pools), fmtPoolStats(devBefore))
	}
	st := h.mustSeq(a)
	if !st.Suspended || st.History != stA.History || st.Capacity != stA.Capacity {
		h.failf(h.last, "a suspended sequence keeps its ledger and says Suspended", "%s, before %s", fmtSeq(*st), fmtSeq(stA))
	}
	if s := h.stats(); s.SuspendedSeqs != 1 {
		h.failf("Stats() after "+h.last, "SuspendedSeqs counts suspended sequences", "SuspendedSeqs %d, want 1", s.SuspendedSeqs)
	}

	h.last = fmt.Sprintf("Resume(%v)", []kvcache.SeqID{a})
	ok, in, err := h.sp.Resume(h.ctx, []kvcache.SeqID{a})
	if err != nil || len(ok) != 1 || !ok[0] || len(in) != len(out) {
		h.failf(h.last, "Resume brings a suspended sequence back when it fits, copying back what Suspend moved", "ok %v, %d copies (Suspend made %d), error %v", ok, len(in), len(out), err)
	}
	for _, c := range in {
		h.checkCopy(c, "Resume copies")
		if tier(c.SrcPool) != kvcache.TierHost || tier(c.DstPool) != kvcache.TierDevice || !moved[[2]int{c.SrcPool, int(c.SrcBlock)}] {
			h.failf(h.last, "Resume copies the host blocks Suspend filled back to the device", "copy %+v; Suspend copied %+v", c, out)
		}
	}
	h.inspect()
	st = h.mustSeq(a)
	if st.Suspended || st.History != stA.History || st.Capacity != stA.Capacity {
		h.failf(h.last, "a resumed sequence is resident with its ledger", "%s, before %s", fmtSeq(*st), fmtSeq(stA))
	}
	// The next grant tells the worker the new blocks (checked by reserve).
	h.grant(kvcache.ReserveItem{Seq: a, Tokens: 1, Draft: d})
	h.commit(kvcache.CommitItem{Seq: a, Accepted: 1 + d})
	h.afterCommit(h.mustSeq(a), stA.History+1+d, 0)
	h.release(a)
	for _, ps := range h.snap.Pools {
		if ps.InUse != 0 {
			h.failf(h.last, "Release frees every block, on both tiers", "%s", fmtPoolStats(h.snap.Pools))
		}
	}
}

func checkOwnership(h *mh) {
	h.info = h.callInfo()
	h.cfg = h.config(true)
	layers := h.cfg.Layers
	layout, err := h.m.Configure(h.ctx, h.cfg)
	if err != nil {
		h.failf("Configure("+fmtConfig(h.cfg)+")", "a budget that holds one max_seq_len request and one max_num_tokens chunk configures", "error %v", err)
	}
	h.useLayout(layout) // keeps a deep copy
	h.last = "Configure(" + fmtConfig(h.cfg) + "), then scribbling on Config.Layers and on the returned Layout"
	for i := range layers {
		layers[i].Index, layers[i].Window, layers[i].Buffers = 1000+i, 7, nil
	}
	h.cfg.Layers = nil
	for i := range layout.Pools {
		layout.Pools[i].Blocks, layout.Pools[i].ID = -1, -1
		for j := range layout.Pools[i].Layers {
			layout.Pools[i].Layers[j] = -1
		}
	}
	h.inspect()

	tpb := h.tpb
	p := prompt(3*tpb+2, 31)
	buf := slices.Clone(p)
	a := h.id()
	g, _ := h.grant(kvcache.ReserveItem{Seq: a, New: true, Prompt: buf, Tokens: len(p)})
	h.last += ", then scribbling on the Prompt and the Grant"
	for i := range buf {
		buf[i] = -5 - int32(i)
	}
	for _, d := range g.Tables {
		for j := range d.Blocks {
			d.Blocks[j] = 1 << 30
		}
	}
	before := h.inspect()
	want := deepSnap(before)
	// Scribble on everything Inspect and Stats returned.
	for i := range before.Seqs {
		before.Seqs[i].History = -7
		for j := range before.Seqs[i].Blocks {
			before.Seqs[i].Blocks[j] = -7
		}
		for _, t := range before.Seqs[i].Tables {
			for j := range t {
				t[j] = 1 << 29
			}
		}
	}
	for _, r := range before.RefCounts {
		for j := range r {
			r[j] = -3
		}
	}
	for i := range before.Pools {
		before.Pools[i].Free = -9
	}
	st := h.stats()
	for i := range st.Pools {
		st.Pools[i].InUse = -9
	}
	h.last = "Inspect and Stats, then scribbling on what they returned"
	h.inspect()
	if diff := diffSnap(want, h.snap); diff != "" {
		h.failf(h.last, "slices returned are owned by the caller", "Inspect changed: %s", diff)
	}
	h.statsAgree()
	h.commit(kvcache.CommitItem{Seq: a, Accepted: len(p)})
	if !h.cfg.EnableBlockReuse {
		return
	}
	h.release(a)
	if got := h.lookup(kvcache.LookupItem{Seq: h.id(), Prompt: p}); got[0] != 3*tpb {
		h.failf(h.last, "slices passed in are not retained: Reserve's Prompt is the caller's buffer, reused after the call",
			"after scribbling on the Prompt buffer once Reserve returned, then Commit and Release: Lookup of the prompt %v, want [%d]", got, 3*tpb)
	}
}

// deepSnap copies a snapshot and every slice in it.
func deepSnap(s kvcache.Snapshot) kvcache.Snapshot {
	out := kvcache.Snapshot{Pools: slices.Clone(s.Pools), Violations: slices.Clone(s.Violations)}
	for _, st := range s.Seqs {
		st.Blocks = slices.Clone(st.Blocks)
		t := make([][]kvcache.BlockID, len(st.Tables))
		for i := range st.Tables {
			t[i] = slices.Clone(st.Tables[i])
		}
		if st.Tables != nil {
			st.Tables = t
		}
		out.Seqs = append(out.Seqs, st)
	}
	for _, r := range s.RefCounts {
		out.RefCounts = append(out.RefCounts, slices.Clone(r))
	}
	return out
}

// statsAgree checks Stats against the last snapshot.
func (h *mh) statsAgree() kvcache.Stats {
	st := h.stats()
	call := "Stats() after " + h.last
	if st.LookupTokens < 0 || st.ReusedTokens < 0 || st.Evictions < 0 || st.ReserveDenials < 0 || st.SuspendedSeqs < 0 ||
		st.Snapshots.Taken < 0 || st.Snapshots.Skipped < 0 || st.Snapshots.Evicted < 0 || st.Snapshots.ReusedTokens < 0 {
		h.failf(call, "Stats counters are non-negative", "%+v", st)
	}
	if !slices.Equal(st.Pools, h.snap.Pools) {
		h.failf(call, "Stats.Pools and Inspect's Pools agree", "Stats %s, Inspect %s", fmtPoolStats(st.Pools), fmtPoolStats(h.snap.Pools))
	}
	suspended := 0
	for _, s := range h.snap.Seqs {
		if s.Suspended {
			suspended++
		}
	}
	if st.Sequences != len(h.snap.Seqs) || st.SuspendedSeqs != suspended {
		h.failf(call, "Stats.Sequences and SuspendedSeqs count Inspect's sequences", "Sequences %d, SuspendedSeqs %d; Inspect lists %d sequences, %d suspended",
			st.Sequences, st.SuspendedSeqs, len(h.snap.Seqs), suspended)
	}
	return st
}

func checkStats(h *mh) {
	h.setup(true, nil)
	h.statsAgree()
	p := prompt(2*h.tpb+5, 11)
	h.lookup(kvcache.LookupItem{Seq: h.id(), Prompt: p}, kvcache.LookupItem{Seq: h.id(), Prompt: p[:7]})
	if st := h.statsAgree(); st.LookupTokens != int64(len(p)+7) {
		h.failf("Stats() after "+h.last, "LookupTokens counts the prompt tokens looked up", "LookupTokens %d, want %d", st.LookupTokens, len(p)+7)
	}
	a := h.id()
	h.prefill(a, p, len(p))
	h.statsAgree()
	h.grant(kvcache.ReserveItem{Seq: a, Tokens: 1, Draft: h.cfg.MaxDraftTokens})
	h.statsAgree()
	h.commit(kvcache.CommitItem{Seq: a, Accepted: 1})
	h.statsAgree()

	// Configure again: the counters start over.
	h.last = "Configure(" + fmtConfig(h.cfg) + ") again"
	layout, err := h.m.Configure(h.ctx, h.cfg)
	if err != nil {
		h.failf(h.last, "a config that configured once configures again", "error %v", err)
	}
	h.useLayout(layout)
	h.inspect()
	if st := h.statsAgree(); st.LookupTokens != 0 || st.ReusedTokens != 0 || st.ReserveDenials != 0 || st.Evictions != 0 || st.Sequences != 0 {
		h.failf("Stats() after "+h.last, "Stats are cumulative counters since Configure", "%+v", st)
	}
}

func checkEmptyCalls(h *mh) {
	h.setup(h.o.Reuse, nil)
	a := h.id()
	h.prefill(a, nil, h.tpb+1)
	before := h.snap
	for _, empty := range []bool{false, true} {
		name := "nil"
		if empty {
			name = "empty"
		}
		var seqs []kvcache.SeqID
		var looks []kvcache.LookupItem
		var res []kvcache.ReserveItem
		var coms []kvcache.CommitItem
		if empty {
			seqs, looks, res, coms = []kvcache.SeqID{}, []kvcache.LookupItem{}, []kvcache.ReserveItem{}, []kvcache.CommitItem{}
		}
		fail := func(call, got string) {
			h.failf(call+" with "+name+" slices", "calls with nil or empty slices are fine: no error, nothing returned", "%s", got)
		}
		if n, err := h.m.Lookup(h.ctx, looks); err != nil || len(n) != 0 {
			fail("Lookup", fmt.Sprintf("%v, %v", n, err))
		}
		if g, err := h.m.Reserve(h.ctx, res); err != nil || len(g) != 0 {
			fail("Reserve", fmt.Sprintf("%+v, %v", g, err))
		}
		if err := h.m.Unreserve(h.ctx, seqs); err != nil {
			fail("Unreserve", fmt.Sprint(err))
		}
		if r, err := h.m.Commit(h.ctx, coms); err != nil || len(r.Copies) != 0 {
			fail("Commit", fmt.Sprintf("%+v, %v", r, err))
		}
		if err := h.m.Release(h.ctx, seqs); err != nil {
			fail("Release", fmt.Sprint(err))
		}
		var moves []struct {
			name string
			f    func() ([]bool, []kvcache.Copy, error)
		}
		if h.sp != nil {
			moves = append(moves, []struct {
				name string
				f    func() ([]bool, []kvcache.Copy, error)
			}{
				{"Suspend", func() ([]bool, []kvcache.Copy, error) { return h.sp.Suspend(h.ctx, seqs) }},
				{"Resume", func() ([]bool, []kvcache.Copy, error) { return h.sp.Resume(h.ctx, seqs) }},
			}...)
		}
		for _, mv := range moves {
			ok, cs, err := mv.f()
			if !h.info.Capabilities.HostTier && errors.Is(err, kvcache.ErrUnsupported) {
				continue
			}
			if err != nil || len(ok) != 0 || len(cs) != 0 {
				fail(mv.name, fmt.Sprintf("%v, %v, %v", ok, cs, err))
			}
		}
		h.last = "calls with " + name + " slices"
		h.inspect()
		if diff := diffSnap(before, h.snap); diff != "" {
			h.failf(h.last, "calls with nothing in them change nothing", "Inspect changed: %s", diff)
		}
	}
}

func checkCacheSalt(h *mh) {
	h.info = h.callInfo()
	if !h.reuseOn() || !h.info.Capabilities.CacheSalt {
		return // no reuse, or the host sends this manager no salt
	}
	h.setup(true, nil)
	tpb := h.tpb
	p := prompt(3*tpb+tpb/2, 13)
	look := func(salt string) int {
		return h.lookup(kvcache.LookupItem{Seq: h.id(), Prompt: p, CacheSalt: salt})[0]
	}
	run := func(salt string, reuse int) *kvcache.SeqState {
		id := h.id()
		h.grant(kvcache.ReserveItem{Seq: id, New: true, Prompt: p, Reuse: reuse, Tokens: len(p) - reuse, CacheSalt: salt})
		return h.commit1(id, len(p)-reuse)
	}
	a := run("conformance-a", 0)
	h.release(a.Seq)
	found := look("conformance-a")
	if found == 0 {
		h.failf(h.last, "a prompt committed under a cache salt is found under the same salt", "Lookup(salt %q) = 0 after Commit and Release", "conformance-a")
		return
	}
	if b, none := look("conformance-b"), look(""); b != 0 || none != 0 {
		h.failf(h.last, "a prompt committed under one cache salt is found under no other salt (nor unsalted)",
			"Lookup(salt %q) = %d, Lookup(no salt) = %d, want 0 and 0", "conformance-b", b, none)
	}
	g := h.reserve(kvcache.ReserveItem{Seq: h.id(), New: true, Prompt: p, Reuse: found, Tokens: len(p) - found, CacheSalt: "conformance-b"})[0]
	if g.OK {
		h.failf(h.last, "Reserve{Reuse} under a salt that holds none of the prompt is denied", "granted Reuse %d under salt %q", found, "conformance-b")
		h.unreserve(g.Seq)
	}
	same := run("conformance-a", found)
	other := run("conformance-b", 0)
	for _, i := range h.full {
		for _, blk := range other.Tables[i] {
			if slices.Contains(same.Tables[i], blk) {
				h.failf(h.last, "two salts never share a block", "pool %d: block %d in the tables of salt %q (%v) and of salt %q (%v)",
					h.layout.Pools[i].ID, blk, "conformance-a", same.Tables[i], "conformance-b", other.Tables[i])
			}
		}
	}
	if b := look("conformance-b"); b != found {
		h.failf(h.last, "within one salt reuse is as without salts", "Lookup(salt %q) = %d after its own Commit, want %d", "conformance-b", b, found)
	}
	h.release(same.Seq, other.Seq)
}

func checkKVEvents(h *mh) {
	h.info = h.callInfo()
	if !h.reuseOn() || !h.info.Capabilities.KVEvents {
		return
	}
	er, ok := h.m.(kvcache.EventReporter)
	if !ok {
		h.failf("Info()", "Capabilities.KVEvents only for a kvcache.EventReporter", "Info says KVEvents, but the manager (%T) has no Events method", h.m)
		return
	}
	events := func() []kvcache.Event {
		evs, err := er.Events(h.ctx)
		if err != nil {
			h.failf("Events()", "Events fails only when the plugin is gone", "error %v", err)
		}
		return evs
	}
	h.setup(true, nil)
	tpb := h.tpb
	p := prompt(3*tpb+tpb/2, 17)
	a := h.id()
	h.grant(kvcache.ReserveItem{Seq: a, New: true, Prompt: p, Tokens: len(p)})
	h.commit(kvcache.CommitItem{Seq: a, Accepted: len(p)})
	if evs := events(); len(evs) != 0 {
		h.failf("Events()", "without Config.KVEvents a manager records no events", "%d events", len(evs))
	}

	h.setup(true, func(c *kvcache.Config) { c.KVEvents = true })
	evs := events()
	if len(evs) != 1 || evs[0].Kind != kvcache.AllBlocksCleared {
		h.failf("Events() after "+h.last, "Configure with KVEvents reports AllBlocksCleared (the cache starts empty)", "%s", fmtEvents(evs))
	}
	a = h.id()
	h.grant(kvcache.ReserveItem{Seq: a, New: true, Prompt: p, Tokens: len(p)})
	h.commit(kvcache.CommitItem{Seq: a, Accepted: len(p)})
	stored := map[uint64]bool{}
	var toks []int32
	var prev uint64
	for _, e := range events() {
		if e.Kind != kvcache.BlockStored {
			continue
		}
		if len(e.Tokens) != len(e.Hashes)*e.BlockSize || e.BlockSize != tpb {
			h.failf("Events() after "+h.last, "a BlockStored carries BlockSize tokens per hash, BlockSize = TokensPerBlock",
				"%d hashes, %d tokens, block size %d (tokens_per_block %d)", len(e.Hashes), len(e.Tokens), e.BlockSize, tpb)
		}
		if len(toks) == 0 && e.HasParent || len(toks) > 0 && (!e.HasParent || e.Parent != prev) {
			h.failf("Events() after "+h.last, "a prompt's first block has no parent; each later BlockStored's parent is the hash stored before it",
				"parent %x (has %v) after %d stored tokens, want %x", e.Parent, e.HasParent, len(toks), prev)
		}
		for _, x := range e.Hashes {
			stored[x] = true
			prev = x
		}
		toks = append(toks, e.Tokens...)
	}
	if !slices.Equal(toks, p[:3*tpb]) || len(stored) != 3 {
		h.failf("Events() after "+h.last, "a commit past full prompt blocks reports them stored, in order, with their tokens",
			"%d distinct hashes, tokens %v, want 3 and %v", len(stored), toks, p[:3*tpb])
	}
	h.release(a)
	// Fill the device pools with fresh sequences until the cached blocks go.
	ever := maps.Clone(stored)
	var live []kvcache.SeqID
	removed := 0
	for k := 0; removed == 0 && k < 1000; k++ {
		id := h.id()
		g := h.reserve(kvcache.ReserveItem{Seq: id, New: true, Prompt: prompt(tpb, 100+k), Tokens: tpb})
		if !g[0].OK {
			break
		}
		h.commit(kvcache.CommitItem{Seq: id, Accepted: tpb})
		live = append(live, id)
		for _, e := range events() {
			switch e.Kind {
			case kvcache.BlockStored:
				for _, x := range e.Hashes {
					ever[x] = true
				}
			case kvcache.BlockRemoved:
				for _, x := range e.Hashes {
					if !ever[x] {
						h.failf("Events() after "+h.last, "BlockRemoved names stored blocks", "hash %x was never stored", x)
					}
					if stored[x] {
						removed++
					}
				}
			}
		}
	}
	if removed == 0 {
		h.failf(h.last, "evicting cached prompt blocks reports them BlockRemoved", "filled the cache with %d sequences: none of the prompt's 3 stored hashes removed", len(live))
	}
	h.release(live...)
}

func fmtEvents(evs []kvcache.Event) string {
	parts := make([]string, len(evs))
	for i, e := range evs {
		parts[i] = fmt.Sprintf("%v%x", e.Kind, e.Hashes)
	}
	return "[" + strings.Join(parts, " ") + "]"
}
