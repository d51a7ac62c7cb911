package cachemgrv2

import (
	"errors"
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
// holds the token whose KV was written there. Before every forward the
// worker's view of a sequence's table (built only from grant deltas) must
// equal the manager's, and every history position must read back the right
// token through it. That catches wrong reuse, lost or overwritten live
// blocks, bad suspend/resume copies and bad table deltas.
type harness struct {
	t      *rapid.T
	m      *Manager
	cfg    kvcache.Config
	tpb    int
	mem    [][]int64 // per pool, block*tpb+slot
	seqs   map[kvcache.SeqID]*modelSeq
	nextID kvcache.SeqID

	hostGrants int // grants that brought blocks back from the host tier
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

// forward applies a grant as the worker would, checks what it reads and
// writes the step's tokens.
func (h *harness) forward(id kvcache.SeqID, s *modelSeq, g kvcache.Grant) {
	for _, d := range g.Tables {
		s.mirror[d.Pool] = append(s.mirror[d.Pool][:min(d.From, len(s.mirror[d.Pool]))], d.Blocks...)
		if d.From > len(s.mirror[d.Pool]) {
			h.t.Fatalf("seq %d: delta From %d beyond the worker's table of %d", id, d.From, len(s.mirror[d.Pool]))
		}
	}
	h.applyCopies(g.Copies)
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
	s.tokens, s.draft, s.reserved = it.Tokens, it.Draft, true
	s.hold = max(s.hold, it.Hold)
	s.cap = max(s.cap, s.hist+it.Tokens+it.Draft, s.hold)
	h.forward(it.Seq, s, g)
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
	h.reserveOne(kvcache.ReserveItem{Seq: id, Tokens: tokens, Hold: hold, New: true, Prompt: prompt, Reuse: reuse}, s)
}

// stepItem draws the next step of a resident sequence without a reservation.
func (h *harness) stepItem(t *rapid.T, id kvcache.SeqID, s *modelSeq) kvcache.ReserveItem {
	if s.hist < len(s.prompt) {
		return kvcache.ReserveItem{Seq: id, Tokens: rapid.IntRange(1, min(len(s.prompt)-s.hist, h.cfg.MaxNumTokens)).Draw(t, "chunk")}
	}
	return kvcache.ReserveItem{Seq: id, Tokens: 1, Draft: rapid.IntRange(0, h.cfg.MaxDraftTokens).Draw(t, "draft")}
}

func steppable(s *modelSeq) bool { return !s.reserved && !s.suspended && s.hist < 24 }

func (h *harness) commit(t *rapid.T) {
	id, s := h.pick(func(s *modelSeq) bool { return s.reserved })
	a := rapid.IntRange(s.tokens, s.tokens+s.draft).Draw(t, "accepted")
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
	s.tokens, s.draft, s.reserved, s.created = 0, 0, false, false
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
	id, s := h.pick(func(s *modelSeq) bool { return s.reserved })
	if err := h.m.Unreserve(ctx, []kvcache.SeqID{id}); err != nil {
		t.Fatal(err)
	}
	if s.created {
		delete(h.seqs, id)
		return
	}
	if got := h.state(id); !reflect.DeepEqual(got, s.before) {
		t.Fatalf("Unreserve: %+v, want %+v", got, s.before)
	}
	s.cap, s.hold = s.before.Capacity, s.before.Hold
	s.tokens, s.draft, s.reserved = 0, 0, false
}

func (h *harness) suspend(t *rapid.T) {
	id, s := h.pick(func(s *modelSeq) bool { return !s.suspended })
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
	if err := h.m.Release(ctx, []kvcache.SeqID{id}); err != nil {
		t.Fatal(err)
	}
	delete(h.seqs, id)
}

func (h *harness) lookup(t *rapid.T) {
	prompt := rapid.SliceOfN(rapid.Int32Range(1, 3), 1, h.cfg.MaxSeqLen).Draw(t, "lprompt")
	before := h.snapshot()
	look, err := h.m.Lookup(ctx, []kvcache.LookupItem{{Prompt: prompt}})
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
		s.tokens, s.draft, s.reserved = it.Tokens, it.Draft, true
		s.cap = max(s.cap, s.hist+it.Tokens+it.Draft, s.hold)
		h.forward(it.Seq, s, g)
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
		h.forward(it.Seq, s, g)
	}
}

func TestProperty(t *testing.T) { rapid.Check(t, func(t *rapid.T) { propertyRun(t, false) }) }

// TestPropertyHostReuse is TestProperty with reuse and a host tier always
// on and a small device pool: cached blocks go to the host tier and come
// back under the deep self-check, with suspends sharing the host budget and
// batches of new sequences sharing promotions. The simulated worker memory
// proves that every block a sequence reads back holds its tokens.
func TestPropertyHostReuse(t *testing.T) {
	hostGrants, offloads := 0, int64(0)
	rapid.Check(t, func(t *rapid.T) {
		h := propertyRun(t, true)
		hostGrants += h.hostGrants
		offloads += h.m.offloaded
	})
	if hostGrants == 0 || offloads == 0 {
		t.Fatalf("%d grants reused host blocks, %d offloads: the test no longer reaches the host tier", hostGrants, offloads)
	}
	t.Logf("%d grants reused host blocks, %d offloads", hostGrants, offloads)
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
		}
		bb := stageBlockBytes(layers, tpb)
		floor := blocksFor(26, tpb)
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
		h := &harness{t: t, m: m, cfg: cfg, tpb: tpb, seqs: map[kvcache.SeqID]*modelSeq{}, nextID: 1}
		for _, p := range lay.Pools {
			h.mem = append(h.mem, make([]int64, p.Blocks*tpb))
		}
		t.Repeat(map[string]func(*rapid.T){
			"new": h.newSeq,
			"step": func(t *rapid.T) {
				id, s := h.pick(steppable)
				h.reserveOne(h.stepItem(t, id, s), s)
			},
			"batch":     h.stepBatch,
			"commit":    h.commit,
			"badCommit": h.badCommit,
			"unreserve": h.unreserve,
			"suspend":   h.suspend,
			"resume":    h.resume,
			"release":   h.release,
			"lookup":    h.lookup,
			"newBatch":  h.newBatch,
			"":          h.check,
		})
		return h
	}
}
