package model

import (
	"errors"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/kvx-dev/kvx/plugins/v1/spec"
)

func mustLoad(t testing.TB, name string) spec.Model {
	t.Helper()
	m, err := Load(name)
	if err != nil {
		t.Fatalf("Load(%q): %v", name, err)
	}
	return m
}

func TestPresetsMatchSharedModels(t *testing.T) {
	want := []string{
		"deepseek-v3", "deepseek-v3.2", "glm-5", "glm-5.1", "glm-5.2", "llama-3.1-8b", "llama-3.1-8b-instruct",
		"nemotron-3-nano-30b-a3b", "nemotron-3-super-120b-a12b-fp8", "nemotron-3-ultra-550b-a55b",
		"nemotron-h-56b-base-8k", "qwen3-next-80b-a3b-thinking",
	}
	if got := Presets(); !slices.Equal(got, want) {
		t.Fatalf("Presets() = %v, want %v", got, want)
	}
	// The embedded copies must be byte-identical to the shared originals.
	for _, n := range want {
		shared, err := os.ReadFile(filepath.Join("..", "..", "..", "shared", "models", n+".json"))
		if err != nil {
			t.Skipf("shared models not reachable: %v", err)
		}
		own, err := os.ReadFile(filepath.Join("presets", n+".json"))
		if err != nil {
			t.Fatal(err)
		}
		if string(own) != string(shared) {
			t.Errorf("presets/%s.json differs from /work/shared/models", n)
		}
	}
}

type shape struct {
	mixers map[spec.Mixer]int // decoder layers only
	ffns   map[spec.FFN]int
	mtp    []spec.Layer // Mixer and FFN of the MTP layers
	maxPos int
}

func shapeOf(m spec.Model) shape {
	s := shape{mixers: map[spec.Mixer]int{}, ffns: map[spec.FFN]int{}, maxPos: m.MaxPosition}
	for _, l := range m.Layers {
		if l.MTP {
			s.mtp = append(s.mtp, spec.Layer{Mixer: l.Mixer, FFN: l.FFN})
			continue
		}
		s.mixers[l.Mixer]++
		s.ffns[l.FFN]++
	}
	return s
}

