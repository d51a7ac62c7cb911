// Package engine is the executor: it owns the step loop that drives the
// scheduler, the per-stage cache managers and the per-stage workers, keeps
// the (simulated or measured) clock, checks the managers' invariants, and
// produces a report.
//
// The engine talks only to kvcache.Manager and worker.Worker values; it
// cannot tell an in-process implementation from a plugin.
//
// Its files, by idea: engine.go (the Spec, the stages and their setup),
// loop.go (the step loop: arrivals, scheduling, rejections), forward.go
// (starting and finishing a micro-batch's forward over the stages),
// commit.go (the end of a step: commit, release, settling the copies),
// stats.go (the report's final figures), admission.go (the scheduler's
// view of capacity, fanned out to every stage by fanout.go), check.go (the
// invariant checks), faults.go (plugin deaths and restarts), liveness.go
// (the deadlines of plugin calls, and the watchdog that kills a plugin
// that misses one, so that a hung plugin takes the path of a dead one) and
// live.go (StartLive: the same loop with requests that arrive while it
// runs, for kvx serve).
package engine

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/kvx-dev/kvx/core/ceiling"
	"github.com/kvx-dev/kvx/core/registry"
	"github.com/kvx-dev/kvx/core/report"
	"github.com/kvx-dev/kvx/core/sched"
	"github.com/kvx-dev/kvx/core/workload"
	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
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
	// Registry names the built-in managers that a refusal of the
	// configured one suggests instead (checkCapabilities); nil: none.
	Registry *registry.Registry

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
	// (Outputs.Requests): the equivalence suite compares them, and kvx
	// generate prints them. A request whose workload.Request.TopLogprobs is
	// K > 0 gets the K most likely tokens of every generated position there
	// too, on devices that compute them.
	KeepOutputs bool
	// KeepRequests puts one record per request in the report
	// (Requests.Records): arrival, first token, finish, tokens, reuse,
	// preemptions (kvx run --requests).
	KeepRequests bool
	// Liveness bounds every wait on a plugin; the zero value waits forever
	// (in-process runs). It needs a Launcher that is a Stopper.
	Liveness Liveness
	// Restarts bounds the restarts of plugins that died (restart.go).
	Restarts RestartPolicy
	// Faults are plugin deaths to inject, for tests (restart.go); nil in
	// a normal run.
	Faults []Fault
	// Progress receives a progress bar; nil for none.
	Progress io.Writer
	Log      hclog.Logger
	// KVEvents receives the cache managers' KV events; nil (the default):
	// the managers record none and the engine asks for none.
	KVEvents EventSink
}

// ErrInterrupted is returned (wrapped, with the ctx's cause) by a run whose
// ctx ended: whatever the calls in flight returned then (a plugin call cut
// short looks like a dead plugin), the run was stopped, not failed.
var ErrInterrupted = errors.New("run interrupted")

// ErrInvariant reports a broken manager invariant; the run stops.
var ErrInvariant = errors.New("manager invariant violated")

