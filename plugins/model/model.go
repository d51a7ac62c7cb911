// Package model is the one reader of a model's description, imported by the
// engine (core/) and the worker wing (device/) alike, and importing neither:
// it turns a Hugging Face config.json into a spec.Model, fills in its
// per-rank cache buffers, splits it into pipeline stages and estimates its
// weight footprint; it also reads the numerics a worker's model code needs
// from the same file (Numerics, numerics.go), so config.json is parsed here
// only.
//
// Supported architectures (the "architectures" field, or "model_type"):
//
//   - DeepseekV3ForCausalLM: MLA on every layer.
//   - DeepseekV32ForCausalLM, GlmMoeDsaForCausalLM: DSA (MLA latent plus the
//     lightning indexer's key cache) on every layer.
//   - LlamaForCausalLM and the same-shaped MistralForCausalLM,
//     Qwen2ForCausalLM, Qwen3ForCausalLM: GQA, with sliding_window where the
//     config enables it.
//   - NemotronHForCausalLM: one layer per hybrid block (Mamba2, attention, MoE
//     or MLP) from hybrid_override_pattern or layers_block_type.
//   - Qwen3NextForCausalLM: Gated DeltaNet linear-attention layers are mapped
//     to MixerMamba with MambaHeads = linear_num_value_heads, MambaHeadDim =
//     linear_value_head_dim, SSMStateSize = linear_key_head_dim, NGroups =
//     linear_num_key_heads, ConvKernel = linear_conv_kernel_dim, so the Mamba2
//     state formulas give the exact GDN conv and recurrent state sizes. Arch
//     stays Qwen3NextForCausalLM so a worker can tell GDN from Mamba2.
//
// MTP layers (num_nextn_predict_layers) are appended after the decoder layers
// with MTP set; spec.Model.NumNextN counts them.
//
// All functions are safe for concurrent use. Returned models own their slices.
package model

import (
	"bytes"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"

	"github.com/kvx-dev/kvx/plugins/v1/spec"
)

//go:embed presets/*.json
var presetFS embed.FS

// Presets returns the names of the embedded model presets (the file stems of
// presets/*.json, e.g. "deepseek-v3.2"), sorted. The slice is the caller's.
func Presets() []string {
	entries, err := fs.ReadDir(presetFS, "presets")
	if err != nil {
		panic(err) // embedded at build time; cannot fail
	}
	var names []string
	for _, e := range entries {
		if n, ok := strings.CutSuffix(e.Name(), ".json"); ok {
			names = append(names, n)
		}
	}
	slices.Sort(names)
	return names
}

// IsPath reports whether Load treats nameOrPath as a file path rather than a
// preset name: it ends in ".json", contains a path separator or names a
// directory.
func IsPath(nameOrPath string) bool {
	if fi, err := os.Stat(nameOrPath); err == nil && fi.IsDir() {
		return true
	}
	return strings.HasSuffix(nameOrPath, ".json") || strings.ContainsRune(nameOrPath, '/') ||
		strings.ContainsRune(nameOrPath, filepath.Separator)
}

// Load returns the model for a preset name (see Presets) or, when IsPath
// holds, for the config.json at that path, or for a Hugging Face checkpoint
// directory (LoadCheckpoint). The model is named after the preset, or after
// the file stem (the parent directory for "config.json"). Buffers are not
// filled; call FillBuffers.
func Load(nameOrPath string) (spec.Model, error) {
	if fi, err := os.Stat(nameOrPath); err == nil && fi.IsDir() {
		return LoadCheckpoint(nameOrPath)
	}
	if IsPath(nameOrPath) {
		data, err := readConfigFile(nameOrPath)
		if err != nil {
			return spec.Model{}, fmt.Errorf("model file: %w", err)
		}
		name := strings.TrimSuffix(filepath.Base(nameOrPath), ".json")
		if name == "config" {
			if dir := filepath.Base(filepath.Dir(nameOrPath)); dir != "." && dir != string(filepath.Separator) {
				name = dir
			}
		}
		return Parse(name, data)
	}
	data, err := presetFS.ReadFile(path.Join("presets", nameOrPath+".json"))
	if err != nil {
		return spec.Model{}, fmt.Errorf("unknown model preset %q; presets: %s (or give a path to a config.json)",
			nameOrPath, strings.Join(Presets(), ", "))
	}
	return Parse(nameOrPath, data)
}

