package cachemgrv2

import (
	"errors"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"
	"testing"

	"pgregory.net/rapid"

	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
	"github.com/kvx-dev/kvx/plugins/v1/spec"
)

// harness drives a Manager like the core and a worker would, with a model of
// every sequence's ledger and a simulated worker memory: each block slot
// holds the token whose KV was written there. At every grant and before
// every forward the worker's view of a sequence's table (built only from
// grant deltas) must equal the manager's, and every history position must
// read back the right token through it. That catches wrong reuse, lost or
// overwritten live blocks, bad suspend/resume copies and bad table deltas.
//
// As in the engine, a grant's copies run only when the reservation is kept:
// with the step's forward, before any later manager call but the step's
// Unreserves can change what they read (flush runs them before every call
// but Unreserve); the step's writes come just before its Commit. An undone
// grant copies and writes nothing. So cached content an Unreserve puts back
// (undo.go) must read back right when it is reused.
type harness struct {
	t      *rapid.T
	m      *Manager
	cfg    kvcache.Config
	tpb    int
	mem    [][]int64 // per pool, block*tpb+slot
	seqs   map[kvcache.SeqID]*modelSeq
	nextID kvcache.SeqID
	// pending are the kept grants' copies not run yet, in grant order.
	pending []pendingCopies
	// prompts are the last prompts started, whose blocks may be cached
	// after their sequences ended (bounce looks them up).
	prompts [][]int32
	clock   int64 // the engine time sent in Now, advanced by newSeq

	hostGrants int // grants that brought blocks back from the host tier

	// With KV events: the hashes the events read so far say each tier
	// holds (events), and how many host events were read.
	evDev, evHost map[uint64]bool
	hostEvents    int
}

type pendingCopies struct {
	seq    kvcache.SeqID
	copies []kvcache.Copy
}

// flush runs the copies of every kept grant (the forward they belong to
// runs before any later call can change their sources).
func (h *harness) flush() {
	for _, p := range h.pending {
		h.applyCopies(p.copies)
		if s := h.seqs[p.seq]; s != nil {
			s.copies, s.ran = nil, true
		}
	}
	h.pending = h.pending[:0]
}

type modelSeq struct {
	prompt          []int32
	hist, cap, hold int
	tokens, draft   int
	reserved        bool
	created         bool // the outstanding reservation created the sequence
	suspended       bool
	mirror          [][]kvcache.BlockID // the worker's tables, per device pool
	before          kvcache.SeqState    // state before the outstanding reservation
	copies          []kvcache.Copy      // the outstanding grant's, made by its forward
	ran             bool                // its copies ran (flush): the reservation must be committed, not undone
}

func (h *harness) token(id kvcache.SeqID, s *modelSeq, pos int) int64 {
	if pos < len(s.prompt) {
		return int64(s.prompt[pos]) + 1
	}
	return int64(id)<<32 | int64(pos) | 1<<62
}

func (h *harness) snapshot() kvcache.Snapshot {
	snap, err := h.m.Inspect(ctx, kvcache.InspectOptions{Tables: true})
	if err != nil {
		h.t.Fatalf("Inspect: %v", err)
	}
	if err := externalCheck(h.m, snap); err != nil {
		h.t.Fatal(err)
	}
	return snap
}

func (h *harness) state(id kvcache.SeqID) kvcache.SeqState {
	for _, s := range h.snapshot().Seqs {
		if s.Seq == id {
			return s
		}
	}
	h.t.Fatalf("seq %d missing", id)
	return kvcache.SeqState{}
}

func (h *harness) applyCopies(cs []kvcache.Copy) {
	for _, c := range cs {
		copy(h.mem[c.DstPool][int(c.DstBlock)*h.tpb:int(c.DstBlock+1)*h.tpb], h.mem[c.SrcPool][int(c.SrcBlock)*h.tpb:int(c.SrcBlock+1)*h.tpb])
	}
}