// request is the engine's record of one request.
type request struct {
	id       kvcache.SeqID
	arrival  int64
	prompt   int
	maxNew   int
	tok      tokenLog // the prompt, then the generated tokens
	drafts   []int32  // draft proposals from the last sample
	history  int      // KV tokens committed on every stage
	resident bool     // the managers hold a sequence for it
	reserved bool     // an outstanding reservation exists (in flight)
	firstTok int64    // simulated ns of the first token; -1 before
	finish   int64
	preempts int
	state    reqState
	rejected string                  // why it can never run, known before it arrived (workload.Request.Rejected)
	logits   []float32               // of the last sampled position (KeepOutputs)
	logitsAt int                     // index among the generated tokens of the token those logits sampled
	topK     int                     // top logprobs asked for every generated token
	logprobs [][]worker.TokenLogprob // of each generated token, while the worker returns them (topK > 0)
	dec      workload.Decoding       // sampling and stop conditions
	chosen   []float64               // the log-probability of each generated token (dec.Logprobs)
	// Prompt logprobs (LiveRequest.PromptLogprobs): wantPrompt asks,
	// promptTopK lists per position; promptLP[i] (and promptTop[i]) is
	// position i's row, about prompt token i+1, taken once each as the
	// chunks come back (forward.go).
	wantPrompt bool
	promptTopK int
	promptLP   []float64
	promptTop  [][]worker.TokenLogprob
	stopped    bool // a stop condition ended it before maxNew (finish_reason "stop")
	reused     int  // prompt tokens the prefix cache supplied at the first admission
	// group, on the hidden prefix request of forked requests (fork.go):
	// when it ends, its sequence forks into the group's requests instead
	// of being released.
	group *forkGroup
	// For the report's records and series (record.go).
	suspends   int    // preemptions that suspended it to the host tier
	recomputed int    // prefill tokens computed again after a preemption
	admitted   bool   // its first prefill chunk ran
	salt       string // cache_salt: its prefix cache is shared only with the same salt
	// Cache control (ReserveItem.Priority, PriorityDuration) for its new
	// sequences: 0 leaves the manager's default.
	priority    int
	priorityDur int64 // ns
	// Why the prefix cache supplied what it did (admission.go): the
	// explanation of the latest Lookup and the host tokens of the latest
	// granted new reservation, frozen into cache at the first admission.
	explain    kvcache.Explanation
	hostReused int
	cache      cacheUse
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
	usage    float64               // device blocks in use / device blocks at the last check; -1 before
	info     kvcache.Info          // m's Info
	events   kvcache.EventReporter // m, when it records KV events for Spec.KVEvents; nil: it does not
	base     baseStats             // m's counters before its last prefix cache reset (reset.go)
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
	live     *Live // nil unless StartLive built the engine (live.go)

	dog      *watchdog     // nil without Spec.Liveness
	slowest  time.Duration // the slowest forward's wall time, for its deadline
	fwdStart time.Time     // when the forward in flight started
	targets  []any         // scratch for the watchdog's targets

	series report.Sampler // the report's figures over engine time (record.go)
	// Prompt tokens of the requests whose first prefill chunk completed,
	// and the prefix reused by them, for the series.
	admitted, admittedReused int64
	restarts                 restartState // restart.go
	faults                   []Fault      // injected faults not yet fired, by step
	warnedRetention          bool         // the warning that a manager ignores priorities was logged
	// lead is the stage that reserves first (admission.Reserve): the last
	// stage to deny an ask that the stage leading then granted.
	lead int
	// ceil records what the report's reuse ceiling needs (ceiling.go); nil
	// in a live engine, which keeps no history.
	ceil *ceiling.Recorder
	// forkPend are the groups whose prefix request ended and whose fork
	// is next (fork.go); forked counts the sequences forked.
	forkPend []*forkGroup
	forked   int64
}

// Run builds the engine (configures every stage) and runs the workload to the
// end. The report is returned also when err != nil, describing how far it got.
func Run(ctx context.Context, s Spec, l Launcher) (report.Report, error) {
	e := &Engine{spec: s, launch: l, log: s.Log, byID: map[kvcache.SeqID]*request{}}
	if e.log == nil {
		e.log = hclog.NewNullLogger()
	}
	if len(s.Managers) > 0 {
		e.ceil = ceiling.NewRecorder(s.Managers[0].TokensPerBlock)
	}
	e.rep.Variant = s.Variant
	e.rep.Config = s.Setup
	e.started = time.Now()
	stopper, _ := l.(Stopper)
	e.dog = newWatchdog(s.Liveness, stopper, e.log.Warn)
	defer e.dog.close()
	err := e.setup(ctx)
	if err == nil {
		err = e.loop(ctx)
	}
	e.finishReport(ctx)
	if ctx.Err() != nil {
		err = fmt.Errorf("%w: %v", ErrInterrupted, context.Cause(ctx))
		e.rep.Error = err.Error()
	}
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
		st := &stage{idx: i, usage: -1, deltas: map[kvcache.SeqID][]kvcache.TableDelta{}, snaps: map[kvcache.SeqID][]kvcache.SnapshotSlot{}}
		err := e.startStage(ctx, st)
		// A plugin that dies while it starts is started again, within the
		// same restart budget as one that dies mid-run.
		for err != nil && errors.Is(err, kvcache.ErrUnavailable) && ctx.Err() == nil && e.rep.Engine.PluginRestarts < e.spec.Restarts.max() {
			e.rep.Engine.PluginRestarts++
			e.log.Warn("plugin died while starting; starting it again", "stage", i, "error", err)
			e.backoff(ctx) // a dying process is noticed in milliseconds: never spend the budget before
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
	if err := checkFaults(e.spec.Faults, n); err != nil {
		return err
	}
	e.faults = slices.Clone(e.spec.Faults)
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
			tok: newTokenLog(r.Prompt), firstTok: -1, topK: r.TopLogprobs, rejected: r.Rejected, salt: r.CacheSalt, dec: r.Decoding,
		}
		req.priority, req.priorityDur = e.spec.Workload.Retention(r)
		if err := checkRetention(req.priority, req.priorityDur); err != nil {
			return fmt.Errorf("request %d: %w", r.ID, err)
		}
		if r.CacheSalt != "" {
			if err := checkSalt(r.CacheSalt, e.saltErr()); err != nil {
				return fmt.Errorf("request %d: %w", r.ID, err)
			}
		}
		e.reqs = append(e.reqs, req)
		e.byID[req.id] = req
	}
	if e.spec.Workload.Concurrency == 0 {
		slices.SortStableFunc(e.reqs, func(a, b *request) int { return cmp.Compare(a.arrival, b.arrival) })
	}
	e.rep.Requests.Total = len(e.reqs)
	if e.spec.Progress != nil {
		e.bar = newProgress(e.spec.Progress, len(e.reqs), e.spec.Variant)
	}
	return nil
}

