package synth

import (
	"context"
	"fmt"
	"math"

	"github.com/kvx-dev/kvx/device"
	"github.com/kvx-dev/kvx/plugins/v1/spec"
)

// RoPETheta is the RoPE base of every synthetic attention layer.
const RoPETheta = 10000

// mixW is one mixer layer's projections, drawn under LayerName(i)+"mixer.",
// for the kernel the backend runs it with. The kernel's own configuration
// (cache dtype, layout) is the device's.
type mixW struct {
	kernel device.Kernel
	rope   RoPE // on q and k (GQA: every head_dim; MLA, DSA: q_pe and k_pe)
	stride int  // elements per head of the rotated tensors

	wq, wk, wv Tensor // GQA projections (out × hidden)

	heads, nope, ropeDim, rank int
	wqa, qaN                   Tensor // q LoRA down projection and its norm (QLoraRank > 0)
	wqb                        Tensor // q up projection (from q LoRA, or from hidden when there is none)
	wkva, kvaN                 Tensor // kv_a_proj_with_mqa (rank+rope × hidden) and the latent norm
	mla                        MLAWeights
	wiq                        Tensor // indexer query projection (from the q LoRA, or hidden)
	wik, wiw                   Tensor // indexer key projection and head weights
	iwScale                    float32

	inner, convDim, mheads int
	win                    Tensor // in_proj: (d_inner + conv dim + heads) × hidden
	mamba                  Mamba2Weights

	wo Tensor // output projection: hidden × the kernel's output width
}

// newMixW draws layer l's mixer weights for kernel k.
func newMixW(ops Loader, w Weights, m *spec.Model, l spec.Layer, k device.Kernel) (*mixW, error) {
	x := &mixW{kernel: k}
	p := LayerName(l.Index) + "mixer."
	h := m.Hidden
	lin := func(name string, out, in int) Tensor { return ops.Weight(w.Linear(p+name, out, in), out, in) }
	norm := func(name string, n int, d float32) Tensor { return ops.Weight(offset(w.Norm(p+name, n), d), 1, n) }
	var core int
	switch k {
	case device.KernelGQA:
		kvh := m.KVHeads
		if kvh == 0 {
			kvh = m.Heads
		}
		x.wq = lin("q_proj", m.Heads*m.HeadDim, h)
		x.wk = lin("k_proj", kvh*m.HeadDim, h)
		x.wv = lin("v_proj", kvh*m.HeadDim, h)
		x.rope, x.stride = RoPE{Dim: m.HeadDim, Theta: RoPETheta}, m.HeadDim
		core = m.Heads * m.HeadDim
	case device.KernelMLA, device.KernelDSA:
		H, N, P, R, V := m.Heads, m.QKNopeHeadDim, m.QKRopeHeadDim, m.KVLoraRank, m.VHeadDim
		x.heads, x.nope, x.ropeDim, x.rank = H, N, P, R
		x.rope, x.stride = RoPE{Dim: P, Theta: RoPETheta, Interleaved: true}, P
		qin := h
		if m.QLoraRank > 0 {
			qin = m.QLoraRank
			x.wqa = lin("q_a_proj", m.QLoraRank, h)
			x.qaN = norm("q_a_norm", m.QLoraRank, 0)
		}
		x.wqb = lin("q_b_proj", H*(N+P), qin)
		x.wkva = lin("kv_a_proj", R+P, h)
		x.kvaN = norm("kv_a_norm", R, 0)
		x.mla = MLAWeights{UK: lin("w_uk", H*N, R), UV: lin("w_uv", H*V, R)}
		core = H * V
		if k == device.KernelDSA {
			x.wiq = lin("indexer.wq_b", m.IndexHeads*m.IndexHeadDim, qin)
			x.wik = lin("indexer.wk", m.IndexHeadDim, h)
			x.wiw = lin("indexer.weights_proj", m.IndexHeads, h)
			x.iwScale = float32(1 / math.Sqrt(float64(m.IndexHeads*m.IndexHeadDim)))
		}
	case device.KernelMamba2:
		H := m.MambaHeads
		x.inner = H * m.MambaHeadDim
		x.convDim = x.inner + 2*m.NGroups*m.SSMStateSize
		x.mheads = H
		if H <= 0 || m.MambaHeadDim <= 0 || m.ConvKernel <= 0 {
			return nil, fmt.Errorf("synth: layer %d: mamba heads %d, head dim %d, conv kernel %d must be > 0", l.Index, H, m.MambaHeadDim, m.ConvKernel)
		}
		x.win = lin("in_proj", x.inner+x.convDim+H, h)
		x.mamba = Mamba2Weights{
			ConvW:  lin("conv1d.weight", x.convDim, m.ConvKernel),
			ConvB:  norm("conv1d.bias", x.convDim, -1),
			DtBias: norm("dt_bias", H, -1),
			A:      norm("a", H, -2), // A = -exp(A_log) in [-1.1, -0.9)
			D:      norm("d", H, 0),
			NormW:  norm("norm", x.inner, 0),
		}
		core = x.inner
	default:
		return nil, fmt.Errorf("synth: layer %d: mixer %q runs kernel %v, which has no projections here", l.Index, l.Mixer, k)
	}
	x.wo = ops.Weight(w.Output(p+"o_proj", h, core), h, core)
	return x, nil
}