// granted applies a grant's table deltas as the worker would and checks its
// tables; the grant's forward waits for its Commit.
func (h *harness) granted(id kvcache.SeqID, s *modelSeq, g kvcache.Grant) {
	for _, d := range g.Tables {
		s.mirror[d.Pool] = append(s.mirror[d.Pool][:min(d.From, len(s.mirror[d.Pool]))], d.Blocks...)
		if d.From > len(s.mirror[d.Pool]) {
			h.t.Fatalf("seq %d: delta From %d beyond the worker's table of %d", id, d.From, len(s.mirror[d.Pool]))
		}
	}
	st := h.state(id)
	for p := range h.m.dev {
		if !slices.Equal(s.mirror[p], st.Tables[p]) {
			h.t.Fatalf("seq %d pool %d: worker table %v, manager table %v", id, p, s.mirror[p], st.Tables[p])
		}
	}
	s.copies = g.Copies
	if len(g.Copies) > 0 {
		h.pending = append(h.pending, pendingCopies{id, g.Copies})
	}
}

// forward runs the outstanding grant's forward as the worker would: it
// makes the grant's copies, checks what it reads and writes the step's
// tokens.
func (h *harness) forward(id kvcache.SeqID, s *modelSeq) {
	h.flush()
	st := h.state(id)
	for p := range h.m.dev {
		if !slices.Equal(s.mirror[p], st.Tables[p]) {
			h.t.Fatalf("seq %d pool %d: worker table %v, manager table %v", id, p, s.mirror[p], st.Tables[p])
		}
		for pos := 0; pos < s.hist; pos++ {
			b := st.Tables[p][pos/h.tpb]
			if got, want := h.mem[p][int(b)*h.tpb+pos%h.tpb], h.token(id, s, pos); got != want {
				h.t.Fatalf("seq %d pool %d pos %d (block %d): read %x, want %x", id, p, pos, b, got, want)
			}
		}
		for pos := s.hist; pos < s.hist+s.tokens+s.draft; pos++ {
			b := st.Tables[p][pos/h.tpb]
			h.mem[p][int(b)*h.tpb+pos%h.tpb] = h.token(id, s, pos)
		}
	}
}

// newHarness is a harness for m, configured with cfg into lay, with the
// worker's memory model of every pool.
func newHarness(t *rapid.T, m *Manager, cfg kvcache.Config, tpb int, lay kvcache.Layout) *harness {
	h := &harness{t: t, m: m, cfg: cfg, tpb: tpb, seqs: map[kvcache.SeqID]*modelSeq{}, nextID: 1}
	for _, p := range lay.Pools {
		h.mem = append(h.mem, make([]int64, p.Blocks*tpb))
	}
	return h
}

// actions is the legal operations every randomized test of the harness
// draws from, with extra's added (or replacing the one of the same name).
func (h *harness) actions(extra map[string]func(*rapid.T)) map[string]func(*rapid.T) {
	a := map[string]func(*rapid.T){
		"new": h.newSeq,
		"step": func(t *rapid.T) {
			id, s := h.pick(steppable)
			h.reserveOne(h.stepItem(t, id, s), s)
		},
		"batch":     h.stepBatch,
		"commit":    h.commit,
		"unreserve": h.unreserve,
		"suspend":   h.suspend,
		"resume":    h.resume,
		"release":   h.release,
	}
	maps.Copy(a, extra)
	return a
}

func (h *harness) pick(filter func(*modelSeq) bool) (kvcache.SeqID, *modelSeq) {
	var ids []kvcache.SeqID
	for _, id := range slices.Sorted(maps.Keys(h.seqs)) {
		if filter(h.seqs[id]) {
			ids = append(ids, id)
		}
	}
	if len(ids) == 0 {
		h.t.Skip("no candidate")
	}
	id := rapid.SampledFrom(ids).Draw(h.t, "seq")
	return id, h.seqs[id]
}

