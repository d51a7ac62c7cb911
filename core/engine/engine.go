// Package engine is the executor: it owns the step loop that drives the
// scheduler, the per-stage cache managers and the per-stage workers, keeps
// the (simulated or measured) clock, checks the managers' invariants, and
// produces a report.
//
// The engine talks only to kvcache.Manager and worker.Worker values; it
// cannot tell an in-process implementation from a plugin.
package engine

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/zeebo/xxh3"

	"github.com/kvx-dev/kvx/core/report"
	"github.com/kvx-dev/kvx/core/sched"
	"github.com/kvx-dev/kvx/core/workload"
	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
	"github.com/kvx-dev/kvx/plugins/v1/pipeline"
	"github.com/kvx-dev/kvx/plugins/v1/spec"
	"github.com/kvx-dev/kvx/plugins/v1/worker"
)

// Launcher makes a stage's manager and worker. The engine calls it at start
// and again to replace a plugin that died.
type Launcher interface {
	Manager(ctx context.Context, stage int) (kvcache.Manager, error)
	Worker(ctx context.Context, stage int) (worker.Worker, error)
}

// Stopper is an optional Launcher interface: Stop ends the process behind a
// manager or worker the launcher returned. The engine calls it on a stage's
// old plugins when it replaces them after one died, so no process is left
// behind a restart.
type Stopper interface {
	Stop(client any)
}

// Spec is a fully resolved run: every number is decided before Run starts.
type Spec struct {
	Variant  string
	Setup    report.Setup
	Hardware spec.Hardware
	Hidden   int // model hidden size, for the inter-stage transfer time

	Managers []kvcache.Config // one per pipeline stage
	Workers  []worker.Config  // one per pipeline stage; Layout is filled in by Run
	Sched    sched.Config     // MaxSeqTokens is filled in by Run from the layouts

	// CheckEvery inspects the managers after every CheckEvery-th commit (0 = never);
	// DeepEvery adds block tables and reference counts every DeepEvery-th check.
	CheckEvery int
	DeepEvery  int

	Workload workload.Workload
	// Sequential waits for each micro-batch's forward before the next step
	// is scheduled. Otherwise, where the next schedule cannot depend on that
	// forward (see overlaps), the engine schedules the next step while the
	// workers run it: plugin managers and workers then work side by side,
	// and the calls, their order and the results are the same.
	Sequential bool
	// KeepOutputs puts every request's generated tokens, and the logits of
	// its last sampled position on devices that compute them, in the report
	// (Outputs.Requests): the equivalence suite compares them.
	KeepOutputs bool
	// Progress receives a progress bar; nil for none.
	Progress io.Writer
	Log      hclog.Logger
}

// ErrInvariant reports a broken manager invariant; the run stops.
var ErrInvariant = errors.New("manager invariant violated")

// request is the engine's record of one request.
type request struct {
	id       kvcache.SeqID
	arrival  int64
	prompt   int
	maxNew   int
	tokens   []int32 // prompt followed by generated tokens
	drafts   []int32 // draft proposals from the last sample
	history  int     // KV tokens committed on every stage
	resident bool    // the managers hold a sequence for it
	reserved bool    // an outstanding reservation exists (in flight)
	firstTok int64   // simulated ns of the first token; -1 before
	finish   int64
	preempts int
	state    reqState
	logits   []float32 // of the last sampled position (KeepOutputs)
	logitsAt int       // index among the generated tokens of the token those logits sampled
}

type reqState uint8

const (
	stPending reqState = iota // not yet arrived
	stActive                  // in the scheduler
	stDone
	stRejected
	stFailed
)

// stage is one pipeline stage's plugins and pending work for its worker.
type stage struct {
	idx      int
	m        kvcache.Manager
	w        worker.Worker
	layout   kvcache.Layout
	released []kvcache.SeqID
	copies   []kvcache.Copy
	deltas   map[kvcache.SeqID][]kvcache.TableDelta
	snaps    map[kvcache.SeqID][]kvcache.SnapshotSlot // state saves granted for the next forward
	free     int64                                    // simulated ns when the stage can take the next micro-batch
	sp       kvcache.Suspender                        // m, when it can suspend sequences to a host tier; nil: it cannot
	peak     float64
}

// forget drops what the stage keeps for seq's next forward.
func (st *stage) forget(seq kvcache.SeqID) {
	delete(st.deltas, seq)
	delete(st.snaps, seq)
}

// microBatch is a scheduled step in flight through the pipeline.
type microBatch struct {
	step    uint64
	items   []sched.Item
	outputs map[kvcache.SeqID]worker.Output
	done    int64
}

