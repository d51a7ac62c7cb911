package engine_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	cachemgrv1 "github.com/kvx-dev/kvx/cachemgr_v1"
	cachemgrv2 "github.com/kvx-dev/kvx/cachemgr_v2"
	"github.com/kvx-dev/kvx/core/engine"
	"github.com/kvx-dev/kvx/core/sched"
	"github.com/kvx-dev/kvx/device"
	"github.com/kvx-dev/kvx/dsa"
	"github.com/kvx-dev/kvx/internal/race"
	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
	"github.com/kvx-dev/kvx/plugins/v1/worker"
)

// refusingWorker fails every forward that contains request bad, with a
// request-scoped error, as a worker does for an item it cannot run.
type refusingWorker struct {
	worker.Worker
	bad kvcache.SeqID
}

func (w refusingWorker) Forward(ctx context.Context, b worker.Batch) (worker.Result, error) {
	for _, it := range b.Items {
		if it.Seq == w.bad {
			return worker.Result{}, kvcache.ItemErrorf([]kvcache.SeqID{w.bad}, "request %d: injected fault", w.bad)
		}
	}
	return w.Worker.Forward(ctx, b)
}

// TestOneBadRequestFailsAlone: a request the worker refuses fails with its
// reason; every other request completes and no invariant breaks. Also when
// the refusal comes back after the next step was scheduled beside the
// forward (a closed loop, overlapped steps).
func TestOneBadRequestFailsAlone(t *testing.T) {
	for _, tc := range []struct {
		name        string
		concurrency int
		manager     func() kvcache.Manager
		overlap     bool // the worker runs a forward when it is waited for
	}{
		{"open loop, v1", 0, func() kvcache.Manager { return cachemgrv1.New() }, false},
		{"closed loop overlapped, v2", 6, func() kvcache.Manager { return cachemgrv2.New() }, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			wl := genWorkload(t, 12, 128)
			wl.Concurrency = tc.concurrency
			bad := kvcache.SeqID(wl.Requests[4].ID)
			s := buildSpec(t, testSpec{pp: 2, draft: 1, reuse: true, policy: sched.GuaranteedNoEvict, cacheTokens: 1 << 15, reqs: wl, maxSeqLen: 2048})
			l := inproc{manager: tc.manager, worker: func() worker.Worker {
				var w worker.Worker = refusingWorker{device.NewWorker(dsa.Backend), bad}
				if tc.overlap {
					w = deferredWorker{w}
				}
				return w
			}}
			rep := runSpec(t, s, l)
			if rep.Requests.Failed != 1 || rep.Requests.Completed != 11 {
				t.Fatalf("requests = %+v, want 1 failed and 11 completed", rep.Requests)
			}
			if f := rep.Requests.Failures[0]; f.ID != uint64(bad) || f.Reason == "" {
				t.Errorf("failure = %+v, want request %d with a reason", f, bad)
			}
			if rep.Invariants.Violations != 0 {
				t.Errorf("violations = %v", rep.Invariants.First)
			}
			if tc.overlap && rep.Engine.OverlappedSteps == 0 {
				t.Error("no step overlapped a forward")
			}
		})
	}
}

// dyingManager answers like a dead plugin (ErrUnavailable) from its dieAt-th
// per-step call on (Lookup, Reserve, Unreserve, Commit, Release, Inspect), the
// way the gRPC client does once the process is gone.
type dyingManager struct {
	kvcache.Manager
	calls *atomic.Int64 // shared by the copies of the value
	dieAt int64
}

func (m dyingManager) dead() bool { return m.calls.Add(1) >= m.dieAt }
func (m dyingManager) Lookup(ctx context.Context, it []kvcache.LookupItem) ([]int, error) {
	if m.dead() {
		return nil, kvcache.Errorf(kvcache.KindUnavailable, "gone")
	}
	return m.Manager.Lookup(ctx, it)
}
func (m dyingManager) Reserve(ctx context.Context, it []kvcache.ReserveItem) ([]kvcache.Grant, error) {
	if m.dead() {
		return nil, kvcache.Errorf(kvcache.KindUnavailable, "gone")
	}
	return m.Manager.Reserve(ctx, it)
}
func (m dyingManager) Unreserve(ctx context.Context, s []kvcache.SeqID) error {
	if m.dead() {
		return kvcache.Errorf(kvcache.KindUnavailable, "gone")
	}
	return m.Manager.Unreserve(ctx, s)
}
func (m dyingManager) Release(ctx context.Context, s []kvcache.SeqID) error {
	if m.dead() {
		return kvcache.Errorf(kvcache.KindUnavailable, "gone")
	}
	return m.Manager.Release(ctx, s)
}
func (m dyingManager) Commit(ctx context.Context, it []kvcache.CommitItem) (kvcache.CommitResult, error) {
	if m.dead() {
		return kvcache.CommitResult{}, kvcache.Errorf(kvcache.KindUnavailable, "gone")
	}
	return m.Manager.Commit(ctx, it)
}
func (m dyingManager) Inspect(ctx context.Context, o kvcache.InspectOptions) (kvcache.Snapshot, error) {
	if m.dead() {
		return kvcache.Snapshot{}, kvcache.Errorf(kvcache.KindUnavailable, "gone")
	}
	return m.Manager.Inspect(ctx, o)
}

