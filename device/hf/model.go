// Package hf runs real architectures from Hugging Face checkpoint
// directories (config.json and safetensors weights) exactly as
// transformers computes them, written once over the device ops of package
// synth so that every device (cpu now, cuda later) runs the same order of
// operations.
//
// Its parts, and the failure each prevents:
//
//   - The safetensors reader (safetensors.go) maps model.safetensors or the
//     shards of model.safetensors.index.json and converts F32, BF16 and
//     F16 to float32; fp8 weights (F8_E4M3, F8_E5M2) with their
//     DeepSeek-style block scales are dequantized at load (fp8.go), so a
//     checkpoint with a quantization_config runs on float32 weights.
//   - The manifest (manifest.go) is every tensor an architecture's
//     checkpoint must or may hold, with its shape, declared by each
//     architecture's New and checked in one place: a missing, extra or
//     mis-shaped tensor is an error that names it (of several, the first
//     by name, every time), so a checkpoint of another architecture or
//     size can never load with some weights silently left at zero.
//   - model.Numerics (plugins/model) reads the numerics transformers takes from
//     config.json (rms_norm_eps, rope_parameters or rope_theta /
//     rope_scaling, tie_word_embeddings, attention_bias, mlp_bias); the
//     shapes and layers come from spec.Model, which plugins/model parsed from
//     the same file, and New cross-checks the architecture.
//   - Stage (this file) is the Llama family's forward: Llama, Mistral
//     (sliding window: the layer's Window, which the GQA kernel applies)
//     and Qwen3 (RMSNorm over each head of q and k before RoPE): embed,
//     per layer x += o(GQA(RoPE(q), RoPE(k), v)) on the input-normed x and
//     x += down(silu(gate) · up) on the post-attention-normed x, final
//     norm, LM head (the embedding table when tied), greedy argmax. RoPE is
//     the non-interleaved (GPT-NeoX) layout transformers' Llama uses, with
//     the default, llama3 or yarn frequencies.
//   - The DeepSeek families (deepseek.go): DeepSeek-V3 (absorbed MLA, grouped
//     sigmoid top-k MoE with shared experts) and DeepSeek-V3.2 (plus
//     transformers' lightning indexer over the DSA kernel).
//   - Nemotron-H (nemotron.go): Mamba2, attention (GQA without RoPE) and
//     relu² MLP blocks, each x += mixer(RMSNorm(x)); the Mamba2 mixer's
//     sequence part runs on the device's Mamba2 kernel with the
//     checkpoint's numerics (Stage.Mamba2Numerics: the gated norm's
//     epsilon, and the dt floor transformers applies to prompt tokens only).
//   - Qwen3-Next (qwen3next.go): Gated DeltaNet and gated full-attention
//     layers, zero-centred RMSNorms, partial RoPE, MoE with a gated shared
//     expert; the delta net runs on the device's GDN kernel (GDNOps, an
//     optional interface of the device's ops).
//
// Greedy ties break to the lowest token id (synth.Ops.Argmax). DeepSeek's
// MTP layers propose drafts (mtp.go); the other families have no MTP head
// and refuse drafts.
package hf

import (
	"context"
	"fmt"
	"slices"
	"strconv"

	"github.com/kvx-dev/kvx/device/synth"
	"github.com/kvx-dev/kvx/plugins/model"
	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
	"github.com/kvx-dev/kvx/plugins/v1/spec"
	"github.com/kvx-dev/kvx/plugins/v1/worker"
)

// Ops is what the model needs of a device: synth.Ops and two row-wise ops
// the synthetic model does not use. They keep synth.Ops' contract: each
// output row depends only on its own input row and the weights.
type Ops interface {
	synth.Ops
	RowOps
}

// RowOps are the row-wise operations of Ops: synth.RowOps and the ones the
// checkpoints add.
type RowOps interface {
	synth.RowOps
	// AddBias sets x += b on every row (b is 1 × Cols).
	AddBias(x, b synth.Tensor)
	// RMSNormGroups returns every w.Cols()-wide group of each row of x
	// RMS-normalized (epsilon eps) and multiplied by the gains w (1 × g):
	// the per-head q/k norm of Qwen3. w.Cols() divides x.Cols().
	RMSNormGroups(x, w synth.Tensor, eps float32) synth.Tensor
	DeepSeekOps
}

// MatMulser is an optional interface of a device's ops: MatMuls returns
// MatMul(x, w) for every w, the same bits, in fewer passes where the
// device can (the fast cuda device rounds x to bf16 once and runs a
// decode step's q, k and v, or gate and up, in one launch).
type MatMulser interface {
	MatMuls(x synth.Tensor, ws ...synth.Tensor) []synth.Tensor
}

