// Package sched is kvx's capacity and micro-batch scheduler: a pure state
// machine in the style of TensorRT-LLM's V2 scheduler. It has no clocks,
// goroutines or I/O. The executor feeds it events (Add, Complete, Abort) and
// asks it for the next micro-batch (Schedule); the scheduler answers with
// decisions and performs its capacity asks through the Capacity the executor
// passes in, which reserves atomically over every pipeline stage.
//
// # Request model
//
// For each request the scheduler keeps known = Prompt + emitted output tokens
// and history = tokens whose KV is computed. A request needs positions
// [history, known). When known-history > 1 it is in prefill (chunkable; only
// the chunk that reaches known samples); when known-history == 1 it is in
// generation: one step writes 1 token plus Draft draft tokens and samples.
// A preempted request keeps known and restarts at history 0: its recompute is
// one prefill of known tokens whose final chunk samples the next token.
//
// # A step
//
// Schedule builds one micro-batch in three phases, one Capacity.Reserve call
// each (plus one retry per preemption): generation items first, so decode is
// never starved; then the next chunk of running prefills; then new admissions
// in arrival order (FCFS). Every item is "in flight" from the Schedule that
// returned it until Complete; an in-flight request is skipped by later
// Schedule calls, so with pipeline parallelism consecutive calls give
// disjoint micro-batches. A step that preempted admits nothing. Chunks other
// than a request's last end on a TokensPerBlock boundary; without chunked
// prefill a prompt runs whole, except the recompute of a preempted request
// longer than MaxNumTokens, which is chunked because it could never run
// otherwise.
//
// # Who releases what
//
// The scheduler calls Capacity.Release itself for requests it preempts and
// for requests it rejects after they held capacity (Step.Rejected). The
// executor releases requests that finish (Complete returns true) and
// requests it aborts, once no item of theirs is in flight, before its next
// Schedule call.
//
// A Scheduler is not safe for concurrent use; the executor drives it from one
// goroutine.
package sched

import (
	"fmt"

	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
)

// Request is one arrival.
type Request struct {
	ID     kvcache.SeqID // unique within an engine run
	Prompt int           // prompt tokens
	MaxNew int           // output tokens to generate
}

// Capacity is the executor's side of admission. It performs each call on
// every pipeline stage (one call per stage per phase) and agrees the answers
// over the stages. The scheduler never retains the slices it passes.
type Capacity interface {
	// Lookup returns, per id, how many leading prompt tokens of a request
	// being admitted the cache holds now (already agreed over stages, i.e. the
	// minimum). Missing answers count as 0.
	Lookup(ids []kvcache.SeqID) []int
	// Reserve grants (true) or denies each ask, in order, atomically over all
	// pools and stages. A denied ask leaves no trace. Prompt is left nil: the
	// executor fills it. Missing answers count as denials.
	Reserve(asks []kvcache.ReserveItem) []bool
	// Release frees the sequences (preemption: they are recomputed later, or
	// rejection of a request that held capacity).
	Release(ids []kvcache.SeqID)
}

// Suspender is an optional Capacity interface. With Config.Suspend, a
// MAX_UTILIZATION preemption suspends the victim to the host tier (its cache
// survives, so it resumes where it stopped) instead of releasing it for
// recompute; when Suspend says no, the victim is released as before.
type Suspender interface {
	// Suspend moves each sequence's cache to the host tier, atomically over
	// the stages; false leaves it where it was.
	Suspend(ids []kvcache.SeqID) []bool
	// Resume brings suspended sequences back; false when they do not fit yet.
	Resume(ids []kvcache.SeqID) []bool
}

// Item is one request's share of a micro-batch.
type Item struct {
	ID      kvcache.SeqID
	Pos     int  // first position written (the request's history)
	Tokens  int  // tokens written from Pos: a prefill chunk, or 1 in generation
	Draft   int  // draft tokens written after Tokens (generation only)
	Sample  bool // the step samples a token (final prefill chunk, or generation)
	Prefill bool
	Reuse   int // tokens taken from the prefix cache (first chunk of an admission); Pos == Reuse then
}

// Rejection drops a request with a reason that names the numbers.
type Rejection struct {
	ID     kvcache.SeqID
	Reason string
}