// reserveOne reserves one item and checks the answer against the model.
func (h *harness) reserveOne(it kvcache.ReserveItem, s *modelSeq) {
	h.flush()
	before := h.snapshot()
	if !it.New {
		s.before = h.state(it.Seq)
	}
	g := reserve1(h.t, h.m, it)
	if !g.OK {
		if !strings.HasPrefix(g.Reason, "no capacity") {
			h.t.Fatalf("Reserve(%+v) denied: %s", it, g.Reason)
		}
		if after := h.snapshot(); !reflect.DeepEqual(after, before) {
			h.t.Fatalf("denial changed state:\n got %+v\nwant %+v", after, before)
		}
		return
	}
	if it.New {
		h.seqs[it.Seq] = s
		s.hist, s.cap, s.created = it.Reuse, it.Reuse, true
		if g.HostReused < 0 || g.HostReused > it.Reuse || g.HostReused%h.tpb != 0 {
			h.t.Fatalf("HostReused %d for Reuse %d", g.HostReused, it.Reuse)
		}
		if g.HostReused > 0 {
			h.hostGrants++
		}
	}
	s.tokens, s.draft, s.reserved, s.ran = it.Tokens, it.Draft, true, false
	s.hold = max(s.hold, it.Hold)
	s.cap = max(s.cap, s.hist+it.Tokens+it.Draft, s.hold)
	h.granted(it.Seq, s, g)
}

func (h *harness) newSeq(t *rapid.T) {
	prompt := rapid.SliceOfN(rapid.Int32Range(1, 3), 1, h.cfg.MaxSeqLen-4).Draw(t, "prompt")
	id := h.nextID
	h.nextID++
	reuse := 0
	if h.cfg.EnableBlockReuse {
		look, err := h.m.Lookup(ctx, []kvcache.LookupItem{{Seq: id, Prompt: prompt}})
		if err != nil {
			t.Fatal(err)
		}
		if look[0] > len(prompt)-1 || (!h.m.partial && look[0]%h.tpb != 0) {
			t.Fatalf("Lookup = %d for a prompt of %d", look[0], len(prompt))
		}
		if rapid.Bool().Draw(t, "reuse") {
			reuse = look[0]
		}
	}
	tokens := rapid.IntRange(1, min(len(prompt)-reuse, h.cfg.MaxNumTokens)).Draw(t, "tokens")
	hold := 0
	if rapid.IntRange(0, 4).Draw(t, "holdp") == 0 {
		hold = rapid.IntRange(len(prompt), h.cfg.MaxSeqLen).Draw(t, "hold")
	}
	s := &modelSeq{prompt: prompt, mirror: make([][]kvcache.BlockID, len(h.m.dev))}
	if h.prompts = append(h.prompts, prompt); len(h.prompts) > 16 {
		h.prompts = h.prompts[1:]
	}
	h.clock += rapid.Int64Range(0, 20).Draw(t, "elapsed")
	h.reserveOne(kvcache.ReserveItem{Seq: id, Tokens: tokens, Hold: hold, New: true, Prompt: prompt, Reuse: reuse,
		Priority:         rapid.SampledFrom([]int{0, 0, 1, 20, 35, 60, 100}).Draw(t, "priority"),
		PriorityDuration: rapid.SampledFrom([]int64{0, 0, 5, 40}).Draw(t, "duration"),
		Now:              h.clock}, s)
}

// badPriority asks for a retention priority out of range: denied as
// invalid, nothing changes.
func (h *harness) badPriority(t *rapid.T) {
	prio := rapid.SampledFrom([]int{-1, 101, 1000}).Draw(t, "bad priority")
	it := kvcache.ReserveItem{Seq: h.nextID, Tokens: 1, New: true, Prompt: []int32{1, 2}, Priority: prio, Now: h.clock}
	before := h.snapshot()
	if g := reserve1(t, h.m, it); g.OK || !strings.HasPrefix(g.Reason, "invalid: ") || !strings.Contains(g.Reason, fmt.Sprint(prio)) {
		t.Fatalf("Reserve(priority %d) = %v %q, want denied as invalid", prio, g.OK, g.Reason)
	}
	if !reflect.DeepEqual(h.snapshot(), before) {
		t.Fatal("invalid priority changed state")
	}
}

