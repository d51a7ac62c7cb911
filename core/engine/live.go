package engine

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/kvx-dev/kvx/core/report"
	"github.com/kvx-dev/kvx/core/workload"
	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
	"github.com/kvx-dev/kvx/plugins/v1/worker"
)

// A live engine takes its requests while it runs (kvx serve) instead of from
// a workload: Submit hands one to the step loop, which admits it at the
// engine clock of the next turn, and the request's tokens come back as
// Events. The loop is the one Run drives (loop.go); between two turns it
// publishes what the turn produced, takes cancellations and new arrivals,
// and when nothing is left to do it waits for the next Submit instead of
// ending.
//
// The engine clock stays what it is in Run: on device sim it is simulated
// time (the loop runs steps as fast as they complete, and an idle engine's
// clock stands still), on a computing device it is the measured time of the
// forwards. Event.At is that clock, so a server can report simulated
// latencies honestly.

// ErrStopped is the Err of a request that the engine dropped because it
// stopped (Stop, or an engine failure) before the request finished.
var ErrStopped = errors.New("engine stopped")

// ErrCancelled is the Err of a request whose Handle.Cancel was called.
var ErrCancelled = errors.New("request cancelled")

// RequestError is the Err of a request the engine rejected or failed alone
// (the engine goes on): Reason names the numbers.
type RequestError struct {
	Rejected bool // never admitted: it cannot fit (scheduler's rejection)
	Reason   string
}

func (e *RequestError) Error() string { return e.Reason }

// LiveRequest is one request submitted to a live engine. Prompt is copied.
type LiveRequest struct {
	Prompt    []int32 // at least one token, each in the model's vocabulary
	MaxTokens int     // tokens to generate, at least 1
	// CacheSalt isolates the request's prefix cache (vLLM's cache_salt):
	// only requests with the same salt share blocks. "" shares with every
	// unsalted request. Submit refuses one longer than
	// kvcache.MaxCacheSaltBytes, or any when a manager lacks the capability.
	CacheSalt string
	// RetentionPriority (1..100; 0 takes the workload's default) and
	// RetentionDuration (ns; 0 = while cached) are the retention of the
	// blocks it stores (workload.Request's). Submit refuses a priority
	// out of range.
	RetentionPriority int
	RetentionDuration int64
	// TopLogprobs asks for the TopLogprobs most likely tokens of every
	// generated position (Event.TopLogprobs), 0 for none.
	TopLogprobs int
	// Decoding is its sampling and stop conditions (workload.Decoding);
	// the zero value is greedy to MaxTokens.
	Decoding workload.Decoding
	// PromptLogprobs asks for the log-probability of every prompt token
	// after the first (Event.PromptLogprobs), and PromptTopLogprobs > 0
	// for that many most likely tokens at each of those positions too.
	// Such a request takes nothing from the prefix cache: every prompt
	// position is computed, so that each has its row (vLLM does the same);
	// the blocks it computes are still cached for others. Its prompt is
	// prefilled on its own when SubmitN makes it, never forked.
	PromptLogprobs    bool
	PromptTopLogprobs int
}

// Event is one step's news for a request: tokens generated, and at the end
// Done or Err. A request's events end with exactly one event whose Done is
// true or whose Err is set.
type Event struct {
	Tokens []int32 // newly generated tokens; owned by the receiver
	At     int64   // the engine clock (ns) when they were committed
	Done   bool    // the request generated MaxTokens tokens, or Stopped
	// Stopped, with Done, says a stop condition ended the request before
	// MaxTokens (a stop id, or Decoding.StopText): OpenAI's finish_reason
	// "stop".
	Stopped bool
	// Logprobs (Decoding.Logprobs) and TopLogprobs (LiveRequest.TopLogprobs)
	// have one entry per token of Tokens, on devices that compute them.
	Logprobs    []float64
	TopLogprobs [][]worker.TokenLogprob
	// PromptLogprobs and PromptTopLogprobs (LiveRequest.PromptLogprobs)
	// come with the first event that has tokens, on devices that compute
	// them: entry i is about prompt token i+1 (the first has none).
	PromptLogprobs    []float64
	PromptTopLogprobs [][]worker.TokenLogprob
	Err               error // ErrCancelled, ErrStopped, or a *RequestError
	// Cached is the number of prompt tokens the prefix cache supplied at the
	// request's first admission; set on the final event.
	Cached int
}