// Step is one Schedule answer. The caller owns its slices.
type Step struct {
	// Items is the micro-batch, in phase order: generation, continuing
	// prefills, admissions.
	Items []Item
	// Preempted requests were released through Capacity.Release and queued
	// at the front of the waiting queue for recompute, or, when also listed
	// in Suspended, suspended to the host tier to resume where they stopped.
	Preempted []kvcache.SeqID
	Suspended []kvcache.SeqID
	// Dropped are requests suspended earlier whose host copy was released
	// through Capacity.Release in this step: they recompute from the start.
	// A suspended request still pins its shared blocks on the device, so
	// when the only running request cannot grow, or the head of the queue
	// does not fit with nothing resident, the suspended ones are dropped
	// before anybody is rejected (no livelock of suspensions either).
	Dropped []kvcache.SeqID
	// Rejected requests are forgotten; any capacity they held was released
	// through Capacity.Release. The executor answers them with the reason.
	Rejected []Rejection
}

type req struct {
	Request
	emitted int  // output tokens produced, capped at MaxNew
	history int  // KV tokens computed
	running bool // admitted (holds capacity)
	// suspended requests wait with their cache on the host tier (history kept).
	suspended bool
	inFlight  bool
	inBatch   bool // granted in the step being built
	item      Item // the in-batch or in-flight item
	order     uint64
	// hold is the Hold its next reservation asks for (a forked request
	// under GuaranteedNoEvict, whose sequence the fork made without one).
	hold int
}

func (r *req) known() int { return r.Prompt + r.emitted }

// Scheduler is the state machine. The zero value is not usable; call New.
type Scheduler struct {
	cfg      Config
	reqs     map[kvcache.SeqID]*req
	waiting  []*req // FIFO; preempted requests go to the front
	running  []*req // admission order, oldest first
	inFlight int    // running requests with an item in flight
	// aborted are requests aborted while in flight; they count as in flight
	// (and resident) until their Complete arrives.
	aborted   map[kvcache.SeqID]struct{}
	rejected  []Rejection     // reported by the next Schedule
	toRelease []kvcache.SeqID // released by the next Schedule
	order     uint64

	// freed counts the events that give capacity back for good (a request
	// finishes, fails or is aborted). After the head of the waiting queue is
	// denied, or a request is preempted, admission waits for the next such
	// event instead of resending the same prompts to every stage each step
	// or re-admitting a victim: between them the cache only fills up.
	freed        uint64
	headDenied   bool
	headDeniedAt uint64

	// scratch, reused between calls
	cands []*req
	items []Item
	asks  []kvcache.ReserveItem
	ids   []kvcache.SeqID
}

// New returns a scheduler for cfg. The error, of kind
// kvcache.KindInvalidConfig, names the field, its value and the limit.
func New(cfg Config) (*Scheduler, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	return &Scheduler{
		cfg:     cfg,
		reqs:    make(map[kvcache.SeqID]*req),
		aborted: make(map[kvcache.SeqID]struct{}),
	}, nil
}

// Config returns the configuration the scheduler runs with.
func (s *Scheduler) Config() Config { return s.cfg }

// Add queues an arrival at the back of the waiting queue. A request that can
// never run (bad sizes, longer than MaxSeqLen, more token slots than the cache
// guarantees one sequence, a prompt over MaxNumTokens without chunked
// prefill, or an id already known) is reported in the next Step's Rejected.
func (s *Scheduler) Add(r Request) {
	if reason := s.check(r); reason != "" {
		s.rejected = append(s.rejected, Rejection{ID: r.ID, Reason: reason})
		return
	}
	q := &req{Request: r}
	s.reqs[r.ID] = q
	s.waiting = append(s.waiting, q)
}

// Room is the number of requests that can still become resident
// (MaxResident less those admitted, suspended or aborted in flight).
func (s *Scheduler) Room() int { return s.cfg.MaxResident - s.resident() }

