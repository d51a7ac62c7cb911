package engine_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"

	cachemgrv1 "github.com/kvx-dev/kvx/cachemgr_v1"
	cachemgrv2 "github.com/kvx-dev/kvx/cachemgr_v2"
	"github.com/kvx-dev/kvx/core/engine"
	"github.com/kvx-dev/kvx/core/sched"
	"github.com/kvx-dev/kvx/core/workload"
	"github.com/kvx-dev/kvx/device"
	"github.com/kvx-dev/kvx/dsa"
	"github.com/kvx-dev/kvx/mamba"
	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
	"github.com/kvx-dev/kvx/plugins/v1/worker"
)

// peak is a manager that records, after every Commit and Fork (calls the
// engine makes from its loop goroutine), the most blocks one of its pools
// had in use. With fork false its Info hides Fork, so the engine runs the
// n sequences of a request as requests of their own.
type peak struct {
	kvcache.Manager
	fork bool
	mu   *sync.Mutex
	max  *int
}

func (p peak) Info(ctx context.Context) (kvcache.Info, error) {
	in, err := p.Manager.Info(ctx)
	in.Capabilities.Fork = in.Capabilities.Fork && p.fork
	return in, err
}

func (p peak) note(ctx context.Context) {
	st, err := p.Manager.Stats(ctx)
	if err != nil || len(st.Pools) == 0 {
		return
	}
	p.mu.Lock()
	for _, ps := range st.Pools {
		*p.max = max(*p.max, ps.InUse)
	}
	p.mu.Unlock()
}

func (p peak) Commit(ctx context.Context, items []kvcache.CommitItem) (kvcache.CommitResult, error) {
	res, err := p.Manager.Commit(ctx, items)
	p.note(ctx)
	return res, err
}

func (p peak) Fork(ctx context.Context, items []kvcache.ForkItem) ([]kvcache.Grant, error) {
	g, err := p.Manager.(kvcache.Forker).Fork(ctx, items)
	p.note(ctx)
	return g, err
}

type peakLauncher struct {
	new  func() kvcache.Manager
	fork bool
	mu   sync.Mutex
	max  []*int // per stage
}

func (l *peakLauncher) Manager(_ context.Context, stage int) (kvcache.Manager, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for len(l.max) <= stage {
		l.max = append(l.max, new(int))
	}
	return peak{Manager: l.new(), fork: l.fork, mu: &l.mu, max: l.max[stage]}, nil
}

func (l *peakLauncher) Worker(context.Context, int) (worker.Worker, error) {
	return device.NewWorker(dsa.Backend), nil
}

// TestForkSharesPromptBlocks: n = 4 sequences of one 200-token prompt,
// submitted together (SubmitN), prefill the prompt once on every manager
// and stage: the fullest pool's blocks in use peak at the prompt's 6 full
// blocks, held once, plus a partial block per sequence (and the prefix's
// own, until it is released), where the same four sequences as requests
// of their own (a manager that hides Fork) hold 4 × 7; the engine counts
// 4 forked sequences, and each sequence's tokens are the same either way.
// Block reuse is off, so only the fork can share.
func TestForkSharesPromptBlocks(t *testing.T) {
	managers := []struct {
		name string
		new  func() kvcache.Manager
	}{
		{"v1", func() kvcache.Manager { return cachemgrv1.New() }},
		{"v2", func() kvcache.Manager { return cachemgrv2.New() }},
		{"mamba", func() kvcache.Manager { return mamba.New() }},
	}
	const n, promptLen, maxTokens, tpb = 4, 200, 4, 32
	full := (promptLen - 1) / tpb
	prompt := make([]int32, promptLen)
	for i := range prompt {
		prompt[i] = int32(i*37%1000 + 1)
	}
	decs := make([]workload.Decoding, n)
	for _, m := range managers {
		for _, pp := range []int{1, 2} {
			t.Run(fmt.Sprintf("%s/pp=%d", m.name, pp), func(t *testing.T) {
				run := func(fork bool) ([][]int32, []int, engine.LiveStats) {
					l := &peakLauncher{new: m.new, fork: fork}
					ts := testSpec{pp: pp, policy: sched.MaxUtilization, cacheTokens: 8192, maxSeqLen: 2048}
					lv, err := engine.StartLive(context.Background(), buildSpec(t, ts), l)
					if err != nil {
						t.Fatal(err)
					}
					hs, err := lv.SubmitN(engine.LiveRequest{Prompt: prompt, MaxTokens: maxTokens}, decs)
					if err != nil {
						t.Fatal(err)
					}
					var out [][]int32
					for _, h := range hs {
						toks, ev := drain(t, h)
						if !ev.Done || ev.Err != nil {
							t.Fatalf("request %d: %+v", h.ID, ev)
						}
						out = append(out, toks)
					}
					st := lv.Stats()
					rep, err := lv.Stop()
					if err != nil || rep.Invariants.Violations != 0 {
						t.Fatalf("Stop: %v, violations %d: %v", err, rep.Invariants.Violations, rep.Invariants.First)
					}
					l.mu.Lock()
					defer l.mu.Unlock()
					peaks := make([]int, len(l.max))
					for i, p := range l.max {
						peaks[i] = *p
					}
					return out, peaks, st
				}
				forked, fpeak, fst := run(true)
				alone, apeak, ast := run(false)
				if fst.Forked != n || ast.Forked != 0 {
					t.Errorf("forked sequences %d with Fork and %d without, want %d and 0", fst.Forked, ast.Forked, n)
				}
				for i := range forked {
					if !slices.Equal(forked[i], alone[i]) || len(forked[i]) != maxTokens {
						t.Errorf("sequence %d: forked tokens %v, alone %v", i, forked[i], alone[i])
					}
				}
				for s := range pp {
					if fpeak[s] > full+2*n || apeak[s] < n*full || fpeak[s] >= apeak[s] {
						t.Errorf("stage %d: blocks in use peak at %d forked, %d alone; want at most %d (the %d full prompt blocks once, a partial one per sequence and the prefix's) and at least %d alone",
							s, fpeak[s], apeak[s], full+2*n, full, n*full)
					}
				}
				t.Logf("blocks in use at peak per stage: forked %v, alone %v", fpeak, apeak)
			})
		}
	}
}
