package equiv_test

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/kvx-dev/kvx/cmd/builtin"
	"github.com/kvx-dev/kvx/core/config"
	"github.com/kvx-dev/kvx/core/engine"
	"github.com/kvx-dev/kvx/core/report"
	"github.com/kvx-dev/kvx/core/setup"
	"github.com/kvx-dev/kvx/core/workload"
	"github.com/kvx-dev/kvx/device/hf/hftest"
)

// TestCheckpointMTP runs DeepSeek-V3 and V3.2 checkpoints with MTP layers
// (transformers' goldens plus two random MTP layers, hftest.WriteMTP)
// through the engine with drafts proposed by the checkpoint's MTP layers:
// one and two per step, managers v1 and v2, reuse on and off, small
// chunks, PP 2 and a cache small enough that requests are preempted. Every
// variant's tokens and final logits must equal, bit for bit, the run
// without speculative decoding (which drops the MTP layers), drafts must be
// proposed, and the report must count them. Random MTP layers draft
// tokens the main model almost never confirms, so the quiet variants
// (hftest.MTPSpec.Quiet: a model whose next token mostly follows from the
// last one, and MTP layers that draft that) make most drafts accepted, so
// that accepted drafts and partly accepted pairs flow through the managers.
func TestCheckpointMTP(t *testing.T) {
	for _, c := range []struct {
		name, fam string
		mtp       hftest.MTPSpec
		accept    float64 // the least acceptance of every run with drafts
	}{
		// V3 stores each MTP layer's embed_tokens and shared_head.head as
		// DeepSeek-V3's checkpoint does; V3.2 uses the model's.
		{"deepseek_v3", "deepseek_v3", hftest.MTPSpec{Layers: 2, Seed: 23, Shared: true}, 0},
		{"deepseek_v32", "deepseek_v32", hftest.MTPSpec{Layers: 2, Seed: 29}, 0},
		{"deepseek_v3/quiet", "deepseek_v3", hftest.MTPSpec{Layers: 2, Seed: 31, Quiet: 0.002}, 0.5},
		{"deepseek_v32/quiet", "deepseek_v32", hftest.MTPSpec{Layers: 2, Seed: 37, Quiet: 0.002}, 0.5},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			src := filepath.Join("..", "..", "device", "hf", "testdata", c.fam)
			dir := filepath.Join(t.TempDir(), c.fam+"_mtp")
			if err := os.Mkdir(dir, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := hftest.WriteMTP(src, dir, c.mtp); err != nil {
				t.Fatal(err)
			}
			ps, _, err := hftest.ReadGolden(src)
			if err != nil {
				t.Fatal(err)
			}
			wl := goldenWorkload(ps)
			base := []string{"model=" + dir, "device=cpu", "isolation=inprocess", "enable_chunked_prefill=true", "max_batch_size=4",
				"max_seq_len=256", "kv_cache_config.tokens_per_block=16", "kv_cache_config.max_tokens=4096", "check_invariants=every"}
			mtp1 := []string{"speculative_config.decoding_type=MTP", "speculative_config.max_draft_len=1"}
			mtp2 := []string{"speculative_config.decoding_type=MTP", "speculative_config.max_draft_len=2"}
			variants := []struct {
				name string
				sets []string
			}{
				{"v1", slices.Concat(mtp1, []string{"cache_manager=v1", "kv_cache_config.enable_block_reuse=false", "max_num_tokens=64"})},
				{"v1/reuse", slices.Concat(mtp1, []string{"cache_manager=v1", "kv_cache_config.enable_block_reuse=true", "max_num_tokens=64"})},
				{"v2/reuse", slices.Concat(mtp1, []string{"cache_manager=v2", "kv_cache_config.enable_block_reuse=true", "max_num_tokens=64"})},
				{"v2/chunk=16", slices.Concat(mtp1, []string{"cache_manager=v2", "max_num_tokens=16", "kv_cache_config.tokens_per_block=4"})},
				{"v2/pp=2", slices.Concat(mtp1, []string{"cache_manager=v2", "pipeline_parallel_size=2", "max_num_tokens=64"})},
				// A cache of about two requests, so that MAX_UTILIZATION pauses.
				{"v1/pressure", slices.Concat(mtp1, []string{"cache_manager=v1", "max_num_tokens=64", "max_seq_len=128",
					"kv_cache_config.enable_block_reuse=false", "kv_cache_config.max_tokens=160", "scheduler_config.capacity_scheduler_policy=MAX_UTILIZATION"})},
				{"v2/drafts=2", slices.Concat(mtp2, []string{"cache_manager=v2", "kv_cache_config.enable_block_reuse=true", "max_num_tokens=64"})},
				{"v2/drafts=2/pressure", slices.Concat(mtp2, []string{"cache_manager=v2", "max_num_tokens=64", "max_seq_len=128",
					"kv_cache_config.enable_block_reuse=false", "kv_cache_config.max_tokens=160", "scheduler_config.capacity_scheduler_policy=MAX_UTILIZATION"})},
			}
			// want[e] is the run without drafts with every output e tokens
			// longer: a variant whose last step accepted e drafts past the
			// end reports the logits of its last token, which are want[e]'s
			// final logits.
			var want []report.Report
			for e := range 3 {
				longer := workload.Workload{Concurrency: wl.Concurrency}
				for _, r := range wl.Requests {
					r.OutputLen += e
					longer.Requests = append(longer.Requests, r)
				}
				rep := runCheckpoint(t, "no drafts", slices.Concat(base, []string{"cache_manager=v2", "max_num_tokens=64"}), longer)
				if rep.Tokens.DraftProposed != 0 || rep.Requests.Completed != len(ps) {
					t.Fatalf("no drafts (outputs %d longer): %d drafts proposed, requests %+v: want none, all %d completed", e, rep.Tokens.DraftProposed, rep.Requests, len(ps))
				}
				want = append(want, rep)
			}
			// More drafts than MTP layers: refused at start-up, naming the limit.
			cfg, _, err := config.Load(builtin.Registry(), nil, nil, slices.Concat(base, []string{"plugin_dirs=" + binDir, "cache_manager=v2",
				"max_num_tokens=64", "speculative_config.decoding_type=MTP", "speculative_config.max_draft_len=3"}))
			if err == nil {
				var res *setup.Resolved
				if res, err = setup.Resolve(cfg, "mtp", false); err == nil {
					res.Spec.Workload = wl
					l := setup.NewLauncher(cfg, builtin.Registry(), nil)
					_, err = engine.Run(context.Background(), res.Spec, l)
					l.Close()
				}
			}
			if want := "draft tokens 3 exceed the 2 MTP layers"; err == nil || !strings.Contains(err.Error(), want) {
				t.Errorf("max_draft_len 3: %v, want an error containing %q", err, want)
			} else {
				t.Logf("max_draft_len 3: %v", err)
			}
			for _, v := range variants {
				if c.accept > 0 && !quietVariants[v.name] {
					continue
				}
				rep := runCheckpoint(t, v.name, slices.Concat(base, v.sets), wl)
				if rep.Requests.Completed != len(ps) || rep.Requests.Failed != 0 || rep.Invariants.Violations != 0 {
					t.Fatalf("%s: requests %+v, violations %d: want all %d completed", v.name, rep.Requests, rep.Invariants.Violations, len(ps))
				}
				t.Logf("%s: %d drafts proposed, %d accepted; %d preemptions, %d prompt tokens reused",
					v.name, rep.Tokens.DraftProposed, rep.Tokens.DraftAccepted, rep.Requests.Preemptions, rep.Tokens.PrefixReused)
				switch {
				case rep.Tokens.DraftProposed == 0:
					t.Errorf("%s: no draft proposed", v.name)
				case float64(rep.Tokens.DraftAccepted) < c.accept*float64(rep.Tokens.DraftProposed):
					t.Errorf("%s: %d drafts accepted of %d proposed, want at least %.0f%%", v.name, rep.Tokens.DraftAccepted, rep.Tokens.DraftProposed, 100*c.accept)
				case rep.Tokens.DraftAccepted > rep.Tokens.DraftProposed:
					t.Errorf("%s: %d drafts accepted of %d proposed", v.name, rep.Tokens.DraftAccepted, rep.Tokens.DraftProposed)
				case strings.HasSuffix(v.name, "pressure") && rep.Requests.Preemptions == 0:
					t.Errorf("%s: no request paused", v.name)
				case strings.HasSuffix(v.name, "reuse") && rep.Tokens.PrefixReused == 0:
					t.Errorf("%s: no prefix reused (the goldens pair prompts sharing 56 tokens)", v.name)
				}
				for j, out := range rep.Outputs.Requests {
					w := want[0].Outputs.Requests[j]
					e := out.LogitsAt - w.LogitsAt
					if out.ID != w.ID || !slices.Equal(out.Tokens, w.Tokens) || e < 0 || e >= len(want) {
						t.Errorf("%s: request %d: tokens %v (final logits of token %d), without drafts %v (of token %d): want the same tokens",
							v.name, out.ID, out.Tokens, out.LogitsAt, w.Tokens, w.LogitsAt)
						continue
					}
					if we := want[e].Outputs.Requests[j]; we.LogitsAt != out.LogitsAt || !sameBits(out.Logits, we.Logits) {
						t.Errorf("%s: request %d: the logits of token %d differ from those without drafts (of token %d): %s",
							v.name, out.ID, out.LogitsAt, we.LogitsAt, firstDiff(out.Logits, we.Logits))
					}
				}
			}
		})
	}
}