// AddForked adds a request whose sequence the executor already made
// resident with history tokens computed, by forking another request's
// sequence (kvcache.Forker): it runs at once, the newest admission, from
// history (history < Prompt). Under GuaranteedNoEvict its next reservation
// asks for the Hold an admission would have. It returns why the request
// can never run, as Add's rejections say ("" when it was added); then
// nothing was added and the executor releases the sequence.
func (s *Scheduler) AddForked(r Request, history int) string {
	if reason := s.check(r); reason != "" {
		return reason
	}
	if history < 0 || history >= r.Prompt {
		return fmt.Sprintf("forked at history %d of a %d-token prompt: want 0 <= history < prompt", history, r.Prompt)
	}
	q := &req{Request: r, running: true, history: history}
	if s.cfg.Policy == GuaranteedNoEvict {
		q.hold = r.Prompt + r.MaxNew + s.cfg.Draft
	}
	s.order++
	q.order = s.order
	s.reqs[r.ID] = q
	s.running = append(s.running, q)
	return ""
}

func (s *Scheduler) check(r Request) string {
	c := &s.cfg
	switch {
	case r.Prompt <= 0:
		return fmt.Sprintf("prompt has %d tokens, must be > 0", r.Prompt)
	case r.MaxNew <= 0:
		return fmt.Sprintf("max_new_tokens is %d, must be > 0", r.MaxNew)
	case r.Prompt+r.MaxNew > c.MaxSeqLen:
		return fmt.Sprintf("prompt %d + max_new_tokens %d = %d tokens exceeds max_seq_len %d",
			r.Prompt, r.MaxNew, r.Prompt+r.MaxNew, c.MaxSeqLen)
	case r.Prompt+r.MaxNew+c.Draft > c.MaxSeqTokens:
		return fmt.Sprintf("needs %d token slots (prompt %d + max_new_tokens %d + draft %d), the cache guarantees %d per sequence",
			r.Prompt+r.MaxNew+c.Draft, r.Prompt, r.MaxNew, c.Draft, c.MaxSeqTokens)
	case !c.ChunkedPrefill && r.Prompt > c.MaxNumTokens:
		return fmt.Sprintf("prompt %d tokens exceeds max_num_tokens %d and chunked prefill is off",
			r.Prompt, c.MaxNumTokens)
	}
	if _, dup := s.reqs[r.ID]; dup {
		return fmt.Sprintf("request id %d is already queued or running", r.ID)
	}
	if _, dup := s.aborted[r.ID]; dup {
		return fmt.Sprintf("request id %d was aborted and is still in flight", r.ID)
	}
	return ""
}

// Idle reports that nothing is waiting, running, in flight or left to report.
func (s *Scheduler) Idle() bool {
	return len(s.waiting) == 0 && len(s.running) == 0 && len(s.aborted) == 0 &&
		len(s.rejected) == 0 && len(s.toRelease) == 0
}

// Waiting is the number of queued requests (new and preempted).
func (s *Scheduler) Waiting() int { return len(s.waiting) }

// Running is the number of admitted, unfinished requests, in flight or not.
func (s *Scheduler) Running() int { return len(s.running) }

// InFlight is the number of items scheduled and not yet completed, counting
// those of requests aborted while in flight.
func (s *Scheduler) InFlight() int { return s.inFlight + len(s.aborted) }

func (s *Scheduler) resident() int { return len(s.running) + len(s.aborted) }

// pass is the micro-batch being built by one round of Schedule.
type pass struct {
	c        Capacity
	st       *Step
	items    []Item
	slots    int  // items left
	tokens   int  // tokens left
	pressure bool // a request was preempted in this round: admit nothing
	resumed  bool // admit resumed a request, which no pass has tried to schedule yet
}

func (p *pass) take(it Item)   { p.slots--; p.tokens -= it.Tokens + it.Draft }
func (p *pass) refund(it Item) { p.slots++; p.tokens += it.Tokens + it.Draft }

