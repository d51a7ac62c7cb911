package cpu

import (
	"fmt"
	"math"

	"github.com/kvx-dev/kvx/device"
	"github.com/kvx-dev/kvx/device/cpu/kernel"
	"github.com/kvx-dev/kvx/device/cpu/synth"
	"github.com/kvx-dev/kvx/plugins/v1/spec"
)

// ropeTheta is the RoPE base of every synthetic attention layer.
const ropeTheta = 10000

// layerMix is one mixer layer: its projections (drawn from synth Weights
// under LayerName(layer)+"mixer.") and its kernel configuration. The paged
// device and the dense Reference share it: project turns the normed hidden
// rows into the kernel inputs, finish turns the kernel output back into the
// residual stream; only the attention or scan core between them differs.
// Immutable after newLayerMix; safe for concurrent use.
type layerMix struct {
	layer  int
	kind   device.Kernel
	hidden int

	gqa        kernel.GQA
	wq, wk, wv []float32 // GQA projections (out × hidden)

	dsa        kernel.DSA // MLA in dsa.MLA; the indexer only for kindDSA
	mlaW       kernel.MLAWeights
	wqa, qaN   []float32 // q LoRA down projection and its norm (QLoraRank > 0)
	wqb        []float32 // q up projection (from q LoRA, or from hidden when there is none)
	wkva, kvaN []float32 // kv_a_proj_with_mqa (rank+rope × hidden) and the latent norm
	wiq        []float32 // indexer query projection (from the q LoRA, or hidden)
	wik, wiw   []float32 // indexer key projection and head weights
	iwScale    float32

	mamba kernel.Mamba2
	mambW kernel.Mamba2Weights
	win   []float32 // in_proj: (d_inner + conv dim + heads) × hidden

	wo   []float32 // output projection: hidden × core width
	core int       // width of the core's output per row
}