// quietVariants are those TestCheckpointMTP runs on its quiet checkpoints,
// whose drafts are mostly accepted: one manager each for one and two drafts,
// small chunks and preemption (the others ran on the random ones).
var quietVariants = map[string]bool{"v1": true, "v2/chunk=16": true, "v1/pressure": true, "v2/drafts=2": true, "v2/drafts=2/pressure": true}

// runCheckpoint runs workload wl under the config keys sets and returns the
// report with every request's outputs.
func runCheckpoint(t *testing.T, name string, sets []string, wl workload.Workload) report.Report {
	t.Helper()
	cfg, _, err := config.Load(builtin.Registry(), nil, nil, append([]string{"plugin_dirs=" + binDir}, sets...))
	if err != nil {
		t.Fatalf("%s: config: %v", name, err)
	}
	res, err := setup.Resolve(cfg, "mtp", false)
	if err != nil {
		t.Fatalf("%s: resolve: %v", name, err)
	}
	res.Spec.Workload = wl
	res.Spec.KeepOutputs = true
	l := setup.NewLauncher(cfg, builtin.Registry(), nil)
	defer l.Close()
	rep, err := engine.Run(context.Background(), res.Spec, l)
	if err != nil {
		t.Fatalf("%s: run: %v", name, err)
	}
	return rep
}
