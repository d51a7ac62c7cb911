package engine_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	cachemgrv1 "github.com/kvx-dev/kvx/cachemgr_v1"
	"github.com/kvx-dev/kvx/core/engine"
	"github.com/kvx-dev/kvx/core/sched"
	"github.com/kvx-dev/kvx/device"
	"github.com/kvx-dev/kvx/dsa"
	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
	"github.com/kvx-dev/kvx/plugins/v1/worker"
)

func TestParseFaults(t *testing.T) {
	got, err := engine.ParseFaults(" kill:manager:120, kill:worker.1:40 ")
	want := []engine.Fault{{Plugin: "worker", Stage: 1, Step: 40}, {Plugin: "manager", Stage: 0, Step: 120}}
	if err != nil || !slices.Equal(got, want) {
		t.Errorf("ParseFaults = %v, %v, want %v (sorted by step)", got, err, want)
	}
	for _, c := range []struct{ in, says string }{
		{"", "names no fault"},
		{"stop:worker:3", `"stop:worker:3": want kill:`},
		{"kill:gpu:3", `plugin "gpu": want manager or worker`},
		{"kill:worker:0", `step "0": want an integer >= 1`},
		{"kill:worker:x", `step "x"`},
		{"kill:worker.-1:3", `stage "-1": want an integer >= 0`},
		{"kill:worker", "want kill:"},
	} {
		if _, err := engine.ParseFaults(c.in); err == nil || !strings.Contains(err.Error(), c.says) || !strings.Contains(err.Error(), engine.FaultEnv) {
			t.Errorf("ParseFaults(%q) = %v, want an error naming %s and saying %q", c.in, err, engine.FaultEnv, c.says)
		}
	}
}

func TestRestartDelay(t *testing.T) {
	p := engine.RestartPolicy{Backoff: 100 * time.Millisecond, MaxBackoff: time.Second}
	for streak, want := range []time.Duration{100, 200, 400, 800, 1000, 1000} {
		if got := p.Delay(streak); got != want*time.Millisecond {
			t.Errorf("Delay(%d) = %v, want %v", streak, got, want*time.Millisecond)
		}
	}
	if d := p.Delay(1000); d != time.Second {
		t.Errorf("Delay(1000) = %v, want the cap", d)
	}
	if d := (engine.RestartPolicy{}).Delay(3); d != 0 {
		t.Errorf("no backoff: Delay(3) = %v, want 0", d)
	}
}

// killable launches in-process v1 managers that a Stop turns into dead
// plugins (every per-step call fails as unavailable, as over gRPC once the
// process is gone). A launch after the first waits on gate when it is set,
// so a test can look at the engine while it restarts.
type killable struct {
	recording
	calls    sync.Map // client -> *atomic.Int64 (dyingManager's counter)
	launches atomic.Int64
	gate     chan struct{}
}

const never = int64(1) << 62

func (l *killable) Manager(ctx context.Context, stage int) (kvcache.Manager, error) {
	if l.launches.Add(1) > 1 && l.gate != nil {
		<-l.gate
	}
	m, _ := l.recording.Manager(ctx, stage)
	d := dyingManager{m, new(atomic.Int64), never}
	l.calls.Store(d, d.calls)
	return d, nil
}

func (l *killable) Worker(ctx context.Context, stage int) (worker.Worker, error) {
	return device.NewWorker(dsa.Backend), nil
}

func (l *killable) Stop(client any) {
	if c, ok := l.calls.Load(client); ok {
		c.(*atomic.Int64).Store(never)
	}
}

// liveRun submits n requests at once and reads each to its end.
func liveRun(t *testing.T, lv *engine.Live, n, maxTokens int) ([][]int32, []engine.Event) {
	t.Helper()
	hs := make([]*engine.Handle, n)
	for i := range hs {
		h, err := lv.Submit(engine.LiveRequest{Prompt: []int32{int32(i + 1), 7, 8, 9, int32(i)}, MaxTokens: maxTokens})
		if err != nil {
			t.Fatal(err)
		}
		hs[i] = h
	}
	toks := make([][]int32, n)
	evs := make([]engine.Event, n)
	for i, h := range hs {
		toks[i], evs[i] = drain(t, h)
	}
	return toks, evs
}