// LoadCheckpoint returns the model of the Hugging Face checkpoint directory
// dir: its config.json parsed as Parse does, named after the directory,
// with Checkpoint set to dir's absolute path so that a computing worker
// loads the weights from there. It fails, naming the file, when config.json
// is unreadable or dir holds neither model.safetensors nor
// model.safetensors.index.json (the weights themselves are the worker's to
// read and check). MTP layers that config.json lists but the weights do not
// hold (no model.layers.<first MTP layer>.* tensor) are dropped: the model
// has no MTP head.
func LoadCheckpoint(dir string) (spec.Model, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return spec.Model{}, fmt.Errorf("checkpoint %s: %w", dir, err)
	}
	data, err := readConfigFile(filepath.Join(abs, "config.json"))
	if err != nil {
		return spec.Model{}, fmt.Errorf("checkpoint %s: %w", dir, err)
	}
	found := false
	for _, w := range []string{"model.safetensors", "model.safetensors.index.json"} {
		if _, err := os.Stat(filepath.Join(abs, w)); err == nil {
			found = true
		}
	}
	if !found {
		return spec.Model{}, fmt.Errorf("checkpoint %s: neither model.safetensors nor model.safetensors.index.json is there", dir)
	}
	m, err := Parse(filepath.Base(abs), data)
	if err != nil {
		return spec.Model{}, err
	}
	if err := dropAbsentMTP(&m, abs); err != nil {
		return spec.Model{}, err
	}
	m.Checkpoint = abs
	return m, nil
}

// CheckpointDtype returns the dtype a checkpoint directory's config.json
// states (dtype, as transformers 5 writes it, else torch_dtype), "" when
// it states none.
func CheckpointDtype(dir string) (string, error) {
	data, err := readConfigFile(filepath.Join(dir, "config.json"))
	if err != nil {
		return "", fmt.Errorf("checkpoint %s: %w", dir, err)
	}
	var c struct {
		Dtype      string `json:"dtype"`
		TorchDtype string `json:"torch_dtype"`
	}
	if err := json.Unmarshal(sanitizeJSON(data), &c); err != nil {
		return "", fmt.Errorf("checkpoint %s: config.json: %w", dir, err)
	}
	if c.Dtype != "" {
		return c.Dtype, nil
	}
	return c.TorchDtype, nil
}