func TestLayerShapes(t *testing.T) {
	mtp := func(mx spec.Mixer, f spec.FFN) []spec.Layer { return []spec.Layer{{Mixer: mx, FFN: f}} }
	tests := []struct {
		name string
		want shape
	}{
		{"deepseek-v3", shape{map[spec.Mixer]int{spec.MixerMLA: 61}, map[spec.FFN]int{spec.FFNDense: 3, spec.FFNMoE: 58}, mtp(spec.MixerMLA, spec.FFNMoE), 163840}},
		{"deepseek-v3.2", shape{map[spec.Mixer]int{spec.MixerDSA: 61}, map[spec.FFN]int{spec.FFNDense: 3, spec.FFNMoE: 58}, mtp(spec.MixerDSA, spec.FFNMoE), 163840}},
		{"glm-5", shape{map[spec.Mixer]int{spec.MixerDSA: 78}, map[spec.FFN]int{spec.FFNDense: 3, spec.FFNMoE: 75}, mtp(spec.MixerDSA, spec.FFNMoE), 202752}},
		{"glm-5.2", shape{map[spec.Mixer]int{spec.MixerDSA: 78}, map[spec.FFN]int{spec.FFNDense: 3, spec.FFNMoE: 75}, mtp(spec.MixerDSA, spec.FFNMoE), 1048576}},
		{"llama-3.1-8b-instruct", shape{map[spec.Mixer]int{spec.MixerGQA: 32}, map[spec.FFN]int{spec.FFNDense: 32}, nil, 131072}},
		{"nemotron-3-nano-30b-a3b", shape{map[spec.Mixer]int{spec.MixerGQA: 6, spec.MixerMamba: 23, spec.MixerNone: 23}, map[spec.FFN]int{spec.FFNNone: 29, spec.FFNMoE: 23}, nil, 262144}},
		{"nemotron-3-super-120b-a12b-fp8", shape{map[spec.Mixer]int{spec.MixerGQA: 8, spec.MixerMamba: 40, spec.MixerNone: 40}, map[spec.FFN]int{spec.FFNNone: 48, spec.FFNMoE: 40}, mtp(spec.MixerGQA, spec.FFNMoE), 262144}},
		{"nemotron-3-ultra-550b-a55b", shape{map[spec.Mixer]int{spec.MixerGQA: 12, spec.MixerMamba: 48, spec.MixerNone: 48}, map[spec.FFN]int{spec.FFNNone: 60, spec.FFNMoE: 48}, mtp(spec.MixerGQA, spec.FFNMoE), 262144}},
		{"nemotron-h-56b-base-8k", shape{map[spec.Mixer]int{spec.MixerGQA: 10, spec.MixerMamba: 54, spec.MixerNone: 54}, map[spec.FFN]int{spec.FFNNone: 64, spec.FFNDense: 54}, nil, 8192}},
		{"qwen3-next-80b-a3b-thinking", shape{map[spec.Mixer]int{spec.MixerGQA: 12, spec.MixerMamba: 36}, map[spec.FFN]int{spec.FFNMoE: 48}, nil, 262144}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := mustLoad(t, tt.name)
			got := shapeOf(m)
			if !mapsEqual(got.mixers, tt.want.mixers) || !mapsEqual(got.ffns, tt.want.ffns) ||
				!slices.EqualFunc(got.mtp, tt.want.mtp, sameKind) || got.maxPos != tt.want.maxPos {
				t.Errorf("shape = %+v, want %+v", got, tt.want)
			}
			if m.NumNextN != len(tt.want.mtp) {
				t.Errorf("NumNextN = %d, want %d", m.NumNextN, len(tt.want.mtp))
			}
			for i, l := range m.Layers {
				if l.Index != i {
					t.Fatalf("layer %d has Index %d", i, l.Index)
				}
				if wantMTP := i >= len(m.Layers)-m.NumNextN; l.MTP != wantMTP {
					t.Fatalf("layer %d MTP = %v, want %v (MTP layers must be last)", i, l.MTP, wantMTP)
				}
			}
		})
	}
}

func sameKind(a, b spec.Layer) bool { return a.Mixer == b.Mixer && a.FFN == b.FFN && a.MTP == b.MTP }

func mapsEqual[K comparable](a, b map[K]int) bool {
	for k, v := range a {
		if v != 0 && b[k] != v {
			return false
		}
	}
	for k, v := range b {
		if v != 0 && a[k] != v {
			return false
		}
	}
	return true
}

func TestNemotronPatternOrder(t *testing.T) {
	m := mustLoad(t, "nemotron-3-nano-30b-a3b")
	const pattern = "MEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEMEM*EMEMEMEME"
	for i, ch := range pattern {
		l := m.Layers[i]
		ok := (ch == 'M' && l.Mixer == spec.MixerMamba && l.FFN == spec.FFNNone) ||
			(ch == 'E' && l.Mixer == spec.MixerNone && l.FFN == spec.FFNMoE) ||
			(ch == '*' && l.Mixer == spec.MixerGQA && l.FFN == spec.FFNNone)
		if !ok {
			t.Fatalf("layer %d = %+v, want block %q", i, l, ch)
		}
	}
}

func TestQwen3NextFullAttentionEveryFourth(t *testing.T) {
	m := mustLoad(t, "qwen3-next-80b-a3b-thinking")
	for i, l := range m.Layers {
		want := spec.MixerMamba
		if (i+1)%4 == 0 {
			want = spec.MixerGQA
		}
		if l.Mixer != want {
			t.Errorf("layer %d mixer %q, want %q", i, l.Mixer, want)
		}
	}
	if m.MambaHeads != 32 || m.MambaHeadDim != 128 || m.SSMStateSize != 128 || m.NGroups != 16 || m.ConvKernel != 4 {
		t.Errorf("GDN mapping = heads %d dim %d state %d groups %d kernel %d", m.MambaHeads, m.MambaHeadDim, m.SSMStateSize, m.NGroups, m.ConvKernel)
	}
}

