package cachemgrv1

import (
	"cmp"
	"errors"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
	"pgregory.net/rapid"
)

// propTPB and friends size the property test's stage: a full-attention pool
// and a 12-token sliding-window pool of 24 blocks of 4 tokens each, so
// pressure, eviction and window release happen within a few steps.
const (
	propTPB    = 4
	propBlocks = 24
	propWindow = 12
)

func propConfig() kvcache.Config {
	return kvcache.Config{
		Stages: 1, TokensPerBlock: propTPB, MaxBatchSize: 6, MaxNumTokens: 12,
		MaxSeqLen: 64, MaxDraftTokens: 2, EnableBlockReuse: true,
		Layers:      append(gqaLayers(0, 1, 30, 0), gqaLayers(1, 1, 70, propWindow)...),
		DeviceBytes: propBlocks * propTPB * 100,
	}
}

// mseq is the test's model of one sequence.
type mseq struct {
	prompt            []int32
	hist, cap, hold   int
	reserved          bool
	tokens, draft     int
	undo              kvcache.SeqState // the manager's view before the reservation
	worker            [][]kvcache.BlockID
	isNew             bool
	undoHold, undoCap int
	// ran: the outstanding grant's copies ran (the next forward began), so
	// it can no longer be undone (Unreserve's contract: they were not made).
	ran bool
}

type propMachine struct {
	m      *Manager
	seqs   map[kvcache.SeqID]*mseq
	nextID kvcache.SeqID
	// content[pool][block*tpb+slot] is what the "worker" wrote there.
	content [][]int32
	// With a host tier: the copies of kept grants not yet run (the worker
	// runs them before the next forward, i.e. the next Commit), in order.
	// An Unreserve takes its sequence's out, as the engine drops the copies
	// of an undone grant.
	pending []seqCopy
	npools  int   // pools of the layout: 2 device (+ 2 host)
	now     int64 // engine time: every action may advance it
	policy  string
	misses  map[kvcache.MissReason]int
}

// tick advances the engine clock by a drawn amount (often 0), so that
// retention durations expire within a walk.
func (pm *propMachine) tick(t *rapid.T) int64 {
	pm.now += int64(rapid.IntRange(0, 20).Draw(t, "dt"))
	return pm.now
}

type seqCopy struct {
	seq kvcache.SeqID
	c   kvcache.Copy
}

// runPending runs the pending copies, as the worker does before a forward:
// from then on their grants cannot be undone.
func (pm *propMachine) runPending() {
	runCopies(pm.content, pm.pending)
	for _, c := range pm.pending {
		if s := pm.seqs[c.seq]; s != nil {
			s.ran = true
		}
	}
	pm.pending = pm.pending[:0]
}

// runCopies applies copies to content.
func runCopies(content [][]int32, cs []seqCopy) {
	for _, sc := range cs {
		c := sc.c
		copy(content[c.DstPool][int(c.DstBlock)*propTPB:int(c.DstBlock+1)*propTPB],
			content[c.SrcPool][int(c.SrcBlock)*propTPB:int(c.SrcBlock+1)*propTPB])
	}
}

func (pm *propMachine) ids(filter func(*mseq) bool) []kvcache.SeqID {
	var out []kvcache.SeqID
	for id, s := range pm.seqs {
		if filter(s) {
			out = append(out, id)
		}
	}
	slices.Sort(out)
	return out
}

func (pm *propMachine) snap(t *rapid.T) kvcache.Snapshot {
	s, err := pm.m.Inspect(bg, kvcache.InspectOptions{Tables: true})
	if err != nil {
		t.Fatalf("Inspect: %v", err)
	}
	return s
}

func (pm *propMachine) seqSnap(t *rapid.T, id kvcache.SeqID) (kvcache.SeqState, bool) {
	for _, s := range pm.snap(t).Seqs {
		if s.Seq == id {
			return s, true
		}
	}
	return kvcache.SeqState{}, false
}

