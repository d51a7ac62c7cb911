package model

import (
	"encoding/json"
	"fmt"
	"math"
	"path/filepath"
	"slices"
)

// MaxBlockSize bounds each side of quantization_config's weight_block_size
// (real checkpoints: 128), checked, with MaxPositions for rope's
// original_max_position_embeddings, before either is used; an error names
// the field, the value and the limit.
const MaxBlockSize = 1 << 16

// Numerics is what a worker's model code needs from a checkpoint's
// config.json beyond the shapes Parse puts in spec.Model: the numerics
// (norm epsilon, RoPE frequencies, biases, q/k norm, tied embeddings).
// Fields are as transformers 5 writes them (rope_parameters), with the
// older rope_theta / rope_scaling accepted.
type Numerics struct {
	Arch      string // architectures[0], or from model_type
	ModelType string
	Eps       float32 // rms_norm_eps
	Tied      bool    // tie_word_embeddings: the LM head is the embedding table
	AttnBias  bool    // attention_bias: q, k, v projections have biases (o_proj's is used where the checkpoint has one)
	MLPBias   bool    // mlp_bias (Llama)
	QKNorm    bool    // Qwen3: RMSNorm over each head of q and k before RoPE
	Rope      Rope
	Dtype     string // dtype / torch_dtype: float32, bfloat16, float16
	Quant     *Quant // quantization_config; nil when the checkpoint has none
	Extra     Extra  // what one architecture's code reads beyond these, as written
}

// Extra holds the config.json fields that only one architecture's code
// reads, as the file states them (nil: absent). ParseNumerics decodes them
// and checks their JSON types only; the code that runs the architecture
// checks their values.
type Extra struct {
	// Nemotron-H
	MLPAct      *string  `json:"mlp_hidden_act"`
	MambaAct    *string  `json:"mamba_hidden_act"`
	ConvBias    *bool    `json:"use_conv_bias"`
	UseBias     bool     `json:"use_bias"` // in_proj and out_proj; mlp_bias is MLPBias
	TimeStepMin *float64 `json:"time_step_min"`
	// DeepSeek-V3 / V3.2 (NormTopK: Qwen3-Next too)
	NGroup         *int     `json:"n_group"`
	TopKGroup      *int     `json:"topk_group"`
	NormTopK       *bool    `json:"norm_topk_prob"`
	RoutedScale    *float64 `json:"routed_scaling_factor"`
	RopeInterleave *bool    `json:"rope_interleave"`
	ScoringFunc    string   `json:"scoring_func"`
	TopKMethod     string   `json:"topk_method"`
}

// Quant is a checkpoint's quantization_config, as DeepSeek-V3 (and
// transformers' FineGrainedFP8Config) write it: quant_method "fp8", fmt
// "e4m3", weight_block_size [rows, cols] of the block one float32
// weight_scale_inv covers. Which tensors are fp8 is read from their
// safetensors dtype; the loader dequantizes them (fp8.go).
type Quant struct {
	Method    string // quant_method: fp8
	Fmt       string // fmt: e4m3 (or e5m2); "" when not stated
	BlockSize [2]int // weight_block_size (transformers' default [128, 128] when absent)
}

// Rope is a checkpoint's rotary embedding: its type and the parameters
// transformers' ROPE_INIT_FUNCTIONS read.
type Rope struct {
	Type                 string  // default, llama3, yarn
	Theta                float64 // rope_theta
	Factor               float64
	LowFreqFactor        float64 // llama3
	HighFreqFactor       float64 // llama3
	OriginalMaxPosition  float64 // llama3, yarn (0: max_position_embeddings)
	AttentionFactor      float64 // yarn (0: computed)
	BetaFast, BetaSlow   float64 // yarn (0: 32 and 1)
	Mscale, MscaleAllDim float64 // yarn
	Truncate             *bool   // yarn (nil: true)
	PartialRotary        float64 // partial_rotary_factor (0: 1)
}

// Families are the architectures whose checkpoints a worker runs
// (ParseNumerics refuses others).
var Families = []string{"LlamaForCausalLM", "MistralForCausalLM", "Qwen3ForCausalLM",
	"DeepseekV3ForCausalLM", "DeepseekV32ForCausalLM", archNemotronH, archQwen3Next}