// hfConfig holds the config.json fields the loader reads. Pointers mark
// fields whose absence (or null) matters.
type hfConfig struct {
	Architectures []string `json:"architectures"`
	ModelType     string   `json:"model_type"`

	Hidden           int      `json:"hidden_size"`
	Vocab            int      `json:"vocab_size"`
	MaxPosition      int      `json:"max_position_embeddings"`
	NumLayers        *int     `json:"num_hidden_layers"`
	Heads            int      `json:"num_attention_heads"`
	KVHeads          *int     `json:"num_key_value_heads"`
	HeadDim          *int     `json:"head_dim"`
	AttentionHeadDim *int     `json:"attention_head_dim"`
	SlidingWindow    *int     `json:"sliding_window"`
	UseSlidingWindow *bool    `json:"use_sliding_window"`
	LayerTypes       []string `json:"layer_types"`

	// MLA / DSA.
	QLoraRank     *int     `json:"q_lora_rank"`
	KVLoraRank    int      `json:"kv_lora_rank"`
	QKNopeHeadDim int      `json:"qk_nope_head_dim"`
	QKRopeHeadDim int      `json:"qk_rope_head_dim"`
	VHeadDim      int      `json:"v_head_dim"`
	IndexHeads    int      `json:"index_n_heads"`
	IndexHeadDim  int      `json:"index_head_dim"`
	IndexTopK     int      `json:"index_topk"`
	IndexerTypes  []string `json:"indexer_types"`

	// FFN / MoE.
	Intermediate          int      `json:"intermediate_size"`
	MoEIntermediate       int      `json:"moe_intermediate_size"`
	RoutedExperts         *int     `json:"n_routed_experts"`
	NumExperts            int      `json:"num_experts"` // Qwen naming
	ExpertsPerToken       int      `json:"num_experts_per_tok"`
	SharedExperts         int      `json:"n_shared_experts"`
	SharedIntermediate    int      `json:"moe_shared_expert_intermediate_size"`
	QwenSharedInter       int      `json:"shared_expert_intermediate_size"`
	MoELatent             *int     `json:"moe_latent_size"`
	FirstKDense           int      `json:"first_k_dense_replace"`
	MoELayerFreq          int      `json:"moe_layer_freq"`
	MLPLayerTypes         []string `json:"mlp_layer_types"`
	DecoderSparseStep     int      `json:"decoder_sparse_step"`
	MLPOnlyLayers         []int    `json:"mlp_only_layers"`
	NumNextNPredictLayers int      `json:"num_nextn_predict_layers"`

	// Nemotron-H.
	HybridPattern    string   `json:"hybrid_override_pattern"`
	LayersBlockType  []string `json:"layers_block_type"`
	MTPHybridPattern string   `json:"mtp_hybrid_override_pattern"`
	MTPBlockType     []string `json:"mtp_layers_block_type"`
	MambaHeads       int      `json:"mamba_num_heads"`
	MambaHeadDim     int      `json:"mamba_head_dim"`
	SSMStateSize     int      `json:"ssm_state_size"`
	NGroups          int      `json:"n_groups"`
	ConvKernel       int      `json:"conv_kernel"`
	Expand           int      `json:"expand"`

	// Qwen3-Next.
	FullAttentionInterval int `json:"full_attention_interval"`
	LinearConvKernel      int `json:"linear_conv_kernel_dim"`
	LinearKeyHeadDim      int `json:"linear_key_head_dim"`
	LinearNumKeyHeads     int `json:"linear_num_key_heads"`
	LinearNumValueHeads   int `json:"linear_num_value_heads"`
	LinearValueHeadDim    int `json:"linear_value_head_dim"`
}

// Architecture families.
const (
	archDeepSeekV3  = "DeepseekV3ForCausalLM"
	archDeepSeekV32 = "DeepseekV32ForCausalLM"
	archGLMDSA      = "GlmMoeDsaForCausalLM"
	archLlama       = "LlamaForCausalLM"
	archMistral     = "MistralForCausalLM"
	archQwen2       = "Qwen2ForCausalLM"
	archQwen3       = "Qwen3ForCausalLM"
	archNemotronH   = "NemotronHForCausalLM"
	archQwen3Next   = "Qwen3NextForCausalLM"
)

var modelTypeArch = map[string]string{
	"deepseek_v3":  archDeepSeekV3,
	"deepseek_v32": archDeepSeekV32,
	"glm_moe_dsa":  archGLMDSA,
	"llama":        archLlama,
	"mistral":      archMistral,
	"qwen2":        archQwen2,
	"qwen3":        archQwen3,
	"nemotron_h":   archNemotronH,
	"qwen3_next":   archQwen3Next,
}

func supportedArchs() []string {
	var a []string
	for _, v := range modelTypeArch {
		a = append(a, v)
	}
	slices.Sort(a)
	return a
}

