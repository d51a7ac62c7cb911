package hf

import (
	"context"
	"fmt"
	"math"
	"strconv"

	"github.com/kvx-dev/kvx/device/synth"
	"github.com/kvx-dev/kvx/plugins/model"
	"github.com/kvx-dev/kvx/plugins/v1/spec"
)

// archNemotronH is Nemotron-H (transformers' NemotronHForCausalLM).
const archNemotronH = "NemotronHForCausalLM"

// Nemotron-H, as transformers 5.17's modeling_nemotron_h computes it on its
// pure-PyTorch path (no mamba_ssm):
//
//   - Every layer is one block, x += mixer(RMSNorm(x)): a Mamba2 mixer
//     (layers_block_type linear_attention, pattern M), attention (full_attention,
//     *) or an MLP (mlp, -); plugins/model reads hybrid_override_pattern or
//     layers_block_type into spec.Layers (MoE blocks are refused here).
//   - Attention is GQA without RoPE (the checkpoint has no position
//     embedding at all) and without biases (transformers builds q, k, v, o
//     with bias=False whatever attention_bias says).
//   - The MLP is down(relu(up(x))²), biases when mlp_bias.
//   - Mamba2: in_proj splits into the gate z (d_inner), xBC (d_inner +
//     2·n_groups·ssm_state) and dt (heads); the device's Mamba2 kernel runs
//     the causal depthwise conv1d with its bias, silu, dt = softplus(dt +
//     dt_bias), A = -exp(A_log), the recurrence with the D skip, then the
//     gated norm: y·silu(z) first, RMS over each of n_groups groups of
//     d_inner/n_groups, epsilon layer_norm_epsilon, times norm.weight; then
//     out_proj.
//   - dt floor: transformers' chunked scan (the prefill of a prompt) clamps
//     dt to [time_step_min, inf) (the mixer hardcodes that range and ignores
//     time_step_limit), while its single-token decode step does not clamp.
//     The goldens' dt_bias lies in [-6.9, -2.3] so softplus often falls
//     below 0.001 and the clamp matters: with the floor on every token, or
//     on none, the goldens' greedy tokens still all match but logprobs move
//     by up to 1.1e-2 and 9.9e-3 (against 7e-6 with the asymmetry), beyond
//     the 1e-3 tolerance. So kvx reproduces the asymmetry: the stage
//     reports the floor (Mamba2Numerics) and the device applies it to
//     prompt tokens only (the tokens before the sequence's first sampled
//     one), however the prompt is chunked or reused. Two paths transformers
//     does not have see a different split: a snapshot reused across
//     sequences carries whatever floor its writer applied (the goldens'
//     shared prefixes are prompt tokens on both sides), and a preempted
//     sequence, released and recomputed from position 0, floors its
//     generated tokens too (as transformers would, given them as a prompt).
//
// Tensor names are the hub's: backbone.embeddings, backbone.layers.<i>.norm
// and .mixer.*, backbone.norm_f, lm_head (or "model." for "backbone.").
type nemotron struct {
	layers                []nemoLayer
	inner, convDim, heads int
	dtMin                 float32
}

type nemoLayer struct {
	norm     synth.Tensor
	mixer    spec.Mixer // MixerMamba, MixerGQA, or MixerNone (an MLP block)
	inProj   linear
	outProj  linear
	mamba    synth.Mamba2Weights
	q, k, v  linear
	o        linear
	up, down linear
}

// Mamba2Numerics returns, for a Nemotron-H stage, the Mamba2 kernel's
// numerics that come from the checkpoint: the gated norm's epsilon
// (layer_norm_epsilon) and the dt floor for prompt tokens (time_step_min;
// see the Nemotron-H notes in nemotron.go). ok is false for other
// architectures.
func (s *Stage) Mamba2Numerics() (eps, dtMin float32, ok bool) {
	if s.nemo == nil {
		return 0, 0, false
	}
	return s.cfg.Eps, s.nemo.dtMin, true
}