// offset adds d to every element of v and returns v.
func offset(v []float32, d float32) []float32 {
	if d != 0 {
		for i := range v {
			v[i] += d
		}
	}
	return v
}

// mix runs mixer layer li on in (the normed hidden rows) and returns its
// output in the residual stream: projections, RoPE on queries and keys, the
// device's kernel, output projection.
func (x *mixW) mix(ctx context.Context, ops Ops, li int, segs []Seg, in Tensor) (Tensor, error) {
	var core Tensor
	var err error
	switch x.kernel {
	case device.KernelGQA:
		q, k := ops.MatMul(in, x.wq), ops.MatMul(in, x.wk)
		ops.RoPE(q, segs, x.stride, x.rope)
		ops.RoPE(k, segs, x.stride, x.rope)
		core, err = ops.GQA(ctx, li, segs, q, k, ops.MatMul(in, x.wv))
	case device.KernelMLA, device.KernelDSA:
		qin := in
		if x.wqa != nil {
			qin = ops.RMSNorm(ops.MatMul(in, x.wqa), x.qaN, NormEps)
		}
		q := ops.Split(ops.MatMul(qin, x.wqb), x.heads, x.nope, x.ropeDim)
		kva := ops.Split(ops.MatMul(in, x.wkva), 1, x.rank, x.ropeDim)
		ops.RoPE(q[1], segs, x.stride, x.rope)
		ops.RoPE(kva[1], segs, x.stride, x.rope)
		mi := MLAIn{QNope: q[0], QPE: q[1], CKV: ops.RMSNorm(kva[0], x.kvaN, NormEps), KPE: kva[1]}
		if x.kernel == device.KernelDSA {
			iw := ops.MatMul(in, x.wiw)
			ops.Scale(iw, x.iwScale)
			ix := IndexIn{Q: ops.MatMul(qin, x.wiq), K: ops.MatMul(in, x.wik), W: iw}
			core, err = ops.DSA(ctx, li, segs, mi, ix, x.mla)
		} else {
			core, err = ops.MLA(ctx, li, segs, mi, x.mla)
		}
	case device.KernelMamba2:
		p := ops.Split(ops.MatMul(in, x.win), 1, x.inner, x.convDim, x.mheads)
		core, err = ops.Mamba2(ctx, li, segs, Mamba2In{Z: p[0], XBC: p[1], DT: p[2]}, x.mamba)
	}
	if err != nil {
		return nil, err
	}
	return ops.MatMul(core, x.wo), nil
}
