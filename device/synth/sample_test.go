package synth

import (
	"math"
	"slices"
	"testing"

	"github.com/kvx-dev/kvx/plugins/model"
	"github.com/kvx-dev/kvx/plugins/v1/worker"

	"github.com/kvx-dev/kvx/plugins/model/tok"
)

// logitsOf returns logits whose softmax is probs (log of each).
func logitsOf(probs ...float64) []float32 {
	l := make([]float32, len(probs))
	for i, p := range probs {
		l[i] = float32(math.Log(p))
	}
	return l
}

// draws counts the tokens Choose picks at positions 0..n-1.
func draws(logits []float32, s worker.Sampling, n int) map[int32]int {
	c := map[int32]int{}
	for pos := range n {
		c[Choose(logits, &s, pos)]++
	}
	return c
}

func TestUniform(t *testing.T) {
	seen := map[float64]bool{}
	var sum float64
	const n = 20000
	for pos := range n {
		u := Uniform(7, pos)
		if u < 0 || u >= 1 {
			t.Fatalf("Uniform(7, %d) = %v, want in [0, 1)", pos, u)
		}
		if Uniform(7, pos) != u {
			t.Fatalf("Uniform(7, %d) is not a function of its arguments", pos)
		}
		seen[u] = true
		sum += u
	}
	if len(seen) != n {
		t.Errorf("%d distinct values of %d positions", len(seen), n)
	}
	if mean := sum / n; math.Abs(mean-0.5) > 0.01 {
		t.Errorf("mean of %d draws = %v, want 0.5 ± 0.01", n, mean)
	}
	if Uniform(7, 3) == Uniform(8, 3) || Uniform(0, 0) == Uniform(0, 1) {
		t.Errorf("Uniform does not depend on the seed or the position")
	}
}

// TestChooseGreedy: a nil Sampling, a zero one and temperature 0 pick the
// largest logit, the lower id among equals, NaN never.
func TestChooseGreedy(t *testing.T) {
	l := []float32{1, float32(math.NaN()), 3, 3, -2}
	for _, s := range []*worker.Sampling{nil, {}, {Seed: 5}, {TopK: 1, TopP: 0.1}} {
		if got := Choose(l, s, 9); got != 2 {
			t.Errorf("Choose(%v, %+v) = %d, want 2", l, s, got)
		}
	}
	// Temperature > 0 with top_k 1 is greedy too.
	for pos := range 50 {
		if got := Choose(l, &worker.Sampling{Temperature: 2, TopK: 1, Seed: 3}, pos); got != 2 {
			t.Fatalf("top_k 1 at pos %d = %d, want 2", pos, got)
		}
	}
}

// TestChooseDistribution: at temperature 1 the draws follow the softmax;
// temperature 0.5 sharpens it (p² renormalized); top_k, top_p and min_p
// keep exactly the tokens their rules name.
func TestChooseDistribution(t *testing.T) {
	const n = 40000
	l := logitsOf(0.5, 0.3, 0.15, 0.05)
	check := func(name string, s worker.Sampling, want []float64) {
		t.Helper()
		c := draws(l, s, n)
		for id, p := range want {
			got := float64(c[int32(id)]) / n
			if math.Abs(got-p) > 0.012 || p == 0 && c[int32(id)] != 0 {
				t.Errorf("%s: token %d drawn %.4f of the time, want %.4f (counts %v)", name, id, got, p, c)
			}
		}
	}
	check("temperature 1", worker.Sampling{Temperature: 1, Seed: 1}, []float64{0.5, 0.3, 0.15, 0.05})
	sq := []float64{0.25, 0.09, 0.0225, 0.0025}
	var z float64
	for _, v := range sq {
		z += v
	}
	for i := range sq {
		sq[i] /= z
	}
	check("temperature 0.5", worker.Sampling{Temperature: 0.5, Seed: 2}, sq)
	check("top_k 2", worker.Sampling{Temperature: 1, TopK: 2, Seed: 3}, []float64{0.625, 0.375, 0, 0})
	// top_p 0.7: 0.5 < 0.7 <= 0.5+0.3, so the first two.
	check("top_p 0.7", worker.Sampling{Temperature: 1, TopP: 0.7, Seed: 4}, []float64{0.625, 0.375, 0, 0})
	check("top_p 0.5", worker.Sampling{Temperature: 1, TopP: 0.5, Seed: 4}, []float64{1, 0, 0, 0})
	// min_p 0.25: tokens below 0.25 × 0.5 = 0.125 go.
	check("min_p 0.25", worker.Sampling{Temperature: 1, MinP: 0.25, Seed: 5}, []float64{0.5 / 0.95, 0.3 / 0.95, 0.15 / 0.95, 0})
	// The same (seed, position) picks the same token; another seed, other tokens.
	a, b := worker.Sampling{Temperature: 1, Seed: 10}, worker.Sampling{Temperature: 1, Seed: 11}
	same, diff := 0, 0
	for pos := range 200 {
		if Choose(l, &a, pos) == Choose(l, &a, pos) {
			same++
		}
		if Choose(l, &a, pos) != Choose(l, &b, pos) {
			diff++
		}
	}
	if same != 200 || diff == 0 {
		t.Errorf("same seed: %d of 200 positions equal (want all); other seed: %d differ (want some)", same, diff)
	}
}

