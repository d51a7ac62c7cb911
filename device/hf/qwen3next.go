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

// archQwen3Next is Qwen3-Next (transformers' Qwen3NextForCausalLM).
const archQwen3Next = "Qwen3NextForCausalLM"

// Qwen3-Next, as transformers 5.17's modeling_qwen3_next computes it on its
// pure-PyTorch path (no flash-linear-attention, no causal_conv1d):
//
//   - Every RMSNorm but the delta-net's gated one is zero-centred
//     (Qwen3NextRMSNorm, Gemma3's): x̂ · (1 + w), the 1 + w taken in
//     float32 once at load, which is what torch computes per call.
//   - Each layer is x += mixer(RMSNorm(x)), then x += mlp(RMSNorm(x)); the
//     mixer is a Gated DeltaNet (layer_types linear_attention; plugins/model
//     maps it onto MixerMamba) or gated full attention (full_attention).
//   - Full attention: q_proj gives, per head, head_dim query then head_dim
//     gate elements; q and k get the per-head zero-centred RMSNorm, then
//     RoPE on the first head_dim·partial_rotary_factor elements of each head
//     (rotate_half layout, frequencies for that rotary width), GQA with
//     scale head_dim^-0.5, the output times sigmoid(gate), then o_proj.
//   - Gated DeltaNet: in_proj_qkvz's rows are, per key head, q (head_k_dim),
//     k (head_k_dim), v and z (value heads per key head × head_v_dim each),
//     and in_proj_ba's, per key head, b then a (value heads per key head
//     each): transformers' fix_query_key_value_ordering. New permutes the
//     weight rows at load into [q of every key head | k | v | z] and
//     [b | a], so each projection is one matmul whose columns are the
//     kernel's inputs (a row permutation of the weight moves dot products,
//     it changes none). The device's GDN kernel (GDNOps.GatedDeltaNet) runs
//     the causal conv1d (no bias) with SiLU, the l2norm of q and k, q's
//     1/sqrt(head_k_dim), g = -exp(A_log)·softplus(a + dt_bias), β =
//     sigmoid(b), the delta rule S = S·exp(g) + k ⊗ β(v - Sᵀk), o = Sᵀq,
//     and the gated norm RMSNorm(o)·w·silu(z) per value head; then
//     out_proj. transformers runs prefill through its chunked algorithm and
//     decode through the recurrence; kvx runs the recurrence token by
//     token on every path (kernelspec.GDN), so its tokens do not depend on
//     chunking, managers or reuse; the two forms differ at ~1e-6 and the
//     goldens were chosen robust to that.
//   - The MLP is sparse MoE on the layers plugins/model marks (num_experts >
//     0, decoder_sparse_step, mlp_only_layers), else a dense SwiGLU MLP of
//     intermediate_size. MoE: softmax router, top num_experts_per_tok,
//     renormalized (norm_topk_prob; the lowest index among equal
//     probabilities), routed experts summed in ascending index, plus the
//     shared expert times sigmoid(shared_expert_gate(x)).
//
// Tensor names are the hub's: model.layers.<i>.linear_attn.* or
// .self_attn.*, .mlp.experts.<e>.*, .mlp.shared_expert.*,
// .mlp.shared_expert_gate.weight; MTP weights (mtp.*) are not read.
type qwen3Next struct {
	layers                      []q3nLayer
	convDim, valueDim, valueHds int
}

type q3nLayer struct {
	inNorm, postNorm synth.Tensor // 1 + w
	gdn              bool         // a Gated DeltaNet layer, else full attention
	qkvz, ba, out    linear       // qkvz and ba with rows permuted (see above)
	gdnW             GDNWeights
	q, k, v, o       linear       // q_proj: query and gate per head
	qNorm, kNorm     synth.Tensor // 1 + w
	dense            *mlp
	router           synth.Tensor
	experts          []mlp
	shared           *mlp
	sharedGate       synth.Tensor // 1 × hidden
}

// GDNIn are a Gated DeltaNet call's inputs, one row per token: QKV (the
// conv channels: q of every key head, then k, then v of every value head),
// Z (the gate, value heads × head_v_dim), B and A (one per value head: β's
// and the decay's pre-activations).
type GDNIn struct{ QKV, Z, B, A synth.Tensor }

// GDNWeights are a Gated DeltaNet layer's own parameters: the depthwise
// conv (conv dim rows of conv_kernel taps), dt_bias, A = -exp(A_log) (one
// per value head) and the gated norm's gains (head_v_dim).
type GDNWeights struct{ ConvW, DtBias, A, NormW synth.Tensor }

