package synth

import (
	"context"
	"encoding/binary"
	"fmt"
	"hash/fnv"
	"math"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/kvx-dev/kvx/plugins/model"
	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
	"github.com/kvx-dev/kvx/plugins/v1/spec"
	"github.com/kvx-dev/kvx/plugins/v1/worker"

	"github.com/kvx-dev/kvx/plugins/model/tok"
)

// pipe is a model split into stages, each with its own device (as separate
// processes would have).
type pipe struct {
	stages []*Stage
	ops    []*meanOps
}

func newPipe(t *testing.T, m spec.Model, seed uint64, pp int) *pipe {
	t.Helper()
	ranges, err := model.SplitStages(m, pp)
	if err != nil {
		t.Fatal(err)
	}
	p := &pipe{}
	for _, r := range ranges {
		ops := newMeanOps(m.Hidden)
		s, err := New(m, seed, r[0], r[1], testKernels, ops)
		if err != nil {
			t.Fatal(err)
		}
		p.stages = append(p.stages, s)
		p.ops = append(p.ops, ops)
	}
	return p
}

func (p *pipe) forward(t *testing.T, st Step) Result {
	t.Helper()
	var hidden []byte
	for i, s := range p.stages {
		st.Hidden = hidden
		res, err := s.Forward(context.Background(), p.ops[i], st)
		if err != nil {
			t.Fatalf("stage %d Forward: %v", i, err)
		}
		if i < len(p.stages)-1 {
			if res.Hidden == nil || res.Outputs != nil {
				t.Fatalf("stage %d: hidden %d bytes, outputs %v", i, len(res.Hidden), res.Outputs)
			}
		}
		hidden = res.Hidden
		if i == len(p.stages)-1 {
			if res.Hidden != nil {
				t.Fatalf("last stage returned hidden")
			}
			return res
		}
	}
	return Result{}
}

// caches describes, bit for bit, what every mixer layer of every stage
// cached for seq: the inputs the model handed to the mixers, MTP layers
// included.
func (p *pipe) caches(seq kvcache.SeqID) []string {
	var out []string
	for _, m := range p.ops {
		for k, buf := range m.hist {
			if k[1] != uint64(seq) {
				continue
			}
			h := fnv.New64a()
			for _, v := range buf {
				binary.Write(h, binary.LittleEndian, math.Float32bits(v))
			}
			out = append(out, fmt.Sprintf("layer %d: %d rows, fnv %x", k[0], len(buf)/m.cols[k], h.Sum64()))
		}
	}
	slices.Sort(out)
	return out
}

// seqRun is one sequence's progress through a run.
type seqRun struct {
	id     kvcache.SeqID
	prompt []int32
	hist   int     // tokens whose cache is final
	next   []int32 // after the prompt: last sampled token, then drafts
	draft  int
	gen    int
	log    []string                // one line per sampling step: tokens, drafts, logits bits
	stream []int32                 // verified tokens
	lps    [][]worker.TokenLogprob // top logprobs of every verified token
	chosen []float64               // Output.Logprobs of every verified token (sampled runs)
}

// runTopK is the number of top logprobs run asks of every sampling item.
const runTopK = 4

// run drives seqs through p in lockstep (every sequence in every step) with
// prefill chunks of chunk tokens, drafts MTP drafts, for gens generation
// steps each. oracle, if set, replaces the proposed drafts by the true
// greedy continuation (so every draft must be accepted).
func run(t *testing.T, p *pipe, prompts [][]int32, chunk, drafts, gens int, oracle []int32) []*seqRun {
	t.Helper()
	return runSampled(t, p, prompts, chunk, drafts, gens, oracle, nil)
}

