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

// The DeepSeek families (DeepseekV3ForCausalLM, DeepseekV32ForCausalLM),
// as transformers 5.17's deepseek_v3 and deepseek_v32 compute them:
//
//   - Attention is MLA in absorbed form: q = q_b(RMSNorm(q_a(x))) (or
//     q_proj(x) without q_lora_rank) split per head into nope and rope
//     parts; kv_a_proj_with_mqa(x) split into the latent (RMSNorm'd:
//     kv_a_layernorm) and the shared rope key; kv_b_proj's rows split per
//     head into w_uk (the first qk_nope_head_dim) and w_uv (the next
//     v_head_dim), which the MLA kernel absorbs. RoPE is interleaved
//     (rope_interleave, always for V3.2): pairs (x[2i], x[2i+1]), which
//     gives the dot products of transformers' de-interleaving rotation. The
//     softmax scale is qk_head_dim^-0.5 · yarn_mscale(factor,
//     mscale_all_dim)² for a yarn rope with mscale_all_dim set.
//   - V3.2's lightning indexer: q = wq_b(q_resid) with q_resid the normed
//     q_a output above, k = LayerNorm(wk(x)) (weight and bias, eps 1e-6),
//     one key per token; RoPE on the first qk_rope_head_dim elements of
//     every index head, NOT interleaved (rotate_half), with the model's
//     frequencies; score(s, t) = Σ_h (weights_proj(x)_h · H^-0.5) ·
//     ReLU(q_h·k_t · D^-0.5) in float32 over the causal keys, the best
//     min(index_topk, t+1) kept and every other key masked out of the
//     attention. Keys are cached unquantized at the KV dtype
//     (kernelspec.Indexer.Plain). Ties in the index score break to the lower
//     position, ties in the router to the lower expert index (torch.topk
//     leaves both unspecified; the goldens keep prompts free of them).
//   - The MLP is dense for the first first_k_dense_replace layers
//     (plugins/model put FFN in spec.Layer); else MoE: router logits
//     gate(x) in float32, sigmoid scores, e_score_correction_bias added to
//     choose, top topk_group of n_group groups (group score: the sum of its
//     best two), top num_experts_per_tok experts inside them, weights from
//     the uncorrected scores normalized (sum + 1e-20, norm_topk_prob) and
//     times routed_scaling_factor; routed experts summed in ascending index,
//     then the shared experts (one MLP of moe_intermediate_size ×
//     n_shared_experts) added. Experts are stored one by one
//     (mlp.experts.N.{gate,up,down}_proj.weight).
//
// MTP layers (num_nextn_predict_layers) run on the last stage and propose
// drafts (mtp.go); plugins/model drops them when the checkpoint holds no
// weights for them (transformers' save_pretrained does not save them).

// DeepSeekOps are the ops the DeepSeek families need beyond synth.Ops,
// with synth.Ops' row-wise contract (each output row from its own input
// row and the weights alone).
type DeepSeekOps interface {
	// LayerNorm returns every row of x normalized to zero mean and unit
	// (biased) variance, epsilon eps, times the gains w plus the biases b
	// (both 1 × Cols; b may be nil): torch.nn.LayerNorm.
	LayerNorm(x, w, b synth.Tensor, eps float32) synth.Tensor
	// RouteGrouped picks every row's experts from its router logits as
	// DeepSeek-V3's router does (see GroupedRoute), bias (1 × experts, or
	// nil) being e_score_correction_bias.
	RouteGrouped(logits, bias synth.Tensor, g GroupedRoute) synth.Routing
}

// GroupedRoute is DeepSeek-V3's expert choice: K experts among the best
// TopKGroup of Groups groups by sigmoid score plus correction bias, their
// weights the uncorrected scores, normalized when Norm, times Scale.
type GroupedRoute struct {
	K, Groups, TopKGroup int
	Norm                 bool
	Scale                float32
}

// DeepSeekConfig is what the DeepSeek code reads from config.json beyond
// Config and spec.Model.
type DeepSeekConfig struct {
	NGroup, TopKGroup  int
	NormTopK           bool
	RoutedScale        float64 // routed_scaling_factor
	Interleave         bool    // rope_interleave (V3; always for V3.2)
	IndexLayerNormEps  float32 // the indexer's k_norm (1e-6)
	AttentionScale     float64 // the MLA softmax scale
	IndexHeadScale     float64 // index_n_heads^-0.5
	IndexScoreScale    float64 // index_head_dim^-0.5
	SharedIntermediate int     // moe_intermediate_size × n_shared_experts
	QLora              bool
	Sparse             bool // V3.2
	RoPEDim            int  // qk_rope_head_dim
}

