package pluginrpc

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
	"github.com/kvx-dev/kvx/plugins/v1/pipeline"
	"github.com/kvx-dev/kvx/plugins/v1/worker"
)

// startedCalls are the pipeline.CallStarter methods as table rows: start
// begins the call on m, and the wait it returns gives what the plain call
// gives.
func startedCalls(f *fakeManager) []struct {
	method string
	arg    any
	start  func(m kvcache.Manager) func() ([]any, error)
	want   []any
} {
	seqs := []kvcache.SeqID{3, 1 << 40}
	type row = struct {
		method string
		arg    any
		start  func(m kvcache.Manager) func() ([]any, error)
		want   []any
	}
	return []row{
		{"Lookup", fullLookupItems, func(m kvcache.Manager) func() ([]any, error) {
			w := pipeline.StartLookup(ctx, m, fullLookupItems)
			return func() ([]any, error) { v, err := w(); return []any{v}, err }
		}, []any{f.lookup}},
		{"Reserve", fullReserveItems, func(m kvcache.Manager) func() ([]any, error) {
			w := pipeline.StartReserve(ctx, m, fullReserveItems)
			return func() ([]any, error) { v, err := w(); return []any{v}, err }
		}, []any{fullGrants}},
		{"Unreserve", seqs, func(m kvcache.Manager) func() ([]any, error) {
			w := pipeline.StartUnreserve(ctx, m, seqs)
			return func() ([]any, error) { return nil, w() }
		}, nil},
		{"Suspend", seqs, func(m kvcache.Manager) func() ([]any, error) {
			w := pipeline.StartSuspend(ctx, m.(kvcache.Suspender), seqs)
			return func() ([]any, error) { ok, c, err := w(); return []any{ok, c}, err }
		}, []any{f.moveOK, fullCopies}},
		{"Resume", seqs, func(m kvcache.Manager) func() ([]any, error) {
			w := pipeline.StartResume(ctx, m.(kvcache.Suspender), seqs)
			return func() ([]any, error) { ok, c, err := w(); return []any{ok, c}, err }
		}, []any{f.moveOK, fullCopies}},
		{"Release", seqs, func(m kvcache.Manager) func() ([]any, error) {
			w := pipeline.StartRelease(ctx, m, seqs)
			return func() ([]any, error) { return nil, w() }
		}, nil},
	}
}

func fullFake() *fakeManager {
	return &fakeManager{lookup: []int{0, 64}, grants: fullGrants, moveOK: []bool{true, false}, moveCopies: fullCopies}
}

// TestStartedCallsOverWire: every started call reaches the plugin with its
// arguments and its wait returns what the plain call returns, on a data
// plane (corked, written by the wait) and, in TestOverGRPCOnly, over gRPC
// (a goroutine per call).
func TestStartedCallsOverWire(t *testing.T) {
	f := fullFake()
	m, _ := managerPair(t, f)
	for _, tc := range startedCalls(f) {
		got, err := tc.start(m)()
		if err != nil {
			t.Errorf("%s: %v", tc.method, err)
			continue
		}
		if !deepEqual(got, normalize(tc.want)) {
			t.Errorf("%s = %#v, want %#v", tc.method, got, tc.want)
		}
		if c := f.last(); c.method != tc.method || !deepEqual(c.arg, normalize(tc.arg)) {
			t.Errorf("%s: plugin saw %s(%#v), want %s(%#v)", tc.method, c.method, c.arg, tc.method, tc.arg)
		}
	}
}

// TestStartedCallsShareAWrite: the calls started on the instances of one
// process are corked until the first wait, which sends them all; each
// instance gets its own call, and every wait its own answer.
func TestStartedCallsShareAWrite(t *testing.T) {
	const n = 3
	var mu sync.Mutex
	fakes := make([]*fakeManager, 0, n) // in the order the plugin made them
	ms := TestManagerInstances(t, func() kvcache.Manager {
		mu.Lock()
		defer mu.Unlock()
		f := fullFake()
		fakes = append(fakes, f)
		return f
	}, n)
	for _, m := range ms { // an instance is made on first use: make them in order
		if _, err := m.Info(ctx); err != nil {
			t.Fatal(err)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(fakes) != n {
		t.Fatalf("%d instances made, want %d", len(fakes), n)
	}
	for _, tc := range startedCalls(fullFake()) {
		t.Run(tc.method, func(t *testing.T) {
			waits := make([]func() ([]any, error), n)
			for i, m := range ms {
				waits[i] = tc.start(m)
			}
			time.Sleep(20 * time.Millisecond) // were they written, a plugin would have run them by now
			for i, f := range fakes {
				if c := f.last(); c.method == tc.method {
					t.Errorf("instance %d ran %s before any wait", i, tc.method)
				}
			}
			for i, wait := range waits {
				got, err := wait()
				if err != nil || !deepEqual(got, normalize(tc.want)) {
					t.Errorf("instance %d: %s = %#v, %v; want %#v", i, tc.method, got, err, tc.want)
				}
			}
			for i, f := range fakes {
				if c := f.last(); c.method != tc.method || !deepEqual(c.arg, normalize(tc.arg)) {
					t.Errorf("instance %d: plugin saw %s(%#v), want %s", i, c.method, c.arg, tc.method)
				}
				f.mu.Lock()
				f.calls = nil // the next method's "not yet" check starts clean
				f.mu.Unlock()
			}
		})
	}
}

// TestStartedForwardRunsBeforeTheWait: a started chain runs in the plugin
// while the caller goes on, and its wait gives ForwardChain's results.
func TestStartedForwardRunsBeforeTheWait(t *testing.T) {
	const stages = 2
	var mu sync.Mutex
	fakes := make([]*fakeWorker, 0, stages)
	ws := TestWorkerInstances(t, func() worker.Worker {
		mu.Lock()
		defer mu.Unlock()
		f := &fakeWorker{result: worker.Result{Nanos: 5}}
		fakes = append(fakes, f)
		return f
	}, stages)
	for _, w := range ws {
		if _, err := w.Info(ctx); err != nil {
			t.Fatal(err)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	bs := make([]worker.Batch, stages)
	for i := range bs {
		bs[i] = worker.Batch{Step: 4, Items: []worker.Item{{Seq: 7, Tokens: []int32{1}, Sample: true}}}
	}
	wait, ok := ws[0].(pipeline.ChainStarter).StartForwardChain(ctx, ws[1:], bs)
	if !ok {
		t.Fatal("the instances of one process cannot be chained")
	}
	ran := func() bool {
		for _, f := range fakes {
			f.mu.Lock()
			n := len(f.calls)
			f.mu.Unlock()
			if n == 0 {
				return false
			}
		}
		return true
	}
	for deadline := time.Now().Add(5 * time.Second); !ran(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the started forward did not run within 5 s of its start")
		}
	}
	res, err := wait()
	if err != nil || len(res) != stages {
		t.Fatalf("wait = %d results, %v; want %d", len(res), err, stages)
	}
	for i, r := range res {
		if r.Nanos != 5 {
			t.Errorf("stage %d: %+v", i, r)
		}
	}
	if got := fmt.Sprint(fakes[1].last().arg.(worker.Batch).Step); got != "4" {
		t.Errorf("stage 1 ran step %s, want 4", got)
	}
}