// Engine runs one Spec.
type Engine struct {
	spec   Spec
	launch Launcher
	log    hclog.Logger
	stages []*stage
	sched  *sched.Scheduler
	reqs   []*request // by arrival order
	byID   map[kvcache.SeqID]*request

	now      int64 // simulated ns
	steps    uint64
	commits  int64
	inflight []*microBatch   // forwarded and waited for, by done
	pend     *pendingForward // a forward started and not yet waited for
	ending   *ending         // an end of step started on every stage, not yet settled
	next     int             // next request of reqs to hand to the scheduler
	active   int             // handed to the scheduler and not finished
	resident int             // requests whose sequences the managers hold
	err      error
	rep      report.Report
	modelled bool
	started  time.Time
	bar      *progress
}

// Run builds the engine (configures every stage) and runs the workload to the
// end. The report is returned also when err != nil, describing how far it got.
func Run(ctx context.Context, s Spec, l Launcher) (report.Report, error) {
	e := &Engine{spec: s, launch: l, log: s.Log, byID: map[kvcache.SeqID]*request{}}
	if e.log == nil {
		e.log = hclog.NewNullLogger()
	}
	e.rep.Variant = s.Variant
	e.rep.Config = s.Setup
	e.started = time.Now()
	err := e.setup(ctx)
	if err == nil {
		err = e.loop(ctx)
	}
	e.finishReport(ctx)
	if err != nil && e.rep.Error == "" {
		e.rep.Error = err.Error()
	}
	return e.rep, err
}

// setup launches and configures every stage, then the scheduler.
func (e *Engine) setup(ctx context.Context) error {
	n := len(e.spec.Managers)
	if n == 0 || len(e.spec.Workers) != n {
		return fmt.Errorf("engine: %d manager configs and %d worker configs; need one of each per stage", n, len(e.spec.Workers))
	}
	maxSeq := 0
	suspendable := true // every stage has a host tier to suspend to
	for i := range n {
		st := &stage{idx: i, deltas: map[kvcache.SeqID][]kvcache.TableDelta{}, snaps: map[kvcache.SeqID][]kvcache.SnapshotSlot{}}
		err := e.startStage(ctx, st)
		// A plugin that dies while it starts is started again, within the
		// same restart budget as one that dies mid-run.
		for err != nil && errors.Is(err, kvcache.ErrUnavailable) && ctx.Err() == nil && e.rep.Engine.PluginRestarts < MaxRestarts {
			e.rep.Engine.PluginRestarts++
			e.log.Warn("plugin died while starting; starting it again", "stage", i, "error", err)
			err = e.startStage(ctx, st)
		}
		if err != nil {
			return err
		}
		e.stages = append(e.stages, st)
		suspendable = suspendable && st.sp != nil
		if i == 0 || st.layout.MaxSeqTokens < maxSeq {
			maxSeq = st.layout.MaxSeqTokens
		}
	}
	sc := e.spec.Sched
	sc.MaxSeqTokens = maxSeq
	sc.Suspend = suspendable
	sch, err := sched.New(sc)
	if err != nil {
		return fmt.Errorf("scheduler: %w", err)
	}
	e.sched = sch
	for _, r := range e.spec.Workload.Requests {
		req := &request{
			id: kvcache.SeqID(r.ID), arrival: r.Arrival, prompt: len(r.Prompt), maxNew: r.OutputLen,
			tokens: r.Prompt, firstTok: -1,
		}
		e.reqs = append(e.reqs, req)
		e.byID[req.id] = req
	}
	if e.spec.Workload.Concurrency == 0 {
		slices.SortStableFunc(e.reqs, func(a, b *request) int { return cmpInt64(a.arrival, b.arrival) })
	}
	e.rep.Requests.Total = len(e.reqs)
	if e.spec.Progress != nil {
		e.bar = newProgress(e.spec.Progress, len(e.reqs), e.spec.Variant)
	}
	return nil
}

