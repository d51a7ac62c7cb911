package cpu_test

import (
	"cmp"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/kvx-dev/kvx/device"
	"github.com/kvx-dev/kvx/device/cpu"
	"github.com/kvx-dev/kvx/device/hf"
	"github.com/kvx-dev/kvx/device/hf/hftest"
	"github.com/kvx-dev/kvx/device/synth"
	"github.com/kvx-dev/kvx/internal/race"
	"github.com/kvx-dev/kvx/plugins/model"
	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
	"github.com/kvx-dev/kvx/plugins/v1/spec"
)

// lpTol is the largest logprob difference (absolute) allowed against the
// oracle on the ids both sides have.
const lpTol = 1e-3

// checkpointModel loads dir as the engine does (plugins/model), with TP-1
// buffers at the checkpoint's KV dtype.
func checkpointModel(t testing.TB, dir, kv string) spec.Model {
	t.Helper()
	m, err := model.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	if m.Checkpoint == "" {
		t.Fatalf("model.Load(%s): no Checkpoint", dir)
	}
	if err := model.FillBuffers(&m, model.Dtypes{KV: kv}, 1); err != nil {
		t.Fatal(err)
	}
	return m
}

// goldenRun generates every prompt on the cpu device through real managers
// (manager, reuse, chunk size and pp as given) and returns the tokens and
// per-step logits, in prompt order. All prompts run in the same batches;
// with reuse on, one after another instead, so that a prompt sharing a
// prefix with an earlier one finds it cached.
func goldenRun(t *testing.T, m spec.Model, ps []hftest.Prompt, o opts, chunk int) []*req {
	t.Helper()
	maxSeq := 0
	for _, p := range ps {
		maxSeq = max(maxSeq, len(p.PromptIDs)+p.MaxTokens)
	}
	o.backend, o.maxSeq = backendOf(m), maxSeq
	o.kv = "float32"
	r := newRig(t, m, o)
	var reqs []*req
	for i, p := range ps {
		reqs = append(reqs, &req{seq: kvcache.SeqID(100 + i), prompt: p.PromptIDs, want: p.MaxTokens, chunk: chunk})
	}
	if o.reuse {
		for _, q := range reqs {
			r.run([]*req{q})
		}
	} else {
		r.run(reqs)
	}
	return reqs
}

// compareGolden applies the vLLM rule to every request against exp and
// returns the comparisons.
func compareGolden(reqs []*req, exp []hftest.Expected) []hftest.Comparison {
	var cs []hftest.Comparison
	for i, q := range reqs {
		lps := make([][]float64, len(q.steps))
		for j, lg := range q.steps {
			lps[j] = hftest.LogSoftmax(lg)
		}
		cs = append(cs, hftest.Compare(exp[i], q.out[:min(len(q.out), len(exp[i].OutputIDs))], lps, 5))
	}
	return cs
}

// ownGolden writes a tiny checkpoint of family fam and its expected
// outputs from hftest.Generate (the float64 oracle) in the golden format.
func ownGolden(t *testing.T, s hftest.Spec) (string, []hftest.Prompt, []hftest.Expected) {
	t.Helper()
	dir := filepath.Join(t.TempDir(), s.Family)
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := hftest.Write(dir, s); err != nil {
		t.Fatal(err)
	}
	shared := prompt(40, 9, s.Vocab)
	ps := []hftest.Prompt{
		{PromptIDs: prompt(1, 1, s.Vocab), MaxTokens: 6},
		{PromptIDs: prompt(9, 2, s.Vocab), MaxTokens: 8},
		{PromptIDs: prompt(23, 3, s.Vocab), MaxTokens: 10},
		{PromptIDs: append(slices.Clone(shared), prompt(5, 4, s.Vocab)...), MaxTokens: 8},
		{PromptIDs: append(slices.Clone(shared), prompt(7, 5, s.Vocab)...), MaxTokens: 8},
	}
	var es []hftest.Expected
	for _, p := range ps {
		toks, lps, err := hftest.Generate(dir, p.PromptIDs, p.MaxTokens)
		if err != nil {
			t.Fatal(err)
		}
		e := hftest.Expected{OutputIDs: toks}
		for _, lp := range lps {
			var top [][2]float64
			for _, id := range hftest.TopK(lp, 5) {
				top = append(top, [2]float64{float64(id), lp[id]})
			}
			e.TopLogprobs = append(e.TopLogprobs, top)
		}
		es = append(es, e)
	}
	return dir, ps, es
}

