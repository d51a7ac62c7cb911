// Package synth is kvx's synthetic model, written once for every device:
// seeded random weights shaped by a (scaled-down) spec.Model, a byte-level
// tokenizer, and the forward of a pipeline stage (embeddings, decoder layers
// with their norms, the mixer projections, dense and MoE FFNs, the final norm
// and LM head, greedy sampling with draft verification and top logprobs,
// and a DeepSeek-V3 style MTP head).
//
// Its parts, and the failure each prevents:
//
//   - Ops (ops.go) is the only way the model computes: every matmul, norm,
//     activation, MoE routing step, mixer kernel and sampling call goes
//     through it, on opaque device-owned Tensors. The order of operations
//     therefore exists once, here; the cpu device (reference kernels) and a
//     cuda device implement Ops, so they cannot drift into two models whose
//     tokens disagree.
//   - The mixer projections (mix.go) are the model's too: the backend only
//     picks the kernel (device.Backend.Kernel), the device only runs it, so
//     a dense no-cache reference built over the same Ops with a dense mixer
//     path differs from the paged device in nothing but the cache.
//   - Weights (weights.go) are a pure function of (seed, name, shape), so
//     every stage, process and device draws the same bits without sharing
//     memory.
//
// Given an Ops that keeps its contract (row-wise ops, causal mixer kernels
// with one fixed summation order), a stage's results are bit-identical
// whatever the batching, chunking, pipeline split or process.
package synth

import (
	"context"
	"fmt"
	"slices"

	"github.com/kvx-dev/kvx/device"
	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
	"github.com/kvx-dev/kvx/plugins/v1/spec"
	"github.com/kvx-dev/kvx/plugins/v1/worker"

	"github.com/kvx-dev/kvx/plugins/model/tok"
)

// NormEps is the RMSNorm epsilon of every norm.
const NormEps = 1e-6

// archNemotronH uses relu² two-matrix MLPs; every other arch SwiGLU.
const archNemotronH = "NemotronHForCausalLM"

// Item is one sequence's part of a step: worker.Item without the block
// tables (the Mixer's business), plus Lookahead.
type Item struct {
	Seq    kvcache.SeqID
	Pos    int     // history before this step: Tokens[0] sits at Pos
	Tokens []int32 // prefill chunk, or the last token followed by Draft drafts
	Draft  int     // trailing draft tokens of Tokens, verified on the last stage
	Sample bool    // sample after the last non-draft token (last stage)
	// Lookahead are prompt tokens known to follow Tokens (the next chunk's
	// first tokens) for a chunk that does not sample; the MTP head pairs the
	// last rows with them. Empty: the MTP head uses its own greedy guesses
	// there (the MTP cache, hence the drafts, then depend on chunking; the
	// verified tokens never do). len >= Drafts makes drafts chunk-invariant.
	Lookahead []int32
	// TopLogprobs > 0 asks a sampling item for the TopLogprobs most likely
	// tokens of every token it samples (worker.Output.TopLogprobs, made by
	// TopLogprobs).
	TopLogprobs int
	// Logprobs asks a sampling item for the log-probability of every token
	// it samples (worker.Output.Logprobs, made by Logprob).
	Logprobs bool
	// Sampling picks a sampling item's tokens (worker.Item.Sampling; nil:
	// greedy, Ops.Argmax; otherwise Choose on the host).
	Sampling *worker.Sampling
	// PromptLogprobs, PromptTopLogprobs and Next ask for the item's prompt
	// rows (worker.Item.PromptLogprobs; Result.Prompt, made by PromptRows).
	PromptLogprobs    bool
	PromptTopLogprobs int
	Next              int32
}

// worker is it as a worker.Item, for the contract's row helpers.
func (it *Item) worker() worker.Item {
	return worker.Item{Tokens: it.Tokens, Draft: it.Draft, Sample: it.Sample, PromptLogprobs: it.PromptLogprobs, Next: it.Next}
}