// startStage launches (or relaunches) a stage's plugins and configures them.
func (e *Engine) startStage(ctx context.Context, st *stage) error {
	i := st.idx
	m, err := e.launch.Manager(ctx, i)
	if err != nil {
		return fmt.Errorf("stage %d: cache manager: %w", i, err)
	}
	info, err := m.Info(ctx)
	if err != nil {
		return fmt.Errorf("stage %d: cache manager info: %w", i, err)
	}
	if err := checkCapabilities(info, e.spec.Managers[i]); err != nil {
		return fmt.Errorf("stage %d: %w", i, err)
	}
	layout, err := m.Configure(ctx, e.spec.Managers[i])
	if err != nil {
		return fmt.Errorf("stage %d: configure %s: %w", i, info.Name, err)
	}
	for _, w := range layout.Warnings {
		e.log.Info("cache manager", "stage", i, "warning", w)
	}
	w, err := e.launch.Worker(ctx, i)
	if err != nil {
		return fmt.Errorf("stage %d: worker: %w", i, err)
	}
	wc := e.spec.Workers[i]
	wc.Layout = layout
	if _, err := w.Configure(ctx, wc); err != nil {
		return fmt.Errorf("stage %d: configure worker: %w", i, err)
	}
	st.m, st.w, st.layout = m, w, layout
	st.sp = suspender(m, info, layout)
	return nil
}

// suspender returns m as a kvcache.Suspender when it can suspend sequences:
// it implements one, its Info says HostTier and its layout has host blocks.
// Otherwise it returns nil, and a preempted sequence is released and
// recomputed. A plugin client always implements Suspender, but its Info
// says HostTier only when the plugin's manager is one, so the answer is the
// same in-process and over gRPC.
func suspender(m kvcache.Manager, info kvcache.Info, layout kvcache.Layout) kvcache.Suspender {
	sp, ok := m.(kvcache.Suspender)
	if !ok || !info.Capabilities.HostTier {
		return nil
	}
	for _, p := range layout.Pools {
		if p.Tier == kvcache.TierHost && p.Blocks > 0 {
			return sp
		}
	}
	return nil
}

// checkCapabilities refuses a manager that cannot hold the stage's layers.
func checkCapabilities(info kvcache.Info, cfg kvcache.Config) error {
	for _, l := range cfg.Layers {
		if !l.HasCache() {
			continue
		}
		if !slices.Contains(info.Capabilities.Mixers, l.Mixer) {
			hint := ""
			if l.Mixer == spec.MixerMamba {
				hint = "; hybrid Mamba models need a manager with an SSM life cycle: set cache_manager: mamba (or v1, without SSM reuse)"
			}
			return fmt.Errorf("cache manager %s cannot serve layer %d (mixer %q); it supports %v%s", info.Name, l.Index, l.Mixer, info.Capabilities.Mixers, hint)
		}
	}
	if cfg.EnableBlockReuse && !info.Capabilities.PrefixReuse {
		return fmt.Errorf("cache manager %s has no prefix reuse; set kv_cache_config.enable_block_reuse: false", info.Name)
	}
	return nil
}

// errDone ends the loop.
var errDone = errors.New("done")

// loop is the discrete-event step loop. Simulated time advances to when the
// first stage can take a micro-batch; micro-batches commit when their last
// stage finishes; at most one micro-batch per pipeline stage is in flight.
// A plugin that dies is restarted and every request recomputed.
func (e *Engine) loop(ctx context.Context) error {
	for {
		err := e.iterate(ctx)
		if err == errDone {
			return e.settle()
		}
		if err == nil {
			continue
		}
		e.dropForward()
		dead, ok := deadStage(err)
		if !ok || ctx.Err() != nil {
			return err
		}
		if err := e.recoverStage(ctx, dead, err); err != nil {
			return err
		}
		e.err = nil
	}
}

