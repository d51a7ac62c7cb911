package hf

import (
	"context"
	"fmt"

	"github.com/kvx-dev/kvx/device/synth"
	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
	"github.com/kvx-dev/kvx/plugins/v1/worker"
)

// DeepSeek-V3's MTP layers (num_nextn_predict_layers), laid out in the
// checkpoint as model.layers.<N>.* for N = num_hidden_layers,
// num_hidden_layers+1, ... and run as vLLM's deepseek_mtp.py and SGLang's
// deepseek_nextn.py run them. MTP depth k (layer N+k-1) computes, for the
// row of position p,
//
//	h_k(p) = block_k(eh_proj_k([enorm_k(embed(t(p+k))) ; hnorm_k(h_{k-1}(p))]))
//
// with h_0 the main model's last decoder output (before model.norm), block_k
// a whole DeepSeek decoder layer (MLA or DSA attention on the MTP layer's
// own KV cache, then the MoE, the tensors named as a decoder layer's), and
// its draft the argmax of shared_head.head(shared_head.norm(h_k)) at the
// last kept row. The embedding is the layer's own embed_tokens when the
// checkpoint has it (DeepSeek-V3's does, a copy of the main one), else
// model.embed_tokens; the head is the layer's shared_head.head when there,
// else lm_head. vLLM zeroes the embedding at position 0 (a carry-over from
// EAGLE); SGLang and the DeepSeek-V3 report do not, nor does kvx. Drafts
// only decide how many tokens a step keeps, never which: the verified
// tokens are the main model's.
//
// Sampling, draft verification and the schedule of MTP rows are
// synth.Head's, the code the synthetic model runs: drafts are verified and
// the MTP caches written exactly as for a synthetic model (one MTP layer per
// draft depth, on the rows the step keeps).

// mtpLayer is one MTP layer's own weights (its decoder block is a dsLayer).
type mtpLayer struct {
	enorm, hnorm synth.Tensor
	ehProj       synth.Tensor // hidden × 2·hidden
	embed        synth.Tensor // the layer's embed_tokens, else the model's
	headNorm     synth.Tensor // shared_head.norm
	head         synth.Tensor // shared_head.head, else lm_head
}

// declareMTP declares the MTP-only tensors of layer i (hidden h, vocab v);
// its decoder block's tensors are declared as any DeepSeek layer's.
func (t *manifest) declareMTP(i, h, v int) {
	p := LayerPrefix(i)
	t.need(p+"enorm.weight", h)
	t.need(p+"hnorm.weight", h)
	t.need(p+"eh_proj.weight", h, 2*h)
	t.need(p+"shared_head.norm.weight", h)
	t.allow(p+"shared_head.head.weight", v, h)
	t.allow(p+"embed_tokens.weight", v, h)
}

// loadMTP loads the MTP-only weights of layer i onto the device: its own
// embed_tokens (nil when the checkpoint has none: the caller gives it the
// model's) and shared_head.head, else head (the model's LM head).
func (t *manifest) loadMTP(i int, head synth.Tensor) mtpLayer {
	p := LayerPrefix(i)
	l := mtpLayer{enorm: t.load(p + "enorm.weight"), hnorm: t.load(p + "hnorm.weight"), ehProj: t.load(p + "eh_proj.weight"),
		headNorm: t.load(p + "shared_head.norm.weight"), embed: t.load(p + "embed_tokens.weight"), head: head}
	if t.ck.Has(p + "shared_head.head.weight") {
		l.head = t.load(p + "shared_head.head.weight")
	}
	return l
}

// decoderEnd is the index of the first MTP layer (the number of decoder
// layers).
func (s *Stage) decoderEnd() int { return len(s.m.Layers) - s.m.NumNextN }

// MTPLayers returns the number of MTP layers the stage runs (the last
// stage's; 0 on the others and for a model without them).
func (s *Stage) MTPLayers() int { return len(s.mtp) }

// checkDrafts refuses a step asking the last stage for more drafts per
// sampling item than it has MTP layers (one per draft depth).
func (s *Stage) checkDrafts(st synth.Step) error {
	if s.last != len(s.m.Layers) || st.Drafts <= s.MTPLayers() {
		return nil
	}
	if s.MTPLayers() == 0 {
		return fmt.Errorf("hf: %d drafts per step: model %q has no MTP head (limit 0)", st.Drafts, s.m.Name)
	}
	return fmt.Errorf("hf: %d drafts per step exceed the %d MTP layers of model %q (limit %d: one layer per draft depth)",
		st.Drafts, s.MTPLayers(), s.m.Name, s.MTPLayers())
}

// checkMTPItem checks an item's drafts and lookahead: no drafts for a model
// without an MTP head, else synth.CheckDrafts.
func (s *Stage) checkMTPItem(it synth.Item) error {
	if it.Draft != 0 && s.m.NumNextN == 0 {
		return kvcache.ItemErrorf([]kvcache.SeqID{it.Seq}, "hf: sequence %d: %d drafts; model %q has no MTP head (limit 0)", it.Seq, it.Draft, s.m.Name)
	}
	return synth.CheckDrafts("hf", it, s.m.Vocab)
}

// mtpHead is a DeepSeek last stage with MTP layers, over the ops of one
// Forward, as a synth.HeadModel (whose methods get the same ops).
type mtpHead struct {
	s   *Stage
	ops Ops
}

var _ synth.HeadModel = mtpHead{}

func (h mtpHead) Vocab() int { return h.s.m.Vocab }

func (h mtpHead) Logits(ops synth.Ops, x synth.Tensor, idx []int) synth.Tensor {
	s := h.s
	return ops.MatMul(ops.RMSNorm(ops.Rows(x, idx), s.finalNorm, s.cfg.Eps), s.lmHead)
}

func (h mtpHead) Prompt(ops synth.Ops, x synth.Tensor, items []synth.Item) []worker.PromptLogprobs {
	s := h.s
	return synth.PromptRows(ops, x, s.finalNorm, s.lmHead, s.cfg.Eps, s.m.Vocab, items)
}

// MTP runs depth k: MTP layer decoderEnd()+k-1 (see the comment at the top).
func (h mtpHead) MTP(ctx context.Context, _ synth.Ops, k int, segs []synth.Seg, toks []int32, prev synth.Tensor) (synth.Tensor, error) {
	s, ops := h.s, h.ops
	li := s.decoderEnd() + k - 1
	l := &s.mtp[k-1]
	eps := s.cfg.Eps
	e := ops.RMSNorm(ops.Embed(l.embed, toks), l.enorm, eps)
	x := ops.MatMul(ops.Concat(e, ops.RMSNorm(prev, l.hnorm, eps)), l.ehProj)
	if err := s.dsLayer(ctx, ops, li, segs, x); err != nil {
		return nil, err
	}
	return x, nil
}

func (h mtpHead) MTPLogits(ops synth.Ops, k int, x synth.Tensor, idx []int) synth.Tensor {
	s := h.s
	l := &s.mtp[k-1]
	return ops.MatMul(ops.RMSNorm(ops.Rows(x, idx), l.headNorm, s.cfg.Eps), l.head)
}