// Parse reads a Hugging Face config.json and returns the model named name.
// Every size the config states is checked against the limits of limits.go
// (MaxLayers, MaxHidden, MaxVocab, ...) before any is used: one above its
// limit is an error naming the field, its value and the limit.
// Bare Infinity, -Infinity and NaN tokens (which Python's json writes and
// encoding/json rejects) are accepted outside strings. Errors name the model,
// the config field and the value; every problem found is reported (joined).
func Parse(name string, data []byte) (spec.Model, error) {
	data = sanitizeJSON(data)
	var c hfConfig
	if err := json.Unmarshal(data, &c); err != nil {
		return spec.Model{}, fmt.Errorf("model %q: config.json: %w", name, err)
	}
	arch := ""
	if len(c.Architectures) > 0 {
		arch = c.Architectures[0]
	}
	if !slices.Contains(supportedArchs(), arch) {
		if a, ok := modelTypeArch[c.ModelType]; ok {
			arch = a
		} else {
			return spec.Model{}, fmt.Errorf("model %q: architecture %q (model_type %q) is not supported; supported: %s",
				name, arch, c.ModelType, strings.Join(supportedArchs(), ", "))
		}
	}

	p := &parser{name: name, c: &c}
	if !p.bounds() {
		return spec.Model{}, errors.Join(p.errs...)
	}
	m := spec.Model{
		Name:        name,
		Arch:        arch,
		Hidden:      c.Hidden,
		Vocab:       c.Vocab,
		MaxPosition: c.MaxPosition,
		Heads:       c.Heads,
	}
	p.positive("hidden_size", c.Hidden)
	p.positive("vocab_size", c.Vocab)
	p.positive("max_position_embeddings", c.MaxPosition)
	p.positive("num_attention_heads", c.Heads)

	switch arch {
	case archDeepSeekV3, archDeepSeekV32, archGLMDSA:
		p.parseMLA(&m)
	case archLlama, archMistral, archQwen2, archQwen3:
		p.parseLlama(&m)
	case archNemotronH:
		p.parseNemotronH(&m)
	case archQwen3Next:
		p.parseQwen3Next(&m)
	}
	if len(p.errs) > 0 {
		return spec.Model{}, errors.Join(p.errs...)
	}
	for i := range m.Layers {
		m.Layers[i].Index = i
		if m.Layers[i].MTP {
			m.NumNextN++
		}
	}
	if err := m.Validate(); err != nil {
		return spec.Model{}, err
	}
	return m, nil
}

type parser struct {
	name string
	c    *hfConfig
	errs []error
}

func (p *parser) errorf(format string, args ...any) {
	p.errs = append(p.errs, fmt.Errorf("model %q: "+format, append([]any{p.name}, args...)...))
}

func (p *parser) positive(field string, v int) {
	if v <= 0 {
		p.errorf("config field %s is %d, want > 0", field, v)
	}
}

func (p *parser) numLayers() int {
	if p.c.NumLayers == nil {
		p.errorf("config field num_hidden_layers is missing")
		return 0
	}
	p.positive("num_hidden_layers", *p.c.NumLayers)
	return max(*p.c.NumLayers, 0)
}

func (p *parser) kvHeads() int {
	if p.c.KVHeads == nil || *p.c.KVHeads == 0 {
		return p.c.Heads // MHA
	}
	return *p.c.KVHeads
}

// headDim returns head_dim, else attention_head_dim (older Nemotron-H), else
// hidden_size / num_attention_heads.
func (p *parser) headDim() int {
	switch {
	case p.c.HeadDim != nil && *p.c.HeadDim > 0:
		return *p.c.HeadDim
	case p.c.AttentionHeadDim != nil && *p.c.AttentionHeadDim > 0:
		return *p.c.AttentionHeadDim
	case p.c.Heads > 0:
		return p.c.Hidden / p.c.Heads
	}
	return 0
}

func (p *parser) experts() int {
	if p.c.RoutedExperts != nil {
		return *p.c.RoutedExperts
	}
	return p.c.NumExperts
}

func add(m *spec.Model, l spec.Layer) { m.Layers = append(m.Layers, l) }