// runSampled is run with every sampling item sampled by sp (nil: greedy),
// its Prompt and Context filled in per sequence, and its logprobs asked for.
func runSampled(t *testing.T, p *pipe, prompts [][]int32, chunk, drafts, gens int, oracle []int32, sp *worker.Sampling) []*seqRun {
	t.Helper()
	sampling := func(s *seqRun, pos int) *worker.Sampling {
		if sp == nil {
			return nil
		}
		c := *sp
		c.Prompt = len(s.prompt)
		if c.Penalized() {
			c.Context = append(slices.Clone(s.prompt), s.stream...)[:pos]
		}
		return &c
	}
	var seqs []*seqRun
	for i, pr := range prompts {
		seqs = append(seqs, &seqRun{id: kvcache.SeqID(100 + i), prompt: pr})
	}
	for step := 0; ; step++ {
		var items []Item
		var active []*seqRun
		for _, s := range seqs {
			if s.gen >= gens {
				continue
			}
			active = append(active, s)
			if s.hist < len(s.prompt) {
				end := min(s.hist+chunk, len(s.prompt))
				it := Item{Seq: s.id, Pos: s.hist, Tokens: s.prompt[s.hist:end], Sample: end == len(s.prompt), TopLogprobs: runTopK}
				if it.Sample {
					it.Sampling, it.Logprobs = sampling(s, s.hist), sp != nil
				}
				if !it.Sample {
					it.Lookahead = s.prompt[end:min(end+drafts, len(s.prompt))]
				}
				items = append(items, it)
				continue
			}
			items = append(items, Item{Seq: s.id, Pos: s.hist, Tokens: s.next, Draft: s.draft, Sample: true, TopLogprobs: runTopK,
				Sampling: sampling(s, s.hist), Logprobs: sp != nil})
		}
		if len(items) == 0 {
			return seqs
		}
		res := p.forward(t, Step{Items: items, Drafts: drafts, Logits: true})
		o := 0
		for i, it := range items {
			s := active[i]
			if !it.Sample {
				s.hist += len(it.Tokens)
				continue
			}
			out := res.Outputs[o]
			o++
			if out.Seq != s.id {
				t.Fatalf("output %d for seq %d, want %d", o-1, out.Seq, s.id)
			}
			accepted := len(out.Tokens) - 1
			if accepted > it.Draft {
				t.Fatalf("%d drafts accepted of %d", accepted, it.Draft)
			}
			if oracle != nil && accepted != it.Draft {
				t.Fatalf("step %d: oracle drafts %v: %d accepted, want all %d (tokens %v)", step, it.Tokens[1:], accepted, it.Draft, out.Tokens)
			}
			s.hist += len(it.Tokens) - it.Draft + accepted
			s.stream = append(s.stream, out.Tokens...)
			if len(out.TopLogprobs) != len(out.Tokens) {
				t.Fatalf("step %d: %d top logprob lists for %d tokens", step, len(out.TopLogprobs), len(out.Tokens))
			}
			if sp != nil && len(out.Logprobs) != len(out.Tokens) {
				t.Fatalf("step %d: %d logprobs for %d tokens", step, len(out.Logprobs), len(out.Tokens))
			}
			s.chosen = append(s.chosen, out.Logprobs...)
			for j, l := range out.TopLogprobs {
				if len(l) != runTopK || sp == nil && l[0].ID != out.Tokens[j] {
					t.Fatalf("step %d: token %d: top logprobs %v, want %d led by the token", step, out.Tokens[j], l, runTopK)
				}
			}
			s.lps = append(s.lps, out.TopLogprobs...)
			bits := make([]uint32, len(out.Logits))
			for j, v := range out.Logits {
				bits[j] = math.Float32bits(v)
			}
			s.log = append(s.log, fmt.Sprintf("pos %d tokens %v drafts %v logits %x", s.hist, out.Tokens, out.Drafts, bits))
			if len(out.Drafts) != drafts {
				t.Fatalf("%d drafts proposed, want %d", len(out.Drafts), drafts)
			}
			d := out.Drafts
			if oracle != nil {
				n := len(s.stream)
				d = oracle[n : n+drafts]
			}
			s.next = append([]int32{out.Tokens[len(out.Tokens)-1]}, d...)
			s.draft = len(d)
			s.gen++
		}
	}
}