// totals sums the decoder layers' buffers (MTP layers excluded, as SOURCES.md counts).
func totals(m spec.Model) (perToken, perSeq int64) {
	for _, l := range m.Layers {
		if l.MTP {
			continue
		}
		for _, b := range l.Buffers {
			perToken += b.BytesPerToken
			perSeq += b.BytesPerSeq
		}
	}
	return
}

// The expected figures are the ones derived in /work/shared/models/SOURCES.md.
func TestFillBuffersSourcesOracle(t *testing.T) {
	fp32, bf16conv := Dtypes{SSM: "float32", Conv: "float32"}, Dtypes{SSM: "float32", Conv: "bfloat16"}
	tests := []struct {
		model    string
		d        Dtypes
		tp       int
		tok, seq int64
	}{
		{"deepseek-v3.2", Dtypes{KV: "bf16"}, 1, 78324, 0},
		{"deepseek-v3.2", Dtypes{KV: "fp8"}, 1, 43188, 0},
		{"deepseek-v3.2", Dtypes{KV: "fp8"}, 8, 43188, 0}, // MLA latent is replicated over TP
		{"deepseek-v3", Dtypes{KV: "auto"}, 1, 70272, 0},
		{"deepseek-v3", Dtypes{KV: "fp8"}, 1, 35136, 0},
		{"glm-5", Dtypes{KV: "bf16"}, 1, 100152, 0},
		{"glm-5.1", Dtypes{KV: "fp8"}, 1, 55224, 0},
		{"glm-5.2", Dtypes{KV: "fp8"}, 1, 44928 + 10296, 0}, // assumption: every layer stores indexer keys
		{"llama-3.1-8b", Dtypes{KV: "bf16"}, 1, 131072, 0},
		{"llama-3.1-8b-instruct", Dtypes{KV: "fp8"}, 1, 65536, 0},
		{"llama-3.1-8b", Dtypes{KV: "bf16"}, 2, 65536, 0},     // 4 KV heads per rank
		{"llama-3.1-8b", Dtypes{KV: "bf16"}, 16, 32 * 512, 0}, // 8 KV heads replicated: 1 per rank
		{"nemotron-3-ultra-550b-a55b", Dtypes{KV: "bf16", SSM: "float32", Conv: "float32"}, 1, 12288, 413270016},
		{"nemotron-3-ultra-550b-a55b", Dtypes{KV: "fp8", SSM: "float32", Conv: "bfloat16"}, 1, 6144, 407961600},
		{"nemotron-3-super-120b-a12b-fp8", Dtypes{KV: "bf16", SSM: fp32.SSM, Conv: fp32.Conv}, 1, 8192, 172687360},
		{"nemotron-3-super-120b-a12b-fp8", Dtypes{KV: "fp8", SSM: bf16conv.SSM, Conv: bf16conv.Conv}, 1, 4096, 170229760},
		{"nemotron-3-nano-30b-a3b", Dtypes{KV: "bf16"}, 1, 6144, 49930240}, // auto = fp32 state and conv
		{"nemotron-3-nano-30b-a3b", Dtypes{KV: "fp8", Conv: "bf16"}, 1, 3072, 49082368},
		// tp=2: conv (2048 + 2*4*128)*3*4 B, ssm 32*64*128*4 B, 23 layers; 1 KV head per rank.
		{"nemotron-3-nano-30b-a3b", Dtypes{KV: "bf16"}, 2, 6 * 512, 23 * (36864 + 1048576)},
		{"nemotron-h-56b-base-8k", Dtypes{KV: "bf16"}, 1, 40960, 919240704},
		{"nemotron-h-56b-base-8k", Dtypes{KV: "fp8", Conv: "bfloat16"}, 1, 20480, 912605184},
		{"qwen3-next-80b-a3b-thinking", Dtypes{KV: "bf16", SSM: "float32", Conv: "float32"}, 1, 24576, 79036416},
		{"qwen3-next-80b-a3b-thinking", Dtypes{KV: "fp8", SSM: "bfloat16", Conv: "bfloat16"}, 1, 12288, 39518208},
	}
	for _, tt := range tests {
		m := mustLoad(t, tt.model)
		if err := FillBuffers(&m, tt.d, tt.tp); err != nil {
			t.Fatalf("FillBuffers(%s, %+v, %d): %v", tt.model, tt.d, tt.tp, err)
		}
		if err := m.Validate(); err != nil {
			t.Fatalf("%s: Validate after FillBuffers: %v", tt.model, err)
		}
		tok, seq := totals(m)
		if tok != tt.tok || seq != tt.seq {
			t.Errorf("FillBuffers(%s, %+v, tp=%d): %d B/token, %d B/seq; want %d, %d", tt.model, tt.d, tt.tp, tok, seq, tt.tok, tt.seq)
		}
	}
}

