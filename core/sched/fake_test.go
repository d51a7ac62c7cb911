package sched

import (
	"fmt"
	"slices"
	"strings"

	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
)

// fakeCap is a Capacity over one block pool that follows the kvcache ledger:
// a sequence holds ceil(max(capacity, hold) / tpb) blocks; Reserve grows
// capacity to history + Tokens + Draft (or denies, leaving no trace); Commit
// advances history and shrinks capacity to it (rejected drafts are freed);
// Release frees everything. It records contract violations instead of
// failing, so the tests can report all of them.
type fakeCap struct {
	tpb, total, used int
	seqs             map[kvcache.SeqID]*fakeSeq
	lookup           map[kvcache.SeqID]int
	deny             map[kvcache.SeqID]int    // fault injection: deny the next n asks of a sequence
	inFlight         func(kvcache.SeqID) bool // the driver's view; nil = never

	calls      struct{ lookup, reserve, release int }
	violations []string
}

type fakeSeq struct {
	hist, cap, hold int
	reserved        int // Tokens + Draft of the outstanding reservation
	draft           int
	blocks          int
}

func newFakeCap(tpb, blocks int) *fakeCap {
	return &fakeCap{tpb: tpb, total: blocks, seqs: map[kvcache.SeqID]*fakeSeq{}, lookup: map[kvcache.SeqID]int{}, deny: map[kvcache.SeqID]int{}}
}

func (f *fakeCap) violate(format string, args ...any) {
	f.violations = append(f.violations, fmt.Sprintf(format, args...))
}

func (f *fakeCap) blocksFor(cap, hold int) int {
	return (max(cap, hold) + f.tpb - 1) / f.tpb
}

func (f *fakeCap) Lookup(ids []kvcache.SeqID) []int {
	f.calls.lookup++
	out := make([]int, len(ids))
	for i, id := range ids {
		out[i] = f.lookup[id]
	}
	return out
}

func (f *fakeCap) Reserve(asks []kvcache.ReserveItem) []bool {
	f.calls.reserve++
	out := make([]bool, len(asks))
	for i, a := range asks {
		out[i] = f.reserve(a)
	}
	return out
}

func (f *fakeCap) reserve(a kvcache.ReserveItem) bool {
	if a.Tokens <= 0 || a.Draft < 0 || a.Hold < 0 || a.Prompt != nil {
		f.violate("Reserve(%+v): bad ask", a)
		return false
	}
	s := f.seqs[a.Seq]
	switch {
	case a.New && s != nil:
		f.violate("Reserve(seq %d, New) for a live sequence", a.Seq)
		return false
	case !a.New && s == nil:
		f.violate("Reserve(seq %d) for an unknown sequence", a.Seq)
		return false
	case !a.New && a.Reuse != 0:
		f.violate("Reserve(seq %d, Reuse %d) without New", a.Seq, a.Reuse)
		return false
	case s != nil && s.reserved > 0:
		f.violate("Reserve(seq %d) while a reservation of %d is outstanding", a.Seq, s.reserved)
		return false
	}
	if f.deny[a.Seq] > 0 {
		f.deny[a.Seq]--
		return false
	}
	if a.New {
		if a.Reuse < 0 || a.Reuse > f.lookup[a.Seq] || a.Reuse%f.tpb != 0 {
			f.violate("Reserve(seq %d, Reuse %d): lookup gave %d, tpb %d", a.Seq, a.Reuse, f.lookup[a.Seq], f.tpb)
			return false
		}
		s = &fakeSeq{hist: a.Reuse, cap: a.Reuse}
	}
	cap := max(s.cap, s.hist+a.Tokens+a.Draft)
	hold := max(s.hold, a.Hold)
	blocks := f.blocksFor(cap, hold)
	if f.used+blocks-s.blocks > f.total {
		return false
	}
	f.used += blocks - s.blocks
	s.cap, s.hold, s.blocks = cap, hold, blocks
	s.reserved, s.draft = a.Tokens+a.Draft, a.Draft
	f.seqs[a.Seq] = s
	return true
}