// events reads the KV events recorded since the last read and checks them:
// a BlockStored names a hash its tier does not hold yet, a BlockRemoved one
// it holds; then each tier's hashes, as the events built them, are the
// tree's: the nodes with device pages, and those with settled host content
// (a pending promotion's host copy included, a pending offload's not).
// Reads are drawn like any action, so that Unreserve also meets unread
// events, which it takes back when it puts content back.
func (h *harness) events(t *rapid.T) {
	if !h.cfg.KVEvents {
		t.Skip("events off")
	}
	evs, err := h.m.Events(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if h.evDev == nil {
		h.evDev, h.evHost = map[uint64]bool{}, map[uint64]bool{}
	}
	for _, e := range evs {
		set := h.evDev
		if e.Tier == kvcache.TierHost {
			set = h.evHost
			h.hostEvents++
		}
		switch e.Kind {
		case kvcache.AllBlocksCleared:
			clear(h.evDev)
			clear(h.evHost)
		case kvcache.BlockStored:
			for _, x := range e.Hashes {
				if set[x] {
					t.Fatalf("BlockStored %v of %x, which that tier holds already", e.Tier, x)
				}
				set[x] = true
			}
			if e.Tier == kvcache.TierHost && (len(e.Tokens) != 0 || e.HasParent || e.BlockSize != h.tpb) {
				t.Fatalf("host BlockStored %+v: want no tokens, no parent, block size %d", e, h.tpb)
			}
		case kvcache.BlockRemoved:
			for _, x := range e.Hashes {
				if !set[x] {
					t.Fatalf("BlockRemoved %v of %x, which that tier does not hold", e.Tier, x)
				}
				delete(set, x)
			}
		}
	}
	dev, host := map[uint64]bool{}, map[uint64]bool{}
	for _, n := range h.m.tree.all {
		if n.nPages > 0 {
			dev[n.chain] = true
		}
		if n.h.n > 0 && (n.nPages > 0 || n.h.pend == 0) {
			host[n.chain] = true
		}
	}
	if !maps.Equal(dev, h.evDev) || !maps.Equal(host, h.evHost) {
		t.Fatalf("the events say %d device and %d host blocks, the tree holds %d and %d", len(h.evDev), len(h.evHost), len(dev), len(host))
	}
}

// explain checks Explain against Lookup and the reasons against what the
// harness knows: it changes nothing, Tokens is Lookup's, the reason fits.
func (h *harness) explain(t *rapid.T) {
	prompt := rapid.SliceOfN(rapid.Int32Range(1, 3), 1, h.cfg.MaxSeqLen).Draw(t, "eprompt")
	items := []kvcache.LookupItem{{Prompt: prompt, Now: h.clock}}
	before := h.snapshot()
	ex, err := h.m.Explain(ctx, items)
	if err != nil {
		t.Fatal(err)
	}
	look, err := h.m.Lookup(ctx, items)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(h.snapshot(), before) {
		t.Fatal("Explain changed state")
	}
	e, full := ex[0], max(len(prompt)-1, 0)/h.tpb*h.tpb
	policy := h.cfg.EvictionPolicy
	if policy == "" {
		policy = kvcache.EvictionLRU
	}
	_, onHost := h.m.LookupTiers("", prompt)
	switch {
	case e.Tokens != look[0] || e.HostTokens != onHost:
		t.Fatalf("Explain = %+v, Lookup %d (%d on the host tier)", e, look[0], onHost)
	case !h.cfg.EnableBlockReuse:
		if e.Miss != kvcache.MissReuseOff {
			t.Fatalf("reuse off: Explain = %+v", e)
		}
	case e.Miss == kvcache.MissPartialBlock:
		if e.Tokens < full {
			t.Fatalf("Explain(%d tokens) = %+v: partial block before the last full block %d", len(prompt), e, full)
		}
	case e.Tokens >= full && len(prompt) > 1:
		t.Fatalf("Explain(%d tokens) = %+v: reached the last full block, want partial_block", len(prompt), e)
	case e.Miss == kvcache.MissEvicted:
		// With a host tier for reuse, content lost there was last on the host.
		tierOK := e.EvictedTier == kvcache.TierDevice || e.EvictedTier == kvcache.TierHost && h.m.hostReuse()
		if !tierOK || e.EvictedBy != policy && e.EvictedBy != "priority" || e.EvictedAt > h.clock {
			t.Fatalf("Explain = %+v: want evicted on device (or host, with a host tier for reuse) by %s or priority, at most %d", e, policy, h.clock)
		}
	case e.Miss != kvcache.MissNeverStored && e.Miss != kvcache.MissInFlight:
		t.Fatalf("Explain = %+v: no salt, no hooks: want never_stored, in_flight or evicted", e)
	}
}

// stepItem draws the next step of a resident sequence without a reservation.
func (h *harness) stepItem(t *rapid.T, id kvcache.SeqID, s *modelSeq) kvcache.ReserveItem {
	if s.hist < len(s.prompt) {
		return kvcache.ReserveItem{Seq: id, Tokens: rapid.IntRange(1, min(len(s.prompt)-s.hist, h.cfg.MaxNumTokens)).Draw(t, "chunk"), Now: h.clock}
	}
	return kvcache.ReserveItem{Seq: id, Tokens: 1, Draft: rapid.IntRange(0, h.cfg.MaxDraftTokens).Draw(t, "draft"), Now: h.clock}
}

func steppable(s *modelSeq) bool { return !s.reserved && !s.suspended && s.hist < 24 }

func (h *harness) commit(t *rapid.T) {
	id, s := h.pick(func(s *modelSeq) bool { return s.reserved })
	a := rapid.IntRange(s.tokens, s.tokens+s.draft).Draw(t, "accepted")
	h.forward(id, s)
	ev0, _ := h.m.Stats(ctx)
	free0 := h.snapshot().Pools
	mustCommit(t, h.m, id, a)
	ev1, _ := h.m.Stats(ctx)
	if ev1.Evictions != ev0.Evictions {
		t.Fatalf("Commit evicted %d blocks", ev1.Evictions-ev0.Evictions)
	}
	for p, ps := range h.snapshot().Pools {
		if ps.Free < free0[p].Free {
			t.Fatalf("Commit allocated: pool %d free %d -> %d", p, free0[p].Free, ps.Free)
		}
	}
	s.hist += a
	s.cap = max(s.hist, s.hold)
	s.tokens, s.draft, s.reserved, s.created, s.ran = 0, 0, false, false, false
}

func (h *harness) badCommit(t *rapid.T) {
	id, s := h.pick(func(s *modelSeq) bool { return s.reserved })
	before := h.snapshot()
	_, err := h.m.Commit(ctx, []kvcache.CommitItem{{Seq: id, Accepted: s.tokens + s.draft + 1}})
	var ke *kvcache.Error
	if !errors.As(err, &ke) || !slices.Equal(ke.Seqs, []kvcache.SeqID{id}) {
		t.Fatalf("Commit beyond the reservation = %v, want an item error", err)
	}
	if after := h.snapshot(); !reflect.DeepEqual(after, before) {
		t.Fatal("invalid Commit changed state")
	}
}

func (h *harness) unreserve(t *rapid.T) {
	id, s := h.pick(func(s *modelSeq) bool { return s.reserved && !s.ran })
	if err := h.m.Unreserve(ctx, []kvcache.SeqID{id}); err != nil {
		t.Fatal(err)
	}
	h.pending = slices.DeleteFunc(h.pending, func(p pendingCopies) bool { return p.seq == id })
	if s.created {
		delete(h.seqs, id)
		return
	}
	if got := h.state(id); !reflect.DeepEqual(got, s.before) {
		t.Fatalf("Unreserve: %+v, want %+v", got, s.before)
	}
	s.cap, s.hold = s.before.Capacity, s.before.Hold
	s.tokens, s.draft, s.reserved, s.copies = 0, 0, false, nil
}

// bounce reserves one item and unreserves it at once, as a pipeline stage
// does whose grant another stage denied: everything must be as before, the
// cached content the reservation evicted included (undo.go), and a later
// reuse of it reads the right tokens (forward). The undone grant's deltas
// and copies are never applied, as in the engine.
func (h *harness) bounce(t *rapid.T) {
	var it kvcache.ReserveItem
	var ids []kvcache.SeqID
	for _, id := range slices.Sorted(maps.Keys(h.seqs)) {
		if steppable(h.seqs[id]) {
			ids = append(ids, id)
		}
	}
	if len(ids) > 0 && rapid.Bool().Draw(t, "bounce a step") {
		id := rapid.SampledFrom(ids).Draw(t, "seq")
		it = h.stepItem(t, id, h.seqs[id])
	} else {
		prompt := rapid.SliceOfN(rapid.Int32Range(1, 3), 1, h.cfg.MaxSeqLen-4).Draw(t, "bprompt")
		it = kvcache.ReserveItem{Seq: h.nextID, New: true, Prompt: prompt}
		if h.cfg.EnableBlockReuse && rapid.Bool().Draw(t, "breuse") {
			it.Reuse = h.lookups([][]int32{prompt})[0]
		}
		it.Tokens = rapid.IntRange(1, min(len(prompt)-it.Reuse, h.cfg.MaxNumTokens)).Draw(t, "btokens")
		if rapid.Bool().Draw(t, "bhold") {
			it.Hold = rapid.IntRange(len(prompt), h.cfg.MaxSeqLen).Draw(t, "bhold tokens")
		}
	}
	before, look := h.snapshot(), h.lookups(h.prompts)
	ev0, _ := h.m.Stats(ctx)
	if g := reserve1(t, h.m, it); !g.OK {
		if !strings.HasPrefix(g.Reason, "no capacity") {
			t.Fatalf("Reserve(%+v) denied: %s", it, g.Reason)
		}
		return
	}
	if err := h.m.Unreserve(ctx, []kvcache.SeqID{it.Seq}); err != nil {
		t.Fatal(err)
	}
	ev1, _ := h.m.Stats(ctx)
	if after := h.snapshot(); !reflect.DeepEqual(after, before) {
		t.Fatalf("Reserve(%+v) then Unreserve (%d blocks evicted) changed state:\n got %+v\nwant %+v",
			it, ev1.Evictions-ev0.Evictions, after, before)
	}
	if got := h.lookups(h.prompts); !slices.Equal(got, look) {
		t.Fatalf("Reserve(%+v) then Unreserve (%d blocks evicted): Lookup %v, was %v", it, ev1.Evictions-ev0.Evictions, got, look)
	}
}

// lookups looks prompts up.
func (h *harness) lookups(prompts [][]int32) []int {
	items := make([]kvcache.LookupItem, len(prompts))
	for i, p := range prompts {
		items[i].Prompt = p
	}
	n, err := h.m.Lookup(ctx, items)
	if err != nil {
		h.t.Fatal(err)
	}
	return n
}

func (h *harness) suspend(t *rapid.T) {
	id, s := h.pick(func(s *modelSeq) bool { return !s.suspended })
	h.flush()
	before := h.snapshot()
	ok, copies, err := h.m.Suspend(ctx, []kvcache.SeqID{id})
	if h.m.host == nil {
		if !errors.Is(err, kvcache.ErrUnsupported) {
			t.Fatalf("Suspend without host tier = %v", err)
		}
		return
	}
	if s.reserved {
		if err == nil || ok[0] || !reflect.DeepEqual(h.snapshot(), before) {
			t.Fatalf("Suspend with a reservation = %v, %v: want refused, nothing changed", ok, err)
		}
		return
	}
	if err != nil {
		t.Fatal(err)
	}
	if !ok[0] {
		if !reflect.DeepEqual(h.snapshot(), before) {
			t.Fatal("refused Suspend changed state")
		}
		return
	}
	h.applyCopies(copies)
	s.suspended = true
}

func (h *harness) resume(t *rapid.T) {
	id, s := h.pick(func(s *modelSeq) bool { return s.suspended })
	h.flush()
	before := h.snapshot()
	ok, copies, err := h.m.Resume(ctx, []kvcache.SeqID{id})
	if err != nil {
		t.Fatal(err)
	}
	if !ok[0] {
		if !reflect.DeepEqual(h.snapshot(), before) {
			t.Fatal("refused Resume changed state")
		}
		return
	}
	h.applyCopies(copies)
	s.suspended = false
}

func (h *harness) release(t *rapid.T) {
	id, _ := h.pick(func(*modelSeq) bool { return true })
	h.flush()
	if err := h.m.Release(ctx, []kvcache.SeqID{id}); err != nil {
		t.Fatal(err)
	}
	delete(h.seqs, id)
}

func (h *harness) lookup(t *rapid.T) {
	prompt := rapid.SliceOfN(rapid.Int32Range(1, 3), 1, h.cfg.MaxSeqLen).Draw(t, "lprompt")
	before := h.snapshot()
	look, err := h.m.Lookup(ctx, []kvcache.LookupItem{{Prompt: prompt, Now: h.clock}})
	if err != nil {
		t.Fatal(err)
	}
	if n := look[0]; n < 0 || n > max(len(prompt)-1, 0) || (!h.m.partial && n%h.tpb != 0) || (!h.cfg.EnableBlockReuse && n != 0) {
		t.Fatalf("Lookup(%d tokens) = %d", len(prompt), n)
	}
	if !reflect.DeepEqual(h.snapshot(), before) {
		t.Fatal("Lookup changed state")
	}
}

// stepBatch reserves the next step of several sequences in one call.
func (h *harness) stepBatch(t *rapid.T) {
	var items []kvcache.ReserveItem
	for _, id := range slices.Sorted(maps.Keys(h.seqs)) {
		if s := h.seqs[id]; steppable(s) && rapid.Bool().Draw(t, "in batch") {
			items = append(items, h.stepItem(t, id, s))
		}
	}
	h.flush()
	for _, it := range items {
		h.seqs[it.Seq].before = h.state(it.Seq)
	}
	gs, err := h.m.Reserve(ctx, items)
	if err != nil {
		t.Fatal(err)
	}
	for i, g := range gs {
		it, s := items[i], h.seqs[items[i].Seq]
		if g.Seq != it.Seq {
			t.Fatalf("grant %d for seq %d, want %d", i, g.Seq, it.Seq)
		}
		if !g.OK {
			if !strings.HasPrefix(g.Reason, "no capacity") {
				t.Fatalf("denied: %s", g.Reason)
			}
			continue
		}
		s.tokens, s.draft, s.reserved, s.ran = it.Tokens, it.Draft, true, false
		s.cap = max(s.cap, s.hist+it.Tokens+it.Draft, s.hold)
		h.granted(it.Seq, s, g)
	}
}

func (h *harness) check(t *rapid.T) {
	snap := h.snapshot()
	if len(snap.Seqs) != len(h.seqs) {
		t.Fatalf("manager holds %d sequences, model %d", len(snap.Seqs), len(h.seqs))
	}
	for _, st := range snap.Seqs {
		s := h.seqs[st.Seq]
		if s == nil {
			t.Fatalf("unexpected seq %d", st.Seq)
		}
		want := kvcache.SeqState{Seq: st.Seq, History: s.hist, Capacity: s.cap, Hold: s.hold, Suspended: s.suspended}
		if s.reserved {
			want.Reserved, want.Draft = s.tokens+s.draft, s.draft
		}
		got := st
		got.Blocks, got.Tables = nil, nil
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("ledger %+v, model %+v", got, want)
		}
	}
}

