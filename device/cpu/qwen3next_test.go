package cpu_test

import (
	"context"
	"testing"

	"github.com/kvx-dev/kvx/device/hf"
	"github.com/kvx-dev/kvx/device/synth"
)

// gdnEdit is a deliberately wrong Gated DeltaNet: edit changes the layer's
// inputs or weights before the device's kernel sees them.
type gdnEdit struct {
	hf.GDNOps
	edit func(o hf.GDNOps, in *hf.GDNIn, w *hf.GDNWeights)
}

func (o gdnEdit) GatedDeltaNet(ctx context.Context, layer int, segs []synth.Seg, in hf.GDNIn, w hf.GDNWeights) (synth.Tensor, error) {
	o.edit(o.GDNOps, &in, &w)
	return o.GDNOps.GatedDeltaNet(ctx, layer, segs, in, w)
}

// gateDrop skips SigmoidMul for gates of one column (the shared expert's)
// when shared, else for the full-width ones (the attention output gate).
type gateDrop struct {
	hf.GDNOps
	shared bool
}

func (o gateDrop) SigmoidMul(x, gate synth.Tensor) {
	if (gate.Cols() == 1) == o.shared {
		return
	}
	o.GDNOps.SigmoidMul(x, gate)
}

// wholeRoPE rotates whole heads in place of partial_rotary_factor's first
// quarter.
type wholeRoPE struct{ hf.GDNOps }

func (o wholeRoPE) RoPE(x synth.Tensor, segs []synth.Seg, stride int, r synth.RoPE) {
	r.Dim, r.InvFreq = stride, nil
	o.GDNOps.RoPE(x, segs, stride, r)
}

// filled is a rows × cols tensor of v.
func filled(o hf.GDNOps, rows, cols int, v float32) synth.Tensor {
	d := make([]float32, rows*cols)
	for i := range d {
		d[i] = v
	}
	return o.FromHost(d, rows, cols)
}

// TestQwen3NextGoldenCheckCatchesWrongKernels shows the Qwen3-Next golden
// check has teeth: a run with the conv taps reversed (the conv state read
// newest first), β dropped (1), the decay dropped (exp(g) = 1), the
// attention output gate or the shared expert's gate dropped, or RoPE on
// whole heads (partial_rotary_factor ignored) fails the
// vLLM rule or the logprob tolerance on some prompt.
func TestQwen3NextGoldenCheckCatchesWrongKernels(t *testing.T) {
	skipUnderRace(t)
	gdn := func(edit func(o hf.GDNOps, in *hf.GDNIn, w *hf.GDNWeights)) func(hf.Ops) hf.Ops {
		return func(o hf.Ops) hf.Ops { return gdnEdit{o.(hf.GDNOps), edit} }
	}
	for _, c := range []struct {
		name string
		wrap func(hf.Ops) hf.Ops
	}{
		{"conv taps reversed", gdn(func(o hf.GDNOps, _ *hf.GDNIn, w *hf.GDNWeights) {
			rows, k := w.ConvW.Rows(), w.ConvW.Cols()
			src, rev := o.ToHost(w.ConvW), make([]float32, rows*k)
			for r := range rows {
				for j := range k {
					rev[r*k+j] = src[r*k+k-1-j]
				}
			}
			w.ConvW = o.FromHost(rev, rows, k)
		})},
		{"beta dropped", gdn(func(o hf.GDNOps, in *hf.GDNIn, _ *hf.GDNWeights) {
			in.B = filled(o, in.B.Rows(), in.B.Cols(), 1e30) // sigmoid = 1
		})},
		{"decay dropped", gdn(func(o hf.GDNOps, _ *hf.GDNIn, w *hf.GDNWeights) {
			w.A = o.Zeros(1, w.A.Cols()) // g = 0: exp(g) = 1
		})},
		{"attention output gate dropped", func(o hf.Ops) hf.Ops { return gateDrop{o.(hf.GDNOps), false} }},
		{"shared expert gate dropped", func(o hf.Ops) hf.Ops { return gateDrop{o.(hf.GDNOps), true} }},
		{"whole heads rotated", func(o hf.Ops) hf.Ops { return wholeRoPE{o.(hf.GDNOps)} }},
	} {
		expectCaught(t, c.name, goldenDir("qwen3_next"), nil, opts{manager: "mamba", batch: allPrompts}, c.wrap)
	}
}