// Handle is a submitted request. Its methods are safe for concurrent use.
type Handle struct {
	ID      kvcache.SeqID
	Arrival int64 // the engine clock when the loop took it; set with the first event
	lv      *Live
	req     LiveRequest // until the loop takes it
	grp     *liveGroup  // the request's group when SubmitN made it; nil alone
	mu      sync.Mutex
	queue   []Event
	notify  chan struct{}
	closed  bool
}

// Next returns the request's next event, waiting for it, or ctx.Err() when
// ctx ends first. Callers stop after the final event (Done or Err): nothing
// follows it.
func (h *Handle) Next(ctx context.Context) (Event, error) {
	for {
		if err := ctx.Err(); err != nil {
			return Event{}, err
		}
		h.mu.Lock()
		if len(h.queue) > 0 {
			ev := h.queue[0]
			h.queue = h.queue[1:]
			h.mu.Unlock()
			return ev, nil
		}
		h.mu.Unlock()
		select {
		case <-h.notify:
		case <-ctx.Done():
			return Event{}, ctx.Err()
		}
	}
}

// Cancel asks the engine to drop the request and free its blocks (a client
// that went away). It returns at once; the request's final event has Err
// ErrCancelled unless it finished first. Cancelling twice does nothing more.
func (h *Handle) Cancel() {
	h.lv.mu.Lock()
	h.lv.cancels = append(h.lv.cancels, h.ID)
	h.lv.mu.Unlock()
	h.lv.wake()
}

// push queues ev; the loop calls it and never blocks on a slow receiver.
func (h *Handle) push(ev Event) {
	h.mu.Lock()
	if !h.closed {
		h.queue = append(h.queue, ev)
		h.closed = ev.Done || ev.Err != nil
	}
	h.mu.Unlock()
	select {
	case h.notify <- struct{}{}:
	default:
	}
}

// LiveStats are a live engine's counters and gauges, as of its last turn.
type LiveStats struct {
	Running, Waiting   int     // the scheduler's requests
	KVUsage            float64 // device blocks in use / device blocks, the fullest stage (0..1)
	PromptTokens       int64   // prompt tokens of admitted requests (prefix cache queries)
	PrefixHits         int64   // of those, tokens the prefix cache supplied
	GeneratedTokens    int64
	Preemptions        int64
	PluginRestarts     int
	Completed, Aborted int64 // requests finished; requests that ended otherwise
	Steps              uint64
	Forked             int64 // sequences forked from a prompt prefilled once (SubmitN)
	Clock              int64 // engine clock, ns
	Modelled           bool  // the clock is simulated (device sim)
}

// Live is a running live engine. Its methods are safe for concurrent use.
type Live struct {
	mu      sync.Mutex
	subs    []*Handle // submitted, not yet taken by the loop
	cancels []kvcache.SeqID
	nextID  kvcache.SeqID
	stopped bool
	stats   LiveStats
	// recovering says why the engine is not serving now (a plugin
	// restart), "" while it is (Health).
	recovering string

	wakeC chan struct{}
	stopC chan struct{}
	doneC chan struct{}
	rep   report.Report
	err   error

	// Loop-side state, touched only by the loop goroutine.
	open      map[kvcache.SeqID]*liveOpen
	seenRej   int
	seenFail  int
	lastStats time.Time
	pending   []kvcache.SeqID // cancellations waiting for an in-flight item
	prompt    int64           // prompt tokens submitted
	completed int64
	aborted   int64

	queued atomic.Int64
	maxSeq int
	salt   error       // why salted requests are refused (nil: they are served)
	resets []*resetReq // ResetPrefixCache calls waiting for the loop (reset.go)
}

// stForgotten marks a live request whose figures moved into the report's
// totals (Live.forget); the next compaction drops it.
const stForgotten reqState = 255