// parseMLA handles DeepSeek-V3 (MLA), DeepSeek-V3.2 and GLM-5 (DSA).
func (p *parser) parseMLA(m *spec.Model) {
	c := p.c
	n := p.numLayers()
	mixer := spec.MixerMLA
	if m.Arch != archDeepSeekV3 {
		mixer = spec.MixerDSA
		p.positive("index_head_dim", c.IndexHeadDim)
		p.positive("index_n_heads", c.IndexHeads)
		p.positive("index_topk", c.IndexTopK)
		m.IndexHeads, m.IndexHeadDim, m.IndexTopK = c.IndexHeads, c.IndexHeadDim, c.IndexTopK
	}
	// GLM-5.2 (IndexShare) marks most layers' indexer "shared": they reuse the
	// top-k of the last "full" layer. Whether such a layer still stores its own
	// indexer keys is not stated by the config. kvx ASSUMES every DSA layer
	// stores indexer keys (the conservative choice: 132 B x 78 layers instead
	// of 132 B x 21 per token), so indexer_types only gets validated here.
	if len(c.IndexerTypes) > 0 && len(c.IndexerTypes) != n {
		p.errorf("config field indexer_types has %d entries, want num_hidden_layers %d", len(c.IndexerTypes), n)
	}
	p.positive("kv_lora_rank", c.KVLoraRank)
	p.positive("qk_rope_head_dim", c.QKRopeHeadDim)
	p.positive("qk_nope_head_dim", c.QKNopeHeadDim)
	p.positive("v_head_dim", c.VHeadDim)
	if c.QLoraRank != nil {
		m.QLoraRank = *c.QLoraRank
	}
	m.KVHeads = p.kvHeads()
	m.KVLoraRank, m.QKNopeHeadDim, m.QKRopeHeadDim, m.VHeadDim = c.KVLoraRank, c.QKNopeHeadDim, c.QKRopeHeadDim, c.VHeadDim
	// The config's head_dim is inconsistent across MLA models (GLM-5: 64,
	// GLM-5.2: 192); the query/key head width is nope + rope.
	m.HeadDim = c.QKNopeHeadDim + c.QKRopeHeadDim
	p.fillMoE(m)

	if len(c.MLPLayerTypes) > 0 && len(c.MLPLayerTypes) != n {
		p.errorf("config field mlp_layer_types has %d entries, want num_hidden_layers %d", len(c.MLPLayerTypes), n)
	}
	freq := max(c.MoELayerFreq, 1)
	for i := range n {
		ffn := spec.FFNDense
		switch {
		case len(c.MLPLayerTypes) == n:
			switch t := c.MLPLayerTypes[i]; t {
			case "sparse", "moe":
				ffn = spec.FFNMoE
			case "dense":
			default:
				p.errorf("config field mlp_layer_types[%d] is %q, want dense or sparse", i, t)
			}
		case m.Experts > 0 && i >= c.FirstKDense && i%freq == 0:
			ffn = spec.FFNMoE
		}
		add(m, spec.Layer{Mixer: mixer, FFN: ffn})
	}
	p.addMTP(m, spec.Layer{Mixer: mixer, FFN: p.mtpFFN(m)})
}

// fillMoE copies the expert fields shared by all MoE architectures.
func (p *parser) fillMoE(m *spec.Model) {
	c := p.c
	m.Intermediate = c.Intermediate
	m.Experts = p.experts()
	if m.Experts > 0 {
		m.MoEIntermediate = c.MoEIntermediate
		m.ExpertsPerToken = c.ExpertsPerToken
		m.SharedExperts = c.SharedExperts
		m.SharedIntermediate = c.SharedIntermediate
		if c.QwenSharedInter > 0 {
			m.SharedExperts = max(m.SharedExperts, 1)
			m.SharedIntermediate = c.QwenSharedInter
		}
		if c.MoELatent != nil {
			m.MoELatent = *c.MoELatent
		}
		p.positive("moe_intermediate_size", c.MoEIntermediate)
		p.positive("num_experts_per_tok", c.ExpertsPerToken)
		if c.ExpertsPerToken > m.Experts {
			p.errorf("config field num_experts_per_tok %d exceeds the %d routed experts", c.ExpertsPerToken, m.Experts)
		}
	}
}

