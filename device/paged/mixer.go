package paged

import (
	"fmt"

	"github.com/kvx-dev/kvx/device"
	"github.com/kvx-dev/kvx/device/hf"
	"github.com/kvx-dev/kvx/device/kernelspec"
	"github.com/kvx-dev/kvx/device/synth"
	"github.com/kvx-dev/kvx/plugins/v1/spec"
)

// Mixer is how one mixer layer runs on a computing device: the kernel the
// backend chose for it and that kernel's configuration (dimensions, cache
// dtypes; RoPE is validated here but applied by the model, so the kernels
// run with it off). The layer's projections and weights are the model's
// (package synth); the paged device and the dense Reference share this.
// Immutable after NewMixer; safe for concurrent use.
type Mixer struct {
	Layer int
	Kind  device.Kernel
	GQA   kernelspec.GQA
	DSA   kernelspec.DSA // MLA in dsa.MLA; the indexer only for KernelDSA
	Mamba kernelspec.Mamba2
	GDN   kernelspec.GDN
}

// NewMixer configures layer l's kernel k, the backend's choice for
// l.Mixer. kvDtype is the attention cache dtype; conv and ssm the Mamba
// state dtypes. A Mamba layer of a Qwen3-Next model (ArchGDN: plugins/model
// maps its Gated DeltaNet layers onto the Mamba mixer, with the same state
// buffers) runs KernelGDN where the backend chose the state-space kernel
// KernelMamba2. Errors name the layer, the field and the limit.
func NewMixer(m *spec.Model, l spec.Layer, k device.Kernel, kvDtype, conv, ssm kernelspec.Dtype) (*Mixer, error) {
	if k == device.KernelMamba2 && m.Arch == ArchGDN {
		k = device.KernelGDN
	}
	x := &Mixer{Layer: l.Index, Kind: k}
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
		x.GQA = kernelspec.GQA{Heads: m.Heads, KVHeads: kvh, HeadDim: m.HeadDim, Window: l.Window, Dtype: kvDtype,
			RoPE: kernelspec.RoPE{Dim: m.HeadDim, Theta: synth.RoPETheta}}
		if err := x.GQA.Validate(); err != nil {
			return nil, fmt.Errorf("layer %d: %w", l.Index, err)
		}
		x.GQA.RoPE = kernelspec.RoPE{} // the model rotates q and k (synth.Ops.RoPE)
	case device.KernelMLA, device.KernelDSA:
		x.DSA.MLA = kernelspec.MLA{Heads: m.Heads, KVLoraRank: m.KVLoraRank, QKNopeHeadDim: m.QKNopeHeadDim, QKRopeHeadDim: m.QKRopeHeadDim,
			VHeadDim: m.VHeadDim, Dtype: kvDtype, RoPE: kernelspec.RoPE{Dim: m.QKRopeHeadDim, Theta: synth.RoPETheta, Interleaved: true}}
		if err := x.DSA.MLA.Validate(); err != nil {
			return nil, fmt.Errorf("layer %d: %w", l.Index, err)
		}
		x.DSA.MLA.RoPE = kernelspec.RoPE{} // the model rotates q_pe and k_pe (synth.Ops.RoPE)
		if k == device.KernelDSA {
			x.DSA.Indexer = kernelspec.Indexer{Heads: m.IndexHeads, HeadDim: m.IndexHeadDim, TopK: m.IndexTopK}
			if m.Checkpoint != "" {
				// transformers' indexer: unquantized keys at the KV dtype
				// (plugins/model.FillBuffers sizes them so).
				x.DSA.Indexer.Plain, x.DSA.Indexer.Keys = true, kvDtype
			}
			if err := x.DSA.Indexer.Validate(); err != nil {
				return nil, fmt.Errorf("layer %d: %w", l.Index, err)
			}
		}
	case device.KernelMamba2:
		x.Mamba = kernelspec.Mamba2{Heads: m.MambaHeads, HeadDim: m.MambaHeadDim, State: m.SSMStateSize, Groups: m.NGroups,
			ConvKernel: m.ConvKernel, ConvDtype: conv, SSMDtype: ssm, Eps: synth.NormEps}
		if err := x.Mamba.Validate(); err != nil {
			return nil, fmt.Errorf("layer %d: %w", l.Index, err)
		}
	case device.KernelGDN:
		// The mapping of plugins/model.parseQwen3Next: value heads, value head
		// dim, key head dim, key heads.
		x.GDN = kernelspec.GDN{Heads: m.MambaHeads, VDim: m.MambaHeadDim, KDim: m.SSMStateSize, KHeads: m.NGroups,
			ConvKernel: m.ConvKernel, ConvDtype: conv, SSMDtype: ssm, Eps: synth.NormEps}
		if err := x.GDN.Validate(); err != nil {
			return nil, fmt.Errorf("layer %d: %w", l.Index, err)
		}
	default:
		return nil, fmt.Errorf("layer %d: mixer %q: kernel %v does not run on the computing devices", l.Index, l.Mixer, k)
	}
	return x, nil
}

