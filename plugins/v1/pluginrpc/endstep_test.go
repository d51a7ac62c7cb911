package pluginrpc_test

import (
	"context"
	"errors"
	"reflect"
	"slices"
	"testing"

	cachemgrv1 "github.com/kvx-dev/kvx/cachemgr_v1"
	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
	"github.com/kvx-dev/kvx/plugins/v1/pipeline"
	"github.com/kvx-dev/kvx/plugins/v1/pluginrpc"
	"github.com/kvx-dev/kvx/plugins/v1/spec"
)

func endStepConfig() kvcache.Config {
	layers := []spec.Layer{
		{Index: 0, Mixer: spec.MixerGQA, Buffers: []spec.Buffer{{Role: spec.RoleKV, BytesPerToken: 512}}},
		{Index: 1, Mixer: spec.MixerGQA, Buffers: []spec.Buffer{{Role: spec.RoleKV, BytesPerToken: 512}}},
	}
	return kvcache.Config{Stages: 1, Layers: layers, TokensPerBlock: 16, DeviceBytes: 1024 * 16 * 200,
		MaxBatchSize: 8, MaxNumTokens: 256, MaxSeqLen: 1024, MaxDraftTokens: 1, EnableBlockReuse: true}
}

// TestEndStepOverTheWire: the one-round-trip end of a step has the effects
// and results of Commit, Release and Inspect called in turn, refused items
// included, whether the manager is in-process or behind gRPC.
func TestEndStepOverTheWire(t *testing.T) {
	ctx := context.Background()
	local, inner := cachemgrv1.New(), cachemgrv1.New()
	remote := pluginrpc.TestManagerPair(t, inner)
	if _, ok := remote.(pipeline.StepEnder); !ok {
		t.Fatal("the gRPC client does not implement pipeline.StepEnder")
	}
	prompt := make([]int32, 100)
	for i := range prompt {
		prompt[i] = int32(i + 1)
	}
	run := func(m kvcache.Manager) (pipeline.EndStepResult, error) {
		if _, err := m.Configure(ctx, endStepConfig()); err != nil {
			t.Fatal(err)
		}
		g, err := m.Reserve(ctx, []kvcache.ReserveItem{
			{Seq: 1, New: true, Tokens: 100, Prompt: prompt},
			{Seq: 2, New: true, Tokens: 40},
		})
		if err != nil || !g[0].OK || !g[1].OK {
			t.Fatalf("Reserve = %+v, %v", g, err)
		}
		// Seq 9 is unknown: refused as an item, the rest applied.
		return pipeline.EndStep(ctx, m, pipeline.EndStepRequest{
			Commits: []kvcache.CommitItem{{Seq: 1, Accepted: 100}, {Seq: 2, Accepted: 40}, {Seq: 9, Accepted: 1}},
			Release: []kvcache.SeqID{2},
			Inspect: &kvcache.InspectOptions{Tables: true},
		})
	}
	want, wantErr := run(local)
	got, gotErr := run(remote)
	for _, c := range []struct {
		name string
		err  error
	}{{"in-process", wantErr}, {"gRPC", gotErr}} {
		var ke *kvcache.Error
		if kvcache.KindOf(c.err) != kvcache.KindInvalidArg || !errors.As(c.err, &ke) || !slices.Equal(ke.Seqs, []kvcache.SeqID{9}) {
			t.Errorf("%s EndStep error = %v, want an item error about seq 9", c.name, c.err)
		}
	}
	if got.Snapshot == nil || want.Snapshot == nil {
		t.Fatalf("snapshot missing: in-process %v, gRPC %v", want.Snapshot != nil, got.Snapshot != nil)
	}
	if len(got.Snapshot.Seqs) != 1 || got.Snapshot.Seqs[0].History != 100 {
		t.Errorf("after EndStep: sequences %+v, want seq 1 alone with history 100", got.Snapshot.Seqs)
	}
	if !reflect.DeepEqual(normalize(*got.Snapshot), normalize(*want.Snapshot)) {
		t.Errorf("gRPC snapshot %+v\nin-process %+v", *got.Snapshot, *want.Snapshot)
	}
	// Without Inspect no snapshot comes back.
	res, err := pipeline.EndStep(ctx, remote, pipeline.EndStepRequest{})
	if err != nil || res.Snapshot != nil {
		t.Errorf("empty EndStep = %+v, %v; want no snapshot and no error", res, err)
	}
}