func isDeepSeek(arch string) bool {
	return arch == "DeepseekV3ForCausalLM" || arch == "DeepseekV32ForCausalLM"
}

// readDeepSeek checks and derives the DeepSeek numerics of model m from
// the fields of its config.json (cfg.Extra).
func readDeepSeek(cfg model.Numerics, m spec.Model) (DeepSeekConfig, error) {
	r := cfg.Extra
	d := DeepSeekConfig{NGroup: 1, TopKGroup: 1, NormTopK: true, RoutedScale: 1, Interleave: true, IndexLayerNormEps: 1e-6,
		QLora: m.QLoraRank > 0, Sparse: cfg.Arch == "DeepseekV32ForCausalLM", RoPEDim: m.QKRopeHeadDim}
	if r.NGroup != nil {
		d.NGroup = *r.NGroup
	}
	if r.TopKGroup != nil {
		d.TopKGroup = *r.TopKGroup
	}
	if r.NormTopK != nil {
		d.NormTopK = *r.NormTopK
	}
	if r.RoutedScale != nil {
		d.RoutedScale = *r.RoutedScale
	}
	if r.RopeInterleave != nil && !d.Sparse {
		d.Interleave = *r.RopeInterleave
	}
	if r.ScoringFunc != "" && r.ScoringFunc != "sigmoid" {
		return d, fmt.Errorf("config.json: scoring_func %q: the %s router runs sigmoid", r.ScoringFunc, cfg.Arch)
	}
	if r.TopKMethod != "" && r.TopKMethod != "noaux_tc" {
		return d, fmt.Errorf("config.json: topk_method %q: the %s router runs noaux_tc", r.TopKMethod, cfg.Arch)
	}
	if m.Experts > 0 && (d.NGroup <= 0 || m.Experts%d.NGroup != 0 || m.Experts/d.NGroup < 2 || d.TopKGroup <= 0 || d.TopKGroup > d.NGroup) {
		return d, fmt.Errorf("config.json: n_group %d, topk_group %d for %d experts: want groups of >= 2 experts dividing them, 1 <= topk_group <= n_group",
			d.NGroup, d.TopKGroup, m.Experts)
	}
	qk := m.QKNopeHeadDim + m.QKRopeHeadDim
	scale := math.Pow(float64(qk), -0.5)
	if ro := cfg.Rope; ro.Type != "default" && ro.MscaleAllDim != 0 && ro.Factor > 1 {
		ms := 0.1*ro.MscaleAllDim*math.Log(ro.Factor) + 1
		scale *= ms * ms
	}
	d.AttentionScale = scale
	d.SharedIntermediate = m.SharedIntermediate
	if d.SharedIntermediate == 0 {
		d.SharedIntermediate = m.MoEIntermediate * m.SharedExperts
	}
	if d.Sparse {
		d.IndexHeadScale = math.Pow(float64(m.IndexHeads), -0.5)
		d.IndexScoreScale = math.Pow(float64(m.IndexHeadDim), -0.5)
	}
	return d, nil
}

type mlp struct{ gate, up, down linear }

func (f mlp) apply(ops Ops, x synth.Tensor) synth.Tensor {
	gu := applyAll(ops, x, f.gate, f.up)
	return f.down.apply(ops, ops.SwiGLU(gu[0], gu[1]))
}

type dsLayer struct {
	inNorm, postNorm synth.Tensor
	qA, qB, q        linear // q_a_proj, q_b_proj, or q_proj without q_lora_rank
	qANorm           synth.Tensor
	kvA              linear
	kvANorm          synth.Tensor
	mla              synth.MLAWeights
	o                linear
	// indexer (V3.2)
	iq, ik, iw     linear
	ikNorm, ikBias synth.Tensor
	// MLP
	dense      *mlp
	router     synth.Tensor
	routerBias synth.Tensor
	experts    []mlp
	shared     *mlp
}

