package synth

import (
	"github.com/kvx-dev/kvx/device/cpu/kernel"
)

// Route picks the experts of one token from its router logits: softmax over
// all experts (kernel.Softmax), the k largest probabilities with the lowest
// index first among equals, then the chosen probabilities renormalized to
// sum to 1 (summed in ascending expert order). The experts come back in
// ascending index order, the order the expert outputs are summed in, with
// their weights. logits is not modified. k is clamped to [1, len(logits)].
func Route(logits []float32, k int) (experts []int, weights []float32) {
	p := append([]float32(nil), logits...)
	kernel.Softmax(p)
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

// mlp is one gated (SwiGLU: down(silu(gate x) * up x)) or relu² (Nemotron-H:
// down(relu(up x)²)) MLP.
type mlp struct {
	gate, up, down []float32 // gate nil for relu²
	inter          int
}

func newMLP(w Weights, prefix string, hidden, inter int, gated bool) *mlp {
	m := &mlp{up: w.Linear(prefix+"up", inter, hidden), down: w.Output(prefix+"down", hidden, inter), inter: inter}
	if gated {
		m.gate = w.Linear(prefix+"gate", inter, hidden)
	}
	return m
}

// forward writes the MLP of x (one row) to out; a and b are scratch of inter.
func (m *mlp) forward(out, x, a, b []float32) {
	kernel.MatVec(a, m.up, x)
	if m.gate != nil {
		kernel.MatVec(b, m.gate, x)
		for i := range a {
			a[i] = kernel.SiLU(b[i]) * a[i]
		}
	} else {
		for i, v := range a {
			r := max(v, 0)
			a[i] = r * r
		}
	}
	kernel.MatVec(out, m.down, a)
}

// moe is a routed MoE with an optional shared expert and an optional latent
// projection (Nemotron-3: routed experts work in a latent space, entered
// through latentDown and left through latentUp; router and shared expert
// see the hidden row).
type moe struct {
	router     []float32
	experts    []*mlp
	shared     *mlp
	topK       int
	latentDown []float32 // latent × hidden, nil without latent
	latentUp   []float32 // hidden × latent
}

// forward writes the MoE of x (one row) to out, summing the chosen experts
// in ascending index order, then the shared expert.
func (m *moe) forward(out, x []float32, s *scratch) {
	logits := s.router
	kernel.MatVec(logits, m.router, x)
	experts, weights := Route(logits, m.topK)
	in, acc := x, out
	if m.latentDown != nil {
		in, acc = s.lat, s.latAcc
		kernel.MatVec(in, m.latentDown, x)
	}
	clear(acc)
	for i, e := range experts {
		ex := m.experts[e]
		y := s.y[:len(acc)]
		ex.forward(y, in, s.a[:ex.inter], s.b[:ex.inter])
		kernel.Axpy(acc, weights[i], y)
	}
	if m.latentDown != nil {
		kernel.MatVec(out, m.latentUp, acc)
	}
	if m.shared != nil {
		y := s.y[:len(out)]
		m.shared.forward(y, x, s.a[:m.shared.inter], s.b[:m.shared.inter])
		for i := range out {
			out[i] += y[i]
		}
	}
}