// Schedule returns the next micro-batch and marks its items in flight.
//
// It never leaves the engine stuck: when it returns no items and InFlight is
// 0, the scheduler is Idle. To get there it preempts the newest running
// request when nothing else can run (under either policy) and rejects a
// request that is denied while nothing else holds capacity ("does not fit in
// an empty cache"). A Step can carry Preempted or Rejected entries with or
// without items.
func (s *Scheduler) Schedule(c Capacity) Step {
	var st Step
	if len(s.rejected) > 0 {
		st.Rejected = append(st.Rejected, s.rejected...)
		s.rejected = s.rejected[:0]
	}
	if len(s.toRelease) > 0 {
		c.Release(s.toRelease)
		s.toRelease = s.toRelease[:0]
	}
	for {
		p := pass{c: c, st: &st, slots: s.cfg.MaxBatchSize, tokens: s.cfg.MaxNumTokens}
		s.scheduleRunning(&p, true)
		s.scheduleRunning(&p, false)
		headRejected := false
		if !p.pressure {
			headRejected = s.admit(&p)
		}
		if len(p.items) > 0 || s.InFlight() > 0 {
			st.Items = p.items
			break
		}
		if p.resumed {
			// A request came back from the host tier after the running ones
			// were scheduled: schedule it before preempting anything (else
			// it would be suspended again at once, round after round).
			continue
		}
		if v := s.newestIdle(); v != nil {
			// Nothing can run and nothing will complete: free the newest.
			s.preempt(&p, v)
			continue
		}
		if (p.pressure || headRejected) && len(s.waiting) > 0 {
			// Running is empty now: admit into the empty cache.
			continue
		}
		break
	}
	for _, it := range st.Items {
		r := s.reqs[it.ID]
		r.inBatch = false
		r.inFlight = true
		s.inFlight++
	}
	return st
}

// scheduleRunning builds the generation items (gen) or the continuing
// prefill chunks (!gen) of running requests that are not in flight, oldest
// admission first, and reserves them in one call.
func (s *Scheduler) scheduleRunning(p *pass, gen bool) {
	cands, items := s.cands[:0], s.items[:0]
	for _, r := range s.running {
		if r.inFlight || r.inBatch {
			continue
		}
		rem := r.known() - r.history
		if gen != (rem == 1) {
			continue
		}
		if p.slots == 0 {
			break
		}
		var it Item
		if gen {
			if p.tokens < 1+s.cfg.Draft {
				break
			}
			it = Item{ID: r.ID, Pos: r.history, Tokens: 1, Draft: s.cfg.Draft, Sample: true}
		} else {
			n := s.chunk(r.history, rem, p.tokens)
			if n == 0 {
				continue
			}
			it = Item{ID: r.ID, Pos: r.history, Tokens: n, Sample: n == rem, Prefill: true}
		}
		p.take(it)
		cands = append(cands, r)
		items = append(items, it)
	}
	s.cands, s.items = cands, items
	if len(cands) == 0 {
		return
	}
	cands, items = s.reserveRunning(p, cands, items)
	for len(cands) > 0 {
		if len(s.running) == 1 && s.InFlight() == 0 && s.dropSuspended(p) > 0 {
			// The suspended requests held device blocks: try again.
			cands, items = s.reserveRunning(p, cands, items)
			continue
		}
		if len(s.running) == 1 && s.InFlight() == 0 {
			// The denied request is alone in the cache: recomputing it would
			// only come back here.
			r, it := cands[0], items[0]
			p.refund(it)
			s.drop(r)
			p.c.Release([]kvcache.SeqID{r.ID})
			p.st.Rejected = append(p.st.Rejected, Rejection{ID: r.ID, Reason: fmt.Sprintf(
				"does not fit in an empty cache: step at position %d of %d tokens + %d draft was denied with no other request resident",
				it.Pos, it.Tokens, it.Draft)})
			return
		}
		if s.cfg.Policy != MaxUtilization {
			break // GuaranteedNoEvict: skip this step
		}
		v := s.newestIdle()
		if v == nil {
			break
		}
		s.preempt(p, v)
		for i, r := range cands {
			if r == v {
				p.refund(items[i])
				cands = append(cands[:i], cands[i+1:]...)
				items = append(items[:i], items[i+1:]...)
				break
			}
		}
		cands, items = s.reserveRunning(p, cands, items)
	}
	for _, it := range items {
		p.refund(it) // still denied: skipped this step
	}
}