// liveOpen is a request the loop still publishes to.
type liveOpen struct {
	h    *Handle
	r    *request
	sent int // generated tokens already published
}

// StartLive builds the engine (configures every stage, as Run does) and runs
// its loop in a goroutine until Stop. s.Workload is ignored. A setup error
// is returned at once.
func StartLive(ctx context.Context, s Spec, l Launcher) (*Live, error) {
	s.Workload.Requests, s.Workload.Concurrency = nil, 0
	s.Progress = nil
	e := &Engine{spec: s, launch: l, log: s.Log, byID: map[kvcache.SeqID]*request{}}
	if e.log == nil {
		e.log = hclog.NewNullLogger()
	}
	e.rep.Variant, e.rep.Config, e.started = s.Variant, s.Setup, time.Now()
	lv := &Live{
		wakeC: make(chan struct{}, 1),
		stopC: make(chan struct{}), doneC: make(chan struct{}), open: map[kvcache.SeqID]*liveOpen{},
	}
	e.live = lv
	// The same liveness as Run: every plugin call bounded, a hung plugin
	// killed and replaced like a dead one.
	stopper, _ := l.(Stopper)
	e.dog = newWatchdog(s.Liveness, stopper, e.log.Warn)
	if err := e.setup(ctx); err != nil {
		e.dog.close()
		return nil, err
	}
	lv.maxSeq = e.sched.Config().MaxSeqTokens
	lv.salt = e.saltErr()
	lv.refreshStats(ctx, e, true)
	go func() {
		defer e.dog.close()
		err := e.loop(ctx)
		e.dropForward()
		e.reqs = slices.DeleteFunc(e.reqs, func(r *request) bool { return r.state == stForgotten })
		e.finishReport(context.WithoutCancel(ctx))
		if err != nil && e.rep.Error == "" {
			e.rep.Error = err.Error()
		}
		lv.mu.Lock()
		lv.stopped, lv.rep, lv.err = true, e.rep, err
		subs := lv.subs
		lv.subs = nil
		lv.mu.Unlock()
		stopErr := ErrStopped
		if err != nil {
			stopErr = fmt.Errorf("%w: the engine failed: %v", ErrStopped, err)
		}
		for _, o := range lv.open {
			o.h.push(Event{Err: stopErr, At: e.now})
		}
		for _, h := range subs {
			h.push(Event{Err: stopErr})
		}
		close(lv.doneC)
	}()
	return lv, nil
}

// MaxSeqTokens is the longest sequence (prompt + generated tokens) that
// every stage's cache can hold, from the managers' layouts: a longer request
// is rejected.
func (lv *Live) MaxSeqTokens() int { return lv.maxSeq }

// Submit hands r to the loop. It fails with ErrStopped once the engine
// stopped. The caller must read the handle's events to the end or Cancel it.
func (lv *Live) Submit(r LiveRequest) (*Handle, error) {
	lv.mu.Lock()
	if err := lv.admit(&r); err != nil {
		lv.mu.Unlock()
		return nil, err
	}
	h := &Handle{ID: lv.nextID, lv: lv, req: r, notify: make(chan struct{}, 1)}
	lv.nextID++
	lv.subs = append(lv.subs, h)
	lv.mu.Unlock()
	lv.queued.Add(1)
	lv.wake()
	return h, nil
}

// admit checks r as Submit and SubmitN take it (the engine running, its
// salt and retention) and gives it its own copy of the prompt. lv.mu must
// be held.
func (lv *Live) admit(r *LiveRequest) error {
	if lv.stopped {
		return ErrStopped
	}
	if err := checkSalt(r.CacheSalt, lv.salt); err != nil {
		return err
	}
	if err := checkRetention(r.RetentionPriority, r.RetentionDuration); err != nil {
		return &RequestError{Reason: err.Error()}
	}
	r.Prompt = slices.Clip(slices.Clone(r.Prompt))
	return nil
}

// liveGroup is the requests of one SubmitN call, and the id of their
// hidden prefix request.
type liveGroup struct {
	pre kvcache.SeqID
	hs  []*Handle
}