// newNemotron is New for Nemotron-H.
func newNemotron(m spec.Model, dir string, first, last int, cfg model.Numerics, ops synth.Loader) (*Stage, error) {
	nc := cfg.Extra
	if nc.MLPAct != nil && *nc.MLPAct != "relu2" {
		return nil, fmt.Errorf("hf: %s: config.json: mlp_hidden_act %q: the %s MLP runs relu2", dir, *nc.MLPAct, m.Arch)
	}
	if nc.MambaAct != nil && *nc.MambaAct != "silu" {
		return nil, fmt.Errorf("hf: %s: config.json: mamba_hidden_act %q: the %s mixer runs silu", dir, *nc.MambaAct, m.Arch)
	}
	convBias := nc.ConvBias == nil || *nc.ConvBias
	dtMin := 0.001
	if nc.TimeStepMin != nil {
		dtMin = *nc.TimeStepMin
	}
	if !(dtMin >= 0) || math.IsInf(dtMin, 0) {
		return nil, fmt.Errorf("hf: %s: config.json: time_step_min %v must be finite and >= 0", dir, dtMin)
	}

	n := len(m.Layers)
	h, v := m.Hidden, m.Vocab
	heads, kvh, d := m.Heads, m.KVHeads, m.HeadDim
	if kvh == 0 {
		kvh = heads
	}
	mh, mp, ng, ns, K := m.MambaHeads, m.MambaHeadDim, m.NGroups, m.SSMStateSize, m.ConvKernel
	di := mh * mp
	cd := di + 2*ng*ns
	for _, l := range m.Layers {
		switch {
		case l.MTP:
			return nil, fmt.Errorf("hf: model %q layer %d: an MTP layer; the %s code has no MTP head (limit 0)", m.Name, l.Index, m.Arch)
		case l.Mixer == spec.MixerMamba && l.FFN == spec.FFNNone:
			if mh <= 0 || mp <= 0 || ng <= 0 || ns <= 0 || K <= 0 || mh%ng != 0 {
				return nil, fmt.Errorf("hf: model %q: mamba heads %d, head dim %d, groups %d, state %d, conv kernel %d: want all > 0, groups dividing heads",
					m.Name, mh, mp, ng, ns, K)
			}
		case l.Mixer == spec.MixerGQA && l.FFN == spec.FFNNone:
			if heads <= 0 || d <= 0 || heads%kvh != 0 {
				return nil, fmt.Errorf("hf: model %q: heads %d, kv heads %d, head dim %d: want all > 0, kv heads dividing heads", m.Name, heads, kvh, d)
			}
		case l.Mixer == spec.MixerNone && l.FFN == spec.FFNDense:
			if m.Intermediate <= 0 {
				return nil, fmt.Errorf("hf: model %q: intermediate_size %d must be > 0", m.Name, m.Intermediate)
			}
		default:
			return nil, fmt.Errorf("hf: model %q layer %d: mixer %q, ffn %q; the %s code runs Mamba2, attention and MLP blocks (not MoE)",
				m.Name, l.Index, l.Mixer, l.FFN, m.Arch)
		}
	}
	if h <= 0 || v <= 0 {
		return nil, fmt.Errorf("hf: model %q: hidden %d, vocab %d: want both > 0", m.Name, h, v)
	}
	t, err := openManifest(dir, ops, cfg.Quant)
	if err != nil {
		return nil, err
	}
	defer t.close()
	root := "backbone."
	if !t.ck.Has(root+"embeddings.weight") && t.ck.Has("model.embeddings.weight") {
		root = "model."
	}
	pre := func(i int) string { return root + "layers." + strconv.Itoa(i) + "." }

	t.ends(root+"embeddings.weight", root+"norm_f.weight", v, h, cfg.Tied)
	for i, l := range m.Layers {
		p := pre(i) + "mixer."
		t.need(pre(i)+"norm.weight", h)
		switch {
		case l.Mixer == spec.MixerMamba:
			t.linear(p+"in_proj", di+cd+mh, h, nc.UseBias)
			t.linear(p+"out_proj", h, di, nc.UseBias)
			t.need(p+"conv1d.weight", cd, 1, K)
			if convBias {
				t.need(p+"conv1d.bias", cd)
			}
			for _, name := range []string{"dt_bias", "A_log", "D"} {
				t.need(p+name, mh)
			}
			t.need(p+"norm.weight", di)
		case l.Mixer == spec.MixerGQA:
			t.linear(p+"q_proj", heads*d, h, false)
			t.linear(p+"k_proj", kvh*d, h, false)
			t.linear(p+"v_proj", kvh*d, h, false)
			t.linear(p+"o_proj", h, heads*d, false)
		default:
			t.linear(p+"up_proj", m.Intermediate, h, cfg.MLPBias)
			t.linear(p+"down_proj", h, m.Intermediate, cfg.MLPBias)
		}
	}
	if err := t.check(m.Arch, n); err != nil {
		return nil, err
	}

	host, load, ln := t.host, t.load, t.lin
	s := &Stage{m: m, cfg: cfg, first: first, last: last}
	nm := &nemotron{inner: di, convDim: cd, heads: mh, dtMin: float32(dtMin)}
	s.nemo = nm
	t.loadEnds(s, root+"embeddings.weight", root+"norm_f.weight")
	for i := first; i < last; i++ {
		l := m.Layers[i]
		p := pre(i) + "mixer."
		lw := nemoLayer{norm: load(pre(i) + "norm.weight"), mixer: l.Mixer}
		switch l.Mixer {
		case spec.MixerMamba:
			lw.inProj, lw.outProj = ln(p+"in_proj"), ln(p+"out_proj")
			convB := host(p + "conv1d.bias")
			if convB == nil {
				convB = make([]float32, cd) // use_conv_bias false
			}
			aLog := host(p + "A_log")
			a := make([]float32, len(aLog))
			for j, x := range aLog {
				a[j] = -float32(math.Exp(float64(x))) // A = -exp(A_log), in float32 as torch rounds it
			}
			lw.mamba = synth.Mamba2Weights{
				ConvW:  ops.Weight(host(p+"conv1d.weight"), cd, K),
				ConvB:  ops.Weight(convB, 1, cd),
				DtBias: load(p + "dt_bias"),
				A:      ops.Weight(a, 1, mh),
				D:      load(p + "D"),
				NormW:  load(p + "norm.weight"),
			}
		case spec.MixerGQA:
			lw.q, lw.k, lw.v, lw.o = ln(p+"q_proj"), ln(p+"k_proj"), ln(p+"v_proj"), ln(p+"o_proj")
		default:
			lw.up, lw.down = ln(p+"up_proj"), ln(p+"down_proj")
		}
		nm.layers = append(nm.layers, lw)
	}
	if err := t.err(); err != nil {
		return nil, err
	}
	return s, nil
}