// Mixers configures the kernel of every mixer layer of layers, as
// kernelOf (the backend's Kernel method) picks it, and checks each against
// its buffers when check is set.
func Mixers(m *spec.Model, layers []spec.Layer, kernelOf func(spec.Mixer) device.Kernel, kv, conv, ssm kernelspec.Dtype, check bool) (map[int]*Mixer, error) {
	ks := map[int]*Mixer{}
	for _, l := range layers {
		if l.Mixer == spec.MixerNone {
			continue
		}
		x, err := NewMixer(m, l, kernelOf(l.Mixer), kv, conv, ssm)
		if err != nil {
			return nil, err
		}
		if check {
			if err := CheckWidths(x, l); err != nil {
				return nil, err
			}
		}
		ks[l.Index] = x
	}
	return ks, nil
}

// OutWidth is the width of the kernel's output per row.
func (x *Mixer) OutWidth() int {
	switch x.Kind {
	case device.KernelGQA:
		return x.GQA.Heads * x.GQA.HeadDim
	case device.KernelMLA, device.KernelDSA:
		return x.DSA.MLA.Heads * x.DSA.MLA.VHeadDim
	case device.KernelMamba2:
		return x.Mamba.Inner()
	case device.KernelGDN:
		return x.GDN.Inner()
	}
	return 0
}

// kvDtype maps Config.KVDtype ("" is bf16, as plugins/model's "auto").
func KVDtype(name string) (kernelspec.Dtype, error) {
	switch name {
	case "", "auto", "bf16", "bfloat16":
		return kernelspec.BF16, nil
	case "fp8":
		return kernelspec.FP8, nil
	case "float32", "fp32":
		return kernelspec.F32, nil
	}
	return 0, fmt.Errorf("kv dtype %q: the computing devices run bf16, fp8 and float32", name)
}

// StateDtypes reads the Mamba conv and SSM state dtypes off the state
// buffers' widths (the config carries only the KV dtype): 4 bytes per
// element is float32, 2 is bf16 (float16 state runs as bf16).
func StateDtypes(m *spec.Model, layers []spec.Layer) (conv, ssm kernelspec.Dtype, err error) {
	conv, ssm = kernelspec.F32, kernelspec.F32
	probe := kernelspec.Mamba2{Heads: m.MambaHeads, HeadDim: m.MambaHeadDim, State: m.SSMStateSize, Groups: m.NGroups, ConvKernel: m.ConvKernel,
		ConvDtype: kernelspec.F32, SSMDtype: kernelspec.F32}
	pick := func(role spec.Role, bytes int64, elems int) (kernelspec.Dtype, error) {
		switch {
		case elems > 0 && bytes == int64(4*elems):
			return kernelspec.F32, nil
		case elems > 0 && bytes == int64(2*elems):
			return kernelspec.BF16, nil
		}
		return 0, fmt.Errorf("mamba %s state: %d bytes per sequence, want %d (float32) or %d (bf16) for %d elements", role, bytes, 4*elems, 2*elems, elems)
	}
	for _, l := range layers {
		if l.Mixer != spec.MixerMamba {
			continue
		}
		for _, b := range l.Buffers {
			switch b.Role {
			case spec.RoleConvState:
				if conv, err = pick(b.Role, b.BytesPerSeq, probe.ConvBytes()/4); err != nil {
					return 0, 0, fmt.Errorf("layer %d: %w", l.Index, err)
				}
			case spec.RoleSSMState:
				if ssm, err = pick(b.Role, b.BytesPerSeq, probe.SSMBytes()/4); err != nil {
					return 0, 0, fmt.Errorf("layer %d: %w", l.Index, err)
				}
			}
		}
	}
	return conv, ssm, nil
}