// SubmitN hands the loop one request per decs entry, each r with that
// Decoding: the n sequences of one prompt (OpenAI's n and best_of). Their
// prompt is prefilled once and its blocks shared through the managers'
// fork (fork.go) when every stage's manager forks; otherwise, and for a
// prompt of one token, each runs as if Submit had taken it. Either way a
// handle's tokens are those Submit would have given it. The handles are in
// decs' order; errors are Submit's, and on one none was submitted.
func (lv *Live) SubmitN(r LiveRequest, decs []workload.Decoding) ([]*Handle, error) {
	lv.mu.Lock()
	if err := lv.admit(&r); err != nil {
		lv.mu.Unlock()
		return nil, err
	}
	g := &liveGroup{pre: lv.nextID}
	lv.nextID++
	for _, d := range decs {
		q := r
		q.Decoding = d
		h := &Handle{ID: lv.nextID, lv: lv, req: q, grp: g, notify: make(chan struct{}, 1)}
		lv.nextID++
		g.hs = append(g.hs, h)
	}
	lv.subs = append(lv.subs, g.hs...)
	lv.mu.Unlock()
	lv.queued.Add(int64(len(decs)))
	lv.wake()
	return slices.Clone(g.hs), nil
}

// Queued is the number of submitted requests that have produced no token
// yet (waiting, or in their prefill): what a server bounds.
func (lv *Live) Queued() int { return int(lv.queued.Load()) }

// Stats returns the counters and gauges as of the loop's last turn.
func (lv *Live) Stats() LiveStats {
	lv.mu.Lock()
	defer lv.mu.Unlock()
	return lv.stats
}

// Health says whether the engine serves now: ok is false, with the reason,
// while it restarts a plugin that died and once its loop has ended.
func (lv *Live) Health() (ok bool, reason string) {
	select {
	case <-lv.doneC:
		if err := lv.Err(); err != nil {
			return false, "the engine failed: " + err.Error()
		}
		return false, "the engine stopped"
	default:
	}
	lv.mu.Lock()
	defer lv.mu.Unlock()
	return lv.recovering == "", lv.recovering
}

func (lv *Live) setRecovering(reason string) {
	lv.mu.Lock()
	lv.recovering = reason
	lv.mu.Unlock()
}

// Done is closed when the loop has ended (Stop, or an engine error).
func (lv *Live) Done() <-chan struct{} { return lv.doneC }

// Stop ends the loop: requests not finished get ErrStopped. It returns the
// report (its figures cover every request the engine still held) and the
// engine's error, if it ended with one.
func (lv *Live) Stop() (report.Report, error) {
	lv.mu.Lock()
	if !lv.stopped {
		lv.stopped = true
		close(lv.stopC)
	}
	lv.mu.Unlock()
	<-lv.doneC
	return lv.rep, lv.err
}

// Err returns the engine error that ended the loop, or nil while it runs or
// after a clean Stop.
func (lv *Live) Err() error {
	select {
	case <-lv.doneC:
		return lv.err
	default:
		return nil
	}
}

func (lv *Live) wake() {
	select {
	case lv.wakeC <- struct{}{}:
	default:
	}
}