var familyOf = map[string]string{"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen3": "Qwen3ForCausalLM",
	"deepseek_v3": "DeepseekV3ForCausalLM", "deepseek_v32": "DeepseekV32ForCausalLM", "nemotron_h": archNemotronH,
	"qwen3_next": archQwen3Next}

type rawConfig struct {
	Architectures  []string                   `json:"architectures"`
	ModelType      string                     `json:"model_type"`
	RMSNormEps     *float64                   `json:"rms_norm_eps"`
	LayerNormEps   *float64                   `json:"layer_norm_epsilon"` // Nemotron-H's RMSNorms
	Tie            *bool                      `json:"tie_word_embeddings"`
	AttentionBias  bool                       `json:"attention_bias"`
	MLPBias        bool                       `json:"mlp_bias"`
	HiddenAct      string                     `json:"hidden_act"`
	RopeTheta      *float64                   `json:"rope_theta"`
	RopeScaling    map[string]json.RawMessage `json:"rope_scaling"`
	RopeParameters map[string]json.RawMessage `json:"rope_parameters"`
	PartialRotary  *float64                   `json:"partial_rotary_factor"`
	Dtype          string                     `json:"dtype"`
	TorchDtype     string                     `json:"torch_dtype"`
	Quant          *rawQuant                  `json:"quantization_config"`
}

type rawQuant struct {
	Method    string          `json:"quant_method"`
	Fmt       string          `json:"fmt"`
	BlockSize json.RawMessage `json:"weight_block_size"`
}

// parseQuant checks quantization_config: quant_method fp8, fmt e4m3 or
// e5m2 when given, weight_block_size two integers >= 1 when given.
func parseQuant(r *rawQuant) (*Quant, error) {
	if r.Method != "fp8" {
		return nil, fmt.Errorf("config.json: quantization_config.quant_method %q: the reader dequantizes fp8 (block-scaled, DeepSeek-V3 style) only", r.Method)
	}
	if r.Fmt != "" && r.Fmt != "e4m3" && r.Fmt != "e5m2" {
		return nil, fmt.Errorf("config.json: quantization_config.fmt %q: allowed e4m3, e5m2", r.Fmt)
	}
	q := &Quant{Method: r.Method, Fmt: r.Fmt, BlockSize: [2]int{128, 128}}
	if len(r.BlockSize) > 0 && string(r.BlockSize) != "null" {
		var b []int
		if err := json.Unmarshal(r.BlockSize, &b); err != nil || len(b) != 2 || b[0] < 1 || b[1] < 1 {
			return nil, fmt.Errorf("config.json: quantization_config.weight_block_size %s: want two integers >= 1 ([rows, cols] of one scale's block)", r.BlockSize)
		}
		if b[0] > MaxBlockSize || b[1] > MaxBlockSize {
			return nil, fmt.Errorf("config.json: quantization_config.weight_block_size %v: above the limit %d (MaxBlockSize) on a side", b, MaxBlockSize)
		}
		q.BlockSize = [2]int{b[0], b[1]}
	}
	return q, nil
}

// ReadNumerics reads the numerics of dir/config.json, of at most
// MaxConfigBytes.
func ReadNumerics(dir string) (Numerics, error) {
	data, err := readConfigFile(filepath.Join(dir, "config.json"))
	if err != nil {
		return Numerics{}, fmt.Errorf("checkpoint config: %w", err)
	}
	return ParseNumerics(data)
}

