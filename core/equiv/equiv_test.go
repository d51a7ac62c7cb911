package equiv_test

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/kvx-dev/kvx/cmd/builtin"
	"github.com/kvx-dev/kvx/core/config"
	"github.com/kvx-dev/kvx/core/engine"
	"github.com/kvx-dev/kvx/core/report"
	"github.com/kvx-dev/kvx/core/setup"
	"github.com/kvx-dev/kvx/core/testbin"
	"github.com/kvx-dev/kvx/core/workload"
	"github.com/kvx-dev/kvx/device/cpu"
)

// binDir holds the plugin binaries for isolation: plugin, built once.
var binDir string

func TestMain(m *testing.M) { testbin.Main(m, &binDir) }

// family is one model family on the cpu device: a preset scaled down by
// synthetic.* keys, the backend that runs it and the managers that serve it.
type family struct {
	name     string
	sets     []string
	mtp      []string // speculative decoding keys, left out where a step holds one token
	managers []string
	noReuse  string // a manager that reuses no prefix of this family (v1 on hybrids: no SSM reuse)
}

// Small shapes keep the suite in CI time: each model runs its requests
// through a dozen variants, and the reference recomputes every prefix.
var families = []family{
	{"gqa", []string{"model=llama-3.1-8b", "attention_backend=gqa",
		"synthetic.layers=3", "synthetic.hidden=48", "synthetic.heads=4", "synthetic.kv_heads=2", "synthetic.head_dim=12", "synthetic.intermediate=96"},
		nil, []string{"v1", "v2"}, ""},
	{"mla", []string{"model=deepseek-v3", "attention_backend=mla",
		"synthetic.layers=3", "synthetic.hidden=48", "synthetic.heads=4", "synthetic.experts=4", "synthetic.experts_per_token=2"},
		[]string{"speculative_config.decoding_type=MTP", "speculative_config.max_draft_len=1"}, []string{"v1", "v2"}, ""},
	{"dsa", []string{"model=deepseek-v3.2", "attention_backend=dsa",
		"synthetic.layers=3", "synthetic.hidden=48", "synthetic.heads=4", "synthetic.experts=4", "synthetic.experts_per_token=2", "synthetic.index_topk=24"},
		[]string{"speculative_config.decoding_type=MTP", "speculative_config.max_draft_len=1"}, []string{"v1", "v2"}, ""},
	{"mamba-hybrid", []string{"model=nemotron-3-nano-30b-a3b", "attention_backend=gqa",
		"synthetic.layers=4", "synthetic.hidden=48", "synthetic.experts=4", "synthetic.experts_per_token=2",
		"mamba_state_config.periodic_snapshot_interval=32", "mamba_state_config.additional_snapshot_offsets_from_end=[0]"},
		nil, []string{"v1", "mamba"}, "v1"},
}

// common are the keys every run shares: the cpu device, chunked prefill, a
// generated workload with shared prefixes (so reuse has something to find),
// and a cache of 16,384 tokens: four times what the whole workload holds
// (6 requests of at most 172 tokens, each as 4 choices in the forked
// runs), so nothing is evicted or paused where a variant sets no smaller
// one (pressure, small-cache and host-tier do, and check that they paused
// or reused from the host), yet small enough that the deep checks, which
// walk every block of a pool, and the cpu device's pools cost little (the
// default, 90% of setup.CPUMemoryBytes a stage, holds far more blocks of
// these small models: clearing and checking them took more than half the
// suite's CPU time, 54 CPU-s against 24).
var common = []string{
	"device=cpu", "seed=11", "enable_chunked_prefill=true", "max_batch_size=4", "max_seq_len=512",
	"kv_cache_config.tokens_per_block=16", "kv_cache_config.max_tokens=16384", "check_invariants=every", "deep_check_every=4",
	"workload.requests=6", "workload.prompt_tokens={min: 60, max: 160}", "workload.output_tokens={min: 4, max: 12}",
	"workload.shared_prefix_tokens=48", "workload.shared_prefix_groups=2", "workload.seed=5", "workload.concurrency=4",
}

// variant is one way to run the same requests: the outputs must not change.
type variant struct {
	name string
	sets []string
}

