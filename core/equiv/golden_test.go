package equiv_test

import (
	"context"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/kvx-dev/kvx/cmd/builtin"
	"github.com/kvx-dev/kvx/core/config"
	"github.com/kvx-dev/kvx/core/engine"
	"github.com/kvx-dev/kvx/core/setup"
	"github.com/kvx-dev/kvx/core/workload"
	"github.com/kvx-dev/kvx/device/hf/hftest"
)

// TestCheckpointGoldens runs transformers' goldens (device/hf/testdata) as
// `model: DIR` through the real engine (scheduler, managers, cpu workers
// in-process and as plugins) for managers v1 and v2 with reuse on and
// off, chunked prefill and PP 2. Every variant must give the same tokens
// and final logits bit for bit, and its tokens must equal transformers'
// or, at the first difference, be in transformers' top-5 (the kvx side of
// the vLLM rule, with per-step logprobs, is device/cpu's TestGoldens).
func TestCheckpointGoldens(t *testing.T) {
	for _, fam := range []string{"llama", "llama_tied", "mistral", "qwen3", "extra/llama_yarn", "extra/qwen3_swa", "deepseek_v3", "deepseek_v32", "nemotron_h", "qwen3_next"} {
		t.Run(fam, func(t *testing.T) {
			t.Parallel() // the families share nothing: each its own runs and reference
			dir, err := filepath.Abs(filepath.Join("..", "..", "device", "hf", "testdata", fam))
			if err != nil {
				t.Fatal(err)
			}
			ps, es, err := hftest.ReadGolden(dir)
			if err != nil {
				t.Fatal(err)
			}
			wl := goldenWorkload(ps)
			// A cache of 4,096 tokens: about three times what a golden's
			// twelve prompts and outputs hold in whole blocks, so nothing
			// is evicted. The default (90% of setup.CPUMemoryBytes a
			// stage) gave the ten families 1.5 GB of pools to clear and
			// check, a quarter of the test's CPU time.
			base := []string{"model=" + dir, "device=cpu", "enable_chunked_prefill=true", "max_batch_size=4", "max_seq_len=256",
				"kv_cache_config.tokens_per_block=16", "kv_cache_config.max_tokens=4096", "check_invariants=every"}
			var first [][]int32
			var firstLogits [][]float32
			variants := [][]string{
				{"cache_manager=v1", "kv_cache_config.enable_block_reuse=false", "max_num_tokens=64"},
				{"cache_manager=v1", "kv_cache_config.enable_block_reuse=true", "max_num_tokens=64"},
				{"cache_manager=v2", "kv_cache_config.enable_block_reuse=false", "max_num_tokens=64"},
				{"cache_manager=v2", "kv_cache_config.enable_block_reuse=true", "max_num_tokens=64"},
				{"cache_manager=v2", "max_num_tokens=16", "kv_cache_config.tokens_per_block=4"},
				{"cache_manager=v2", "pipeline_parallel_size=2", "max_num_tokens=64"},
				{"cache_manager=v2", "isolation=plugin", "max_num_tokens=64"},
			}
			if hybridGoldens[fam] {
				variants = hybridVariants
			}
			for _, v := range variants {
				name := strings.Join(v, " ")
				sets := append(slices.Clone(base), v...)
				if !slices.Contains(v, "isolation=plugin") {
					sets = append(sets, "isolation=inprocess")
				}
				cfg, _, err := config.Load(builtin.Registry(), nil, nil, append([]string{"plugin_dirs=" + binDir}, sets...))
				if err != nil {
					t.Fatalf("%s: config: %v", name, err)
				}
				if cfg.KVCache.Dtype != "float32" {
					t.Errorf("%s: kv_cache_config.dtype auto resolved to %q for a float32 checkpoint, want float32", name, cfg.KVCache.Dtype)
				}
				res, err := setup.Resolve(cfg, "golden", false)
				if err != nil {
					t.Fatalf("%s: resolve: %v", name, err)
				}
				res.Spec.Workload = wl
				res.Spec.KeepOutputs = true
				l := setup.NewLauncher(cfg, builtin.Registry(), nil)
				rep, err := engine.Run(context.Background(), res.Spec, l)
				l.Close()
				if err != nil {
					t.Fatalf("%s: run: %v", name, err)
				}
				if rep.Requests.Completed != len(ps) || rep.Requests.Failed != 0 || rep.Invariants.Violations != 0 {
					t.Fatalf("%s: requests %+v, violations %d: want all %d completed", name, rep.Requests, rep.Invariants.Violations, len(ps))
				}
				if strings.Contains(name, "reuse=true") && rep.Tokens.PrefixReused == 0 {
					t.Errorf("%s: no prefix reused (the goldens pair prompts sharing 56 tokens)", name)
				}
				exact := 0
				var toks [][]int32
				var logits [][]float32
				for _, out := range rep.Outputs.Requests {
					toks = append(toks, out.Tokens)
					logits = append(logits, out.Logits)
					e := es[out.ID]
					d := firstDifference(out.Tokens, e.OutputIDs)
					switch {
					case d < 0:
						exact++
					case d >= len(e.TopLogprobs) || !inTop(out.Tokens[d], e.TopLogprobs[d]):
						t.Errorf("%s: prompt %d: tokens %v, transformers %v: token %d at step %d is not in transformers' top-5",
							name, out.ID, out.Tokens, e.OutputIDs, out.Tokens[min(d, len(out.Tokens)-1)], d)
					}
				}
				t.Logf("%s: %d of %d prompts token-exact with transformers, %d prompt tokens reused", name, exact, len(ps), rep.Tokens.PrefixReused)
				if first == nil {
					first, firstLogits = toks, logits
					continue
				}
				for i := range toks {
					if !slices.Equal(toks[i], first[i]) || !sameBits(logits[i], firstLogits[i]) {
						t.Errorf("%s: prompt %d: tokens %v (or final logits) differ from the first variant's %v", name, i, toks[i], first[i])
					}
				}
			}
		})
	}
}