// ownSpecs are the checkpoints written here: every family, GQA, a window
// shorter than the prompts (mistral), tied embeddings and biases (qwen3).
var ownSpecs = []hftest.Spec{
	{Family: "llama", Hidden: 32, Layers: 2, Heads: 4, KVHeads: 2, HeadDim: 8, Intermediate: 64, Vocab: 96, MaxPosition: 128, Seed: 1},
	{Family: "mistral", Hidden: 32, Layers: 2, Heads: 4, KVHeads: 1, HeadDim: 8, Intermediate: 48, Vocab: 80, MaxPosition: 128, Window: 12, Seed: 2},
	{Family: "qwen3", Hidden: 32, Layers: 2, Heads: 2, KVHeads: 1, HeadDim: 16, Intermediate: 48, Vocab: 90, MaxPosition: 128, Tied: true, Bias: true, Theta: 1e6, Seed: 3},
	// bf16 weights, read as float32 (the oracle reads the same bits).
	{Family: "llama", Hidden: 32, Layers: 2, Heads: 4, KVHeads: 4, HeadDim: 8, Intermediate: 64, Vocab: 70, MaxPosition: 128, Dtype: "BF16", Seed: 5},
}

// checkAll fails the test for every comparison that breaks the rule or
// whose logprobs are off by more than lpTol, and returns the exact count
// and the largest difference.
func checkAll(t *testing.T, name string, cs []hftest.Comparison) (exact int, worst float64) {
	t.Helper()
	for i, c := range cs {
		if !c.OK {
			t.Errorf("%s prompt %d: %s", name, i, c.Reason)
		}
		if c.MaxLPDiff > lpTol {
			t.Errorf("%s prompt %d: logprob difference %.2e > %.0e (%s)", name, i, c.MaxLPDiff, lpTol, c.Worst)
		}
		if c.Exact {
			exact++
		}
		worst = max(worst, c.MaxLPDiff)
	}
	return exact, worst
}

// TestOwnCheckpoints runs checkpoints written here (float32 weights)
// against the float64 oracle of package hftest, through managers v1 and v2
// with reuse on and off: same tokens by the vLLM rule, logprobs within
// lpTol, and every variant's tokens and logits bit-identical.
func TestOwnCheckpoints(t *testing.T) {
	skipUnderRace(t)
	for _, s := range ownSpecs {
		t.Run(s.Family+"/"+cmp.Or(s.Dtype, "F32"), func(t *testing.T) {
			dir, ps, es := ownGolden(t, s)
			m := checkpointModel(t, dir, "float32")
			var first []*req
			for _, v := range []struct {
				mgr   string
				reuse bool
				chunk int
				pp    int
			}{{"v1", false, 0, 1}, {"v1", true, 0, 1}, {"v2", false, 0, 1}, {"v2", true, 5, 1}, {"v2", true, 0, 2}} {
				name := fmt.Sprintf("%s/reuse=%v/chunk=%d/pp=%d", v.mgr, v.reuse, v.chunk, v.pp)
				reqs := goldenRun(t, m, ps, opts{manager: v.mgr, reuse: v.reuse, pp: v.pp}, v.chunk)
				exact, worst := checkAll(t, name, compareGolden(reqs, es))
				if reused := reqs[len(reqs)-1].reused; v.reuse && reused == 0 {
					t.Errorf("%s: the last prompt reused no prefix of the one before it", name)
				}
				t.Logf("%s: %d of %d prompts token-exact, largest logprob difference %.2e", name, exact, len(ps), worst)
				if first == nil {
					first = reqs
					continue
				}
				for i, q := range reqs {
					if !slices.Equal(q.out, first[i].out) || !sameBits(q.logits, first[i].logits) {
						t.Errorf("%s prompt %d: tokens %v differ from the first variant's %v (or their logits' bits)", name, i, q.out, first[i].out)
					}
				}
			}
		})
	}
}

// goldenFamilies are the transformers goldens of device/hf/testdata this
// package's model code runs: the main set (scripts/hf_goldens.py) and
// extra/ (device/hf/testdata/extra/make.py: yarn RoPE with attention and
// MLP biases; Qwen3 with a sliding window on two of three layers).
var goldenFamilies = []string{"llama", "llama_tied", "mistral", "qwen3", "extra/llama_yarn", "extra/qwen3_swa", "deepseek_v3", "deepseek_v32"}

