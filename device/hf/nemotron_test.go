package hf_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvx-dev/kvx/device/hf"
	"github.com/kvx-dev/kvx/plugins/model"
	"github.com/kvx-dev/kvx/plugins/v1/spec"
)

const nemotronGolden = "testdata/nemotron_h"

// copyNemotron copies the Nemotron-H golden checkpoint to a temporary
// directory with config.json's keys set to edits and the tensor omit left
// out of the file ("" keeps all).
func copyNemotron(t *testing.T, edits map[string]any, omit string) string {
	return copyGolden(t, nemotronGolden, edits, omit)
}

// copyGolden is copyNemotron for the golden checkpoint in src.
func copyGolden(t *testing.T, src string, edits map[string]any, omit string) string {
	t.Helper()
	dst := filepath.Join(t.TempDir(), filepath.Base(src))
	if err := os.Mkdir(dst, 0o755); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(filepath.Join(src, "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	var c map[string]any
	if err := json.Unmarshal(data, &c); err != nil {
		t.Fatal(err)
	}
	for k, v := range edits {
		c[k] = v
	}
	if data, err = json.Marshal(c); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dst, "config.json"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	ck, err := hf.OpenCheckpoint(src)
	if err != nil {
		t.Fatal(err)
	}
	defer ck.Close()
	var ts []hf.Named
	for _, name := range ck.Names() {
		if name == omit {
			continue
		}
		info, _ := ck.Info(name)
		shape := make([]int, len(info.Shape))
		for i, v := range info.Shape {
			shape[i] = int(v)
		}
		v, err := ck.Float32(name, shape...)
		if err != nil {
			t.Fatal(err)
		}
		ts = append(ts, hf.Named{Name: name, Shape: shape, Data: v})
	}
	if err := hf.WriteSafetensors(filepath.Join(dst, "model.safetensors"), ts, map[string]string{"format": "pt"}); err != nil {
		t.Fatal(err)
	}
	return dst
}

// TestNemotronConfigAndLoad: the golden's config.json parses as Nemotron-H
// with layer_norm_epsilon as the norms' epsilon; New loads every tensor
// once over the stages of any split; the stage reports the Mamba2 numerics
// (epsilon, the dt floor time_step_min) and a Llama stage none.
func TestNemotronConfigAndLoad(t *testing.T) {
	cfg, err := model.ReadNumerics(nemotronGolden)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Arch != "NemotronHForCausalLM" || cfg.Eps != float32(1e-5) || cfg.Tied {
		t.Errorf("ReadNumerics = arch %s eps %v tied %v, want NemotronHForCausalLM 1e-05 false", cfg.Arch, cfg.Eps, cfg.Tied)
	}
	m, err := model.Load(nemotronGolden)
	if err != nil {
		t.Fatal(err)
	}
	var kinds []string
	for _, l := range m.Layers {
		kinds = append(kinds, string(l.Mixer)+"/"+string(l.FFN))
	}
	if len(m.Layers) != 5 || m.Layers[0].Mixer != spec.MixerMamba || m.Layers[1].Mixer != spec.MixerGQA || m.Layers[2].FFN != spec.FFNDense {
		t.Fatalf("model.Load: layers %v, want Mamba2, attention, MLP, Mamba2, MLP", kinds)
	}
	whole := &loader{}
	s, err := hf.New(m, nemotronGolden, 0, 5, whole)
	if err != nil {
		t.Fatal(err)
	}
	if eps, dtMin, ok := s.Mamba2Numerics(); !ok || eps != float32(1e-5) || dtMin != float32(0.001) {
		t.Errorf("Mamba2Numerics = %v, %v, %v, want 1e-05, 0.001, true", eps, dtMin, ok)
	}
	ck, err := hf.OpenCheckpoint(nemotronGolden)
	if err != nil {
		t.Fatal(err)
	}
	want := 0
	for _, name := range ck.Names() {
		info, _ := ck.Info(name)
		n := 1
		for _, d := range info.Shape {
			n *= int(d)
		}
		want += n
	}
	ck.Close()
	if whole.n != want {
		t.Errorf("New loaded %d values, the checkpoint holds %d", whole.n, want)
	}
	for _, cut := range []int{1, 2, 3, 4} {
		a, b := &loader{}, &loader{}
		if _, err := hf.New(m, nemotronGolden, 0, cut, a); err != nil {
			t.Fatal(err)
		}
		if _, err := hf.New(m, nemotronGolden, cut, 5, b); err != nil {
			t.Fatal(err)
		}
		if a.n+b.n != want {
			t.Errorf("stages [0,%d) and [%d,5) loaded %d + %d values, want %d", cut, cut, a.n, b.n, want)
		}
	}
	lm, err := model.Load(write(t, tiny))
	if err != nil {
		t.Fatal(err)
	}
	ls, err := hf.New(lm, lm.Checkpoint, 0, 2, &loader{})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, ok := ls.Mamba2Numerics(); ok {
		t.Errorf("a Llama stage reports Mamba2 numerics")
	}
}

func TestNemotronRejects(t *testing.T) {
	for _, c := range []struct {
		name  string
		edits map[string]any
		omit  string
		want  string
	}{
		{"missing", nil, "backbone.layers.3.mixer.dt_bias", `tensor "backbone.layers.3.mixer.dt_bias" is missing (want shape [8])`},
		{"conv bias off", map[string]any{"use_conv_bias": false}, "", `tensor "backbone.layers.0.mixer.conv1d.bias" (shape [192]) is not a tensor of NemotronHForCausalLM`},
		{"mlp act", map[string]any{"mlp_hidden_act": "silu"}, "", `mlp_hidden_act "silu": the NemotronHForCausalLM MLP runs relu2`},
		{"moe", map[string]any{"layers_block_type": []string{"linear_attention", "full_attention", "moe", "linear_attention", "mlp"}}, "",
			`layer 2: mixer "", ffn "moe"`},
	} {
		dir := copyNemotron(t, c.edits, c.omit)
		m, err := model.Load(dir)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if _, err := hf.New(m, dir, 0, 5, &loader{}); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: New = %v, want an error containing %q", c.name, err, c.want)
		}
	}
}