// reserveRunning asks the cache for the items of the running requests cands
// (in one Reserve), grants the step to those it accepts and returns the
// denied ones, in order, reusing the slices.
func (s *Scheduler) reserveRunning(p *pass, cands []*req, items []Item) ([]*req, []Item) {
	if len(cands) == 0 {
		return cands, items
	}
	asks := s.asks[:0]
	for i, it := range items {
		asks = append(asks, kvcache.ReserveItem{Seq: it.ID, Tokens: it.Tokens, Draft: it.Draft, Hold: cands[i].hold})
	}
	ok := p.c.Reserve(asks)
	s.asks = asks[:0]
	n := 0
	for i, r := range cands {
		if i < len(ok) && ok[i] {
			r.hold = 0 // the sequence keeps it until released
			s.grant(p, r, items[i])
			continue
		}
		cands[n], items[n] = r, items[i]
		n++
	}
	return cands[:n], items[:n]
}

func (s *Scheduler) grant(p *pass, r *req, it Item) {
	r.inBatch = true
	r.item = it
	if p.items == nil {
		// One allocation per step: the caller owns Step.Items.
		p.items = make([]Item, 0, min(s.cfg.MaxBatchSize, len(s.running)+len(s.waiting)))
	}
	p.items = append(p.items, it)
}

// admit admits waiting requests FCFS into the room the pass has left, with
// one Lookup (when Reuse) and one Reserve call. It reports whether it
// rejected the head of the queue for not fitting in an empty cache.
func (s *Scheduler) admit(p *pass) bool {
	n := min(len(s.waiting), s.cfg.MaxResident-s.resident(), p.slots, p.tokens)
	if n <= 0 {
		return false
	}
	empty := s.resident() == 0 && s.InFlight() == 0
	if s.headDenied && s.headDeniedAt == s.freed && !empty {
		return false // nothing left the cache since the head was denied
	}
	s.headDenied = false
	if s.resume(p) {
		return false // FCFS: a suspended head resumes before anyone is admitted
	}
	n = min(s.newAtHead(), s.cfg.MaxResident-s.resident(), p.slots, p.tokens)
	if n <= 0 {
		return false
	}
	empty = s.resident() == 0 && s.InFlight() == 0
	// Candidates go in windows that double while every ask is granted: under
	// memory pressure the head is denied and only a few prompts were sent
	// to Lookup, instead of the whole waiting queue every step.
	for w := admitWindow; n > 0; w *= 2 {
		k := min(w, n)
		granted, denied, rejected := s.admitWindow(p, s.waiting[:k], empty)
		if rejected || denied || granted < k {
			return rejected
		}
		empty = false
		n = min(s.newAtHead(), s.cfg.MaxResident-s.resident(), p.slots, p.tokens)
	}
	return false
}

// newAtHead is the number of waiting requests before the first suspended
// one: those admit is free to admit anew. A suspended request resumes (it
// holds a sequence on the host tier) and never goes through admission as a
// new one; it can sit behind others when a later victim was released to
// the head of the queue after it was suspended.
func (s *Scheduler) newAtHead() int {
	for i, r := range s.waiting {
		if r.suspended {
			return i
		}
	}
	return len(s.waiting)
}

// admitWindow is the first window of candidates to look up and reserve.
const admitWindow = 4