func (p *parser) mtpFFN(m *spec.Model) spec.FFN {
	if m.Experts > 0 {
		return spec.FFNMoE
	}
	return spec.FFNDense
}

func (p *parser) addMTP(m *spec.Model, l spec.Layer) {
	n := p.c.NumNextNPredictLayers
	if n < 0 {
		p.errorf("config field num_nextn_predict_layers is %d, want >= 0", n)
	}
	if !p.layerRoom(len(m.Layers), n, "num_nextn_predict_layers") {
		return
	}
	l.MTP = true
	for range n {
		add(m, l)
	}
}

// parseLlama handles GQA decoder-only models.
func (p *parser) parseLlama(m *spec.Model) {
	c := p.c
	n := p.numLayers()
	m.KVHeads = p.kvHeads()
	m.HeadDim = p.headDim()
	p.positive("head_dim", m.HeadDim)
	p.positive("intermediate_size", c.Intermediate)
	m.Intermediate = c.Intermediate
	window := 0
	if c.SlidingWindow != nil && *c.SlidingWindow > 0 && (c.UseSlidingWindow == nil || *c.UseSlidingWindow) {
		window = *c.SlidingWindow
	}
	if len(c.LayerTypes) > 0 && len(c.LayerTypes) != n {
		p.errorf("config field layer_types has %d entries, want num_hidden_layers %d", len(c.LayerTypes), n)
	}
	for i := range n {
		w := window
		if len(c.LayerTypes) == n {
			switch t := c.LayerTypes[i]; t {
			case "full_attention":
				w = 0
			case "sliding_attention":
				if window == 0 {
					p.errorf("config field layer_types[%d] is sliding_attention but sliding_window is not set", i)
				}
			default:
				p.errorf("config field layer_types[%d] is %q, want full_attention or sliding_attention", i, t)
			}
		}
		add(m, spec.Layer{Mixer: spec.MixerGQA, FFN: spec.FFNDense, Window: w})
	}
	p.addMTP(m, spec.Layer{Mixer: spec.MixerGQA, FFN: spec.FFNDense, Window: window})
}

// block is one Nemotron-H hybrid block.
type block byte

const (
	blockMamba     block = 'M'
	blockAttention block = '*'
	blockMoE       block = 'E'
	blockMLP       block = '-'
)

// blockNames are layers_block_type's names: the older ones and those
// transformers 5 writes (linear_attention is Mamba2, full_attention GQA).
var blockNames = map[string]block{"mamba": blockMamba, "attention": blockAttention, "moe": blockMoE, "mlp": blockMLP,
	"linear_attention": blockMamba, "full_attention": blockAttention}

func (p *parser) blocks(field, pattern string, list []string) []block {
	var out []block
	if pattern != "" {
		for i, r := range pattern {
			b := block(r)
			switch b {
			case blockMamba, blockAttention, blockMoE, blockMLP:
				out = append(out, b)
			default:
				p.errorf("config field %s has %q at position %d; want M, *, E or -", field, r, i)
			}
		}
		return out
	}
	for i, s := range list {
		b, ok := blockNames[strings.ToLower(s)]
		if !ok {
			if len(s) == 1 {
				if b = block(s[0]); b == blockMamba || b == blockAttention || b == blockMoE || b == blockMLP {
					out = append(out, b)
					continue
				}
			}
			p.errorf("config field %s[%d] is %q; want mamba, attention, moe or mlp", field, i, s)
			continue
		}
		out = append(out, b)
	}
	return out
}

func blockLayer(b block) spec.Layer {
	switch b {
	case blockMamba:
		return spec.Layer{Mixer: spec.MixerMamba}
	case blockAttention:
		return spec.Layer{Mixer: spec.MixerGQA}
	case blockMoE:
		return spec.Layer{FFN: spec.FFNMoE}
	default:
		return spec.Layer{FFN: spec.FFNDense}
	}
}