// AddNormer is an optional interface of a device's ops: AddRMSNorm does
// Add(x, y) and returns RMSNorm(x, w, eps), the same bits, in one pass
// where the device can (the fast cuda device adds the residual inside its
// RMSNorm's launch).
type AddNormer interface {
	AddRMSNorm(x, y, w synth.Tensor, eps float32) synth.Tensor
}

// RoPEGQAer is an optional interface of a device's ops: RoPEGQA does
// RoPE(q, segs, stride, r) and RoPE(k, segs, stride, r), then returns
// GQA(ctx, layer, segs, q, k, v): the same bits, in fewer passes where the
// device can (the cuda device writes the rotated k into the pool with v in
// the launch that rotates q). q is rotated as RoPE leaves it; k's contents
// afterwards are unspecified (the cuda device leaves it unrotated).
type RoPEGQAer interface {
	RoPEGQA(ctx context.Context, layer int, segs []synth.Seg, q, k, v synth.Tensor, stride int, r synth.RoPE) (synth.Tensor, error)
}

// ropeGQA is RoPE of q and k, then GQA, through RoPEGQA where ops has it.
func ropeGQA(ctx context.Context, ops Ops, layer int, segs []synth.Seg, q, k, v synth.Tensor, stride int, r synth.RoPE) (synth.Tensor, error) {
	if rg, ok := ops.(RoPEGQAer); ok {
		return rg.RoPEGQA(ctx, layer, segs, q, k, v, stride, r)
	}
	ops.RoPE(q, segs, stride, r)
	ops.RoPE(k, segs, stride, r)
	return ops.GQA(ctx, layer, segs, q, k, v)
}

// addNorm is x += y, then RMSNorm(x, w, eps), through AddRMSNorm where ops
// has it; with y nil it is RMSNorm alone.
func addNorm(ops Ops, x, y, w synth.Tensor, eps float32) synth.Tensor {
	if y == nil {
		return ops.RMSNorm(x, w, eps)
	}
	if an, ok := ops.(AddNormer); ok {
		return an.AddRMSNorm(x, y, w, eps)
	}
	ops.Add(x, y)
	return ops.RMSNorm(x, w, eps)
}

type linear struct{ w, b synth.Tensor }

// applyAll is apply of every linear of ls to the same x, through MatMuls
// where ops has it.
func applyAll(ops Ops, x synth.Tensor, ls ...linear) []synth.Tensor {
	mm, ok := ops.(MatMulser)
	if !ok {
		ys := make([]synth.Tensor, len(ls))
		for i, l := range ls {
			ys[i] = l.apply(ops, x)
		}
		return ys
	}
	ws := make([]synth.Tensor, len(ls))
	for i, l := range ls {
		ws[i] = l.w
	}
	ys := mm.MatMuls(x, ws...)
	for i, l := range ls {
		if l.b != nil {
			ops.AddBias(ys[i], l.b)
		}
	}
	return ys
}

func (l linear) apply(ops Ops, x synth.Tensor) synth.Tensor {
	y := ops.MatMul(x, l.w)
	if l.b != nil {
		ops.AddBias(y, l.b)
	}
	return y
}

type layerW struct {
	inNorm, postNorm synth.Tensor
	q, k, v, o       linear
	qNorm, kNorm     synth.Tensor // Qwen3
	gate, up, down   linear
}

// Stage runs layers [first, last) of a checkpoint. Stage 0 embeds tokens;
// the stage holding the last layer applies the final norm and the LM head
// and samples greedily. A Stage holds only weights (tensors of the device
// whose Loader built it): it is immutable after New and safe for concurrent
// use with distinct Ops of that device.
type Stage struct {
	m           spec.Model
	cfg         model.Numerics
	first, last int
	embed       synth.Tensor
	finalNorm   synth.Tensor
	lmHead      synth.Tensor
	layers      []layerW
	rope        synth.RoPE
	ds          *DeepSeekConfig // the DeepSeek families (deepseek.go): dsLayers in place of layers
	dsLayers    []dsLayer
	mtp         []mtpLayer // DeepSeek's MTP layers on the last stage (mtp.go), their blocks in dsLayers
	nemo        *nemotron  // Nemotron-H's blocks (nemotron.go); nil for the Llama family
	q3n         *qwen3Next // Qwen3-Next's layers (qwen3next.go)
}

// Config returns the checkpoint's numerics the stage runs with.
func (s *Stage) Config() model.Numerics { return s.cfg }

