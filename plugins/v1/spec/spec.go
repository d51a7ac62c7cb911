// Package spec holds the model and hardware descriptions that the core, cache
// managers and workers share. They are plain values: no methods mutate them,
// and every type has a stable JSON encoding (it travels inside the v1 protocol
// as JSON, see plugins/proto).
package spec

import "fmt"

// Mixer is the token-mixing part of a layer: the part that needs a cache.
type Mixer string

const (
	MixerNone  Mixer = ""      // no token mixing (a pure FFN/MoE block in Nemotron-H)
	MixerGQA   Mixer = "gqa"   // grouped-query attention (MHA and MQA included), paged K and V
	MixerMLA   Mixer = "mla"   // multi-head latent attention, paged latent (kv_lora_rank + rope)
	MixerDSA   Mixer = "dsa"   // MLA plus the DSA lightning indexer key cache
	MixerMamba Mixer = "mamba" // Mamba2 mixer: per-sequence conv and SSM state
)

// FFN is the feed-forward part of a layer.
type FFN string

const (
	FFNNone  FFN = ""
	FFNDense FFN = "dense"
	FFNMoE   FFN = "moe"
)

// Role names one cache buffer of a layer.
type Role string

const (
	RoleKV        Role = "kv"        // GQA keys and values, per token
	RoleLatent    Role = "latent"    // MLA compressed latent and rope key, per token
	RoleIndexKey  Role = "index_key" // DSA indexer key (fp8) and its scale, per token
	RoleConvState Role = "conv"      // Mamba conv state, per sequence
	RoleSSMState  Role = "ssm"       // Mamba SSM state, per sequence
)

// Buffer is one cache buffer of a layer on one rank. Exactly one of
// BytesPerToken (paged buffers) and BytesPerSeq (state buffers) is non-zero.
type Buffer struct {
	Role          Role  `json:"role"`
	BytesPerToken int64 `json:"bytes_per_token,omitempty"`
	BytesPerSeq   int64 `json:"bytes_per_seq,omitempty"`
}

// Paged reports whether the buffer grows with the number of tokens.
func (b Buffer) Paged() bool { return b.BytesPerToken > 0 }

// Layer is one decoder layer (or MTP layer) of a model.
type Layer struct {
	Index  int   `json:"index"`            // position in Model.Layers
	Mixer  Mixer `json:"mixer,omitempty"`  // what needs a cache
	FFN    FFN   `json:"ffn,omitempty"`    // what follows it
	Window int   `json:"window,omitempty"` // attention window in tokens; 0 = full attention
	MTP    bool  `json:"mtp,omitempty"`    // a multi-token-prediction layer (always on the last stage)
	// Buffers are the per-rank cache buffers of this layer, filled in by the
	// model loader from the KV dtype, the SSM dtype and tensor parallelism.
	Buffers []Buffer `json:"buffers,omitempty"`
}

// HasCache reports whether the layer needs any cache buffer.
func (l Layer) HasCache() bool { return len(l.Buffers) > 0 }

// Model is an architecture: dimensions plus the ordered list of layers,
// decoder layers first, then the MTP layers.
type Model struct {
	Name        string `json:"name"`
	Arch        string `json:"arch"`
	Hidden      int    `json:"hidden"`
	Vocab       int    `json:"vocab"`
	MaxPosition int    `json:"max_position"`

	// Attention (GQA and the query side of MLA).
	Heads   int `json:"heads"`
	KVHeads int `json:"kv_heads,omitempty"`
	HeadDim int `json:"head_dim,omitempty"`

	// MLA.
	QLoraRank     int `json:"q_lora_rank,omitempty"`
	KVLoraRank    int `json:"kv_lora_rank,omitempty"`
	QKNopeHeadDim int `json:"qk_nope_head_dim,omitempty"`
	QKRopeHeadDim int `json:"qk_rope_head_dim,omitempty"`
	VHeadDim      int `json:"v_head_dim,omitempty"`

	// DSA lightning indexer.
	IndexHeads   int `json:"index_heads,omitempty"`
	IndexHeadDim int `json:"index_head_dim,omitempty"`
	IndexTopK    int `json:"index_topk,omitempty"`

	// Mamba2.
	MambaHeads   int `json:"mamba_heads,omitempty"`
	MambaHeadDim int `json:"mamba_head_dim,omitempty"`
	SSMStateSize int `json:"ssm_state_size,omitempty"`
	NGroups      int `json:"n_groups,omitempty"`
	ConvKernel   int `json:"conv_kernel,omitempty"`

	// FFN.
	Intermediate       int `json:"intermediate,omitempty"`     // dense MLP width
	MoEIntermediate    int `json:"moe_intermediate,omitempty"` // one routed expert's width
	Experts            int `json:"experts,omitempty"`
	ExpertsPerToken    int `json:"experts_per_token,omitempty"`
	SharedExperts      int `json:"shared_experts,omitempty"`
	SharedIntermediate int `json:"shared_intermediate,omitempty"` // width of the shared expert(s); 0 = MoEIntermediate
	MoELatent          int `json:"moe_latent,omitempty"`          // latent MoE projection size; 0 = none

	// MTP layers (num_nextn_predict_layers); they are the last NumNextN entries of Layers.
	NumNextN int `json:"num_nextn,omitempty"`

	// Checkpoint is the Hugging Face checkpoint directory (config.json and
	// safetensors weights) the model was parsed from, an absolute path a
	// computing worker loads the weights from; empty for a preset or a
	// synthetic model (seeded weights).
	Checkpoint string `json:"checkpoint,omitempty"`

	Layers []Layer `json:"layers"`
}