// iterate schedules and forwards at most one micro-batch.
func (e *Engine) iterate(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	overlap := e.pend != nil && e.overlaps()
	var at int64 // overlap: the clock before the forward's answer
	admitted := e.next
	if overlap {
		// The forward in flight is the newest micro-batch, and every older
		// one completes before the next schedule, whatever the forward's
		// times (see overlaps). So they complete now, while the workers run.
		at = e.now
		e.rep.Engine.OverlappedSteps++
		for _, mb := range e.inflight {
			at = max(at, mb.done)
			if err := e.complete(ctx, mb); err != nil {
				return err
			}
		}
		e.inflight = e.inflight[:0]
		e.admitArrivals() // stamped again below, once the clock is known
	} else {
		if err := e.awaitForward(ctx); err != nil {
			return err
		}
		e.now = max(e.now, e.stages[0].free)
		if err := e.completeUpTo(ctx, e.now); err != nil {
			return err
		}
		e.admitArrivals()
		if len(e.inflight) >= len(e.stages) {
			e.now = e.inflight[0].done
			return nil
		}
	}
	step := e.sched.Schedule(admission{e, ctx})
	failed := e.err
	if failed != nil {
		// A plugin call failed inside Schedule, so its denials were not the
		// cache's answers: a request rejected for lack of space goes back to
		// the scheduler (a rejection it deserves comes again).
		e.requeueRejected(step.Rejected)
		step.Rejected = nil
	}
	e.handleRejected(step.Rejected)
	for _, id := range step.Preempted {
		e.rep.Requests.Preemptions++
		if slices.Contains(step.Suspended, id) {
			e.rep.Requests.Suspensions++ // cache kept on the host tier: nothing to recompute
			continue
		}
		r := e.byID[id]
		r.preempts++
		r.drafts = r.drafts[:0]
	}
	for _, id := range step.Dropped {
		// A suspension given up: the request recomputes after all.
		e.rep.Requests.Suspensions--
		r := e.byID[id]
		r.preempts++
		r.drafts = r.drafts[:0]
	}
	if overlap {
		// The forward's answer sets the clock the sequential engine would
		// have scheduled at: the arrivals just admitted take it.
		err := e.awaitForward(ctx)
		e.now = max(at, e.stages[0].free)
		if e.spec.Workload.Concurrency > 0 {
			for _, r := range e.reqs[admitted:e.next] {
				r.arrival = e.now
			}
		}
		if failed == nil {
			failed = err
		}
	}
	if failed != nil {
		return failed
	}
	if len(step.Items) == 0 {
		switch {
		case len(e.inflight) > 0:
			e.now = max(e.now, e.inflight[0].done)
		case e.next < len(e.reqs) && e.spec.Workload.Concurrency == 0:
			e.now = max(e.now, e.reqs[e.next].arrival)
		case e.sched.Idle() && e.next >= len(e.reqs):
			return errDone
		case e.sched.Idle() && e.canAdmitMore():
			// Closed loop: admitArrivals adds more on the next turn.
		default:
			return fmt.Errorf("engine: scheduler made no progress at step %d with %d waiting and %d running requests", e.steps, e.sched.Waiting(), e.sched.Running())
		}
		return nil
	}
	return e.startForward(ctx, step.Items)
}

// overlaps reports whether the next step may be scheduled while the
// started forward runs, with the same result as after it. The forward
// decides the clock (when stage 0 is free and when the micro-batch is
// done), and the sequential engine schedules once stage 0 is free and
// fewer micro-batches than stages are in flight, completing those done by
// then. With two stages that is every micro-batch but the newest, whatever
// the times: the one before it is in flight until then or completes, and
// the newest finishes after both stage 0 and the one before it (a forward
// takes time on the last stage). The clock itself is used only to stamp
// arrivals: closed-loop arrivals are stamped once it is known; open-loop
// ones would be admitted by it, so an open loop overlaps only once every
// request has arrived. With more stages which micro-batches complete
// depends on the times.
func (e *Engine) overlaps() bool {
	return !e.spec.Sequential && len(e.stages) == 2 && len(e.inflight) < len(e.stages) &&
		(e.spec.Workload.Concurrency > 0 || e.next >= len(e.reqs))
}

// admitArrivals hands arrived requests to the scheduler: by timestamp in an
// open loop, or keeping Concurrency requests active in a closed loop.
func (e *Engine) admitArrivals() {
	for e.next < len(e.reqs) {
		r := e.reqs[e.next]
		if c := e.spec.Workload.Concurrency; c > 0 {
			if e.active >= c {
				return
			}
			r.arrival = e.now
		} else if r.arrival > e.now {
			return
		}
		e.next++
		e.active++
		r.state = stActive
		e.sched.Add(sched.Request{ID: r.id, Prompt: r.prompt, MaxNew: r.maxNew})
	}
}

// requeueRejected hands rejected requests back to the scheduler as they
// stand: prompt plus what they generated so far, for what is left to generate.
func (e *Engine) requeueRejected(rs []sched.Rejection) {
	for _, rj := range rs {
		r := e.byID[rj.ID]
		if r == nil || r.state != stActive {
			continue
		}
		generated := len(r.tokens) - r.prompt
		e.sched.Add(sched.Request{ID: r.id, Prompt: len(r.tokens), MaxNew: r.maxNew - generated})
	}
}

func (e *Engine) canAdmitMore() bool {
	c := e.spec.Workload.Concurrency
	return e.next < len(e.reqs) && (c == 0 || e.active < c)
}

func (e *Engine) handleRejected(rs []sched.Rejection) {
	for _, rj := range rs {
		r := e.byID[rj.ID]
		if r == nil || r.state != stActive {
			continue
		}
		r.state = stRejected
		e.active--
		e.rep.Requests.Rejections = append(e.rep.Requests.Rejections, report.Rejection{ID: uint64(rj.ID), Reason: rj.Reason})
		e.bar.tick(e)
	}
}