// liveRunToFailure submits up to n requests to an engine that is to fail
// and returns how each request it took ended. The engine may fail before the
// last Submit (the first request alone outlasts the failure): from then on
// Submit fails with ErrStopped, and the rest are not submitted.
func liveRunToFailure(t *testing.T, lv *engine.Live, n, maxTokens int) []engine.Event {
	t.Helper()
	var hs []*engine.Handle
	for i := range n {
		h, err := lv.Submit(engine.LiveRequest{Prompt: []int32{int32(i + 1), 7, 8, 9, int32(i)}, MaxTokens: maxTokens})
		if err != nil {
			if i == 0 || !errors.Is(err, engine.ErrStopped) {
				t.Fatalf("Submit %d: %v", i, err)
			}
			break
		}
		hs = append(hs, h)
	}
	evs := make([]engine.Event, len(hs))
	for i, h := range hs {
		_, evs[i] = drain(t, h)
	}
	return evs
}

// TestLiveFaultHookRestartsAndCompletes: two injected kills of the cache
// manager while a live engine serves 12 requests. Each is restarted, the
// requests are recomputed, and every request completes with the tokens of
// an undisturbed run; the engine holds nothing after.
func TestLiveFaultHookRestartsAndCompletes(t *testing.T) {
	ts := testSpec{pp: 1, policy: sched.GuaranteedNoEvict, cacheTokens: 1 << 15, maxSeqLen: 2048}
	clean, err := engine.StartLive(context.Background(), buildSpec(t, ts), &recording{})
	if err != nil {
		t.Fatal(err)
	}
	want, _ := liveRun(t, clean, 12, 40)
	clean.Stop()

	s := buildSpec(t, ts)
	s.Faults = []engine.Fault{{Plugin: "manager", Step: 5}, {Plugin: "manager", Step: 25}}
	s.Restarts = engine.RestartPolicy{Max: 3}
	l := &killable{}
	lv, err := engine.StartLive(context.Background(), s, l)
	if err != nil {
		t.Fatal(err)
	}
	defer lv.Stop()
	got, evs := liveRun(t, lv, 12, 40)
	for i := range got {
		if !evs[i].Done || !slices.Equal(got[i], want[i]) {
			t.Errorf("request %d: %v, final event %+v; want the undisturbed %v", i, got[i], evs[i], want[i])
		}
	}
	st := settledStats(lv, func(st engine.LiveStats) bool { return st.Completed == 12 && st.Running == 0 })
	if st.PluginRestarts != 2 || st.Completed != 12 || st.Aborted != 0 || st.KVUsage != 0 {
		t.Errorf("stats %+v, want 2 restarts, 12 completed, nothing held", st)
	}
	if ok, why := lv.Health(); !ok {
		t.Errorf("Health after the restarts = false, %q", why)
	}
	l.mu.Lock()
	l.managers = l.managers[len(l.managers)-1:] // the one serving now
	l.mu.Unlock()
	checkEmpty(t, &l.recording)
}

// TestLiveHealthWhileRestarting: while a dead plugin is being replaced the
// engine says so (Health false, with the reason), and serves again after.
func TestLiveHealthWhileRestarting(t *testing.T) {
	s := buildSpec(t, testSpec{pp: 1, policy: sched.GuaranteedNoEvict, cacheTokens: 1 << 15, maxSeqLen: 2048})
	s.Faults = []engine.Fault{{Plugin: "manager", Step: 3}}
	l := &killable{gate: make(chan struct{})}
	lv, err := engine.StartLive(context.Background(), s, l)
	if err != nil {
		t.Fatal(err)
	}
	defer lv.Stop()
	if ok, why := lv.Health(); !ok {
		t.Fatalf("Health before any fault = false, %q", why)
	}
	h, _ := lv.Submit(engine.LiveRequest{Prompt: []int32{1, 2, 3}, MaxTokens: 20})
	var why string
	for end := time.Now().Add(10 * time.Second); time.Now().Before(end); time.Sleep(2 * time.Millisecond) {
		var ok bool
		if ok, why = lv.Health(); !ok {
			break
		}
	}
	if !strings.Contains(why, "restarting the plugins of stage 0 (restart 1 of 8)") || !strings.Contains(why, "gone") {
		t.Errorf("Health while the restart waits = %q, want the restart and its cause", why)
	}
	close(l.gate)
	if toks, ev := drain(t, h); !ev.Done || len(toks) != 20 {
		t.Errorf("the request on the wire: %d tokens, %+v; want all 20", len(toks), ev)
	}
	if ok, why := lv.Health(); !ok {
		t.Errorf("Health after the restart = false, %q", why)
	}
}