// commit is what the executor does after a forward.
func (f *fakeCap) commit(id kvcache.SeqID, accepted int) {
	s := f.seqs[id]
	switch {
	case s == nil:
		f.violate("Commit(seq %d) for an unknown sequence", id)
		return
	case s.reserved == 0:
		f.violate("Commit(seq %d) without a reservation", id)
		return
	case accepted > s.reserved || accepted < s.reserved-s.draft:
		f.violate("Commit(seq %d, %d) outside reservation %d (draft %d)", id, accepted, s.reserved, s.draft)
		return
	}
	s.hist += accepted
	if s.hist > s.cap {
		f.violate("seq %d history %d > capacity %d", id, s.hist, s.cap)
	}
	s.cap = s.hist
	s.reserved, s.draft = 0, 0
	blocks := f.blocksFor(s.cap, s.hold)
	f.used += blocks - s.blocks
	s.blocks = blocks
}

func (f *fakeCap) Release(ids []kvcache.SeqID) {
	f.calls.release++
	for _, id := range ids {
		f.free(id)
	}
}

// free is Release of one sequence by the scheduler or the executor.
func (f *fakeCap) free(id kvcache.SeqID) {
	s := f.seqs[id]
	if s == nil {
		f.violate("Release(seq %d) of an unknown sequence", id)
		return
	}
	if f.inFlight != nil && f.inFlight(id) {
		f.violate("Release(seq %d) while its item is in flight", id)
	}
	f.used -= s.blocks
	delete(f.seqs, id)
}

// check verifies the pool accounting.
func (f *fakeCap) check() {
	sum := 0
	for id, s := range f.seqs {
		sum += s.blocks
		if s.hist < 0 || s.hist > s.cap {
			f.violate("seq %d: history %d, capacity %d", id, s.hist, s.cap)
		}
		if s.blocks != f.blocksFor(s.cap, s.hold) {
			f.violate("seq %d: %d blocks for capacity %d hold %d", id, s.blocks, s.cap, s.hold)
		}
	}
	if sum != f.used || f.used > f.total || f.used < 0 {
		f.violate("pool: used %d, sum over sequences %d, total %d", f.used, sum, f.total)
	}
}

func (f *fakeCap) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "cache: %d/%d blocks", f.used, f.total)
	ids := make([]kvcache.SeqID, 0, len(f.seqs))
	for id := range f.seqs {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	for _, id := range ids {
		s := f.seqs[id]
		fmt.Fprintf(&b, "\n  seq %d: history=%d capacity=%d", id, s.hist, s.cap)
		if s.hold > 0 {
			fmt.Fprintf(&b, " hold=%d", s.hold)
		}
		fmt.Fprintf(&b, " blocks=%d", s.blocks)
	}
	return b.String()
}

// driver plays the executor: it schedules, keeps up to pp micro-batches in
// flight, commits and completes them, and releases finished and aborted
// requests. It checks every item against its own model of each request.
type driver struct {
	s      *Scheduler
	f      *fakeCap
	cfg    Config
	reqs   map[kvcache.SeqID]*model
	queue  [][]Item // micro-batches in flight, oldest first
	flight map[kvcache.SeqID]bool
	// acceptDrafts picks the accepted drafts of a generation item.
	acceptDrafts func(it Item) int
	errs         []string
	steps        int
}

// model is the driver's view of a request.
type model struct {
	r         Request
	emitted   int // output tokens emitted (uncapped sum of what Complete was told, capped at MaxNew)
	history   int // as the driver expects the scheduler to see it
	admitted  bool
	preempted bool
	aborted   bool
	finished  bool
	rejected  string
}

func newDriver(cfg Config, blocks int) (*driver, error) {
	s, err := New(cfg)
	if err != nil {
		return nil, err
	}
	d := &driver{
		s: s, cfg: cfg, f: newFakeCap(cfg.TokensPerBlock, blocks),
		reqs: map[kvcache.SeqID]*model{}, flight: map[kvcache.SeqID]bool{},
		acceptDrafts: func(it Item) int { return it.Draft },
	}
	d.f.inFlight = func(id kvcache.SeqID) bool { return d.flight[id] }
	return d, nil
}

func (d *driver) errorf(format string, args ...any) {
	d.errs = append(d.errs, fmt.Sprintf("step %d: ", d.steps)+fmt.Sprintf(format, args...))
}

