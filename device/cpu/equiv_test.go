package cpu_test

import (
	"fmt"
	"slices"
	"testing"

	"github.com/kvx-dev/kvx/device/cpu"
	"github.com/kvx-dev/kvx/internal/race"
	"github.com/kvx-dev/kvx/plugins/model"
	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
	"github.com/kvx-dev/kvx/plugins/v1/spec"
)

// requests are three prompts generated together, prefilled in chunks of 1,
// 7 and whole.
func requests(vocab int, lens [3]int, want int) []*req {
	var rs []*req
	for i, c := range []int{1, 7, 0} {
		rs = append(rs, &req{seq: kvcache.SeqID(10 + i), prompt: prompt(lens[i], i+1, vocab), chunk: c, want: want})
	}
	return rs
}

type equivCase struct {
	preset  string
	backend string
	manager string
	kv      string
	drafts  int
	pp      int
	edit    func(*spec.Model)
}

func (c equivCase) name() string {
	return fmt.Sprintf("%s/%s/%s/%s/drafts=%d/pp=%d", c.preset, c.backend, c.manager, c.kv, c.drafts, c.pp)
}

func runEquiv(t *testing.T, c equivCase) {
	m := synthModel(t, c.preset, model.SyntheticSpec{}, c.kv)
	if c.edit != nil {
		c.edit(&m)
	}
	ref, err := cpu.NewReference(m, seed, backends[c.backend].Kernel)
	if err != nil {
		t.Fatal(err)
	}
	r := newRig(t, m, opts{backend: c.backend, manager: c.manager, kv: c.kv, drafts: c.drafts, pp: c.pp})
	reqs := requests(m.Vocab, [3]int{9, 23, 30}, 5)
	r.run(reqs)
	for _, q := range reqs {
		t.Logf("seq %d: tokens %v, %d drafts accepted", q.seq, q.out, q.accepted)
	}
	checkReference(t, ref, reqs)
	if c.pp > 1 { // and equal to the same run on one stage
		one := newRig(t, m, opts{backend: c.backend, manager: c.manager, kv: c.kv, drafts: c.drafts})
		reqs1 := requests(m.Vocab, [3]int{9, 23, 30}, 5)
		one.run(reqs1)
		for i, q := range reqs {
			if !slices.Equal(q.out, reqs1[i].out) || !sameBits(q.logits, reqs1[i].logits) {
				t.Errorf("seq %d: PP %d tokens %v, PP 1 tokens %v (or last logits differ)", q.seq, c.pp, q.out, reqs1[i].out)
			}
		}
	}
}

// raceCases is cases, or under -race (make test-race) the first case of
// each backend. The device's only goroutines are its parallel loops
// (kernel.parallelFor in each attention kernel, and matMul), which every
// case of a backend reaches through the same kernels, each unit writing
// only its own outputs: the KV dtype, drafts, windows and pipeline stages
// (run one after another) change what a unit reads, not where it writes.
// The plain pass runs every case; under -race each takes about ten times
// as long.
func raceCases(cases []equivCase) []equivCase {
	if !race.Enabled {
		return cases
	}
	var first []equivCase
	seen := map[string]bool{}
	for _, c := range cases {
		if !seen[c.backend] {
			seen[c.backend] = true
			first = append(first, c)
		}
	}
	return first
}

// skipVariantsUnderRace skips, under -race, a test of drafts, windows or
// stages: the raceCases of TestEquivalenceLlama, DeepSeek and NemotronH
// race the same loops of every backend.
func skipVariantsUnderRace(t *testing.T) {
	t.Helper()
	if race.Enabled {
		t.Skip("the same parallel loops as the other equivalence tests' race cases: run without -race (make test's main pass)")
	}
}

func TestEquivalenceLlama(t *testing.T) {
	for _, c := range raceCases([]equivCase{
		{preset: "llama-3.1-8b", backend: "gqa", manager: "v1", kv: "bf16"},
		{preset: "llama-3.1-8b", backend: "gqa", manager: "v2", kv: "fp8"},
	}) {
		t.Run(c.name(), func(t *testing.T) { runEquiv(t, c) })
	}
}

func TestEquivalenceDeepSeek(t *testing.T) {
	for _, c := range raceCases([]equivCase{
		{preset: "deepseek-v3.2", backend: "dsa", manager: "v2", kv: "bf16"},
		{preset: "deepseek-v3.2", backend: "dsa", manager: "v1", kv: "fp8", drafts: 1},
		{preset: "deepseek-v3.2", backend: "mla", manager: "v2", kv: "bf16", drafts: 1},
		{preset: "deepseek-v3.2", backend: "mla", manager: "v1", kv: "fp8"},
	}) {
		t.Run(c.name(), func(t *testing.T) { runEquiv(t, c) })
	}
}

func TestEquivalenceNemotronH(t *testing.T) {
	for _, c := range raceCases([]equivCase{
		{preset: "nemotron-3-nano-30b-a3b", backend: "gqa", manager: "mamba", kv: "bf16"},
		{preset: "nemotron-3-nano-30b-a3b", backend: "gqa", manager: "mamba", kv: "fp8"},
	}) {
		t.Run(c.name(), func(t *testing.T) { runEquiv(t, c) })
	}
}

// withMTP appends one MTP layer (GQA + the model's FFN) to a model without
// one, so that a hybrid model runs drafts and Mamba rollback.
func withMTP(m *spec.Model) {
	ffn := spec.FFNMoE
	for _, l := range m.Layers {
		if l.FFN != spec.FFNNone {
			ffn = l.FFN
		}
	}
	m.Layers = append(m.Layers, spec.Layer{Index: len(m.Layers), Mixer: spec.MixerGQA, FFN: ffn, MTP: true})
	m.NumNextN = 1
	if err := model.FillBuffers(m, model.Dtypes{KV: "bf16"}, 1); err != nil {
		panic(err)
	}
}

// windowed gives layers 1 and 3 a sliding window of 8 tokens.
func windowed(m *spec.Model) {
	m.Layers[1].Window = 8
	m.Layers[3].Window = 8
}

func TestEquivalenceDraftsAndWindows(t *testing.T) {
	skipVariantsUnderRace(t)
	for _, c := range []equivCase{
		{preset: "nemotron-3-nano-30b-a3b", backend: "gqa", manager: "mamba", kv: "bf16", drafts: 1, edit: withMTP},
		{preset: "llama-3.1-8b", backend: "gqa", manager: "v2", kv: "bf16", edit: windowed},
		{preset: "llama-3.1-8b", backend: "gqa", manager: "v1", kv: "bf16", edit: windowed},
		{preset: "llama-3.1-8b", backend: "gqa", manager: "v2", kv: "bf16", drafts: 1, edit: func(m *spec.Model) { windowed(m); withMTP(m) }},
	} {
		t.Run(c.name(), func(t *testing.T) { runEquiv(t, c) })
	}
}

func TestEquivalencePipeline(t *testing.T) {
	skipVariantsUnderRace(t)
	for _, c := range []equivCase{
		{preset: "llama-3.1-8b", backend: "gqa", manager: "v2", kv: "bf16", pp: 2},
		{preset: "deepseek-v3.2", backend: "dsa", manager: "v1", kv: "bf16", drafts: 1, pp: 2},
		{preset: "deepseek-v3.2", backend: "mla", manager: "v2", kv: "fp8", pp: 2},
		{preset: "nemotron-3-nano-30b-a3b", backend: "gqa", manager: "mamba", kv: "bf16", drafts: 1, pp: 2, edit: withMTP},
	} {
		t.Run(c.name(), func(t *testing.T) { runEquiv(t, c) })
	}
}