func variants(f family) []variant {
	var vs []variant
	add := func(name string, sets ...string) { vs = append(vs, variant{name, slices.Concat(f.mtp, sets)}) }
	for _, m := range f.managers {
		for _, reuse := range []string{"true", "false"} {
			add(fmt.Sprintf("%s/reuse=%s", m, reuse), "cache_manager="+m, "kv_cache_config.enable_block_reuse="+reuse, "max_num_tokens=64")
		}
		add(m+"/chunk=7", "cache_manager="+m, "max_num_tokens=7", "max_batch_size=1", "kv_cache_config.tokens_per_block=4")
		add(m+"/chunk=max", "cache_manager="+m, "max_num_tokens=512")
		add(m+"/pp=2", "cache_manager="+m, "pipeline_parallel_size=2", "max_num_tokens=64")
		// A cache of a few requests' worth, so that MAX_UTILIZATION pauses.
		add(m+"/pressure", "cache_manager="+m, "max_num_tokens=64", "max_seq_len=176", "kv_cache_config.max_tokens=224",
			"scheduler_config.capacity_scheduler_policy=MAX_UTILIZATION")
		add(m+"/plugin", "cache_manager="+m, "isolation=plugin", "max_num_tokens=64")
	}
	for _, m := range f.managers {
		if m == f.noReuse {
			continue
		}
		// A device cache of a few requests' worth, with and without a host
		// tier: blocks (and mamba's snapshots) evicted from the device come
		// back from the host.
		small := []string{"cache_manager=" + m, "kv_cache_config.enable_block_reuse=true", "max_num_tokens=64",
			"max_seq_len=160", "kv_cache_config.max_tokens=176"}
		add(m+"/small-cache", small...)
		add(m+"/host-tier", append(small, "kv_cache_config.host_cache_size=64000000")...)
	}
	// One token per step: no room for drafts, so without MTP (the outputs
	// do not depend on it: drafts only change how many tokens a step keeps).
	vs = append(vs, variant{f.managers[0] + "/chunk=1", []string{"cache_manager=" + f.managers[0], "max_num_tokens=1", "max_batch_size=1", "kv_cache_config.tokens_per_block=1"}})
	return vs
}

// run runs one variant and returns its report with every request's outputs.
func run(t *testing.T, sets []string) (report.Report, *config.Config) {
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
	l := setup.NewLauncher(cfg, builtin.Registry(), nil)
	defer l.Close()
	rep, err := engine.Run(context.Background(), res.Spec, l)
	if err != nil {
		t.Fatalf("run: %v", err)
	}
	return rep, cfg
}

// oracle is the dense reference of one family: every request generated
// greedily with no cache, recomputing the whole prefix per token.
type oracle struct {
	mu   sync.Mutex
	ref  *cpu.Reference
	reqs map[uint64]workload.Request
	memo map[string]refOut
}

type refOut struct {
	tokens []int32
	logits []float32
}

func newOracle(t *testing.T, cfg *config.Config, wl workload.Workload) *oracle {
	t.Helper()
	res, err := setup.Resolve(cfg, "reference", false)
	if err != nil {
		t.Fatal(err)
	}
	b := builtin.Backend(cfg.AttentionBackend)
	if b == nil {
		t.Fatalf("attention backend %q is not built in", cfg.AttentionBackend)
	}
	ref, err := cpu.NewReference(res.Model, cfg.Seed, b.Kernel)
	if err != nil {
		t.Fatalf("reference: %v", err)
	}
	o := &oracle{ref: ref, reqs: map[uint64]workload.Request{}, memo: map[string]refOut{}}
	for _, r := range wl.Requests {
		o.reqs[r.ID] = r
	}
	return o
}

// generate returns the reference's first n tokens of request id and the
// logits that sampled the last of them.
func (o *oracle) generate(t *testing.T, id uint64, n int) refOut {
	t.Helper()
	key := fmt.Sprint(id, "/", n)
	o.mu.Lock()
	defer o.mu.Unlock()
	if r, ok := o.memo[key]; ok {
		return r
	}
	toks, logits, err := o.ref.Generate(context.Background(), o.reqs[id].Prompt, n)
	if err != nil {
		t.Fatalf("reference request %d: %v", id, err)
	}
	o.memo[key] = refOut{toks, logits}
	return o.memo[key]
}

