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

type tensor struct{ r, c int }

func (t tensor) Rows() int { return t.r }
func (t tensor) Cols() int { return t.c }

// loader counts the weights New puts on the device.
type loader struct{ n int }

func (l *loader) Weight(data []float32, rows, cols int) synth.Tensor {
	l.n += len(data)
	return tensor{rows, cols}
}

var tiny = hftest.Spec{Family: "llama", Hidden: 16, Layers: 2, Heads: 2, KVHeads: 1, HeadDim: 8, Intermediate: 24, Vocab: 40, MaxPosition: 64, Seed: 4}

func write(t *testing.T, s hftest.Spec) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "ckpt")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := hftest.Write(dir, s); err != nil {
		t.Fatal(err)
	}
	return dir
}

func TestNewLoadsEveryStage(t *testing.T) {
	for _, s := range []hftest.Spec{tiny, func() hftest.Spec { s := tiny; s.Dtype = "BF16"; s.Tied = true; return s }()} {
		dir := write(t, s)
		m, err := model.Load(dir)
		if err != nil {
			t.Fatal(err)
		}
		whole := &loader{}
		if _, err := hf.New(m, dir, 0, 2, whole); err != nil {
			t.Fatalf("New(%s, dtype %q): %v", dir, s.Dtype, err)
		}
		h, v, i, d := s.Hidden, s.Vocab, s.Intermediate, s.HeadDim
		perLayer := 2*h + (s.Heads+2*s.KVHeads)*d*h + h*s.Heads*d + 3*i*h
		want := v*h + h + 2*perLayer
		if !s.Tied {
			want += v * h
		}
		if whole.n != want {
			t.Errorf("dtype %q tied %v: New loaded %d values, want %d", s.Dtype, s.Tied, whole.n, want)
		}
		first, last := &loader{}, &loader{}
		if _, err := hf.New(m, dir, 0, 1, first); err != nil {
			t.Fatal(err)
		}
		if _, err := hf.New(m, dir, 1, 2, last); err != nil {
			t.Fatal(err)
		}
		shared := 0 // the embedding table on both stages when tied
		if s.Tied {
			shared = v * h
		}
		if first.n+last.n != want+shared {
			t.Errorf("dtype %q tied %v: stages loaded %d + %d values, want %d", s.Dtype, s.Tied, first.n, last.n, want+shared)
		}
	}
}

func TestNewRejects(t *testing.T) {
	for _, c := range []struct {
		name string
		edit func(*hftest.Spec)
		want string
	}{
		{"missing", func(s *hftest.Spec) { s.Omit = "model.layers.1.mlp.up_proj.weight" }, `tensor "model.layers.1.mlp.up_proj.weight" is missing (want shape [24 16])`},
		{"extra", func(s *hftest.Spec) { s.Extra = "model.layers.0.self_attn.rotary.weight" }, `tensor "model.layers.0.self_attn.rotary.weight" (shape [1]) is not a tensor of LlamaForCausalLM`},
		{"lm head missing", func(s *hftest.Spec) { s.Omit = "lm_head.weight" }, `tensor "lm_head.weight" is missing`},
		{"q norm of qwen3", func(s *hftest.Spec) { s.Family = "qwen3"; s.Omit = "model.layers.0.self_attn.k_norm.weight" }, `"model.layers.0.self_attn.k_norm.weight" is missing`},
	} {
		s := tiny
		c.edit(&s)
		dir := write(t, s)
		m, err := model.Load(dir)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := hf.New(m, dir, 1, 2, &loader{}); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: New = %v, want an error containing %q", c.name, err, c.want)
		}
	}
	// A mis-shaped tensor: the config says a wider MLP than the weights.
	dir := write(t, tiny)
	m, err := model.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	m.Intermediate = 32
	// All six MLP tensors are mis-shaped; New names the first by name.
	const misShaped = `tensor "model.layers.0.mlp.down_proj.weight" has shape [16 24], want [16 32]`
	if _, err := hf.New(m, dir, 0, 2, &loader{}); err == nil || !strings.Contains(err.Error(), misShaped) {
		t.Errorf("mis-shaped: New = %v, want an error containing %q", err, misShaped)
	}
	m.Intermediate = tiny.Intermediate
	m.Arch = "MistralForCausalLM"
	if _, err := hf.New(m, dir, 0, 2, &loader{}); err == nil || !strings.Contains(err.Error(), "architecture LlamaForCausalLM") {
		t.Errorf("arch mismatch: New = %v, want an architecture error", err)
	}
}

// valuesLoader keeps every weight's values in load order; as a BF16Loader
// (bf16 true) it takes the matrices of at least 2 × 2 as raw bf16 bytes.
type valuesLoader struct {
	bf16 bool
	got  [][]float32
	raw  int // weights taken through WeightBF16
}

func (l *valuesLoader) Weight(data []float32, rows, cols int) synth.Tensor {
	l.got = append(l.got, append([]float32(nil), data...))
	return tensor{rows, cols}
}

type bf16Loader struct{ *valuesLoader }

func (l bf16Loader) WeightBF16(raw []byte, rows, cols int) (synth.Tensor, bool) {
	if rows < 2 || cols < 2 {
		return nil, false
	}
	if len(raw) != 2*rows*cols {
		panic("WeightBF16: wrong byte count")
	}
	v := make([]float32, rows*cols)
	for i := range v {
		v[i] = math.Float32frombits(uint32(raw[2*i])<<16 | uint32(raw[2*i+1])<<24)
	}
	l.raw++
	return l.Weight(v, rows, cols), true
}

// TestBF16Loader: a BF16Loader gets a bf16 checkpoint's matrices as their
// bytes, the same values Weight gets through the float32 path, in the same
// order and shapes; a float32 checkpoint never reaches WeightBF16.
func TestBF16Loader(t *testing.T) {
	for _, dt := range []string{"BF16", "F32"} {
		s := tiny
		s.Dtype = dt
		dir := write(t, s)
		m, err := model.Load(dir)
		if err != nil {
			t.Fatal(err)
		}
		plain := &valuesLoader{}
		if _, err := hf.New(m, dir, 0, 2, plain); err != nil {
			t.Fatal(err)
		}
		raw := bf16Loader{&valuesLoader{}}
		if _, err := hf.New(m, dir, 0, 2, raw); err != nil {
			t.Fatal(err)
		}
		if want := map[string]bool{"BF16": true, "F32": false}[dt]; (raw.raw > 0) != want {
			t.Errorf("dtype %s: %d weights through WeightBF16", dt, raw.raw)
		}
		if len(raw.got) != len(plain.got) {
			t.Fatalf("dtype %s: %d weights, want %d", dt, len(raw.got), len(plain.got))
		}
		for i := range plain.got {
			if len(raw.got[i]) != len(plain.got[i]) {
				t.Fatalf("dtype %s: weight %d has %d values, want %d", dt, i, len(raw.got[i]), len(plain.got[i]))
			}
			for j := range plain.got[i] {
				if math.Float32bits(raw.got[i][j]) != math.Float32bits(plain.got[i][j]) {
					t.Fatalf("dtype %s: weight %d value %d = %v, want %v", dt, i, j, raw.got[i][j], plain.got[i][j])
				}
			}
		}
	}
}
