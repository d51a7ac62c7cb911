package model

import (
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestParseNumericsRope(t *testing.T) {
	for _, c := range []struct {
		name, json string
		want       Rope
	}{
		{"transformers 5", `{"model_type":"llama","rope_parameters":{"rope_type":"default","rope_theta":500000.0}}`, Rope{Type: "default", Theta: 500000}},
		{"old keys", `{"architectures":["LlamaForCausalLM"],"rope_theta":123.0,"rope_scaling":{"type":"llama3","factor":8,"low_freq_factor":1,"high_freq_factor":4,"original_max_position_embeddings":8192}}`,
			Rope{Type: "llama3", Theta: 123, Factor: 8, LowFreqFactor: 1, HighFreqFactor: 4, OriginalMaxPosition: 8192}},
		{"no rope keys", `{"model_type":"mistral"}`, Rope{Type: "default", Theta: 10000}},
		{"yarn", `{"model_type":"qwen3","rope_parameters":{"rope_type":"yarn","rope_theta":1e6,"factor":4.0,"original_max_position_embeddings":32768,"beta_fast":null}}`,
			Rope{Type: "yarn", Theta: 1e6, Factor: 4, OriginalMaxPosition: 32768}},
	} {
		got, err := ParseNumerics([]byte(c.json))
		if err != nil {
			t.Errorf("%s: ParseNumerics: %v", c.name, err)
			continue
		}
		if got.Rope.Truncate != nil || got.Rope != c.want {
			t.Errorf("%s: Rope = %+v, want %+v", c.name, got.Rope, c.want)
		}
	}
	q, err := ParseNumerics([]byte(`{"model_type":"qwen3","tie_word_embeddings":true,"attention_bias":true,"rms_norm_eps":1e-5,"dtype":"float32"}`))
	if err != nil {
		t.Fatal(err)
	}
	if q.Arch != "Qwen3ForCausalLM" || !q.QKNorm || !q.Tied || !q.AttnBias || q.Eps != 1e-5 || q.Dtype != "float32" {
		t.Errorf("qwen3 config = %+v", q)
	}
	if l, _ := ParseNumerics([]byte(`{"model_type":"llama"}`)); l.QKNorm || l.Tied || l.Eps != 1e-6 {
		t.Errorf("llama defaults = %+v, want no q/k norm, untied, eps 1e-6", l)
	}
}

func TestParseNumericsRejects(t *testing.T) {
	for _, c := range []struct{ json, want string }{
		{`{"model_type":"gpt2"}`, `model_type "gpt2"`},
		{`{"model_type":"llama","hidden_act":"gelu"}`, `hidden_act "gelu"`},
		{`{"model_type":"llama","rope_parameters":{"rope_type":"dynamic","rope_theta":1e4}}`, `rope_type "dynamic"`},
		{`{"model_type":"llama","rope_parameters":{"rope_type":"llama3","rope_theta":1e4,"factor":8}}`, "needs rope parameter low_freq_factor"},
		{`{"model_type":"llama","rope_parameters":{"rope_type":"default","rope_theta":"x"}}`, "rope_theta"},
		{`{"model_type":"llama","partial_rotary_factor":0.5}`, "partial_rotary_factor 0.5"},
	} {
		if _, err := ParseNumerics([]byte(c.json)); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("ParseNumerics(%s) = %v, want an error containing %q", c.json, err, c.want)
		}
	}
}

