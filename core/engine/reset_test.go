package engine_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/kvx-dev/kvx/core/engine"
	"github.com/kvx-dev/kvx/core/sched"
)

// TestLiveResetPrefixCache: a reset while the engine is idle drops every
// cached block of every stage (the managers' own Stats say none is left),
// so the same prompt is then served with no reused token, and it is
// reused again once stored anew; a reset asked for while a request is in
// flight is refused with ErrBusy and changes nothing.
func TestLiveResetPrefixCache(t *testing.T) {
	wl := genWorkload(t, 1, 0)
	ts := testSpec{pp: 2, reuse: true, policy: sched.GuaranteedNoEvict, cacheTokens: 8000, reqs: wl, maxSeqLen: 2048}
	l := &recording{}
	lv, err := engine.StartLive(context.Background(), buildSpec(t, ts), l)
	if err != nil {
		t.Fatal(err)
	}
	defer lv.Stop()
	prompt := wl.Requests[0].Prompt
	serveOne := func(maxTokens int) engine.Event {
		t.Helper()
		h, err := lv.Submit(engine.LiveRequest{Prompt: prompt, MaxTokens: maxTokens})
		if err != nil {
			t.Fatal(err)
		}
		_, ev := drain(t, h)
		if !ev.Done {
			t.Fatalf("request %d: %v", h.ID, ev.Err)
		}
		return ev
	}
	cached := func() int {
		t.Helper()
		n := 0
		l.mu.Lock()
		defer l.mu.Unlock()
		for _, m := range l.managers {
			st, err := m.Stats(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			for _, p := range st.Pools {
				n += p.Cached
			}
		}
		return n
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if ev := serveOne(4); ev.Cached != 0 {
		t.Fatalf("first request: %d cached tokens, want 0", ev.Cached)
	}
	if ev := serveOne(4); ev.Cached == 0 {
		t.Fatalf("the same prompt again: 0 cached tokens, want its full blocks")
	}
	settledStats(lv, func(st engine.LiveStats) bool { return st.Running == 0 && st.Completed == 2 })
	before := cached()
	if before == 0 {
		t.Fatal("the managers hold no cached block after two requests")
	}
	res, err := lv.ResetPrefixCache(ctx)
	if err != nil {
		t.Fatalf("ResetPrefixCache: %v", err)
	}
	if res.CachedBlocks != before || res.CachedAfter != 0 || res.WorkerReconfigured {
		t.Errorf("ResetPrefixCache = %+v, want %d cached blocks dropped, 0 left, the same layout", res, before)
	}
	if n := cached(); n != 0 {
		t.Errorf("after the reset the managers hold %d cached blocks, want 0", n)
	}
	if ev := serveOne(4); ev.Cached != 0 {
		t.Errorf("the prompt after the reset: %d cached tokens, want 0", ev.Cached)
	}
	if ev := serveOne(4); ev.Cached == 0 {
		t.Errorf("the prompt stored again after the reset: 0 cached tokens, want its full blocks")
	}

	// Busy: a long request is in flight.
	h, err := lv.Submit(engine.LiveRequest{Prompt: prompt, MaxTokens: 1000})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := lv.ResetPrefixCache(ctx); !errors.Is(err, engine.ErrBusy) {
		t.Errorf("ResetPrefixCache with a request in flight: %v, want ErrBusy", err)
	}
	if _, ev := drain(t, h); !ev.Done || ev.Cached == 0 {
		t.Errorf("the request in flight during the refused reset: done %v, %d cached tokens, want its full blocks", ev.Done, ev.Cached)
	}
	final, err := lv.Stop()
	if err != nil || final.Invariants.Violations != 0 || final.Requests.Completed != 5 {
		t.Errorf("Stop: %v, requests %+v, invariants %+v", err, final.Requests, final.Invariants)
	}
}
