package equiv_test

import (
	"context"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/kvx-dev/kvx/cmd/builtin"
	"github.com/kvx-dev/kvx/core/config"
	"github.com/kvx-dev/kvx/core/engine"
	"github.com/kvx-dev/kvx/core/report"
	"github.com/kvx-dev/kvx/core/setup"
	"github.com/kvx-dev/kvx/plugins/v1/worker"
)

// runDecoded is run with every request sampled (sampledParams), its
// logprobs asked for, and the stop ids stopIDs gives it.
func runDecoded(t *testing.T, sets []string, stopIDs func(id uint64) []int32) report.Report {
	t.Helper()
	cfg, _, err := config.Load(builtin.Registry(), nil, nil, append([]string{"isolation=inprocess", "plugin_dirs=" + binDir}, sets...))
	if err != nil {
		t.Fatalf("config: %v", err)
	}
	res, err := setup.Resolve(cfg, "equiv", true)
	if err != nil {
		t.Fatalf("resolve: %v", err)
	}
	res.Spec.KeepOutputs = true
	for i := range res.Spec.Workload.Requests {
		r := &res.Spec.Workload.Requests[i]
		r.Decoding.Sampling = sampledParams(r.ID)
		r.Decoding.Logprobs = true
		r.Decoding.StopIDs = stopIDs(r.ID)
	}
	l := setup.NewLauncher(cfg, builtin.Registry(), nil)
	defer l.Close()
	rep, err := engine.Run(context.Background(), res.Spec, l)
	if err != nil {
		t.Fatalf("run: %v", err)
	}
	return rep
}

// sampledParams are the sampling of request id: every rule of
// worker.Sampling at once, a seed of its own.
func sampledParams(id uint64) *worker.Sampling {
	return &worker.Sampling{Temperature: 0.9, TopP: 0.92, TopK: 30, MinP: 0.02, Seed: 1000 + id,
		PresencePenalty: 0.3, FrequencyPenalty: 0.1, RepetitionPenalty: 1.05}
}

// TestSampledEquivalence: seeded sampled requests (temperature, top_p,
// top_k, min_p, penalties; one seed each) give the same tokens and
// logprobs, hence one digest, through every manager, both isolation modes,
// reuse on and off, chunk sizes 1, 7, 64 and max_num_tokens, PP 1 and 2,
// MTP drafts (mla) and a cache so small that requests are preempted and
// recomputed. The same requests with a stop id (the third token each
// generated) end at its first occurrence, finish_reason "stop", everywhere,
// with the tokens before it unchanged. The sampled tokens are not the
// greedy ones.
func TestSampledEquivalence(t *testing.T) {
	none := func(uint64) []int32 { return nil }
	for _, f := range families[:2] {
		t.Run(f.name, func(t *testing.T) {
			t.Parallel() // the families share nothing: each its own runs and reference
			var ref, refStop report.Report
			var first string
			var stops map[uint64]int32
			for _, v := range variants(f) {
				sets := slices.Concat(common, f.sets, v.sets)
				rep := runDecoded(t, sets, none)
				if rep.Requests.Completed != rep.Requests.Total || rep.Invariants.Violations != 0 {
					t.Fatalf("%s: requests %+v, violations %d", v.name, rep.Requests, rep.Invariants.Violations)
				}
				if strings.HasSuffix(v.name, "/pressure") && rep.Requests.Preemptions == 0 {
					t.Errorf("%s: no request preempted", v.name)
				}
				if first == "" {
					first, ref = v.name, rep
					stops = map[uint64]int32{}
					for _, o := range rep.Outputs.Requests {
						if len(o.Tokens) > 2 {
							stops[o.ID] = o.Tokens[2]
						}
					}
					greedy, _ := run(t, sets)
					if greedy.Outputs.Digest == rep.Outputs.Digest {
						t.Errorf("%s: the sampled outputs are the greedy ones (digest %s)", v.name, rep.Outputs.Digest)
					}
				} else if d := diffOutputs(rep, ref); d != "" {
					t.Errorf("%s (sets %s): %s; want %s's", v.name, strings.Join(sets, " "), d, first)
				}
				stopped := runDecoded(t, sets, func(id uint64) []int32 {
					if s, ok := stops[id]; ok {
						return []int32{s}
					}
					return nil
				})
				if refStop.Outputs.Requests == nil {
					refStop = stopped
					for i, o := range stopped.Outputs.Requests {
						want, reason := ref.Outputs.Requests[i].Tokens, "length"
						if s, ok := stops[o.ID]; ok {
							want, reason = want[:slices.Index(want, s)+1], "stop"
						}
						if !slices.Equal(o.Tokens, want) || o.FinishReason != reason {
							t.Errorf("%s with stop ids: request %d: tokens %v (%s), want %v (%s)", v.name, o.ID, o.Tokens, o.FinishReason, want, reason)
						}
					}
				} else if d := diffOutputs(stopped, refStop); d != "" {
					t.Errorf("%s with stop ids: %s; want %s's", v.name, d, first)
				}
			}
		})
	}
}

// diffOutputs describes the first difference of tokens, logprobs or finish
// reasons between two runs ("" when none).
func diffOutputs(a, b report.Report) string {
	if a.Outputs.Digest != b.Outputs.Digest {
		for i := range min(len(a.Outputs.Requests), len(b.Outputs.Requests)) {
			x, y := a.Outputs.Requests[i], b.Outputs.Requests[i]
			if !slices.Equal(x.Tokens, y.Tokens) {
				return fmt.Sprintf("digest %s: request %d: tokens %v", a.Outputs.Digest, x.ID, x.Tokens)
			}
		}
		return "digest " + a.Outputs.Digest
	}
	for i := range a.Outputs.Requests {
		x, y := a.Outputs.Requests[i], b.Outputs.Requests[i]
		if !reflect.DeepEqual(x.Logprobs, y.Logprobs) || len(x.Logprobs) != len(x.Tokens) {
			return fmt.Sprintf("request %d: logprobs %v, want %v (one per token)", x.ID, x.Logprobs, y.Logprobs)
		}
		if x.FinishReason != y.FinishReason {
			return fmt.Sprintf("request %d: finish_reason %q", x.ID, x.FinishReason)
		}
	}
	return ""
}