// GDNOps are what Qwen3-Next needs of a device beyond Ops: an optional
// interface, found by type assertion when a Qwen3-Next stage runs (Forward
// fails with an error naming the architecture on a device without it). The
// cpu device implements it; the cuda device refuses the architecture at
// Open. Both methods keep synth.Ops' contracts.
type GDNOps interface {
	Ops
	// SigmoidMul sets x *= sigmoid(gate) element-wise; gate has x's shape,
	// or one column (one gate per row). Row-wise.
	SigmoidMul(x, gate synth.Tensor)
	// GatedDeltaNet is layer's GDN kernel on the layer's conv and recurrent
	// state, causal like the other mixer kernels: one row of value heads ×
	// head_v_dim per input row.
	GatedDeltaNet(ctx context.Context, layer int, segs []synth.Seg, in GDNIn, w GDNWeights) (synth.Tensor, error)
}

// GDNNumerics returns, for a Qwen3-Next stage, the GDN kernel's numerics
// that come from the checkpoint: the gated norm's epsilon (rms_norm_eps).
// ok is false for other architectures.
func (s *Stage) GDNNumerics() (eps float32, ok bool) {
	if s.q3n == nil {
		return 0, false
	}
	return s.cfg.Eps, true
}

// newQwen3Next is New for Qwen3-Next (cfg read, m's architecture checked,
// no MTP layers).
func newQwen3Next(m spec.Model, dir string, first, last int, cfg model.Numerics, ops synth.Loader) (*Stage, error) {
	rc := cfg.Extra
	if rc.NormTopK != nil && !*rc.NormTopK && m.Experts > 0 {
		return nil, fmt.Errorf("hf: %s: config.json: norm_topk_prob false: the %s router renormalizes the top-k weights (true)", dir, m.Arch)
	}
	n := len(m.Layers)
	h, v := m.Hidden, m.Vocab
	heads, kvh, d := m.Heads, m.KVHeads, m.HeadDim
	if kvh == 0 {
		kvh = heads
	}
	nk, dk, nv, dv, K := m.NGroups, m.SSMStateSize, m.MambaHeads, m.MambaHeadDim, m.ConvKernel
	for _, l := range m.Layers {
		ok := (l.Mixer == spec.MixerMamba || l.Mixer == spec.MixerGQA) && (l.FFN == spec.FFNDense || l.FFN == spec.FFNMoE)
		if !ok || l.MTP {
			return nil, fmt.Errorf("hf: model %q layer %d: mixer %q, ffn %q (mtp %v); the %s code runs Gated DeltaNet or attention with a dense or MoE MLP",
				m.Name, l.Index, l.Mixer, l.FFN, l.MTP, m.Arch)
		}
		switch {
		case l.Mixer == spec.MixerMamba && (nk <= 0 || dk <= 0 || nv <= 0 || dv <= 0 || K <= 0 || nv%nk != 0):
			return nil, fmt.Errorf("hf: model %q: linear key heads %d, key dim %d, value heads %d, value dim %d, conv kernel %d: want all > 0, key heads dividing value heads",
				m.Name, nk, dk, nv, dv, K)
		case l.Mixer == spec.MixerGQA && (heads <= 0 || d <= 0 || heads%kvh != 0):
			return nil, fmt.Errorf("hf: model %q: heads %d, kv heads %d, head dim %d: want all > 0, kv heads dividing heads", m.Name, heads, kvh, d)
		case l.FFN == spec.FFNDense && m.Intermediate <= 0:
			return nil, fmt.Errorf("hf: model %q: intermediate_size %d must be > 0", m.Name, m.Intermediate)
		case l.FFN == spec.FFNMoE && (m.MoEIntermediate <= 0 || m.ExpertsPerToken <= 0):
			return nil, fmt.Errorf("hf: model %q: moe_intermediate_size %d, num_experts_per_tok %d: want both > 0", m.Name, m.MoEIntermediate, m.ExpertsPerToken)
		}
	}
	if h <= 0 || v <= 0 {
		return nil, fmt.Errorf("hf: model %q: hidden %d, vocab %d: want both > 0", m.Name, h, v)
	}
	partial := cfg.Rope.PartialRotary
	if partial == 0 {
		partial = 1
	}
	rotary := int(float64(d) * partial) // transformers: int(head_dim * partial_rotary_factor)
	if rotary <= 0 || rotary%2 != 0 {
		return nil, fmt.Errorf("hf: model %q: head_dim %d × partial_rotary_factor %v = %d rotary dims: want an even number > 0", m.Name, d, partial, rotary)
	}
	kd, vd := nk*dk, nv*dv
	cd := 2*kd + vd
	t, err := openManifest(dir, ops, cfg.Quant)
	if err != nil {
		return nil, err
	}
	defer t.close()

	t.ends("model.embed_tokens.weight", "model.norm.weight", v, h, cfg.Tied)
	for i, l := range m.Layers {
		p := LayerPrefix(i)
		t.need(p+"input_layernorm.weight", h)
		t.need(p+"post_attention_layernorm.weight", h)
		if l.Mixer == spec.MixerMamba {
			a := p + "linear_attn."
			t.linear(a+"in_proj_qkvz", 2*kd+2*vd, h, false)
			t.linear(a+"in_proj_ba", 2*nv, h, false)
			t.need(a+"conv1d.weight", cd, 1, K)
			t.need(a+"dt_bias", nv)
			t.need(a+"A_log", nv)
			t.need(a+"norm.weight", dv)
			t.linear(a+"out_proj", h, vd, false)
		} else {
			a := p + "self_attn."
			t.linear(a+"q_proj", 2*heads*d, h, cfg.AttnBias)
			t.linear(a+"k_proj", kvh*d, h, cfg.AttnBias)
			t.linear(a+"v_proj", kvh*d, h, cfg.AttnBias)
			t.linear(a+"o_proj", h, heads*d, cfg.AttnBias)
			t.need(a+"q_norm.weight", d)
			t.need(a+"k_norm.weight", d)
		}
		f := p + "mlp."
		if l.FFN == spec.FFNDense {
			t.linear(f+"gate_proj", m.Intermediate, h, false)
			t.linear(f+"up_proj", m.Intermediate, h, false)
			t.linear(f+"down_proj", h, m.Intermediate, false)
			continue
		}
		t.need(f+"gate.weight", m.Experts, h)
		for e := range m.Experts {
			x := f + "experts." + strconv.Itoa(e) + "."
			t.linear(x+"gate_proj", m.MoEIntermediate, h, false)
			t.linear(x+"up_proj", m.MoEIntermediate, h, false)
			t.linear(x+"down_proj", h, m.MoEIntermediate, false)
		}
		if m.SharedIntermediate > 0 {
			t.linear(f+"shared_expert.gate_proj", m.SharedIntermediate, h, false)
			t.linear(f+"shared_expert.up_proj", m.SharedIntermediate, h, false)
			t.linear(f+"shared_expert.down_proj", h, m.SharedIntermediate, false)
			t.need(f+"shared_expert_gate.weight", 1, h)
		}
	}
	if err := t.check(m.Arch, n); err != nil {
		return nil, err
	}

	host, load, lin := t.host, t.load, t.lin
	// onePlus loads a zero-centred norm's gains as 1 + w.
	onePlus := func(name string) synth.Tensor {
		w := host(name)
		if w == nil {
			return nil
		}
		for i := range w {
			w[i] = 1 + w[i]
		}
		return ops.Weight(w, 1, len(w))
	}
	mk := func(name string) *mlp {
		return &mlp{gate: lin(name + "gate_proj"), up: lin(name + "up_proj"), down: lin(name + "down_proj")}
	}
	s := &Stage{m: m, cfg: cfg, first: first, last: last}
	q3 := &qwen3Next{convDim: cd, valueDim: vd, valueHds: nv}
	s.q3n = q3
	inv, scale := cfg.Rope.InvFreq(rotary, m.MaxPosition)
	s.rope = synth.RoPE{Dim: rotary, Theta: cfg.Rope.Theta, InvFreq: inv}
	if scale != 1 {
		s.rope.Scale = scale
	}
	t.loadEndsWith(s, "model.embed_tokens.weight", "model.norm.weight", onePlus)
	r := nv / max(nk, 1) // value heads per key head
	for i := first; i < last; i++ {
		l := m.Layers[i]
		p := LayerPrefix(i)
		lw := q3nLayer{inNorm: onePlus(p + "input_layernorm.weight"), postNorm: onePlus(p + "post_attention_layernorm.weight"),
			gdn: l.Mixer == spec.MixerMamba}
		if lw.gdn {
			a := p + "linear_attn."
			if w := host(a + "in_proj_qkvz.weight"); w != nil {
				per := 2*dk + 2*r*dv // rows per key head
				parts := [4][]float32{}
				for g := range nk {
					base := g * per * h
					cut := []int{0, dk, 2 * dk, 2*dk + r*dv, per}
					for j := range 4 {
						parts[j] = append(parts[j], w[base+cut[j]*h:base+cut[j+1]*h]...)
					}
				}
				perm := append(append(append(parts[0], parts[1]...), parts[2]...), parts[3]...)
				lw.qkvz = linear{w: ops.Weight(perm, 2*kd+2*vd, h)}
			}
			if w := host(a + "in_proj_ba.weight"); w != nil {
				var bs, as []float32
				for g := range nk {
					base := g * 2 * r * h
					bs = append(bs, w[base:base+r*h]...)
					as = append(as, w[base+r*h:base+2*r*h]...)
				}
				lw.ba = linear{w: ops.Weight(append(bs, as...), 2*nv, h)}
			}
			aLog := host(a + "A_log")
			A := make([]float32, len(aLog))
			for j, x := range aLog {
				A[j] = -float32(math.Exp(float64(x))) // -A_log.float().exp()
			}
			lw.gdnW = GDNWeights{
				ConvW:  ops.Weight(host(a+"conv1d.weight"), cd, K),
				DtBias: load(a + "dt_bias"),
				A:      ops.Weight(A, 1, nv),
				NormW:  load(a + "norm.weight"),
			}
			lw.out = lin(a + "out_proj")
		} else {
			a := p + "self_attn."
			lw.q, lw.k, lw.v, lw.o = lin(a+"q_proj"), lin(a+"k_proj"), lin(a+"v_proj"), lin(a+"o_proj")
			lw.qNorm, lw.kNorm = onePlus(a+"q_norm.weight"), onePlus(a+"k_norm.weight")
		}
		f := p + "mlp."
		if l.FFN == spec.FFNDense {
			lw.dense = mk(f)
		} else {
			lw.router = load(f + "gate.weight")
			for e := range m.Experts {
				lw.experts = append(lw.experts, *mk(f + "experts." + strconv.Itoa(e) + "."))
			}
			if m.SharedIntermediate > 0 {
				lw.shared, lw.sharedGate = mk(f+"shared_expert."), load(f+"shared_expert_gate.weight")
			}
		}
		q3.layers = append(q3.layers, lw)
	}
	if err := t.err(); err != nil {
		return nil, err
	}
	return s, nil
}