// newBatch starts several sequences in one Reserve call, each reusing what
// a Lookup before the call said: later items share what earlier ones bring
// back from the host tier (the same copy in both grants).
func (h *harness) newBatch(t *rapid.T) {
	if !h.cfg.EnableBlockReuse {
		t.Skip("reuse off")
	}
	base := rapid.SliceOfN(rapid.Int32Range(1, 3), 1, h.cfg.MaxSeqLen-6).Draw(t, "base")
	k := rapid.IntRange(2, 3).Draw(t, "batch size")
	var items []kvcache.ReserveItem
	var seqs []*modelSeq
	for range k {
		prompt := append(slices.Clone(base), rapid.SliceOfN(rapid.Int32Range(1, 3), 1, 2).Draw(t, "tail")...)
		look, err := h.m.Lookup(ctx, []kvcache.LookupItem{{Prompt: prompt}})
		if err != nil {
			t.Fatal(err)
		}
		id := h.nextID
		h.nextID++
		reuse := look[0]
		tokens := rapid.IntRange(1, min(len(prompt)-reuse, h.cfg.MaxNumTokens)).Draw(t, "tokens")
		items = append(items, kvcache.ReserveItem{Seq: id, Tokens: tokens, New: true, Prompt: prompt, Reuse: reuse})
		seqs = append(seqs, &modelSeq{prompt: prompt, mirror: make([][]kvcache.BlockID, len(h.m.dev))})
	}
	gs, err := h.m.Reserve(ctx, items)
	if err != nil {
		t.Fatal(err)
	}
	for i, g := range gs {
		it, s := items[i], seqs[i]
		if !g.OK {
			// An earlier item may have evicted what a later one's Lookup saw.
			if !strings.HasPrefix(g.Reason, "no capacity") && !strings.HasPrefix(g.Reason, "reuse") {
				t.Fatalf("denied: %s", g.Reason)
			}
			continue
		}
		if g.HostReused < 0 || g.HostReused > it.Reuse || g.HostReused%h.tpb != 0 {
			t.Fatalf("HostReused %d for Reuse %d", g.HostReused, it.Reuse)
		}
		if g.HostReused > 0 {
			h.hostGrants++
		}
		h.seqs[it.Seq] = s
		s.hist, s.cap, s.created = it.Reuse, it.Reuse, true
		s.tokens, s.reserved = it.Tokens, true
		s.cap = max(s.cap, s.hist+it.Tokens)
		h.granted(it.Seq, s, g)
	}
}