// TestChooseMinTokensAndPenalties: min_tokens masks the stop ids until
// enough tokens follow the prompt; the repetition penalty reaches prompt
// and generated tokens, presence and frequency only generated ones.
func TestChooseMinTokensAndPenalties(t *testing.T) {
	l := []float32{1, 5, 2, 0.5}
	s := worker.Sampling{MinTokens: 2, StopIDs: []int32{1}, Prompt: 10}
	for pos, want := range map[int]int32{10: 2, 11: 2, 12: 1, 20: 1} {
		if got := Choose(l, &s, pos); got != want {
			t.Errorf("min_tokens 2, prompt 10, pos %d: %d, want %d", pos, got, want)
		}
	}
	// Repetition 3 on token 1 (in the prompt): 5/3 < 2, so token 2 wins.
	rep := worker.Sampling{RepetitionPenalty: 3, Prompt: 2}
	if got := Choose(l, &rep, 3, []int32{1, 0}, []int32{3}); got != 2 {
		t.Errorf("repetition penalty on a prompt token: %d, want 2", got)
	}
	// A negative logit is multiplied: token 0's -0.5 × 4 falls below token 1's -1.
	neg := []float32{-0.5, -1, -3}
	if got := Choose(neg, &worker.Sampling{RepetitionPenalty: 4, Prompt: 0}, 1, []int32{0}); got != 1 {
		t.Errorf("repetition penalty on a negative logit: %d, want 1 (-0.5 × 4 < -1)", got)
	}
	// Presence 4 on token 1 counts only generated tokens (positions >= Prompt).
	pres := worker.Sampling{PresencePenalty: 4, Prompt: 2}
	if got := Choose(l, &pres, 2, []int32{1, 1}); got != 1 {
		t.Errorf("presence penalty, token 1 only in the prompt: %d, want 1", got)
	}
	if got := Choose(l, &pres, 3, []int32{1, 1}, []int32{1}); got != 2 {
		t.Errorf("presence penalty 4, token 1 generated once: %d, want 2 (5-4 = 1 < 2)", got)
	}
	freq := worker.Sampling{FrequencyPenalty: 1, Prompt: 0}
	if got := Choose(l, &freq, 3, []int32{1, 1, 1}); got != 1 {
		t.Errorf("frequency penalty 1, token 1 three times: %d, want 1 (5-3 = 2 ties token 2: the lower id)", got)
	}
	if got := Choose(l, &freq, 4, []int32{1, 1, 1, 1}); got != 2 {
		t.Errorf("frequency penalty 1, token 1 four times: %d, want 2 (5-4 = 1 < 2)", got)
	}
	if !slices.Equal(l, []float32{1, 5, 2, 0.5}) {
		t.Errorf("Choose modified the logits: %v", l)
	}
}