func (d *driver) add(r Request) {
	if _, ok := d.reqs[r.ID]; !ok {
		d.reqs[r.ID] = &model{r: r}
	}
	d.s.Add(r)
}

// schedule calls Schedule, checks the step and queues it as in flight.
func (d *driver) schedule() Step {
	d.steps++
	st := d.s.Schedule(d.f)
	d.f.check()
	for _, id := range st.Preempted {
		m := d.reqs[id]
		if m == nil || !m.admitted || d.flight[id] {
			d.errorf("preempted %d: not an idle admitted request", id)
			continue
		}
		readmitted := slices.ContainsFunc(st.Items, func(it Item) bool { return it.ID == id })
		if _, live := d.f.seqs[id]; live && !readmitted {
			d.errorf("preempted %d was not released", id)
		}
		m.admitted, m.preempted, m.history = false, true, 0
	}
	for _, rj := range st.Rejected {
		m := d.reqs[rj.ID]
		if m == nil {
			d.errorf("rejected unknown %d", rj.ID)
			continue
		}
		if strings.HasPrefix(rj.Reason, "request id") {
			continue // a duplicate Add; the original lives on
		}
		if d.flight[rj.ID] {
			d.errorf("rejected %d while in flight", rj.ID)
		}
		if _, live := d.f.seqs[rj.ID]; live {
			d.errorf("rejected %d still holds capacity", rj.ID)
		}
		m.rejected, m.admitted = rj.Reason, false
	}
	tokens := 0
	for _, it := range st.Items {
		d.checkItem(it)
		tokens += it.Tokens + it.Draft
		d.flight[it.ID] = true
	}
	if len(st.Items) > d.cfg.MaxBatchSize || tokens > d.cfg.MaxNumTokens {
		d.errorf("step has %d items, %d tokens; limits %d, %d", len(st.Items), tokens, d.cfg.MaxBatchSize, d.cfg.MaxNumTokens)
	}
	if d.s.Running() > d.cfg.MaxResident {
		d.errorf("%d running > MaxResident %d", d.s.Running(), d.cfg.MaxResident)
	}
	if len(st.Items) > 0 {
		d.queue = append(d.queue, st.Items)
	}
	return st
}

func (d *driver) checkItem(it Item) {
	m := d.reqs[it.ID]
	if m == nil || m.finished || m.aborted || m.rejected != "" {
		d.errorf("item %+v for a request that is gone", it)
		return
	}
	if d.flight[it.ID] {
		d.errorf("item %+v: request already in an in-flight micro-batch", it)
	}
	if !m.admitted {
		if !it.Prefill || it.Pos != it.Reuse {
			d.errorf("item %+v: admission must be a prefill at its reuse", it)
		}
		m.admitted, m.history = true, it.Pos
	} else if it.Reuse != 0 {
		d.errorf("item %+v: reuse on a running request", it)
	}
	known := m.r.Prompt + m.emitted
	s := d.f.seqs[it.ID]
	switch {
	case it.Pos != m.history:
		d.errorf("item %+v: pos, want history %d", it, m.history)
	case s == nil || s.hist != it.Pos || s.reserved != it.Tokens+it.Draft:
		d.errorf("item %+v: cache ledger %+v disagrees", it, s)
	case it.Prefill && (it.Draft != 0 || it.Pos+it.Tokens > known || it.Sample != (it.Pos+it.Tokens == known)):
		d.errorf("item %+v: bad prefill for known %d", it, known)
	case it.Prefill && !it.Sample && (it.Pos+it.Tokens)%d.cfg.TokensPerBlock != 0:
		d.errorf("item %+v: non-final chunk not block aligned (tpb %d)", it, d.cfg.TokensPerBlock)
	case it.Prefill && !d.cfg.ChunkedPrefill && !it.Sample && known <= d.cfg.MaxNumTokens:
		d.errorf("item %+v: chunked without chunked prefill", it)
	case !it.Prefill && (it.Pos != known-1 || it.Tokens != 1 || it.Draft != d.cfg.Draft || !it.Sample):
		d.errorf("item %+v: bad generation step for known %d", it, known)
	}
}

// outcome is what the executor reports for an item.
func (d *driver) outcome(it Item) (accepted, emitted int) {
	switch {
	case !it.Prefill:
		a := d.acceptDrafts(it)
		return 1 + a, 1 + a
	case it.Sample:
		return it.Tokens, 1
	}
	return it.Tokens, 0
}

