package engine_test

import (
	"context"
	"errors"
	"slices"
	"sync"
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

// recording launches in-process v1 managers and remembers them, so a test
// can inspect what they hold.
type recording struct {
	mu       sync.Mutex
	managers []kvcache.Manager
}

func (l *recording) Manager(context.Context, int) (kvcache.Manager, error) {
	m := cachemgrv1.New()
	l.mu.Lock()
	l.managers = append(l.managers, m)
	l.mu.Unlock()
	return m, nil
}

func (l *recording) Worker(context.Context, int) (worker.Worker, error) {
	return device.NewWorker(dsa.Backend), nil
}

// drain reads a handle's events to the end.
func drain(t *testing.T, h *engine.Handle) ([]int32, engine.Event) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var toks []int32
	for {
		ev, err := h.Next(ctx)
		if err != nil {
			t.Fatalf("request %d: %v", h.ID, err)
		}
		toks = append(toks, ev.Tokens...)
		if ev.Done || ev.Err != nil {
			return toks, ev
		}
	}
}

// TestLiveGivesRunTokens: requests submitted to a live engine, from several
// goroutines, under cache pressure with MTP over two stages (the overlapped
// step path), get the tokens Run gives the same requests; the engine then
// holds nothing, and its figures count them.
func TestLiveGivesRunTokens(t *testing.T) {
	wl := genWorkload(t, 24, 256)
	ts := testSpec{pp: 2, draft: 1, reuse: true, policy: sched.MaxUtilization, cacheTokens: 2600, reqs: wl, maxSeqLen: 2048}
	s := buildSpec(t, ts)
	s.KeepOutputs = true
	rep := runSpec(t, s, v1Launcher())
	want := map[uint64][]int32{}
	for _, o := range rep.Outputs.Requests {
		want[o.ID] = o.Tokens
	}

	l := &recording{}
	lv, err := engine.StartLive(context.Background(), buildSpec(t, ts), l)
	if err != nil {
		t.Fatal(err)
	}
	// Submit in workload order, so request i gets id i (sim tokens depend
	// on the request id and the position); read from many goroutines.
	handles := make([]*engine.Handle, len(wl.Requests))
	for i, r := range wl.Requests {
		h, err := lv.Submit(engine.LiveRequest{Prompt: r.Prompt, MaxTokens: r.OutputLen})
		if err != nil {
			t.Fatal(err)
		}
		handles[i] = h
	}
	var wg sync.WaitGroup
	for i, h := range handles {
		wg.Go(func() {
			toks, ev := drain(t, h)
			if !ev.Done || !slices.Equal(toks, want[uint64(i)]) {
				t.Errorf("request %d: done %v err %v tokens %v, want Run's %v", i, ev.Done, ev.Err, toks, want[uint64(i)])
			}
		})
	}
	wg.Wait()
	st := settledStats(lv, func(st engine.LiveStats) bool { return st.Completed >= int64(len(wl.Requests)) && st.Running == 0 })
	if st.Completed != int64(len(wl.Requests)) || st.Running != 0 || st.Waiting != 0 || st.KVUsage != 0 || st.GeneratedTokens != rep.Tokens.Generated {
		t.Errorf("stats %+v, want %d completed, nothing running or held, %d generated", st, len(wl.Requests), rep.Tokens.Generated)
	}
	checkEmpty(t, l)
	final, err := lv.Stop()
	if err != nil || final.Requests.Completed != len(wl.Requests) || final.Invariants.Violations != 0 {
		t.Errorf("Stop: %v, requests %+v, invariants %+v", err, final.Requests, final.Invariants)
	}
	if _, err := lv.Submit(engine.LiveRequest{Prompt: []int32{1}, MaxTokens: 1}); !errors.Is(err, engine.ErrStopped) {
		t.Errorf("Submit after Stop: %v, want ErrStopped", err)
	}
}

// settledStats returns lv's stats once done says they are settled, or after
// 10 s: Stats is the snapshot the loop publishes after a step, which may
// come after the last event reached its handle.
func settledStats(lv *engine.Live, done func(engine.LiveStats) bool) engine.LiveStats {
	st := lv.Stats()
	for end := time.Now().Add(10 * time.Second); !done(st) && time.Now().Before(end); st = lv.Stats() {
		time.Sleep(5 * time.Millisecond)
	}
	return st
}

// checkEmpty fails unless every manager holds no sequence.
func checkEmpty(t *testing.T, l *recording) {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	for i, m := range l.managers {
		snap, err := m.Inspect(context.Background(), kvcache.InspectOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if len(snap.Seqs) != 0 {
			t.Errorf("manager %d holds %d sequences after every request ended", i, len(snap.Seqs))
		}
	}
}

// TestLiveCancelFreesAndRejects: a cancelled request ends with ErrCancelled
// and is released at once; a request that can never fit is rejected alone
// with the numbers; the engine serves the next request.
func TestLiveCancelFreesAndRejects(t *testing.T) {
	// A long request (130k tokens: many thousand steps even on the sim) is
	// cancelled right after its first event.
	ts := testSpec{pp: 2, draft: 1, policy: sched.GuaranteedNoEvict, cacheTokens: 1 << 18, maxSeqLen: 1 << 17}
	l := &recording{}
	lv, err := engine.StartLive(context.Background(), buildSpec(t, ts), l)
	if err != nil {
		t.Fatal(err)
	}
	defer lv.Stop()
	long, err := lv.Submit(engine.LiveRequest{Prompt: make([]int32, 100), MaxTokens: 130000})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if ev, err := long.Next(ctx); err != nil || len(ev.Tokens) == 0 {
		t.Fatalf("first event %+v %v", ev, err)
	}
	long.Cancel()
	_, ev := drain(t, long)
	if !errors.Is(ev.Err, engine.ErrCancelled) {
		t.Errorf("cancelled request ended with %+v, want ErrCancelled", ev)
	}
	big, _ := lv.Submit(engine.LiveRequest{Prompt: make([]int32, 1<<17), MaxTokens: 4})
	_, ev = drain(t, big)
	var re *engine.RequestError
	if !errors.As(ev.Err, &re) || !re.Rejected {
		t.Errorf("a prompt of max_seq_len tokens ended with %+v, want a rejection", ev)
	}
	ok, _ := lv.Submit(engine.LiveRequest{Prompt: []int32{5, 6, 7}, MaxTokens: 3})
	if toks, ev := drain(t, ok); !ev.Done || len(toks) != 3 {
		t.Errorf("next request: %v %+v", toks, ev)
	}
	checkEmpty(t, l)
	st := settledStats(lv, func(st engine.LiveStats) bool { return st.Completed >= 1 && st.Running == 0 })
	if st.Aborted != 2 || st.Completed != 1 || st.GeneratedTokens >= 130000 {
		t.Errorf("stats %+v, want 2 aborted, 1 completed, the cancelled one cut short", st)
	}
}
