package model

import (
	"math"
	"strings"

	"github.com/kvx-dev/kvx/plugins/v1/spec"
)

// params counts one rank's parameters by how they are stored.
type params struct {
	embed  float64 // embedding and lm head: always bf16
	linear float64 // non-expert projections: the weights dtype, 1 B at most below bf16
	expert float64 // routed and shared expert projections: 4-bit for fp4/w4afp8
	small  float64 // norms, biases, conv filters, A/D/dt, routers: bf16
}

func (p *params) add(q params) {
	p.embed += q.embed
	p.linear += q.linear
	p.expert += q.expert
	p.small += q.small
}

func (p params) total() float64 { return p.embed + p.linear + p.expert + p.small }

// bytes returns the storage of p for a weights dtype. The figures are an
// approximation that ignores fp8 block scales (1/16384 of the weights):
//
//	bf16    everything 2 B
//	fp8     projections 1 B; embeddings, lm head, norms, routers bf16
//	fp4     expert projections 0.5 B + one fp8 scale per 16 (NVFP4: 0.5625 B);
//	        other projections fp8; embeddings, lm head, norms bf16
//	w4afp8  expert projections 0.5 B + one bf16 scale per 128 (0.515625 B);
//	        other projections fp8; embeddings, lm head, norms bf16
//
// Unknown names count as bf16 (the config package validates names).
func (p params) bytes(dtype string) float64 {
	lin, exp := 2.0, 2.0
	switch strings.ToLower(dtype) {
	case "fp8":
		lin, exp = 1, 1
	case "fp4", "nvfp4":
		lin, exp = 1, 0.5+1.0/16
	case "w4afp8":
		lin, exp = 1, 0.5+2.0/128
	}
	return 2*p.embed + lin*p.linear + exp*p.expert + 2*p.small
}

// gated reports whether the model's MLPs and experts are SwiGLU (gate, up,
// down) rather than two-matrix (Nemotron-H relu2: up, down).
func gated(m spec.Model) bool { return m.Arch != archNemotronH }

// layerParams returns one rank's parameters of layer l under tensor
// parallelism tp. Head-sharded projections are divided by tp, KV heads and
// Mamba groups are rounded up (replicated when fewer than tp), experts are
// divided by tp (TP or EP, the aggregate is the same), MLA down-projections,
// the DSA indexer and routers are replicated.
func layerParams(m spec.Model, l spec.Layer, tp int) params {
	h := float64(m.Hidden)
	t := float64(tp)
	var p params
	switch l.Mixer {
	case spec.MixerGQA:
		hd := float64(m.HeadDim)
		kv := m.KVHeads
		if kv == 0 {
			kv = m.Heads
		}
		q := h * float64(m.Heads) * hd
		if m.Arch == archQwen3Next {
			q *= 2 // gated attention: the query projection also yields the output gate
			p.small += 2 * hd
		}
		p.linear += q/t + 2*h*float64(perRank(kv, tp))*hd + float64(m.Heads)*hd*h/t
		p.small += h
	case spec.MixerMLA, spec.MixerDSA:
		heads := float64(m.Heads)
		qk := float64(m.QKNopeHeadDim + m.QKRopeHeadDim)
		qIn := h
		if m.QLoraRank > 0 {
			qIn = float64(m.QLoraRank)
			p.linear += h * qIn // q_a, replicated
			p.small += qIn
		}
		p.linear += qIn * heads * qk / t                                                    // q_b (or q)
		p.linear += h * float64(m.KVLoraRank+m.QKRopeHeadDim)                               // kv_a, replicated
		p.linear += float64(m.KVLoraRank) * heads * float64(m.QKNopeHeadDim+m.VHeadDim) / t // kv_b
		p.linear += heads * float64(m.VHeadDim) * h / t                                     // o
		p.small += float64(m.KVLoraRank) + h
		if l.Mixer == spec.MixerDSA {
			ih, ihd := float64(m.IndexHeads), float64(m.IndexHeadDim)
			p.linear += qIn*ih*ihd + h*ihd // wq_b, wk
			p.small += h*ih + 2*ihd        // weights_proj, k_norm
		}
	case spec.MixerMamba:
		heads := float64(m.MambaHeads) / t
		inner := heads * float64(m.MambaHeadDim)
		groups := float64(perRank(m.NGroups, tp)) * float64(m.SSMStateSize)
		conv := inner + 2*groups
		perHead := 1.0 // Mamba2: dt per head
		if m.Arch == archQwen3Next {
			perHead = 2 // GDN: beta and alpha per value head
		}
		p.linear += h*(2*inner+2*groups+perHead*heads) + inner*h // in_proj, out_proj
		p.small += conv*float64(m.ConvKernel+1) + 3*heads + inner + h
	}
	k := 3.0
	if !gated(m) {
		k = 2
	}
	switch l.FFN {
	case spec.FFNDense:
		p.linear += k * h * float64(m.Intermediate) / t
		p.small += h
	case spec.FFNMoE:
		dim := h
		if m.MoELatent > 0 {
			dim = float64(m.MoELatent)
			p.linear += 2 * h * dim // latent down and up projections, replicated
		}
		p.expert += float64(m.Experts) * k * dim * float64(m.MoEIntermediate) / t
		if shared := sharedWidth(m); shared > 0 {
			p.expert += k * h * shared / t
		}
		p.small += h*float64(m.Experts) + float64(m.Experts) + h // router, bias, norm
	}
	if l.MTP {
		p.linear += 2 * h * h // eh_proj, replicated
		p.small += 3 * h      // enorm, hnorm, final norm
	}
	return p
}

