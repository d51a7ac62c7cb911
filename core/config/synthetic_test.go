package config

import (
	"fmt"
	"strings"
	"testing"

	"pgregory.net/rapid"

	"github.com/kvx-dev/kvx/plugins/model"
	"github.com/kvx-dev/kvx/plugins/v1/spec"
)

// With device cpu the resolved model is the synthetic one, with or without
// overrides, and every model-derived default follows it.
func TestSyntheticModel(t *testing.T) {
	c, _ := load(t, nil, nil, []string{"model=deepseek-v3.2", "device=cpu", "pipeline_parallel_size=2"})
	m := c.ModelSpec()
	if m.Name != "deepseek-v3.2-synthetic" || m.Hidden != 64 || m.Vocab != 258 || len(m.Layers) != 5 || m.NumNextN != 1 {
		t.Errorf("ModelSpec() = %s hidden %d vocab %d layers %d mtp %d, want the default synthetic model",
			m.Name, m.Hidden, m.Vocab, len(m.Layers), m.NumNextN)
	}
	if c.MaxSeqLen != 4096 || c.AttentionBackend != "dsa" || c.CacheManager != "v2" {
		t.Errorf("max_seq_len %d backend %s manager %s, want 4096 dsa v2", c.MaxSeqLen, c.AttentionBackend, c.CacheManager)
	}

	f := writeYAML(t, "model: nemotron-3-nano-30b-a3b\ndevice: cpu\nsynthetic:\n  hidden: 96\n  layers: 5\n  mamba_heads: 8\n")
	c, _ = load(t, []string{f}, []string{"KVX_SYNTHETIC__HEADS=8"}, []string{"synthetic.max_position=2048"})
	m = c.ModelSpec()
	want := model.SyntheticSpec{Hidden: 96, Layers: 5, MambaHeads: 8, Heads: 8, MaxPosition: 2048}
	if c.Synthetic != want {
		t.Errorf("Synthetic = %+v, want %+v", c.Synthetic, want)
	}
	if m.Hidden != 96 || len(m.Layers) != 5 || m.MambaHeads != 8 || m.Heads != 8 || c.MaxSeqLen != 2048 || c.CacheManager != "mamba" {
		t.Errorf("model hidden %d layers %d mamba heads %d heads %d max_seq_len %d manager %s",
			m.Hidden, len(m.Layers), m.MambaHeads, m.Heads, c.MaxSeqLen, c.CacheManager)
	}
	flat := c.Flatten()
	if flat["synthetic.hidden"] != 96 || flat["synthetic.heads"] != 8 || flat["synthetic.vocab"] != nil {
		t.Errorf("Flatten synthetic.hidden %v heads %v vocab %v, want 96 8 nil", flat["synthetic.hidden"], flat["synthetic.heads"], flat["synthetic.vocab"])
	}
	// One synthetic MTP layer per draft depth unless mtp_layers is given.
	c, _ = load(t, nil, nil, []string{"model=deepseek-v3", "device=cpu", "speculative_config.decoding_type=MTP", "speculative_config.max_draft_len=3"})
	if m := c.ModelSpec(); m.NumNextN != 3 || c.Speculative.MaxDraftLen != 3 {
		t.Errorf("max_draft_len 3: %d MTP layers, max_draft_len %d; want 3 3", m.NumNextN, c.Speculative.MaxDraftLen)
	}
	c, _ = load(t, nil, nil, []string{"model=deepseek-v3", "device=cpu", "speculative_config.decoding_type=MTP", "synthetic.mtp_layers=2"})
	if m := c.ModelSpec(); m.NumNextN != 2 {
		t.Errorf("synthetic.mtp_layers 2: %d MTP layers, want 2", m.NumNextN)
	}

	// Device cuda computes as cpu does: the same synthetic model.
	cu, _ := load(t, nil, nil, []string{"model=deepseek-v3.2", "device=cuda", "pipeline_parallel_size=2"})
	if got, want := cu.ModelSpec(), m0(t); got.Name != want.Name || got.Hidden != want.Hidden || len(got.Layers) != len(want.Layers) {
		t.Errorf("device cuda: ModelSpec() = %s hidden %d layers %d, want device cpu's %s hidden %d layers %d",
			got.Name, got.Hidden, len(got.Layers), want.Name, want.Hidden, len(want.Layers))
	}

	// Without a computing device the full model stays.
	c, _ = load(t, nil, nil, []string{"model=deepseek-v3.2"})
	if m := c.ModelSpec(); m.Hidden != 7168 {
		t.Errorf("device sim: hidden %d, want 7168", m.Hidden)
	}
}

// m0 is device cpu's synthetic DeepSeek-V3.2 over two stages.
func m0(t *testing.T) spec.Model {
	c, _ := load(t, nil, nil, []string{"model=deepseek-v3.2", "device=cpu", "pipeline_parallel_size=2"})
	return c.ModelSpec()
}