// PromptRows computes the prompt rows of every item that asks for them
// (Item.PromptLogprobs) from x, the last layer's output of every item's
// rows in item order: each row's final norm and LM head (the same ops as
// the sampled rows', so the same values: every op is row-independent),
// then Logprob of its target and TopLogprobs, in float64 on the host. nil
// when no item asks.
func PromptRows(ops Ops, x, norm, head Tensor, eps float32, vocab int, items []Item) []worker.PromptLogprobs {
	var idx []int
	base := 0
	for i := range items {
		wi := items[i].worker()
		for j := range wi.PromptRows() {
			idx = append(idx, base+j)
		}
		base += len(items[i].Tokens)
	}
	if len(idx) == 0 {
		return nil
	}
	host := ops.ToHost(ops.MatMul(ops.RMSNorm(ops.Rows(x, idx), norm, eps), head))
	var out []worker.PromptLogprobs
	r := 0
	for i := range items {
		it := &items[i]
		if !it.PromptLogprobs {
			continue
		}
		wi := it.worker()
		p := worker.PromptLogprobs{Seq: it.Seq, Logprobs: make([]float64, wi.PromptRows())}
		if it.PromptTopLogprobs > 0 {
			p.TopLogprobs = make([][]worker.TokenLogprob, len(p.Logprobs))
		}
		for j := range p.Logprobs {
			row := host[r*vocab : (r+1)*vocab : (r+1)*vocab]
			p.Logprobs[j] = Logprob(row, wi.PromptTarget(j))
			if p.TopLogprobs != nil {
				p.TopLogprobs[j] = TopLogprobs(row, it.PromptTopLogprobs)
			}
			r++
		}
		out = append(out, p)
	}
	return out
}

// ItemsFrom converts worker items (no Lookahead: the v1 contract has none).
func ItemsFrom(items []worker.Item) []Item {
	out := make([]Item, len(items))
	for i, it := range items {
		out[i] = Item{Seq: it.Seq, Pos: it.Pos, Tokens: it.Tokens, Draft: it.Draft, Sample: it.Sample, TopLogprobs: it.TopLogprobs,
			Logprobs: it.Logprobs, Sampling: it.Sampling,
			PromptLogprobs: it.PromptLogprobs, PromptTopLogprobs: it.PromptTopLogprobs, Next: it.Next}
	}
	return out
}

// Step is one stage's forward input.
type Step struct {
	Items []Item
	// Hidden is the previous stage's output (EncodeHidden of every item's
	// rows in item order); nil on the first stage.
	Hidden []byte
	// Drafts is how many MTP draft tokens the last stage proposes per
	// sampling item (worker.Config.DraftTokens); at most the stage's MTP
	// layers. Ignored on other stages.
	Drafts int
	// Logits asks for the main model's logits of each sampled position.
	Logits bool
}

// Result is one stage's forward output.
type Result struct {
	// Hidden is for the next stage: every item's rows after this stage's
	// layers, EncodeHidden format; nil on the last stage.
	Hidden []byte
	// Outputs are the last stage's, one per item with Sample, in item order.
	Outputs []worker.Output
	// Prompt are the last stage's prompt rows (PromptRows).
	Prompt []worker.PromptLogprobs
}

type layerW struct {
	spec             spec.Layer
	mixNorm, ffnNorm Tensor
	mix              *mixW
	mlp              *mlp
	moe              *moe
	enorm, hnorm     Tensor // MTP: norms of the token embedding and of the hidden input
	ehProj           Tensor // MTP: Hidden × 2·Hidden, input [enorm(emb) ; hnorm(h)]
}

// Stage runs layers [First, Last) of a synthetic model. Stage 0 embeds
// tokens; the stage that holds the last layer applies the final norm and the
// (untied) LM head, samples greedily, verifies drafts and runs the MTP layers
// (which are always last in spec.Model.Layers). A Stage holds only weights
// (tensors of the device whose Ops built it): it is immutable after New and
// safe for concurrent use with distinct Ops of that device.
type Stage struct {
	m           spec.Model
	first, last int
	decEnd      int // index of the first MTP layer
	embed       Tensor
	finalNorm   Tensor
	lmHead      Tensor
	layers      []layerW // [first, last)
}

