package hf_test

import (
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvx-dev/kvx/device/hf"
	"github.com/kvx-dev/kvx/device/hf/hftest"
	"github.com/kvx-dev/kvx/device/synth"
	"github.com/kvx-dev/kvx/plugins/model"
)

// recorder keeps every weight New loads, in order.
type recorder struct{ ws [][]float32 }

func (r *recorder) Weight(data []float32, rows, cols int) synth.Tensor {
	r.ws = append(r.ws, data)
	return tensor{rows, cols}
}

// fp8Pair writes the DeepSeek-V3 golden checkpoint in fp8 (16 × 24 blocks,
// ragged on every projection) and the same weights dequantized to float32.
func fp8Pair(t *testing.T) (fp8, f32 string) {
	t.Helper()
	fp8, f32 = filepath.Join(t.TempDir(), "fp8"), filepath.Join(t.TempDir(), "f32")
	for _, d := range []string{fp8, f32} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	n, err := hftest.WriteFP8(filepath.Join("testdata", "deepseek_v3"), fp8, f32, [2]int{16, 24})
	if err != nil {
		t.Fatal(err)
	}
	if n < 20 {
		t.Fatalf("WriteFP8 quantized %d tensors, want every projection (>= 20)", n)
	}
	return fp8, f32
}

// An fp8 DeepSeek-V3 checkpoint loads the same weights, bit for bit, as
// the float32 checkpoint of its dequantized values; they differ from the
// original float32 weights (the quantization is real).
func TestNewFP8DeepSeek(t *testing.T) {
	fp8, f32 := fp8Pair(t)
	orig := filepath.Join("testdata", "deepseek_v3")
	var got [3]*recorder
	for i, dir := range []string{fp8, f32, orig} {
		got[i] = &recorder{}
		if _, err := hf.New(mustLoad(t, dir), dir, 0, 3, got[i]); err != nil {
			t.Fatalf("New(%s): %v", dir, err)
		}
	}
	if len(got[0].ws) != len(got[1].ws) || len(got[0].ws) != len(got[2].ws) {
		t.Fatalf("loaded %d, %d, %d weights (fp8, dequantized, original)", len(got[0].ws), len(got[1].ws), len(got[2].ws))
	}
	differ := 0
	for i := range got[0].ws {
		a, b, o := got[0].ws[i], got[1].ws[i], got[2].ws[i]
		for j := range a {
			if math.Float32bits(a[j]) != math.Float32bits(b[j]) {
				t.Fatalf("weight %d element %d: fp8 loads %v, the dequantized checkpoint %v", i, j, a[j], b[j])
			}
			if a[j] != o[j] {
				differ++
			}
		}
	}
	if differ == 0 {
		t.Errorf("the fp8 weights equal the original float32 ones: nothing was quantized")
	}
}

// A missing, mis-shaped or misplaced block scale, and fp8 weights without
// a quantization_config, are refused naming the tensor.
func TestNewFP8Rejects(t *testing.T) {
	const w = "model.layers.0.self_attn.q_a_proj.weight"
	for _, c := range []struct {
		name string
		edit func(ts []hf.Named, cfg map[string]any) []hf.Named
		want string
	}{
		{"missing scale", func(ts []hf.Named, _ map[string]any) []hf.Named {
			return drop(ts, w+"_scale_inv")
		}, `tensor "` + w + `_scale_inv" is missing: the F8_E4M3 tensor "` + w + `" needs its block scales (want shape [3 3]`},
		{"mis-shaped scale", func(ts []hf.Named, _ map[string]any) []hf.Named {
			for i := range ts {
				if ts[i].Name == w+"_scale_inv" {
					ts[i] = hf.Named{Name: ts[i].Name, Shape: []int{3, 2}, Data: ts[i].Data[:6]}
				}
			}
			return ts
		}, `tensor "` + w + `_scale_inv" has shape [3 2], want [3 3]`},
		{"scale of a float32 weight", func(ts []hf.Named, _ map[string]any) []hf.Named {
			return append(ts, hf.Named{Name: "model.embed_tokens.weight_scale_inv", Shape: []int{1, 1}, Data: []float32{1}})
		}, `"model.embed_tokens.weight_scale_inv" holds block scales of "model.embed_tokens.weight", which is F32, not fp8`},
		{"stray scale", func(ts []hf.Named, _ map[string]any) []hf.Named {
			return append(ts, hf.Named{Name: "model.layers.0.foo.weight_scale_inv", Shape: []int{1, 1}, Data: []float32{1}})
		}, `tensor "model.layers.0.foo.weight_scale_inv" (shape [1 1]) is not a tensor of DeepseekV3ForCausalLM`},
		{"weight without its scale's", func(ts []hf.Named, _ map[string]any) []hf.Named {
			return drop(ts, w)
		}, `tensor "` + w + `" is missing (want shape [48 64])`},
		{"no quantization_config", func(ts []hf.Named, cfg map[string]any) []hf.Named {
			delete(cfg, "quantization_config")
			return ts
		}, `is F8_E4M3, but config.json has no quantization_config`},
		{"another block size", func(ts []hf.Named, cfg map[string]any) []hf.Named {
			cfg["quantization_config"].(map[string]any)["weight_block_size"] = []int{128, 128}
			return ts
		}, `tensor "model.layers.0.mlp.down_proj.weight_scale_inv" has shape [4 6], want [1 1] (the block scales of "model.layers.0.mlp.down_proj.weight" [64 128], weight_block_size [128 128])`},
	} {
		ts, _, _, cfg, _, err := hftest.FP8Tensors(filepath.Join("testdata", "deepseek_v3"), [2]int{16, 24})
		if err != nil {
			t.Fatal(err)
		}
		fp8 := t.TempDir()
		if err := hftest.WriteCheckpoint(fp8, cfg, c.edit(ts, cfg)); err != nil {
			t.Fatal(err)
		}
		m, err := model.Load(fp8)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := hf.New(m, fp8, 0, 3, &loader{}); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: New = %v, want an error containing %q", c.name, err, c.want)
		}
	}
}

func drop(ts []hf.Named, name string) []hf.Named {
	var out []hf.Named
	for _, x := range ts {
		if x.Name != name {
			out = append(out, x)
		}
	}
	return out
}
