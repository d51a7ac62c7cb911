package pluginrpc_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"

	cachemgrv1 "github.com/kvx-dev/kvx/cachemgr_v1"
	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
	"github.com/kvx-dev/kvx/plugins/v1/pipeline"
	"github.com/kvx-dev/kvx/plugins/v1/pluginrpc"
	"github.com/kvx-dev/kvx/plugins/v1/worker"
)

// TestInstancesAreSeparate: the managers one plugin process serves keep
// their own state, whether their calls come one by one or together from
// several goroutines (one data plane, pipelined).
func TestInstancesAreSeparate(t *testing.T) {
	ctx := context.Background()
	ms := pluginrpc.TestManagerInstances(t, func() kvcache.Manager { return cachemgrv1.New() }, 3)
	for _, m := range ms {
		if _, err := m.Configure(ctx, endStepConfig()); err != nil {
			t.Fatal(err)
		}
	}
	var wg sync.WaitGroup
	for i, m := range ms {
		wg.Go(func() {
			// Instance i admits i+1 sequences of 16 tokens, one call each.
			for s := range i + 1 {
				seq := kvcache.SeqID(100*i + s)
				g, err := m.Reserve(ctx, []kvcache.ReserveItem{{Seq: seq, New: true, Tokens: 16}})
				if err != nil || len(g) != 1 || !g[0].OK || g[0].Seq != seq {
					t.Errorf("instance %d: Reserve = %+v, %v", i, g, err)
					return
				}
				res, err := pipeline.StartEndStep(ctx, m, pipeline.EndStepRequest{
					Commits: []kvcache.CommitItem{{Seq: seq, Accepted: 16}}, Inspect: &kvcache.InspectOptions{}})()
				if err != nil || res.Snapshot == nil {
					t.Errorf("instance %d: EndStep = %+v, %v", i, res, err)
					return
				}
			}
		})
	}
	wg.Wait()
	for i, m := range ms {
		snap, err := m.Inspect(ctx, kvcache.InspectOptions{})
		if err != nil {
			t.Fatal(err)
		}
		var got []kvcache.SeqID
		for _, s := range snap.Seqs {
			got = append(got, s.Seq)
			if s.History != 16 {
				t.Errorf("instance %d: seq %d history %d, want 16", i, s.Seq, s.History)
			}
		}
		var want []kvcache.SeqID
		for s := range i + 1 {
			want = append(want, kvcache.SeqID(100*i+s))
		}
		if !slices.Equal(got, want) {
			t.Errorf("instance %d holds %v, want %v", i, got, want)
		}
	}
}

// stageWorker records what each forward got. Its result's activations are
// its input's followed by its stage number; its output, on the last stage,
// names the activations it got. failStep makes Forward of that step fail.
type stageWorker struct {
	mu       *sync.Mutex
	log      *[]string
	cfg      worker.Config
	failStep uint64
}

func (w *stageWorker) Info(context.Context) (worker.Info, error) {
	return worker.Info{Name: "stages", Protocols: []int{kvcache.ProtocolVersion}}, nil
}
func (w *stageWorker) Configure(_ context.Context, cfg worker.Config) (worker.Setup, error) {
	w.cfg = cfg
	return worker.Setup{}, nil
}
func (w *stageWorker) Forward(_ context.Context, b worker.Batch) (worker.Result, error) {
	w.mu.Lock()
	*w.log = append(*w.log, fmt.Sprintf("stage %d step %d hidden %v", w.cfg.Stage, b.Step, b.Hidden))
	w.mu.Unlock()
	if b.Step == w.failStep {
		return worker.Result{}, kvcache.ItemErrorf([]kvcache.SeqID{7}, "stage %d refuses request 7", w.cfg.Stage)
	}
	res := worker.Result{Hidden: append(bytes.Clone(b.Hidden), byte(w.cfg.Stage)), Nanos: int64(10 + w.cfg.Stage), Modelled: true}
	if w.cfg.Stage == w.cfg.Stages-1 {
		res.Outputs = []worker.Output{{Seq: 7, Tokens: []int32{int32(len(b.Hidden))}}}
	}
	return res, nil
}
func (w *stageWorker) CopyBlocks(context.Context, []kvcache.Copy) error { return nil }
func (w *stageWorker) Health(context.Context) error                     { return nil }

