package model

import (
	"fmt"
	"strings"

	"github.com/kvx-dev/kvx/plugins/v1/spec"
)

// Dtypes are the cache element types, as named in the engine config.
// An empty string means "auto".
type Dtypes struct {
	// KV is the element type of GQA keys/values and of the MLA latent:
	// "bf16" (2 B), "fp8" (1 B), "float32" (4 B) or "auto" (bf16: every
	// supported preset has bf16 activations and no KV quantization of its
	// own; core/config resolves auto to float32 for a float32 checkpoint
	// directory).
	KV string
	// SSM is the Mamba/GDN recurrent-state element type: "float32",
	// "float16", "bfloat16" or "auto" (float32, what every Nemotron-H config
	// that states mamba_ssm_cache_dtype asks for).
	SSM string
	// Conv is the Mamba/GDN conv-state element type, same names as SSM.
	// "auto" is float32 (no config states a conv dtype; vLLM would use the
	// model dtype, bfloat16).
	Conv string
}

// KVBytes returns the bytes per element of a KV dtype name, or an error that
// lists the allowed names.
func KVBytes(name string) (int64, error) {
	switch strings.ToLower(name) {
	case "", "auto", "bf16", "bfloat16":
		return 2, nil
	case "fp8":
		return 1, nil
	case "float32", "fp32":
		return 4, nil
	}
	return 0, fmt.Errorf("kv cache dtype %q: allowed auto, bf16, fp8, float32", name)
}

// StateBytes returns the bytes per element of an SSM or conv state dtype name,
// or an error that lists the allowed names.
func StateBytes(name string) (int64, error) {
	switch strings.ToLower(name) {
	case "", "auto", "float32", "fp32":
		return 4, nil
	case "float16", "fp16", "bfloat16", "bf16":
		return 2, nil
	}
	return 0, fmt.Errorf("state dtype %q: allowed auto, float32, float16, bfloat16", name)
}

// Indexer keys are fp8 with one fp32 scale per token, whatever the KV dtype.
const indexScaleBytes = 4

// perRank is how many of n heads (or groups) one of tp tensor-parallel ranks
// holds: n/tp rounded up, so that a count tp does not divide (fewer KV heads
// than ranks) is replicated rather than split.
func perRank(n, tp int) int { return (n + tp - 1) / tp }

// FillBuffers sets Buffers on every layer of m (decoder and MTP) to the
// per-rank cache buffers for tensor parallelism tp, replacing any buffers
// already there:
//
//   - GQA: K and V, 2 * ceil(kv_heads/tp) * head_dim * kv bytes per token
//     (KV heads are replicated when kv_heads < tp).
//   - MLA: the latent, (kv_lora_rank + qk_rope_head_dim) * kv bytes per token,
//     replicated over TP.
//   - DSA: the MLA latent plus the indexer key, index_head_dim * 1 B (fp8) +
//     4 B scale per token; for a checkpoint (Checkpoint set) index_head_dim *
//     kv bytes, unquantized.
//   - Mamba (and GDN): per sequence, conv state
//     (heads/tp * head_dim + 2 * ceil(n_groups/tp) * state) * (conv_kernel-1)
//   - conv bytes and SSM state heads/tp * head_dim * state * ssm bytes.
//
// It fails, leaving m unchanged, when tp < 1, a dtype name is unknown, or tp
// does not divide the attention heads (GQA, MLA, DSA layers) or the Mamba
// heads (Mamba layers).
func FillBuffers(m *spec.Model, d Dtypes, tp int) error {
	if tp < 1 {
		return fmt.Errorf("model %q: tensor parallel size %d must be >= 1", m.Name, tp)
	}
	kvB, err := KVBytes(d.KV)
	if err != nil {
		return err
	}
	ssmB, err := StateBytes(d.SSM)
	if err != nil {
		return fmt.Errorf("ssm %w", err)
	}
	convB, err := StateBytes(d.Conv)
	if err != nil {
		return fmt.Errorf("conv %w", err)
	}
	var attn, mamba bool
	for _, l := range m.Layers {
		switch l.Mixer {
		case spec.MixerGQA, spec.MixerMLA, spec.MixerDSA:
			attn = true
		case spec.MixerMamba:
			mamba = true
		}
	}
	if attn && m.Heads%tp != 0 {
		return fmt.Errorf("model %q: tensor parallel size %d does not divide the %d attention heads", m.Name, tp, m.Heads)
	}
	if mamba && (m.MambaHeads <= 0 || m.MambaHeads%tp != 0) {
		return fmt.Errorf("model %q: tensor parallel size %d does not divide the %d mamba heads", m.Name, tp, m.MambaHeads)
	}

	kvHeads := m.KVHeads
	if kvHeads == 0 {
		kvHeads = m.Heads
	}
	gqa := int64(2*perRank(kvHeads, tp)*m.HeadDim) * kvB
	latent := int64(m.KVLoraRank+m.QKRopeHeadDim) * kvB
	index := int64(m.IndexHeadDim) + indexScaleBytes
	if m.Checkpoint != "" {
		index = int64(m.IndexHeadDim) * int64(kvB) // unquantized, as transformers' deepseek_v32 indexer keeps them
	}
	var conv, ssm int64
	if mamba {
		heads := m.MambaHeads / tp
		conv = int64((heads*m.MambaHeadDim+2*perRank(m.NGroups, tp)*m.SSMStateSize)*(m.ConvKernel-1)) * convB
		ssm = int64(heads*m.MambaHeadDim*m.SSMStateSize) * ssmB
	}
	for i := range m.Layers {
		var bufs []spec.Buffer
		switch m.Layers[i].Mixer {
		case spec.MixerGQA:
			bufs = []spec.Buffer{{Role: spec.RoleKV, BytesPerToken: gqa}}
		case spec.MixerMLA:
			bufs = []spec.Buffer{{Role: spec.RoleLatent, BytesPerToken: latent}}
		case spec.MixerDSA:
			bufs = []spec.Buffer{{Role: spec.RoleLatent, BytesPerToken: latent}, {Role: spec.RoleIndexKey, BytesPerToken: index}}
		case spec.MixerMamba:
			if conv > 0 {
				bufs = append(bufs, spec.Buffer{Role: spec.RoleConvState, BytesPerSeq: conv})
			}
			bufs = append(bufs, spec.Buffer{Role: spec.RoleSSMState, BytesPerSeq: ssm})
		}
		m.Layers[i].Buffers = bufs
	}
	return nil
}