// New loads layers [first, last) of model m from checkpoint directory dir
// onto the device of ops. m is what plugins/model parsed from dir/config.json
// (Checkpoint set, buffers filled or not). Errors name the field or tensor,
// the value and the limit: an architecture other than m's or outside
// Families, a layer that is not GQA with a dense MLP, MTP layers, a
// missing, extra or mis-shaped tensor anywhere in the checkpoint (every
// stage checks every name, so a wrong checkpoint fails on every stage).
func New(m spec.Model, dir string, first, last int, ops synth.Loader) (*Stage, error) {
	n := len(m.Layers)
	if first < 0 || first >= last || last > n {
		return nil, fmt.Errorf("hf: layers [%d, %d) are not a non-empty range of the %d layers of model %q", first, last, n, m.Name)
	}
	cfg, err := model.ReadNumerics(dir)
	if err != nil {
		return nil, fmt.Errorf("hf: %s: %w", dir, err)
	}
	if cfg.Arch != m.Arch {
		return nil, fmt.Errorf("hf: %s: config.json architecture %s, model %q says %s", dir, cfg.Arch, m.Name, m.Arch)
	}
	if isDeepSeek(cfg.Arch) {
		return newDeepSeek(m, dir, first, last, ops, cfg)
	}
	if m.NumNextN > 0 {
		return nil, fmt.Errorf("hf: model %q: %d MTP layers; the %s code has no MTP head (limit 0)", m.Name, m.NumNextN, m.Arch)
	}
	if cfg.Arch == archNemotronH {
		return newNemotron(m, dir, first, last, cfg, ops)
	}
	if cfg.Arch == archQwen3Next {
		return newQwen3Next(m, dir, first, last, cfg, ops)
	}
	for _, l := range m.Layers {
		if l.Mixer != spec.MixerGQA || l.FFN != spec.FFNDense {
			return nil, fmt.Errorf("hf: model %q layer %d: mixer %q, ffn %q; the %s code runs gqa with a dense MLP", m.Name, l.Index, l.Mixer, l.FFN, m.Arch)
		}
	}
	h, v, inter := m.Hidden, m.Vocab, m.Intermediate
	heads, kvh, d := m.Heads, m.KVHeads, m.HeadDim
	if kvh == 0 {
		kvh = heads
	}
	if h <= 0 || v <= 0 || inter <= 0 || heads <= 0 || d <= 0 || d%2 != 0 || heads%kvh != 0 {
		return nil, fmt.Errorf("hf: model %q: hidden %d, vocab %d, intermediate %d, heads %d, kv heads %d, head dim %d: want all > 0, an even head dim, kv heads dividing heads",
			m.Name, h, v, inter, heads, kvh, d)
	}
	t, err := openManifest(dir, ops, cfg.Quant)
	if err != nil {
		return nil, err
	}
	defer t.close()

	// Every tensor the checkpoint must hold (shape), and those it may.
	t.ends("model.embed_tokens.weight", "model.norm.weight", v, h, cfg.Tied)
	for i := range n {
		p := LayerPrefix(i)
		t.need(p+"input_layernorm.weight", h)
		t.need(p+"post_attention_layernorm.weight", h)
		for _, x := range []struct {
			name    string
			out, in int
		}{{"self_attn.q_proj", heads * d, h}, {"self_attn.k_proj", kvh * d, h}, {"self_attn.v_proj", kvh * d, h}, {"self_attn.o_proj", h, heads * d},
			{"mlp.gate_proj", inter, h}, {"mlp.up_proj", inter, h}, {"mlp.down_proj", h, inter}} {
			t.need(p+x.name+".weight", x.out, x.in)
			switch {
			case x.name == "self_attn.o_proj" && cfg.AttnBias:
				t.allow(p+x.name+".bias", x.out)
			case x.name[:4] == "self" && cfg.AttnBias, x.name[:3] == "mlp" && cfg.MLPBias:
				t.need(p+x.name+".bias", x.out)
			}
		}
		if cfg.QKNorm {
			t.need(p+"self_attn.q_norm.weight", d)
			t.need(p+"self_attn.k_norm.weight", d)
		}
	}
	if err := t.check(m.Arch, n); err != nil {
		return nil, err
	}

	load, lin := t.load, t.lin
	s := &Stage{m: m, cfg: cfg, first: first, last: last}
	inv, scale := cfg.Rope.InvFreq(d, m.MaxPosition)
	s.rope = synth.RoPE{Dim: d, Theta: cfg.Rope.Theta, InvFreq: inv}
	if scale != 1 {
		s.rope.Scale = scale
	}
	t.loadEnds(s, "model.embed_tokens.weight", "model.norm.weight")
	for i := first; i < last; i++ {
		p := LayerPrefix(i)
		lw := layerW{
			inNorm: load(p + "input_layernorm.weight"), postNorm: load(p + "post_attention_layernorm.weight"),
			q: lin(p + "self_attn.q_proj"), k: lin(p + "self_attn.k_proj"), v: lin(p + "self_attn.v_proj"), o: lin(p + "self_attn.o_proj"),
			gate: lin(p + "mlp.gate_proj"), up: lin(p + "mlp.up_proj"), down: lin(p + "mlp.down_proj"),
		}
		if cfg.QKNorm {
			lw.qNorm, lw.kNorm = load(p+"self_attn.q_norm.weight"), load(p+"self_attn.k_norm.weight")
		}
		s.layers = append(s.layers, lw)
	}
	if err := t.err(); err != nil {
		return nil, err
	}
	return s, nil
}