// Validate checks the fields every consumer relies on.
func (m *Model) Validate() error {
	if m.Hidden <= 0 {
		return fmt.Errorf("model %q: hidden size %d must be > 0", m.Name, m.Hidden)
	}
	if len(m.Layers) == 0 {
		return fmt.Errorf("model %q: no layers", m.Name)
	}
	for i, l := range m.Layers {
		if l.Index != i {
			return fmt.Errorf("model %q: layer %d has index %d", m.Name, i, l.Index)
		}
		for _, b := range l.Buffers {
			if (b.BytesPerToken > 0) == (b.BytesPerSeq > 0) {
				return fmt.Errorf("model %q: layer %d buffer %s must have exactly one of bytes_per_token and bytes_per_seq", m.Name, i, b.Role)
			}
		}
	}
	return nil
}

// Hardware describes one accelerator for sizing and for the sim cost model.
type Hardware struct {
	Name          string  `json:"name"`
	MemoryBytes   int64   `json:"memory_bytes"`     // device memory per GPU
	MemBandwidth  float64 `json:"mem_bandwidth"`    // HBM bytes/s
	FLOPSBF16     float64 `json:"flops_bf16"`       // dense bf16 FLOP/s
	FLOPSFP8      float64 `json:"flops_fp8"`        // dense fp8 FLOP/s
	FLOPSFP4      float64 `json:"flops_fp4"`        // dense fp4 FLOP/s; 0 = not supported (falls back to fp8)
	NVLinkBW      float64 `json:"nvlink_bandwidth"` // bytes/s per GPU, one direction
	PCIeBW        float64 `json:"pcie_bandwidth"`   // host<->device bytes/s
	Uncalibrated  bool    `json:"uncalibrated"`     // figures are datasheet values, not measured
	LaunchLatency float64 `json:"launch_latency"`   // seconds of fixed overhead per layer per step
	// CopyLatency is the fixed cost in seconds of one block-copy transfer
	// (one cudaMemcpyAsync: driver submission and DMA setup), paid once
	// per transfer on top of its bytes over the link, whatever the
	// direction. 0: copies cost their bytes only. Only the sim device reads it.
	CopyLatency float64 `json:"copy_latency"`
	// Calibration, when set, is the sim cost model's calibration (kvx
	// calibrate): measured efficiencies per kernel class, a launch cost per
	// kernel and an overhead per step that replace the datasheet roofline
	// and LaunchLatency. nil: the datasheet roofline. Only the sim device
	// reads it; sizing never does.
	Calibration *SimCalibration `json:"calibration,omitempty"`
}

// SimCalibration is what the sim device needs of a calibration. With one, a
// kernel of class c costs
//
//	max(FLOPs/peak * ComputeScale_c, Bytes/bandwidth * MemoryScale_c) + LaunchSeconds
//
// and each forward of a stage StepSeconds more; a class the calibration does
// not list keeps scale 1 on both sides (the datasheet roofline).
type SimCalibration struct {
	// Name says where it came from: a file path, or "embedded:<file>" for
	// the default that ships with kvx.
	Name          string             `json:"name"`
	Classes       []KernelClassScale `json:"classes"`
	LaunchSeconds float64            `json:"launch_seconds"` // per kernel
	StepSeconds   float64            `json:"step_seconds"`   // per forward of a stage
}

// KernelClassScale is one kernel class's measured slowdown against the
// datasheet roofline: a scale of 2 means half the peak (efficiency 0.5); 0
// means that side of the roofline never mattered in the measurements.
type KernelClassScale struct {
	// Class is "gemm" (weight matmuls, LM head, router), "moe" (routed
	// experts), "memory" (pure memory traffic: embeddings) or
	// "mixer.<mixer>" (a backend's token-mixing kernels: "mixer.gqa",
	// "mixer.mla", "mixer.dsa", "mixer.mamba2").
	Class        string  `json:"class"`
	ComputeScale float64 `json:"compute_scale"`
	MemoryScale  float64 `json:"memory_scale"`
}