// compare checks every request of rep against the oracle bit for bit and
// returns a description of the first divergence ("" when none).
func compare(t *testing.T, o *oracle, rep report.Report) string {
	t.Helper()
	if rep.Requests.Completed != rep.Requests.Total || rep.Requests.Failed != 0 || rep.Invariants.Violations != 0 {
		return fmt.Sprintf("requests %+v, violations %d: want all completed, none failed", rep.Requests, rep.Invariants.Violations)
	}
	for _, out := range rep.Outputs.Requests {
		want := o.generate(t, out.ID, max(len(out.Tokens), out.LogitsAt+1))
		if !slices.Equal(out.Tokens, want.tokens[:len(out.Tokens)]) {
			return fmt.Sprintf("request %d: tokens %v, reference %v", out.ID, out.Tokens, want.tokens[:len(out.Tokens)])
		}
		if out.Logits == nil {
			return fmt.Sprintf("request %d: no logits", out.ID)
		}
		if out.LogitsAt+1 == len(want.tokens) && !sameBits(out.Logits, want.logits) {
			return fmt.Sprintf("request %d: final logits (of token %d) differ from the reference: %s", out.ID, out.LogitsAt, firstDiff(out.Logits, want.logits))
		}
	}
	return ""
}

func sameBits(a, b []float32) bool {
	return len(a) == len(b) && firstDiff(a, b) == ""
}

func firstDiff(a, b []float32) string {
	if len(a) != len(b) {
		return fmt.Sprintf("%d values, reference %d", len(a), len(b))
	}
	for i := range a {
		if math.Float32bits(a[i]) != math.Float32bits(b[i]) {
			return fmt.Sprintf("logit %d: %v (%#08x), reference %v (%#08x)", i, a[i], math.Float32bits(a[i]), b[i], math.Float32bits(b[i]))
		}
	}
	return ""
}

// TestEquivalence is the metamorphic suite of the cpu device: the same
// seeded requests through every manager, both isolation modes, reuse on and
// off, chunk sizes 1, 7, 64 and max_num_tokens, PP 1 and 2, and a cache so
// small that requests pause, give the tokens and final logits of the dense
// no-cache reference, bit for bit.
func TestEquivalence(t *testing.T) {
	for _, f := range families {
		t.Run(f.name, func(t *testing.T) {
			t.Parallel() // the families share nothing: each its own runs and reference
			var o *oracle
			smallReused := map[string]int64{} // per manager
			for _, v := range variants(f) {
				sets := slices.Concat(common, f.sets, v.sets)
				rep, cfg := run(t, sets)
				if o == nil {
					wl, err := setup.Workload(cfg, cfg.ModelSpec().Vocab)
					if err != nil {
						t.Fatal(err)
					}
					o = newOracle(t, cfg, wl)
				}
				if d := compare(t, o, rep); d != "" {
					t.Errorf("%s (seed %d, sets %s): %s", v.name, cfg.Seed, strings.Join(sets, " "), d)
				}
				// The variants must do what they are named for.
				m, _, _ := strings.Cut(v.name, "/")
				if strings.HasSuffix(v.name, "/small-cache") {
					smallReused[m] = rep.Tokens.PrefixReused
				}
				small, ran := smallReused[m]
				if strings.HasSuffix(v.name, "/host-tier") {
					t.Logf("%s: %d prompt tokens reused (%d from the host tier), %d without the host tier",
						v.name, rep.Tokens.PrefixReused, rep.Tokens.PrefixReusedByTier.Host, small)
				}
				switch {
				case strings.HasSuffix(v.name, "/host-tier") && (!ran || rep.Tokens.PrefixReused <= small ||
					rep.Tokens.PrefixReusedByTier.Host == 0 || !hasHostPool(rep)):
					// The outputs above are the dense reference's, so the
					// blocks that came back from the host held the right KV.
					t.Errorf("%s: %d tokens reused (%d from the host tier), %d without the host tier (host pool in the layout: %v); want more, some from the host",
						v.name, rep.Tokens.PrefixReused, rep.Tokens.PrefixReusedByTier.Host, small, hasHostPool(rep))
				case strings.HasSuffix(v.name, "/pressure") && rep.Requests.Preemptions == 0:
					t.Errorf("%s: no request paused", v.name)
				case strings.HasSuffix(v.name, "reuse=true") && rep.Tokens.PrefixReused == 0 && !strings.HasPrefix(v.name, f.noReuse+"/"):
					t.Errorf("%s: no prefix reused", v.name)
				case strings.HasSuffix(v.name, "reuse=false") && rep.Tokens.PrefixReused != 0:
					t.Errorf("%s: %d tokens reused with reuse off", v.name, rep.Tokens.PrefixReused)
				case strings.HasSuffix(v.name, "/plugin") && rep.Config.Isolation != "plugin":
					t.Errorf("%s: ran with isolation %q", v.name, rep.Config.Isolation)
				}
			}
		})
	}
}

func hasHostPool(rep report.Report) bool {
	for _, st := range rep.KV.Stages {
		for _, p := range st.Pools {
			if p.Tier == "host" && p.Blocks > 0 {
				return true
			}
		}
	}
	return false
}
