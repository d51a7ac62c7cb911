package pipeline_test

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
	"github.com/kvx-dev/kvx/plugins/v1/pipeline"
	"github.com/kvx-dev/kvx/plugins/v1/worker"
)

var ctx = context.Background()

// manager records its calls; Commit and Release refuse the sequences in
// refuse (item errors), Commit fails outright with fail.
type manager struct {
	kvcache.Manager
	calls  []string
	refuse map[kvcache.SeqID]bool
	fail   error
}

func (m *manager) refused(op string, seqs []kvcache.SeqID) error {
	var bad []kvcache.SeqID
	for _, s := range seqs {
		if m.refuse[s] {
			bad = append(bad, s)
		}
	}
	if len(bad) > 0 {
		return kvcache.ItemErrorf(bad, "%s: %v unknown", op, bad)
	}
	return nil
}

func (m *manager) Commit(_ context.Context, items []kvcache.CommitItem) (kvcache.CommitResult, error) {
	m.calls = append(m.calls, "Commit")
	if m.fail != nil {
		return kvcache.CommitResult{}, m.fail
	}
	seqs := make([]kvcache.SeqID, len(items))
	for i, it := range items {
		seqs[i] = it.Seq
	}
	return kvcache.CommitResult{Copies: []kvcache.Copy{{SrcBlock: 1, DstBlock: 2}}}, m.refused("Commit", seqs)
}

func (m *manager) Release(_ context.Context, seqs []kvcache.SeqID) error {
	m.calls = append(m.calls, "Release")
	return m.refused("Release", seqs)
}

func (m *manager) Inspect(context.Context, kvcache.InspectOptions) (kvcache.Snapshot, error) {
	m.calls = append(m.calls, "Inspect")
	return kvcache.Snapshot{Violations: []string{"seen"}}, nil
}

// TestEndStepFallback: on a manager that is no StepEnder, EndStep is
// Commit, Release and Inspect in that order; refused items of both come
// back as one item error after the snapshot was taken, and any other error
// stops the calls.
func TestEndStepFallback(t *testing.T) {
	m := &manager{refuse: map[kvcache.SeqID]bool{2: true, 3: true}}
	req := pipeline.EndStepRequest{
		Commits: []kvcache.CommitItem{{Seq: 1, Accepted: 1}, {Seq: 2, Accepted: 1}},
		Release: []kvcache.SeqID{3, 4},
		Inspect: &kvcache.InspectOptions{},
	}
	res, err := pipeline.StartEndStep(ctx, m, req)()
	var ke *kvcache.Error
	if !errors.As(err, &ke) || ke.Kind != kvcache.KindInvalidArg || !slices.Equal(ke.Seqs, []kvcache.SeqID{2, 3}) {
		t.Errorf("EndStep error = %v, want an item error about [2 3]", err)
	}
	if !slices.Equal(m.calls, []string{"Commit", "Release", "Inspect"}) {
		t.Errorf("calls %v, want Commit, Release, Inspect", m.calls)
	}
	if len(res.Commit.Copies) != 1 || res.Snapshot == nil || len(res.Snapshot.Violations) != 1 {
		t.Errorf("result %+v, want the commit's copy and the snapshot", res)
	}

	broken := &manager{fail: kvcache.ErrCorrupt}
	if _, err := pipeline.EndStep(ctx, broken, req); !errors.Is(err, kvcache.ErrCorrupt) || !slices.Equal(broken.calls, []string{"Commit"}) {
		t.Errorf("EndStep of a corrupt manager = %v after %v, want ErrCorrupt after Commit alone", err, broken.calls)
	}
	quiet := &manager{}
	if res, err := pipeline.EndStep(ctx, quiet, pipeline.EndStepRequest{}); err != nil || res.Snapshot != nil || !slices.Equal(quiet.calls, []string{"Commit"}) {
		t.Errorf("EndStep with nothing to release or inspect = %+v, %v after %v; want Commit alone", res, err, quiet.calls)
	}
}

// stage is a worker that appends its byte to the activations it gets, or
// fails.
type stage struct {
	worker.Worker
	b    byte
	fail bool
	got  *[][]byte
}

func (s stage) Forward(_ context.Context, b worker.Batch) (worker.Result, error) {
	*s.got = append(*s.got, b.Hidden)
	if s.fail {
		return worker.Result{}, errors.New("stage down")
	}
	return worker.Result{Hidden: append(slices.Clone(b.Hidden), s.b), Nanos: int64(s.b)}, nil
}

// TestForwardStagesFallback: on workers that do not chain, each stage's
// batch takes the previous result's activations (stage 0 its own), and a
// failing stage stops the forward with a StageError naming it, after the
// results of the stages before it.
func TestForwardStagesFallback(t *testing.T) {
	var got [][]byte
	ws := []worker.Worker{stage{b: 1, got: &got}, stage{b: 2, got: &got}, stage{b: 3, got: &got}}
	bs := []worker.Batch{{Hidden: []byte{0}}, {Hidden: []byte{9}}, {}}
	res, err := pipeline.StartForwardStages(ctx, ws, bs)()
	if err != nil || len(res) != 3 || !slices.Equal(res[2].Hidden, []byte{0, 1, 2, 3}) {
		t.Fatalf("ForwardStages = %+v, %v; want three results ending in activations [0 1 2 3]", res, err)
	}
	if !slices.Equal(got[1], []byte{0, 1}) {
		t.Errorf("stage 1 got activations %v, want stage 0's [0 1], not its batch's own", got[1])
	}

	ws[1] = stage{b: 2, fail: true, got: &got}
	res, err = pipeline.ForwardStages(ctx, ws, bs)
	var se *pipeline.StageError
	if !errors.As(err, &se) || se.Stage != 1 || len(res) != 1 {
		t.Errorf("ForwardStages with stage 1 down = %d results, %v; want stage 0's result and a StageError of stage 1", len(res), err)
	}
	if _, err := pipeline.ForwardStages(ctx, ws, bs[:2]); err == nil {
		t.Error("ForwardStages of 3 workers with 2 batches: no error")
	}
}