// ParseNumerics reads the numerics of a config.json. Errors name the field
// and the value: an architecture outside Families, a hidden_act other than
// silu, a rope type other than default, llama3 and yarn, a parameter
// that type needs missing, a size above its limit (MaxBlockSize,
// MaxPositions), or a quantization_config other than block-scaled fp8
// (see Quant).
func ParseNumerics(data []byte) (Numerics, error) {
	var r rawConfig
	if err := json.Unmarshal(data, &r); err != nil {
		return Numerics{}, fmt.Errorf("config.json: %w", err)
	}
	var extra Extra
	if err := json.Unmarshal(data, &extra); err != nil {
		return Numerics{}, fmt.Errorf("config.json: %w", err)
	}
	c := Numerics{Extra: extra, ModelType: r.ModelType, Eps: 1e-6, AttnBias: r.AttentionBias, MLPBias: r.MLPBias, Dtype: r.Dtype}
	if c.Dtype == "" {
		c.Dtype = r.TorchDtype
	}
	if len(r.Architectures) > 0 && slices.Contains(Families, r.Architectures[0]) {
		c.Arch = r.Architectures[0]
	} else if a, ok := familyOf[r.ModelType]; ok {
		c.Arch = a
	} else {
		return Numerics{}, fmt.Errorf("config.json: architectures %v, model_type %q: not one of %v", r.Architectures, r.ModelType, Families)
	}
	c.QKNorm = c.Arch == "Qwen3ForCausalLM"
	if r.Quant != nil {
		q, err := parseQuant(r.Quant)
		if err != nil {
			return Numerics{}, err
		}
		c.Quant = q
	}
	if r.RMSNormEps != nil {
		c.Eps = float32(*r.RMSNormEps)
	} else if r.LayerNormEps != nil {
		c.Eps = float32(*r.LayerNormEps)
	}
	if r.Tie != nil {
		c.Tied = *r.Tie
	}
	if r.HiddenAct != "" && r.HiddenAct != "silu" {
		return Numerics{}, fmt.Errorf("config.json: hidden_act %q: the %s MLP runs silu", r.HiddenAct, c.Arch)
	}
	// rope_parameters (transformers 5) wins; else rope_scaling plus rope_theta.
	params := r.RopeParameters
	if params == nil {
		params = r.RopeScaling
	}
	num := func(key string) (float64, bool, error) {
		v, ok := params[key]
		if !ok || string(v) == "null" {
			return 0, false, nil
		}
		var f float64
		if err := json.Unmarshal(v, &f); err != nil {
			return 0, false, fmt.Errorf("config.json: rope parameter %s = %s: want a number", key, v)
		}
		return f, true, nil
	}
	str := func(key string) string {
		var s string
		if v, ok := params[key]; ok {
			_ = json.Unmarshal(v, &s)
		}
		return s
	}
	ro := &c.Rope
	ro.Type = str("rope_type")
	if ro.Type == "" {
		ro.Type = str("type")
	}
	if ro.Type == "" {
		ro.Type = "default"
	}
	ro.Theta = 10000
	if r.RopeTheta != nil {
		ro.Theta = *r.RopeTheta
	}
	if r.PartialRotary != nil {
		ro.PartialRotary = *r.PartialRotary
	}
	fields := []struct {
		key  string
		dst  *float64
		need []string // rope types that require it
	}{
		{"rope_theta", &ro.Theta, nil},
		{"factor", &ro.Factor, []string{"llama3"}},
		{"low_freq_factor", &ro.LowFreqFactor, []string{"llama3"}},
		{"high_freq_factor", &ro.HighFreqFactor, []string{"llama3"}},
		{"original_max_position_embeddings", &ro.OriginalMaxPosition, []string{"llama3"}},
		{"attention_factor", &ro.AttentionFactor, nil},
		{"beta_fast", &ro.BetaFast, nil},
		{"beta_slow", &ro.BetaSlow, nil},
		{"mscale", &ro.Mscale, nil},
		{"mscale_all_dim", &ro.MscaleAllDim, nil},
		{"partial_rotary_factor", &ro.PartialRotary, nil},
	}
	for _, f := range fields {
		v, ok, err := num(f.key)
		if err != nil {
			return Numerics{}, err
		}
		if ok {
			*f.dst = v
		} else if slices.Contains(f.need, ro.Type) {
			return Numerics{}, fmt.Errorf("config.json: rope_type %s needs rope parameter %s", ro.Type, f.key)
		}
	}
	if v, ok := params["truncate"]; ok {
		var b bool
		if err := json.Unmarshal(v, &b); err != nil {
			return Numerics{}, fmt.Errorf("config.json: rope parameter truncate = %s: want true or false", v)
		}
		ro.Truncate = &b
	}
	switch ro.Type {
	case "default", "llama3", "yarn":
	default:
		return Numerics{}, fmt.Errorf("config.json: rope_type %q: allowed default, llama3, yarn", ro.Type)
	}
	if ro.Theta <= 0 {
		return Numerics{}, fmt.Errorf("config.json: rope_theta %v must be > 0", ro.Theta)
	}
	if !(ro.OriginalMaxPosition >= 0 && ro.OriginalMaxPosition <= MaxPositions) {
		return Numerics{}, fmt.Errorf("config.json: rope parameter original_max_position_embeddings %v: want 0 to the limit %d (MaxPositions)", ro.OriginalMaxPosition, MaxPositions)
	}
	if c.Arch == archQwen3Next {
		if !(ro.PartialRotary >= 0 && ro.PartialRotary <= 1) {
			return Numerics{}, fmt.Errorf("config.json: partial_rotary_factor %v: want a fraction in (0, 1]", ro.PartialRotary)
		}
	} else if ro.PartialRotary != 0 && ro.PartialRotary != 1 {
		return Numerics{}, fmt.Errorf("config.json: partial_rotary_factor %v: the %s attention rotates whole heads (1)", ro.PartialRotary, c.Arch)
	}
	return c, nil
}