// New builds the weights of layers [first, last) of m from seed (eagerly) on
// the device of ops, each mixer layer's projections for the kernel that
// kernelOf (the backend's Kernel method) picks for its mixer. It fails,
// naming the value and the limit, when the range is empty or out of m, an
// MTP layer would sit on a stage that is not the last, or m lacks a
// dimension its layers need (vocab >= 258, hidden, intermediate, experts).
func New(m spec.Model, seed uint64, first, last int, kernelOf func(spec.Mixer) device.Kernel, ops Loader) (*Stage, error) {
	n := len(m.Layers)
	decEnd := n - m.NumNextN
	switch {
	case first < 0 || first >= last || last > n:
		return nil, fmt.Errorf("synth: layers [%d, %d) are not a non-empty range of the %d layers of model %q", first, last, n, m.Name)
	case m.NumNextN < 0 || decEnd < 1:
		return nil, fmt.Errorf("synth: model %q: %d MTP layers of %d leave no decoder layer", m.Name, m.NumNextN, n)
	case last > decEnd && last != n:
		return nil, fmt.Errorf("synth: layers [%d, %d) hold MTP layers but not the last layer %d (MTP layers are on the last stage)", first, last, n-1)
	case m.Hidden <= 0:
		return nil, fmt.Errorf("synth: model %q: hidden %d must be > 0", m.Name, m.Hidden)
	case m.Vocab < tok.ByteVocab:
		return nil, fmt.Errorf("synth: model %q: vocab %d is less than %d (256 bytes + BOS + EOS)", m.Name, m.Vocab, tok.ByteVocab)
	}
	w := Weights{Seed: seed, Layers: decEnd}
	s := &Stage{m: m, first: first, last: last, decEnd: decEnd}
	h := m.Hidden
	norm := func(name string) Tensor { return ops.Weight(w.Norm(name, h), 1, h) }
	gated := m.Arch != archNemotronH
	if first == 0 || (last == n && m.NumNextN > 0) {
		s.embed = ops.Weight(w.Embedding("embed", m.Vocab, h), m.Vocab, h)
	}
	if last == n {
		s.finalNorm = norm("norm")
		s.lmHead = ops.Weight(w.Linear("lm_head", m.Vocab, h), m.Vocab, h)
	}
	for i := first; i < last; i++ {
		l := m.Layers[i]
		p := LayerName(i)
		lw := layerW{spec: l}
		if l.Mixer != spec.MixerNone {
			lw.mixNorm = norm(p + "mixer_norm")
			var err error
			if lw.mix, err = newMixW(ops, w, &m, l, kernelOf(l.Mixer)); err != nil {
				return nil, err
			}
		}
		switch l.FFN {
		case spec.FFNDense:
			if m.Intermediate <= 0 {
				return nil, fmt.Errorf("synth: model %q layer %d is dense but intermediate is %d", m.Name, i, m.Intermediate)
			}
			lw.ffnNorm = norm(p + "ffn_norm")
			lw.mlp = newMLP(ops, w, p+"mlp.", h, m.Intermediate, gated)
		case spec.FFNMoE:
			if m.Experts <= 0 || m.MoEIntermediate <= 0 || m.ExpertsPerToken < 1 || m.ExpertsPerToken > m.Experts {
				return nil, fmt.Errorf("synth: model %q layer %d is MoE but experts %d, moe_intermediate %d, experts_per_token %d (want >= 1, >= 1, 1..experts)",
					m.Name, i, m.Experts, m.MoEIntermediate, m.ExpertsPerToken)
			}
			lw.ffnNorm = norm(p + "ffn_norm")
			mo := &moe{router: ops.Weight(w.Linear(p+"moe.router", m.Experts, h), m.Experts, h), topK: m.ExpertsPerToken, dim: h}
			if m.MoELatent > 0 {
				mo.dim = m.MoELatent
				mo.latentDown = ops.Weight(w.Linear(p+"moe.latent_down", m.MoELatent, h), m.MoELatent, h)
				mo.latentUp = ops.Weight(w.Output(p+"moe.latent_up", h, m.MoELatent), h, m.MoELatent)
			}
			for e := range m.Experts {
				mo.experts = append(mo.experts, newMLP(ops, w, fmt.Sprintf("%smoe.experts.%d.", p, e), mo.dim, m.MoEIntermediate, gated))
			}
			if m.SharedExperts > 0 {
				width := m.SharedIntermediate
				if width <= 0 {
					width = m.SharedExperts * m.MoEIntermediate
				}
				mo.shared = newMLP(ops, w, p+"moe.shared.", h, width, gated)
			}
			lw.moe = mo
		}
		if l.MTP {
			lw.enorm = norm(p + "mtp.enorm")
			lw.hnorm = norm(p + "mtp.hnorm")
			lw.ehProj = ops.Weight(w.Linear(p+"mtp.eh_proj", h, 2*h), h, 2*h)
		}
		s.layers = append(s.layers, lw)
	}
	return s, nil
}