// CheckWidths checks layer l's buffers against what its kernels read and
// write: the roles, in order, and the bytes per token or per sequence.
func CheckWidths(x *Mixer, l spec.Layer) error {
	type want struct {
		role  spec.Role
		bytes int // 0: any width (a buffer the kernel does not touch)
		paged bool
	}
	var ws []want
	switch x.Kind {
	case device.KernelGQA:
		ws = []want{{spec.RoleKV, x.GQA.RowBytes(), true}}
	case device.KernelMLA, device.KernelDSA:
		ws = []want{{spec.RoleLatent, x.DSA.MLA.RowBytes(), true}}
		if l.Mixer == spec.MixerDSA {
			w := want{spec.RoleIndexKey, x.DSA.Indexer.RowBytes(), true}
			if x.Kind == device.KernelMLA {
				w.bytes = 0 // dense MLA on a DSA model leaves the indexer keys alone
			}
			ws = append(ws, w)
		}
	case device.KernelMamba2:
		if c := x.Mamba.ConvBytes(); c > 0 {
			ws = append(ws, want{spec.RoleConvState, c, false})
		}
		ws = append(ws, want{spec.RoleSSMState, x.Mamba.SSMBytes(), false})
	case device.KernelGDN:
		if c := x.GDN.ConvBytes(); c > 0 {
			ws = append(ws, want{spec.RoleConvState, c, false})
		}
		ws = append(ws, want{spec.RoleSSMState, x.GDN.SSMBytes(), false})
	}
	if len(l.Buffers) != len(ws) {
		return fmt.Errorf("layer %d (%s): %d cache buffers, the %s kernel uses %d", l.Index, l.Mixer, len(l.Buffers), x.Kind, len(ws))
	}
	for i, w := range ws {
		b := l.Buffers[i]
		got := b.BytesPerSeq
		if w.paged {
			got = b.BytesPerToken
		}
		if b.Role != w.role || (w.bytes > 0 && got != int64(w.bytes)) {
			unit := "sequence"
			if w.paged {
				unit = "token"
			}
			return fmt.Errorf("layer %d (%s) buffer %d: role %s with %d bytes per %s, the %s kernel needs role %s with %d",
				l.Index, l.Mixer, i, b.Role, got, unit, x.Kind, w.role, w.bytes)
		}
	}
	return nil
}

// WithScales returns the layer's DSA (its MLA alone for an MLA call, ix
// nil) with the softmax and index scales the call's inputs set (0 keeps the
// kernel's default). x is not modified.
func (x *Mixer) WithScales(in synth.MLAIn, ix *synth.IndexIn) kernelspec.DSA {
	d := x.DSA
	if in.Scale != 0 {
		d.MLA.Scale = in.Scale
	}
	if ix != nil && ix.Scale != 0 {
		d.Indexer.Scale = ix.Scale
	}
	return d
}

// CheckpointMamba sets the Mamba2 kernels of mix to a checkpoint's numerics
// (hf.Stage.Mamba2Numerics: Nemotron-H's gated-norm epsilon and dt floor),
// which the synthetic model's defaults (synth.NormEps, no floor) do not
// match. The paged device applies the floor to prompt tokens only
// (seqState.promptEnd), as transformers' prefill and decode paths do.
func CheckpointMamba(mix map[int]*Mixer, hs *hf.Stage) {
	eps, dtMin, ok := hs.Mamba2Numerics()
	if !ok {
		return
	}
	for _, x := range mix {
		if x.Kind == device.KernelMamba2 {
			x.Mamba.Eps, x.Mamba.DtMin = eps, dtMin
		}
	}
}

// CheckpointGDN sets the GDN kernels of mix to a Qwen3-Next checkpoint's
// gated-norm epsilon (hf.Stage.GDNNumerics: rms_norm_eps), which the
// synthetic default (synth.NormEps) need not match.
func CheckpointGDN(mix map[int]*Mixer, hs *hf.Stage) {
	eps, ok := hs.GDNNumerics()
	if !ok {
		return
	}
	for _, x := range mix {
		if x.Kind == device.KernelGDN {
			x.GDN.Eps = eps
		}
	}
}