// newLayerMix draws layer l's mixer weights for kernel k, the backend's
// choice for l.Mixer. kvDtype is the attention cache dtype; conv and ssm the
// Mamba state dtypes.
func newLayerMix(m *spec.Model, w synth.Weights, l spec.Layer, k device.Kernel, kvDtype, conv, ssm kernel.Dtype) (*layerMix, error) {
	x := &layerMix{layer: l.Index, kind: k, hidden: m.Hidden}
	p := synth.LayerName(l.Index) + "mixer."
	h := m.Hidden
	switch x.kind {
	case device.KernelNone:
		if l.Mixer != spec.MixerNone {
			return nil, fmt.Errorf("layer %d: mixer %q runs no kernel on this backend", l.Index, l.Mixer)
		}
		return x, nil
	case device.KernelGQA:
		kvh := m.KVHeads
		if kvh == 0 {
			kvh = m.Heads
		}
		x.gqa = kernel.GQA{Heads: m.Heads, KVHeads: kvh, HeadDim: m.HeadDim, Window: l.Window, Dtype: kvDtype,
			RoPE: kernel.RoPE{Dim: m.HeadDim, Theta: ropeTheta}}
		if err := x.gqa.Validate(); err != nil {
			return nil, fmt.Errorf("layer %d: %w", l.Index, err)
		}
		x.wq = w.Linear(p+"q_proj", m.Heads*m.HeadDim, h)
		x.wk = w.Linear(p+"k_proj", kvh*m.HeadDim, h)
		x.wv = w.Linear(p+"v_proj", kvh*m.HeadDim, h)
		x.core = m.Heads * m.HeadDim
	case device.KernelMLA, device.KernelDSA:
		H, N, P, R, V := m.Heads, m.QKNopeHeadDim, m.QKRopeHeadDim, m.KVLoraRank, m.VHeadDim
		x.dsa.MLA = kernel.MLA{Heads: H, KVLoraRank: R, QKNopeHeadDim: N, QKRopeHeadDim: P, VHeadDim: V, Dtype: kvDtype,
			RoPE: kernel.RoPE{Dim: P, Theta: ropeTheta, Interleaved: true}}
		if err := x.dsa.MLA.Validate(); err != nil {
			return nil, fmt.Errorf("layer %d: %w", l.Index, err)
		}
		qin := h
		if m.QLoraRank > 0 {
			qin = m.QLoraRank
			x.wqa = w.Linear(p+"q_a_proj", m.QLoraRank, h)
			x.qaN = w.Norm(p+"q_a_norm", m.QLoraRank)
		}
		x.wqb = w.Linear(p+"q_b_proj", H*(N+P), qin)
		x.wkva = w.Linear(p+"kv_a_proj", R+P, h)
		x.kvaN = w.Norm(p+"kv_a_norm", R)
		x.mlaW = kernel.MLAWeights{UK: w.Linear(p+"w_uk", H*N, R), UV: w.Linear(p+"w_uv", H*V, R)}
		x.core = H * V
		if x.kind == device.KernelDSA {
			x.dsa.Indexer = kernel.Indexer{Heads: m.IndexHeads, HeadDim: m.IndexHeadDim, TopK: m.IndexTopK}
			if err := x.dsa.Indexer.Validate(); err != nil {
				return nil, fmt.Errorf("layer %d: %w", l.Index, err)
			}
			x.wiq = w.Linear(p+"indexer.wq_b", m.IndexHeads*m.IndexHeadDim, qin)
			x.wik = w.Linear(p+"indexer.wk", m.IndexHeadDim, h)
			x.wiw = w.Linear(p+"indexer.weights_proj", m.IndexHeads, h)
			x.iwScale = float32(1 / math.Sqrt(float64(m.IndexHeads*m.IndexHeadDim)))
		}
	case device.KernelMamba2:
		x.mamba = kernel.Mamba2{Heads: m.MambaHeads, HeadDim: m.MambaHeadDim, State: m.SSMStateSize, Groups: m.NGroups,
			ConvKernel: m.ConvKernel, ConvDtype: conv, SSMDtype: ssm, Eps: synth.NormEps}
		if err := x.mamba.Validate(); err != nil {
			return nil, fmt.Errorf("layer %d: %w", l.Index, err)
		}
		mb := x.mamba
		cd, H := mb.ConvDim(), mb.Heads
		x.win = w.Linear(p+"in_proj", mb.Inner()+cd+H, h)
		x.mambW = kernel.Mamba2Weights{
			ConvW:  w.Linear(p+"conv1d.weight", cd, mb.ConvKernel),
			ConvB:  offset(w.Norm(p+"conv1d.bias", cd), -1),
			DtBias: offset(w.Norm(p+"dt_bias", H), -1),
			A:      offset(w.Norm(p+"a", H), -2), // A = -exp(A_log) in [-1.1, -0.9)
			D:      w.Norm(p+"d", H),
			NormW:  w.Norm(p+"norm", mb.Inner()),
		}
		x.core = mb.Inner()
	default:
		return nil, fmt.Errorf("layer %d: mixer %q: kernel %v does not run on the cpu device", l.Index, l.Mixer, k)
	}
	x.wo = w.Output(p+"o_proj", h, x.core)
	return x, nil
}

// offset adds d to every element of v and returns v.
func offset(v []float32, d float32) []float32 {
	for i := range v {
		v[i] += d
	}
	return v
}

// gqaIn are the GQA kernel inputs of rows.
type gqaIn struct{ q, k, v []float32 }

func (x *layerMix) projectGQA(in []float32) gqaIn {
	h, rows := x.hidden, len(in)/x.hidden
	g := x.gqa
	r := gqaIn{
		q: make([]float32, rows*g.Heads*g.HeadDim),
		k: make([]float32, rows*g.KVHeads*g.HeadDim),
		v: make([]float32, rows*g.KVHeads*g.HeadDim),
	}
	kernel.MatMul(r.q, in, x.wq, h)
	kernel.MatMul(r.k, in, x.wk, h)
	kernel.MatMul(r.v, in, x.wv, h)
	return r
}