// layer runs Nemotron-H block i on x in place, as transformers'
// NemotronHBlock does: x += mixer(RMSNorm(x)).
func (nm *nemotron) layer(ctx context.Context, ops Ops, s *Stage, i int, segs []synth.Seg, x synth.Tensor) error {
	lw := &nm.layers[i-s.first]
	in := ops.RMSNorm(x, lw.norm, s.cfg.Eps)
	switch lw.mixer {
	case spec.MixerMamba:
		p := ops.Split(lw.inProj.apply(ops, in), 1, nm.inner, nm.convDim, nm.heads)
		core, err := ops.Mamba2(ctx, i, segs, synth.Mamba2In{Z: p[0], XBC: p[1], DT: p[2]}, lw.mamba)
		if err != nil {
			return err
		}
		ops.Add(x, lw.outProj.apply(ops, core))
	case spec.MixerGQA:
		qkv := applyAll(ops, in, lw.q, lw.k, lw.v)
		core, err := ops.GQA(ctx, i, segs, qkv[0], qkv[1], qkv[2])
		if err != nil {
			return err
		}
		ops.Add(x, lw.o.apply(ops, core))
	default:
		ops.Add(x, lw.down.apply(ops, ops.ReLU2(lw.up.apply(ops, in))))
	}
	return nil
}