// TestLogprobMatchesTopLogprobs: Logprob is TopLogprobs' value, bit for bit.
func TestLogprobMatchesTopLogprobs(t *testing.T) {
	l := []float32{0.25, -3, 7.5, float32(math.NaN()), 7.5, 1e-3}
	for _, e := range TopLogprobs(l, 5) {
		if got := Logprob(l, e.ID); math.Float64bits(got) != math.Float64bits(e.Logprob) {
			t.Errorf("Logprob(%d) = %v, TopLogprobs says %v", e.ID, got, e.Logprob)
		}
	}
	if got := Logprob(l, 3); !math.IsInf(got, -1) {
		t.Errorf("Logprob of a NaN logit = %v, want -Inf", got)
	}
}

// TestDraftsKeepSampledStream: a seeded sampled stream (temperature,
// top_p, top_k, penalties) is the same with and without MTP drafts, in one
// stage or two, in one prefill chunk or many, alone or batched, with the
// same logprobs; it is not the greedy stream, and another seed gives
// another one.
func TestDraftsKeepSampledStream(t *testing.T) {
	m := synthModel(t, "deepseek-v3", model.SyntheticSpec{MTPLayers: 2})
	prompt := tok.EncodeBytes("seeded sampling")
	other := tok.EncodeBytes("a neighbour in the batch")
	sp := &worker.Sampling{Temperature: 1.5, TopP: 0.95, TopK: 40, Seed: 1234, PresencePenalty: 0.2, RepetitionPenalty: 1.1}
	ref := runSampled(t, newPipe(t, m, 3, 1), [][]int32{prompt}, 1<<20, 0, 14, nil, sp)[0]
	for _, v := range []struct {
		name                    string
		pp, chunk, drafts, gens int
		batched                 bool
	}{
		{"drafts 2, pp 2", 2, 5, 2, 10, false},
		{"drafts 1, chunk 1", 1, 1, 1, 8, false},
		{"batched, chunk 7", 1, 7, 0, 14, true},
		{"batched, drafts 2", 2, 3, 2, 10, true},
	} {
		prompts := [][]int32{prompt}
		if v.batched {
			prompts = append(prompts, other)
		}
		got := runSampled(t, newPipe(t, m, 3, v.pp), prompts, v.chunk, v.drafts, v.gens, nil, sp)[0]
		n := min(len(got.stream), len(ref.stream))
		if n < 8 || !slices.Equal(got.stream[:n], ref.stream[:n]) {
			t.Errorf("%s: stream %v, want %v", v.name, got.stream[:n], ref.stream[:n])
		}
		if !slices.Equal(got.chosen[:n], ref.chosen[:n]) {
			t.Errorf("%s: logprobs %v, want %v", v.name, got.chosen[:n], ref.chosen[:n])
		}
	}
	// Drafts that are the sampled continuation are all accepted (run
	// fails otherwise): verification picks each draft's position's token
	// by the same rule, penalties over the accepted drafts included.
	if o := runSampled(t, newPipe(t, m, 3, 1), [][]int32{prompt}, 5, 2, 4, ref.stream, sp)[0]; !slices.Equal(o.stream, ref.stream[:len(o.stream)]) || len(o.stream) != 10 {
		t.Errorf("oracle drafts: stream %v, want all 10 of %v", o.stream, ref.stream)
	}
	greedy := run(t, newPipe(t, m, 3, 1), [][]int32{prompt}, 1<<20, 0, 14, nil)[0]
	if slices.Equal(greedy.stream, ref.stream) {
		t.Errorf("sampled stream %v equals the greedy one", ref.stream)
	}
	o := *sp
	o.Seed++
	if got := runSampled(t, newPipe(t, m, 3, 1), [][]int32{prompt}, 1<<20, 0, 14, nil, &o)[0]; slices.Equal(got.stream, ref.stream) {
		t.Errorf("seed %d gives the stream of seed %d: %v", o.Seed, sp.Seed, got.stream)
	}
	// Every chosen logprob is the raw log-softmax of its position: a token
	// in the top list has that list's value.
	for i, tok := range ref.stream {
		for _, e := range ref.lps[i] {
			if e.ID == tok && e.Logprob != ref.chosen[i] {
				t.Errorf("token %d (%d): logprob %v, top list says %v", i, tok, ref.chosen[i], e.Logprob)
			}
		}
	}
}
