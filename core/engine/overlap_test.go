package engine_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"reflect"
	"slices"
	"testing"

	cachemgrv2 "github.com/kvx-dev/kvx/cachemgr_v2"
	"github.com/kvx-dev/kvx/core/engine"
	"github.com/kvx-dev/kvx/core/report"
	"github.com/kvx-dev/kvx/core/sched"
	"github.com/kvx-dev/kvx/core/workload"
	"github.com/kvx-dev/kvx/device"
	"github.com/kvx-dev/kvx/dsa"
	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
	"github.com/kvx-dev/kvx/plugins/v1/pipeline"
	"github.com/kvx-dev/kvx/plugins/v1/worker"
)

// deferredWorker runs a forward only when the engine waits for it, the way
// a worker process runs while the engine goes on (pipeline.ChainStarter). It
// keeps its own copy of the batches from the start, and the wait fails when
// the engine changed the batches in between.
type deferredWorker struct{ worker.Worker }

var errBatchChanged = errors.New("the engine changed a batch between the start of its forward and the wait")

func (w deferredWorker) StartForwardChain(ctx context.Context, next []worker.Worker, bs []worker.Batch) (func() ([]worker.Result, error), bool) {
	ws := []worker.Worker{w.Worker}
	for _, n := range next {
		d, ok := n.(deferredWorker)
		if !ok {
			return nil, false
		}
		ws = append(ws, d.Worker)
	}
	kept := cloneBatches(bs)
	return func() ([]worker.Result, error) {
		if !reflect.DeepEqual(kept, bs) {
			return nil, &pipeline.StageError{Stage: 0, Err: errBatchChanged}
		}
		return pipeline.ForwardStages(ctx, ws, kept)
	}, true
}

func cloneBatches(bs []worker.Batch) []worker.Batch {
	out := make([]worker.Batch, len(bs))
	for i, b := range bs {
		c := b
		c.Hidden, c.Released, c.Copies = slices.Clone(b.Hidden), slices.Clone(b.Released), slices.Clone(b.Copies)
		c.Items = slices.Clone(b.Items)
		for j := range c.Items {
			it := &c.Items[j]
			it.Tokens, it.Snapshots = slices.Clone(it.Tokens), slices.Clone(it.Snapshots)
			it.Tables = slices.Clone(it.Tables)
			for k := range it.Tables {
				it.Tables[k].Blocks = slices.Clone(it.Tables[k].Blocks)
			}
		}
		out[i] = c
	}
	return out
}

// comparable blanks what differs between two runs of the same spec: the
// wall time and what is derived from it.
func comparable(r report.Report) report.Report {
	r.Engine.WallS, r.Engine.OverlappedSteps = 0, 0
	r.Variant = ""
	return r
}

// TestOverlapMatchesSequential runs seeded random two-stage traces — open
// and closed loops, drafts, reuse, both capacity policies, caches from
// roomy to tight, with and without a host tier — with the next step
// scheduled while the forward runs and with every forward waited for first.
// The reports must be identical: the same tokens, the same simulated
// times, the same preemptions and checks.
func TestOverlapMatchesSequential(t *testing.T) {
	seeds := 40
	if testing.Short() {
		seeds = 10
	}
	l := inproc{
		manager: func() kvcache.Manager { return cachemgrv2.New() },
		worker:  func() worker.Worker { return deferredWorker{device.NewWorker(dsa.Backend)} },
	}
	overlapped := 0 // steps
	for seed := uint64(1); seed <= uint64(seeds); seed++ {
		rng := rand.New(rand.NewPCG(seed, 0x0fe1))
		const maxSeqLen = 2048
		wl, err := workload.GenerateWorkload(workload.GenOptions{
			Requests: 8 + rng.IntN(30), PromptMin: 64, PromptMax: 64 + rng.IntN(1500),
			OutputMin: 1, OutputMax: 1 + rng.IntN(150), SharedPrefix: rng.IntN(2) * 64,
			SharedGroups: 1 + rng.IntN(3), Rate: float64(5 + rng.IntN(200)), Seed: seed,
		})
		if err != nil {
			t.Fatal(err)
		}
		if rng.IntN(2) == 0 {
			wl.Concurrency = 1 + rng.IntN(12)
		}
		policy := sched.GuaranteedNoEvict
		if rng.IntN(2) == 0 {
			policy = sched.MaxUtilization
		}
		ts := testSpec{pp: 2, draft: rng.IntN(3), reuse: rng.IntN(2) == 0, policy: policy,
			cacheTokens: maxSeqLen + 600 + rng.IntN(6*maxSeqLen), reqs: wl, maxSeqLen: maxSeqLen}
		host := rng.IntN(2) == 0
		var reps [2]report.Report
		var over int64
		for i, sequential := range []bool{false, true} {
			s := buildSpec(t, ts)
			s.Sequential = sequential
			s.KeepRequests = true // the per-request records and the series must agree too
			if host {
				for j := range s.Managers {
					s.Managers[j].HostBytes = 2 * s.Managers[j].DeviceBytes
				}
			}
			rep, err := engine.Run(t.Context(), s, l)
			if err != nil {
				t.Fatalf("seed %d sequential %v: %v\nviolations: %v", seed, sequential, err, rep.Invariants.First)
			}
			if len(rep.Requests.Records) != rep.Requests.Total || rep.Series == nil {
				t.Fatalf("seed %d: %d records for %d requests, series %v", seed, len(rep.Requests.Records), rep.Requests.Total, rep.Series != nil)
			}
			if sequential && rep.Engine.OverlappedSteps != 0 {
				t.Fatalf("seed %d: %d steps overlapped in a sequential run", seed, rep.Engine.OverlappedSteps)
			}
			if !sequential {
				over = rep.Engine.OverlappedSteps
			}
			reps[i] = comparable(rep)
		}
		if !reflect.DeepEqual(reps[0], reps[1]) {
			t.Fatalf("seed %d: overlapped and sequential reports differ:\n%+v\n%+v", seed, reps[0], reps[1])
		}
		if reps[0].Requests.Completed == 0 {
			t.Fatalf("seed %d: nothing completed: %+v", seed, reps[0].Requests)
		}
		overlapped += int(over)
	}
	if overlapped == 0 {
		t.Fatal("no step overlapped a forward")
	}
	t.Logf("%d traces, %d steps overlapped", seeds, overlapped)
}