// completeOldest completes the oldest in-flight micro-batch. It returns one
// line per item.
func (d *driver) completeOldest() []string {
	if len(d.queue) == 0 {
		return nil
	}
	batch := d.queue[0]
	d.queue = d.queue[1:]
	var out []string
	for _, it := range batch {
		acc, em := d.outcome(it)
		out = append(out, d.complete(it, acc, em))
	}
	return out
}

func (d *driver) complete(it Item, acc, em int) string {
	m := d.reqs[it.ID]
	delete(d.flight, it.ID)
	if m.aborted {
		d.s.Complete(it.ID, acc, em)
		d.f.free(it.ID)
		return fmt.Sprintf("%d: aborted, released", it.ID)
	}
	d.f.commit(it.ID, acc)
	fin := d.s.Complete(it.ID, acc, em)
	if _, known := d.s.reqs[it.ID]; !known && !fin {
		return fmt.Sprintf("%d: dropped, reported by the next Schedule", it.ID)
	}
	m.history += acc
	m.emitted = min(m.r.MaxNew, m.emitted+em)
	if fin != (m.emitted == m.r.MaxNew) {
		d.errorf("Complete(%d, %d, %d) = %t with %d of %d emitted", it.ID, acc, em, fin, m.emitted, m.r.MaxNew)
	}
	if fin {
		m.finished = true
		d.f.free(it.ID)
		return fmt.Sprintf("%d: finished (%d tokens)", it.ID, m.emitted)
	}
	return fmt.Sprintf("%d: emitted %d/%d history %d", it.ID, m.emitted, m.r.MaxNew, m.history)
}

// abort aborts id and releases it now when it holds capacity and is not in
// flight (else completeOldest releases it).
func (d *driver) abort(id kvcache.SeqID) {
	d.s.Abort(id)
	m := d.reqs[id]
	if m == nil || m.finished || m.rejected != "" || m.aborted {
		return
	}
	m.aborted = true
	if !d.flight[id] {
		if _, live := d.f.seqs[id]; live {
			d.f.free(id)
		}
	}
}

// checkDone verifies the end state once the scheduler is idle.
func (d *driver) checkDone() {
	for id, m := range d.reqs {
		if !m.finished && !m.aborted && m.rejected == "" {
			d.errorf("request %d neither finished, aborted nor rejected (emitted %d/%d)", id, m.emitted, m.r.MaxNew)
		}
		if m.finished && m.emitted != m.r.MaxNew {
			d.errorf("request %d finished with %d of %d tokens", id, m.emitted, m.r.MaxNew)
		}
	}
	if len(d.f.seqs) != 0 || d.f.used != 0 {
		d.errorf("idle but the cache holds %s", d.f)
	}
	if !d.s.Idle() || d.s.InFlight() != 0 || d.s.Running() != 0 || d.s.Waiting() != 0 {
		d.errorf("not idle: waiting %d running %d in flight %d", d.s.Waiting(), d.s.Running(), d.s.InFlight())
	}
}

func formatStep(st Step) string {
	var b strings.Builder
	if len(st.Items) == 0 {
		b.WriteString("items: none\n")
	} else {
		b.WriteString("items:\n")
	}
	for _, it := range st.Items {
		fmt.Fprintf(&b, "  %d: pos=%d tokens=%d", it.ID, it.Pos, it.Tokens)
		if it.Draft > 0 {
			fmt.Fprintf(&b, " draft=%d", it.Draft)
		}
		if it.Reuse > 0 {
			fmt.Fprintf(&b, " reuse=%d", it.Reuse)
		}
		if it.Prefill {
			b.WriteString(" prefill")
		} else {
			b.WriteString(" gen")
		}
		if it.Sample {
			b.WriteString(" sample")
		}
		b.WriteString("\n")
	}
	if len(st.Preempted) > 0 {
		fmt.Fprintf(&b, "preempted: %v\n", st.Preempted)
	}
	for _, r := range st.Rejected {
		fmt.Fprintf(&b, "rejected %d: %s\n", r.ID, r.Reason)
	}
	return b.String()
}