func TestSyntheticErrors(t *testing.T) {
	tests := []struct {
		name string
		sets []string
		want []string
	}{
		{"device sim", []string{"synthetic.hidden=32", "synthetic.layers=2"},
			[]string{`synthetic.layers, synthetic.hidden: set with device "sim" (default); synthetic models run only on a computing device (device: cpu or cuda)`}},
		{"device sim given", []string{"device=sim", "synthetic.vocab=300"},
			[]string{`synthetic.vocab: set with device "sim" (--set); synthetic models run only on a computing device (device: cpu or cuda)`}},
		{"tensor parallel on cuda", []string{"device=cuda", "tensor_parallel_size=2"},
			[]string{`tensor_parallel_size: 2 with device cuda (--set): the cuda device runs one rank per stage; set 1`}},
		{"cuda in process", []string{"device=cuda", "isolation=inprocess"},
			[]string{`isolation: inprocess (--set) with device cuda (--set): device cuda runs in the backend plugin binaries built with make cuda-build; set isolation: plugin`}},
		{"negative", []string{"device=cpu", "synthetic.heads=-1"},
			[]string{`synthetic.heads: -1 (--set) is out of range; allowed: 0 <= value <= 2147483647`}},
		{"not an int", []string{"device=cpu", "synthetic.hidden=wide"}, []string{`synthetic.hidden: "wide" (--set) is not an integer`}},
		{"unknown", []string{"device=cpu", "synthetic.hiden=32"}, []string{`unknown key "synthetic.hiden" (--set); did you mean "synthetic.hidden"?`}},
		{"heads kv", []string{"device=cpu", "synthetic.heads=6", "synthetic.kv_heads=4"},
			[]string{`synthetic.heads: 6 is not a multiple of synthetic.kv_heads 4 (synthetic model of "llama-3.1-8b" for device cpu)`}},
		{"two problems", []string{"device=cpu", "synthetic.vocab=10", "synthetic.experts=4"},
			[]string{`synthetic.vocab: 10 is out of range; allowed: 258`, `synthetic.experts: 4 is set but model "llama-3.1-8b" has no MoE layers`}},
		{"pp over synthetic layers", []string{"device=cpu", "synthetic.layers=2", "pipeline_parallel_size=3"},
			[]string{`pipeline_parallel_size: pipeline parallel size 3 exceeds the 2 decoder layers of model "llama-3.1-8b-synthetic"`}},
		{"tensor parallel on cpu", []string{"device=cpu", "tensor_parallel_size=2"},
			[]string{`tensor_parallel_size: 2 with device cpu (--set): the cpu device runs one rank per stage; set 1`}},
	}
	for _, tt := range tests {
		sets := append([]string{"model=llama-3.1-8b"}, tt.sets...)
		_, _, err := Load(testReg, nil, nil, sets)
		if err == nil {
			t.Errorf("%s: Load(%v) = nil error, want %q", tt.name, sets, tt.want)
			continue
		}
		for _, w := range tt.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: Load(%v) = %q, want it to contain %q", tt.name, sets, err, w)
			}
		}
	}
}

// Any one synthetic override with device cpu either loads, and the model
// shows it, or fails with a message that names the key and the value.
func TestSyntheticKeysProperty(t *testing.T) {
	fields := model.SyntheticFields()
	presets := []string{"llama-3.1-8b", "deepseek-v3.2", "nemotron-3-super-120b-a12b-fp8", "qwen3-next-80b-a3b-thinking"}
	rapid.Check(t, func(t *rapid.T) {
		f := fields[rapid.IntRange(0, len(fields)-1).Draw(t, "field")]
		preset := rapid.SampledFrom(presets).Draw(t, "preset")
		v := rapid.OneOf(rapid.IntRange(-2, 70), rapid.IntRange(0, 1<<15)).Draw(t, "value")
		key := "synthetic." + f.Key
		c, _, err := Load(testReg, nil, nil, []string{"model=" + preset, "device=cpu", fmt.Sprintf("%s=%d", key, v)})
		if err != nil {
			if msg := err.Error(); !strings.Contains(msg, key) || !strings.Contains(msg, fmt.Sprint(v)) {
				t.Fatalf("Load(%s=%d) error %q does not name the key and the value", key, v, msg)
			}
			return
		}
		if got := c.Flatten()[key]; v != 0 && got != v {
			t.Fatalf("Flatten()[%s] = %v, want %d", key, got, v)
		}
		m := c.ModelSpec()
		if err := model.FillBuffers(&m, c.Dtypes(), 1); err != nil {
			t.Fatalf("FillBuffers after %s=%d: %v", key, v, err)
		}
		want := map[string]int{"hidden": m.Hidden, "vocab": m.Vocab, "heads": m.Heads, "max_position": m.MaxPosition, "experts": m.Experts,
			"mamba_heads": m.MambaHeads, "kv_lora_rank": m.KVLoraRank, "layers": len(m.Layers) - m.NumNextN, "mtp_layers": m.NumNextN}
		if got, ok := want[f.Key]; ok && v != 0 && got != v {
			t.Fatalf("%s=%d: model has %d", key, v, got)
		}
	})
}