func drawPrompt(t *rapid.T, label string) []int32 {
	// Blocks from three patterns, so prefixes collide often; then a tail
	// over a two-letter alphabet.
	blocks := rapid.SliceOfN(rapid.IntRange(0, 2), 0, 8).Draw(t, label+"_blocks")
	tail := rapid.SliceOfN(rapid.IntRange(0, 1), 0, 6).Draw(t, label+"_tail")
	var p []int32
	for _, b := range blocks {
		for i := range propTPB {
			p = append(p, int32(10*b+i))
		}
	}
	for _, v := range tail {
		p = append(p, int32(v))
	}
	if len(p) == 0 {
		p = append(p, 5)
	}
	return p
}

// reserveChecked reserves one item and checks the grant against the model.
func (pm *propMachine) reserveChecked(t *rapid.T, it kvcache.ReserveItem, s *mseq) bool {
	before := pm.snap(t)
	gs, err := pm.m.Reserve(bg, []kvcache.ReserveItem{it})
	if err != nil || len(gs) != 1 {
		t.Fatalf("Reserve(%+v) = %v, %v", it, gs, err)
	}
	g := gs[0]
	if !g.OK {
		if strings.HasPrefix(g.Reason, "invalid:") {
			t.Fatalf("a valid item was judged invalid: %s", g.Reason)
		}
		if len(g.Tables) > 0 || len(g.Copies) > 0 {
			t.Fatalf("a denial carries tables or copies: %+v", g)
		}
		if after := pm.snap(t); !reflect.DeepEqual(before, after) {
			t.Fatalf("denial %q changed the state:\nbefore %+v\nafter  %+v", g.Reason, before, after)
		}
		return false
	}
	if it.New {
		s.worker = make([][]kvcache.BlockID, 2)
		s.undoCap, s.undoHold = 0, 0
	} else {
		for _, st := range before.Seqs {
			if st.Seq == it.Seq {
				s.undo = st
			}
		}
		s.undoCap, s.undoHold = s.cap, s.hold
	}
	for _, d := range g.Tables {
		if d.Pool < 0 || d.Pool > 1 || d.From > len(s.worker[d.Pool]) {
			t.Fatalf("bad delta %+v for a worker table of %d", d, len(s.worker[d.Pool]))
		}
		for _, b := range d.Blocks {
			if b < 0 || b >= propBlocks {
				t.Fatalf("delta block %d out of range: %+v", b, d)
			}
		}
		s.worker[d.Pool] = append(s.worker[d.Pool][:d.From:d.From], d.Blocks...)
	}
	promotions := 0
	for _, c := range g.Copies {
		if c.SrcPool >= 2 && c.DstPool < 2 {
			promotions++
		}
		if pm.npools != 4 || c.SrcPool < 0 || c.SrcPool >= 4 || c.DstPool < 0 || c.DstPool >= 4 ||
			(c.SrcPool < 2) == (c.DstPool < 2) || c.SrcPool%2 != c.DstPool%2 ||
			c.SrcBlock < 0 || int(c.SrcBlock)*propTPB >= len(pm.content[c.SrcPool]) ||
			c.DstBlock < 0 || int(c.DstBlock)*propTPB >= len(pm.content[c.DstPool]) {
			t.Fatalf("bad copy %+v in grant %+v (%d pools)", c, g, pm.npools)
		}
		pm.pending = append(pm.pending, seqCopy{it.Seq, c})
	}
	// HostReused: whole blocks of Reuse, each needing a promotion (or
	// sharing one of this call) in some pool: at least one copy from the
	// host per host block, at most one per pool.
	if hr := g.HostReused; hr < 0 || hr > it.Reuse || hr%propTPB != 0 || promotions > 2*hr/propTPB ||
		(hr > 0) != (promotions > 0) {
		t.Fatalf("grant %+v: HostReused %d for Reuse %d with %d host→device copies", g, hr, it.Reuse, promotions)
	}
	s.hold = max(s.hold, it.Hold)
	s.cap = max(s.cap, s.hist+it.Tokens+it.Draft, s.hold)
	s.reserved, s.tokens, s.draft, s.ran = true, it.Tokens, it.Draft, false
	return true
}

