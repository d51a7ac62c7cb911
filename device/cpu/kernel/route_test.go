package kernel

import (
	"math"
	"slices"
	"testing"
)

func TestRoute(t *testing.T) {
	tests := []struct {
		logits  []float32
		k       int
		experts []int
	}{
		{[]float32{1, 1, 1, 1}, 2, []int{0, 1}},    // all tied: lowest indices
		{[]float32{0, 3, 3, 2}, 2, []int{1, 2}},    // the tie at the top
		{[]float32{0, 3, 2, 2, 2}, 2, []int{1, 2}}, // tie for the last slot: lowest index wins
		{[]float32{5, -1, 5}, 1, []int{0}},
		{[]float32{-1, 4, 2}, 3, []int{0, 1, 2}},
		{[]float32{-1, 4, 2}, 9, []int{0, 1, 2}}, // k clamped
		{[]float32{2, 1}, 0, []int{0}},           // k clamped to 1
	}
	for _, tt := range tests {
		experts, weights := Route(tt.logits, tt.k)
		if !slices.Equal(experts, tt.experts) {
			t.Errorf("Route(%v, %d) experts = %v, want %v", tt.logits, tt.k, experts, tt.experts)
		}
		var sum float64
		for _, w := range weights {
			sum += float64(w)
		}
		if math.Abs(sum-1) > 1e-6 || len(weights) != len(experts) {
			t.Errorf("Route(%v, %d) weights = %v, want %d summing to 1", tt.logits, tt.k, weights, len(experts))
		}
	}
	// Weights follow the probabilities: larger logit, larger weight.
	_, w := Route([]float32{0, 2, 1}, 2)
	if !(w[0] > w[1]) {
		t.Errorf("Route weights %v: expert 1 (logit 2) should outweigh expert 2 (logit 1)", w)
	}
}

// Greedy sampling is Argmax: the lowest id among equal logits, NaN never
// wins, -1 for no logits.
func TestGreedy(t *testing.T) {
	nan := float32(math.NaN())
	inf := float32(math.Inf(1))
	tests := []struct {
		logits []float32
		want   int32
	}{
		{[]float32{1, 5, 5, 2}, 1},
		{[]float32{3, 3, 3}, 0},
		{[]float32{nan, 2, 2}, 1},
		{[]float32{-inf, -inf}, 0},
		{[]float32{0, inf, inf}, 1},
		{nil, -1},
	}
	for _, tt := range tests {
		if got := int32(Argmax(tt.logits)); got != tt.want {
			t.Errorf("Argmax(%v) = %d, want %d", tt.logits, got, tt.want)
		}
	}
}