func TestProperty(t *testing.T) { rapid.Check(t, func(t *rapid.T) { propertyRun(t, false) }) }

// TestPropertyHostReuse is TestProperty with reuse and a host tier always
// on and a small device pool: cached blocks go to the host tier and come
// back under the deep self-check, with suspends sharing the host budget and
// batches of new sequences sharing promotions. The simulated worker memory
// proves that every block a sequence reads back holds its tokens.
func TestPropertyHostReuse(t *testing.T) {
	hostGrants, offloads, hostEvents := 0, int64(0), 0
	rapid.Check(t, func(t *rapid.T) {
		h := propertyRun(t, true)
		hostGrants += h.hostGrants
		offloads += h.m.offloaded
		hostEvents += h.hostEvents
	})
	if hostGrants == 0 || offloads == 0 || hostEvents == 0 {
		t.Fatalf("%d grants reused host blocks, %d offloads, %d host KV events read: the test no longer reaches the host tier", hostGrants, offloads, hostEvents)
	}
	t.Logf("%d grants reused host blocks, %d offloads, %d host KV events read", hostGrants, offloads, hostEvents)
}

func propertyRun(t *rapid.T, hostReuse bool) *harness {
	{
		tpb := rapid.SampledFrom([]int{2, 4}).Draw(t, "tpb")
		layers := []spec.Layer{dsaLayer(0, false), dsaLayer(1, true)}
		if rapid.Bool().Draw(t, "two groups") {
			layers = append(layers, gqaLayer(2, 8))
		}
		cfg := kvcache.Config{
			Layers: layers, TokensPerBlock: tpb, MaxBatchSize: 4, MaxNumTokens: 8, MaxSeqLen: 24, MaxDraftTokens: 2,
			EnableBlockReuse: hostReuse || rapid.IntRange(0, 3).Draw(t, "reuse") > 0,
			EvictionPolicy:   rapid.SampledFrom([]string{"", "lru", "lfu"}).Draw(t, "policy"),
		}
		cfg.KVEvents = cfg.EnableBlockReuse && rapid.Bool().Draw(t, "events")
		bb := stageBlockBytes(layers, tpb)
		floor := kvcache.BlocksFor(26, tpb)
		extra, hostMin := 16, 0
		if hostReuse {
			extra, hostMin = 6, 2
		}
		cfg.DeviceBytes = int64(rapid.IntRange(floor, floor+extra).Draw(t, "device blocks")) * bb
		cfg.HostBytes = int64(rapid.IntRange(hostMin, 12).Draw(t, "host blocks")) * bb
		m := New()
		m.partial = rapid.Bool().Draw(t, "partial")
		lay, err := m.Configure(ctx, cfg)
		if err != nil {
			t.Fatal(err)
		}
		h := newHarness(t, m, cfg, tpb, lay)
		t.Repeat(h.actions(map[string]func(*rapid.T){
			"badCommit": h.badCommit,
			"bounce":    h.bounce,
			"lookup":    h.lookup,
			"newBatch":  h.newBatch,
			"explain":   h.explain,
			"badPrio":   h.badPriority,
			"events":    h.events,
			"":          h.check,
		}))
		return h
	}
}