func TestInvFreq(t *testing.T) {
	const dim = 128
	def, s := Rope{Type: "default", Theta: 500000}.InvFreq(dim, 131072)
	if s != 1 || len(def) != dim/2 {
		t.Fatalf("default: %d frequencies, scale %v", len(def), s)
	}
	for i, f := range def {
		if want := math.Pow(500000, -float64(2*i)/dim); math.Abs(f-want) > want*1e-6 {
			t.Errorf("default freq %d = %v, want %v", i, f, want)
		}
	}
	// Llama 3.1's parameters: wavelengths below 8192/4 keep their
	// frequency, above 8192/1 are divided by 8, in between interpolated.
	l3 := Rope{Type: "llama3", Theta: 500000, Factor: 8, LowFreqFactor: 1, HighFreqFactor: 4, OriginalMaxPosition: 8192}
	got, s := l3.InvFreq(dim, 131072)
	if s != 1 {
		t.Errorf("llama3 scale %v, want 1", s)
	}
	var kept, divided, mid int
	for i, f := range got {
		wl := 2 * math.Pi / def[i]
		switch {
		case wl < 8192/4.0:
			kept++
			if f != def[i] {
				t.Errorf("llama3 freq %d (wavelength %.0f) = %v, want unchanged %v", i, wl, f, def[i])
			}
		case wl > 8192:
			divided++
			if want := float64(float32(def[i] / 8)); f != want {
				t.Errorf("llama3 freq %d (wavelength %.0f) = %v, want %v / 8", i, wl, f, def[i])
			}
		default:
			mid++
			sm := (8192/wl - 1) / 3
			if want := float64(float32((1-sm)*def[i]/8 + sm*def[i])); f != want {
				t.Errorf("llama3 freq %d (wavelength %.0f) = %v, want %v", i, wl, f, want)
			}
		}
	}
	if kept == 0 || divided == 0 || mid == 0 {
		t.Errorf("llama3: %d kept, %d divided, %d interpolated: want each band used", kept, divided, mid)
	}
	// YaRN, factor 4: attention factor 0.1 ln 4 + 1; the fastest
	// frequencies extrapolate (unchanged), the slowest interpolate (/4).
	y := Rope{Type: "yarn", Theta: 1e6, Factor: 4, OriginalMaxPosition: 32768}
	yf, ys := y.InvFreq(dim, 131072)
	if want := float64(float32(0.1*math.Log(4) + 1)); ys != want {
		t.Errorf("yarn attention factor %v, want %v", ys, want)
	}
	d0, _ := Rope{Type: "default", Theta: 1e6}.InvFreq(dim, 0)
	if yf[0] != d0[0] || math.Abs(yf[dim/2-1]-d0[dim/2-1]/4) > d0[dim/2-1]*1e-6 {
		t.Errorf("yarn freqs [0] %v (default %v), [last] %v (default/4 %v)", yf[0], d0[0], yf[dim/2-1], d0[dim/2-1]/4)
	}
	for i := 1; i < dim/2; i++ {
		if yf[i] < d0[i]/4*(1-1e-6) || yf[i] > d0[i]*(1+1e-6) {
			t.Errorf("yarn freq %d = %v outside [default/4, default] = [%v, %v]", i, yf[i], d0[i]/4, d0[i])
		}
	}
}

// TestParseNumericsBounds: the sizes this package reads from config.json are
// bounded before they are used (issue 24), each error naming the field,
// the value and the limit.
func TestParseNumericsBounds(t *testing.T) {
	for _, c := range []struct{ json, want string }{
		{`{"model_type":"deepseek_v3","quantization_config":{"quant_method":"fp8","weight_block_size":[128,1000000000000]}}`,
			"weight_block_size [128 1000000000000]: above the limit 65536 (MaxBlockSize)"},
		{`{"model_type":"llama","rope_parameters":{"rope_type":"yarn","rope_theta":1e4,"factor":4,"original_max_position_embeddings":1e300}}`,
			"original_max_position_embeddings 1e+300: want 0 to the limit 1073741824 (MaxPositions)"},
		{`{"model_type":"llama","rope_parameters":{"rope_type":"yarn","rope_theta":1e4,"factor":4,"original_max_position_embeddings":-5}}`,
			"original_max_position_embeddings -5: want 0 to the limit"},
	} {
		if _, err := ParseNumerics([]byte(c.json)); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("ParseNumerics(%s) = %v, want an error containing %q", c.json, err, c.want)
		}
	}
	dir := t.TempDir()
	big := `{"model_type":"llama","pad":"` + strings.Repeat("x", MaxConfigBytes) + `"}`
	if err := os.WriteFile(filepath.Join(dir, "config.json"), []byte(big), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadNumerics(dir); err == nil || !strings.Contains(err.Error(), "larger than the 16777216-byte limit") {
		t.Errorf("ReadNumerics(a config.json over MaxConfigBytes) = %v, want the limit named", err)
	}
}

// FuzzParseNumerics feeds arbitrary bytes to ParseNumerics: no panic, and a
// config it accepts gives finite RoPE frequencies for a small head.
func FuzzParseNumerics(f *testing.F) {
	paths, _ := filepath.Glob("presets/*.json")
	for _, p := range paths {
		if data, err := os.ReadFile(p); err == nil {
			f.Add(data)
		}
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := ParseNumerics(data)
		if err != nil {
			if !strings.HasPrefix(err.Error(), "config.json: ") {
				t.Fatalf("ParseNumerics error %q does not name config.json", err)
			}
			return
		}
		if c.Quant != nil && (c.Quant.BlockSize[0] > MaxBlockSize || c.Quant.BlockSize[1] > MaxBlockSize) {
			t.Fatalf("ParseNumerics accepted weight_block_size %v", c.Quant.BlockSize)
		}
		c.Rope.InvFreq(16, 4096)
	})
}
