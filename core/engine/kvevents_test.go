package engine_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	cachemgrv1 "github.com/kvx-dev/kvx/cachemgr_v1"
	"github.com/kvx-dev/kvx/core/engine"
	"github.com/kvx-dev/kvx/core/sched"
	"github.com/kvx-dev/kvx/core/workload"
	"github.com/kvx-dev/kvx/device"
	"github.com/kvx-dev/kvx/dsa"
	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
	"github.com/kvx-dev/kvx/plugins/v1/worker"
)

func saltPrompt(n int) []int32 {
	p := make([]int32, n)
	for i := range p {
		p[i] = int32(i*7 + 3)
	}
	return p
}

// cachedAfter submits p under salt, reads it to the end and returns the
// prompt tokens the prefix cache supplied.
func cachedAfter(t *testing.T, lv *engine.Live, salt string, p []int32) int {
	t.Helper()
	h, err := lv.Submit(engine.LiveRequest{Prompt: p, MaxTokens: 2, CacheSalt: salt})
	if err != nil {
		t.Fatalf("Submit(salt %q): %v", salt, err)
	}
	_, ev := drain(t, h)
	if !ev.Done {
		t.Fatalf("salt %q: ended with %+v", salt, ev)
	}
	return ev.Cached
}

// TestLiveCacheSalt: a prompt is reused under its own salt only; an
// oversized salt is refused with the numbers.
func TestLiveCacheSalt(t *testing.T) {
	ts := testSpec{pp: 1, reuse: true, policy: sched.MaxUtilization, cacheTokens: 1 << 14, maxSeqLen: 2048}
	lv, err := engine.StartLive(context.Background(), buildSpec(t, ts), &recording{})
	if err != nil {
		t.Fatal(err)
	}
	defer lv.Stop()
	if err := lv.CacheSaltErr(); err != nil {
		t.Fatalf("CacheSaltErr on v1: %v", err)
	}
	p := saltPrompt(700)
	if got := cachedAfter(t, lv, "a", p); got != 0 {
		t.Fatalf("first request reused %d", got)
	}
	for _, tc := range []struct {
		salt string
		hit  bool
	}{{"a", true}, {"b", false}, {"", false}, {"b", true}, {"", true}} {
		if got := cachedAfter(t, lv, tc.salt, p); (got > 0) != tc.hit {
			t.Errorf("salt %q: %d cached tokens, want hit %v", tc.salt, got, tc.hit)
		}
	}
	_, err = lv.Submit(engine.LiveRequest{Prompt: p, MaxTokens: 1, CacheSalt: strings.Repeat("x", kvcache.MaxCacheSaltBytes+1)})
	var re *engine.RequestError
	if !errors.As(err, &re) || !strings.Contains(re.Reason, "257 bytes") {
		t.Errorf("Submit(oversized salt) = %v, want a RequestError naming the length", err)
	}
}

// noSalt is a manager that predates cache_salt: its Info lacks the capability.
type noSalt struct{ kvcache.Manager }

func (m noSalt) Info(ctx context.Context) (kvcache.Info, error) {
	info, err := m.Manager.Info(ctx)
	info.Capabilities.CacheSalt = false
	return info, err
}

type noSaltLauncher struct{ recording }

func (l *noSaltLauncher) Manager(ctx context.Context, i int) (kvcache.Manager, error) {
	m, err := l.recording.Manager(ctx, i)
	return noSalt{m}, err
}

// TestLiveRefusesSaltWithoutCapability: a manager without the cache_salt
// capability gets no salted request (it would share across salts); unsalted
// requests are served.
func TestLiveRefusesSaltWithoutCapability(t *testing.T) {
	ts := testSpec{pp: 1, reuse: true, policy: sched.MaxUtilization, cacheTokens: 1 << 14, maxSeqLen: 2048}
	lv, err := engine.StartLive(context.Background(), buildSpec(t, ts), &noSaltLauncher{})
	if err != nil {
		t.Fatal(err)
	}
	defer lv.Stop()
	if _, err := lv.Submit(engine.LiveRequest{Prompt: saltPrompt(10), MaxTokens: 1, CacheSalt: "a"}); !errors.Is(err, engine.ErrCacheSaltUnsupported) ||
		!strings.Contains(err.Error(), "stage 0") {
		t.Fatalf("Submit(salted) = %v, want ErrCacheSaltUnsupported naming the stage", err)
	}
	if got := cachedAfter(t, lv, "", saltPrompt(10)); got != 0 {
		t.Errorf("unsalted request reused %d on an empty cache", got)
	}
}

type sink struct {
	mu  sync.Mutex
	evs []kvcache.Event
}

func (s *sink) KVEvents(evs []kvcache.Event) {
	s.mu.Lock()
	s.evs = append(s.evs, evs...)
	s.mu.Unlock()
}