// turn runs on the loop goroutine between two iterations: it publishes
// tokens and endings, applies cancellations and takes new arrivals. An
// error is a plugin call's (releasing a cancelled request).
func (lv *Live) turn(ctx context.Context, e *Engine) error {
	lv.publish(e)
	lv.mu.Lock()
	subs := lv.subs
	lv.subs = nil
	cancels := append(lv.pending, lv.cancels...)
	lv.cancels = nil
	lv.mu.Unlock()
	var group *forkGroup // the group being taken, while it forks
	for _, h := range subs {
		lr := h.req
		h.req = LiveRequest{}
		r := &request{id: h.ID, arrival: e.now, prompt: len(lr.Prompt), maxNew: lr.MaxTokens, tok: newTokenLog(lr.Prompt), firstTok: -1, salt: lr.CacheSalt,
			topK: lr.TopLogprobs, dec: lr.Decoding, wantPrompt: lr.PromptLogprobs, promptTopK: lr.PromptTopLogprobs}
		r.priority, r.priorityDur = e.spec.Workload.Retention(workload.Request{RetentionPriority: lr.RetentionPriority, RetentionDuration: lr.RetentionDuration})
		h.Arrival = e.now
		if g := h.grp; g != nil && h == g.hs[0] {
			group = nil
			if len(g.hs) > 1 && len(lr.Prompt) > 1 && !lr.PromptLogprobs && e.forks() {
				// The hidden prefix: the prompt but its last token, greedy,
				// one token that nobody sees (fork.go).
				pre := &request{id: g.pre, arrival: e.now, prompt: r.prompt - 1, maxNew: 1, tok: newTokenLog(lr.Prompt[:r.prompt-1]), firstTok: -1,
					salt: r.salt, priority: r.priority, priorityDur: r.priorityDur}
				group = &forkGroup{pre: pre}
				pre.group = group
				e.reqs = append(e.reqs, pre)
				e.byID[pre.id] = pre
			}
		}
		if group != nil && h.grp != nil && h.grp.pre == group.pre.id {
			group.children = append(group.children, r)
		} else {
			e.reqs = append(e.reqs, r)
			e.byID[r.id] = r
		}
		e.rep.Requests.Total++
		lv.prompt += int64(r.prompt)
		lv.open[r.id] = &liveOpen{h: h, r: r}
	}
	lv.pending = nil
	// A cancelled request is in flight at every turn while it runs (its
	// next forward is started before the turn): complete the micro-batches
	// in flight now, as the next iterations would, so it can be dropped this
	// turn. The clock moves to when they are done; the pipeline is drained
	// once, at a cancellation.
	for lv.inFlight(cancels) && (e.pend != nil || len(e.inflight) > 0) {
		if err := e.awaitForward(ctx); err != nil {
			return err
		}
		if len(e.inflight) > 0 {
			e.now = max(e.now, e.inflight[0].done)
			if err := e.completeUpTo(ctx, e.now); err != nil {
				return err
			}
		}
	}
	var drop []kvcache.SeqID
	for _, id := range slices.Compact(slices.Sorted(slices.Values(cancels))) {
		o := lv.open[id]
		if o == nil {
			continue // finished already, or never known
		}
		switch r := o.r; {
		case r.state == stPending:
			r.rejected = ErrCancelled.Error() // admitArrivals drops it on arrival
		case r.state != stActive:
		case r.reserved:
			lv.pending = append(lv.pending, id) // its item is in flight: after it commits
		default:
			drop = append(drop, id)
		}
	}
	if len(drop) > 0 {
		if err := e.settle(); err != nil { // the release follows the last end of step
			return err
		}
		if err := e.failRequests(ctx, drop, false, ErrCancelled.Error()); err != nil {
			return err
		}
	}
	lv.publish(e)
	lv.refuseResets(e)
	lv.refreshStats(ctx, e, false)
	return nil
}

// inFlight reports whether one of the cancelled requests has an item in
// flight.
func (lv *Live) inFlight(ids []kvcache.SeqID) bool {
	for _, id := range ids {
		if o := lv.open[id]; o != nil && o.r.state == stActive && o.r.reserved {
			return true
		}
	}
	return false
}