func (pm *propMachine) New(t *rapid.T) {
	p := drawPrompt(t, "prompt")
	id := pm.nextID
	now := pm.tick(t)
	n := pm.explainChecked(t, kvcache.LookupItem{Seq: id, Prompt: p, Now: now})
	if n%propTPB != 0 || n > max(0, len(p)-1) || n < 0 {
		t.Fatalf("Lookup(%v) = %d", p, n)
	}
	reuse := rapid.IntRange(0, n/propTPB).Draw(t, "reuseBlocks") * propTPB
	tokens := rapid.IntRange(1, min(len(p)-reuse, 12)).Draw(t, "tokens")
	hold := 0
	if rapid.IntRange(0, 4).Draw(t, "holdDie") == 0 {
		hold = rapid.IntRange(0, 40).Draw(t, "hold")
	}
	prio := rapid.IntRange(0, kvcache.MaxPriority).Draw(t, "priority")
	dur := int64(rapid.SampledFrom([]int{0, 5, 50}).Draw(t, "duration"))
	s := &mseq{prompt: p, hist: reuse, cap: reuse, isNew: true}
	if !pm.reserveChecked(t, kvcache.ReserveItem{Seq: id, New: true, Tokens: tokens, Hold: hold, Prompt: p, Reuse: reuse,
		Priority: prio, PriorityDuration: dur, Now: now}, s) {
		return
	}
	pm.nextID++
	pm.seqs[id] = s
	// The reused prefix must hold this prompt's tokens in every pool once
	// the pending copies ran (before the forward that reads it).
	content := pm.content
	if len(pm.pending) > 0 {
		content = make([][]int32, len(pm.content))
		for i := range content {
			content[i] = slices.Clone(pm.content[i])
		}
		runCopies(content, pm.pending)
	}
	for pool := range 2 {
		for pos := 0; pos < reuse; pos++ {
			b := s.worker[pool][pos/propTPB]
			if got := content[pool][int(b)*propTPB+pos%propTPB]; got != p[pos] {
				t.Fatalf("pool %d: reused position %d (block %d) holds %d, prompt has %d", pool, pos, b, got, p[pos])
			}
		}
	}
}

func (pm *propMachine) Step(t *rapid.T) {
	ids := pm.ids(func(s *mseq) bool { return !s.reserved })
	if len(ids) == 0 {
		t.Skip("no idle sequence")
	}
	id := rapid.SampledFrom(ids).Draw(t, "seq")
	s := pm.seqs[id]
	it := kvcache.ReserveItem{Seq: id, Now: pm.tick(t)}
	if rest := len(s.prompt) - s.hist; rest > 0 {
		it.Tokens = rapid.IntRange(1, min(rest, 12)).Draw(t, "chunk")
	} else {
		it.Tokens = 1
		it.Draft = rapid.IntRange(0, 2).Draw(t, "draft")
	}
	if s.hist+it.Tokens+it.Draft > 64+2 {
		t.Skip("sequence at max_seq_len")
	}
	if rapid.IntRange(0, 9).Draw(t, "holdDie") == 0 {
		it.Hold = rapid.IntRange(0, 60).Draw(t, "hold")
	}
	pm.reserveChecked(t, it, s)
}