// pendingForward is a micro-batch whose forward was started and not yet
// waited for.
type pendingForward struct {
	mb       *microBatch
	items    []sched.Item
	at       int64 // the clock when it was started: no stage starts before
	tokens   int
	proposed int // draft tokens
	// sent counts, per stage, the releases and copies that went with it:
	// the first ones of the stage's lists.
	released, copies []int
	wait             func() ([]worker.Result, error)
}

// startForward starts one micro-batch's forward through every stage;
// awaitForward waits for it and puts it in flight.
func (e *Engine) startForward(ctx context.Context, items []sched.Item) error {
	if err := e.settle(); err != nil { // the copies of the last end of step go with this forward
		return err
	}
	e.steps++
	e.pend = e.startOnce(ctx, &microBatch{step: e.steps}, items, e.now)
	return nil
}

// awaitForward waits for the started forward, if any, and schedules its
// completion on the simulated clock. Items a worker refuses (a
// request-scoped error) fail alone and the rest run again from the first
// stage, at once; table deltas are idempotent, so a repeat is safe.
func (e *Engine) awaitForward(ctx context.Context) error {
	p := e.pend
	e.pend = nil
	for p != nil {
		res, err := p.wait()
		err = e.finishOnce(p, res, err)
		if err == nil {
			e.inflight = append(e.inflight, p.mb)
			slices.SortStableFunc(e.inflight, func(a, b *microBatch) int { return cmpInt64(a.done, b.done) })
			return nil
		}
		bad := itemSeqs(err)
		if len(bad) == 0 {
			return err
		}
		if ferr := e.failRequests(ctx, bad, true, err.Error()); ferr != nil {
			return ferr
		}
		items := slices.DeleteFunc(p.items, func(it sched.Item) bool { return slices.Contains(bad, it.ID) })
		if len(items) == 0 {
			return nil
		}
		p = e.startOnce(ctx, p.mb, items, p.at)
	}
	return nil
}

// dropForward waits for the started forward, if any, and forgets it: a
// stage died, or the run stops.
func (e *Engine) dropForward() {
	if p := e.pend; p != nil {
		e.pend = nil
		_, _ = p.wait()
	}
}

// startOnce builds every stage's batch for items and starts the forward.
func (e *Engine) startOnce(ctx context.Context, mb *microBatch, items []sched.Item, at int64) *pendingForward {
	mb.items = items
	wItems := make([]worker.Item, len(items))
	tokens, proposed := 0, 0
	for i, it := range items {
		r := e.byID[it.ID]
		// Drafts come from the last sample: a generation step right after a
		// prefill chunk that did not sample (a recompute split at a block
		// boundary) has none, and its reserved draft slots are released by
		// the commit like rejected drafts.
		draft := min(it.Draft, len(r.drafts))
		toks := make([]int32, 0, it.Tokens+draft)
		toks = append(toks, r.tokens[it.Pos:it.Pos+it.Tokens]...)
		toks = append(toks, r.drafts[:draft]...)
		wItems[i] = worker.Item{Seq: it.ID, Pos: it.Pos, Tokens: toks, Draft: draft, Sample: it.Sample}
		tokens += len(toks)
		proposed += draft
		r.reserved = true // in flight: an end of step the forward overlaps sees it so
	}
	// Every stage's batch is known before the first runs: the activations
	// go from stage to stage inside the workers (inside the worker process,
	// when one serves every stage).
	p := &pendingForward{mb: mb, items: items, at: at, tokens: tokens, proposed: proposed,
		released: make([]int, len(e.stages)), copies: make([]int, len(e.stages))}
	ws := make([]worker.Worker, len(e.stages))
	bs := make([]worker.Batch, len(e.stages))
	for _, st := range e.stages {
		its := wItems
		if st.idx > 0 {
			its = slices.Clone(wItems)
		}
		for i := range its {
			its[i].Tables, its[i].Snapshots = st.deltas[its[i].Seq], nil
			if len(st.snaps) > 0 { // only hybrid managers grant state saves
				its[i].Snapshots = st.snaps[its[i].Seq]
			}
		}
		ws[st.idx] = st.w
		bs[st.idx] = worker.Batch{Step: mb.step, Items: its, Released: st.released, Copies: st.copies}
		p.released[st.idx], p.copies[st.idx] = len(st.released), len(st.copies)
	}
	p.wait = pipeline.StartForwardStages(ctx, ws, bs)
	return p
}