// Model returns the model the stage was built from (shared slices: do not
// modify).
func (s *Stage) Model() spec.Model { return s.m }

// Range returns the stage's layers [first, last).
func (s *Stage) Range() (first, last int) { return s.first, s.last }

// MTPLayers returns the number of MTP layers the stage runs.
func (s *Stage) MTPLayers() int { return max(0, s.last-max(s.first, s.decEnd)) }

func (s *Stage) isLast() bool { return s.last == len(s.m.Layers) }

// Forward runs the stage's decoder layers on st.Items over ops (an Ops of
// the device that built the stage, holding this step's caches), and on the
// last stage samples, verifies drafts and runs the MTP head. The rows of
// item i are Tokens' positions Pos..Pos+len-1, in item order. Item problems
// (no tokens, Draft outside [0, len), drafts without Sample, token outside
// the vocabulary, position beyond max_position) are *kvcache.Error values
// with Seqs set; a Hidden of the wrong length is a plain error; the mixer
// kernels' errors are returned as they are. The result is the caller's.
func (s *Stage) Forward(ctx context.Context, ops Ops, st Step) (Result, error) {
	rows := 0
	segs := make([]Seg, len(st.Items))
	for i, it := range st.Items {
		if err := s.checkItem(it); err != nil {
			return Result{}, err
		}
		segs[i] = Seg{Seq: it.Seq, Pos: it.Pos, Rows: len(it.Tokens), Draft: it.Draft}
		rows += len(it.Tokens)
	}
	if s.isLast() && st.Drafts > s.MTPLayers() {
		return Result{}, fmt.Errorf("synth: %d drafts per step exceed the %d MTP layers of model %q (one layer per draft depth)",
			st.Drafts, s.MTPLayers(), s.m.Name)
	}
	h := s.m.Hidden
	var x Tensor
	if s.first == 0 {
		toks := make([]int32, 0, rows)
		for _, it := range st.Items {
			toks = append(toks, it.Tokens...)
		}
		x = ops.Embed(s.embed, toks)
	} else {
		hid, err := DecodeHidden(st.Hidden, rows, h)
		if err != nil {
			return Result{}, err
		}
		x = ops.FromHost(hid, rows, h)
	}
	for i := s.first; i < min(s.last, s.decEnd); i++ {
		if err := ctx.Err(); err != nil {
			return Result{}, err
		}
		if err := s.layer(ctx, ops, i, segs, x); err != nil {
			return Result{}, err
		}
	}
	if !s.isLast() {
		hid := ops.ToHost(x)
		return Result{Hidden: EncodeHidden(make([]byte, 0, 4*len(hid)), hid)}, nil
	}
	return Head(ctx, ops, st, x, stageHead{s})
}