// TestForwardChain: a micro-batch over three stages served by one process
// runs in one chained call with the activations handed on inside the
// plugin, and gives what a forward stage by stage over separate processes
// gives; a failing stage stops the chain there and is named.
func TestForwardChain(t *testing.T) {
	ctx := context.Background()
	const stages = 3
	// setup returns the workers and a copy of their log so far.
	setup := func(shared bool, failStage int, failStep uint64) ([]worker.Worker, func() []string) {
		var mu sync.Mutex
		log := new([]string)
		made := 0
		newWorker := func() worker.Worker {
			w := &stageWorker{mu: &mu, log: log}
			if made == failStage {
				w.failStep = failStep
			}
			made++
			return w
		}
		var ws []worker.Worker
		if shared {
			ws = pluginrpc.TestWorkerInstances(t, newWorker, stages)
		} else {
			for range stages {
				ws = append(ws, pluginrpc.TestWorkerPair(t, newWorker()))
			}
		}
		for i, w := range ws {
			if _, err := w.Configure(ctx, worker.Config{Stage: i, Stages: stages}); err != nil {
				t.Fatal(err)
			}
		}
		return ws, func() []string {
			mu.Lock()
			defer mu.Unlock()
			return slices.Clone(*log)
		}
	}
	batches := func(step uint64) []worker.Batch {
		bs := make([]worker.Batch, stages)
		for i := range bs {
			bs[i] = worker.Batch{Step: step, Items: []worker.Item{{Seq: 7, Tokens: []int32{1}, Sample: true}}}
		}
		bs[0].Hidden = []byte{9}
		return bs
	}

	chained, chainLog := setup(true, -1, 0)
	if _, ok := chained[0].(pipeline.Chainer); !ok {
		t.Fatal("the plugin client does not implement pipeline.Chainer")
	}
	apart, apartLog := setup(false, -1, 0)
	got, err := pipeline.ForwardStages(ctx, chained, batches(1))
	if err != nil {
		t.Fatal(err)
	}
	want, err := pipeline.ForwardStages(ctx, apart, batches(1))
	if err != nil {
		t.Fatal(err)
	}
	if c, a := chainLog(), apartLog(); !slices.Equal(c, a) {
		t.Errorf("chained forwards got %q, stage by stage %q", c, a)
	}
	if len(got) != stages || len(want) != stages {
		t.Fatalf("%d chained and %d separate results, want %d", len(got), len(want), stages)
	}
	for i := range got {
		if got[i].Nanos != want[i].Nanos || !slices.EqualFunc(got[i].Outputs, want[i].Outputs, func(a, b worker.Output) bool { return slices.Equal(a.Tokens, b.Tokens) }) {
			t.Errorf("stage %d: chained %+v, separate %+v", i, got[i], want[i])
		}
		if i < stages-1 && got[i].Hidden != nil {
			t.Errorf("stage %d: chained result carries activations %v back", i, got[i].Hidden)
		}
	}
	if h := got[stages-1].Hidden; !bytes.Equal(h, []byte{9, 0, 1, 2}) || !bytes.Equal(h, want[stages-1].Hidden) {
		t.Errorf("last activations: chained %v, separate %v, want [9 0 1 2]", h, want[stages-1].Hidden)
	}

	for _, failStage := range []int{0, 1, 2} {
		t.Run(fmt.Sprintf("stage %d fails", failStage), func(t *testing.T) {
			ws, log := setup(true, failStage, 5)
			res, err := pipeline.ForwardStages(ctx, ws, batches(5))
			var se *pipeline.StageError
			if !errors.As(err, &se) || se.Stage != failStage || kvcache.KindOf(err) != kvcache.KindInvalidArg {
				t.Fatalf("error %v, want a StageError of stage %d with the worker's item error", err, failStage)
			}
			if ran := log(); len(res) != failStage || len(ran) != failStage+1 {
				t.Errorf("%d results and %d forwards run (%q), want %d and %d", len(res), len(ran), ran, failStage, failStage+1)
			}
			// The plane is still in step: the next chain runs whole.
			if res, err := pipeline.ForwardStages(ctx, ws, batches(6)); err != nil || len(res) != stages {
				t.Errorf("the chain after a failure: %d results, %v", len(res), err)
			}
		})
	}
}
