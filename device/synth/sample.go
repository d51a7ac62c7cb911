package synth

import (
	"cmp"
	"math"
	"slices"

	"github.com/kvx-dev/kvx/device"
	"github.com/kvx-dev/kvx/plugins/v1/worker"
)

// Sampling on the host, for every device: a sampled position's logits come
// to the host (Ops.ToHost of its row, which the devices already do for the
// outputs' Logits) and Choose picks its token there in float64, so the cpu
// and cuda devices share one sampler and a token depends only on the
// position's logits, the sequence's earlier tokens and (seed, position)
// (worker.Sampling's rules). Greedy items (worker.Sampling.Greedy) never
// come here: Ops.Argmax picks their tokens on the device, as before.

// Uniform returns the uniform number in [0, 1) that position pos of a
// sequence draws under seed: the splitmix64 finalizer of seed and pos,
// twice, its top 53 bits. A counter-based generator, so a position's number
// does not depend on what was drawn before it, in which step, batch or
// process: a preempted and recomputed sequence, or one whose drafts were
// rejected, draws the same number at the same position again.
func Uniform(seed uint64, pos int) float64 {
	x := device.Mix(seed ^ device.Mix(uint64(pos)+0x9e3779b97f4a7c15))
	return float64(x>>11) / (1 << 53)
}

// Choose returns the token that s picks at position pos from that
// position's final logits, by worker.Sampling's rules. seen are the
// sequence's tokens before pos, in order from position 0 (s.Context, then
// the item's tokens up to the row that produced these logits); only a
// penalized s reads them. A NaN logit is never picked; a row with no
// finite logit left gives the greedy token of the raw logits. logits is
// not modified.
func Choose(logits []float32, s *worker.Sampling, pos int, seen ...[]int32) int32 {
	if s.Greedy() {
		return argmax32(logits)
	}
	l := make([]float64, len(logits))
	for i, x := range logits {
		l[i] = float64(x)
		if x != x {
			l[i] = math.Inf(-1)
		}
	}
	if s.MinTokens > 0 && pos-s.Prompt < s.MinTokens {
		for _, id := range s.StopIDs {
			if id >= 0 && int(id) < len(l) {
				l[id] = math.Inf(-1)
			}
		}
	}
	if s.Penalized() {
		penalize(l, s, seen)
	}
	if s.Temperature == 0 {
		if t := argmax64(l); t >= 0 {
			return t
		}
		return argmax32(logits)
	}
	// Candidates by (logit descending, id ascending): the order every
	// truncation and the draw walk, so equal logits never depend on a sort's
	// stability.
	cand := make([]int32, 0, len(l))
	lmax := math.Inf(-1)
	for i, x := range l {
		if !math.IsInf(x, -1) {
			cand = append(cand, int32(i))
			lmax = max(lmax, x)
		}
	}
	if len(cand) == 0 {
		return argmax32(logits)
	}
	w := make([]float64, len(l)) // unnormalized probabilities: the largest is 1
	for _, id := range cand {
		w[id] = math.Exp((l[id] - lmax) / s.Temperature)
	}
	if s.MinP > 0 {
		cand = slices.DeleteFunc(cand, func(id int32) bool { return w[id] < s.MinP })
	}
	slices.SortFunc(cand, func(a, b int32) int {
		if c := cmp.Compare(l[b], l[a]); c != 0 {
			return c
		}
		return cmp.Compare(a, b)
	})
	if s.TopK > 0 && len(cand) > s.TopK {
		cand = cand[:s.TopK]
	}
	var total float64
	for _, id := range cand {
		total += w[id]
	}
	if s.TopP > 0 && s.TopP < 1 {
		var cum float64
		for k, id := range cand {
			cum += w[id]
			if cum >= s.TopP*total {
				cand, total = cand[:k+1], cum
				break
			}
		}
	}
	target := Uniform(s.Seed, pos) * total
	var cum float64
	for _, id := range cand {
		cum += w[id]
		if target < cum {
			return id
		}
	}
	return cand[len(cand)-1] // rounding: target within the last ulp of total
}

// penalize applies rule 3 of worker.Sampling to l: the repetition penalty
// to every token seen before the position, the frequency and presence
// penalties to the generated ones (positions >= s.Prompt).
func penalize(l []float64, s *worker.Sampling, seen [][]int32) {
	counts := map[int32]int{}
	inSeq := map[int32]bool{}
	p := 0
	for _, part := range seen {
		for _, t := range part {
			if t >= 0 && int(t) < len(l) {
				inSeq[t] = true
				if p >= s.Prompt {
					counts[t]++
				}
			}
			p++
		}
	}
	// Each token's change reads and writes its own logit only, so the
	// maps' order does not matter.
	if r := s.RepetitionPenalty; r != 0 && r != 1 {
		for t := range inSeq {
			if l[t] > 0 {
				l[t] /= r
			} else {
				l[t] *= r
			}
		}
	}
	for t, c := range counts {
		l[t] -= s.FrequencyPenalty*float64(c) + s.PresencePenalty
	}
}

// argmax32 is Ops.Argmax of one row on the host: the lowest id among the
// largest, -1 for an all-NaN row.
func argmax32(row []float32) int32 {
	best := int32(-1)
	for i, x := range row {
		if x == x && (best < 0 || x > row[best]) {
			best = int32(i)
		}
	}
	return best
}

// argmax64 is argmax32 over float64 values, -Inf excluded: -1 when every
// value is -Inf.
func argmax64(row []float64) int32 {
	best := int32(-1)
	for i, x := range row {
		if !math.IsInf(x, -1) && (best < 0 || x > row[best]) {
			best = int32(i)
		}
	}
	return best
}

// Logprob returns the log-probability of token id at a position with these
// final logits: the same float64 log-softmax as TopLogprobs (so equal to
// the entry TopLogprobs gives id, bit for bit), NaN logits left out; -Inf
// for a NaN logit or id outside the row.
func Logprob(logits []float32, id int32) float64 {
	lse, ok := logSumExp(logits)
	if !ok || id < 0 || int(id) >= len(logits) || logits[id] != logits[id] {
		return math.Inf(-1)
	}
	return float64(logits[id]) - lse
}

// logSumExp is log Σ exp over the non-NaN logits, in float64 with the
// largest subtracted first; false when there is none (or all are -Inf).
func logSumExp(logits []float32) (float64, bool) {
	maxv := math.Inf(-1)
	for _, x := range logits {
		if x == x && float64(x) > maxv {
			maxv = float64(x)
		}
	}
	if math.IsInf(maxv, -1) {
		return 0, false
	}
	var sum float64
	for _, x := range logits {
		if x == x {
			sum += math.Exp(float64(x) - maxv)
		}
	}
	return maxv + math.Log(sum), true
}