func (s *Stage) checkItem(it Item) error {
	n := len(it.Tokens)
	seqs := []kvcache.SeqID{it.Seq}
	switch {
	case n == 0:
		return kvcache.ItemErrorf(seqs, "synth: sequence %d has no tokens", it.Seq)
	case it.TopLogprobs < 0:
		return kvcache.ItemErrorf(seqs, "synth: sequence %d: top logprobs %d must be >= 0", it.Seq, it.TopLogprobs)
	case it.PromptTopLogprobs < 0:
		return kvcache.ItemErrorf(seqs, "synth: sequence %d: prompt top logprobs %d must be >= 0", it.Seq, it.PromptTopLogprobs)
	case it.Pos < 0 || (s.m.MaxPosition > 0 && it.Pos+n > s.m.MaxPosition):
		return kvcache.ItemErrorf(seqs, "synth: sequence %d: positions %d..%d outside [0, max_position %d)", it.Seq, it.Pos, it.Pos+n-1, s.m.MaxPosition)
	}
	for _, t := range it.Tokens {
		if t < 0 || int(t) >= s.m.Vocab {
			return kvcache.ItemErrorf(seqs, "synth: sequence %d: token %d outside the vocabulary [0, %d)", it.Seq, t, s.m.Vocab)
		}
	}
	if err := CheckDrafts("synth", it, s.m.Vocab); err != nil {
		return err
	}
	return CheckSampling(it, s.m.Vocab)
}

// CheckDrafts checks an item's drafts and lookahead for a model with an
// MTP head: Draft in [0, len(Tokens)) and only on a sampling item, the
// Lookahead tokens in [0, vocab). Problems are *kvcache.Error values naming
// the sequence, after who ("synth", "hf").
func CheckDrafts(who string, it Item, vocab int) error {
	n := len(it.Tokens)
	seqs := []kvcache.SeqID{it.Seq}
	switch {
	case it.Draft < 0 || it.Draft >= n:
		return kvcache.ItemErrorf(seqs, "%s: sequence %d: draft %d outside [0, %d) (tokens %d)", who, it.Seq, it.Draft, n, n)
	case it.Draft > 0 && !it.Sample:
		return kvcache.ItemErrorf(seqs, "%s: sequence %d: %d drafts without sample", who, it.Seq, it.Draft)
	}
	for _, t := range it.Lookahead {
		if t < 0 || int(t) >= vocab {
			return kvcache.ItemErrorf(seqs, "%s: sequence %d: lookahead token %d outside the vocabulary [0, %d)", who, it.Seq, t, vocab)
		}
	}
	return nil
}

// CheckSampling checks an item's Sampling (worker.Sampling.Check) and that
// its stop ids and context tokens are in [0, vocab); nil for a greedy item.
// Problems are *kvcache.Error values naming the sequence.
func CheckSampling(it Item, vocab int) error {
	sp := it.Sampling
	if sp == nil {
		return nil
	}
	seqs := []kvcache.SeqID{it.Seq}
	if err := sp.Check(it.Pos, len(it.Tokens)); err != nil {
		return kvcache.ItemErrorf(seqs, "sequence %d: %v", it.Seq, err)
	}
	for name, toks := range map[string][]int32{"stop id": sp.StopIDs, "context token": sp.Context} {
		for _, t := range toks {
			if t < 0 || int(t) >= vocab {
				return kvcache.ItemErrorf(seqs, "sequence %d: sampling %s %d outside the vocabulary [0, %d)", it.Seq, name, t, vocab)
			}
		}
	}
	return nil
}

// layer runs decoder layer i on x in place: x += mixer(norm(x)); x += ffn(norm(x)).
func (s *Stage) layer(ctx context.Context, ops Ops, i int, segs []Seg, x Tensor) error {
	lw := &s.layers[i-s.first]
	if lw.mix != nil {
		out, err := lw.mix.mix(ctx, ops, i, segs, ops.RMSNorm(x, lw.mixNorm, NormEps))
		if err != nil {
			return err
		}
		ops.Add(x, out)
	}
	if lw.spec.FFN != spec.FFNNone {
		in := ops.RMSNorm(x, lw.ffnNorm, NormEps)
		var out Tensor
		if lw.moe != nil {
			out = lw.moe.forward(ops, in)
		} else {
			out = lw.mlp.forward(ops, in)
		}
		ops.Add(x, out)
	}
	return nil
}