// startStage launches (or relaunches) a stage's plugins and configures them.
func (e *Engine) startStage(ctx context.Context, st *stage) error {
	m, info, layout, events, err := e.startManager(ctx, st)
	if err != nil {
		return err
	}
	w, err := e.startWorker(ctx, st.idx, layout)
	if err != nil {
		return err
	}
	st.m, st.w, st.layout = m, w, layout
	st.sp = suspender(m, info, layout)
	st.info, st.events = info, events
	return nil
}

// startManager launches stage st's cache manager, checks its Info against
// the stage's config (checkCapabilities, checkEvictionPolicy) and
// configures it; st is not changed.
func (e *Engine) startManager(ctx context.Context, st *stage) (kvcache.Manager, kvcache.Info, kvcache.Layout, kvcache.EventReporter, error) {
	i := st.idx
	m, err := e.launch.Manager(ctx, i)
	if err != nil {
		return nil, kvcache.Info{}, kvcache.Layout{}, nil, fmt.Errorf("stage %d: cache manager: %w", i, err)
	}
	e.dog.arm(slotCall, fmt.Sprintf("stage %d: cache manager Info and Configure", i), e.spec.Liveness.Configure, m)
	defer e.dog.disarm(slotCall)
	fail := func(err error) (kvcache.Manager, kvcache.Info, kvcache.Layout, kvcache.EventReporter, error) {
		return nil, kvcache.Info{}, kvcache.Layout{}, nil, err
	}
	info, err := m.Info(ctx)
	if err != nil {
		return fail(fmt.Errorf("stage %d: cache manager info: %w", i, err))
	}
	if err := checkCapabilities(info, e.spec.Managers[i], e.spec.Registry); err != nil {
		return fail(fmt.Errorf("stage %d: %w", i, err))
	}
	if err := checkEvictionPolicy(info, e.spec.Managers[i]); err != nil {
		return fail(fmt.Errorf("stage %d: %w", i, err))
	}
	mc := e.spec.Managers[i]
	events := e.eventsConfig(st, m, info, &mc)
	layout, err := m.Configure(ctx, mc)
	if err != nil {
		return fail(fmt.Errorf("stage %d: configure %s: %w", i, info.Name, err))
	}
	for _, w := range layout.Warnings {
		e.log.Info("cache manager", "stage", i, "warning", w)
	}
	return m, info, layout, events, nil
}

// startWorker launches stage i's worker and configures it for layout.
func (e *Engine) startWorker(ctx context.Context, i int, layout kvcache.Layout) (worker.Worker, error) {
	// The launch is bounded by the plugin host's start timeout.
	w, err := e.launch.Worker(ctx, i)
	if err != nil {
		return nil, fmt.Errorf("stage %d: worker: %w", i, err)
	}
	wc := e.spec.Workers[i]
	wc.Layout = layout
	e.dog.arm(slotCall, fmt.Sprintf("stage %d: worker Configure", i), e.spec.Liveness.Configure, w)
	defer e.dog.disarm(slotCall)
	if _, err := w.Configure(ctx, wc); err != nil {
		return nil, fmt.Errorf("stage %d: configure worker: %w", i, err)
	}
	return w, nil
}

// Stage is one pipeline stage's plugins, launched and configured by
// StartManager or StartStage exactly as Run configures them.
type Stage struct {
	Manager kvcache.Manager
	Info    kvcache.Info   // the manager's
	Layout  kvcache.Layout // what the manager's Configure returned
	Worker  worker.Worker  // configured with Layout; nil from StartManager
}

// StartManager launches stage i's cache manager of s through l and
// configures it as Run does, with the same checks: a manager whose Info
// cannot serve the stage's layers, or does not list the eviction policy,
// is refused before Configure (as a configuration error). The caller owns
// what l started (closing l stops it). s.Liveness does not apply: there
// is no engine to restart a plugin.
func StartManager(ctx context.Context, s Spec, l Launcher, i int) (Stage, error) {
	e, st, err := starter(s, l, i)
	if err != nil {
		return Stage{}, err
	}
	m, info, layout, _, err := e.startManager(ctx, st)
	return Stage{Manager: m, Info: info, Layout: layout}, err
}

