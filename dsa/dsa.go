// Package dsa is the DeepSeek Sparse Attention backend (DeepSeek-V3.2, GLM-5).
//
// A DSA layer is MLA plus the lightning indexer. Its cache is the MLA latent
// (kv_lora_rank + qk_rope_head_dim per token) and the indexer's fp8 key with
// its scale (index_head_dim + 4 bytes per token), on the same life cycle. Per
// query the indexer scores every cached token with index_heads small fp8 heads
// and keeps the index_topk best; sparse MLA then attends to those only. So a
// decode step scans the whole context once, cheaply, and attends to at most
// index_topk tokens: the indexer's cost grows linearly with the context, the
// attention's stops growing at index_topk.
//
// Package dsa/mla runs the same models densely, for A/B comparisons.
package dsa

import (
	"github.com/kvx-dev/kvx/device"
	"github.com/kvx-dev/kvx/device/sim"
	"github.com/kvx-dev/kvx/dsa/mla"
	"github.com/kvx-dev/kvx/plugins/v1/spec"
)

// Backend is the DSA backend.
var Backend device.Backend = backend{}

type backend struct{}

var mixers = []spec.Mixer{spec.MixerDSA}

func (backend) Name() string         { return "dsa" }
func (backend) Mixers() []spec.Mixer { return mixers }

// Kernel runs DSA layers with the indexer top-k and sparse MLA.
func (backend) Kernel(m spec.Mixer) device.Kernel {
	if m == spec.MixerDSA {
		return device.KernelDSA
	}
	return device.KernelNone
}

func (backend) MixerWork(e *sim.Env, l *spec.Layer, b *sim.Batch, w *sim.Work) {
	mla.Projections(e, w, b.Tokens)
	Indexer(e, w, l, b)
	Sparse(e, w, l, b)
}

// Indexer adds the lightning indexer of one layer: its projections (query up
// from the q latent, key, and per-head weights; replicated on every
// tensor-parallel rank, which must all pick the same tokens), and the fp8
// scoring of every query against every cached index key of its context,
// index_heads * index_head_dim multiply-adds per pair. Bytes are each
// sequence's index keys read once and the new tokens' keys written. The top-k
// selection is fused into the scoring kernel and not charged.
func Indexer(e *sim.Env, w *sim.Work, l *spec.Layer, b *sim.Batch) {
	m := e.Model
	in := m.QLoraRank
	if in == 0 {
		in = m.Hidden
	}
	sim.Linear(e, w, in, m.IndexHeads*m.IndexHeadDim, b.Tokens, false)
	sim.Linear(e, w, m.Hidden, m.IndexHeadDim, b.Tokens, false)
	sim.Linear(e, w, m.Hidden, m.IndexHeads, b.Tokens, false)
	var pairs, ctx float64
	for _, s := range b.Seqs {
		pairs += sim.Pairs(s, 0)
		ctx += float64(s.Context)
	}
	key := sim.TokenBytes(l, spec.RoleIndexKey)
	w.Add(e, sim.Kernel{
		FLOPs: pairs * 2 * float64(m.IndexHeads*m.IndexHeadDim),
		Prec:  sim.FP8,
		Bytes: (ctx + float64(b.Tokens)) * key,
	})
}

// Sparse adds sparse MLA: absorbed MLA (mla.Absorbed) where each query sees
// at most index_topk tokens (0 = no limit: dense). Bytes are the KV up projection's weights, the
// latents gathered (per sequence the pairs, but never more than its context:
// a token picked by several queries of a prefill chunk is read once) and the
// new tokens' latents written.
func Sparse(e *sim.Env, w *sim.Work, l *spec.Layer, b *sim.Batch) {
	k := e.Model.IndexTopK
	perPair, perToken := mla.Absorbed(e)
	var pairs, read float64
	for _, s := range b.Seqs {
		p := sim.Pairs(s, k)
		pairs += p
		read += min(p, float64(s.Context))
	}
	lat := sim.TokenBytes(l, spec.RoleLatent)
	w.Add(e, sim.Kernel{
		FLOPs: pairs*perPair + float64(b.Tokens)*perToken,
		Prec:  sim.BF16, // fp8 latents are dequantized to bf16 in the kernel
		Bytes: mla.UpWeightBytes(e) + (read+float64(b.Tokens))*lat,
	})
}
