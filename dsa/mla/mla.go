// Package mla is the dense multi-head latent attention backend (DeepSeek-V3).
//
// It runs MLA layers, and DSA layers densely: running a DSA model (DeepSeek
// V3.2, GLM-5) with this backend is a legitimate A/B against package dsa,
// sparse against dense. On a DSA layer it still projects and writes the
// lightning indexer's keys, so the indexer cache holds what it would under
// dsa, but never scores them: attention covers the whole context.
//
// The exported cost functions are the building blocks that package dsa
// shares. All are pure and work on one rank.
package mla

import (
	"github.com/kvx-dev/kvx/device"
	"github.com/kvx-dev/kvx/device/sim"
	"github.com/kvx-dev/kvx/plugins/v1/spec"
)

// Backend is the dense MLA backend.
var Backend device.Backend = backend{}

type backend struct{}

var mixers = []spec.Mixer{spec.MixerMLA, spec.MixerDSA}

func (backend) Name() string         { return "mla" }
func (backend) Mixers() []spec.Mixer { return mixers }

// Kernel runs MLA layers and DSA layers alike with dense absorbed MLA: a DSA
// layer's indexer keys are left alone and attention covers the whole context.
func (backend) Kernel(m spec.Mixer) device.Kernel {
	switch m {
	case spec.MixerMLA, spec.MixerDSA:
		return device.KernelMLA
	}
	return device.KernelNone
}

func (backend) MixerWork(e *sim.Env, l *spec.Layer, b *sim.Batch, w *sim.Work) {
	Projections(e, w, b.Tokens)
	Dense(e, w, l, b)
	if l.Mixer == spec.MixerDSA {
		IndexKeys(e, w, l, b.Tokens)
	}
}

// Projections adds the MLA weight matmuls for tokens rows: the query down
// projection (replicated) and up projection (sharded by heads), or one query
// projection without q_lora_rank; the joint KV down projection to the latent
// and the rope key (replicated); and the output projection (sharded). The KV
// up projection's weights are read by the attention kernel (Dense, and dsa's
// sparse kernel), which uses them in one form or the other.
func Projections(e *sim.Env, w *sim.Work, tokens int) {
	m := e.Model
	qHead := m.QKNopeHeadDim + m.QKRopeHeadDim
	if m.QLoraRank > 0 {
		sim.Linear(e, w, m.Hidden, m.QLoraRank, tokens, false)
		sim.Linear(e, w, m.QLoraRank, m.Heads*qHead, tokens, true)
	} else {
		sim.Linear(e, w, m.Hidden, m.Heads*qHead, tokens, true)
	}
	sim.Linear(e, w, m.Hidden, m.KVLoraRank+m.QKRopeHeadDim, tokens, false)
	sim.Linear(e, w, m.Heads*m.VHeadDim, m.Hidden, tokens, true)
}

// Absorbed returns the FLOPs on one rank of absorbed MLA (MQA over the
// latent, as decode kernels run it): per query-key pair, QK over the latent
// and rope dims plus PV over the latent; per query token, absorbing the KV up
// projection into the query (nope -> latent) and out of the output (latent
// -> v).
func Absorbed(e *sim.Env) (perPair, perToken float64) {
	m := e.Model
	h := e.Shard(float64(m.Heads))
	lat, rope := float64(m.KVLoraRank), float64(m.QKRopeHeadDim)
	perPair = 2 * h * (2*lat + rope)
	perToken = 2 * h * lat * float64(m.QKNopeHeadDim+m.VHeadDim)
	return perPair, perToken
}

// UpWeightBytes is the KV up projection's weights on one rank (sharded by
// heads), read once per layer by the attention kernel.
func UpWeightBytes(e *sim.Env) float64 {
	m := e.Model
	return e.Shard(float64(m.KVLoraRank*m.Heads*(m.QKNopeHeadDim+m.VHeadDim))) * e.Weights.Bytes
}

// Dense adds dense MLA attention over the whole context of every sequence.
// Per sequence it takes the cheaper of two forms, as engines pick MHA for
// prefill and absorbed MQA for decode:
//
//	absorbed: pairs * perPair + new * perToken                   (Absorbed)
//	MHA:      pairs * 2h(nope+rope+v) + context * 2h*latent*(nope+v)
//
// where MHA first expands every context token's latent into K and V. Bytes
// are the KV up projection's weights, the latent of every context token read
// once, and the new tokens' latents written (the expanded K and V of the MHA
// form stay on chip; an optimistic simplification).
func Dense(e *sim.Env, w *sim.Work, l *spec.Layer, b *sim.Batch) {
	m := e.Model
	h := e.Shard(float64(m.Heads))
	absPair, absTok := Absorbed(e)
	mhaPair := 2 * h * float64(m.QKNopeHeadDim+m.QKRopeHeadDim+m.VHeadDim)
	mhaCtx := 2 * h * float64(m.KVLoraRank) * float64(m.QKNopeHeadDim+m.VHeadDim)
	var flops, ctx float64
	for _, s := range b.Seqs {
		pairs := sim.Pairs(s, 0)
		c := float64(s.Context)
		flops += min(pairs*absPair+float64(s.New)*absTok, pairs*mhaPair+c*mhaCtx)
		ctx += c
	}
	lat := sim.TokenBytes(l, spec.RoleLatent)
	w.Add(e, sim.Kernel{
		FLOPs: flops,
		Prec:  sim.BF16, // fp8 caches are dequantized to bf16 in the kernel
		Bytes: UpWeightBytes(e) + ctx*lat + float64(b.Tokens)*lat,
	})
}

// IndexKeys adds what a DSA layer's indexer costs when its scores are not
// needed: the replicated key projection and norm, and writing the new
// tokens' index keys.
func IndexKeys(e *sim.Env, w *sim.Work, l *spec.Layer, tokens int) {
	sim.Linear(e, w, e.Model.Hidden, e.Model.IndexHeadDim, tokens, false)
	w.Add(e, sim.Kernel{Bytes: float64(tokens) * sim.TokenBytes(l, spec.RoleIndexKey)})
}