// hybridGoldens are the goldens of hybrid models (Mamba2: Nemotron-H; Gated
// DeltaNet: Qwen3-Next), which managers v1 (fixed state slots, no SSM
// reuse) and mamba (snapshots) serve.
var hybridGoldens = map[string]bool{"nemotron_h": true, "qwen3_next": true}

// hybridVariants are the hybrids' engine variants: v1 and mamba, reuse on
// and off (mamba snapshots every 16 tokens, so the goldens' pairs sharing 56
// prompt tokens reuse 48), chunked prefill with small blocks, PP 2 and
// plugin isolation.
var hybridVariants = [][]string{
	{"cache_manager=v1", "kv_cache_config.enable_block_reuse=false", "max_num_tokens=64"},
	{"cache_manager=mamba", "kv_cache_config.enable_block_reuse=false", "max_num_tokens=64"},
	{"cache_manager=mamba", "kv_cache_config.enable_block_reuse=true", "mamba_state_config.periodic_snapshot_interval=16", "max_num_tokens=64"},
	{"cache_manager=mamba", "kv_cache_config.enable_block_reuse=true", "mamba_state_config.periodic_snapshot_interval=8",
		"max_num_tokens=16", "kv_cache_config.tokens_per_block=4"},
	{"cache_manager=mamba", "pipeline_parallel_size=2", "max_num_tokens=64"},
	{"cache_manager=mamba", "isolation=plugin", "max_num_tokens=64"},
}

// firstDifference is the first step where got and want differ (a missing
// token counts), -1 when equal.
func firstDifference(got, want []int32) int {
	for i := range max(len(got), len(want)) {
		if i >= len(got) || i >= len(want) || got[i] != want[i] {
			return i
		}
	}
	return -1
}

func inTop(tok int32, top [][2]float64) bool {
	for _, p := range top {
		if int32(p[0]) == tok {
			return true
		}
	}
	return false
}

// goldenWorkload is a golden's prompts as a workload of four in flight,
// each asking for the golden's output length.
func goldenWorkload(ps []hftest.Prompt) workload.Workload {
	wl := workload.Workload{Concurrency: 4}
	for i, p := range ps {
		wl.Requests = append(wl.Requests, workload.Request{ID: uint64(i), Prompt: slices.Clip(p.PromptIDs), OutputLen: p.MaxTokens})
	}
	return wl
}
