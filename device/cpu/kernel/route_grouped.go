package kernel

import "math"

// GroupedRoute is DeepSeek-V3's router (transformers' DeepseekV3TopkRouter
// with norm_topk_prob): sigmoid scores, the correction bias added only to
// choose experts, experts restricted to the best TopKGroup of Groups equal
// groups (a group's score is the sum of its two best biased scores), then
// the K best biased scores among the allowed experts. The weights are the
// chosen experts' uncorrected sigmoid scores, divided by their sum + 1e-20
// when Norm, times Scale (routed_scaling_factor).
//
// Ties (equal biased scores or group scores) break to the lowest index;
// torch.topk leaves them unspecified.
type GroupedRoute struct {
	K, Groups, TopKGroup int
	Norm                 bool
	Scale                float32
}

// Sigmoid returns 1 / (1 + e^-x) rounded to float32.
func Sigmoid(x float32) float32 { return float32(1 / (1 + math.Exp(-float64(x)))) }

// Route returns the chosen experts of one token from its router logits
// (ascending index, the order their outputs are summed in) and their
// weights. bias has len(logits) entries (nil: zeros). Groups must divide
// len(logits) and each group must hold at least two experts (K, TopKGroup
// are clamped to what exists). logits and bias are not modified.
func (g GroupedRoute) Route(logits, bias []float32) (experts []int, weights []float32) {
	n := len(logits)
	groups := max(g.Groups, 1)
	per := n / groups
	scores := make([]float32, n)
	choice := make([]float32, n)
	for e, v := range logits {
		scores[e] = Sigmoid(v)
		choice[e] = scores[e]
		if bias != nil {
			choice[e] += bias[e]
		}
	}
	// best returns the index of the largest of v where ok, lowest among equals (-1: none).
	best := func(v []float32, ok func(int) bool) int {
		b := -1
		for i, x := range v {
			if ok(i) && (b < 0 || x > v[b]) {
				b = i
			}
		}
		return b
	}
	gs := make([]float32, groups)
	for gi := range groups {
		part := choice[gi*per : (gi+1)*per]
		a := best(part, func(int) bool { return true })
		b := best(part, func(i int) bool { return i != a })
		gs[gi] = part[a]
		if b >= 0 {
			gs[gi] = part[a] + part[b]
		}
	}
	allowed := make([]bool, groups)
	for range max(1, min(g.TopKGroup, groups)) {
		allowed[best(gs, func(i int) bool { return !allowed[i] })] = true
	}
	chosen := make([]bool, n)
	var order []int // chosen experts, best first
	for range max(1, min(g.K, per*min(g.TopKGroup, groups))) {
		e := best(choice, func(i int) bool { return allowed[i/per] && !chosen[i] })
		chosen[e] = true
		order = append(order, e)
	}
	var sum float32
	for _, e := range order { // topk's order: best first
		sum += scores[e]
	}
	den := sum + 1e-20
	for e, c := range chosen {
		if !c {
			continue
		}
		w := scores[e]
		if g.Norm {
			w /= den
		}
		experts = append(experts, e)
		weights = append(weights, w*g.Scale)
	}
	return experts, weights
}

// LayerNorm sets out = (x - mean) / sqrt(var + eps) · w + b over one row
// (biased variance), as torch.nn.LayerNorm computes it in float32: the mean
// and variance summed in float64 here (torch's cpu kernel accumulates in a
// wider type), the normalization in float32. b may be nil. It panics on
// mismatched lengths.
func LayerNorm(out, x, w, b []float32, eps float32) {
	n := len(x)
	_, _ = out[n-1], w[n-1]
	var s float64
	for _, v := range x {
		s += float64(v)
	}
	mean := s / float64(n)
	var q float64
	for _, v := range x {
		d := float64(v) - mean
		q += d * d
	}
	rstd := float32(1 / math.Sqrt(q/float64(n)+float64(eps)))
	m := float32(mean)
	for i, v := range x {
		y := (v - m) * rstd * w[i]
		if b != nil {
			y += b[i]
		}
		out[i] = y
	}
}
