package kernel

import (
	"errors"
	"math"
	"math/rand/v2"
	"testing"

	"pgregory.net/rapid"

	"github.com/kvx-dev/kvx/device/kernelspec"
)

type gdnCase struct {
	g            kernelspec.GDN
	w            *GDNWeights
	qkv, z, b, a []float32
}

func newGDNCase(r *rand.Rand, g kernelspec.GDN, T int) gdnCase {
	cd, H := g.ConvDim(), g.Heads
	w := &GDNWeights{
		ConvW:  randVec(r, cd*g.ConvKernel, 0.5),
		DtBias: randVec(r, H, 0.5),
		A:      make([]float32, H),
		NormW:  randVec(r, g.VDim, 1),
	}
	for h := range w.A {
		w.A[h] = -float32(0.05 + r.Float64()*2)
	}
	return gdnCase{g: g, w: w, qkv: randVec(r, T*cd, 1), z: randVec(r, T*g.Inner(), 1), b: randVec(r, T*H, 2), a: randVec(r, T*H, 1)}
}

// run runs tokens [lo, hi) on the given state.
func (c gdnCase) run(t tb, conv, ssm []byte, lo, hi int, out []float32) {
	t.Helper()
	g := c.g
	di, cd, H := g.Inner(), g.ConvDim(), g.Heads
	if err := GDN(g, c.w, conv, ssm, c.qkv[lo*cd:hi*cd], c.z[lo*di:hi*di], c.b[lo*H:hi*H], c.a[lo*H:hi*H], out[lo*di:hi*di]); err != nil {
		t.Fatalf("GDN.Forward(%d..%d): %v", lo, hi, err)
	}
}

func drawGDN(t *rapid.T) kernelspec.GDN {
	kh := rapid.IntRange(1, 2).Draw(t, "keyHeads")
	return kernelspec.GDN{
		KHeads:     kh,
		Heads:      kh * rapid.IntRange(1, 3).Draw(t, "headsPerKey"),
		KDim:       rapid.IntRange(1, 6).Draw(t, "keyDim"),
		VDim:       rapid.IntRange(1, 5).Draw(t, "valueDim"),
		ConvKernel: rapid.IntRange(1, 4).Draw(t, "kernel"),
		ConvDtype:  rapid.SampledFrom([]kernelspec.Dtype{kernelspec.F32, kernelspec.BF16}).Draw(t, "convDtype"),
		SSMDtype:   rapid.SampledFrom([]kernelspec.Dtype{kernelspec.F32, kernelspec.BF16}).Draw(t, "ssmDtype"),
		Eps:        1e-6,
	}
}

// TestGDNChunkedEqualsDenseProperty: any chunk split gives the dense
// reference's outputs and final state, bit for bit.
func TestGDNChunkedEqualsDenseProperty(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		g := drawGDN(rt)
		T := rapid.IntRange(1, 24).Draw(rt, "T")
		r := rand.New(rand.NewPCG(rapid.Uint64().Draw(rt, "seed"), 5))
		c := newGDNCase(r, g, T)
		want := make([]float32, T*g.Inner())
		wconv, wssm, err := DenseGDN(g, c.w, c.qkv, c.z, c.b, c.a, want)
		if err != nil {
			rt.Fatalf("DenseGDN: %v", err)
		}
		conv, ssm := make([]byte, g.ConvBytes()), make([]byte, g.SSMBytes())
		got := make([]float32, len(want))
		pos := 0
		for _, n := range drawChunks(rt, T) {
			c.run(rt, conv, ssm, pos, pos+n, got)
			pos += n
		}
		checkEqual(rt, "GDN chunked vs dense", got, want)
		gc, gs := make([]float32, len(wconv)), make([]float32, len(wssm))
		decodeRow(g.ConvDtype, gc, conv)
		decodeRow(g.SSMDtype, gs, ssm)
		checkEqual(rt, "conv state", gc, wconv)
		checkEqual(rt, "recurrent state", gs, wssm)
	})
}

// TestGDNSizesAreMamba2s: the state sizes are those of the Mamba2 mapping
// plugins/model sizes a GDN layer's buffers with (heads, head dim = value dim,
// state = key dim, groups = key heads).
func TestGDNSizesAreMamba2s(t *testing.T) {
	for _, d := range []kernelspec.Dtype{kernelspec.F32, kernelspec.BF16} {
		g := kernelspec.GDN{Heads: 32, KHeads: 16, KDim: 128, VDim: 128, ConvKernel: 4, ConvDtype: d, SSMDtype: d}
		m := kernelspec.Mamba2{Heads: 32, HeadDim: 128, State: 128, Groups: 16, ConvKernel: 4, ConvDtype: d, SSMDtype: d}
		if g.ConvBytes() != m.ConvBytes() || g.SSMBytes() != m.SSMBytes() || g.Inner() != m.Inner() {
			t.Errorf("%v: kernelspec.GDN conv %d ssm %d inner %d, kernelspec.Mamba2 mapping %d %d %d", d, g.ConvBytes(), g.SSMBytes(), g.Inner(), m.ConvBytes(), m.SSMBytes(), m.Inner())
		}
	}
}