// TestDeadPluginIsRestartedAndNothingIsLost: a stage's manager dies mid-run;
// the engine starts a new one, recomputes every request, and every request
// completes with the same outputs as an undisturbed run.
func TestDeadPluginIsRestartedAndNothingIsLost(t *testing.T) {
	wl := genWorkload(t, 16, 128)
	ts := testSpec{pp: 2, draft: 1, reuse: true, policy: sched.MaxUtilization, cacheTokens: 1 << 15, reqs: wl, maxSeqLen: 2048}
	clean := runSpec(t, buildSpec(t, ts), v1Launcher())

	var launches atomic.Int64
	l := inproc{
		manager: func() kvcache.Manager {
			n := launches.Add(1)
			if n == 2 { // the second stage's first manager dies at its 40th commit
				return dyingManager{cachemgrv1.New(), new(atomic.Int64), 120}
			}
			return cachemgrv1.New()
		},
		worker: func() worker.Worker { return device.NewWorker(dsa.Backend) },
	}
	rep := runSpec(t, buildSpec(t, ts), l)
	if rep.Engine.PluginRestarts != 1 {
		t.Errorf("plugin restarts = %d, want 1", rep.Engine.PluginRestarts)
	}
	if rep.Requests.Completed != len(wl.Requests) || rep.Requests.Failed != 0 {
		t.Fatalf("requests = %+v, want all %d completed", rep.Requests, len(wl.Requests))
	}
	if rep.Outputs.Digest != clean.Outputs.Digest {
		t.Errorf("outputs digest %s after a restart, %s without", rep.Outputs.Digest, clean.Outputs.Digest)
	}
	if rep.Tokens.Recomputed == 0 {
		t.Errorf("recomputed = 0 after a restart")
	}
	if rep.Invariants.Violations != 0 {
		t.Errorf("violations = %v", rep.Invariants.First)
	}
}

// TestRestartAtEveryCall: whichever call finds the plugin dead — in the
// middle of admission, a commit, a release or an invariant check — every
// request still completes with the outputs of an undisturbed run.
func TestRestartAtEveryCall(t *testing.T) {
	wl := genWorkload(t, 40, 128)
	ts := testSpec{pp: 2, draft: 1, reuse: true, policy: sched.MaxUtilization, cacheTokens: 2600, reqs: wl, maxSeqLen: 2048}
	clean := runSpec(t, buildSpec(t, ts), v1Launcher())
	// Every third call of the first 400; under -race, where each run takes
	// ten times as long and the restart's goroutines are what is raced, a
	// spread of 19 of them (the plain pass tries all 133).
	stride := int64(3)
	if race.Enabled {
		stride = 21
	}
	for die := int64(1); die < 400; die += stride {
		var launches atomic.Int64
		l := inproc{
			manager: func() kvcache.Manager {
				if launches.Add(1) == 2 {
					return dyingManager{cachemgrv1.New(), new(atomic.Int64), die}
				}
				return cachemgrv1.New()
			},
			worker: func() worker.Worker { return device.NewWorker(dsa.Backend) },
		}
		rep := runSpec(t, buildSpec(t, ts), l)
		if rep.Requests.Completed != len(wl.Requests) || rep.Engine.PluginRestarts != 1 || rep.Outputs.Digest != clean.Outputs.Digest {
			t.Fatalf("plugin dead from call %d: requests %+v, restarts %d, digest %s (undisturbed %s)",
				die, rep.Requests, rep.Engine.PluginRestarts, rep.Outputs.Digest, clean.Outputs.Digest)
		}
	}
}