func TestFillBuffersRolesAndMTP(t *testing.T) {
	m := mustLoad(t, "deepseek-v3.2")
	if err := FillBuffers(&m, Dtypes{KV: "fp8"}, 1); err != nil {
		t.Fatal(err)
	}
	last := m.Layers[len(m.Layers)-1]
	want := []spec.Buffer{{Role: spec.RoleLatent, BytesPerToken: 576}, {Role: spec.RoleIndexKey, BytesPerToken: 132}}
	if !last.MTP || !slices.Equal(last.Buffers, want) {
		t.Errorf("MTP layer = %+v, want MTP with buffers %+v", last, want)
	}
	n := mustLoad(t, "nemotron-3-nano-30b-a3b")
	if err := FillBuffers(&n, Dtypes{}, 1); err != nil {
		t.Fatal(err)
	}
	wantM := []spec.Buffer{{Role: spec.RoleConvState, BytesPerSeq: 73728}, {Role: spec.RoleSSMState, BytesPerSeq: 2097152}}
	if !slices.Equal(n.Layers[0].Buffers, wantM) || n.Layers[1].HasCache() {
		t.Errorf("nano layers 0,1 = %+v, %+v; want %+v and no cache", n.Layers[0].Buffers, n.Layers[1].Buffers, wantM)
	}
	// Refilling replaces, never appends.
	if err := FillBuffers(&n, Dtypes{KV: "fp8"}, 2); err != nil {
		t.Fatal(err)
	}
	if len(n.Layers[0].Buffers) != 2 {
		t.Errorf("refill left %d buffers on a mamba layer, want 2", len(n.Layers[0].Buffers))
	}
}

func TestFillBuffersErrors(t *testing.T) {
	tests := []struct {
		model string
		d     Dtypes
		tp    int
		want  string
	}{
		{"llama-3.1-8b", Dtypes{}, 0, `model "llama-3.1-8b": tensor parallel size 0 must be >= 1`},
		{"llama-3.1-8b", Dtypes{}, 3, `model "llama-3.1-8b": tensor parallel size 3 does not divide the 32 attention heads`},
		{"nemotron-3-nano-30b-a3b", Dtypes{}, 128, `model "nemotron-3-nano-30b-a3b": tensor parallel size 128 does not divide the 32 attention heads`},
		{"nemotron-3-nano-30b-a3b/48", Dtypes{}, 32, `model "nemotron-3-nano-30b-a3b": tensor parallel size 32 does not divide the 48 mamba heads`},
		{"llama-3.1-8b", Dtypes{KV: "nvfp4"}, 1, `kv cache dtype "nvfp4": allowed auto, bf16, fp8, float32`},
		{"llama-3.1-8b", Dtypes{SSM: "int8"}, 1, `ssm state dtype "int8": allowed auto, float32, float16, bfloat16`},
		{"llama-3.1-8b", Dtypes{Conv: "fp8"}, 1, `conv state dtype "fp8": allowed auto, float32, float16, bfloat16`},
	}
	for _, tt := range tests {
		name, heads, _ := strings.Cut(tt.model, "/")
		m := mustLoad(t, name)
		if heads != "" {
			m.MambaHeads = 48 // synthetic: 32 attention heads divide by 32, 48 mamba heads do not
		}
		before := m.Layers[0].Buffers
		err := FillBuffers(&m, tt.d, tt.tp)
		if err == nil || err.Error() != tt.want {
			t.Errorf("FillBuffers(%s, %+v, %d) = %v, want %q", tt.model, tt.d, tt.tp, err, tt.want)
		}
		if !slices.Equal(m.Layers[0].Buffers, before) {
			t.Errorf("FillBuffers(%s) changed the model on error", tt.model)
		}
	}
}