func (pm *propMachine) Commit(t *rapid.T) {
	ids := pm.ids(func(s *mseq) bool { return s.reserved })
	if len(ids) == 0 {
		t.Skip("no reservation")
	}
	id := rapid.SampledFrom(ids).Draw(t, "seq")
	s := pm.seqs[id]
	acc := rapid.IntRange(s.tokens, s.tokens+s.draft).Draw(t, "accepted")
	pm.runPending()
	// The worker writes the accepted tokens' KV where its tables say.
	for pos := s.hist; pos < s.hist+acc; pos++ {
		v := int32(-1000 - int(id))
		if pos < len(s.prompt) {
			v = s.prompt[pos]
		}
		for pool := range 2 {
			b := s.worker[pool][pos/propTPB]
			pm.content[pool][int(b)*propTPB+pos%propTPB] = v
		}
	}
	if _, err := pm.m.Commit(bg, []kvcache.CommitItem{{Seq: id, Accepted: acc}}); err != nil {
		t.Fatalf("Commit(%d, %d): %v", id, acc, err)
	}
	s.hist += acc
	s.cap = max(s.hist, s.hold)
	s.reserved, s.isNew, s.tokens, s.draft = false, false, 0, 0
}

func (pm *propMachine) BadCommit(t *rapid.T) {
	ids := pm.ids(func(s *mseq) bool { return s.reserved && s.tokens > 0 })
	if len(ids) == 0 {
		t.Skip("no reservation with tokens")
	}
	id := rapid.SampledFrom(ids).Draw(t, "seq")
	s := pm.seqs[id]
	before := pm.snap(t)
	acc := rapid.SampledFrom([]int{s.tokens - 1, s.tokens + s.draft + 1}).Draw(t, "badAccepted")
	_, err := pm.m.Commit(bg, []kvcache.CommitItem{{Seq: id, Accepted: acc}})
	var ke *kvcache.Error
	if !errors.As(err, &ke) || !errors.Is(err, kvcache.ErrInvalidArg) || !slices.Equal(ke.Seqs, []kvcache.SeqID{id}) {
		t.Fatalf("Commit(%d, %d) = %v, want an item error", id, acc, err)
	}
	if after := pm.snap(t); !reflect.DeepEqual(before, after) {
		t.Fatalf("a rejected commit changed the state")
	}
}

func (pm *propMachine) Unreserve(t *rapid.T) {
	ids := pm.ids(func(s *mseq) bool { return s.reserved && !s.ran })
	if len(ids) == 0 {
		t.Skip("no reservation")
	}
	id := rapid.SampledFrom(ids).Draw(t, "seq")
	s := pm.seqs[id]
	if err := pm.m.Unreserve(bg, []kvcache.SeqID{id}); err != nil {
		t.Fatalf("Unreserve(%d): %v", id, err)
	}
	pm.pending = slices.DeleteFunc(pm.pending, func(c seqCopy) bool { return c.seq == id })
	got, ok := pm.seqSnap(t, id)
	if s.isNew {
		if ok {
			t.Fatalf("a new sequence survived Unreserve: %+v", got)
		}
		delete(pm.seqs, id)
		return
	}
	if !reflect.DeepEqual(got, s.undo) {
		t.Fatalf("Unreserve(%d) = %+v, want the state before Reserve %+v", id, got, s.undo)
	}
	s.cap, s.hold = s.undoCap, s.undoHold
	s.reserved, s.tokens, s.draft = false, 0, 0
}

func (pm *propMachine) Release(t *rapid.T) {
	ids := pm.ids(func(*mseq) bool { return true })
	if len(ids) == 0 {
		t.Skip("no sequence")
	}
	id := rapid.SampledFrom(ids).Draw(t, "seq")
	if err := pm.m.Release(bg, []kvcache.SeqID{id}); err != nil {
		t.Fatalf("Release(%d): %v", id, err)
	}
	delete(pm.seqs, id)
}

func (pm *propMachine) Lookup(t *rapid.T) {
	before := pm.snap(t)
	p := drawPrompt(t, "lookup")
	n := pm.explainChecked(t, kvcache.LookupItem{Seq: 999, Prompt: p, Now: pm.now})
	if n%propTPB != 0 || n > len(p)-1 && n != 0 {
		t.Fatalf("Lookup(%v) = %v", p, n)
	}
	if after := pm.snap(t); !reflect.DeepEqual(before, after) {
		t.Fatalf("Lookup or Explain changed the state")
	}
}

