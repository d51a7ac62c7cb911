package kernel

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/kvx-dev/kvx/device/kernelspec"
)

func TestDotOrder(t *testing.T) {
	// Dot's documented order, spelled out for n = 7.
	x := []float32{1e8, 1, -1e8, 1, 3, 0.5, 0.25}
	y := []float32{1, 1, 1, 1, 1, 1, 1}
	s0 := float32(1e8) + 3
	s1 := float32(1) + 0.5
	s2 := float32(-1e8) + 0.25
	s3 := float32(1)
	if got, want := Dot(x, y), (s0+s1)+(s2+s3); got != want {
		t.Errorf("Dot = %g, want %g", got, want)
	}
}

func TestMatMulIndependentOfProcs(t *testing.T) {
	r := rand.New(rand.NewPCG(2, 3))
	x, w := randVec(r, 7*33, 1), randVec(r, 5*33, 1)
	var a, b []float32
	withProcs(1, func() { a = make([]float32, 35); MatMul(a, x, w, 33) })
	withProcs(2, func() { b = make([]float32, 35); MatMul(b, x, w, 33) })
	checkEqual(t, "MatMul 2 procs vs 1", b, a)
	for i := 0; i < 7; i++ {
		for j := 0; j < 5; j++ {
			if got, want := a[i*5+j], Dot(x[i*33:(i+1)*33], w[j*33:(j+1)*33]); got != want {
				t.Fatalf("MatMul[%d][%d] = %g, want Dot %g", i, j, got, want)
			}
		}
	}
}

func TestSoftmaxRMSNormSiLUArgmax(t *testing.T) {
	x := []float32{1, 2, 3, float32(math.Inf(-1))}
	Softmax(x)
	e1, e2 := math.Exp(-2), math.Exp(-1)
	sum := e1 + e2 + 1
	for i, want := range []float64{e1 / sum, e2 / sum, 1 / sum, 0} {
		if math.Abs(float64(x[i])-want) > 1e-6 {
			t.Errorf("Softmax[%d] = %g, want %g", i, x[i], want)
		}
	}
	v := []float32{3, 4}
	out := make([]float32, 2)
	RMSNorm(out, v, []float32{1, 2}, 0)
	if rms := math.Sqrt(12.5); math.Abs(float64(out[0])-3/rms) > 1e-6 || math.Abs(float64(out[1])-8/rms) > 1e-6 {
		t.Errorf("RMSNorm = %v", out)
	}
	if got := SiLU(0); got != 0 {
		t.Errorf("SiLU(0) = %g", got)
	}
	if got := SiLU(2); math.Abs(float64(got)-2/(1+math.Exp(-2))) > 1e-6 {
		t.Errorf("SiLU(2) = %g", got)
	}
	if got := Softplus(30); got != 30 {
		t.Errorf("Softplus(30) = %g", got)
	}
	for _, tc := range []struct {
		x    []float32
		want int
	}{
		{[]float32{1, 5, 5, 2}, 1}, {[]float32{nanF(), 1, 1}, 1}, {nil, -1}, {[]float32{nanF()}, -1}, {[]float32{-1, -1}, 0},
	} {
		if got := Argmax(tc.x); got != tc.want {
			t.Errorf("Argmax(%v) = %d, want %d", tc.x, got, tc.want)
		}
	}
}

func TestRoPE(t *testing.T) {
	r := rand.New(rand.NewPCG(4, 5))
	for _, inter := range []bool{false, true} {
		rp := kernelspec.RoPE{Dim: 8, Theta: 10000, Interleaved: inter}
		q, k := randVec(r, 10, 1), randVec(r, 10, 1)
		// Position 0 is the identity.
		q0 := append([]float32(nil), q...)
		RoPE(rp, q0, 10, 0)
		checkEqual(t, "RoPE at 0", q0, q)
		// Scores depend on the distance only; dims past Dim pass through.
		score := func(pq, pk int) float64 {
			a, b := append([]float32(nil), q...), append([]float32(nil), k...)
			RoPE(rp, a, 10, pq)
			RoPE(rp, b, 10, pk)
			if a[8] != q[8] || a[9] != q[9] {
				t.Fatalf("RoPE touched dims past Dim")
			}
			return float64(Dot(a, b))
		}
		if s1, s2 := score(7, 3), score(104, 100); math.Abs(s1-s2) > 1e-4 {
			t.Errorf("interleaved %v: score(7,3) = %g, score(104,100) = %g", inter, s1, s2)
		}
		// Two heads rotate alike.
		two := append(append([]float32(nil), q...), q...)
		RoPE(rp, two, 10, 5)
		checkEqual(t, "RoPE head 2", two[10:], two[:10])
	}
}

// InvFreq equal to the Theta table rotates bit-identically; Scale scales
// the rotated vector's length.
func TestRoPEInvFreqAndScale(t *testing.T) {
	x := []float32{0.3, -1.2, 0.7, 2.0, 1.5, -0.25, 0.9, -0.4}
	base := kernelspec.RoPE{Dim: 8, Theta: 10000}
	inv := make([]float64, 4)
	for i := range inv {
		inv[i] = math.Pow(10000, -float64(2*i)/8)
	}
	a, b, c := append([]float32(nil), x...), append([]float32(nil), x...), append([]float32(nil), x...)
	RoPE(base, a, 8, 37)
	RoPE(kernelspec.RoPE{Dim: 8, InvFreq: inv}, b, 8, 37)
	for i := range a {
		if math.Float32bits(a[i]) != math.Float32bits(b[i]) {
			t.Fatalf("InvFreq = the Theta table: element %d is %v, Theta gives %v", i, b[i], a[i])
		}
	}
	RoPE(kernelspec.RoPE{Dim: 8, InvFreq: inv, Scale: 2}, c, 8, 37)
	for i := range 4 {
		na := math.Hypot(float64(a[i]), float64(a[i+4]))
		nc := math.Hypot(float64(c[i]), float64(c[i+4]))
		if math.Abs(nc-2*na) > 1e-5 {
			t.Errorf("Scale 2: pair %d has length %v, want 2 × %v", i, nc, na)
		}
	}
	if err := (kernelspec.GQA{Heads: 1, KVHeads: 1, HeadDim: 8, RoPE: kernelspec.RoPE{Dim: 8, InvFreq: inv[:3]}}).Validate(); err == nil {
		t.Errorf("3 frequencies for dim 8: no error")
	}
}
