package engine_test

import (
	"context"
	"slices"
	"sync"
	"testing"

	cachemgrv1 "github.com/kvx-dev/kvx/cachemgr_v1"
	"github.com/kvx-dev/kvx/core/sched"
	"github.com/kvx-dev/kvx/device"
	"github.com/kvx-dev/kvx/dsa"
	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
	"github.com/kvx-dev/kvx/plugins/v1/worker"
)

// leadLog records, over a run, what each stage's manager was asked.
type leadLog struct {
	mu    sync.Mutex
	calls []leadCall
	first map[kvcache.SeqID]bool // new sequences whose first ask stage 1 denied
	live  map[kvcache.SeqID]bool // sequences stage 1 holds
}

// leadCall is one Reserve or Unreserve call on one stage.
type leadCall struct {
	stage     int
	unreserve bool
	seqs      []kvcache.SeqID // asked (Reserve) or unreserved
	granted   map[kvcache.SeqID]bool
}

// pickyManager is a v1 manager that, on stage 1, denies the first ask of
// every new sequence while it holds another (as a stage with less room
// would; a denial with nothing resident would reject the request) and
// grants its retries; on both stages it logs the calls.
type pickyManager struct {
	kvcache.Manager
	stage int
	log   *leadLog
}

func (m pickyManager) Reserve(ctx context.Context, items []kvcache.ReserveItem) ([]kvcache.Grant, error) {
	l := m.log
	l.mu.Lock()
	call := leadCall{stage: m.stage, granted: map[kvcache.SeqID]bool{}}
	var pass []kvcache.ReserveItem
	var at []int
	for i, it := range items {
		call.seqs = append(call.seqs, it.Seq)
		if m.stage == 1 && it.New && !l.first[it.Seq] && len(l.live) > 0 {
			l.first[it.Seq] = true
			continue
		}
		pass, at = append(pass, it), append(at, i)
	}
	l.mu.Unlock()
	got, err := m.Manager.Reserve(ctx, pass)
	if err != nil {
		return nil, err
	}
	out := make([]kvcache.Grant, len(items))
	for i, it := range items {
		out[i] = kvcache.Grant{Seq: it.Seq, Reason: "no capacity: picky stage"}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	for k, g := range got {
		out[at[k]] = g
		call.granted[g.Seq] = g.OK
		if m.stage == 1 && g.OK && pass[k].New {
			l.live[g.Seq] = true
		}
	}
	l.calls = append(l.calls, call)
	return out, nil
}

func (m pickyManager) Unreserve(ctx context.Context, seqs []kvcache.SeqID) error {
	m.log.mu.Lock()
	m.log.calls = append(m.log.calls, leadCall{stage: m.stage, unreserve: true, seqs: slices.Clone(seqs)})
	m.log.mu.Unlock()
	return m.Manager.Unreserve(ctx, seqs)
}

func (m pickyManager) Release(ctx context.Context, seqs []kvcache.SeqID) error {
	if m.stage == 1 {
		m.log.mu.Lock()
		for _, s := range seqs {
			delete(m.log.live, s)
		}
		m.log.mu.Unlock()
	}
	return m.Manager.Release(ctx, seqs)
}

type pickyLauncher struct{ log *leadLog }

func (l pickyLauncher) Manager(_ context.Context, stage int) (kvcache.Manager, error) {
	return pickyManager{cachemgrv1.New(), stage, l.log}, nil
}

func (pickyLauncher) Worker(context.Context, int) (worker.Worker, error) {
	return device.NewWorker(dsa.Backend), nil
}

// TestReserveLeadStage: over two stages, the stage that denied last
// reserves first and the other only what it granted. Stage 1 denies the
// first ask of every new sequence (while it holds another): the first such
// denial is undone on stage 0, which led then and granted it; from then on
// stage 1 leads, so stage 0 is asked only what stage 1 granted and
// unreserves nothing more. The outputs equal a run on two plain stages.
func TestReserveLeadStage(t *testing.T) {
	wl := genWorkload(t, 24, 0)
	ts := testSpec{pp: 2, draft: 1, reuse: true, policy: sched.GuaranteedNoEvict, cacheTokens: 1 << 15, reqs: wl, maxSeqLen: 2048}
	want := runSpec(t, buildSpec(t, ts), v1Launcher())
	log := &leadLog{first: map[kvcache.SeqID]bool{}, live: map[kvcache.SeqID]bool{}}
	rep := runSpec(t, buildSpec(t, ts), pickyLauncher{log})
	if rep.Requests.Completed != len(wl.Requests) || rep.Outputs.Digest != want.Outputs.Digest {
		t.Fatalf("%+v: completed %d of %d, digest %s, want %s", rep.Requests, rep.Requests.Completed, len(wl.Requests), rep.Outputs.Digest, want.Outputs.Digest)
	}
	if len(log.first) < len(wl.Requests)/2 {
		t.Fatalf("stage 1 denied the first ask of %d requests, want most of %d", len(log.first), len(wl.Requests))
	}
	if c := log.calls[0]; c.stage != 0 || c.unreserve {
		t.Fatalf("first call %+v, want a Reserve on stage 0 (leading)", c)
	}
	undone := -1
	for k, c := range log.calls {
		if !c.unreserve {
			continue
		}
		if c.stage != 0 || undone >= 0 {
			t.Fatalf("call %d: Unreserve of %v on stage %d after the one of call %d: want one, on stage 0", k, c.seqs, c.stage, undone)
		}
		undone = k
	}
	if undone < 0 {
		t.Fatal("no Unreserve on stage 0: the first denial of stage 1 should be undone there")
	}
	// After the undo, every Reserve on stage 0 asks only what the Reserve on
	// stage 1 just before it granted.
	var last *leadCall
	for k := undone + 1; k < len(log.calls); k++ {
		c := &log.calls[k]
		if c.stage == 1 {
			last = c
			continue
		}
		if last == nil {
			t.Fatalf("call %d: Reserve of %v on stage 0 before any on stage 1: want stage 1 leading", k, c.seqs)
		}
		for _, seq := range c.seqs {
			if !last.granted[seq] {
				t.Fatalf("call %d: stage 0 asked for seq %d, which stage 1 did not grant just before", k, seq)
			}
		}
	}
}