// TestPluginThatKeepsDyingStopsTheEngine: restarts are bounded; the run ends
// with an error (a non-zero exit) instead of looping.
func TestPluginThatKeepsDyingStopsTheEngine(t *testing.T) {
	wl := genWorkload(t, 8, 0)
	ts := testSpec{pp: 1, draft: 0, policy: sched.GuaranteedNoEvict, cacheTokens: 1 << 15, reqs: wl, maxSeqLen: 2048}
	l := inproc{
		manager: func() kvcache.Manager { return dyingManager{cachemgrv1.New(), new(atomic.Int64), 9} },
		worker:  func() worker.Worker { return device.NewWorker(dsa.Backend) },
	}
	rep, err := engine.Run(context.Background(), buildSpec(t, ts), l)
	if err == nil {
		t.Fatal("Run succeeded with a manager that dies every third commit")
	}
	if rep.Engine.PluginRestarts != engine.MaxRestarts {
		t.Errorf("plugin restarts = %d, want %d", rep.Engine.PluginRestarts, engine.MaxRestarts)
	}
}

// deadOnArrival is a manager whose plugin died before it answered Info.
type deadOnArrival struct{ kvcache.Manager }

func (deadOnArrival) Info(context.Context) (kvcache.Info, error) {
	return kvcache.Info{}, kvcache.Errorf(kvcache.KindUnavailable, "plugin process exited")
}

// TestPluginDeadAtStartIsStartedAgain: a plugin that dies while the engine
// starts is launched again and the run completes.
func TestPluginDeadAtStartIsStartedAgain(t *testing.T) {
	wl := genWorkload(t, 6, 0)
	var launches atomic.Int64
	l := inproc{
		manager: func() kvcache.Manager {
			if launches.Add(1) == 2 {
				return deadOnArrival{cachemgrv1.New()}
			}
			return cachemgrv1.New()
		},
		worker: func() worker.Worker { return device.NewWorker(dsa.Backend) },
	}
	rep := runSpec(t, buildSpec(t, testSpec{pp: 2, policy: sched.GuaranteedNoEvict, cacheTokens: 1 << 15, reqs: wl, maxSeqLen: 2048}), l)
	if rep.Engine.PluginRestarts != 1 || rep.Requests.Completed != len(wl.Requests) {
		t.Errorf("restarts %d, requests %+v; want 1 restart and every request completed", rep.Engine.PluginRestarts, rep.Requests)
	}
}

// stoppingLauncher records the clients the engine asks it to stop.
type stoppingLauncher struct {
	inproc
	stopped []any
}

func (l *stoppingLauncher) Stop(client any) { l.stopped = append(l.stopped, client) }

// TestRestartStopsTheOldPlugins: replacing a dead stage's plugins stops the
// old manager and worker, so no process outlives its replacement.
func TestRestartStopsTheOldPlugins(t *testing.T) {
	wl := genWorkload(t, 10, 0)
	var launches atomic.Int64
	var first kvcache.Manager
	l := &stoppingLauncher{inproc: inproc{
		manager: func() kvcache.Manager {
			if launches.Add(1) == 1 {
				first = dyingManager{cachemgrv1.New(), new(atomic.Int64), 30}
				return first
			}
			return cachemgrv1.New()
		},
		worker: func() worker.Worker { return device.NewWorker(dsa.Backend) },
	}}
	rep := runSpec(t, buildSpec(t, testSpec{pp: 1, policy: sched.GuaranteedNoEvict, cacheTokens: 1 << 15, reqs: wl, maxSeqLen: 2048}), l)
	if rep.Engine.PluginRestarts != 1 || len(l.stopped) != 2 || l.stopped[0] != first {
		t.Errorf("restarts %d, stopped %d clients (first is the dead manager: %v); want 1 restart, manager and worker stopped",
			rep.Engine.PluginRestarts, len(l.stopped), len(l.stopped) > 0 && l.stopped[0] == first)
	}
}

// refusingManager refuses the commit of one request once, applying the
// others, like a manager whose ledger lost that sequence.
type refusingManager struct {
	kvcache.Manager
	seq     kvcache.SeqID
	refused *bool
}

func (m refusingManager) Commit(ctx context.Context, items []kvcache.CommitItem) (kvcache.CommitResult, error) {
	if *m.refused || !slices.ContainsFunc(items, func(it kvcache.CommitItem) bool { return it.Seq == m.seq }) {
		return m.Manager.Commit(ctx, items)
	}
	*m.refused = true
	rest := slices.DeleteFunc(slices.Clone(items), func(it kvcache.CommitItem) bool { return it.Seq == m.seq })
	res, err := m.Manager.Commit(ctx, rest)
	if err != nil {
		return res, err
	}
	return res, kvcache.ItemErrorf([]kvcache.SeqID{m.seq}, "seq %d: not mine", m.seq)
}