// admitWindow tries to admit cands, the head of the waiting queue, in order.
// It returns how many were admitted, whether one was denied, and whether the
// head was rejected for not fitting an empty cache.
func (s *Scheduler) admitWindow(p *pass, cands []*req, empty bool) (granted int, denied, rejected bool) {
	var hits []int
	if s.cfg.Reuse {
		ids := s.ids[:0]
		for _, r := range cands {
			ids = append(ids, r.ID)
		}
		s.ids = ids
		hits = p.c.Lookup(ids)
	}
	tpb := s.cfg.TokensPerBlock
	tokens := p.tokens
	items, asks := s.items[:0], s.asks[:0]
	for i, r := range cands {
		known := r.known()
		reuse := 0
		if i < len(hits) {
			reuse = max(0, min(hits[i], known-1)) / tpb * tpb
		}
		c := s.chunk(reuse, known-reuse, tokens)
		if c == 0 {
			break // FCFS: the head waits for room, nobody skips ahead
		}
		tokens -= c
		hold := 0
		if s.cfg.Policy == GuaranteedNoEvict {
			hold = r.Prompt + r.MaxNew + s.cfg.Draft
		}
		items = append(items, Item{ID: r.ID, Pos: reuse, Tokens: c, Sample: reuse+c == known, Prefill: true, Reuse: reuse})
		asks = append(asks, kvcache.ReserveItem{Seq: r.ID, Tokens: c, Hold: hold, New: true, Reuse: reuse})
	}
	s.items, s.asks = items, asks
	if len(asks) == 0 {
		return 0, true, false
	}
	ok := p.c.Reserve(asks)
	first := 0
	for first < len(asks) && first < len(ok) && ok[first] {
		first++
	}
	if first < len(asks) {
		// FCFS: grants behind the first denial would skip ahead; undo them.
		ids := s.ids[:0]
		for j := first + 1; j < len(asks) && j < len(ok); j++ {
			if ok[j] {
				ids = append(ids, asks[j].Seq)
			}
		}
		s.ids = ids
		if len(ids) > 0 {
			p.c.Release(ids)
		}
	}
	for i := range first {
		r, it := cands[i], items[i]
		s.order++
		r.order = s.order
		r.running = true
		r.history = it.Pos
		s.running = append(s.running, r)
		p.take(it)
		s.grant(p, r, it)
	}
	s.waiting = s.waiting[first:]
	if first == 0 && !empty {
		// The cache refused the head: wait until something leaves it.
		s.headDenied, s.headDeniedAt = true, s.freed
	}
	if first == 0 && empty && s.dropSuspended(p) > 0 {
		// Suspended requests held device blocks: the next pass tries again.
		return 0, true, false
	}
	if first == 0 && empty {
		r, a := s.waiting[0], asks[0]
		s.drop(r)
		p.st.Rejected = append(p.st.Rejected, Rejection{ID: r.ID, Reason: fmt.Sprintf(
			"does not fit in an empty cache: prompt %d + generated %d, first chunk of %d tokens after %d reused, hold %d, was denied with no other request resident",
			r.Prompt, r.emitted, a.Tokens, a.Reuse, a.Hold)})
		return 0, true, true
	}
	return first, first < len(cands), false
}

// chunk is the number of tokens to prefill from pos, with rem left and budget
// tokens of room; 0 when nothing fits. Chunks other than the last end on a
// block boundary. Without chunked prefill the rest must fit whole, except a
// recompute after preemption longer than MaxNumTokens, which could never fit
// and is chunked.
func (s *Scheduler) chunk(pos, rem, budget int) int {
	if rem <= budget {
		return rem
	}
	if !s.cfg.ChunkedPrefill && rem <= s.cfg.MaxNumTokens {
		return 0
	}
	tpb := s.cfg.TokensPerBlock
	end := (pos + budget) / tpb * tpb
	if end <= pos {
		return 0
	}
	return end - pos
}

// dropSuspended releases every suspended request's cache (host copy and
// the device blocks it still pins); they wait where they are and recompute.
// It returns how many it dropped.
func (s *Scheduler) dropSuspended(p *pass) int {
	var ids []kvcache.SeqID
	for _, r := range s.waiting {
		if r.suspended {
			r.suspended, r.history = false, 0
			ids = append(ids, r.ID)
		}
	}
	if len(ids) > 0 {
		p.c.Release(ids)
		p.st.Dropped = append(p.st.Dropped, ids...)
	}
	return len(ids)
}

// newestIdle is the most recently admitted running request not in flight.
func (s *Scheduler) newestIdle() *req {
	for i := len(s.running) - 1; i >= 0; i-- {
		if r := s.running[i]; !r.inFlight {
			return r
		}
	}
	return nil
}

// preempt releases v, removes it from the pass, and queues it at the front of
// the waiting queue with history 0.
func (s *Scheduler) preempt(p *pass, v *req) {
	if s.suspend(p, v) {
		return
	}
	p.c.Release([]kvcache.SeqID{v.ID})
	// The space was taken back for the running requests to grow into:
	// admitting the victim again before anything finishes would only
	// recompute it to be preempted again (a recompute storm).
	s.headDenied, s.headDeniedAt = true, s.freed
	if v.inBatch {
		s.unbatch(p, v)
	}
	s.removeRunning(v)
	v.history = 0
	v.order = 0
	s.waiting = append(s.waiting, nil)
	copy(s.waiting[1:], s.waiting)
	s.waiting[0] = v
	p.st.Preempted = append(p.st.Preempted, v.ID)
	p.pressure = true
}

