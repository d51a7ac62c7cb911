// Package synth is the math of kvx's synthetic models on the cpu device:
// seeded random weights shaped by a (scaled-down) spec.Model, a byte-level
// tokenizer, embeddings, RMSNorm, dense and MoE FFNs, the final norm and LM
// head, greedy sampling with draft verification, and a DeepSeek-V3 style MTP
// head. Token mixers (attention, Mamba2) are not here: the model calls them
// through the Mixer interface, which the cpu device implements with the paged
// kernels of device/cpu/kernel.
//
// Every function is deterministic with a fixed summation order (the order of
// kernel.Dot), parallel only across independent outputs, so a stage's
// results are bit-identical whatever the batching, chunking, pipeline split
// or process, given a Mixer that keeps its own contract.
package synth

import (
	"context"
	"fmt"
	"runtime"
	"slices"
	"sync"

	"github.com/kvx-dev/kvx/device/cpu/kernel"
	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
	"github.com/kvx-dev/kvx/plugins/v1/spec"
	"github.com/kvx-dev/kvx/plugins/v1/worker"
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
}

// ItemsFrom converts worker items (no Lookahead: the v1 contract has none).
func ItemsFrom(items []worker.Item) []Item {
	out := make([]Item, len(items))
	for i, it := range items {
		out[i] = Item{Seq: it.Seq, Pos: it.Pos, Tokens: it.Tokens, Draft: it.Draft, Sample: it.Sample}
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
}

type layerW struct {
	spec             spec.Layer
	mixNorm, ffnNorm []float32
	mlp              *mlp
	moe              *moe
	enorm, hnorm     []float32 // MTP: norms of the token embedding and of the hidden input
	ehProj           []float32 // MTP: Hidden × 2·Hidden, input [enorm(emb) ; hnorm(h)]
}

// Stage runs layers [First, Last) of a synthetic model. Stage 0 embeds
// tokens; the stage that holds the last layer applies the final norm and the
// (untied) LM head, samples greedily, verifies drafts and runs the MTP layers
// (which are always last in spec.Model.Layers). A Stage holds only weights:
// it is immutable after New and safe for concurrent use with distinct Mixers.
type Stage struct {
	m           spec.Model
	first, last int
	decEnd      int // index of the first MTP layer
	w           Weights
	embed       []float32
	finalNorm   []float32
	lmHead      []float32
	layers      []layerW // [first, last)
	maxInter    int
}

// New builds the weights of layers [first, last) of m from seed (eagerly).
// It fails, naming the value and the limit, when the range is empty or out
// of m, an MTP layer would sit on a stage that is not the last, or m lacks
// a dimension its layers need (vocab >= 258, hidden, intermediate, experts).
func New(m spec.Model, seed uint64, first, last int) (*Stage, error) {
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
	case m.Vocab < MinVocab:
		return nil, fmt.Errorf("synth: model %q: vocab %d is less than %d (256 bytes + BOS + EOS)", m.Name, m.Vocab, MinVocab)
	}
	s := &Stage{m: m, first: first, last: last, decEnd: decEnd, w: Weights{Seed: seed, Layers: decEnd}}
	h := m.Hidden
	gated := m.Arch != archNemotronH
	if first == 0 || (last == n && m.NumNextN > 0) {
		s.embed = s.w.Embedding("embed", m.Vocab, h)
	}
	if last == n {
		s.finalNorm = s.w.Norm("norm", h)
		s.lmHead = s.w.Linear("lm_head", m.Vocab, h)
	}
	for i := first; i < last; i++ {
		l := m.Layers[i]
		p := LayerName(i)
		lw := layerW{spec: l}
		if l.Mixer != spec.MixerNone {
			lw.mixNorm = s.w.Norm(p+"mixer_norm", h)
		}
		switch l.FFN {
		case spec.FFNDense:
			if m.Intermediate <= 0 {
				return nil, fmt.Errorf("synth: model %q layer %d is dense but intermediate is %d", m.Name, i, m.Intermediate)
			}
			lw.ffnNorm = s.w.Norm(p+"ffn_norm", h)
			lw.mlp = newMLP(s.w, p+"mlp.", h, m.Intermediate, gated)
			s.maxInter = max(s.maxInter, m.Intermediate)
		case spec.FFNMoE:
			if m.Experts <= 0 || m.MoEIntermediate <= 0 || m.ExpertsPerToken < 1 || m.ExpertsPerToken > m.Experts {
				return nil, fmt.Errorf("synth: model %q layer %d is MoE but experts %d, moe_intermediate %d, experts_per_token %d (want >= 1, >= 1, 1..experts)",
					m.Name, i, m.Experts, m.MoEIntermediate, m.ExpertsPerToken)
			}
			lw.ffnNorm = s.w.Norm(p+"ffn_norm", h)
			mo := &moe{router: s.w.Linear(p+"moe.router", m.Experts, h), topK: m.ExpertsPerToken}
			dim := h
			if m.MoELatent > 0 {
				dim = m.MoELatent
				mo.latentDown = s.w.Linear(p+"moe.latent_down", dim, h)
				mo.latentUp = s.w.Output(p+"moe.latent_up", h, dim)
			}
			for e := range m.Experts {
				mo.experts = append(mo.experts, newMLP(s.w, fmt.Sprintf("%smoe.experts.%d.", p, e), dim, m.MoEIntermediate, gated))
			}
			s.maxInter = max(s.maxInter, m.MoEIntermediate)
			if m.SharedExperts > 0 {
				width := m.SharedIntermediate
				if width <= 0 {
					width = m.SharedExperts * m.MoEIntermediate
				}
				mo.shared = newMLP(s.w, p+"moe.shared.", h, width, gated)
				s.maxInter = max(s.maxInter, width)
			}
			lw.moe = mo
		}
		if l.MTP {
			lw.enorm = s.w.Norm(p+"mtp.enorm", h)
			lw.hnorm = s.w.Norm(p+"mtp.hnorm", h)
			lw.ehProj = s.w.Linear(p+"mtp.eh_proj", h, 2*h)
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

// Weights returns the generator the stage drew its tensors from, for Mixers.
func (s *Stage) Weights() Weights { return s.w }

// MTPLayers returns the number of MTP layers the stage runs.
func (s *Stage) MTPLayers() int { return max(0, s.last-max(s.first, s.decEnd)) }

func (s *Stage) isLast() bool { return s.last == len(s.m.Layers) }

// scratch is per-row scratch space for the FFNs.
type scratch struct {
	a, b, y, router []float32
	lat, latAcc     []float32 // latent MoE input and output
}

func (s *Stage) newScratch() *scratch {
	return &scratch{a: make([]float32, s.maxInter), b: make([]float32, s.maxInter), y: make([]float32, max(s.m.Hidden, s.m.MoELatent)),
		router: make([]float32, max(s.m.Experts, 1)), lat: make([]float32, s.m.MoELatent), latAcc: make([]float32, s.m.MoELatent)}
}

// Forward runs the stage's decoder layers on st.Items, calling mix for every
// mixer layer, and on the last stage samples, verifies drafts and runs the
// MTP head. The rows of item i are Tokens' positions Pos..Pos+len-1, in item
// order. Item problems (no tokens, Draft outside [0, len), drafts without
// Sample, token outside the vocabulary, position beyond max_position) are
// *kvcache.Error values with Seqs set; a Hidden of the wrong length is a
// plain error; the Mixer's errors are returned as they are. The result is
// the caller's.
func (s *Stage) Forward(ctx context.Context, mix Mixer, st Step) (Result, error) {
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
	var x []float32
	if s.first == 0 {
		x = make([]float32, 0, rows*h)
		for _, it := range st.Items {
			for _, t := range it.Tokens {
				x = append(x, s.embed[int(t)*h:(int(t)+1)*h]...)
			}
		}
	} else {
		var err error
		if x, err = DecodeHidden(st.Hidden, rows, h); err != nil {
			return Result{}, err
		}
	}
	for i := s.first; i < min(s.last, s.decEnd); i++ {
		if err := ctx.Err(); err != nil {
			return Result{}, err
		}
		if err := s.layer(ctx, mix, i, segs, x); err != nil {
			return Result{}, err
		}
	}
	if !s.isLast() {
		return Result{Hidden: EncodeHidden(make([]byte, 0, 4*len(x)), x)}, nil
	}
	return s.head(ctx, mix, st, x)
}

func (s *Stage) checkItem(it Item) error {
	n := len(it.Tokens)
	seqs := []kvcache.SeqID{it.Seq}
	switch {
	case n == 0:
		return kvcache.ItemErrorf(seqs, "synth: sequence %d has no tokens", it.Seq)
	case it.Draft < 0 || it.Draft >= n:
		return kvcache.ItemErrorf(seqs, "synth: sequence %d: draft %d outside [0, %d) (tokens %d)", it.Seq, it.Draft, n, n)
	case it.Draft > 0 && !it.Sample:
		return kvcache.ItemErrorf(seqs, "synth: sequence %d: %d drafts without sample", it.Seq, it.Draft)
	case it.Pos < 0 || (s.m.MaxPosition > 0 && it.Pos+n > s.m.MaxPosition):
		return kvcache.ItemErrorf(seqs, "synth: sequence %d: positions %d..%d outside [0, max_position %d)", it.Seq, it.Pos, it.Pos+n-1, s.m.MaxPosition)
	}
	for _, toks := range [][]int32{it.Tokens, it.Lookahead} {
		for _, t := range toks {
			if t < 0 || int(t) >= s.m.Vocab {
				return kvcache.ItemErrorf(seqs, "synth: sequence %d: token %d outside the vocabulary [0, %d)", it.Seq, t, s.m.Vocab)
			}
		}
	}
	return nil
}

// layer runs decoder layer i on x in place: x += mixer(norm(x)); x += ffn(norm(x)).
func (s *Stage) layer(ctx context.Context, mix Mixer, i int, segs []Seg, x []float32) error {
	lw := &s.layers[i-s.first]
	h := s.m.Hidden
	rows := len(x) / h
	if lw.spec.Mixer != spec.MixerNone {
		in := make([]float32, len(x))
		for r := range rows {
			kernel.RMSNorm(in[r*h:(r+1)*h], x[r*h:(r+1)*h], lw.mixNorm, NormEps)
		}
		out := make([]float32, len(x))
		if err := mix.Mix(ctx, i, segs, in, out); err != nil {
			return err
		}
		for j := range x {
			x[j] += out[j]
		}
	}
	if lw.spec.FFN != spec.FFNNone {
		// Rows are independent: split them over goroutines, each row computed
		// whole by one of them, so the split cannot change a bit.
		work := rows * h * 3 * max(s.m.Intermediate, s.m.MoEIntermediate*(s.m.ExpertsPerToken+s.m.SharedExperts))
		parallelRows(rows, work, func(lo, hi int) {
			sc := s.newScratch()
			in := make([]float32, h)
			out := make([]float32, h)
			for r := lo; r < hi; r++ {
				row := x[r*h : (r+1)*h]
				kernel.RMSNorm(in, row, lw.ffnNorm, NormEps)
				if lw.moe != nil {
					lw.moe.forward(out, in, sc)
				} else {
					lw.mlp.forward(out, in, sc.a[:lw.mlp.inter], sc.b[:lw.mlp.inter])
				}
				for j := range row {
					row[j] += out[j]
				}
			}
		})
	}
	return nil
}

// parallelMin is the multiply-adds below which parallelRows stays on the
// calling goroutine.
const parallelMin = 1 << 16

// parallelRows calls fn on contiguous row ranges covering [0, rows), on up
// to GOMAXPROCS goroutines when work (multiply-adds) is large enough.
func parallelRows(rows, work int, fn func(lo, hi int)) {
	workers := min(runtime.GOMAXPROCS(0), rows)
	if workers <= 1 || work < parallelMin {
		fn(0, rows)
		return
	}
	var wg sync.WaitGroup
	for w := range workers {
		lo, hi := w*rows/workers, (w+1)*rows/workers
		wg.Add(1)
		go func() {
			defer wg.Done()
			fn(lo, hi)
		}()
	}
	wg.Wait()
}

// logits returns the final norm and LM head of one hidden row.
func (s *Stage) logits(row []float32) []float32 {
	n := make([]float32, len(row))
	kernel.RMSNorm(n, row, s.finalNorm, NormEps)
	out := make([]float32, s.m.Vocab)
	kernel.MatVec(out, s.lmHead, n)
	return out
}

// Greedy returns the token with the largest logit, the lowest id among
// equals (kernel.Argmax); -1 when logits is empty or all NaN.
func Greedy(logits []float32) int32 { return int32(kernel.Argmax(logits)) }

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

// head runs the last stage's sampling, verification and MTP head. x is the
// main model's final hidden (before the final norm).
func (s *Stage) head(ctx context.Context, mix Mixer, st Step, x []float32) (Result, error) {
	h := s.m.Hidden
	var res Result
	type mtpItem struct {
		seq  kvcache.SeqID
		pos  int
		base int     // first row in x
		m    int     // rows kept: all of a prefill chunk, 1 + accepted drafts of a sampling item
		ext  []int32 // Tokens[:m] followed by the next tokens: sampled, lookahead or guessed
		out  int     // index into res.Outputs, or -1
	}
	var mi []mtpItem
	base := 0
	for _, it := range st.Items {
		n := len(it.Tokens)
		if it.Sample {
			first := n - 1 - it.Draft
			greedy := make([]int32, it.Draft+1)
			var lg [][]float32
			for i := range greedy {
				l := s.logits(x[(base+first+i)*h : (base+first+i+1)*h])
				greedy[i] = Greedy(l)
				lg = append(lg, l)
			}
			toks := Verify(it.Tokens, it.Draft, greedy)
			o := worker.Output{Seq: it.Seq, Tokens: toks}
			if st.Logits {
				o.Logits = lg[len(toks)-1]
			}
			res.Outputs = append(res.Outputs, o)
			m := first + len(toks)
			ext := append(slices.Clone(it.Tokens[:m]), toks[len(toks)-1])
			mi = append(mi, mtpItem{seq: it.Seq, pos: it.Pos, base: base, m: m, ext: ext, out: len(res.Outputs) - 1})
		} else if st.Drafts > 0 {
			ext := append(slices.Clone(it.Tokens), it.Lookahead...)
			if len(ext) == n {
				ext = append(ext, Greedy(s.logits(x[(base+n-1)*h:(base+n)*h])))
			}
			mi = append(mi, mtpItem{seq: it.Seq, pos: it.Pos, base: base, m: n, ext: ext, out: -1})
		}
		base += len(it.Tokens)
	}
	if st.Drafts == 0 || len(mi) == 0 {
		return res, nil
	}

	// MTP depth k (1..Drafts) runs MTP layer decEnd+k-1 on the same
	// positions as the kept rows: row j pairs the previous depth's hidden
	// at j (the main model's for k = 1) with the token at j+k, and its
	// output at the last row proposes draft k. Positions never leave the
	// step's rows, so the MTP caches stay inside what the manager reserved.
	rows := 0
	for _, it := range mi {
		rows += it.m
	}
	prev := make([]float32, 0, rows*h)
	for _, it := range mi {
		prev = append(prev, x[it.base*h:(it.base+it.m)*h]...)
	}
	segs := make([]Seg, len(mi))
	for i, it := range mi {
		segs[i] = Seg{Seq: it.seq, Pos: it.pos, Rows: it.m}
	}
	cat := make([]float32, 2*h)
	for k := 1; k <= st.Drafts; k++ {
		if err := ctx.Err(); err != nil {
			return Result{}, err
		}
		li := s.decEnd + k - 1
		lw := &s.layers[li-s.first]
		cur := make([]float32, rows*h)
		r := 0
		for _, it := range mi {
			for j := range it.m {
				t := int(it.ext[j+k])
				kernel.RMSNorm(cat[:h], s.embed[t*h:(t+1)*h], lw.enorm, NormEps)
				kernel.RMSNorm(cat[h:], prev[r*h:(r+1)*h], lw.hnorm, NormEps)
				kernel.MatVec(cur[r*h:(r+1)*h], lw.ehProj, cat)
				r++
			}
		}
		if err := s.layer(ctx, mix, li, segs, cur); err != nil {
			return Result{}, err
		}
		r = 0
		for i := range mi {
			it := &mi[i]
			r += it.m
			if it.out < 0 && len(it.ext) > it.m+k || k == st.Drafts && it.out < 0 {
				continue
			}
			d := Greedy(s.logits(cur[(r-1)*h : r*h]))
			if len(it.ext) <= it.m+k {
				it.ext = append(it.ext, d)
			}
			if it.out >= 0 {
				res.Outputs[it.out].Drafts = append(res.Outputs[it.out].Drafts, d)
			}
		}
		prev = cur
	}
	return res, nil
}