// TopLogprobs returns the k most likely tokens of one position from its
// final logits (min(k, the non-NaN logits) of them): the log-softmax
// computed in float64 (logit - log Σ exp over the non-NaN logits, with the
// largest subtracted first), ordered by logit, largest first, ties broken
// by the lower token id, exactly as Ops.Argmax picks the greedy token. So
// the first entry is the greedy token of the row, even where two float32
// logits that differ give the same float64 log-probability. The slice is
// the caller's.
func TopLogprobs(logits []float32, k int) []worker.TokenLogprob {
	if k <= 0 {
		return nil
	}
	lse, ok := logSumExp(logits)
	if !ok {
		return nil // no logit, or all NaN or -Inf
	}
	// The k best by (logit descending, id ascending): a k-wide insertion
	// list, as k is small next to the vocabulary.
	top := make([]worker.TokenLogprob, 0, min(k, len(logits)))
	better := func(a, b int32) bool { // a ranks before b
		return logits[a] > logits[b] || logits[a] == logits[b] && a < b
	}
	for i, x := range logits {
		if x != x {
			continue
		}
		id := int32(i)
		if len(top) == k && !better(id, top[k-1].ID) {
			continue
		}
		if len(top) < k {
			top = append(top, worker.TokenLogprob{})
		}
		j := len(top) - 1
		for j > 0 && better(id, top[j-1].ID) {
			top[j] = top[j-1]
			j--
		}
		top[j] = worker.TokenLogprob{ID: id}
	}
	for i := range top {
		top[i].Logprob = float64(logits[top[i].ID]) - lse
	}
	return top
}

// Verify applies the greedy draft rule to one sampling item: tokens ends
// with draft drafts, and greedy[i] (i = 0..draft) is the greedy token after
// tokens[len-1-draft+i]. Draft i is accepted while it equals greedy[i]; the
// result is the accepted drafts followed by the greedy token after the last
// accepted one, as worker.Output.Tokens expects (len-1 drafts accepted). It
// panics if len(greedy) != draft+1 or draft > len(tokens)-1.
func Verify(tokens []int32, draft int, greedy []int32) []int32 {
	if len(greedy) != draft+1 || draft < 0 || draft > len(tokens)-1 {
		panic(fmt.Sprintf("synth.Verify: %d greedy tokens for %d drafts of %d tokens", len(greedy), draft, len(tokens)))
	}
	d := tokens[len(tokens)-draft:]
	a := 0
	for a < draft && d[a] == greedy[a] {
		a++
	}
	return append(slices.Clone(d[:a]), greedy[a])
}

// HeadModel is what Head needs of a model's last stage: its LM head and its
// MTP depths, over the stage's Ops. The synthetic model implements it, and
// so does a checkpoint's DeepSeek MTP head (package hf), so drafts are
// proposed and verified by one piece of code for both.
type HeadModel interface {
	// Vocab returns the width of the logits.
	Vocab() int
	// Logits returns the main model's logits of rows idx of x (the last
	// decoder layer's output, before the final norm), in idx order.
	Logits(ops Ops, x Tensor, idx []int) Tensor
	// Prompt returns the prompt rows of items from x (PromptRows).
	Prompt(ops Ops, x Tensor, items []Item) []worker.PromptLogprobs
	// MTP runs MTP depth k (1..Step.Drafts) on segs: row j of prev (the
	// previous depth's output, the main model's x for k = 1) paired with
	// the token toks[j], through the depth's MTP layer and its cache. It
	// returns the depth's output, one row per row of prev, before its
	// head's norm.
	MTP(ctx context.Context, ops Ops, k int, segs []Seg, toks []int32, prev Tensor) (Tensor, error)
	// MTPLogits returns depth k's logits of rows idx of its output h.
	MTPLogits(ops Ops, k int, h Tensor, idx []int) Tensor
}

// stageHead is the synthetic model's HeadModel: the shared final norm and
// LM head for the main model and every MTP depth.
type stageHead struct{ s *Stage }

func (h stageHead) Vocab() int { return h.s.m.Vocab }

func (h stageHead) Logits(ops Ops, x Tensor, idx []int) Tensor {
	return ops.MatMul(ops.RMSNorm(ops.Rows(x, idx), h.s.finalNorm, NormEps), h.s.lmHead)
}

