package synth

// mlp is one gated (SwiGLU: down(silu(gate x) * up x)) or relu² (Nemotron-H:
// down(relu(up x)²)) MLP.
type mlp struct {
	gate, up, down Tensor // gate nil for relu²
}

func newMLP(ops Loader, w Weights, prefix string, hidden, inter int, gated bool) *mlp {
	m := &mlp{up: ops.Weight(w.Linear(prefix+"up", inter, hidden), inter, hidden), down: ops.Weight(w.Output(prefix+"down", hidden, inter), hidden, inter)}
	if gated {
		m.gate = ops.Weight(w.Linear(prefix+"gate", inter, hidden), inter, hidden)
	}
	return m
}

// forward returns the MLP of every row of x.
func (m *mlp) forward(ops Ops, x Tensor) Tensor {
	up := ops.MatMul(x, m.up)
	var a Tensor
	if m.gate != nil {
		a = ops.SwiGLU(ops.MatMul(x, m.gate), up)
	} else {
		a = ops.ReLU2(up)
	}
	return ops.MatMul(a, m.down)
}

// moe is a routed MoE with an optional shared expert and an optional latent
// projection (Nemotron-3: routed experts work in a latent space, entered
// through latentDown and left through latentUp; router and shared expert
// see the hidden row).
type moe struct {
	router     Tensor
	experts    []*mlp
	shared     *mlp
	topK       int
	dim        int    // the experts' width: hidden, or the latent
	latentDown Tensor // latent × hidden, nil without latent
	latentUp   Tensor // hidden × latent
}

// forward returns the MoE of every row of x: per row, the chosen experts'
// outputs weighted and summed in ascending expert order (Ops.AddRouted),
// then the shared expert's added.
func (m *moe) forward(ops Ops, x Tensor) Tensor {
	r := ops.Route(ops.MatMul(x, m.router), m.topK)
	in := x
	if m.latentDown != nil {
		in = ops.MatMul(x, m.latentDown)
	}
	acc := ops.Zeros(x.Rows(), m.dim)
	for e, ex := range m.experts {
		if xe := ops.Gather(in, r, e); xe != nil {
			ops.AddRouted(acc, ex.forward(ops, xe), r, e)
		}
	}
	out := acc
	if m.latentDown != nil {
		out = ops.MatMul(acc, m.latentUp)
	}
	if m.shared != nil {
		ops.Add(out, m.shared.forward(ops, x))
	}
	return out
}