// layer runs Qwen3-Next decoder layer i on x in place, as transformers'
// Qwen3NextDecoderLayer does.
func (q3 *qwen3Next) layer(ctx context.Context, o Ops, s *Stage, i int, segs []synth.Seg, x synth.Tensor) error {
	ops, ok := o.(GDNOps)
	if !ok {
		return fmt.Errorf("hf: model %q (%s): the device's ops (%T) do not run Gated DeltaNet", s.m.Name, s.m.Arch, o)
	}
	lw := &q3.layers[i-s.first]
	eps := s.cfg.Eps
	in := ops.RMSNorm(x, lw.inNorm, eps)
	var mixed synth.Tensor // the mixer's output, x's residual addend
	if lw.gdn {
		p := ops.Split(lw.qkvz.apply(ops, in), 1, q3.convDim, q3.valueDim)
		ba := ops.Split(lw.ba.apply(ops, in), 1, q3.valueHds, q3.valueHds)
		core, err := ops.GatedDeltaNet(ctx, i, segs, GDNIn{QKV: p[0], Z: p[1], B: ba[0], A: ba[1]}, lw.gdnW)
		if err != nil {
			return err
		}
		mixed = lw.out.apply(ops, core)
	} else {
		d := s.m.HeadDim
		qg := ops.Split(lw.q.apply(ops, in), s.m.Heads, d, d)
		q := ops.RMSNormGroups(qg[0], lw.qNorm, eps)
		k := ops.RMSNormGroups(lw.k.apply(ops, in), lw.kNorm, eps)
		core, err := ropeGQA(ctx, ops, i, segs, q, k, lw.v.apply(ops, in), d, s.rope)
		if err != nil {
			return err
		}
		ops.SigmoidMul(core, qg[1])
		mixed = lw.o.apply(ops, core)
	}
	post := addNorm(ops, x, mixed, lw.postNorm, eps)
	if lw.dense != nil {
		ops.Add(x, lw.dense.apply(ops, post))
		return nil
	}
	r := ops.Route(ops.MatMul(post, lw.router), s.m.ExpertsPerToken)
	acc := ops.Zeros(x.Rows(), x.Cols())
	for e := range lw.experts {
		xe := ops.Gather(post, r, e)
		if xe == nil {
			continue
		}
		ops.AddRouted(acc, lw.experts[e].apply(ops, xe), r, e)
	}
	if lw.shared != nil {
		sh := lw.shared.apply(ops, post)
		ops.SigmoidMul(sh, ops.MatMul(post, lw.sharedGate))
		ops.Add(acc, sh)
	}
	ops.Add(x, acc)
	return nil
}