func TestSanitizeJSON(t *testing.T) {
	tests := []struct{ in, want string }{
		{`{"a": [0.0, Infinity]}`, `{"a": [0.0, 1e308]}`},
		{`{"a": -Infinity, "b": NaN}`, `{"a": -1e308, "b": null}`},
		{`{"Infinity": "NaN or Infinity", "x": "a\"Infinity"}`, `{"Infinity": "NaN or Infinity", "x": "a\"Infinity"}`},
		{`{"a": 1}`, `{"a": 1}`},
	}
	for _, tt := range tests {
		if got := string(sanitizeJSON([]byte(tt.in))); got != tt.want {
			t.Errorf("sanitizeJSON(%s) = %s, want %s", tt.in, got, tt.want)
		}
	}
}

func TestLoadPathAndErrors(t *testing.T) {
	dir := t.TempDir()
	data, err := os.ReadFile(filepath.Join("presets", "llama-3.1-8b.json"))
	if err != nil {
		t.Fatal(err)
	}
	sub := filepath.Join(dir, "my-llama")
	if err := os.Mkdir(sub, 0o755); err != nil {
		t.Fatal(err)
	}
	for path, wantName := range map[string]string{
		filepath.Join(sub, "config.json"): "my-llama",
		filepath.Join(dir, "tiny.json"):   "tiny",
	} {
		if err := os.WriteFile(path, data, 0o644); err != nil {
			t.Fatal(err)
		}
		m, err := Load(path)
		if err != nil || m.Name != wantName || len(m.Layers) != 32 {
			t.Errorf("Load(%s) = %q with %d layers, %v; want %q with 32", path, m.Name, len(m.Layers), err, wantName)
		}
	}
	if _, err := Load("llama-9"); err == nil || !strings.Contains(err.Error(), `unknown model preset "llama-9"; presets: deepseek-v3, deepseek-v3.2,`) {
		t.Errorf("Load(llama-9) = %v, want an error listing presets", err)
	}
	if _, err := Load(filepath.Join(dir, "missing.json")); err == nil || !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Load(missing.json) = %v, want ErrNotExist", err)
	}
}

func TestParseErrors(t *testing.T) {
	tests := []struct {
		name, json string
		want       []string
	}{
		{"arch", `{"architectures":["GPT2LMHeadModel"],"model_type":"gpt2"}`,
			[]string{`model "arch": architecture "GPT2LMHeadModel" (model_type "gpt2") is not supported; supported: DeepseekV32ForCausalLM, DeepseekV3ForCausalLM,`}},
		{"syntax", `{"architectures": [`, []string{`model "syntax": config.json: unexpected end of JSON input`}},
		{"llama", `{"architectures":["LlamaForCausalLM"],"hidden_size":64,"vocab_size":10,"max_position_embeddings":0,"num_attention_heads":4,"intermediate_size":8}`,
			[]string{`model "llama": config field max_position_embeddings is 0, want > 0`, `model "llama": config field num_hidden_layers is missing`}},
		{"nemo", `{"architectures":["NemotronHForCausalLM"],"hidden_size":64,"vocab_size":10,"max_position_embeddings":8,"num_attention_heads":4,"num_hidden_layers":3,
			"hybrid_override_pattern":"M*X","mamba_num_heads":4,"mamba_head_dim":16,"ssm_state_size":8,"n_groups":1,"conv_kernel":4}`,
			[]string{`model "nemo": config field hybrid_override_pattern has 'X' at position 2; want M, *, E or -`,
				`model "nemo": config field num_hidden_layers 3 does not match the 2 blocks of hybrid_override_pattern`}},
	}
	for _, tt := range tests {
		_, err := Parse(tt.name, []byte(tt.json))
		if err == nil {
			t.Errorf("Parse(%s) = nil error", tt.name)
			continue
		}
		for _, w := range tt.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("Parse(%s) error %q does not contain %q", tt.name, err, w)
			}
		}
	}
}