// explainChecked runs Lookup and Explain on it and checks that they agree
// and that the explanation is well formed; it returns Lookup's answer.
func (pm *propMachine) explainChecked(t *rapid.T, it kvcache.LookupItem) int {
	n, err := pm.m.Lookup(bg, []kvcache.LookupItem{it})
	if err != nil {
		t.Fatal(err)
	}
	ex, err := pm.m.Explain(bg, []kvcache.LookupItem{it})
	if err != nil {
		t.Fatal(err)
	}
	e := ex[0]
	limit := 0
	if len(it.Prompt) > propTPB {
		limit = (len(it.Prompt) - 1) / propTPB * propTPB
	}
	switch {
	case e.Tokens != n[0]:
		t.Fatalf("Explain(%v) = %+v, Lookup = %d", it.Prompt, e, n[0])
	case e.HostTokens < 0 || e.HostTokens > e.Tokens || e.HostTokens%propTPB != 0 || pm.npools == 2 && e.HostTokens != 0:
		t.Fatalf("Explain(%v) = %+v: HostTokens out of [0, Tokens] or not whole blocks", it.Prompt, e)
	case (e.Miss == kvcache.MissPartialBlock) != (e.Tokens == limit):
		t.Fatalf("Explain(%v) = %+v: partial_block iff the match reached %d", it.Prompt, e, limit)
	case e.Miss == kvcache.MissUnknown || e.Miss == kvcache.MissReuseOff || e.Miss == kvcache.MissSnapshot || e.Miss == kvcache.MissCacheSalt:
		t.Fatalf("Explain(%v) = %+v: reason %s cannot happen here", it.Prompt, e, e.Miss)
	case e.Miss == kvcache.MissEvicted && (e.EvictedAt > pm.now || e.EvictedBy != "priority" && e.EvictedBy != pm.policy ||
		pm.npools == 2 && e.EvictedTier != kvcache.TierDevice):
		t.Fatalf("Explain(%v) = %+v: eviction after now %d, or by another rule than %s/priority", it.Prompt, e, pm.now, pm.policy)
	case e.Miss != kvcache.MissEvicted && (e.EvictedBy != "" || e.EvictedAt != 0):
		t.Fatalf("Explain(%v) = %+v: eviction fields without an eviction", it.Prompt, e)
	}
	pm.misses[e.Miss]++
	return n[0]
}