// parseNemotronH handles NemotronH: every block of the pattern is one layer.
func (p *parser) parseNemotronH(m *spec.Model) {
	c := p.c
	field := "hybrid_override_pattern"
	if c.HybridPattern == "" {
		field = "layers_block_type"
	}
	blocks := p.blocks(field, c.HybridPattern, c.LayersBlockType)
	if len(blocks) == 0 {
		p.errorf("config has neither hybrid_override_pattern nor layers_block_type")
		return
	}
	if c.NumLayers != nil && *c.NumLayers != len(blocks) {
		p.errorf("config field num_hidden_layers %d does not match the %d blocks of %s", *c.NumLayers, len(blocks), field)
	}
	m.KVHeads = p.kvHeads()
	m.HeadDim = p.headDim()
	m.MambaHeads = c.MambaHeads
	m.MambaHeadDim = c.MambaHeadDim
	if m.MambaHeads == 0 && c.MambaHeadDim > 0 && c.Expand > 0 {
		m.MambaHeads = c.Expand * c.Hidden / c.MambaHeadDim // older configs: d_inner = expand * hidden
	}
	m.SSMStateSize, m.NGroups, m.ConvKernel = c.SSMStateSize, c.NGroups, c.ConvKernel
	p.fillMoE(m)
	var has [256]bool
	for _, b := range blocks {
		has[b] = true
		add(m, blockLayer(b))
	}
	if has[blockMamba] {
		p.positive("mamba_num_heads", m.MambaHeads)
		p.positive("mamba_head_dim", m.MambaHeadDim)
		p.positive("ssm_state_size", m.SSMStateSize)
		p.positive("n_groups", m.NGroups)
		p.positive("conv_kernel", m.ConvKernel)
	}
	if has[blockAttention] {
		p.positive("head_dim", m.HeadDim)
	}
	if has[blockMLP] {
		p.positive("intermediate_size", c.Intermediate)
	}
	if has[blockMoE] && m.Experts <= 0 {
		p.errorf("pattern has MoE blocks but config field n_routed_experts is %d", m.Experts)
	}

	// MTP: each of the num_nextn_predict_layers modules follows the MTP
	// pattern ("*E" for Nemotron-3). A mixer block starts a layer and the FFN
	// block after it joins that layer, so "*E" is one layer (GQA + MoE).
	n := c.NumNextNPredictLayers
	if n <= 0 {
		return
	}
	mfield := "mtp_hybrid_override_pattern"
	if c.MTPHybridPattern == "" {
		mfield = "mtp_layers_block_type"
	}
	mtp := p.blocks(mfield, c.MTPHybridPattern, c.MTPBlockType)
	if len(mtp) == 0 {
		mtp = []block{blockAttention, blockMoE}
		if m.Experts == 0 {
			mtp[1] = blockMLP
		}
	}
	var module []spec.Layer
	for _, b := range mtp {
		l := blockLayer(b)
		if cur := len(module) - 1; l.Mixer == spec.MixerNone && cur >= 0 && module[cur].FFN == spec.FFNNone {
			module[cur].FFN = l.FFN
			continue
		}
		module = append(module, l)
	}
	if !p.layerRoom(len(m.Layers), n*len(module), "num_nextn_predict_layers × MTP pattern layers") {
		return
	}
	for range n {
		for _, l := range module {
			l.MTP = true
			add(m, l)
		}
	}
}