// finishOnce takes the results of a forward startOnce started: the stages
// that ran took their releases and copies, and when every stage ran the
// micro-batch is accounted for and gets its time on the clock.
func (e *Engine) finishOnce(p *pendingForward, results []worker.Result, err error) error {
	mb, items := p.mb, p.items
	prevEnd := p.at
	var last worker.Result
	free := make([]int64, len(e.stages))
	for i, res := range results {
		st := e.stages[i]
		st.released = st.released[:copy(st.released, st.released[p.released[i]:])]
		st.copies = st.copies[:copy(st.copies, st.copies[p.copies[i]:])]
		e.modelled = res.Modelled
		start := max(prevEnd, st.free)
		if st.idx > 0 {
			start = max(prevEnd+e.transferNanos(p.tokens), st.free)
		}
		free[st.idx] = start + max(res.Nanos, 1) // a forward takes time (see overlaps)
		prevEnd = free[st.idx]
		last = res
	}
	if err != nil {
		stage := len(results)
		var se *pipeline.StageError
		if errors.As(err, &se) {
			stage, err = se.Stage, se.Err
		}
		return stageErr(stage, fmt.Sprintf("forward step %d", mb.step), err)
	}
	// The micro-batch ran on every stage: account for it.
	for i, st := range e.stages {
		st.free = free[i]
		for _, it := range items {
			st.forget(it.ID)
		}
	}
	for _, it := range items {
		r := e.byID[it.ID]
		switch {
		case it.Prefill && r.preempts > 0:
			e.rep.Tokens.Recomputed += int64(it.Tokens)
		case it.Reuse > 0:
			// The first chunk of the first admission: prompt tokens the
			// cache supplied. (After a preemption reuse only saves recompute.)
			e.rep.Tokens.PrefixReused += int64(it.Reuse)
		}
	}
	e.rep.Tokens.DraftProposed += int64(p.proposed)
	mb.done = prevEnd
	mb.outputs = make(map[kvcache.SeqID]worker.Output, len(last.Outputs))
	for _, o := range last.Outputs {
		mb.outputs[o.Seq] = o
	}
	return nil
}

// transferNanos is the simulated time to hand activations to the next stage.
func (e *Engine) transferNanos(tokens int) int64 {
	bw := e.spec.Hardware.NVLinkBW
	if bw <= 0 {
		return 0
	}
	return int64(float64(tokens*e.spec.Hidden*2) / bw * 1e9)
}

// completeUpTo commits every in-flight micro-batch that finished by t.
func (e *Engine) completeUpTo(ctx context.Context, t int64) error {
	for len(e.inflight) > 0 && e.inflight[0].done <= t {
		mb := e.inflight[0]
		e.inflight = e.inflight[1:]
		if err := e.complete(ctx, mb); err != nil {
			return err
		}
	}
	return nil
}