// Check runs after every action.
func (pm *propMachine) Check(t *rapid.T) {
	snap := pm.snap(t)
	if len(snap.Violations) > 0 {
		t.Fatalf("violations: %v", snap.Violations)
	}
	if len(snap.Seqs) != len(pm.seqs) {
		t.Fatalf("%d sequences, model has %d", len(snap.Seqs), len(pm.seqs))
	}
	refs := [2][]int32{make([]int32, propBlocks), make([]int32, propBlocks)}
	for _, st := range snap.Seqs {
		s := pm.seqs[st.Seq]
		if s == nil {
			t.Fatalf("unknown seq %d in Inspect", st.Seq)
		}
		if st.History < 0 || st.History > st.Capacity {
			t.Fatalf("seq %d: history %d capacity %d", st.Seq, st.History, st.Capacity)
		}
		if st.History != s.hist || st.Capacity != s.cap || st.Hold != s.hold {
			t.Fatalf("seq %d: ledger %d/%d/%d, model %d/%d/%d", st.Seq, st.History, st.Capacity, st.Hold, s.hist, s.cap, s.hold)
		}
		if wantRes, wantDraft := s.tokens+s.draft, s.draft; st.Reserved != wantRes || st.Draft != wantDraft {
			t.Fatalf("seq %d: reservation %d/%d, model %v %d/%d", st.Seq, st.Reserved, st.Draft, s.reserved, s.tokens, s.draft)
		}
		want := kvcache.BlocksFor(st.Capacity, propTPB)
		if st.Blocks[0] != want || len(st.Tables[0]) != want || len(st.Tables[1]) != want {
			t.Fatalf("seq %d: capacity %d needs %d blocks; full pool %d (table %d), window table %d",
				st.Seq, st.Capacity, want, st.Blocks[0], len(st.Tables[0]), len(st.Tables[1]))
		}
		for pool := range 2 {
			tab, w := st.Tables[pool], s.worker[pool]
			if len(w) < len(tab) {
				t.Fatalf("seq %d pool %d: worker table %v shorter than %v", st.Seq, pool, w, tab)
			}
			for j, b := range tab {
				if b == noBlock {
					if pool == 0 || (j+1)*propTPB > st.History-propWindow {
						t.Fatalf("seq %d pool %d: position %d released at history %d", st.Seq, pool, j, st.History)
					}
					continue
				}
				if w[j] != b {
					t.Fatalf("seq %d pool %d: worker table %v, manager %v", st.Seq, pool, w, tab)
				}
				refs[pool][b]++
			}
		}
	}
	for pool := range 2 {
		ps := snap.Pools[pool]
		if ps.Free+ps.Cached+ps.InUse != ps.Total || ps.Total != propBlocks {
			t.Fatalf("pool %d: %+v", pool, ps)
		}
		if !slices.Equal(refs[pool], snap.RefCounts[pool]) {
			t.Fatalf("pool %d: recomputed refcounts %v, reported %v", pool, refs[pool], snap.RefCounts[pool])
		}
		inUse := 0
		for _, r := range refs[pool] {
			if r > 0 {
				inUse++
			}
		}
		if inUse != ps.InUse {
			t.Fatalf("pool %d: %d blocks referenced, InUse %d", pool, inUse, ps.InUse)
		}
		for _, b := range pm.m.paged[pool].free {
			if refs[pool][b] != 0 {
				t.Fatalf("pool %d: block %d is free and referenced %d times", pool, b, refs[pool][b])
			}
		}
	}
}

func TestPropertyLedgerAndReuse(t *testing.T) { propertyRun(t, 0) }

// TestPropertyHostTier is the same walk with a host tier of propHostBlocks
// blocks per pool: reused prefixes must hold the prompt's tokens after the
// copies ran, wherever the blocks travelled.
func TestPropertyHostTier(t *testing.T) { propertyRun(t, propHostBlocks) }

const propHostBlocks = 10

func propertyRun(t *testing.T, hostBlocks int) {
	rapid.Check(t, func(t *rapid.T) {
		m := New()
		cfg := propConfig()
		cfg.HostBytes = int64(hostBlocks * propTPB * 100)
		cfg.EvictionPolicy = rapid.SampledFrom([]string{"", kvcache.EvictionLRU, kvcache.EvictionLFU}).Draw(t, "policy")
		lay, err := m.Configure(bg, cfg)
		if err != nil {
			t.Fatal(err)
		}
		pm := &propMachine{m: m, seqs: map[kvcache.SeqID]*mseq{}, nextID: 1, npools: len(lay.Pools),
			policy: cmp.Or(cfg.EvictionPolicy, kvcache.EvictionLRU), misses: map[kvcache.MissReason]int{}}
		for _, p := range lay.Pools {
			pm.content = append(pm.content, make([]int32, p.Blocks*propTPB))
		}
		if want := 2 + 2*min(hostBlocks, 1); len(lay.Pools) != want {
			t.Fatalf("host blocks %d: %d pools, want %d", hostBlocks, len(lay.Pools), want)
		}
		for i := range pm.content {
			for j := range pm.content[i] {
				pm.content[i][j] = -1
			}
		}
		t.Repeat(map[string]func(*rapid.T){
			"new":       pm.New,
			"step":      pm.Step,
			"commit":    pm.Commit,
			"badCommit": pm.BadCommit,
			"unreserve": pm.Unreserve,
			"release":   pm.Release,
			"lookup":    pm.Lookup,
			"":          pm.Check,
		})
	})
}

