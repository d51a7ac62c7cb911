// Package gqa is the standard attention backend: grouped-query attention
// (MHA and MQA included) with full or sliding-window attention, plus the
// Mamba2 mixer and mixer-less (pure FFN) layers, so that it runs Llama-style
// models and Nemotron-H-style hybrids.
package gqa

import (
	"github.com/kvx-dev/kvx/device"
	"github.com/kvx-dev/kvx/device/sim"
	"github.com/kvx-dev/kvx/plugins/v1/spec"
)

// Backend is the GQA (and Mamba2) backend.
var Backend device.Backend = backend{}

type backend struct{}

var mixers = []spec.Mixer{spec.MixerGQA, spec.MixerMamba, spec.MixerNone}

func (backend) Name() string         { return "gqa" }
func (backend) Mixers() []spec.Mixer { return mixers }

// Kernel runs GQA layers with GQA attention (their window included) and
// Mamba layers with Mamba2; mixer-less layers need no kernel.
func (backend) Kernel(m spec.Mixer) device.Kernel {
	switch m {
	case spec.MixerGQA:
		return device.KernelGQA
	case spec.MixerMamba:
		return device.KernelMamba2
	}
	return device.KernelNone
}

func (backend) MixerWork(e *sim.Env, l *spec.Layer, b *sim.Batch, w *sim.Work) {
	switch l.Mixer {
	case spec.MixerGQA:
		Attention(e, w, l, b)
	case spec.MixerMamba:
		Mamba(e, w, l, b)
	}
}

// Attention adds one GQA layer: the fused QKV projection and the output
// projection (both sharded by heads), and attention where each query sees at
// most l.Window tokens (0 = the whole context), QK and PV at 2*head_dim FLOPs
// each per head per pair. Bytes are each sequence's visible K and V read
// once and the new tokens' K and V written, at the layer's per-rank KV bytes.
func Attention(e *sim.Env, w *sim.Work, l *spec.Layer, b *sim.Batch) {
	m := e.Model
	hd := sim.HeadDim(m)
	sim.Linear(e, w, m.Hidden, (m.Heads+2*m.KVHeads)*hd, b.Tokens, true)
	sim.Linear(e, w, m.Heads*hd, m.Hidden, b.Tokens, true)
	var pairs, read float64
	for _, s := range b.Seqs {
		pairs += sim.Pairs(s, l.Window)
		read += sim.Visible(s, l.Window)
	}
	kv := sim.TokenBytes(l, spec.RoleKV)
	w.Add(e, sim.Kernel{
		FLOPs: pairs * 4 * e.Shard(float64(m.Heads*hd)),
		Prec:  sim.BF16, // fp8 caches are dequantized to bf16 in the kernel
		Bytes: (read + float64(b.Tokens)) * kv,
	})
}

// Mamba adds one Mamba2 layer (d_inner = mamba_heads * mamba_head_dim): the
// input projection to z, x, B, C and dt and the output projection (sharded
// by heads); the causal conv1d over x, B and C (conv_kernel taps); and the
// selective scan, about 6 FLOPs per d_inner element per state element per
// token (decay, input, output). Bytes are each sequence's conv and SSM state
// read and written once (the layer's per-rank state bytes) and the conv and
// scan activations. The chunked SSD form used for long prefills does more
// FLOPs than this recurrence; both are small next to the projections.
func Mamba(e *sim.Env, w *sim.Work, l *spec.Layer, b *sim.Batch) {
	m := e.Model
	inner := m.MambaHeads * m.MambaHeadDim
	bc := 2 * m.NGroups * m.SSMStateSize // B and C
	sim.Linear(e, w, m.Hidden, 2*inner+bc+m.MambaHeads, b.Tokens, true)
	t := float64(b.Tokens)
	conv := float64(inner + bc)
	w.Add(e, sim.Kernel{
		FLOPs: e.Shard(t * (2*float64(m.ConvKernel)*conv + 6*float64(inner*m.SSMStateSize))),
		Prec:  sim.BF16,
		Bytes: 2*float64(len(b.Seqs))*sim.SeqBytes(l) + e.Shard(t*(conv+float64(inner))*2*2),
	})
	sim.Linear(e, w, inner, m.Hidden, b.Tokens, true)
}