// newDeepSeek is New for the DeepSeek families (cfg read, m's architecture checked).
func newDeepSeek(m spec.Model, dir string, first, last int, ops synth.Loader, cfg model.Numerics) (*Stage, error) {
	n := len(m.Layers)
	dec := n - m.NumNextN
	if m.NumNextN < 0 || dec < 1 {
		return nil, fmt.Errorf("hf: model %q: %d MTP layers of %d leave no decoder layer", m.Name, m.NumNextN, n)
	}
	if last > dec && last != n {
		return nil, fmt.Errorf("hf: layers [%d, %d) hold MTP layers but not the last layer %d (MTP layers are on the last stage)", first, last, n-1)
	}
	ds, err := readDeepSeek(cfg, m)
	if err != nil {
		return nil, fmt.Errorf("hf: %s: %w", dir, err)
	}
	sparse := ds.Sparse
	mixer := spec.MixerMLA
	if sparse {
		mixer = spec.MixerDSA
	}
	for i, l := range m.Layers {
		if l.Mixer != mixer || (l.FFN != spec.FFNDense && l.FFN != spec.FFNMoE) {
			return nil, fmt.Errorf("hf: model %q layer %d: mixer %q, ffn %q; the %s code runs %s with a dense or MoE MLP", m.Name, l.Index, l.Mixer, l.FFN, m.Arch, mixer)
		}
		if l.MTP != (i >= dec) {
			return nil, fmt.Errorf("hf: model %q layer %d: MTP %v; the last %d of its %d layers (num_nextn_predict_layers) are the MTP layers", m.Name, i, l.MTP, m.NumNextN, n)
		}
	}
	h, v, H := m.Hidden, m.Vocab, m.Heads
	R, N, P, V := m.KVLoraRank, m.QKNopeHeadDim, m.QKRopeHeadDim, m.VHeadDim
	if h <= 0 || v <= 0 || H <= 0 || R <= 0 || N <= 0 || P <= 0 || P%2 != 0 || V <= 0 {
		return nil, fmt.Errorf("hf: model %q: hidden %d, vocab %d, heads %d, kv_lora_rank %d, qk_nope %d, qk_rope %d, v_head_dim %d: want all > 0 and an even qk_rope",
			m.Name, h, v, H, R, N, P, V)
	}
	if sparse && (!ds.QLora || m.IndexHeads <= 0 || m.IndexHeadDim < P || m.IndexTopK <= 0) {
		return nil, fmt.Errorf("hf: model %q: q_lora_rank %d, index heads %d, index head dim %d, index_topk %d: the indexer needs q_lora_rank > 0, heads > 0, head dim >= qk_rope_head_dim %d, top k > 0",
			m.Name, m.QLoraRank, m.IndexHeads, m.IndexHeadDim, m.IndexTopK, P)
	}
	t, err := openManifest(dir, ops, cfg.Quant)
	if err != nil {
		return nil, err
	}
	defer t.close()

	t.ends("model.embed_tokens.weight", "model.norm.weight", v, h, cfg.Tied)
	// declare declares layer i's tensors in t.
	declare := func(t *manifest, i int, l spec.Layer) {
		p := LayerPrefix(i)
		a := p + "self_attn."
		if l.MTP {
			t.declareMTP(i, h, v)
		}
		t.need(p+"input_layernorm.weight", h)
		t.need(p+"post_attention_layernorm.weight", h)
		if ds.QLora {
			t.linear(a+"q_a_proj", m.QLoraRank, h, cfg.AttnBias)
			t.need(a+"q_a_layernorm.weight", m.QLoraRank)
			t.linear(a+"q_b_proj", H*(N+P), m.QLoraRank, false)
		} else {
			t.linear(a+"q_proj", H*(N+P), h, false)
		}
		t.linear(a+"kv_a_proj_with_mqa", R+P, h, cfg.AttnBias)
		t.need(a+"kv_a_layernorm.weight", R)
		t.linear(a+"kv_b_proj", H*(N+V), R, false)
		t.linear(a+"o_proj", h, H*V, cfg.AttnBias)
		if sparse {
			t.linear(a+"indexer.wq_b", m.IndexHeads*m.IndexHeadDim, m.QLoraRank, false)
			t.linear(a+"indexer.wk", m.IndexHeadDim, h, false)
			t.need(a+"indexer.k_norm.weight", m.IndexHeadDim)
			t.need(a+"indexer.k_norm.bias", m.IndexHeadDim)
			t.linear(a+"indexer.weights_proj", m.IndexHeads, h, false)
		}
		f := p + "mlp."
		if l.FFN == spec.FFNDense {
			t.linear(f+"gate_proj", m.Intermediate, h, cfg.MLPBias)
			t.linear(f+"up_proj", m.Intermediate, h, cfg.MLPBias)
			t.linear(f+"down_proj", h, m.Intermediate, cfg.MLPBias)
			return
		}
		t.need(f+"gate.weight", m.Experts, h)
		t.need(f+"gate.e_score_correction_bias", m.Experts)
		for e := range m.Experts {
			x := f + "experts." + strconv.Itoa(e) + "."
			t.linear(x+"gate_proj", m.MoEIntermediate, h, false)
			t.linear(x+"up_proj", m.MoEIntermediate, h, false)
			t.linear(x+"down_proj", h, m.MoEIntermediate, false)
		}
		if m.SharedExperts > 0 {
			t.linear(f+"shared_experts.gate_proj", ds.SharedIntermediate, h, false)
			t.linear(f+"shared_experts.up_proj", ds.SharedIntermediate, h, false)
			t.linear(f+"shared_experts.down_proj", h, ds.SharedIntermediate, false)
		}
	}
	for i, l := range m.Layers {
		declare(t, i, l)
	}
	// The checkpoint's MTP layers that m leaves out (speculative decoding
	// off drops them) are allowed, their shapes checked, and not loaded.
	held, err := model.CheckpointMTPLayers(dir)
	if err != nil {
		return nil, fmt.Errorf("hf: %w", err)
	}
	ffn := spec.FFNDense
	if m.Experts > 0 {
		ffn = spec.FFNMoE
	}
	for i := n; i < dec+held; i++ {
		u := &manifest{want: map[string][]int{}, may: map[string][]int{}}
		declare(u, i, spec.Layer{Index: i, Mixer: mixer, FFN: ffn, MTP: true})
		for _, names := range []map[string][]int{u.want, u.may} {
			for name, shape := range names {
				t.allow(name, shape...)
			}
		}
	}
	if err := t.check(m.Arch, n); err != nil {
		return nil, err
	}

	host, load, lin := t.host, t.load, t.lin
	mk := func(name string) *mlp {
		return &mlp{gate: lin(name + "gate_proj"), up: lin(name + "up_proj"), down: lin(name + "down_proj")}
	}

	s := &Stage{m: m, cfg: cfg, first: first, last: last, ds: &ds}
	inv, scale := cfg.Rope.InvFreq(P, m.MaxPosition)
	s.rope = synth.RoPE{Dim: P, Theta: cfg.Rope.Theta, Interleaved: ds.Interleave, InvFreq: inv}
	if scale != 1 {
		s.rope.Scale = scale
	}
	t.loadEnds(s, "model.embed_tokens.weight", "model.norm.weight")
	modelEmbed := s.embed // the MTP layers' embedding where they have none of their own
	for i := first; i < last; i++ {
		p := LayerPrefix(i)
		a := p + "self_attn."
		l := dsLayer{inNorm: load(p + "input_layernorm.weight"), postNorm: load(p + "post_attention_layernorm.weight"),
			kvA: lin(a + "kv_a_proj_with_mqa"), kvANorm: load(a + "kv_a_layernorm.weight"), o: lin(a + "o_proj")}
		if ds.QLora {
			l.qA, l.qANorm, l.qB = lin(a+"q_a_proj"), load(a+"q_a_layernorm.weight"), lin(a+"q_b_proj")
		} else {
			l.q = lin(a + "q_proj")
		}
		// kv_b_proj rows: per head, N rows of k_nope then V rows of v.
		kvb := host(a + "kv_b_proj.weight")
		if kvb != nil {
			uk, uv := make([]float32, 0, H*N*R), make([]float32, 0, H*V*R)
			for hd := range H {
				base := hd * (N + V) * R
				uk = append(uk, kvb[base:base+N*R]...)
				uv = append(uv, kvb[base+N*R:base+(N+V)*R]...)
			}
			l.mla = synth.MLAWeights{UK: ops.Weight(uk, H*N, R), UV: ops.Weight(uv, H*V, R)}
		}
		if sparse {
			l.iq, l.ik, l.iw = lin(a+"indexer.wq_b"), lin(a+"indexer.wk"), lin(a+"indexer.weights_proj")
			l.ikNorm, l.ikBias = load(a+"indexer.k_norm.weight"), load(a+"indexer.k_norm.bias")
		}
		f := p + "mlp."
		if m.Layers[i].FFN == spec.FFNDense {
			l.dense = mk(f)
		} else {
			l.router, l.routerBias = load(f+"gate.weight"), load(f+"gate.e_score_correction_bias")
			for e := range m.Experts {
				l.experts = append(l.experts, *mk(f + "experts." + strconv.Itoa(e) + "."))
			}
			if m.SharedExperts > 0 {
				l.shared = mk(f + "shared_experts.")
			}
		}
		s.dsLayers = append(s.dsLayers, l)
		if m.Layers[i].MTP {
			ml := t.loadMTP(i, s.lmHead)
			if ml.embed == nil {
				if modelEmbed == nil {
					modelEmbed = load("model.embed_tokens.weight")
				}
				ml.embed = modelEmbed
			}
			s.mtp = append(s.mtp, ml)
		}
	}
	if err := t.err(); err != nil {
		return nil, err
	}
	return s, nil
}

