package synth

import (
	"math"
	"math/rand/v2"
	"strconv"

	"github.com/zeebo/xxh3"
)

// Weights draws a synthetic model's tensors. Every tensor is a pure function
// of (Seed, name, shape): the same seed gives the same bits in every process,
// stage split and batch, so stages and mixers draw their own tensors by name
// and agree without sharing memory.
//
// Init rule. Element i of tensor name comes from a PCG generator (math/rand/v2)
// seeded with (Seed, xxh3(name)): u = Float64() in [0, 1), value
// float32((2u-1)*a), drawn in index order. The bound a gives each kind a
// variance that keeps activations near unit scale through the stack:
//
//	Linear(out, in)   a = sqrt(3/in)                     (variance 1/in: y keeps x's scale)
//	Output(out, in)   a = sqrt(3/in) / sqrt(2*Layers)    (residual-branch output projection)
//	Embedding(n, h)   a = sqrt(3)                        (unit variance)
//	Norm(n)           1 + (2u-1)*0.1                     (RMSNorm gains near 1)
//
// Tensors are row-major out × in (a linear layer's weight layout, the layout
// kernel.MatMul takes). A Weights value is immutable and safe for concurrent
// use; returned slices are the caller's.
type Weights struct {
	Seed   uint64
	Layers int // decoder layers of the model (MTP layers excluded, so that turning MTP on or off leaves the main model as it is), for the Output scaling; < 1 counts as 1
}

func (w Weights) fill(name string, n int, a float64) []float32 {
	r := rand.New(rand.NewPCG(w.Seed, xxh3.HashString(name)))
	out := make([]float32, n)
	for i := range out {
		out[i] = float32((2*r.Float64() - 1) * a)
	}
	return out
}

// Linear returns an out × in projection with variance 1/in.
func (w Weights) Linear(name string, out, in int) []float32 {
	return w.fill(name, out*in, math.Sqrt(3/float64(in)))
}

// Output returns an out × in projection that writes into the residual
// stream: Linear's bound divided by sqrt(2*Layers).
func (w Weights) Output(name string, out, in int) []float32 {
	return w.fill(name, out*in, math.Sqrt(3/float64(in))/math.Sqrt(2*float64(max(w.Layers, 1))))
}

// Embedding returns an n × h table with unit variance.
func (w Weights) Embedding(name string, n, h int) []float32 {
	return w.fill(name, n*h, math.Sqrt(3))
}

// Norm returns n RMSNorm gains in [0.9, 1.1).
func (w Weights) Norm(name string, n int) []float32 {
	g := w.fill(name, n, 0.1)
	for i := range g {
		g[i] += 1
	}
	return g
}

// LayerName returns the tensor name prefix of layer i of spec.Model.Layers:
// "layers.<i>.". Names used by this package under it: mixer_norm, ffn_norm,
// mlp.{gate,up,down}, moe.router, moe.experts.<e>.{gate,up,down},
// moe.shared.{gate,up,down}, moe.latent_{down,up}, mtp.{enorm,hnorm,eh_proj}.
// A Mixer draws its own projections under LayerName(i)+"mixer." (e.g.
// "layers.3.mixer.q_proj").
// Model-wide tensors: embed, norm (final), lm_head (untied from embed).
func LayerName(i int) string { return "layers." + strconv.Itoa(i) + "." }
