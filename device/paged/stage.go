package paged

import (
	"context"
	"fmt"

	"github.com/kvx-dev/kvx/device"
	"github.com/kvx-dev/kvx/device/hf"
	"github.com/kvx-dev/kvx/device/synth"
	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
	"github.com/kvx-dev/kvx/plugins/v1/spec"
)

// ArchGDN is Qwen3-Next, whose Gated DeltaNet layers plugins/model maps onto
// the Mamba mixer for sizing; their kernel is KernelGDN (NewMixer), which
// only a checkpoint's model code (package hf) calls: the synthetic model
// has no GDN layer.
const ArchGDN = "Qwen3NextForCausalLM"

// Stage is what a computing device knows of its stage before its first
// Forward, the same on every device: the kernels of its mixer layers, where
// their buffers live, its model (synthetic or a checkpoint, its weights on
// the device that loaded them) and its place in the pipeline.
type Stage struct {
	Mix    map[int]*Mixer     // mixer layers by layer index
	Place  map[int]*Placement // by layer index
	Mambas []int              // the state-space layers (Mamba2, GDN), ascending
	// Pools is the config's layout, Layers included (the runtime's
	// device.Stage.Pools drop them), each with its Layers cloned.
	Pools       []kvcache.Pool
	First, Last bool // stage 0 (embeds tokens); the last stage (samples)
	// Model is the stage's forward over a device's ops: the synthetic
	// model's (synth.Stage) or a checkpoint's (hf.Stage).
	Model func(ctx context.Context, ops hf.Ops, st synth.Step) (synth.Result, error)
	HF    *hf.Stage // the checkpoint's stage; nil for the synthetic model
}

// NewStage checks stage s for a computing device named dev and loads its
// model's weights through load. It fails, naming the field, the value and
// the limit, on tensor parallelism > 1, a synthetic GDN model (Qwen3-Next
// without a checkpoint: the synthetic model has no GDN layer), a KV
// dtype other than bf16, fp8 or float32, more draft tokens than the model's
// MTP layers, buffer widths the kernels do not produce, a pool whose
// BlockBytes differs from the in-block layout (see the package doc), or a
// checkpoint that does not load (hf.New's errors).
func NewStage(dev string, s device.Stage, load synth.Loader) (*Stage, error) {
	cfg := s.Config
	m := &cfg.Model
	if cfg.TensorParallel > 1 {
		return nil, fmt.Errorf("tensor_parallel %d: the %s device runs one rank (limit 1)", cfg.TensorParallel, dev)
	}
	if m.Arch == ArchGDN && m.Checkpoint == "" {
		for _, l := range s.Layers {
			if l.Mixer == spec.MixerMamba {
				return nil, fmt.Errorf("model %q arch %s: layer %d is Gated DeltaNet, which the synthetic model does not have; the %s device runs it from a checkpoint directory (model: DIR)",
					m.Name, m.Arch, l.Index, dev)
			}
		}
	}
	kv, err := KVDtype(cfg.KVDtype)
	if err != nil {
		return nil, err
	}
	st := &Stage{First: cfg.First == 0, Last: cfg.Stage == cfg.Stages-1}
	if st.Last && cfg.DraftTokens > m.NumNextN {
		return nil, fmt.Errorf("draft tokens %d exceed the %d MTP layers of model %q (one per draft depth)", cfg.DraftTokens, m.NumNextN, m.Name)
	}
	conv, ssm, err := StateDtypes(m, s.Layers)
	if err != nil {
		return nil, err
	}
	if st.Mix, err = Mixers(m, s.Layers, s.Backend.Kernel, kv, conv, ssm, true); err != nil {
		return nil, err
	}
	for _, l := range s.Layers {
		if x := st.Mix[l.Index]; x != nil && (x.Kind == device.KernelMamba2 || x.Kind == device.KernelGDN) {
			st.Mambas = append(st.Mambas, l.Index)
		}
	}
	for _, p := range cfg.Layout.Pools {
		p.Layers = append([]int(nil), p.Layers...)
		st.Pools = append(st.Pools, p)
	}
	if st.Place, err = Place(s.Layers, st.Pools); err != nil {
		return nil, err
	}
	if m.Checkpoint != "" {
		hs, err := hf.New(*m, m.Checkpoint, cfg.First, cfg.Last, load)
		if err != nil {
			return nil, err
		}
		CheckpointMamba(st.Mix, hs)
		CheckpointGDN(st.Mix, hs)
		st.HF = hs
		st.Model = hs.Forward
		return st, nil
	}
	ss, err := synth.New(*m, cfg.Seed, cfg.First, cfg.Last, s.Backend.Kernel, load)
	if err != nil {
		return nil, err
	}
	st.Model = func(ctx context.Context, ops hf.Ops, step synth.Step) (synth.Result, error) {
		return ss.Forward(ctx, ops, step)
	}
	return st, nil
}