// model: DIR (a checkpoint directory) keeps the checkpoint's shapes on
// device cpu (no synthetic model), resolves kv_cache_config.dtype auto to
// float32 for a float32 checkpoint, and refuses synthetic keys.
func TestCheckpointModel(t *testing.T) {
	dir := "../../device/hf/testdata/llama"
	c, _ := load(t, nil, nil, []string{"model=" + dir, "device=cpu"})
	m := c.ModelSpec()
	if m.Name != "llama" || m.Checkpoint == "" || m.Hidden != 64 || len(m.Layers) != 3 || m.Vocab != 256 {
		t.Errorf("ModelSpec() = %s checkpoint %q hidden %d layers %d vocab %d, want the checkpoint's llama", m.Name, m.Checkpoint, m.Hidden, len(m.Layers), m.Vocab)
	}
	if c.KVCache.Dtype != "float32" || c.AttentionBackend != "gqa" || c.MaxSeqLen != 256 {
		t.Errorf("kv dtype %q backend %q max_seq_len %d, want float32 gqa 256", c.KVCache.Dtype, c.AttentionBackend, c.MaxSeqLen)
	}
	if c, _ := load(t, nil, nil, []string{"model=" + dir, "device=cpu", "kv_cache_config.dtype=bf16"}); c.KVCache.Dtype != "bf16" {
		t.Errorf("kv_cache_config.dtype=bf16 became %q", c.KVCache.Dtype)
	}
	_, _, err := Load(testReg, nil, nil, []string{"model=" + dir, "device=cpu", "synthetic.hidden=32"})
	if err == nil || !strings.Contains(err.Error(), "synthetic.hidden: set with model") {
		t.Errorf("synthetic keys with a checkpoint: %v, want an error naming synthetic.hidden", err)
	}
}

// Device cuda takes what device cpu takes: a checkpoint directory keeps its
// own weights and shapes, with the same kv dtype under the exact numerics
// (dtype float32); the fast numerics, cuda's default, keep bf16 KV.
func TestCheckpointOnCUDA(t *testing.T) {
	files := []string{"../../scenarios/hf-llama.yaml"}
	cpu, _ := load(t, files, nil, nil)
	if fast, _ := load(t, files, nil, []string{"device=cuda"}); fast.Dtype != "bfloat16" || fast.KVCache.Dtype != "auto" {
		t.Errorf("device cuda: dtype %q kv %q, want bfloat16 and auto (bf16)", fast.Dtype, fast.KVCache.Dtype)
	}
	cu, _ := load(t, files, nil, []string{"device=cuda", "dtype=float32"})
	a, b := cpu.ModelSpec(), cu.ModelSpec()
	if b.Checkpoint == "" || b.Checkpoint != a.Checkpoint || b.Hidden != a.Hidden || len(b.Layers) != len(a.Layers) || cu.KVCache.Dtype != cpu.KVCache.Dtype {
		t.Errorf("device cuda: checkpoint %q hidden %d layers %d kv %s; want device cpu's %q %d %d %s",
			b.Checkpoint, b.Hidden, len(b.Layers), cu.KVCache.Dtype, a.Checkpoint, a.Hidden, len(a.Layers), cpu.KVCache.Dtype)
	}
}

// dtype auto is bfloat16 on cuda and float32 elsewhere; bfloat16 on the cpu
// device is refused, naming both keys.
func TestDtype(t *testing.T) {
	files := []string{"../../scenarios/hf-llama.yaml"}
	for _, tc := range []struct {
		set  []string
		want string
	}{
		{nil, "float32"},
		{[]string{"device=cuda"}, "bfloat16"},
		{[]string{"device=cuda", "dtype=bf16"}, "bfloat16"},
		{[]string{"device=cuda", "dtype=fp32"}, "float32"},
		{[]string{"device=sim", "dtype=bfloat16"}, "bfloat16"},
	} {
		if c, _ := load(t, files, nil, tc.set); c.Dtype != tc.want {
			t.Errorf("--set %v: dtype %q, want %q", tc.set, c.Dtype, tc.want)
		}
	}
	_, _, err := Load(testReg, files, nil, []string{"device=cpu", "dtype=bfloat16"})
	if err == nil || !strings.Contains(err.Error(), "dtype: bfloat16") || !strings.Contains(err.Error(), "device cpu") {
		t.Errorf("dtype bfloat16 on cpu: %v, want an error naming dtype and device", err)
	}
	_, _, err = Load(testReg, files, nil, []string{"dtype=float16"})
	if err == nil || !strings.Contains(err.Error(), "dtype") || !strings.Contains(err.Error(), "float16") {
		t.Errorf("dtype float16: %v, want an error naming the key and the value", err)
	}
}