func synthModel(t *testing.T, preset string, s model.SyntheticSpec) spec.Model {
	t.Helper()
	base, err := model.Load(preset)
	if err != nil {
		t.Fatal(err)
	}
	m, err := model.Synthetic(base, s)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// One stage or two (hidden passed as bytes), one prefill chunk or chunks of
// 1 and 7, alone or batched with another sequence: the logits, verified
// tokens and MTP drafts of every sampling step are bit-identical.
func TestSplitChunkBatchInvariance(t *testing.T) {
	for _, preset := range []string{"llama-3.1-8b", "deepseek-v3.2", "nemotron-3-super-120b-a12b-fp8", "qwen3-next-80b-a3b-thinking"} {
		t.Run(preset, func(t *testing.T) {
			m := synthModel(t, preset, model.SyntheticSpec{})
			drafts := min(m.NumNextN, 1)
			prompt := tok.EncodeBytes("kvx: bit-identical whatever the split")
			other := tok.EncodeBytes("another sequence in the same batch")
			type variant struct {
				pp, chunk int
				batched   bool
			}
			var ref []string
			for _, v := range []variant{{1, 1 << 20, false}, {2, 7, false}, {1, 1, false}, {2, 1, true}, {1, 7, true}} {
				p := newPipe(t, m, 42, v.pp)
				prompts := [][]int32{prompt}
				if v.batched {
					prompts = append(prompts, other)
				}
				got := run(t, p, prompts, v.chunk, drafts, 6, nil)[0].log
				got = append(got, p.caches(100)...)
				if ref == nil {
					ref = got
					continue
				}
				if !slices.Equal(got, ref) {
					t.Errorf("variant %+v:\n%s\nwant (one stage, one chunk):\n%s", v, got, ref)
				}
			}
		})
	}
}

// Speculative decoding never changes the verified stream: with the MTP
// head's own drafts, with drafts that are the true continuation (all
// accepted) and without drafts, the streams are equal, and the logits of
// random weights are finite and not degenerate.
func TestDraftsKeepGreedyStream(t *testing.T) {
	for _, preset := range []string{"deepseek-v3", "nemotron-3-super-120b-a12b-fp8"} {
		t.Run(preset, func(t *testing.T) {
			ov := model.SyntheticSpec{MTPLayers: 2}
			if preset == "nemotron-3-super-120b-a12b-fp8" {
				ov.MoELatent = 80 // wider than hidden 64
			}
			m := synthModel(t, preset, ov)
			prompt := tok.EncodeBytes("speculative decoding")
			plain := run(t, newPipe(t, m, 3, 1), [][]int32{prompt}, 5, 0, 12, nil)[0]
			mtp := run(t, newPipe(t, m, 3, 2), [][]int32{prompt}, 5, 2, 6, nil)[0]
			n := min(len(plain.stream), len(mtp.stream))
			if !slices.Equal(mtp.stream[:n], plain.stream[:n]) {
				t.Errorf("MTP drafts stream %v, want greedy %v", mtp.stream[:n], plain.stream[:n])
			}
			// An accepted draft's top logprobs are its verifying row's: those
			// of the same token sampled without drafts, bit for bit.
			if !reflect.DeepEqual(mtp.lps[:n], plain.lps[:n]) {
				t.Errorf("MTP drafts top logprobs %v, want those without drafts %v", mtp.lps[:n], plain.lps[:n])
			}
			oracle := run(t, newPipe(t, m, 3, 1), [][]int32{prompt}, 5, 2, 3, plain.stream)[0]
			if len(oracle.stream) != 1+3*2 {
				t.Errorf("oracle drafts: %d tokens in 3 steps + prefill, want 7 (all drafts accepted)", len(oracle.stream))
			}
			if !slices.Equal(oracle.stream, plain.stream[:len(oracle.stream)]) {
				t.Errorf("oracle stream %v, want %v", oracle.stream, plain.stream[:len(oracle.stream)])
			}
			if !reflect.DeepEqual(oracle.lps, plain.lps[:len(oracle.lps)]) {
				t.Errorf("oracle drafts top logprobs %v, want %v", oracle.lps, plain.lps[:len(oracle.lps)])
			}
			if distinct := len(slices.Compact(slices.Sorted(slices.Values(plain.stream)))); distinct < 2 {
				t.Errorf("greedy stream %v is constant: weights degenerate", plain.stream)
			}
		})
	}
}

// Activations stay in a sane range through the stack (the init rule).
func TestActivationScale(t *testing.T) {
	m := synthModel(t, "llama-3.1-8b", model.SyntheticSpec{Layers: 16})
	ops := newMeanOps(m.Hidden)
	s, err := New(m, 1, 0, len(m.Layers)-1, testKernels, ops)
	if err != nil {
		t.Fatal(err)
	}
	toks := tok.EncodeBytes("scale check")
	res, err := s.Forward(context.Background(), ops, Step{Items: []Item{{Seq: 1, Tokens: toks}}})
	if err != nil {
		t.Fatal(err)
	}
	h, err := DecodeHidden(res.Hidden, len(toks), m.Hidden)
	if err != nil {
		t.Fatal(err)
	}
	var ss float64
	for _, v := range h {
		ss += float64(v) * float64(v)
	}
	if rms := math.Sqrt(ss / float64(len(h))); !(rms > 0.3 && rms < 10) {
		t.Errorf("hidden rms after 15 layers = %v, want within (0.3, 10)", rms)
	}
}

func TestForwardErrors(t *testing.T) {
	m := synthModel(t, "deepseek-v3", model.SyntheticSpec{})
	mix := newMeanOps(m.Hidden)
	s, err := New(m, 1, 0, len(m.Layers), testKernels, mix)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		st   Step
		want string
	}{
		{"empty", Step{Items: []Item{{Seq: 1}}}, "synth: sequence 1 has no tokens"},
		{"draft range", Step{Items: []Item{{Seq: 2, Tokens: []int32{1}, Draft: 1, Sample: true}}}, "synth: sequence 2: draft 1 outside [0, 1)"},
		{"draft without sample", Step{Items: []Item{{Seq: 3, Tokens: []int32{1, 2}, Draft: 1}}}, "synth: sequence 3: 1 drafts without sample"},
		{"vocab", Step{Items: []Item{{Seq: 4, Tokens: []int32{258}}}}, "synth: sequence 4: token 258 outside the vocabulary [0, 258)"},
		{"position", Step{Items: []Item{{Seq: 5, Pos: 4095, Tokens: []int32{1, 2}}}}, "synth: sequence 5: positions 4095..4096 outside [0, max_position 4096)"},
		{"too many drafts", Step{Items: []Item{{Seq: 6, Tokens: []int32{1}, Sample: true}}, Drafts: 2}, "synth: 2 drafts per step exceed the 1 MTP layers"},
	}
	for _, tt := range tests {
		_, err := s.Forward(context.Background(), mix, tt.st)
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: Forward = %v, want %q", tt.name, err, tt.want)
		}
	}
	s2, err := New(m, 1, 1, len(m.Layers), testKernels, mix)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s2.Forward(context.Background(), mix, Step{Items: []Item{{Seq: 1, Tokens: []int32{1, 2}}}, Hidden: make([]byte, 12)}); err == nil ||
		!strings.Contains(err.Error(), "hidden activations are 12 bytes, want 512") {
		t.Errorf("short hidden: Forward = %v", err)
	}
	for _, r := range [][2]int{{0, 0}, {2, 1}, {0, len(m.Layers) + 1}, {-1, 2}} {
		if _, err := New(m, 1, r[0], r[1], testKernels, mix); err == nil || !strings.Contains(err.Error(), "are not a non-empty range") {
			t.Errorf("New(%v) = %v, want a range error", r, err)
		}
	}
	m2 := synthModel(t, "deepseek-v3", model.SyntheticSpec{MTPLayers: 2})
	if _, err := New(m2, 1, 0, len(m2.Layers)-1, testKernels, mix); err == nil || !strings.Contains(err.Error(), "MTP layers are on the last stage") {
		t.Errorf("New(MTP layer on a middle stage) = %v", err)
	}
	if _, err := New(m, 1, 0, len(m.Layers)-1, testKernels, mix); err != nil {
		t.Errorf("New(decoder only) = %v", err)
	}
	m.Vocab = 100
	if _, err := New(m, 1, 0, 1, testKernels, mix); err == nil || !strings.Contains(err.Error(), "vocab 100 is less than 258") {
		t.Errorf("New(vocab 100) = %v", err)
	}
}

// BenchmarkPrefill is one 256-token prefill chunk through the default
// synthetic DeepSeek-V3.2 (MoE, MTP) with the test mixers, one stage.
func BenchmarkPrefill(b *testing.B) {
	base, err := model.Load("deepseek-v3.2")
	if err != nil {
		b.Fatal(err)
	}
	m, err := model.Synthetic(base, model.SyntheticSpec{})
	if err != nil {
		b.Fatal(err)
	}
	s, err := New(m, 1, 0, len(m.Layers), testKernels, newMeanOps(m.Hidden))
	if err != nil {
		b.Fatal(err)
	}
	toks := make([]int32, 256)
	for i := range toks {
		toks[i] = int32(i % 256)
	}
	b.ResetTimer()
	for range b.N {
		mix := newMeanOps(m.Hidden)
		if _, err := s.Forward(context.Background(), mix, Step{Items: []Item{{Seq: 1, Tokens: toks, Sample: true}}, Drafts: 1}); err != nil {
			b.Fatal(err)
		}
	}
}