func TestSlidingWindowAndLayerTypes(t *testing.T) {
	base := `"hidden_size":64,"vocab_size":10,"max_position_embeddings":64,"num_attention_heads":4,"num_key_value_heads":2,"intermediate_size":8,"num_hidden_layers":3`
	tests := []struct {
		json string
		want []int
	}{
		{`{"architectures":["MistralForCausalLM"],` + base + `,"sliding_window":16}`, []int{16, 16, 16}},
		{`{"architectures":["Qwen2ForCausalLM"],` + base + `,"sliding_window":16,"use_sliding_window":false}`, []int{0, 0, 0}},
		{`{"architectures":["LlamaForCausalLM"],` + base + `,"sliding_window":null}`, []int{0, 0, 0}},
		{`{"model_type":"qwen3",` + base + `,"sliding_window":16,"layer_types":["sliding_attention","full_attention","sliding_attention"]}`, []int{16, 0, 16}},
	}
	for _, tt := range tests {
		m, err := Parse("w", []byte(tt.json))
		if err != nil {
			t.Fatalf("Parse(%s): %v", tt.json, err)
		}
		var got []int
		for _, l := range m.Layers {
			got = append(got, l.Window)
		}
		if !slices.Equal(got, tt.want) || m.HeadDim != 16 {
			t.Errorf("Parse(%s) windows %v head_dim %d, want %v and 16", tt.json, got, m.HeadDim, tt.want)
		}
	}
}

// A layers_block_type list and the equivalent pattern give the same model.
func TestNemotronListEqualsPattern(t *testing.T) {
	common := `"architectures":["NemotronHForCausalLM"],"hidden_size":64,"vocab_size":10,"max_position_embeddings":8,"num_attention_heads":4,
		"num_key_value_heads":2,"head_dim":16,"mamba_num_heads":4,"mamba_head_dim":16,"ssm_state_size":8,"n_groups":2,"conv_kernel":4,
		"n_routed_experts":4,"num_experts_per_tok":2,"moe_intermediate_size":8,"intermediate_size":8,"num_nextn_predict_layers":2`
	a, err := Parse("a", []byte(`{`+common+`,"hybrid_override_pattern":"ME*-","mtp_hybrid_override_pattern":"*E"}`))
	if err != nil {
		t.Fatal(err)
	}
	b, err := Parse("a", []byte(`{`+common+`,"layers_block_type":["mamba","moe","attention","mlp"],"mtp_layers_block_type":["attention","moe"]}`))
	if err != nil {
		t.Fatal(err)
	}
	// transformers 5 writes linear_attention for Mamba2, full_attention for
	// attention.
	c, err := Parse("a", []byte(`{`+common+`,"layers_block_type":["linear_attention","moe","full_attention","mlp"],"mtp_layers_block_type":["full_attention","moe"]}`))
	if err != nil {
		t.Fatal(err)
	}
	same := func(x, y spec.Layer) bool {
		return x.Index == y.Index && x.Mixer == y.Mixer && x.FFN == y.FFN && x.MTP == y.MTP
	}
	if len(a.Layers) != 6 || a.NumNextN != 2 || !slices.EqualFunc(a.Layers, b.Layers, same) || !slices.EqualFunc(a.Layers, c.Layers, same) {
		t.Errorf("pattern model %+v\n list model %+v\n transformers 5 list model %+v", a.Layers, b.Layers, c.Layers)
	}
}