// mlaIn are the MLA (and DSA indexer) kernel inputs of rows.
type mlaIn struct {
	in kernel.MLAInput // Pos left 0
	ix kernel.IndexInput
}

func (x *layerMix) projectMLA(in []float32) mlaIn {
	h, rows := x.hidden, len(in)/x.hidden
	m := x.dsa.MLA
	H, N, P, R := m.Heads, m.QKNopeHeadDim, m.QKRopeHeadDim, m.KVLoraRank
	qin, qw := in, h
	if x.wqa != nil {
		qw = len(x.qaN)
		qa := make([]float32, rows*qw)
		kernel.MatMul(qa, in, x.wqa, h)
		for r := range rows {
			row := qa[r*qw : (r+1)*qw]
			kernel.RMSNorm(row, row, x.qaN, synth.NormEps)
		}
		qin = qa
	}
	q := make([]float32, rows*H*(N+P))
	kernel.MatMul(q, qin, x.wqb, qw)
	var o mlaIn
	o.in.QNope = make([]float32, rows*H*N)
	o.in.QPE = make([]float32, rows*H*P)
	for r := range rows {
		for hd := range H {
			src := q[(r*H+hd)*(N+P):]
			copy(o.in.QNope[(r*H+hd)*N:(r*H+hd+1)*N], src[:N])
			copy(o.in.QPE[(r*H+hd)*P:(r*H+hd+1)*P], src[N:N+P])
		}
	}
	kva := make([]float32, rows*(R+P))
	kernel.MatMul(kva, in, x.wkva, h)
	o.in.CKV = make([]float32, rows*R)
	o.in.KPE = make([]float32, rows*P)
	for r := range rows {
		kernel.RMSNorm(o.in.CKV[r*R:(r+1)*R], kva[r*(R+P):r*(R+P)+R], x.kvaN, synth.NormEps)
		copy(o.in.KPE[r*P:(r+1)*P], kva[r*(R+P)+R:(r+1)*(R+P)])
	}
	if x.kind == device.KernelDSA {
		ix := x.dsa.Indexer
		o.ix.Q = make([]float32, rows*ix.Heads*ix.HeadDim)
		kernel.MatMul(o.ix.Q, qin, x.wiq, qw)
		o.ix.K = make([]float32, rows*ix.HeadDim)
		kernel.MatMul(o.ix.K, in, x.wik, h)
		o.ix.W = make([]float32, rows*ix.Heads)
		kernel.MatMul(o.ix.W, in, x.wiw, h)
		for i := range o.ix.W {
			o.ix.W[i] *= x.iwScale
		}
	}
	return o
}

// mambaIn are the Mamba2 kernel inputs of rows.
type mambaIn struct{ z, xBC, dt []float32 }

func (x *layerMix) projectMamba(in []float32) mambaIn {
	h, rows := x.hidden, len(in)/x.hidden
	mb := x.mamba
	di, cd, H := mb.Inner(), mb.ConvDim(), mb.Heads
	w := di + cd + H
	all := make([]float32, rows*w)
	kernel.MatMul(all, in, x.win, h)
	o := mambaIn{z: make([]float32, rows*di), xBC: make([]float32, rows*cd), dt: make([]float32, rows*H)}
	for r := range rows {
		row := all[r*w : (r+1)*w]
		copy(o.z[r*di:], row[:di])
		copy(o.xBC[r*cd:], row[di:di+cd])
		copy(o.dt[r*H:], row[di+cd:])
	}
	return o
}

// finish writes out = core · wo for every row.
func (x *layerMix) finish(out, core []float32) {
	kernel.MatMul(out, core, x.wo, x.core)
}

// sub returns rows [lo, hi) of a row-major slice of width w.
func sub(s []float32, w, lo, hi int) []float32 { return s[lo*w : hi*w : hi*w] }