// publish sends each open request the tokens it generated since the last
// turn and, when it ended, its final event.
func (lv *Live) publish(e *Engine) {
	why := map[kvcache.SeqID]*RequestError{}
	for _, rj := range e.rep.Requests.Rejections[lv.seenRej:] {
		why[kvcache.SeqID(rj.ID)] = &RequestError{Rejected: true, Reason: rj.Reason}
	}
	for _, f := range e.rep.Requests.Failures[lv.seenFail:] {
		why[kvcache.SeqID(f.ID)] = &RequestError{Reason: f.Reason}
	}
	// A server runs for long: the report keeps the latest reasons only (its
	// counts come from the requests' states, not from these lists).
	e.rep.Requests.Rejections = keepLast(e.rep.Requests.Rejections)
	e.rep.Requests.Failures = keepLast(e.rep.Requests.Failures)
	lv.seenRej, lv.seenFail = len(e.rep.Requests.Rejections), len(e.rep.Requests.Failures)
	for id, o := range lv.open {
		r := o.r
		gen := len(r.tok.Generated())
		var ev Event
		if gen > o.sent {
			if o.sent == 0 {
				lv.queued.Add(-1)
			}
			ev.Tokens = slices.Clone(r.tok.Generated()[o.sent:])
			if r.dec.Logprobs && len(r.chosen) == gen {
				ev.Logprobs = slices.Clone(r.chosen[o.sent:])
			}
			if r.topK > 0 && len(r.logprobs) == gen {
				ev.TopLogprobs = slices.Clone(r.logprobs[o.sent:])
			}
			if o.sent == 0 && r.wantPrompt && len(r.promptLP) == r.prompt-1 {
				ev.PromptLogprobs = r.promptLP
				if r.promptTopK > 0 {
					ev.PromptTopLogprobs = r.promptTop
				}
			}
			o.sent = gen
		}
		ev.At = e.now
		if r.firstTok >= 0 && len(ev.Tokens) == gen {
			ev.At = r.firstTok
		}
		switch r.state {
		case stDone:
			ev.Done, ev.At, ev.Cached, ev.Stopped = true, r.finish, r.reused, r.stopped
			lv.completed++
		case stFailed, stRejected:
			switch w := why[id]; {
			case w != nil && w.Reason == ErrCancelled.Error():
				ev.Err = ErrCancelled
			case w != nil:
				ev.Err = w
			default:
				ev.Err = &RequestError{Reason: "the engine dropped the request"}
			}
			if o.sent == 0 {
				lv.queued.Add(-1)
			}
			lv.aborted++
		}
		if ev.Tokens == nil && !ev.Done && ev.Err == nil {
			continue
		}
		o.h.push(ev)
		if ev.Done || ev.Err != nil {
			delete(lv.open, id)
			lv.forget(e, r)
		}
	}
}

// keptReasons is how many rejection and failure reasons a live engine's
// report keeps.
const keptReasons = 1000

func keepLast(rs []report.Rejection) []report.Rejection {
	if len(rs) <= 2*keptReasons {
		return rs
	}
	return slices.Clone(rs[len(rs)-keptReasons:])
}

// forget drops a finished request from the engine's records once nothing
// refers to it, so a server's memory does not grow with every request it
// served: its figures move into the report's running totals.
func (lv *Live) forget(e *Engine, r *request) {
	if r.reserved || r.resident {
		return
	}
	switch r.state {
	case stDone:
		e.rep.Requests.Completed++
		e.rep.Tokens.Prompt += int64(r.prompt)
	case stFailed:
		e.rep.Requests.Failed++
		e.rep.Tokens.Prompt += int64(r.prompt)
	case stRejected:
		e.rep.Requests.Rejected++
	default:
		return
	}
	r.state = stForgotten
	delete(e.byID, r.id)
	// Compact the request list now and then: entries before e.next that
	// were forgotten go.
	if forgot := len(e.reqs) - len(lv.open); forgot > 256 && forgot > len(e.reqs)/2 {
		kept := e.reqs[:0]
		next := 0
		for i, q := range e.reqs {
			if q.state == stForgotten {
				continue
			}
			if i < e.next {
				next++
			}
			kept = append(kept, q)
		}
		clear(e.reqs[len(kept):])
		e.reqs, e.next = kept, next
	}
}

