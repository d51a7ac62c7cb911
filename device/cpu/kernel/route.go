package kernel

// Route picks the experts of one token from its router logits: softmax over
// all experts (Softmax), the k largest probabilities with the lowest index
// first among equals, then the chosen probabilities renormalized to sum to 1
// (summed in ascending expert order). The experts come back in ascending
// index order, the order the expert outputs are summed in, with their
// weights. logits is not modified. k is clamped to [1, len(logits)].
func Route(logits []float32, k int) (experts []int, weights []float32) {
	p := append([]float32(nil), logits...)
	Softmax(p)
	k = max(1, min(k, len(p)))
	chosen := make([]bool, len(p))
	for range k {
		best := -1
		for e, v := range p {
			if !chosen[e] && (best < 0 || v > p[best]) {
				best = e
			}
		}
		chosen[best] = true
	}
	var sum float32
	for e, c := range chosen {
		if c {
			experts = append(experts, e)
			sum += p[e]
		}
	}
	for _, e := range experts {
		weights = append(weights, p[e]/sum)
	}
	return experts, weights
}
