package cpu

import (
	"context"
	"fmt"

	"github.com/kvx-dev/kvx/device"
	"github.com/kvx-dev/kvx/device/cpu/kernel"
	"github.com/kvx-dev/kvx/device/cpu/synth"
	"github.com/kvx-dev/kvx/plugins/v1/spec"
)

// Reference is the dense, no-cache model the cpu device must equal: the same
// synthetic weights and per-row math, every token recomputed from scratch
// through all layers with the kernels' Dense* references. It is immutable
// after NewReference and safe for concurrent use.
type Reference struct {
	stage *synth.Stage
	mix   map[int]*layerMix
}

// NewReference builds the reference of model m (its Buffers filled by
// core/model.FillBuffers with TP 1: the cache dtypes are read off them; a
// model without buffers runs bf16 KV and float32 state) with the weights of
// seed, running each layer with the kernel that kernelOf, the backend's
// Kernel method, picks for its mixer (so DSA layers run sparse or dense as on
// the device). Errors name the field, the value and the limit.
func NewReference(m spec.Model, seed uint64, kernelOf func(spec.Mixer) device.Kernel) (*Reference, error) {
	if kernelOf == nil {
		return nil, fmt.Errorf("reference: no kernel choice (want a backend's Kernel method)")
	}
	if m.Arch == archGDN {
		return nil, fmt.Errorf("model %q arch %s: Gated DeltaNet layers cannot run on the cpu kernels", m.Name, m.Arch)
	}
	st, err := synth.New(m, seed, 0, len(m.Layers))
	if err != nil {
		return nil, err
	}
	kv, err := kvFromBuffers(&m, kernelOf)
	if err != nil {
		return nil, err
	}
	conv, ssm, err := stateDtypes(&m, m.Layers)
	if err != nil {
		return nil, err
	}
	r := &Reference{stage: st, mix: map[int]*layerMix{}}
	for _, l := range m.Layers {
		if l.Mixer == spec.MixerNone {
			continue
		}
		if r.mix[l.Index], err = newLayerMix(&m, st.Weights(), l, kernelOf(l.Mixer), kv, conv, ssm); err != nil {
			return nil, err
		}
	}
	return r, nil
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
		res, err := r.stage.Forward(ctx, denseMixer{r}, synth.Step{
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

// denseMixer runs whole sequences (every Seg at Pos 0) through the Dense*
// kernel references.
type denseMixer struct{ r *Reference }

// Mix implements synth.Mixer.
func (dm denseMixer) Mix(_ context.Context, layer int, segs []synth.Seg, in, out []float32) error {
	x := dm.r.mix[layer]
	if x == nil {
		return fmt.Errorf("reference: layer %d has no mixer", layer)
	}
	rows := len(in) / x.hidden
	core := make([]float32, rows*x.core)
	r := 0
	for _, sg := range segs {
		if sg.Pos != 0 {
			return fmt.Errorf("reference: seq %d at pos %d: the dense reference recomputes from pos 0", sg.Seq, sg.Pos)
		}
		lo, hi := r, r+sg.Rows
		seg := sub(in, x.hidden, lo, hi)
		o := sub(core, x.core, lo, hi)
		var err error
		switch x.kind {
		case device.KernelGQA:
			p := x.projectGQA(seg)
			err = kernel.DenseGQA(x.gqa, 0, p.q, p.k, p.v, o)
		case device.KernelMLA:
			p := x.projectMLA(seg)
			err = kernel.DenseMLA(x.dsa.MLA, &x.mlaW, p.in, o)
		case device.KernelDSA:
			p := x.projectMLA(seg)
			err = kernel.DenseDSA(x.dsa, &x.mlaW, p.in, p.ix, o, nil)
		case device.KernelMamba2:
			p := x.projectMamba(seg)
			_, _, err = kernel.DenseMamba2(x.mamba, &x.mambW, p.z, p.xBC, p.dt, o)
		default:
			err = fmt.Errorf("no token mixer")
		}
		if err != nil {
			return fmt.Errorf("reference: layer %d: %w", layer, err)
		}
		r = hi
	}
	x.finish(out, core)
	return nil
}

// kvFromBuffers reads the KV dtype off the first attention layer's buffers
// (bf16 when no layer has buffers).
func kvFromBuffers(m *spec.Model, kernelOf func(spec.Mixer) device.Kernel) (kernel.Dtype, error) {
	for _, l := range m.Layers {
		if len(l.Buffers) == 0 || l.Mixer == spec.MixerMamba || l.Mixer == spec.MixerNone {
			continue
		}
		for _, dt := range []kernel.Dtype{kernel.BF16, kernel.FP8} {
			x, err := newLayerMix(m, synth.Weights{}, l, kernelOf(l.Mixer), dt, kernel.F32, kernel.F32)
			if err != nil {
				return 0, err
			}
			if checkWidths(x, l) == nil {
				return dt, nil
			}
		}
		return 0, fmt.Errorf("layer %d (%s): buffers %+v fit neither bf16 nor fp8 KV", l.Index, l.Mixer, l.Buffers)
	}
	return kernel.BF16, nil
}
