package cpu

import (
	"github.com/kvx-dev/kvx/device/cpu/kernel"
	"github.com/kvx-dev/kvx/device/hf"
	"github.com/kvx-dev/kvx/device/synth"
	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
)

// pool is one pool of the layout as the device owns it.
type pool struct {
	kvcache.Pool
	mem kernel.Pool // Blocks × BlockBytes bytes
}

// state reports whether the pool holds per-sequence state (TokensPerBlock 0).
func (p *pool) state() bool { return p.TokensPerBlock == 0 }

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

func gdnWeights(w hf.GDNWeights) kernel.GDNWeights {
	return kernel.GDNWeights{ConvW: cpuTensor(w.ConvW).d, DtBias: cpuTensor(w.DtBias).d, A: cpuTensor(w.A).d, NormW: cpuTensor(w.NormW).d}
}