// backendOf is the backend that runs m's mixers: mla or dsa for the
// DeepSeek families, else gqa.
func backendOf(m spec.Model) string {
	switch m.Layers[0].Mixer {
	case spec.MixerMLA:
		return "mla"
	case spec.MixerDSA:
		return "dsa"
	}
	return "gqa"
}

func goldenDir(fam string) string { return filepath.Join("..", "hf", "testdata", fam) }

// skipUnderRace skips a numerical check in the race detector's pass (make
// test-race): the goldens, the checks that show a check has teeth and the
// kernel choice are single-threaded numerical checks that the normal pass
// runs in full; under -race the goldens took about 290 of the package's
// 400 s, and the rest 40 of its 112. The device's parallel loops are raced
// by the equivalence and metamorphic tests, which still run there.
func skipUnderRace(t *testing.T) {
	t.Helper()
	if race.Enabled {
		t.Skip("a numerical check: run without -race (make test's main pass)")
	}
}

// TestGoldens runs transformers' goldens (device/hf/testdata, made by
// scripts/hf_goldens.py) on the cpu device through managers v1 and v2 with
// reuse on and off: every prompt passes the vLLM rule, the logprobs of
// transformers' top-5 ids are within lpTol at every compared step, and
// every variant gives the same tokens and logits bit for bit.
func TestGoldens(t *testing.T) {
	skipUnderRace(t)
	for _, fam := range goldenFamilies {
		t.Run(fam, func(t *testing.T) {
			dir := goldenDir(fam)
			ps, es, err := hftest.ReadGolden(dir)
			if err != nil {
				t.Fatal(err)
			}
			m := checkpointModel(t, dir, "float32")
			vs := []goldenVariant{{opts{manager: "v1"}, 0}, {opts{manager: "v1", reuse: true}, 0},
				{opts{manager: "v2"}, 0}, {opts{manager: "v2", reuse: true}, 0}, {opts{manager: "v2", reuse: true}, 7}}
			if testing.Short() { // the race run: the two variants furthest apart
				vs = []goldenVariant{vs[0], vs[4]}
			}
			goldenVariants(t, fam, m, ps, es, vs)
			checkTopLogprobs(t, m, ps, es)
		})
	}
}

// goldenVariant is one way to run a golden's prompts: the rig's options
// (manager, reuse, snapshots, batch) and the prefill chunk (0: whole).
type goldenVariant struct {
	o     opts
	chunk int
}

// goldenVariants runs golden fam's prompts under every variant and checks
// each against transformers' outputs (checkAll), that prompts sharing a
// prefix reused it where reuse is on, and that every variant gives the
// first one's tokens and logits bit for bit.
func goldenVariants(t *testing.T, fam string, m spec.Model, ps []hftest.Prompt, es []hftest.Expected, vs []goldenVariant) {
	t.Helper()
	var first []*req
	for _, v := range vs {
		name := fmt.Sprintf("%s/reuse=%v/chunk=%d", v.o.manager, v.o.reuse, v.chunk)
		reqs := goldenRun(t, m, ps, v.o, v.chunk)
		exact, worst := checkAll(t, name, compareGolden(reqs, es))
		t.Logf("%s %s: %d of %d prompts token-exact, largest logprob difference %.2e", fam, name, exact, len(ps), worst)
		reused := 0
		for _, q := range reqs {
			reused += q.reused
		}
		if v.o.reuse && reused == 0 {
			t.Errorf("%s: no prompt reused a prefix (the goldens pair prompts sharing 56 tokens)", name)
		}
		if first == nil {
			first = reqs
			continue
		}
		for i, q := range reqs {
			if !slices.Equal(q.out, first[i].out) || !sameBits(q.logits, first[i].logits) {
				t.Errorf("%s prompt %d: tokens %v differ from the first variant's %v (or their logits' bits)", name, i, q.out, first[i].out)
			}
		}
	}
}

// checkTopLogprobs runs the prompts asking the device for its top-5
// logprobs (worker.Output.TopLogprobs, what kvx generate prints): every
// step's list starts with the sampled token and matches transformers' ids
// and logprobs within lpTol while the tokens agree.
func checkTopLogprobs(t *testing.T, m spec.Model, ps []hftest.Prompt, es []hftest.Expected) {
	t.Helper()
	checkTopLogprobsWith(t, "v2", m, ps, es)
}