// dsLayer runs DeepSeek decoder layer i on x in place, as transformers'
// DeepseekV3DecoderLayer (DeepseekV32DecoderLayer) does.
func (s *Stage) dsLayer(ctx context.Context, ops Ops, i int, segs []synth.Seg, x synth.Tensor) error {
	lw := &s.dsLayers[i-s.first]
	ds, m, eps := s.ds, s.m, s.cfg.Eps
	H, N, P, R := m.Heads, m.QKNopeHeadDim, m.QKRopeHeadDim, m.KVLoraRank
	in := ops.RMSNorm(x, lw.inNorm, eps)
	var q, qResid synth.Tensor
	if ds.QLora {
		qResid = ops.RMSNorm(lw.qA.apply(ops, in), lw.qANorm, eps)
		q = lw.qB.apply(ops, qResid)
	} else {
		q = lw.q.apply(ops, in)
	}
	qs := ops.Split(q, H, N, P)
	kv := ops.Split(lw.kvA.apply(ops, in), 1, R, P)
	mi := synth.MLAIn{QNope: qs[0], QPE: qs[1], CKV: ops.RMSNorm(kv[0], lw.kvANorm, eps), KPE: kv[1], Scale: float32(ds.AttentionScale)}
	ops.RoPE(mi.QPE, segs, P, s.rope)
	ops.RoPE(mi.KPE, segs, P, s.rope)
	var core synth.Tensor
	var err error
	if ds.Sparse {
		D := m.IndexHeadDim
		// The indexer rotates the first qk_rope_head_dim elements of each
		// head in the rotate_half layout, whatever the main attention does.
		ir := s.rope
		ir.Interleaved = false
		iq := lw.iq.apply(ops, qResid)
		ik := ops.LayerNorm(lw.ik.apply(ops, in), lw.ikNorm, lw.ikBias, ds.IndexLayerNormEps)
		ops.RoPE(iq, segs, D, ir)
		ops.RoPE(ik, segs, D, ir)
		iw := lw.iw.apply(ops, in)
		ops.Scale(iw, float32(ds.IndexHeadScale))
		core, err = ops.DSA(ctx, i, segs, mi, synth.IndexIn{Q: iq, K: ik, W: iw, Scale: float32(ds.IndexScoreScale)}, lw.mla)
	} else {
		core, err = ops.MLA(ctx, i, segs, mi, lw.mla)
	}
	if err != nil {
		return err
	}
	post := addNorm(ops, x, lw.o.apply(ops, core), lw.postNorm, eps)
	if lw.dense != nil {
		ops.Add(x, lw.dense.apply(ops, post))
		return nil
	}
	r := ops.RouteGrouped(ops.MatMul(post, lw.router), lw.routerBias,
		GroupedRoute{K: m.ExpertsPerToken, Groups: ds.NGroup, TopKGroup: ds.TopKGroup, Norm: ds.NormTopK, Scale: float32(ds.RoutedScale)})
	acc := ops.Zeros(x.Rows(), x.Cols())
	for e := range lw.experts {
		xe := ops.Gather(post, r, e)
		if xe == nil {
			continue
		}
		ops.AddRouted(acc, lw.experts[e].apply(ops, xe), r, e)
	}
	if lw.shared != nil {
		ops.Add(acc, lw.shared.apply(ops, post))
	}
	ops.Add(x, acc)
	return nil
}

// DeepSeek returns the DeepSeek numerics the stage runs with (the zero
// value for the other families).
func (s *Stage) DeepSeek() DeepSeekConfig {
	if s.ds == nil {
		return DeepSeekConfig{}
	}
	return *s.ds
}
