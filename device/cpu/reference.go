package cpu

import (
	"context"
	"fmt"
	"github.com/kvx-dev/kvx/device/kernelspec"
	"github.com/kvx-dev/kvx/device/paged"

	"github.com/kvx-dev/kvx/device"
	"github.com/kvx-dev/kvx/device/cpu/kernel"
	"github.com/kvx-dev/kvx/device/synth"
	"github.com/kvx-dev/kvx/plugins/v1/spec"
)

// Reference is the dense, no-cache model the cpu device must equal: the same
// model code (synth.Stage) over the same row-wise ops (hostOps), every token
// recomputed from scratch through all layers with the kernels' Dense*
// references in place of the paged kernels. It is immutable after
// NewReference and safe for concurrent use.
type Reference struct {
	stage *synth.Stage
	ops   denseOps
}

// NewReference builds the reference of model m (its Buffers filled by
// plugins/model.FillBuffers with TP 1: the cache dtypes are read off them; a
// model without buffers runs bf16 KV and float32 state) with the weights of
// seed, running each layer with the kernel that kernelOf, the backend's
// Kernel method, picks for its mixer (so DSA layers run sparse or dense as on
// the device). Errors name the field, the value and the limit.
func NewReference(m spec.Model, seed uint64, kernelOf func(spec.Mixer) device.Kernel) (*Reference, error) {
	if kernelOf == nil {
		return nil, fmt.Errorf("reference: no kernel choice (want a backend's Kernel method)")
	}
	if m.Arch == paged.ArchGDN {
		return nil, fmt.Errorf("model %q arch %s: the synthetic model (and so its dense reference) has no Gated DeltaNet layer", m.Name, m.Arch)
	}
	kv, err := kvFromBuffers(&m, kernelOf)
	if err != nil {
		return nil, err
	}
	conv, ssm, err := paged.StateDtypes(&m, m.Layers)
	if err != nil {
		return nil, err
	}
	mix, err := paged.Mixers(&m, m.Layers, kernelOf, kv, conv, ssm, false)
	if err != nil {
		return nil, err
	}
	st, err := synth.New(m, seed, 0, len(m.Layers), kernelOf, hostOps{})
	if err != nil {
		return nil, err
	}
	return &Reference{stage: st, ops: denseOps{mix: mix}}, nil
}

// Generate greedily generates n tokens after prompt, recomputing the whole
// sequence at every token, and returns them with the logits that produced
// the last one. ctx cancels between layers.
func (r *Reference) Generate(ctx context.Context, prompt []int32, n int) (tokens []int32, logits []float32, err error) {
	if len(prompt) == 0 || n < 1 {
		return nil, nil, fmt.Errorf("reference: prompt of %d tokens and n %d: want >= 1 each", len(prompt), n)
	}
	seq := append([]int32(nil), prompt...)
	for range n {
		res, err := r.stage.Forward(ctx, r.ops, synth.Step{
			Items:  []synth.Item{{Seq: 1, Tokens: seq, Sample: true}},
			Logits: true,
		})
		if err != nil {
			return nil, nil, err
		}
		o := res.Outputs[0]
		seq = append(seq, o.Tokens[0])
		tokens = append(tokens, o.Tokens[0])
		logits = o.Logits
	}
	return tokens, logits, nil
}

// denseOps is synth.Ops with the Dense* kernel references as mixers: whole
// sequences (every Seg at Pos 0), no cache.
type denseOps struct {
	hostOps
	mix map[int]*paged.Mixer
}

var _ synth.Ops = denseOps{}

// each runs fn on every seg's rows [lo, hi), which must start at Pos 0.
func (dm denseOps) each(layer int, k device.Kernel, segs []synth.Seg, rows int, fn func(x *paged.Mixer, lo, hi int, out []float32) error) (synth.Tensor, error) {
	x, err := kernelOf(dm.mix, layer, k)
	if err != nil {
		return nil, fmt.Errorf("reference: %w", err)
	}
	core := newTensor(rows, x.OutWidth())
	r := 0
	for _, sg := range segs {
		if sg.Pos != 0 {
			return nil, fmt.Errorf("reference: seq %d at pos %d: the dense reference recomputes from pos 0", sg.Seq, sg.Pos)
		}
		lo, hi := r, r+sg.Rows
		if err := fn(x, lo, hi, core.rowsOf(lo, hi)); err != nil {
			return nil, fmt.Errorf("reference: layer %d: %w", layer, err)
		}
		r = hi
	}
	return core, nil
}

func (dm denseOps) GQA(_ context.Context, layer int, segs []synth.Seg, q, k, v synth.Tensor) (synth.Tensor, error) {
	return dm.each(layer, device.KernelGQA, segs, q.Rows(), func(x *paged.Mixer, lo, hi int, out []float32) error {
		return kernel.DenseGQA(x.GQA, 0, rowsOf(q, lo, hi), rowsOf(k, lo, hi), rowsOf(v, lo, hi), out)
	})
}

func (dm denseOps) MLA(_ context.Context, layer int, segs []synth.Seg, in synth.MLAIn, w synth.MLAWeights) (synth.Tensor, error) {
	mw := mlaWeights(w)
	return dm.each(layer, device.KernelMLA, segs, in.QNope.Rows(), func(x *paged.Mixer, lo, hi int, out []float32) error {
		mi, _ := mlaRows(in, nil, 0, lo, hi)
		return kernel.DenseMLA(x.DSA.MLA, &mw, mi, out)
	})
}

func (dm denseOps) DSA(_ context.Context, layer int, segs []synth.Seg, in synth.MLAIn, ix synth.IndexIn, w synth.MLAWeights) (synth.Tensor, error) {
	mw := mlaWeights(w)
	return dm.each(layer, device.KernelDSA, segs, in.QNope.Rows(), func(x *paged.Mixer, lo, hi int, out []float32) error {
		mi, ki := mlaRows(in, &ix, 0, lo, hi)
		return kernel.DenseDSA(x.DSA, &mw, mi, ki, out, nil)
	})
}

func (dm denseOps) Mamba2(_ context.Context, layer int, segs []synth.Seg, in synth.Mamba2In, w synth.Mamba2Weights) (synth.Tensor, error) {
	mw := mamba2Weights(w)
	return dm.each(layer, device.KernelMamba2, segs, in.Z.Rows(), func(x *paged.Mixer, lo, hi int, out []float32) error {
		_, _, err := kernel.DenseMamba2(x.Mamba, &mw, rowsOf(in.Z, lo, hi), rowsOf(in.XBC, lo, hi), rowsOf(in.DT, lo, hi), out)
		return err
	})
}

// kvFromBuffers reads the KV dtype off the first attention layer's buffers
// (bf16 when no layer has buffers).
func kvFromBuffers(m *spec.Model, kernelOf func(spec.Mixer) device.Kernel) (kernelspec.Dtype, error) {
	for _, l := range m.Layers {
		if len(l.Buffers) == 0 || l.Mixer == spec.MixerMamba || l.Mixer == spec.MixerNone {
			continue
		}
		for _, dt := range []kernelspec.Dtype{kernelspec.BF16, kernelspec.FP8} {
			x, err := paged.NewMixer(m, l, kernelOf(l.Mixer), dt, kernelspec.F32, kernelspec.F32)
			if err != nil {
				return 0, err
			}
			if paged.CheckWidths(x, l) == nil {
				return dt, nil
			}
		}
		return 0, fmt.Errorf("layer %d (%s): buffers %+v fit neither bf16 nor fp8 KV", l.Index, l.Mixer, l.Buffers)
	}
	return kernelspec.BF16, nil
}