// InvFreq returns the dim/2 RoPE frequencies of r for heads of dim
// elements and the factor that multiplies cosines and sines (1 but for
// yarn), as transformers' ROPE_INIT_FUNCTIONS compute them: the default
// table 1/θ^(2i/dim) in float32 arithmetic, then the llama3 or yarn
// rescaling. maxPosition is max_position_embeddings.
func (r Rope) InvFreq(dim, maxPosition int) ([]float64, float64) {
	half := dim / 2
	pos := make([]float32, half) // θ^(2i/dim), float32 as torch computes it
	inv := make([]float64, half)
	for i := range half {
		e := float32(2*i) / float32(dim)
		pos[i] = float32(math.Pow(float64(float32(r.Theta)), float64(e)))
		inv[i] = float64(float32(1) / pos[i])
	}
	switch r.Type {
	case "llama3":
		old := r.OriginalMaxPosition
		lowW, highW := old/r.LowFreqFactor, old/r.HighFreqFactor
		for i, f := range inv {
			wl := 2 * math.Pi / f
			scaled := f
			if wl > lowW {
				scaled = f / r.Factor
			}
			if !(wl < highW) && !(wl > lowW) {
				s := (old/wl - r.LowFreqFactor) / (r.HighFreqFactor - r.LowFreqFactor)
				scaled = (1-s)*scaled/r.Factor + s*scaled
			}
			inv[i] = float64(float32(scaled))
		}
		return inv, 1
	case "yarn":
		old := r.OriginalMaxPosition
		if old == 0 {
			old = float64(maxPosition)
		}
		factor := r.Factor
		if factor == 0 {
			factor = float64(maxPosition) / old
		}
		mscale := func(scale, m float64) float64 {
			if scale <= 1 {
				return 1
			}
			return 0.1*m*math.Log(scale) + 1
		}
		att := r.AttentionFactor
		if att == 0 {
			if r.Mscale != 0 && r.MscaleAllDim != 0 {
				att = mscale(factor, r.Mscale) / mscale(factor, r.MscaleAllDim)
			} else {
				att = mscale(factor, 1)
			}
		}
		fast, slow := r.BetaFast, r.BetaSlow
		if fast == 0 {
			fast = 32
		}
		if slow == 0 {
			slow = 1
		}
		corr := func(rot float64) float64 {
			return float64(dim) * math.Log(old/(rot*2*math.Pi)) / (2 * math.Log(r.Theta))
		}
		low, high := corr(fast), corr(slow)
		if r.Truncate == nil || *r.Truncate {
			low, high = math.Floor(low), math.Ceil(high)
		}
		low, high = max(low, 0), min(high, float64(dim-1))
		if low == high {
			high += 0.001
		}
		for i := range inv {
			ramp := float32((float32(i) - float32(low)) / (float32(high) - float32(low)))
			ramp = min(max(ramp, 0), 1)
			extra := 1 - ramp // inv_freq_extrapolation_factor
			interp := float32(1) / (float32(factor) * pos[i])
			ex := float32(1) / pos[i]
			inv[i] = float64(interp*(1-extra) + ex*extra)
		}
		return inv, float64(float32(att))
	}
	return inv, 1
}
