package hf_test

import (
	"math"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvx-dev/kvx/device/hf"
	"github.com/kvx-dev/kvx/plugins/model"
	"github.com/kvx-dev/kvx/plugins/v1/spec"
)

// The DeepSeek goldens load on every stage split, and a model that does not
// match the weights is refused naming the tensor.
func TestNewDeepSeek(t *testing.T) {
	for _, fam := range []string{"deepseek_v3", "deepseek_v32"} {
		dir := filepath.Join("testdata", fam)
		m, err := model.Load(dir)
		if err != nil {
			t.Fatal(err)
		}
		whole, a, b := &loader{}, &loader{}, &loader{}
		if _, err := hf.New(m, dir, 0, 3, whole); err != nil {
			t.Fatalf("%s: New: %v", fam, err)
		}
		if _, err := hf.New(m, dir, 0, 1, a); err != nil {
			t.Fatal(err)
		}
		if _, err := hf.New(m, dir, 1, 3, b); err != nil {
			t.Fatal(err)
		}
		if whole.n == 0 || a.n+b.n != whole.n {
			t.Errorf("%s: stages loaded %d + %d values, the whole model %d", fam, a.n, b.n, whole.n)
		}
		for _, c := range []struct {
			name string
			edit func(*spec.Model)
			want string
		}{
			{"12 experts", func(m *spec.Model) { m.Experts = 12 }, `tensor "model.layers.1.mlp.experts.10.down_proj.weight" is missing`},
			{"9 experts in 4 groups", func(m *spec.Model) { m.Experts = 9 }, "n_group 4, topk_group 2 for 9 experts"},
			{"expert width", func(m *spec.Model) { m.MoEIntermediate = 16 }, `"model.layers.1.mlp.experts.0.down_proj.weight" has shape [64 32], want [64 16]`},
			{"latent rank", func(m *spec.Model) { m.KVLoraRank = 24 }, `"model.layers.0.self_attn.kv_a_layernorm.weight" has shape [32], want [24]`},
			{"an MTP layer", func(m *spec.Model) {
				m.Layers = append(m.Layers, spec.Layer{Index: 3, Mixer: m.Layers[0].Mixer, FFN: spec.FFNMoE, MTP: true})
				m.NumNextN = 1
			}, `tensor "model.layers.3.eh_proj.weight" is missing (want shape [64 128])`},
			{"a gqa layer", func(m *spec.Model) { m.Layers[1].Mixer = spec.MixerGQA }, `layer 1: mixer "gqa"`},
		} {
			mm := m
			mm.Layers = append([]spec.Layer(nil), m.Layers...)
			c.edit(&mm)
			if _, err := hf.New(mm, dir, 0, 3, &loader{}); err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("%s %s: New = %v, want an error containing %q", fam, c.name, err, c.want)
			}
		}
	}
}

func TestDeepSeekConfig(t *testing.T) {
	dir := filepath.Join("testdata", "deepseek_v32")
	m, err := model.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	s, err := hf.New(m, dir, 0, 3, &loader{})
	if err != nil {
		t.Fatal(err)
	}
	d := s.DeepSeek()
	ms := 0.1*math.Log(4) + 1 // yarn_get_mscale(factor 4, mscale_all_dim 1)
	if want := ms * ms / math.Sqrt(24); math.Abs(d.AttentionScale-want) > 1e-15 {
		t.Errorf("attention scale %v, want 24^-0.5 · mscale² = %v", d.AttentionScale, want)
	}
	if d.NGroup != 4 || d.TopKGroup != 2 || !d.NormTopK || d.RoutedScale != 2.5 || !d.Interleave || !d.Sparse || d.SharedIntermediate != 32 ||
		d.IndexHeadScale != 0.25 || d.IndexScoreScale != 0.25 || d.IndexLayerNormEps != 1e-6 {
		t.Errorf("DeepSeek config = %+v", d)
	}
	if d3, _ := hf.New(mustLoad(t, filepath.Join("testdata", "deepseek_v3")), filepath.Join("testdata", "deepseek_v3"), 0, 3, &loader{}); d3 == nil || d3.DeepSeek().Sparse {
		t.Errorf("deepseek_v3: want a dense-MLA DeepSeek stage")
	}
}

func mustLoad(t *testing.T, dir string) spec.Model {
	t.Helper()
	m, err := model.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	return m
}