// LayerPrefix is the tensor name prefix of decoder layer i:
// "model.layers.<i>.".
func LayerPrefix(i int) string { return "model.layers." + strconv.Itoa(i) + "." }

// Model returns the model the stage was built from (shared slices: do not
// modify).
func (s *Stage) Model() spec.Model { return s.m }

// Forward runs the stage's layers on st.Items over ops (an Ops of the
// device that built the stage, holding this step's caches), and on the
// last stage samples after every item with Sample (greedily, or by
// synth.Choose for an item whose Sampling is not greedy), with the
// logits when st.Logits and the item's TopLogprobs most likely tokens
// (synth.TopLogprobs) when it asks for them; a last stage with MTP layers
// (DeepSeek, mtp.go) also verifies the items' drafts and proposes
// st.Drafts drafts per sampling item (synth.Head). The rows of item i are Tokens' positions
// Pos..Pos+len-1, in item order. Item problems (no tokens, drafts on a
// model without MTP layers or outside [0, tokens), a token outside the
// vocabulary, positions beyond max_position) are *kvcache.Error values
// with Seqs set; more st.Drafts than MTP layers and a Hidden of the wrong
// length are plain errors; the kernels' errors are returned as they are.
// The result is the caller's.
func (s *Stage) Forward(ctx context.Context, ops Ops, st synth.Step) (synth.Result, error) {
	rows := 0
	segs := make([]synth.Seg, len(st.Items))
	for i, it := range st.Items {
		if err := s.checkItem(it); err != nil {
			return synth.Result{}, err
		}
		segs[i] = synth.Seg{Seq: it.Seq, Pos: it.Pos, Rows: len(it.Tokens), Draft: it.Draft}
		rows += len(it.Tokens)
	}
	if err := s.checkDrafts(st); err != nil {
		return synth.Result{}, err
	}
	h := s.m.Hidden
	var x synth.Tensor
	if s.first == 0 {
		toks := make([]int32, 0, rows)
		for _, it := range st.Items {
			toks = append(toks, it.Tokens...)
		}
		x = ops.Embed(s.embed, toks)
	} else {
		hid, err := synth.DecodeHidden(st.Hidden, rows, h)
		if err != nil {
			return synth.Result{}, err
		}
		x = ops.FromHost(hid, rows, h)
	}
	var pending synth.Tensor // the last layer's residual addend, not yet added to x
	for i := s.first; i < min(s.last, s.decoderEnd()); i++ {
		if err := ctx.Err(); err != nil {
			return synth.Result{}, err
		}
		var err error
		if pending, err = s.layer(ctx, ops, i, segs, x, pending); err != nil {
			return synth.Result{}, err
		}
	}
	if pending != nil {
		ops.Add(x, pending)
	}
	if s.last != len(s.m.Layers) {
		hid := ops.ToHost(x)
		return synth.Result{Hidden: synth.EncodeHidden(make([]byte, 0, 4*len(hid)), hid)}, nil
	}
	if len(s.mtp) > 0 {
		return synth.Head(ctx, ops, st, x, mtpHead{s, ops})
	}
	var idx []int
	var items []synth.Item // the sampling items, in order
	base := 0
	for _, it := range st.Items {
		base += len(it.Tokens)
		if it.Sample {
			idx = append(idx, base-1)
			items = append(items, it)
		}
	}
	res := synth.Result{Prompt: synth.PromptRows(ops, x, s.finalNorm, s.lmHead, s.cfg.Eps, s.m.Vocab, st.Items)}
	if len(idx) == 0 {
		return res, nil
	}
	lg := ops.MatMul(ops.RMSNorm(ops.Rows(x, idx), s.finalNorm, s.cfg.Eps), s.lmHead)
	greedy := ops.Argmax(lg)
	var host []float32
	if st.Logits || slices.ContainsFunc(items, func(it synth.Item) bool {
		return it.TopLogprobs > 0 || it.Logprobs || !it.Sampling.Greedy()
	}) {
		host = ops.ToHost(lg)
	}
	v := s.m.Vocab
	for i, it := range items {
		tok := greedy[i]
		o := worker.Output{Seq: it.Seq}
		if host != nil { // the row is on the host when some item needs it
			row := host[i*v : (i+1)*v : (i+1)*v]
			if !it.Sampling.Greedy() {
				tok = synth.Choose(row, it.Sampling, it.Pos+len(it.Tokens), it.Sampling.Context, it.Tokens)
			}
			if st.Logits {
				o.Logits = row
			}
			if k := it.TopLogprobs; k > 0 {
				o.TopLogprobs = [][]worker.TokenLogprob{synth.TopLogprobs(row, k)}
			}
			if it.Logprobs {
				o.Logprobs = []float64{synth.Logprob(row, tok)}
			}
		}
		o.Tokens = []int32{tok}
		res.Outputs = append(res.Outputs, o)
	}
	return res, nil
}