// TestLiveKVEvents: with a sink, the engine hands it the first stage's
// events: the cache cleared at Configure, then the prompt's full blocks
// stored, with its tokens.
func TestLiveKVEvents(t *testing.T) {
	ts := testSpec{pp: 2, reuse: true, policy: sched.MaxUtilization, cacheTokens: 1 << 14, maxSeqLen: 2048}
	s := buildSpec(t, ts)
	var got sink
	s.KVEvents = &got
	lv, err := engine.StartLive(context.Background(), s, &recording{})
	if err != nil {
		t.Fatal(err)
	}
	p := saltPrompt(700)
	cachedAfter(t, lv, "", p)
	cachedAfter(t, lv, "", saltPrompt(5)) // one more step collects the first's last events
	if _, err := lv.Stop(); err != nil {
		t.Fatal(err)
	}
	got.mu.Lock()
	defer got.mu.Unlock()
	tpb := s.Managers[0].TokensPerBlock
	var stored []int32
	for _, e := range got.evs[min(1, len(got.evs)):] {
		if e.Kind == kvcache.BlockStored {
			stored = append(stored, e.Tokens...)
		}
	}
	if len(got.evs) == 0 || got.evs[0].Kind != kvcache.AllBlocksCleared || !slices.Equal(stored, p[:len(p)/tpb*tpb]) {
		t.Fatalf("events %+v: want AllBlocksCleared, then the %d full blocks of the prompt stored", got.evs, len(p)/tpb)
	}
}

// saltWorkload is four runs of one prompt, one at a time, under salts.
func saltWorkload(salts ...string) workload.Workload {
	var w workload.Workload
	for i, s := range salts {
		w.Requests = append(w.Requests, workload.Request{ID: uint64(i), Prompt: saltPrompt(700), OutputLen: 2, CacheSalt: s})
	}
	w.Concurrency = 1
	return w
}

// TestRunCacheSalt: in a replay, a request reuses only what requests of its
// own salt computed.
func TestRunCacheSalt(t *testing.T) {
	ts := testSpec{pp: 2, reuse: true, policy: sched.MaxUtilization, cacheTokens: 1 << 14, maxSeqLen: 2048}
	ts.reqs = saltWorkload("", "", "", "")
	shared := runSpec(t, buildSpec(t, ts), v1Launcher()).Tokens.PrefixReused
	ts.reqs = saltWorkload("a", "a", "b", "")
	salted := runSpec(t, buildSpec(t, ts), v1Launcher()).Tokens.PrefixReused
	if shared == 0 || salted*3 != shared {
		t.Errorf("prefix reused %d tokens under salts a, a, b, none; %d without salts: want a third (only the second a reuses)", salted, shared)
	}
	ts.reqs = saltWorkload("a")
	if _, err := engine.Run(context.Background(), buildSpec(t, ts), &noSaltLauncher{}); !errors.Is(err, engine.ErrCacheSaltUnsupported) {
		t.Errorf("Run of a salted request on a manager without cache_salt = %v, want ErrCacheSaltUnsupported", err)
	}
}

// dyingReporter is a dyingManager that reports its manager's KV events.
type dyingReporter struct {
	dyingManager
	er kvcache.EventReporter
}

func (m dyingReporter) Events(ctx context.Context) ([]kvcache.Event, error) { return m.er.Events(ctx) }

// TestKVEventsAfterRestart: a manager that dies is replaced by one whose
// events start with AllBlocksCleared, so a router forgets the dead cache;
// the new manager's stores follow.
func TestKVEventsAfterRestart(t *testing.T) {
	wl := genWorkload(t, 12, 128)
	ts := testSpec{pp: 1, reuse: true, policy: sched.MaxUtilization, cacheTokens: 1 << 15, reqs: wl, maxSeqLen: 2048}
	var launches atomic.Int64
	l := inproc{
		manager: func() kvcache.Manager {
			m := cachemgrv1.New()
			if launches.Add(1) == 1 {
				return dyingReporter{dyingManager{m, new(atomic.Int64), 40}, m}
			}
			return m
		},
		worker: func() worker.Worker { return device.NewWorker(dsa.Backend) },
	}
	s := buildSpec(t, ts)
	var got sink
	s.KVEvents = &got
	rep := runSpec(t, s, l)
	if rep.Engine.PluginRestarts != 1 || rep.Requests.Completed != len(wl.Requests) {
		t.Fatalf("restarts %d, requests %+v: want 1 restart and every request completed", rep.Engine.PluginRestarts, rep.Requests)
	}
	var cleared []int
	storedAfter := 0
	for i, e := range got.evs {
		switch {
		case e.Kind == kvcache.AllBlocksCleared:
			cleared = append(cleared, i)
		case e.Kind == kvcache.BlockStored && len(cleared) == 2:
			storedAfter += len(e.Hashes)
		}
	}
	if len(cleared) != 2 || cleared[0] != 0 || storedAfter == 0 {
		t.Errorf("AllBlocksCleared at events %v, %d blocks stored after the second: want it first, again at the restart, then stores", cleared, storedAfter)
	}
}
