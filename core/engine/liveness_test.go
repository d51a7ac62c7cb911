package engine_test

import (
	"context"
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

// hang is a plugin that stops answering at its hangAt-th call: the call
// blocks until the plugin is stopped (as kill -STOP leaves a process until
// it is killed), then fails as a killed plugin's call does.
type hang struct {
	calls   *atomic.Int64
	hangAt  int64
	stopped chan struct{}
	once    *sync.Once
}

func newHang(at int64) hang {
	return hang{calls: new(atomic.Int64), hangAt: at, stopped: make(chan struct{}), once: new(sync.Once)}
}

func (h hang) call() error {
	if h.calls.Add(1) != h.hangAt {
		return nil
	}
	<-h.stopped
	return kvcache.Errorf(kvcache.KindUnavailable, "plugin killed")
}

func (h hang) stop() { h.once.Do(func() { close(h.stopped) }) }

type hangingManager struct {
	kvcache.Manager
	hang
}

func (m hangingManager) Reserve(ctx context.Context, it []kvcache.ReserveItem) ([]kvcache.Grant, error) {
	if err := m.call(); err != nil {
		return nil, err
	}
	return m.Manager.Reserve(ctx, it)
}

type hangingWorker struct {
	worker.Worker
	hang
}

func (w hangingWorker) Forward(ctx context.Context, b worker.Batch) (worker.Result, error) {
	if err := w.call(); err != nil {
		return worker.Result{}, err
	}
	return w.Worker.Forward(ctx, b)
}

// killingLauncher stops a hanging plugin when the engine asks, as
// setup.Launcher kills the process; it counts the stops. It counts after
// the stop, which lets the engine go on: only Run's waiting for its
// watchdog orders the count before Run returns, and the test reads it
// after Run, without the lock, so the race detector sees a Run that
// returns with its watchdog still touching the launcher.
type killingLauncher struct {
	inproc
	mu    sync.Mutex
	stops int
}

func (l *killingLauncher) Stop(client any) {
	switch c := client.(type) {
	case hangingManager:
		c.stop()
	case hangingWorker:
		c.stop()
	}
	l.mu.Lock()
	l.stops++
	l.mu.Unlock()
}

// TestHungPluginIsKilledAndRestarted: a manager that stops answering in the
// middle of a Reserve, or a worker in the middle of a forward, misses its
// deadline; the watchdog stops it, the engine restarts the stage and
// recomputes, and every request completes with the outputs of an
// undisturbed run.
func TestHungPluginIsKilledAndRestarted(t *testing.T) {
	wl := genWorkload(t, 16, 128)
	ts := testSpec{pp: 2, draft: 1, reuse: true, policy: sched.MaxUtilization, cacheTokens: 1 << 15, reqs: wl, maxSeqLen: 2048}
	clean := runSpec(t, buildSpec(t, ts), v1Launcher())
	live := engine.Liveness{Configure: 10 * time.Second, Call: 300 * time.Millisecond, Forward: 300 * time.Millisecond, ForwardFactor: 10}
	for _, tc := range []struct {
		name string
		l    func() engine.Launcher
	}{
		{"manager", func() engine.Launcher {
			var launches atomic.Int64
			return &killingLauncher{inproc: inproc{
				manager: func() kvcache.Manager {
					if launches.Add(1) == 2 {
						return hangingManager{cachemgrv1.New(), newHang(20)}
					}
					return cachemgrv1.New()
				},
				worker: func() worker.Worker { return device.NewWorker(dsa.Backend) },
			}}
		}},
		{"worker", func() engine.Launcher {
			var launches atomic.Int64
			return &killingLauncher{inproc: inproc{
				manager: func() kvcache.Manager { return cachemgrv1.New() },
				worker: func() worker.Worker {
					if launches.Add(1) == 1 {
						return hangingWorker{device.NewWorker(dsa.Backend), newHang(20)}
					}
					return device.NewWorker(dsa.Backend)
				},
			}}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := buildSpec(t, ts)
			s.Liveness = live
			l := tc.l()
			done := make(chan struct{})
			var rep = clean
			var err error
			go func() {
				defer close(done)
				rep, err = engine.Run(context.Background(), s, l)
			}()
			select {
			case <-done:
			case <-time.After(60 * time.Second):
				t.Fatal("the run hangs: the stopped plugin was never killed")
			}
			if err != nil {
				t.Fatalf("Run: %v", err)
			}
			if rep.Engine.PluginRestarts < 1 || l.(*killingLauncher).stops == 0 {
				t.Errorf("restarts %d, stops %d; want the hung plugin stopped and restarted", rep.Engine.PluginRestarts, l.(*killingLauncher).stops)
			}
			if rep.Requests.Completed != len(wl.Requests) || rep.Requests.Failed != 0 || rep.Invariants.Violations != 0 {
				t.Errorf("requests %+v, violations %d; want all %d completed", rep.Requests, rep.Invariants.Violations, len(wl.Requests))
			}
			if rep.Outputs.Digest != clean.Outputs.Digest {
				t.Errorf("outputs digest %s after a hang, %s without", rep.Outputs.Digest, clean.Outputs.Digest)
			}
		})
	}
}