// complete ends one micro-batch's step: it starts the commit, the release
// of the finished requests and the invariant snapshot on every stage (settle
// takes their answers), and advances the requests and the scheduler.
func (e *Engine) complete(ctx context.Context, mb *microBatch) error {
	if err := e.settle(); err != nil { // no call went out since the last end of step
		return err
	}
	commits := make([]kvcache.CommitItem, 0, len(mb.items))
	emits := make([][]int32, len(mb.items))
	sampled := make([]int, len(mb.items)) // before capping at the request's output length
	for i, it := range mb.items {
		r := e.byID[it.ID]
		accepted := it.Tokens
		if it.Sample {
			out, ok := mb.outputs[it.ID]
			if !ok || len(out.Tokens) == 0 {
				return fmt.Errorf("step %d: last stage returned no output for request %d", mb.step, it.ID)
			}
			if it.Prefill && len(out.Tokens) != 1 {
				return fmt.Errorf("step %d: request %d: prefill sampled %d tokens, want 1", mb.step, it.ID, len(out.Tokens))
			}
			acc := len(out.Tokens) - 1
			if acc > it.Draft {
				return fmt.Errorf("step %d: request %d: %d drafts accepted of %d proposed", mb.step, it.ID, acc, it.Draft)
			}
			accepted += acc
			e.rep.Tokens.DraftAccepted += int64(acc)
			emit := out.Tokens
			sampled[i] = len(emit)
			if rem := r.maxNew - (len(r.tokens) - r.prompt); len(emit) > rem {
				emit = emit[:rem]
			}
			emits[i] = emit
			r.drafts = append(r.drafts[:0], out.Drafts...)
			if e.spec.KeepOutputs && out.Logits != nil {
				r.logits, r.logitsAt = out.Logits, len(r.tokens)-r.prompt+len(out.Tokens)-1
			}
		}
		commits = append(commits, kvcache.CommitItem{Seq: it.ID, Accepted: accepted})
	}
	// Requests that this step finishes are released in the same call.
	var finishing []kvcache.SeqID
	for i, it := range mb.items {
		r := e.byID[it.ID]
		if len(r.tokens)-r.prompt+len(emits[i]) >= r.maxNew {
			finishing = append(finishing, it.ID)
		}
	}
	e.commits++
	var inspect *kvcache.InspectOptions
	deep := false
	if c := e.spec.CheckEvery; c > 0 && e.commits%int64(c) == 0 {
		e.rep.Invariants.CheckedSteps++
		deep = e.spec.DeepEvery > 0 && e.rep.Invariants.CheckedSteps%int64(e.spec.DeepEvery) == 0
		inspect = &kvcache.InspectOptions{Tables: deep, CheckTables: deep}
	}
	// Commit, release the finished and inspect, in one call per stage that
	// is only started here: a plugin gets it with the next step's first
	// call, and settle checks the answers then (see ending).
	end := &ending{step: mb.step, waits: make([]func() (pipeline.EndStepResult, error), len(e.stages)), inspect: inspect != nil, deep: deep}
	req := pipeline.EndStepRequest{Commits: commits, Release: finishing, Inspect: inspect}
	_ = e.eachStage(func(st *stage) error {
		end.waits[st.idx] = pipeline.StartEndStep(ctx, st.m, req)
		st.released = append(st.released, finishing...)
		for _, id := range finishing {
			st.forget(id)
		}
		return nil
	})
	e.ending = end
	for _, id := range finishing {
		r := e.byID[id]
		if r.resident {
			e.resident--
		}
		r.resident = false
	}
	for i, it := range mb.items {
		r := e.byID[it.ID]
		r.reserved = false
		r.history += commits[i].Accepted
		r.tokens = append(r.tokens, emits[i]...)
		if len(emits[i]) > 0 && r.firstTok < 0 {
			r.firstTok = mb.done
		}
		e.rep.Tokens.Generated += int64(len(emits[i]))
		finished := e.sched.Complete(it.ID, commits[i].Accepted, sampled[i])
		if finished != slices.Contains(finishing, it.ID) {
			return fmt.Errorf("step %d: request %d: the scheduler says finished %v, the engine released it %v", mb.step, it.ID, finished, !finished)
		}
		if finished {
			r.state, r.finish = stDone, mb.done
			r.history = 0
			e.active--
			e.bar.tick(e)
		}
	}
	e.bar.update(e)
	return nil
}

// ending is the end of one step, started on every stage by complete and
// settled by the engine's next call to the managers. Everything the engine
// does in between depends only on what it committed, not on the answers:
// the answers carry block copies for the next forward, the snapshot for the
// invariant check and the items a stage refused. So a plugin manager is
// woken once per step for the end of one step and the start of the next
// (pipeline.StepStarter), and the check still sees the engine exactly as it
// was at the end of the step: settle runs after the next phase's calls
// return and before their answers are applied.
type ending struct {
	step    uint64
	waits   []func() (pipeline.EndStepResult, error) // per stage
	inspect bool
	deep    bool
}

// settle takes the answers of the started end of a step, if any: it hands
// their copies to the workers and checks the snapshots. A stage that refused
// a commit or a release broke the contract (a commit cannot fail): the run
// stops with the stage, the step and the requests.
func (e *Engine) settle() error {
	end := e.ending
	if end == nil {
		return nil
	}
	e.ending = nil
	res := make([]pipeline.EndStepResult, len(e.stages))
	err := e.eachStage(func(st *stage) error {
		r, err := end.waits[st.idx]()
		if err != nil {
			return stageErr(st.idx, fmt.Sprintf("end of step %d", end.step), err)
		}
		res[st.idx] = r
		return nil
	})
	if err != nil {
		return err
	}
	snaps := make([]*kvcache.Snapshot, len(e.stages))
	for i, st := range e.stages {
		st.copies = append(st.copies, res[i].Commit.Copies...)
		snaps[i] = res[i].Snapshot
	}
	if end.inspect {
		return e.check(snaps, end.deep)
	}
	return nil
}

// dropEnding forgets the started end of a step after a stage died: the
// surviving stages still get it (before anything else the engine sends
// them), and the answers no longer matter.
func (e *Engine) dropEnding() {
	if end := e.ending; end != nil {
		e.ending = nil
		for _, wait := range end.waits {
			_, _ = wait()
		}
	}
}