func (s *Stage) checkItem(it synth.Item) error {
	n := len(it.Tokens)
	seqs := []kvcache.SeqID{it.Seq}
	switch {
	case n == 0:
		return kvcache.ItemErrorf(seqs, "hf: sequence %d has no tokens", it.Seq)
	case it.TopLogprobs < 0:
		return kvcache.ItemErrorf(seqs, "hf: sequence %d: top logprobs %d must be >= 0", it.Seq, it.TopLogprobs)
	case it.PromptTopLogprobs < 0:
		return kvcache.ItemErrorf(seqs, "hf: sequence %d: prompt top logprobs %d must be >= 0", it.Seq, it.PromptTopLogprobs)
	case it.Pos < 0 || (s.m.MaxPosition > 0 && it.Pos+n > s.m.MaxPosition):
		return kvcache.ItemErrorf(seqs, "hf: sequence %d: positions %d..%d outside [0, max_position %d)", it.Seq, it.Pos, it.Pos+n-1, s.m.MaxPosition)
	}
	if err := s.checkMTPItem(it); err != nil {
		return err
	}
	for _, t := range it.Tokens {
		if t < 0 || int(t) >= s.m.Vocab {
			return kvcache.ItemErrorf(seqs, "hf: sequence %d: token %d outside the vocabulary [0, %d)", it.Seq, t, s.m.Vocab)
		}
	}
	return synth.CheckSampling(it, s.m.Vocab)
}

// layer runs decoder layer i on x in place, as transformers' LlamaDecoderLayer
// (and Mistral's, Qwen3's) does. pending, when not nil, is the layer
// before's last residual addend, which x has not had yet: the layer adds it
// (in its first RMSNorm's pass where the device can: AddNormer). It returns
// its own last addend in the same way, or nil when x has everything.
func (s *Stage) layer(ctx context.Context, ops Ops, i int, segs []synth.Seg, x, pending synth.Tensor) (synth.Tensor, error) {
	if s.ds != nil || s.nemo != nil || s.q3n != nil {
		if pending != nil {
			ops.Add(x, pending)
		}
		switch {
		case s.ds != nil:
			return nil, s.dsLayer(ctx, ops, i, segs, x)
		case s.nemo != nil:
			return nil, s.nemo.layer(ctx, ops, s, i, segs, x)
		default:
			return nil, s.q3n.layer(ctx, ops, s, i, segs, x)
		}
	}
	lw := &s.layers[i-s.first]
	eps := s.cfg.Eps
	in := addNorm(ops, x, pending, lw.inNorm, eps)
	qkv := applyAll(ops, in, lw.q, lw.k, lw.v)
	q, k, v := qkv[0], qkv[1], qkv[2]
	if lw.qNorm != nil {
		q, k = ops.RMSNormGroups(q, lw.qNorm, eps), ops.RMSNormGroups(k, lw.kNorm, eps)
	}
	core, err := ropeGQA(ctx, ops, i, segs, q, k, v, s.m.HeadDim, s.rope)
	if err != nil {
		return nil, err
	}
	post := addNorm(ops, x, lw.o.apply(ops, core), lw.postNorm, eps)
	gu := applyAll(ops, post, lw.gate, lw.up)
	return lw.down.apply(ops, ops.SwiGLU(gu[0], gu[1])), nil
}