// refreshStats updates the published figures; the managers' block usage is
// asked for at most every 100 ms, or when force is set.
func (lv *Live) refreshStats(ctx context.Context, e *Engine, force bool) {
	usage := -1.0
	if force || time.Since(lv.lastStats) > 100*time.Millisecond {
		lv.lastStats = time.Now()
		usage = 0
		for _, st := range e.stages {
			s, err := st.m.Stats(ctx)
			if err != nil {
				usage = -1
				break
			}
			var used, total int
			for i, p := range s.Pools {
				if i < len(st.layout.Pools) && st.layout.Pools[i].Tier == kvcache.TierDevice {
					used += p.InUse
					total += p.Total
				}
			}
			if total > 0 {
				usage = max(usage, float64(used)/float64(total))
			}
		}
	}
	lv.mu.Lock()
	defer lv.mu.Unlock()
	s := &lv.stats
	if e.sched != nil {
		s.Running, s.Waiting = e.sched.Running(), e.sched.Waiting()
	}
	if usage >= 0 {
		s.KVUsage = usage
	}
	s.PromptTokens, s.PrefixHits = lv.prompt, e.rep.Tokens.PrefixReused
	s.GeneratedTokens = e.rep.Tokens.Generated
	s.Preemptions = int64(e.rep.Requests.Preemptions)
	s.PluginRestarts = e.rep.Engine.PluginRestarts
	s.Completed, s.Aborted = lv.completed, lv.aborted
	s.Steps, s.Clock, s.Modelled = e.steps, e.now, e.modelled
	s.Forked = e.forked
}

// probeEvery is how often an idle live engine asks its plugins whether
// they live: a plugin that dies while nothing runs is found (and
// restarted) within about this long, not at the next request.
const probeEvery = 500 * time.Millisecond

// idle waits, with nothing left to run, for a submission, a cancellation or
// Stop: false means stop. Meanwhile it probes the plugins every probeEvery;
// an error is a probe's (a dead plugin: the loop restarts it).
func (lv *Live) idle(ctx context.Context, e *Engine) (bool, error) {
	lv.refreshStats(ctx, e, true)
	t := time.NewTicker(probeEvery)
	defer t.Stop()
	for {
		lv.mu.Lock()
		ready := len(lv.subs) > 0 || len(lv.cancels) > 0
		resets := len(lv.resets) > 0
		lv.mu.Unlock()
		if ready {
			return true, nil
		}
		if resets {
			if err := lv.runResets(ctx, e); err != nil {
				return true, err
			}
			continue
		}
		select {
		case <-lv.wakeC:
		case <-t.C:
			e.injectFaults()
			if err := lv.probe(ctx, e); err != nil {
				return true, err
			}
		case <-lv.stopC:
			return false, nil
		case <-ctx.Done():
			return false, nil
		}
	}
}

// probe asks every stage's manager for its stats and its worker for its
// health, each call bounded like any other.
func (lv *Live) probe(ctx context.Context, e *Engine) error {
	for _, st := range e.stages {
		e.dog.arm(slotCall, fmt.Sprintf("stage %d: probe of an idle engine's plugins", st.idx), e.spec.Liveness.Call, st.m, st.w)
		_, err := st.m.Stats(ctx)
		if err == nil {
			err = st.w.Health(ctx)
		}
		e.dog.disarm(slotCall)
		if err != nil {
			return stageErr(st.idx, "probe while idle", err)
		}
	}
	return nil
}

// stopping reports whether Stop was called.
func (lv *Live) stopping() bool {
	select {
	case <-lv.stopC:
		return true
	default:
		return false
	}
}

// liveStep is the loop's hook after each iteration of a live engine: it
// turns, and maps the end of the work to a wait for more. It returns the
// error the loop should act on (errDone ends the loop).
func (e *Engine) liveStep(ctx context.Context, err error) error {
	lv := e.live
	if err != nil && err != errDone {
		return err
	}
	if lv.stopping() {
		return errDone
	}
	if terr := lv.turn(ctx, e); terr != nil {
		return terr
	}
	if err != errDone || e.next < len(e.reqs) || !e.sched.Idle() || len(e.forkPend) > 0 {
		return nil // more to run: arrivals this turn took, or work a cancellation left
	}
	// Nothing left to run: settle the last end of step (its releases reach
	// the managers now, so the figures are right) and wait.
	if serr := e.settle(); serr != nil {
		return serr
	}
	if eerr := e.collectEvents(ctx); eerr != nil { // the last step's KV events, before the wait
		return eerr
	}
	lv.publish(e)
	more, perr := lv.idle(ctx, e)
	if perr != nil {
		return perr
	}
	if !more {
		return errDone
	}
	return lv.turn(ctx, e)
}