// checkTopLogprobsWith is checkTopLogprobs through manager mgr.
func checkTopLogprobsWith(t *testing.T, mgr string, m spec.Model, ps []hftest.Prompt, es []hftest.Expected) {
	t.Helper()
	reqs := goldenRun(t, m, ps, opts{manager: mgr, top: 5, batch: len(ps)}, 0)
	for i, q := range reqs {
		if len(q.tops) != len(q.out) {
			t.Fatalf("prompt %d: %d top-logprob lists for %d tokens", i, len(q.tops), len(q.out))
		}
		for j, top := range q.tops {
			if len(top) != 5 || top[0].ID != q.out[j] {
				t.Errorf("prompt %d step %d: top logprobs %v, want 5 starting with the sampled token %d", i, j, top, q.out[j])
				continue
			}
			if j >= len(es[i].OutputIDs) || q.out[j] != es[i].OutputIDs[j] {
				break
			}
			for k, p := range es[i].TopLogprobs[j] {
				if got := top[k]; int(p[0]) != int(got.ID) || math.Abs(got.Logprob-p[1]) > lpTol {
					t.Errorf("prompt %d step %d: top %d is (%d, %.6f), transformers (%d, %.6f)", i, j, k, got.ID, got.Logprob, int(p[0]), p[1])
				}
			}
		}
	}
}

// offByOne is a deliberately wrong kernel: RoPE rotates the keys one
// position late. (Shifting queries and keys alike would change nothing:
// RoPE scores depend on the distance only.) The model rotates q, then k.
type offByOne struct {
	hf.Ops
	calls *int
}

func (o offByOne) RoPE(x synth.Tensor, segs []synth.Seg, stride int, r synth.RoPE) {
	*o.calls++
	if *o.calls%2 == 1 {
		o.Ops.RoPE(x, segs, stride, r)
		return
	}
	shifted := slices.Clone(segs)
	for i := range shifted {
		shifted[i].Pos++
	}
	o.Ops.RoPE(x, shifted, stride, r)
}

// defaultRoPE drops the checkpoint's RoPE scaling (llama3, yarn): the
// plain Theta table.
type defaultRoPE struct{ hf.Ops }

func (o defaultRoPE) RoPE(x synth.Tensor, segs []synth.Seg, stride int, r synth.RoPE) {
	r.InvFreq, r.Scale = nil, 0
	o.Ops.RoPE(x, segs, stride, r)
}

// noScale drops yarn's attention factor (the cosines' and sines' scale).
type noScale struct{ hf.Ops }

func (o noScale) RoPE(x synth.Tensor, segs []synth.Seg, stride int, r synth.RoPE) {
	r.Scale = 0
	o.Ops.RoPE(x, segs, stride, r)
}

// noBias skips every bias add.
type noBias struct{ hf.Ops }

func (noBias) AddBias(_, _ synth.Tensor) {}

// noQKNorm skips Qwen3's per-head q/k norm.
type noQKNorm struct{ hf.Ops }

func (o noQKNorm) RMSNormGroups(x, _ synth.Tensor, _ float32) synth.Tensor {
	return o.Rows(x, seqInts(x.Rows()))
}

// noRoutedScale drops DeepSeek's routed_scaling_factor.
type noRoutedScale struct{ hf.Ops }

func (o noRoutedScale) RouteGrouped(logits, bias synth.Tensor, g hf.GroupedRoute) synth.Routing {
	g.Scale = 1
	return o.Ops.RouteGrouped(logits, bias, g)
}

// noCorrectionBias chooses experts without e_score_correction_bias.
type noCorrectionBias struct{ hf.Ops }

func (o noCorrectionBias) RouteGrouped(logits, _ synth.Tensor, g hf.GroupedRoute) synth.Routing {
	return o.Ops.RouteGrouped(logits, nil, g)
}

// flipInterleave flips the RoPE layout of the calls whose heads are stride
// elements apart: 8, the main MLA's q_pe and k_pe (qk_rope_head_dim), or
// 16, the DSA indexer's q and k (index_head_dim).
type flipInterleave struct {
	hf.Ops
	stride int
}

func (o flipInterleave) RoPE(x synth.Tensor, segs []synth.Seg, stride int, r synth.RoPE) {
	if stride == o.stride {
		r.Interleaved = !r.Interleaved
	}
	o.Ops.RoPE(x, segs, stride, r)
}