// TestLiveRestartBudgetSpent: the kill after the budget stops the engine:
// every request on the wire ends with ErrStopped naming the budget, Health
// says the engine failed, Submit is refused, Stop returns the error.
func TestLiveRestartBudgetSpent(t *testing.T) {
	s := buildSpec(t, testSpec{pp: 1, policy: sched.GuaranteedNoEvict, cacheTokens: 1 << 15, maxSeqLen: 2048})
	s.Faults = []engine.Fault{{Plugin: "manager", Step: 3}, {Plugin: "manager", Step: 6}, {Plugin: "manager", Step: 9}}
	s.Restarts = engine.RestartPolicy{Max: 2}
	lv, err := engine.StartLive(context.Background(), s, &killable{})
	if err != nil {
		t.Fatal(err)
	}
	for i, ev := range liveRunToFailure(t, lv, 4, 500) {
		if !errors.Is(ev.Err, engine.ErrStopped) || !strings.Contains(ev.Err.Error(), "budget (plugin_restarts.max 2) is spent") {
			t.Errorf("request %d ended with %+v, want ErrStopped naming the spent budget", i, ev)
		}
	}
	<-lv.Done()
	if ok, why := lv.Health(); ok || !strings.Contains(why, "the engine failed") {
		t.Errorf("Health after the engine failed = %v, %q", ok, why)
	}
	if _, err := lv.Submit(engine.LiveRequest{Prompt: []int32{1}, MaxTokens: 1}); !errors.Is(err, engine.ErrStopped) {
		t.Errorf("Submit after the failure: %v, want ErrStopped", err)
	}
	if _, err := lv.Stop(); err == nil || !strings.Contains(err.Error(), "2 plugin restarts, the budget") {
		t.Errorf("Stop = %v, want the restart error", err)
	}
}

// TestLiveManagerCorruptionStopsTheEngine: a manager that refuses a commit
// has lost track of a sequence (corruption, no restart can mend it): the
// live engine stops, every request on the wire ends with ErrStopped naming
// the stage and the step, and Health says the engine failed.
func TestLiveManagerCorruptionStopsTheEngine(t *testing.T) {
	s := buildSpec(t, testSpec{pp: 1, policy: sched.GuaranteedNoEvict, cacheTokens: 1 << 15, maxSeqLen: 2048})
	refused := false
	l := inproc{
		manager: func() kvcache.Manager { return refusingManager{cachemgrv1.New(), 1, &refused} },
		worker:  func() worker.Worker { return device.NewWorker(dsa.Backend) },
	}
	lv, err := engine.StartLive(context.Background(), s, l)
	if err != nil {
		t.Fatal(err)
	}
	for i, ev := range liveRunToFailure(t, lv, 3, 200) {
		if !errors.Is(ev.Err, engine.ErrStopped) || !strings.Contains(ev.Err.Error(), "the engine failed: stage 0: end of step") {
			t.Errorf("request %d ended with %+v, want ErrStopped naming the refused commit", i, ev)
		}
	}
	<-lv.Done()
	if ok, why := lv.Health(); ok || !strings.Contains(why, "the engine failed: stage 0: end of step") {
		t.Errorf("Health = %v, %q", ok, why)
	}
	if st := lv.Stats(); st.PluginRestarts != 0 {
		t.Errorf("%d restarts after a refused commit, want none (a restart cannot mend corruption)", st.PluginRestarts)
	}
}