// StartStage is StartManager, then stage i's worker launched and
// configured with the manager's layout, as Run starts a stage: a caller
// that drives a stage itself (kvx calibrate) gets every check the engine
// makes.
func StartStage(ctx context.Context, s Spec, l Launcher, i int) (Stage, error) {
	e, st, err := starter(s, l, i)
	if err != nil {
		return Stage{}, err
	}
	m, info, layout, _, err := e.startManager(ctx, st)
	if err != nil {
		return Stage{}, err
	}
	w, err := e.startWorker(ctx, i, layout)
	if err != nil {
		return Stage{}, err
	}
	return Stage{Manager: m, Info: info, Layout: layout, Worker: w}, nil
}

// starter is the engine of StartManager and StartStage: s and l, no
// watchdog, no KV events.
func starter(s Spec, l Launcher, i int) (*Engine, *stage, error) {
	if i < 0 || i >= len(s.Managers) || i >= len(s.Workers) {
		return nil, nil, fmt.Errorf("engine: stage %d of %d manager configs and %d worker configs", i, len(s.Managers), len(s.Workers))
	}
	s.KVEvents = nil
	e := &Engine{spec: s, launch: l, log: s.Log}
	if e.log == nil {
		e.log = hclog.NewNullLogger()
	}
	return e, &stage{idx: i}, nil
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

// checkCapabilities refuses a manager that cannot hold the stage's layers,
// naming the registered managers that can.
func checkCapabilities(info kvcache.Info, cfg kvcache.Config, reg *registry.Registry) error {
	for _, l := range cfg.Layers {
		if !l.HasCache() {
			continue
		}
		if !slices.Contains(info.Capabilities.Mixers, l.Mixer) {
			var fit []string
			for _, m := range reg.ManagersFor([]spec.Mixer{l.Mixer}) {
				name := m.Name
				if l.Mixer == spec.MixerMamba && !m.Capabilities.SSMReuse {
					name += " (without SSM reuse)"
				}
				fit = append(fit, name)
			}
			hint := ""
			if len(fit) > 0 {
				hint = fmt.Sprintf("; set cache_manager to one that manages mixer %q: %s", l.Mixer, strings.Join(fit, ", "))
			}
			return fmt.Errorf("cache manager %s cannot serve layer %d (mixer %q); it supports %v%s", info.Name, l.Index, l.Mixer, info.Capabilities.Mixers, hint)
		}
	}
	if cfg.EnableBlockReuse && !info.Capabilities.PrefixReuse {
		return fmt.Errorf("cache manager %s has no prefix reuse; set kv_cache_config.enable_block_reuse: false", info.Name)
	}
	return nil
}

// checkEvictionPolicy refuses, as a configuration error, an eviction policy
// the manager does not list in its Info (nil lists EvictionLRU alone), before
// Configure sees it.
func checkEvictionPolicy(info kvcache.Info, cfg kvcache.Config) error {
	p := cfg.EvictionPolicy
	if p == "" {
		p = kvcache.EvictionLRU
	}
	accepted := info.Capabilities.EvictionPolicies
	if len(accepted) == 0 {
		accepted = []string{kvcache.EvictionLRU}
	}
	if !slices.Contains(accepted, p) {
		return &policyError{fmt.Sprintf("kv_cache_config.eviction_policy %q: cache manager %s %s accepts %s",
			p, info.Name, info.Version, strings.Join(accepted, ", "))}
	}
	return nil
}

// ErrEvictionPolicy is returned (wrapped) when a stage's manager does not
// list the configured eviction policy; the error is also of
// kvcache.KindInvalidConfig, a configuration error.
var ErrEvictionPolicy = errors.New("eviction policy not accepted by the cache manager")

// policyError is checkEvictionPolicy's refusal: ErrEvictionPolicy and
// kvcache.ErrInvalidConfig.
type policyError struct{ msg string }

func (e *policyError) Error() string   { return e.msg }
func (e *policyError) Unwrap() []error { return []error{ErrEvictionPolicy, kvcache.ErrInvalidConfig} }

// checkRetention checks a request's retention priority (0 or
// kvcache.MinPriority..MaxPriority) and duration (ns, >= 0), which a
// manager with Retention would otherwise deny on every admission.
func checkRetention(priority int, duration int64) error {
	if priority != 0 && (priority < kvcache.MinPriority || priority > kvcache.MaxPriority) || duration < 0 {
		return fmt.Errorf("retention priority %d for %d ns: want a priority in [%d, %d] (0 for the default) and a duration >= 0",
			priority, duration, kvcache.MinPriority, kvcache.MaxPriority)
	}
	return nil
}