// normalize maps empty slices to nil so that values that crossed the wire
// compare equal with local ones.
func normalize(s kvcache.Snapshot) kvcache.Snapshot {
	if len(s.Violations) == 0 {
		s.Violations = nil
	}
	for i := range s.Seqs {
		for p := range s.Seqs[i].Tables {
			if len(s.Seqs[i].Tables[p]) == 0 {
				s.Seqs[i].Tables[p] = nil
			}
		}
	}
	return s
}

// TestStartedEndStep: a started end of a step has EndStep's results, and a
// call made before waiting for it is applied after it, whether that call
// carries it to the plugin on the data plane (Reserve), travels on gRPC
// (Stats), or the wait sends it alone; refused items come back from the
// wait.
func TestStartedEndStep(t *testing.T) {
	ctx := context.Background()
	prompt := make([]int32, 100)
	for i := range prompt {
		prompt[i] = int32(i + 1)
	}
	for _, next := range []string{"reserve", "stats", "none"} {
		inner := cachemgrv1.New()
		m := pluginrpc.TestManagerPair(t, inner)
		if _, ok := m.(pipeline.StepStarter); !ok {
			t.Fatal("the gRPC client does not implement pipeline.StepStarter")
		}
		if _, err := m.Configure(ctx, endStepConfig()); err != nil {
			t.Fatal(err)
		}
		if g, err := m.Reserve(ctx, []kvcache.ReserveItem{{Seq: 1, New: true, Tokens: 100, Prompt: prompt}, {Seq: 2, New: true, Tokens: 40}}); err != nil || !g[0].OK || !g[1].OK {
			t.Fatalf("Reserve = %+v, %v", g, err)
		}
		wait := pipeline.StartEndStep(ctx, m, pipeline.EndStepRequest{
			Commits: []kvcache.CommitItem{{Seq: 1, Accepted: 100}, {Seq: 2, Accepted: 40}, {Seq: 9, Accepted: 1}},
			Release: []kvcache.SeqID{2},
			Inspect: &kvcache.InspectOptions{},
		})
		switch next {
		case "reserve":
			// Seq 1 can grow only once its commit ended its reservation.
			g, err := m.Reserve(ctx, []kvcache.ReserveItem{{Seq: 1, Tokens: 1, Draft: 1}})
			if err != nil || !g[0].OK {
				t.Fatalf("Reserve after the started end of step = %+v, %v; want granted", g, err)
			}
		case "stats":
			if st, err := m.Stats(ctx); err != nil || st.Sequences != 1 {
				t.Errorf("Stats after the started end of step = %+v, %v; want 1 sequence (seq 2 released)", st, err)
			}
		}
		res, err := wait()
		var ke *kvcache.Error
		if !errors.As(err, &ke) || ke.Kind != kvcache.KindInvalidArg || !slices.Equal(ke.Seqs, []kvcache.SeqID{9}) {
			t.Errorf("next %s: wait error = %v, want an item error about seq 9", next, err)
		}
		if res.Snapshot == nil || len(res.Snapshot.Seqs) != 1 || res.Snapshot.Seqs[0].History != 100 || res.Snapshot.Seqs[0].Reserved != 0 {
			t.Fatalf("next %s: snapshot %+v, want seq 1 alone, history 100, nothing reserved (taken before the next call)", next, res.Snapshot)
		}
		if st, err := m.Stats(ctx); err != nil || st.Sequences != 1 {
			t.Errorf("next %s: Stats = %+v, %v; want 1 sequence (seq 2 released)", next, st, err)
		}
	}
}