// release frees sequences on every stage and tells the workers.
func (e *Engine) release(ctx context.Context, ids []kvcache.SeqID) error {
	err := e.eachManager(func(st *stage) func() error {
		wait := pipeline.StartRelease(ctx, st.m, ids)
		return func() error {
			if err := wait(); err != nil {
				return stageErr(st.idx, "release", err)
			}
			st.released = append(st.released, ids...)
			for _, id := range ids {
				st.forget(id)
			}
			return nil
		}
	})
	if err != nil {
		return err
	}
	for _, id := range ids {
		r := e.byID[id]
		if r.resident {
			e.resident--
		}
		r.resident, r.history, r.reserved = false, 0, false
	}
	return nil
}

// finishReport fills in the figures that are known only at the end.
func (e *Engine) finishReport(ctx context.Context) {
	rep := &e.rep
	rep.Engine.Steps = int64(e.steps)
	rep.Engine.WallS = time.Since(e.started).Seconds()
	rep.Engine.Modelled = e.modelled
	rep.Engine.Uncalibrated = e.spec.Hardware.Uncalibrated && e.modelled
	var ttft, tpot, e2e []float64
	digest := xxh3.New()
	var buf [4]byte
	var end int64
	for _, r := range e.reqs {
		rep.Tokens.Prompt += int64(r.prompt)
		switch r.state {
		case stDone:
			rep.Requests.Completed++
			ttft = append(ttft, float64(r.firstTok-r.arrival)/1e6)
			e2e = append(e2e, float64(r.finish-r.arrival)/1e6)
			if n := len(r.tokens) - r.prompt; n > 1 {
				tpot = append(tpot, float64(r.finish-r.firstTok)/1e6/float64(n-1))
			}
			end = max(end, r.finish)
		case stRejected:
			rep.Requests.Rejected++
		case stFailed:
			rep.Requests.Failed++
		}
		for _, t := range r.tokens[r.prompt:] {
			buf[0], buf[1], buf[2], buf[3] = byte(t), byte(t>>8), byte(t>>16), byte(t>>24)
			digest.Write(buf[:])
		}
		buf = [4]byte{0xff, 0xff, 0xff, 0xff} // request separator
		digest.Write(buf[:])
		if e.spec.KeepOutputs {
			rep.Outputs.Requests = append(rep.Outputs.Requests, report.RequestOutput{
				ID: uint64(r.id), Tokens: slices.Clone(r.tokens[r.prompt:]), Logits: r.logits, LogitsAt: r.logitsAt,
			})
		}
	}
	rep.Outputs.Digest = fmt.Sprintf("%016x", digest.Sum64())
	rep.Latency = report.Latency{
		TTFTP50: report.Percentile(ttft, 50), TTFTP99: report.Percentile(ttft, 99),
		TPOTP50: report.Percentile(tpot, 50), TPOTP99: report.Percentile(tpot, 99),
		E2EP50: report.Percentile(e2e, 50),
	}
	if end > 0 {
		s := float64(end) / 1e9
		rep.Throughput = report.Throughput{
			OutputTokensPerS: float64(rep.Tokens.Generated) / s,
			RequestsPerS:     float64(rep.Requests.Completed) / s,
			SimulatedS:       s,
		}
	}
	if rep.Tokens.Prompt > 0 {
		rep.Tokens.HitRate = float64(rep.Tokens.PrefixReused) / float64(rep.Tokens.Prompt)
	}
	rep.KV.Stages = rep.KV.Stages[:0]
	var snaps report.Snapshots
	hasSnaps := false
	for _, st := range e.stages {
		u := report.StageUsage{Stage: st.idx, PeakUsage: st.peak, MaxSeqTokens: st.layout.MaxSeqTokens}
		for _, p := range st.layout.Pools {
			u.Pools = append(u.Pools, report.Pool{Name: p.Name, Tier: string(p.Tier), Blocks: p.Blocks, BlockBytes: p.BlockBytes, Tokens: p.TokensPerBlock})
		}
		if st.m != nil {
			if info, err := st.m.Info(ctx); err == nil {
				u.Manager = info.Name + " " + info.Version
			}
			if s, err := st.m.Stats(ctx); err == nil {
				u.Evictions = s.Evictions
				if s.Snapshots != (kvcache.SnapshotStats{}) {
					hasSnaps = true
					snaps.Taken += s.Snapshots.Taken
					snaps.Skipped += s.Snapshots.Skipped
					snaps.Evicted += s.Snapshots.Evicted
					snaps.ReusedTokens += s.Snapshots.ReusedTokens
				}
			}
		}
		rep.KV.Stages = append(rep.KV.Stages, u)
		rep.KV.PeakUsage = max(rep.KV.PeakUsage, st.peak)
	}
	if hasSnaps {
		rep.Snapshots = &snaps
	}
	e.bar.finish(e)
}

func cmpInt64(a, b int64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}