// TestGDNOracle checks three tokens from zero state against the gated
// delta rule written out in float64 as transformers' recurrent form states
// it (S = S·exp(g) + k ⊗ β(v - Sᵀk), o = Sᵀq), with its causal conv, l2norm,
// q scale, decay, β and gated norm: a transposed state, a dropped β or gate,
// a conv tap off by one or a key head read by the wrong value head shows.
func TestGDNOracle(t *testing.T) {
	g := kernelspec.GDN{Heads: 4, KHeads: 2, KDim: 3, VDim: 2, ConvKernel: 3, ConvDtype: kernelspec.F32, SSMDtype: kernelspec.F32, Eps: 1e-6}
	const T = 3
	r := rand.New(rand.NewPCG(21, 22))
	c := newGDNCase(r, g, T)
	out := make([]float32, T*g.Inner())
	conv, ssm := make([]byte, g.ConvBytes()), make([]byte, g.SSMBytes())
	c.run(t, conv, ssm, 0, T, out)

	silu := func(v float64) float64 { return v / (1 + math.Exp(-v)) }
	cd, di, K, KD, V, kd := g.ConvDim(), g.Inner(), g.ConvKernel, g.KDim, g.VDim, g.KeyDim()
	S := make([][][]float64, g.Heads) // [h][k][v]
	for h := range S {
		S[h] = make([][]float64, KD)
		for i := range S[h] {
			S[h][i] = make([]float64, V)
		}
	}
	l2 := func(x []float64) []float64 {
		s := 0.0
		for _, v := range x {
			s += v * v
		}
		inv := 1 / math.Sqrt(s+1e-6)
		y := make([]float64, len(x))
		for i, v := range x {
			y[i] = v * inv
		}
		return y
	}
	for tok := range T {
		xc := make([]float64, cd)
		for ch := range cd {
			acc := 0.0
			for k := range K {
				if src := tok - (K - 1) + k; src >= 0 {
					acc += float64(c.w.ConvW[ch*K+k]) * float64(c.qkv[src*cd+ch])
				}
			}
			xc[ch] = silu(acc)
		}
		for h := range g.Heads {
			kh := h / (g.Heads / g.KHeads)
			q := l2(xc[kh*KD : (kh+1)*KD])
			k := l2(xc[kd+kh*KD : kd+(kh+1)*KD])
			v := xc[2*kd+h*V : 2*kd+(h+1)*V]
			for i := range q {
				q[i] /= math.Sqrt(float64(KD))
			}
			sp := math.Log1p(math.Exp(float64(c.a[tok*g.Heads+h]) + float64(c.w.DtBias[h])))
			decay := math.Exp(float64(c.w.A[h]) * sp)
			beta := 1 / (1 + math.Exp(-float64(c.b[tok*g.Heads+h])))
			o := make([]float64, V)
			for j := range V {
				stk := 0.0
				for i := range KD {
					stk += S[h][i][j] * decay * k[i]
				}
				for i := range KD {
					S[h][i][j] = S[h][i][j]*decay + k[i]*beta*(v[j]-stk)
					o[j] += S[h][i][j] * q[i]
				}
			}
			ms := 0.0
			for _, x := range o {
				ms += x * x
			}
			inv := 1 / math.Sqrt(ms/float64(V)+float64(g.Eps))
			for j := range V {
				want := o[j] * inv * float64(c.w.NormW[j]) * silu(float64(c.z[tok*di+h*V+j]))
				if got := out[tok*di+h*V+j]; math.Abs(float64(got)-want) > 1e-5*(1+math.Abs(want)) {
					t.Errorf("token %d head %d out[%d] = %v, float64 recurrence %v", tok, h, j, got, want)
				}
			}
		}
	}
}

func TestGDNErrors(t *testing.T) {
	g := kernelspec.GDN{Heads: 2, KHeads: 1, KDim: 2, VDim: 2, ConvKernel: 3, ConvDtype: kernelspec.F32, SSMDtype: kernelspec.F32}
	r := rand.New(rand.NewPCG(1, 1))
	c := newGDNCase(r, g, 2)
	conv, ssm := make([]byte, g.ConvBytes()), make([]byte, g.SSMBytes())
	out := make([]float32, 2*g.Inner())
	bad := g
	bad.KHeads = 3
	fp8 := g
	fp8.SSMDtype = kernelspec.FP8
	for _, tc := range []struct {
		name string
		err  error
	}{
		{"key heads", GDN(bad, c.w, conv, ssm, c.qkv, c.z, c.b, c.a, out)},
		{"ssm dtype", fp8.Validate()},
		{"qkv", GDN(g, c.w, conv, ssm, c.qkv[1:], c.z, c.b, c.a, out)},
		{"b", GDN(g, c.w, conv, ssm, c.qkv, c.z, c.b[1:], c.a, out)},
		{"state", GDN(g, c.w, conv[1:], ssm, c.qkv, c.z, c.b, c.a, out)},
		{"weights", GDN(g, &GDNWeights{}, conv, ssm, c.qkv, c.z, c.b, c.a, out)},
	} {
		if !errors.Is(tc.err, kernelspec.ErrInvalid) {
			t.Errorf("%s: %v, want kernelspec.ErrInvalid", tc.name, tc.err)
		} else {
			t.Logf("%s: %v", tc.name, tc.err)
		}
	}
}
