package conformance

import (
	"fmt"

	"github.com/kvx-dev/kvx/plugins/v1/spec"
)

// SmallModel returns the suite's built-in model for mixer: four decoder
// layers with realistic per-rank cache bytes per token and, for MLA and DSA,
// one MTP layer (DeepSeek style), small enough for the sim device and for a
// manager with a few hundred blocks.
//
//   - gqa: Llama-style, 8 KV heads of 64 dims in bf16: 2,048 bytes per token
//     per layer;
//   - mla: DeepSeek-V3-style latent, kv_lora_rank 256 + rope 32 in bf16: 576
//     bytes per token per layer;
//   - dsa: the mla latent plus the lightning indexer key (64 fp8 dims + a
//     4-byte scale): 644 bytes per token per layer.
//
// Any other mixer is an error.
func SmallModel(mixer spec.Mixer) (spec.Model, error) {
	m := spec.Model{
		Name:         "conformance-" + string(mixer),
		Hidden:       1024,
		Vocab:        32000,
		MaxPosition:  8192,
		Heads:        16,
		Intermediate: 2816,
	}
	var bufs []spec.Buffer
	mtp := false
	switch mixer {
	case spec.MixerGQA:
		m.Arch = "LlamaForCausalLM"
		m.KVHeads, m.HeadDim = 8, 64
		bufs = []spec.Buffer{{Role: spec.RoleKV, BytesPerToken: 2 * 8 * 64 * 2}}
	case spec.MixerMLA, spec.MixerDSA:
		m.Arch = "DeepseekV3ForCausalLM"
		m.QLoraRank, m.KVLoraRank = 384, 256
		m.QKNopeHeadDim, m.QKRopeHeadDim, m.VHeadDim = 64, 32, 64
		bufs = []spec.Buffer{{Role: spec.RoleLatent, BytesPerToken: (256 + 32) * 2}}
		if mixer == spec.MixerDSA {
			m.Arch = "DeepseekV32ForCausalLM"
			m.IndexHeads, m.IndexHeadDim, m.IndexTopK = 8, 64, 128
			bufs = append(bufs, spec.Buffer{Role: spec.RoleIndexKey, BytesPerToken: 64 + 4})
		}
		m.NumNextN = 1
		mtp = true
	default:
		return spec.Model{}, fmt.Errorf("conformance: no built-in model for mixer %q (built in: gqa, mla, dsa)", mixer)
	}
	n := 4
	if mtp {
		n++
	}
	for i := range n {
		m.Layers = append(m.Layers, spec.Layer{
			Index:   i,
			Mixer:   mixer,
			FFN:     spec.FFNDense,
			MTP:     mtp && i == n-1,
			Buffers: append([]spec.Buffer(nil), bufs...),
		})
	}
	return m, nil
}

// pickMixer returns the first of prefer that listed contains (prefer[0] when
// listed is empty), or "" when none is.
func pickMixer(listed []spec.Mixer, prefer ...spec.Mixer) spec.Mixer {
	if len(listed) == 0 {
		return prefer[0]
	}
	for _, p := range prefer {
		for _, l := range listed {
			if l == p {
				return p
			}
		}
	}
	return ""
}

// simHardware is an H200-like accelerator (datasheet figures) for the sim
// device.
var simHardware = spec.Hardware{
	Name:          "conformance-h200",
	MemoryBytes:   141e9,
	MemBandwidth:  4.8e12,
	FLOPSBF16:     989e12,
	FLOPSFP8:      1979e12,
	NVLinkBW:      450e9,
	PCIeBW:        55e9,
	Uncalibrated:  true,
	LaunchLatency: 5e-6,
}

// bytesPerToken sums the paged bytes of layers.
func bytesPerToken(layers []spec.Layer) int64 {
	var n int64
	for _, l := range layers {
		for _, b := range l.Buffers {
			n += b.BytesPerToken
		}
	}
	return n
}
