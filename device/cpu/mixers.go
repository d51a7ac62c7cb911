package cpu

import (
	"fmt"

	"github.com/kvx-dev/kvx/device"
	"github.com/kvx-dev/kvx/device/cpu/kernel"
	"github.com/kvx-dev/kvx/device/synth"
	"github.com/kvx-dev/kvx/plugins/v1/spec"
)

// layerKernel is how one mixer layer runs on the cpu: the kernel the
// backend chose for it and that kernel's configuration (dimensions, cache
// dtypes; RoPE is validated here but applied by the model, so the kernels
// run with it off). The layer's projections and weights are the model's
// (package synth); the paged device and the dense Reference share this.
// Immutable after newLayerKernel; safe for concurrent use.
type layerKernel struct {
	layer int
	kind  device.Kernel
	gqa   kernel.GQA
	dsa   kernel.DSA // MLA in dsa.MLA; the indexer only for KernelDSA
	mamba kernel.Mamba2
}

// newLayerKernel configures layer l's kernel k, the backend's choice for
// l.Mixer. kvDtype is the attention cache dtype; conv and ssm the Mamba
// state dtypes. Errors name the layer, the field and the limit.
func newLayerKernel(m *spec.Model, l spec.Layer, k device.Kernel, kvDtype, conv, ssm kernel.Dtype) (*layerKernel, error) {
	x := &layerKernel{layer: l.Index, kind: k}
	switch k {
	case device.KernelNone:
		if l.Mixer != spec.MixerNone {
			return nil, fmt.Errorf("layer %d: mixer %q runs no kernel on this backend", l.Index, l.Mixer)
		}
	case device.KernelGQA:
		kvh := m.KVHeads
		if kvh == 0 {
			kvh = m.Heads
		}
		x.gqa = kernel.GQA{Heads: m.Heads, KVHeads: kvh, HeadDim: m.HeadDim, Window: l.Window, Dtype: kvDtype,
			RoPE: kernel.RoPE{Dim: m.HeadDim, Theta: synth.RoPETheta}}
		if err := x.gqa.Validate(); err != nil {
			return nil, fmt.Errorf("layer %d: %w", l.Index, err)
		}
		x.gqa.RoPE = kernel.RoPE{} // the model rotates q and k (synth.Ops.RoPE)
	case device.KernelMLA, device.KernelDSA:
		x.dsa.MLA = kernel.MLA{Heads: m.Heads, KVLoraRank: m.KVLoraRank, QKNopeHeadDim: m.QKNopeHeadDim, QKRopeHeadDim: m.QKRopeHeadDim,
			VHeadDim: m.VHeadDim, Dtype: kvDtype, RoPE: kernel.RoPE{Dim: m.QKRopeHeadDim, Theta: synth.RoPETheta, Interleaved: true}}
		if err := x.dsa.MLA.Validate(); err != nil {
			return nil, fmt.Errorf("layer %d: %w", l.Index, err)
		}
		x.dsa.MLA.RoPE = kernel.RoPE{} // the model rotates q_pe and k_pe (synth.Ops.RoPE)
		if k == device.KernelDSA {
			x.dsa.Indexer = kernel.Indexer{Heads: m.IndexHeads, HeadDim: m.IndexHeadDim, TopK: m.IndexTopK}
			if m.Checkpoint != "" {
				// transformers' indexer: unquantized keys at the KV dtype
				// (core/model.FillBuffers sizes them so).
				x.dsa.Indexer.Plain, x.dsa.Indexer.Keys = true, kvDtype
			}
			if err := x.dsa.Indexer.Validate(); err != nil {
				return nil, fmt.Errorf("layer %d: %w", l.Index, err)
			}
		}
	case device.KernelMamba2:
		x.mamba = kernel.Mamba2{Heads: m.MambaHeads, HeadDim: m.MambaHeadDim, State: m.SSMStateSize, Groups: m.NGroups,
			ConvKernel: m.ConvKernel, ConvDtype: conv, SSMDtype: ssm, Eps: synth.NormEps}
		if err := x.mamba.Validate(); err != nil {
			return nil, fmt.Errorf("layer %d: %w", l.Index, err)
		}
	default:
		return nil, fmt.Errorf("layer %d: mixer %q: kernel %v does not run on the cpu device", l.Index, l.Mixer, k)
	}
	return x, nil
}

// layerKernels configures the kernel of every mixer layer of layers, as
// kernelOf (the backend's Kernel method) picks it, and checks each against
// its buffers when check is set.
func layerKernels(m *spec.Model, layers []spec.Layer, kernelOf func(spec.Mixer) device.Kernel, kv, conv, ssm kernel.Dtype, check bool) (map[int]*layerKernel, error) {
	ks := map[int]*layerKernel{}
	for _, l := range layers {
		if l.Mixer == spec.MixerNone {
			continue
		}
		x, err := newLayerKernel(m, l, kernelOf(l.Mixer), kv, conv, ssm)
		if err != nil {
			return nil, err
		}
		if check {
			if err := checkWidths(x, l); err != nil {
				return nil, err
			}
		}
		ks[l.Index] = x
	}
	return ks, nil
}

// outWidth is the width of the kernel's output per row.
func (x *layerKernel) outWidth() int {
	switch x.kind {
	case device.KernelGQA:
		return x.gqa.Heads * x.gqa.HeadDim
	case device.KernelMLA, device.KernelDSA:
		return x.dsa.MLA.Heads * x.dsa.MLA.VHeadDim
	case device.KernelMamba2:
		return x.mamba.Inner()
	}
	return 0
}

// mlaRows returns rows [lo, hi) of in and ix (ix when it is set) as kernel
// inputs at position pos.
func mlaRows(in synth.MLAIn, ix *synth.IndexIn, pos, lo, hi int) (kernel.MLAInput, kernel.IndexInput) {
	mi := kernel.MLAInput{Pos: pos, QNope: rowsOf(in.QNope, lo, hi), QPE: rowsOf(in.QPE, lo, hi), CKV: rowsOf(in.CKV, lo, hi), KPE: rowsOf(in.KPE, lo, hi)}
	var ki kernel.IndexInput
	if ix != nil {
		ki = kernel.IndexInput{Q: rowsOf(ix.Q, lo, hi), W: rowsOf(ix.W, lo, hi), K: rowsOf(ix.K, lo, hi)}
	}
	return mi, ki
}

// rowsOf returns rows [lo, hi) of a cpu tensor's elements.
func rowsOf(t synth.Tensor, lo, hi int) []float32 { return cpuTensor(t).rowsOf(lo, hi) }

func mlaWeights(w synth.MLAWeights) kernel.MLAWeights {
	return kernel.MLAWeights{UK: cpuTensor(w.UK).d, UV: cpuTensor(w.UV).d}
}

func mamba2Weights(w synth.Mamba2Weights) kernel.Mamba2Weights {
	return kernel.Mamba2Weights{ConvW: cpuTensor(w.ConvW).d, ConvB: cpuTensor(w.ConvB).d, DtBias: cpuTensor(w.DtBias).d,
		A: cpuTensor(w.A).d, D: cpuTensor(w.D).d, NormW: cpuTensor(w.NormW).d}
}