// TestRefusedCommitStopsTheRun: a commit cannot fail, so a stage that
// refuses one has lost track of a sequence: the run stops, naming the
// stage, the step and the request, with invariant checks on or off.
func TestRefusedCommitStopsTheRun(t *testing.T) {
	wl := genWorkload(t, 6, 0)
	bad := kvcache.SeqID(wl.Requests[2].ID)
	for _, checks := range []int{0, 1} {
		s := buildSpec(t, testSpec{pp: 2, draft: 1, policy: sched.GuaranteedNoEvict, cacheTokens: 1 << 15, reqs: wl, maxSeqLen: 2048})
		s.CheckEvery = checks
		var launches int
		refused := false
		l := inproc{
			manager: func() kvcache.Manager {
				launches++
				if launches == 2 { // stage 1
					return refusingManager{cachemgrv1.New(), bad, &refused}
				}
				return cachemgrv1.New()
			},
			worker: func() worker.Worker { return device.NewWorker(dsa.Backend) },
		}
		_, err := engine.Run(context.Background(), s, l)
		if !refused {
			t.Fatalf("checks %d: request %d was never committed", checks, bad)
		}
		if err == nil || !strings.Contains(err.Error(), "stage 1: end of step") || !strings.Contains(err.Error(), fmt.Sprint(bad)) {
			t.Errorf("checks %d: Run error = %v; want stage 1's end of step refusing request %d", checks, err, bad)
		}
	}
}

// workerProc is a fake worker plugin process that serves every stage, an
// instance each: the instances share its life, and Stop of any one ends it.
type workerProc struct {
	dead    atomic.Bool
	forward atomic.Int64
	dieAt   int64 // it dies at its dieAt-th forward; 0 never
}

type procWorker struct {
	worker.Worker
	p *workerProc
}

func (w procWorker) gone() error {
	if w.p.dead.Load() {
		return kvcache.Errorf(kvcache.KindUnavailable, "plugin process exited")
	}
	return nil
}

func (w procWorker) Forward(ctx context.Context, b worker.Batch) (worker.Result, error) {
	if n := w.p.forward.Add(1); n == w.p.dieAt {
		w.p.dead.Store(true)
	}
	if err := w.gone(); err != nil {
		return worker.Result{}, err
	}
	return w.Worker.Forward(ctx, b)
}

func (w procWorker) Health(ctx context.Context) error {
	if err := w.gone(); err != nil {
		return err
	}
	return w.Worker.Health(ctx)
}

// sharedWorkerLauncher hands every stage an instance of one worker process,
// launching a new one when it died, as core/setup does with a plugin binary.
type sharedWorkerLauncher struct {
	inproc
	procs []*workerProc
}

func (l *sharedWorkerLauncher) Worker(context.Context, int) (worker.Worker, error) {
	if n := len(l.procs); n == 0 || l.procs[n-1].dead.Load() {
		p := &workerProc{}
		if n == 0 {
			p.dieAt = 40
		}
		l.procs = append(l.procs, p)
	}
	return procWorker{device.NewWorker(dsa.Backend), l.procs[len(l.procs)-1]}, nil
}

func (l *sharedWorkerLauncher) Stop(client any) {
	if w, ok := client.(procWorker); ok {
		w.p.dead.Store(true)
	}
}

// TestDeadSharedWorkerRestartsEveryStage: when the worker process that
// serves both stages dies, one restart replaces both stages' workers (the
// surviving stage's too, though its manager lives), and nothing is lost.
func TestDeadSharedWorkerRestartsEveryStage(t *testing.T) {
	wl := genWorkload(t, 10, 0)
	s := buildSpec(t, testSpec{pp: 2, draft: 1, policy: sched.GuaranteedNoEvict, cacheTokens: 1 << 15, reqs: wl, maxSeqLen: 2048})
	clean := runSpec(t, s, v1Launcher())
	l := &sharedWorkerLauncher{inproc: inproc{manager: func() kvcache.Manager { return cachemgrv1.New() }}}
	rep := runSpec(t, s, l)
	if rep.Engine.PluginRestarts != 1 || rep.Requests.Completed != len(wl.Requests) || rep.Outputs.Digest != clean.Outputs.Digest {
		t.Errorf("restarts %d, requests %+v, digest %s (clean %s); want 1 restart, every request completed, the clean digest",
			rep.Engine.PluginRestarts, rep.Requests, rep.Outputs.Digest, clean.Outputs.Digest)
	}
	if len(l.procs) != 2 {
		t.Errorf("%d worker processes launched, want 2", len(l.procs))
	}
}