func (h stageHead) Prompt(ops Ops, x Tensor, items []Item) []worker.PromptLogprobs {
	return PromptRows(ops, x, h.s.finalNorm, h.s.lmHead, NormEps, h.s.m.Vocab, items)
}

func (h stageHead) MTP(ctx context.Context, ops Ops, k int, segs []Seg, toks []int32, prev Tensor) (Tensor, error) {
	s := h.s
	li := s.decEnd + k - 1
	lw := &s.layers[li-s.first]
	e := ops.RMSNorm(ops.Embed(s.embed, toks), lw.enorm, NormEps)
	cur := ops.MatMul(ops.Concat(e, ops.RMSNorm(prev, lw.hnorm, NormEps)), lw.ehProj)
	if err := s.layer(ctx, ops, li, segs, cur); err != nil {
		return nil, err
	}
	return cur, nil
}

func (h stageHead) MTPLogits(ops Ops, _ int, x Tensor, idx []int) Tensor {
	return h.Logits(ops, x, idx)
}

// Head runs a last stage's sampling, draft verification and MTP head over
// m: x is the main model's output of st's rows (the last decoder layer's,
// before the final norm). Sampling items get the greedy token (or Choose's)
// after their last non-draft row, their drafts verified by Verify; with
// st.Drafts > 0, MTP depths 1..st.Drafts run on every item's kept rows
// (the rows of a prefill chunk, a sampling item's rows up to its last
// accepted draft), so each MTP layer's cache covers exactly the positions
// the main model's does, and each sampling item gets st.Drafts drafts. The
// caller checks st.Drafts against its MTP layers. The result is the
// caller's.
func Head(ctx context.Context, ops Ops, st Step, x Tensor, m HeadModel) (Result, error) {
	res := Result{Prompt: m.Prompt(ops, x, st.Items)}
	type mtpItem struct {
		seq  kvcache.SeqID
		pos  int
		base int     // first row in x
		m    int     // rows kept: all of a prefill chunk, 1 + accepted drafts of a sampling item
		ext  []int32 // Tokens[:m] followed by the next tokens: sampled, lookahead or guessed
		out  int     // index into res.Outputs, or -1
	}
	// The rows whose greedy token is needed: each sampling item's last
	// non-draft row and its draft rows; the last row of a chunk whose MTP
	// head has no lookahead.
	var idx []int
	base := 0
	for _, it := range st.Items {
		n := len(it.Tokens)
		switch {
		case it.Sample:
			for i := range it.Draft + 1 {
				idx = append(idx, base+n-1-it.Draft+i)
			}
		case st.Drafts > 0 && len(it.Lookahead) == 0:
			idx = append(idx, base+n-1)
		}
		base += n
	}
	var greedy []int32
	var lg Tensor
	if len(idx) > 0 {
		lg = m.Logits(ops, x, idx)
		greedy = ops.Argmax(lg)
	}
	// The host has every row of lg when a sampled item, logprobs or top
	// logprobs need them; a sampled item's rows then get Choose's tokens in
	// place of the greedy ones, and its drafts are verified against those.
	var host []float32
	v := m.Vocab()
	if slices.ContainsFunc(st.Items, func(it Item) bool {
		return it.Sample && (!it.Sampling.Greedy() || it.Logprobs || it.TopLogprobs > 0)
	}) {
		host = ops.ToHost(lg)
	}
	g := 0
	for _, it := range st.Items {
		n := len(it.Tokens)
		switch {
		case it.Sample:
			if !it.Sampling.Greedy() {
				for j := range it.Draft + 1 {
					r := n - 1 - it.Draft + j // the row whose next token this is
					greedy[g+j] = Choose(host[(g+j)*v:(g+j+1)*v], it.Sampling, it.Pos+r+1, it.Sampling.Context, it.Tokens[:r+1])
				}
			}
			g += it.Draft + 1
		case st.Drafts > 0 && len(it.Lookahead) == 0:
			g++
		}
	}
	var mi []mtpItem
	var keep []int  // rows of lg whose logits the outputs carry
	var first []int // per output, the row of lg of its first token
	base = 0
	g = 0
	for _, it := range st.Items {
		n := len(it.Tokens)
		if it.Sample {
			firstRow := n - 1 - it.Draft
			toks := Verify(it.Tokens, it.Draft, greedy[g:g+it.Draft+1])
			keep = append(keep, g+len(toks)-1)
			first = append(first, g)
			g += it.Draft + 1
			res.Outputs = append(res.Outputs, worker.Output{Seq: it.Seq, Tokens: toks})
			m := firstRow + len(toks)
			ext := append(slices.Clone(it.Tokens[:m]), toks[len(toks)-1])
			mi = append(mi, mtpItem{seq: it.Seq, pos: it.Pos, base: base, m: m, ext: ext, out: len(res.Outputs) - 1})
		} else if st.Drafts > 0 {
			ext := append(slices.Clone(it.Tokens), it.Lookahead...)
			if len(ext) == n {
				ext = append(ext, greedy[g])
				g++
			}
			mi = append(mi, mtpItem{seq: it.Seq, pos: it.Pos, base: base, m: n, ext: ext, out: -1})
		}
		base += n
	}
	if st.Logits && len(keep) > 0 {
		h := ops.ToHost(ops.Rows(lg, keep))
		for i := range keep {
			res.Outputs[i].Logits = h[i*v : (i+1)*v : (i+1)*v]
		}
	}
	if host != nil {
		o := 0
		for _, it := range st.Items {
			if !it.Sample {
				continue
			}
			out := &res.Outputs[o]
			// Token j of out.Tokens (an accepted draft, then the sampled
			// token) was picked from row first[o]+j.
			for j, tok := range out.Tokens {
				row := host[(first[o]+j)*v : (first[o]+j+1)*v]
				if it.TopLogprobs > 0 {
					out.TopLogprobs = append(out.TopLogprobs, TopLogprobs(row, it.TopLogprobs))
				}
				if it.Logprobs {
					out.Logprobs = append(out.Logprobs, Logprob(row, tok))
				}
			}
			o++
		}
	}
	if st.Drafts == 0 || len(mi) == 0 {
		return res, nil
	}

	// MTP depth k (1..Drafts; the synthetic model's MTP layer decEnd+k-1) runs on the same
	// positions as the kept rows: row j pairs the previous depth's hidden
	// at j (the main model's for k = 1) with the token at j+k, and its
	// output at the last row proposes draft k. Positions never leave the
	// step's rows, so the MTP caches stay inside what the manager reserved.
	var rows []int
	segs := make([]Seg, len(mi))
	for i, it := range mi {
		for j := range it.m {
			rows = append(rows, it.base+j)
		}
		segs[i] = Seg{Seq: it.seq, Pos: it.pos, Rows: it.m}
	}
	prev := ops.Rows(x, rows)
	toks := make([]int32, len(rows))
	for k := 1; k <= st.Drafts; k++ {
		if err := ctx.Err(); err != nil {
			return Result{}, err
		}
		toks = toks[:0]
		for _, it := range mi {
			toks = append(toks, it.ext[k:k+it.m]...)
		}
		cur, err := m.MTP(ctx, ops, k, segs, toks, prev)
		if err != nil {
			return Result{}, err
		}
		// Draft k of each sampling item, and the guess at position m+k of a
		// chunk that has neither lookahead nor sample there (while a later
		// depth needs it).
		var last, who []int
		r := 0
		for i := range mi {
			it := &mi[i]
			r += it.m
			if it.out < 0 && len(it.ext) > it.m+k || k == st.Drafts && it.out < 0 {
				continue
			}
			last = append(last, r-1)
			who = append(who, i)
		}
		if len(last) > 0 {
			d := ops.Argmax(m.MTPLogits(ops, k, cur, last))
			for j, i := range who {
				it := &mi[i]
				if len(it.ext) <= it.m+k {
					it.ext = append(it.ext, d[j])
				}
				if it.out >= 0 {
					res.Outputs[it.out].Drafts = append(res.Outputs[it.out].Drafts, d[j])
				}
			}
		}
		prev = cur
	}
	return res, nil
}