// noLayerNormBias drops the biases of LayerNorm (the DSA indexer's k_norm).
// (Dropping the indexer's index_head_dim^-0.5 would change nothing: a
// positive factor inside the ReLU scales every score alike.)
type noLayerNormBias struct{ hf.Ops }

func (o noLayerNormBias) LayerNorm(x, w, _ synth.Tensor, eps float32) synth.Tensor {
	return o.Ops.LayerNorm(x, w, nil, eps)
}

func seqInts(n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = i
	}
	return out
}

// TestGoldenCheckCatchesWrongKernels shows the golden check has teeth: a
// golden run with a deliberately wrong op (the keys' RoPE one position
// late; llama3 scaling dropped; Qwen3's q/k norm skipped; yarn's attention
// factor dropped; the q/k/v biases dropped; the sliding window ignored, a
// wrong option rather than op) breaks the rule
// or the logprob tolerance on some prompt.
func TestGoldenCheckCatchesWrongKernels(t *testing.T) {
	skipUnderRace(t)
	for _, c := range []struct {
		name, fam string
		wrap      func(hf.Ops) hf.Ops
		edit      func(*spec.Model) // a wrong option instead of a wrong op
	}{
		{"keys' RoPE off by one", "llama", func(o hf.Ops) hf.Ops { return offByOne{o, new(int)} }, nil},
		{"llama3 scaling dropped", "llama", func(o hf.Ops) hf.Ops { return defaultRoPE{o} }, nil},
		{"q/k norm skipped", "qwen3", func(o hf.Ops) hf.Ops { return noQKNorm{o} }, nil},
		{"yarn attention factor dropped", "extra/llama_yarn", func(o hf.Ops) hf.Ops { return noScale{o} }, nil},
		{"biases dropped", "extra/qwen3_swa", func(o hf.Ops) hf.Ops { return noBias{o} }, nil},
		{"routed_scaling_factor ignored", "deepseek_v3", func(o hf.Ops) hf.Ops { return noRoutedScale{o} }, nil},
		{"correction bias ignored", "deepseek_v3", func(o hf.Ops) hf.Ops { return noCorrectionBias{o} }, nil},
		{"MLA RoPE not interleaved", "deepseek_v3", func(o hf.Ops) hf.Ops { return flipInterleave{o, 8} }, nil},
		{"indexer RoPE interleaved", "deepseek_v32", func(o hf.Ops) hf.Ops { return flipInterleave{o, 16} }, nil},
		{"indexer keys' LayerNorm bias dropped", "deepseek_v32", func(o hf.Ops) hf.Ops { return noLayerNormBias{o} }, nil},
		{"sliding window ignored", "extra/qwen3_swa", nil, func(m *spec.Model) {
			for i := range m.Layers {
				m.Layers[i].Window = 0
			}
		}},
	} {
		expectCaught(t, c.name+" ("+c.fam+")", goldenDir(c.fam), c.edit, opts{manager: "v2"}, c.wrap)
	}
}

// allPrompts as opts.batch in expectCaught: one batch of every prompt.
const allPrompts = -1

// expectCaught runs the golden checkpoint in dir (its model edited by edit,
// when given) on a cpu device whose ops wrap wraps, with the run options o,
// and fails t unless the golden check (the token rule or the logprob
// tolerance) fails on at least one prompt: the check has teeth for that
// deliberately wrong kernel. o.batch allPrompts batches every prompt at once.
func expectCaught(t *testing.T, name, dir string, edit func(*spec.Model), o opts, wrap func(hf.Ops) hf.Ops) {
	t.Helper()
	ps, es, err := hftest.ReadGolden(dir)
	if err != nil {
		t.Fatal(err)
	}
	m := checkpointModel(t, dir, "float32")
	if edit != nil {
		edit(&m)
	}
	if o.batch == allPrompts {
		o.batch = len(ps)
	}
	o.open = cpu.OpenWith(cpu.Options{WrapHF: wrap})
	cs := compareGolden(goldenRun(t, m, ps, o, 0), es)
	caught := 0
	for _, cm := range cs {
		if !cm.OK || cm.MaxLPDiff > lpTol {
			caught++
		}
	}
	if caught == 0 {
		t.Errorf("%s: passed the golden check on all %d prompts", name, len(cs))
	}
	t.Logf("%s: %d of %d prompts fail the check", name, caught, len(cs))
}

var _ device.OpenFunc = cpu.OpenWith(cpu.Options{})
