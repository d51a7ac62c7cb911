package hf_test

import (
	"strings"
	"testing"

	"github.com/kvx-dev/kvx/device/hf"
	"github.com/kvx-dev/kvx/plugins/model"
	"github.com/kvx-dev/kvx/plugins/v1/spec"
)

const qwen3NextGolden = "testdata/qwen3_next"

// TestQwen3NextConfigAndLoad: the golden's config.json parses as Qwen3-Next
// with its partial rotary factor; plugins/model maps the delta-net layers onto
// the Mamba mixer and the last onto attention, MoE everywhere; New loads
// every tensor exactly once over the stages of any split (the permuted
// in_proj rows and the 1 + w norms included); the stage reports its GDN
// numerics and a Nemotron-H stage none.
func TestQwen3NextConfigAndLoad(t *testing.T) {
	cfg, err := model.ReadNumerics(qwen3NextGolden)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Arch != "Qwen3NextForCausalLM" || cfg.Rope.PartialRotary != 0.25 || cfg.Eps != float32(1e-6) || cfg.Tied {
		t.Errorf("ReadNumerics = arch %s partial %v eps %v tied %v, want Qwen3NextForCausalLM 0.25 1e-06 false", cfg.Arch, cfg.Rope.PartialRotary, cfg.Eps, cfg.Tied)
	}
	m, err := model.Load(qwen3NextGolden)
	if err != nil {
		t.Fatal(err)
	}
	for i, l := range m.Layers {
		want := spec.MixerMamba
		if i == 3 {
			want = spec.MixerGQA
		}
		if l.Mixer != want || l.FFN != spec.FFNMoE {
			t.Errorf("layer %d: mixer %q ffn %q, want %q moe", i, l.Mixer, l.FFN, want)
		}
	}
	whole := &loader{}
	s, err := hf.New(m, qwen3NextGolden, 0, 4, whole)
	if err != nil {
		t.Fatal(err)
	}
	if eps, ok := s.GDNNumerics(); !ok || eps != float32(1e-6) {
		t.Errorf("GDNNumerics = %v, %v, want 1e-06, true", eps, ok)
	}
	want := checkpointValues(t, qwen3NextGolden)
	if whole.n != want {
		t.Errorf("New loaded %d values, the checkpoint holds %d", whole.n, want)
	}
	for _, cut := range []int{1, 2, 3} {
		a, b := &loader{}, &loader{}
		if _, err := hf.New(m, qwen3NextGolden, 0, cut, a); err != nil {
			t.Fatal(err)
		}
		if _, err := hf.New(m, qwen3NextGolden, cut, 4, b); err != nil {
			t.Fatal(err)
		}
		if a.n+b.n != want {
			t.Errorf("stages [0,%d) and [%d,4) loaded %d + %d values, want %d", cut, cut, a.n, b.n, want)
		}
	}
	nm, err := model.Load(nemotronGolden)
	if err != nil {
		t.Fatal(err)
	}
	ns, err := hf.New(nm, nemotronGolden, 0, 5, &loader{})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := ns.GDNNumerics(); ok {
		t.Errorf("a Nemotron-H stage reports GDN numerics")
	}
}

// checkpointValues is the number of float values the checkpoint in dir holds.
func checkpointValues(t *testing.T, dir string) int {
	t.Helper()
	ck, err := hf.OpenCheckpoint(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer ck.Close()
	n := 0
	for _, name := range ck.Names() {
		info, _ := ck.Info(name)
		k := 1
		for _, d := range info.Shape {
			k *= int(d)
		}
		n += k
	}
	return n
}

func TestQwen3NextRejects(t *testing.T) {
	for _, c := range []struct {
		name  string
		edits map[string]any
		omit  string
		want  string
	}{
		{"missing", nil, "model.layers.1.linear_attn.A_log", `tensor "model.layers.1.linear_attn.A_log" is missing (want shape [4])`},
		{"norm_topk_prob", map[string]any{"norm_topk_prob": false}, "", "norm_topk_prob false"},
		{"odd rotary", map[string]any{"partial_rotary_factor": 0.1, "rope_parameters": map[string]any{"rope_type": "default", "rope_theta": 10000, "partial_rotary_factor": 0.1}}, "",
			"head_dim 32 × partial_rotary_factor 0.1 = 3 rotary dims"},
		{"mlp_only_layers", map[string]any{"mlp_only_layers": []int{1}}, "", `tensor "model.layers.1.mlp.experts.0.down_proj.weight" (shape [64 32]) is not a tensor of Qwen3NextForCausalLM`},
		{"decoder_sparse_step", map[string]any{"decoder_sparse_step": 2}, "", `tensor "model.layers.0.mlp.experts.0.down_proj.weight" (shape [64 32]) is not a tensor of Qwen3NextForCausalLM`},
		{"partial above 1", map[string]any{"partial_rotary_factor": 1.5, "rope_parameters": map[string]any{"rope_type": "default", "rope_theta": 10000, "partial_rotary_factor": 1.5}}, "",
			"partial_rotary_factor 1.5"},
	} {
		dir := copyGolden(t, qwen3NextGolden, c.edits, c.omit)
		m, err := model.Load(dir)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if _, err := hf.New(m, dir, 0, 4, &loader{}); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: New = %v, want an error containing %q", c.name, err, c.want)
		}
	}
}