// suspend pauses v by moving its cache to the host tier, when configured
// and possible: v keeps its history and resumes at the head of the queue.
// A request granted in the step being built holds a reservation and cannot
// be suspended.
func (s *Scheduler) suspend(p *pass, v *req) bool {
	sp, ok := p.c.(Suspender)
	if !ok || !s.cfg.Suspend || s.cfg.Policy != MaxUtilization || v.inBatch {
		return false
	}
	if res := sp.Suspend([]kvcache.SeqID{v.ID}); len(res) != 1 || !res[0] {
		return false
	}
	s.removeRunning(v)
	v.suspended = true
	v.order = 0
	s.waiting = append(s.waiting, nil)
	copy(s.waiting[1:], s.waiting)
	s.waiting[0] = v
	p.st.Preempted = append(p.st.Preempted, v.ID)
	p.st.Suspended = append(p.st.Suspended, v.ID)
	p.pressure = true
	s.headDenied, s.headDeniedAt = true, s.freed
	return true
}

// resume brings suspended requests at the head of the queue back, in order,
// while they fit; it reports whether the head is still suspended.
func (s *Scheduler) resume(p *pass) (blocked bool) {
	for len(s.waiting) > 0 && s.waiting[0].suspended && s.resident() < s.cfg.MaxResident {
		r := s.waiting[0]
		sp, _ := p.c.(Suspender)
		if sp == nil {
			return true
		}
		if res := sp.Resume([]kvcache.SeqID{r.ID}); len(res) != 1 || !res[0] {
			if s.resident() > 0 || s.InFlight() > 0 {
				s.headDenied, s.headDeniedAt = true, s.freed
				return true
			}
			// Not even an empty cache takes it back: recompute instead.
			p.c.Release([]kvcache.SeqID{r.ID})
			r.suspended, r.history = false, 0
			return false
		}
		r.suspended = false
		p.resumed = true
		s.order++
		r.order = s.order
		r.running = true
		s.running = append(s.running, r)
		s.waiting = s.waiting[1:]
	}
	return len(s.waiting) > 0 && s.waiting[0].suspended
}

func (s *Scheduler) unbatch(p *pass, r *req) {
	r.inBatch = false
	for i, it := range p.items {
		if it.ID == r.ID {
			p.refund(it)
			p.items = append(p.items[:i], p.items[i+1:]...)
			return
		}
	}
}

func (s *Scheduler) removeRunning(r *req) {
	r.running = false
	for i, q := range s.running {
		if q == r {
			s.running = append(s.running[:i], s.running[i+1:]...)
			return
		}
	}
}

func (s *Scheduler) removeWaiting(r *req) {
	for i, q := range s.waiting {
		if q == r {
			s.waiting = append(s.waiting[:i], s.waiting[i+1:]...)
			return
		}
	}
}

// drop forgets r, which must not be in flight.
func (s *Scheduler) drop(r *req) {
	if r.suspended {
		// Its cache waits on the host tier: the next Schedule releases it.
		s.toRelease = append(s.toRelease, r.ID)
	}
	if r.running {
		s.freed++
		s.removeRunning(r)
	} else {
		s.removeWaiting(r)
	}
	delete(s.reqs, r.ID)
}