func TestSplitStages(t *testing.T) {
	ds := mustLoad(t, "deepseek-v3.2") // 61 decoder + 1 MTP
	nano := mustLoad(t, "nemotron-3-nano-30b-a3b")
	tests := []struct {
		m    spec.Model
		pp   int
		want [][2]int
	}{
		{ds, 1, [][2]int{{0, 62}}},
		{ds, 2, [][2]int{{0, 31}, {31, 62}}},
		{ds, 4, [][2]int{{0, 16}, {16, 31}, {31, 46}, {46, 62}}},
		{nano, 3, [][2]int{{0, 18}, {18, 35}, {35, 52}}},
	}
	for _, tt := range tests {
		got, err := SplitStages(tt.m, tt.pp)
		if err != nil || !slices.Equal(got, tt.want) {
			t.Errorf("SplitStages(%s, %d) = %v, %v; want %v", tt.m.Name, tt.pp, got, err, tt.want)
		}
	}
	for _, pp := range []int{0, -1, 62} {
		if _, err := SplitStages(ds, pp); err == nil {
			t.Errorf("SplitStages(deepseek-v3.2, %d) = nil error", pp)
		}
	}
	_, err := SplitStages(ds, 62)
	if want := `pipeline parallel size 62 exceeds the 61 decoder layers of model "deepseek-v3.2"`; err == nil || err.Error() != want {
		t.Errorf("SplitStages(62) error %v, want %q", err, want)
	}
}

func within(got, want, tol float64) bool { return math.Abs(got-want) <= tol*want }

func TestParamCount(t *testing.T) {
	tests := []struct {
		model string
		want  float64
	}{
		{"deepseek-v3", 671e9},
		{"deepseek-v3.2", 671e9},
		{"llama-3.1-8b", 8.0e9},
		{"nemotron-3-nano-30b-a3b", 31.6e9}, // model card: 31.6B total
		{"nemotron-3-super-120b-a12b-fp8", 120e9},
		{"nemotron-3-ultra-550b-a55b", 550e9},
		{"nemotron-h-56b-base-8k", 56e9},
		{"qwen3-next-80b-a3b-thinking", 80e9},
		{"glm-5", 744e9},
	}
	for _, tt := range tests {
		m := mustLoad(t, tt.model)
		if got := float64(ParamCount(m)); !within(got, tt.want, 0.03) {
			t.Errorf("ParamCount(%s) = %.2fB, want %.1fB ±3%%", tt.model, got/1e9, tt.want/1e9)
		}
	}
}

