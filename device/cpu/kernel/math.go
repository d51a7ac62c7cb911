package kernel

import (
	"math"

	"github.com/kvx-dev/kvx/device/kernelspec"
)

// Dot returns the dot product of x and y[:len(x)] in the one summation order
// every kernel of this package uses: four partial sums, element i going to
// sum i%4 in increasing i, each product rounded to float32 before its add,
// and the result (s0+s1)+(s2+s3). It panics if len(y) < len(x).
func Dot(x, y []float32) float32 {
	y = y[:len(x)]
	var s0, s1, s2, s3 float32
	n := len(x)
	i := 0
	for ; i+4 <= n; i += 4 {
		s0 += float32(x[i] * y[i])
		s1 += float32(x[i+1] * y[i+1])
		s2 += float32(x[i+2] * y[i+2])
		s3 += float32(x[i+3] * y[i+3])
	}
	for ; i < n; i++ {
		p := float32(x[i] * y[i])
		switch i & 3 {
		case 0:
			s0 += p
		case 1:
			s1 += p
		case 2:
			s2 += p
		default:
			s3 += p
		}
	}
	return (s0 + s1) + (s2 + s3)
}

// Axpy adds a*x to y element-wise (y[i] += float32(a*x[i])). It panics if
// len(x) < len(y).
func Axpy(y []float32, a float32, x []float32) {
	x = x[:len(y)]
	for i := range y {
		y[i] += float32(a * x[i])
	}
}

// MatVec sets out[r] = Dot(w[r*cols:(r+1)*cols], x) for r < len(out): w is
// row-major len(out) × cols, cols = len(x). It panics if len(w) < len(out)*len(x).
func MatVec(out, w, x []float32) {
	cols := len(x)
	_ = w[len(out)*cols-1 : len(out)*cols]
	for r := range out {
		out[r] = Dot(w[r*cols:(r+1)*cols], x)
	}
}

// MatMul computes out = x · wᵀ for n rows of x: x is n × k, w is m × k (the
// layout of a linear layer's weight), out is n × m, each element one Dot.
// Rows run on several goroutines when large; the result does not depend on
// it. It panics if the lengths are not n*k, m*k and n*m for some n.
func MatMul(out, x, w []float32, k int) {
	if k <= 0 || len(x)%k != 0 || len(w)%k != 0 {
		panic("kernel.MatMul: lengths not multiples of k")
	}
	n, m := len(x)/k, len(w)/k
	if len(out) != n*m {
		panic("kernel.MatMul: len(out) != rows(x) * rows(w)")
	}
	parallelFor(n, n*m*k, func() struct{} { return struct{}{} }, func(_ struct{}, i int) {
		MatVec(out[i*m:(i+1)*m], w, x[i*k:(i+1)*k])
	})
}

// exp32 is e^x rounded to float32 (through float64 math.Exp).
func exp32(x float32) float32 { return float32(math.Exp(float64(x))) }

// SiLU returns x·sigmoid(x) = x / (1 + e^-x).
func SiLU(x float32) float32 { return x / (1 + exp32(-x)) }

// Softplus returns log(1 + e^x), or x when x > 20 (as Mamba2 does).
func Softplus(x float32) float32 {
	if x > 20 {
		return x
	}
	return float32(math.Log1p(math.Exp(float64(x))))
}

// RMSNorm sets out[i] = x[i] * inv * w[i] with inv = 1/sqrt(Dot(x,x)/n + eps),
// n = len(x). out may alias x. It panics if len(out) or len(w) < len(x).
func RMSNorm(out, x, w []float32, eps float32) {
	inv := rmsInv(x, eps)
	out = out[:len(x)]
	w = w[:len(x)]
	for i, v := range x {
		out[i] = float32(v*inv) * w[i]
	}
}

func rmsInv(x []float32, eps float32) float32 {
	ms := Dot(x, x) / float32(len(x))
	return float32(1 / math.Sqrt(float64(ms+eps)))
}

// Softmax replaces x by softmax(x): m = max, e_i = exp(x_i - m), summed in
// increasing i, then x_i = e_i / sum. A -Inf entry gets 0. Empty x is a no-op.
func Softmax(x []float32) {
	if len(x) == 0 {
		return
	}
	m := x[0]
	for _, v := range x[1:] {
		if v > m {
			m = v
		}
	}
	var sum float32
	for i, v := range x {
		e := exp32(v - m)
		x[i] = e
		sum += e
	}
	for i := range x {
		x[i] /= sum
	}
}

// Argmax returns the index of the largest element, the lowest index among
// equals; NaN entries are skipped; -1 for an empty or all-NaN x.
func Argmax(x []float32) int {
	best := -1
	for i, v := range x {
		if v != v {
			continue
		}
		if best < 0 || v > x[best] {
			best = i
		}
	}
	return best
}

// RoPE rotates by r, for position pos, x[h*stride : h*stride+Dim] for every head
// h with h*stride < len(x). Frequency i is Theta^(-2i/Dim), or InvFreq[i]
// when InvFreq is set; the angle pos·freq, its cosine and sine (times Scale
// when Scale != 0) are computed in float64 and rounded to float32. It
// panics if stride <= 0, a head's rope part runs past len(x), or InvFreq
// is set but shorter than Dim/2.
func RoPE(r kernelspec.RoPE, x []float32, stride, pos int) {
	if !r.On() {
		return
	}
	if stride <= 0 {
		panic("kernel.RoPE.Apply: stride must be > 0")
	}
	half := r.Dim / 2
	var cbuf, sbuf [128]float32
	cs, sn := cbuf[:0], sbuf[:0]
	for i := 0; i < half; i++ {
		var freq float64
		if len(r.InvFreq) > 0 {
			freq = r.InvFreq[i]
		} else {
			freq = math.Pow(r.Theta, -float64(2*i)/float64(r.Dim))
		}
		s, c := math.Sincos(float64(pos) * freq)
		if r.Scale != 0 {
			s, c = s*r.Scale, c*r.Scale
		}
		cs, sn = append(cs, float32(c)), append(sn, float32(s))
	}
	for h := 0; h < len(x); h += stride {
		v := x[h : h+r.Dim]
		for i := 0; i < half; i++ {
			a, b := i, i+half
			if r.Interleaved {
				a, b = 2*i, 2*i+1
			}
			x0, x1 := v[a], v[b]
			v[a] = float32(x0*cs[i]) - float32(x1*sn[i])
			v[b] = float32(x0*sn[i]) + float32(x1*cs[i])
		}
	}
}