// sharedWidth is the total intermediate width of the shared experts:
// SharedIntermediate when set (a total, as Qwen and Nemotron-H configs give
// it), else SharedExperts * MoEIntermediate (DeepSeek).
func sharedWidth(m spec.Model) float64 {
	if m.SharedExperts == 0 {
		return 0
	}
	if m.SharedIntermediate > 0 {
		return float64(m.SharedIntermediate)
	}
	return float64(m.SharedExperts * m.MoEIntermediate)
}

// stageParams returns one rank's parameters for layers [first, last).
func stageParams(m spec.Model, first, last, tp int) params {
	tp = max(tp, 1)
	first = max(first, 0)
	last = min(last, len(m.Layers))
	var p params
	for i := first; i < last; i++ {
		p.add(layerParams(m, m.Layers[i], tp))
	}
	vocab := float64(m.Vocab) * float64(m.Hidden) / float64(tp)
	if first == 0 && last > first {
		p.embed += vocab
	}
	if last > first && last >= len(m.Layers)-m.NumNextN {
		p.embed += vocab // lm head (counted even when tied: the last stage holds its own copy)
		p.small += float64(m.Hidden)
	}
	return p
}

// WeightBytes estimates the weight memory of one GPU that holds layers
// [first, last) of m under tensor parallelism tp (tp < 1 counts as 1): the
// attention, MLA, indexer, Mamba, dense MLP and MoE parameters of those
// layers, the embeddings when first == 0 and the lm head when the range
// reaches the last decoder layer. Expert weights are divided evenly over the
// tp ranks (EP and MoE-TP give the same aggregate); MLA down-projections, the
// DSA indexer, routers and MTP eh_proj are replicated. dtype is the weights
// dtype; the bytes per parameter are an approximation (fp8 block scales and
// other quantization metadata ignored except the 4-bit group scales):
//
//	bf16    everything 2 B
//	fp8     projections 1 B; embeddings, lm head, norms, routers 2 B
//	fp4     routed and shared expert projections 0.5625 B (NVFP4: 4 bits plus
//	        an fp8 scale per 16); other projections 1 B; embeddings etc. 2 B
//	w4afp8  expert projections 0.515625 B (4 bits plus a bf16 scale per 128);
//	        other projections 1 B; embeddings etc. 2 B
//
// Unknown dtype names count as bf16 (the config package validates names).
func WeightBytes(m spec.Model, first, last int, dtype string, tp int) int64 {
	return int64(math.Ceil(stageParams(m, first, last, tp).bytes(dtype)))
}

// ParamCount returns the parameter count of m as model cards state it:
// embeddings, decoder layers and lm head, without the MTP layers (DeepSeek-V3
// is 671B plus a 14B MTP module).
func ParamCount(m spec.Model) int64 {
	decoder := len(m.Layers) - m.NumNextN
	p := stageParams(m, 0, decoder, 1)
	return int64(math.Round(p.total()))
}