func TestWeightBytes(t *testing.T) {
	llama := mustLoad(t, "llama-3.1-8b")
	n := len(llama.Layers)
	if got, want := WeightBytes(llama, 0, n, "bf16", 1), 2*ParamCount(llama); got < want-1 || got > want+1 {
		t.Errorf("WeightBytes(llama, bf16) = %d, want 2 * ParamCount = %d", got, want)
	}
	// fp8: projections 1 B, embeddings and head (2 * 128256 * 4096) stay bf16.
	embed := int64(2 * 128256 * 4096)
	fp8 := WeightBytes(llama, 0, n, "fp8", 1)
	if want := ParamCount(llama) + embed; !within(float64(fp8), float64(want), 0.001) {
		t.Errorf("WeightBytes(llama, fp8) = %d, want ≈ %d", fp8, want)
	}
	if got := WeightBytes(llama, 0, n, "fp4", 1); got != fp8 {
		t.Errorf("WeightBytes(llama, fp4) = %d, want fp8's %d (no experts to quantize)", got, fp8)
	}

	ds := mustLoad(t, "deepseek-v3")
	bf, f8, f4, w4 := WeightBytes(ds, 0, len(ds.Layers), "bf16", 1), WeightBytes(ds, 0, len(ds.Layers), "fp8", 1),
		WeightBytes(ds, 0, len(ds.Layers), "fp4", 1), WeightBytes(ds, 0, len(ds.Layers), "w4afp8", 1)
	if !(bf > f8 && f8 > f4 && f4 > w4) {
		t.Errorf("deepseek-v3 bytes bf16 %d, fp8 %d, fp4 %d, w4afp8 %d: want strictly decreasing", bf, f8, f4, w4)
	}
	// DeepSeek-V3 FP8 checkpoint is ~690 GB with MTP (685B params, fp8 weights).
	if !within(float64(f8), 690e9, 0.03) {
		t.Errorf("deepseek-v3 fp8 = %.1f GB, want ≈ 690 GB", float64(f8)/1e9)
	}

	for _, name := range []string{"deepseek-v3.2", "nemotron-3-super-120b-a12b-fp8", "qwen3-next-80b-a3b-thinking"} {
		m := mustLoad(t, name)
		whole := WeightBytes(m, 0, len(m.Layers), "fp8", 1)
		for pp := 1; pp <= 4; pp++ {
			stages, err := SplitStages(m, pp)
			if err != nil {
				t.Fatal(err)
			}
			var sum int64
			for _, s := range stages {
				sum += WeightBytes(m, s[0], s[1], "fp8", 1)
			}
			if d := sum - whole; d < -int64(pp) || d > int64(pp) { // per-stage rounding only
				t.Errorf("%s pp=%d: stages sum to %d, whole model %d", name, pp, sum, whole)
			}
		}
		for _, tp := range []int{2, 8} {
			per := WeightBytes(m, 0, len(m.Layers), "fp8", tp)
			if float64(per)*float64(tp) < float64(whole) || float64(per)*float64(tp) > 1.1*float64(whole) {
				t.Errorf("%s tp=%d: %d per GPU x %d vs %d whole; want within [1, 1.1]x (replicated parts only)", name, tp, per, tp, whole)
			}
		}
	}
}

func BenchmarkLoadFill(b *testing.B) {
	for b.Loop() {
		m, err := Load("nemotron-3-ultra-550b-a55b")
		if err != nil {
			b.Fatal(err)
		}
		if err := FillBuffers(&m, Dtypes{KV: "fp8"}, 4); err != nil {
			b.Fatal(err)
		}
	}
}

// A checkpoint directory loads as a model named after it, with Checkpoint
// set to its absolute path; one without weights, or without a config, is
// refused naming what is missing.
func TestLoadCheckpoint(t *testing.T) {
	src := filepath.Join("..", "..", "device", "hf", "testdata", "qwen3")
	m, err := Load(src)
	if err != nil {
		t.Fatal(err)
	}
	abs, _ := filepath.Abs(src)
	if m.Name != "qwen3" || m.Checkpoint != abs || m.Arch != "Qwen3ForCausalLM" || len(m.Layers) != 3 || m.HeadDim != 32 || m.KVHeads != 2 {
		t.Errorf("Load(%s) = name %q checkpoint %q arch %s layers %d head dim %d kv heads %d", src, m.Name, m.Checkpoint, m.Arch, len(m.Layers), m.HeadDim, m.KVHeads)
	}
	if dt, err := CheckpointDtype(src); err != nil || dt != "float32" {
		t.Errorf("CheckpointDtype(%s) = %q, %v; want float32", src, dt, err)
	}
	if mi, err := Load(filepath.Join("..", "..", "device", "hf", "testdata", "mistral")); err != nil || mi.Layers[0].Window != 32 {
		t.Errorf("mistral: window %d, %v; want 32 (sliding_window)", mi.Layers[0].Window, err)
	}
	if n, err := KVBytes("float32"); err != nil || n != 4 {
		t.Errorf("KVBytes(float32) = %d, %v; want 4", n, err)
	}
	dir := t.TempDir()
	data, err := os.ReadFile(filepath.Join(src, "config.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "config.json"), data, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(dir); err == nil || !strings.Contains(err.Error(), "neither model.safetensors nor model.safetensors.index.json") {
		t.Errorf("Load(dir without weights) = %v, want an error naming the weight files", err)
	}
	if _, err := Load(t.TempDir()); err == nil || !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Load(empty dir) = %v, want ErrNotExist for config.json", err)
	}
}