// Complete reports that id's in-flight item ran: accepted is the number of KV
// tokens now final (the item's Tokens plus accepted drafts), emitted the
// output tokens the step produced (0 for a non-final prefill chunk, 1 for the
// final one, 1 + accepted drafts for generation; the scheduler caps the total
// at MaxNew). It returns true when the request has emitted MaxNew tokens: the
// scheduler forgets it and the executor releases its capacity.
//
// Complete for a request aborted while in flight only ends its in-flight
// state. Complete for an unknown id does nothing. A Complete that breaks the
// item's contract (no item in flight, accepted outside [Tokens, Tokens+Draft],
// emitted not as above) is a request-scoped failure: the request is dropped,
// released by the next Schedule and reported in its Rejected.
func (s *Scheduler) Complete(id kvcache.SeqID, accepted, emitted int) (finished bool) {
	if _, ok := s.aborted[id]; ok {
		delete(s.aborted, id)
		return false
	}
	r := s.reqs[id]
	if r == nil {
		return false
	}
	if !r.inFlight {
		s.fail(r, fmt.Sprintf("Complete(accepted=%d, emitted=%d) for a request with no item in flight", accepted, emitted))
		return false
	}
	r.inFlight = false
	s.inFlight--
	it := r.item
	var want string
	switch {
	case !it.Sample && (accepted != it.Tokens || emitted != 0):
		want = fmt.Sprintf("accepted=%d emitted=0", it.Tokens)
	case it.Prefill && it.Sample && (accepted != it.Tokens || emitted != 1):
		want = fmt.Sprintf("accepted=%d emitted=1", it.Tokens)
	case !it.Prefill && (accepted < it.Tokens || accepted > it.Tokens+it.Draft || emitted != accepted):
		want = fmt.Sprintf("accepted in [%d, %d] and emitted == accepted", it.Tokens, it.Tokens+it.Draft)
	}
	if want != "" {
		s.fail(r, fmt.Sprintf("Complete(accepted=%d, emitted=%d) breaks its item (pos %d, tokens %d, draft %d, sample %t): want %s",
			accepted, emitted, it.Pos, it.Tokens, it.Draft, it.Sample, want))
		return false
	}
	r.history += accepted
	r.emitted = min(r.MaxNew, r.emitted+emitted)
	if r.emitted < r.MaxNew {
		return false
	}
	s.drop(r)
	return true
}

// fail drops r (not in flight) as a request-scoped failure: the next
// Schedule releases its capacity, if it held any, and reports it.
func (s *Scheduler) fail(r *req, reason string) {
	if r.running {
		s.toRelease = append(s.toRelease, r.ID)
	}
	s.drop(r)
	s.rejected = append(s.rejected, Rejection{ID: r.ID, Reason: reason})
}

// RequeueAll returns every admitted request, in flight or not, to the front
// of the waiting queue in admission order, for recompute from scratch: the
// executor lost their caches (a plugin died) and releases them itself, so the
// scheduler calls no Capacity method. Requests aborted while in flight are
// forgotten; failures not yet reported stay reported by the next Schedule.
// It returns the requeued ids.
func (s *Scheduler) RequeueAll() []kvcache.SeqID {
	ids := make([]kvcache.SeqID, 0, len(s.running))
	front := make([]*req, 0, len(s.running)+len(s.waiting))
	for _, r := range s.running {
		r.inFlight, r.inBatch, r.running = false, false, false
		r.history, r.order = 0, 0
		front = append(front, r)
		ids = append(ids, r.ID)
	}
	s.running = s.running[:0]
	s.inFlight = 0
	s.freed++
	for _, r := range s.waiting {
		if r.suspended { // its cache is gone with the plugin, or released
			r.suspended, r.history = false, 0
			ids = append(ids, r.ID)
		}
	}
	clear(s.aborted)
	s.toRelease = s.toRelease[:0]
	s.waiting = append(front, s.waiting...)
	return ids
}

// Abort forgets a request in any state (a request-scoped failure, a client
// that went away, a stop token). The executor releases its capacity if it was
// admitted: at once when no item of it is in flight, else after the
// in-flight item's Complete (which the executor still calls; it only ends the
// in-flight state). Until then the request counts as in flight and resident.
// Aborting an unknown or finished id does nothing.
func (s *Scheduler) Abort(id kvcache.SeqID) {
	r := s.reqs[id]
	if r == nil {
		return
	}
	if r.inFlight {
		r.inFlight = false
		s.inFlight--
		s.aborted[id] = struct{}{}
	}
	s.drop(r)
}

// Shorten lowers request id's output length to maxNew generated tokens (a
// stop condition ended it early: an EOS or stop id, a stop string). Called
// before the Complete of the step that generated its last token, that
// Complete then finishes it. A longer maxNew, or an unknown id, changes
// nothing.
func (s *Scheduler) Shorten(id kvcache.SeqID, maxNew int) {
	if r := s.reqs[id]; r != nil && maxNew < r.MaxNew {
		r.MaxNew = max(maxNew, r.emitted)
	}
}