// parseQwen3Next handles Qwen3-Next. Its Gated DeltaNet (GDN) layers are
// mapped onto MixerMamba so that the Mamba2 state formulas give the exact GDN
// state sizes (SOURCES.md):
//
//	MambaHeads   = linear_num_value_heads   (d_inner = v_heads * v_head_dim)
//	MambaHeadDim = linear_value_head_dim
//	SSMStateSize = linear_key_head_dim      (recurrent state v_heads * v_dim * k_dim)
//	NGroups      = linear_num_key_heads     (conv adds 2 * k_heads * k_dim for q and k)
//	ConvKernel   = linear_conv_kernel_dim
//
// Arch stays "Qwen3NextForCausalLM" so a worker can tell GDN from Mamba2.
// Layer i is full attention when (i+1) % full_attention_interval == 0, or as
// layer_types says.
func (p *parser) parseQwen3Next(m *spec.Model) {
	c := p.c
	n := p.numLayers()
	m.KVHeads = p.kvHeads()
	m.HeadDim = p.headDim()
	m.MambaHeads, m.MambaHeadDim = c.LinearNumValueHeads, c.LinearValueHeadDim
	m.SSMStateSize, m.NGroups, m.ConvKernel = c.LinearKeyHeadDim, c.LinearNumKeyHeads, c.LinearConvKernel
	for _, f := range []struct {
		name string
		v    int
	}{{"linear_num_value_heads", m.MambaHeads}, {"linear_value_head_dim", m.MambaHeadDim},
		{"linear_key_head_dim", m.SSMStateSize}, {"linear_num_key_heads", m.NGroups},
		{"linear_conv_kernel_dim", m.ConvKernel}, {"head_dim", m.HeadDim}} {
		p.positive(f.name, f.v)
	}
	p.fillMoE(m)
	if len(c.LayerTypes) > 0 && len(c.LayerTypes) != n {
		p.errorf("config field layer_types has %d entries, want num_hidden_layers %d", len(c.LayerTypes), n)
	}
	if len(c.LayerTypes) == 0 {
		p.positive("full_attention_interval", c.FullAttentionInterval)
	}
	step := max(c.DecoderSparseStep, 1)
	for i := range n {
		mixer := spec.MixerMamba
		if len(c.LayerTypes) == n {
			switch t := c.LayerTypes[i]; t {
			case "full_attention":
				mixer = spec.MixerGQA
			case "linear_attention":
			default:
				p.errorf("config field layer_types[%d] is %q, want full_attention or linear_attention", i, t)
			}
		} else if c.FullAttentionInterval > 0 && (i+1)%c.FullAttentionInterval == 0 {
			mixer = spec.MixerGQA
		}
		ffn := spec.FFNDense
		if m.Experts > 0 && !slices.Contains(c.MLPOnlyLayers, i) && (i+1)%step == 0 {
			ffn = spec.FFNMoE
		}
		add(m, spec.Layer{Mixer: mixer, FFN: ffn})
	}
	p.addMTP(m, spec.Layer{Mixer: spec.MixerGQA, FFN: p.mtpFFN(m)})
}

// sanitizeJSON replaces the bare tokens Infinity, -Infinity and NaN that
// appear outside strings (Python's json.dumps writes them) with values that
// encoding/json accepts: ±1e308 and null. Input without them is returned as is.
func sanitizeJSON(data []byte) []byte {
	if !bytes.Contains(data, []byte("Infinity")) && !bytes.Contains(data, []byte("NaN")) {
		return data
	}
	out := make([]byte, 0, len(data)+8)
	inString, escaped := false, false
	for i := 0; i < len(data); i++ {
		ch := data[i]
		if inString {
			out = append(out, ch)
			switch {
			case escaped:
				escaped = false
			case ch == '\\':
				escaped = true
			case ch == '"':
				inString = false
			}
			continue
		}
		switch {
		case ch == '"':
			inString = true
			out = append(out, ch)
		case bytes.HasPrefix(data[i:], []byte("-Infinity")):
			out = append(out, "-1e308"...)
			i += len("-Infinity") - 1
		case bytes.HasPrefix(data[i:], []byte("Infinity")):
			out = append(out, "1e308"...)
			i += len("Infinity") - 1
		case bytes.HasPrefix(data[i:], []byte("NaN")):
			out = append(out, "null"...)
			i += len("NaN") - 1
		default:
			out = append(out, ch)
		}
	}
	return out
}