// TestPropertyCoverage makes sure the random walk reaches the states it is
// meant to test (reuse, eviction, denials, window release), so a generator
// change cannot silently weaken the property test.
func TestPropertyCoverage(t *testing.T) {
	var reused, evicted, denied, released, offloaded, promoted, reclaimed, byPriority, expired int
	for seed := range 80 {
		cfg := propConfig()
		if seed%2 == 1 {
			cfg.HostBytes = propHostBlocks * propTPB * 100
		}
		if seed%4 >= 2 {
			cfg.EvictionPolicy = kvcache.EvictionLFU
		}
		m := configured(t, cfg)
		r := newLCG(uint64(seed))
		live := map[kvcache.SeqID]int{}
		for id := kvcache.SeqID(1); id < 60; id++ {
			var p []int32
			for range 2 + r.n(6) {
				b := int32(r.n(2))
				for i := range propTPB {
					p = append(p, 10*b+int32(i))
				}
			}
			p = append(p, int32(id))
			now := int64(id) * 10
			n, _ := m.Lookup(bg, []kvcache.LookupItem{{Seq: id, Prompt: p, Now: now}})
			g, _ := m.Reserve(bg, []kvcache.ReserveItem{{Seq: id, New: true, Tokens: len(p) - n[0], Reuse: n[0], Prompt: p,
				Priority: r.n(kvcache.MaxPriority + 1), PriorityDuration: int64(r.n(3) * 40), Now: now}})
			if g[0].OK {
				if _, err := m.Commit(bg, []kvcache.CommitItem{{Seq: id, Accepted: len(p) - n[0]}}); err != nil {
					t.Fatal(err)
				}
				live[id] = len(p)
			} else {
				denied++
			}
			if len(live) > 3 || !g[0].OK {
				for old := range live {
					_ = m.Release(bg, []kvcache.SeqID{old})
					delete(live, old)
					break
				}
			}
		}
		st, _ := m.Stats(bg)
		if st.ReusedTokens > 0 {
			reused++
		}
		if st.Evictions > 0 {
			evicted++
		}
		if m.c.offloaded > 0 {
			offloaded++
		}
		if m.c.promoted > 0 {
			promoted++
		}
		if m.c.reclaimed > 0 {
			reclaimed++
		}
		for _, g := range m.ghosts {
			if slices.ContainsFunc(g.ring, func(e ghostEntry) bool { return e.by == rulePriority }) {
				byPriority++
				break
			}
		}
		if m.paged[0].expired > 0 {
			expired++
		}
		if len(inspect(t, m).Violations) > 0 {
			t.Fatal(inspect(t, m).Violations)
		}
		for _, s := range inspect(t, m).Seqs {
			if s.Blocks[1] < s.Blocks[0] {
				released++
			}
		}
	}
	if reused == 0 || evicted == 0 || denied == 0 || released == 0 || offloaded == 0 || promoted == 0 || reclaimed == 0 || byPriority == 0 || expired == 0 {
		t.Fatalf("coverage: reused %d evicted %d denied %d window-released %d offloaded %d promoted %d reclaimed %d by-priority %d expired %d runs",
			reused, evicted, denied, released, offloaded, promoted, reclaimed, byPriority, expired)
	}
	t.Logf("reused %d evicted %d denied %d window-released %d offloaded %d promoted %d reclaimed %d by-priority %d expired %d (of 80 runs, 40 with a host tier, 40 LFU)",
		reused, evicted, denied, released, offloaded, promoted, reclaimed, byPriority, expired)
}

type lcg struct{ x uint64 }

func newLCG(seed uint64) *lcg { return &lcg{seed*6364136223846793005 + 1442695040888963407} }

func (l *lcg) n(k int) int {
	l.x = l.x*6364136223846793005 + 1442695040888963407
	return int((l.x >> 33) % uint64(k))
}
