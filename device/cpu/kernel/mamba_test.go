package kernel

import (
	"errors"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/kvx-dev/kvx/device/kernelspec"
	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
	"pgregory.net/rapid"
)

type mambaCase struct {
	m          kernelspec.Mamba2
	w          *Mamba2Weights
	z, xBC, dt []float32
}

func newMambaCase(r *rand.Rand, m kernelspec.Mamba2, T int) mambaCase {
	cd, H := m.ConvDim(), m.Heads
	w := &Mamba2Weights{
		ConvW:  randVec(r, cd*m.ConvKernel, 0.5),
		ConvB:  randVec(r, cd, 0.1),
		DtBias: randVec(r, H, 0.5),
		A:      make([]float32, H),
		D:      randVec(r, H, 1),
		NormW:  randVec(r, m.Inner(), 1),
	}
	for h := range w.A {
		w.A[h] = -float32(0.5 + r.Float64()*4)
	}
	return mambaCase{m: m, w: w, z: randVec(r, T*m.Inner(), 1), xBC: randVec(r, T*cd, 1), dt: randVec(r, T*H, 1)}
}

// run runs tokens [a, b) on the given state slot.
func (c mambaCase) run(t tb, conv, ssm []byte, a, b int, out []float32) {
	t.Helper()
	m := c.m
	di, cd, H := m.Inner(), m.ConvDim(), m.Heads
	if err := Mamba2(m, c.w, conv, ssm, c.z[a*di:b*di], c.xBC[a*cd:b*cd], c.dt[a*H:b*H], out[a*di:b*di]); err != nil {
		t.Fatalf("Mamba2.Forward(%d..%d): %v", a, b, err)
	}
}

// slots makes a state pool of nb blocks and returns it and a slot getter.
func (c mambaCase) pool(r *rand.Rand, nb, pad int) (Pool, func(b int) (conv, ssm []byte)) {
	m := c.m
	bb := pad + m.ConvBytes() + m.SSMBytes() + 5
	p := Pool{Data: make([]byte, nb*bb), BlockBytes: bb}
	for i := range p.Data {
		p.Data[i] = byte(r.Uint32())
	}
	return p, func(b int) ([]byte, []byte) {
		conv, err1 := StateSlot(p, kvcache.BlockID(b), pad, m.ConvBytes())
		ssm, err2 := StateSlot(p, kvcache.BlockID(b), pad+m.ConvBytes(), m.SSMBytes())
		if err1 != nil || err2 != nil {
			panic(errors.Join(err1, err2))
		}
		return conv, ssm
	}
}

func drawMamba(t *rapid.T) kernelspec.Mamba2 {
	g := rapid.IntRange(1, 2).Draw(t, "groups")
	return kernelspec.Mamba2{
		Groups:     g,
		Heads:      g * rapid.IntRange(1, 3).Draw(t, "headsPerGroup"),
		HeadDim:    rapid.IntRange(1, 4).Draw(t, "headDim"),
		State:      rapid.IntRange(1, 6).Draw(t, "state"),
		ConvKernel: rapid.IntRange(1, 4).Draw(t, "kernel"),
		ConvDtype:  rapid.SampledFrom([]kernelspec.Dtype{kernelspec.F32, kernelspec.BF16}).Draw(t, "convDtype"),
		SSMDtype:   rapid.SampledFrom([]kernelspec.Dtype{kernelspec.F32, kernelspec.BF16}).Draw(t, "ssmDtype"),
		Eps:        1e-5,
		DtMin:      rapid.SampledFrom([]float32{0, 0.001, 0.5}).Draw(t, "dtMin"),
	}
}

// TestMamba2ChunkedEqualsDenseProperty: any chunk split gives the dense
// reference's outputs and final state, bit for bit.
func TestMamba2ChunkedEqualsDenseProperty(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		m := drawMamba(rt)
		T := rapid.IntRange(1, 24).Draw(rt, "T")
		r := rand.New(rand.NewPCG(rapid.Uint64().Draw(rt, "seed"), 4))
		c := newMambaCase(r, m, T)
		want := make([]float32, T*m.Inner())
		wconv, wssm, err := DenseMamba2(m, c.w, c.z, c.xBC, c.dt, want)
		if err != nil {
			rt.Fatalf("DenseMamba2: %v", err)
		}
		_, slot := c.pool(r, 3, rapid.IntRange(0, 7).Draw(rt, "pad"))
		conv, ssm := slot(rapid.IntRange(0, 2).Draw(rt, "slot"))
		clear(conv)
		clear(ssm)
		got := make([]float32, len(want))
		pos := 0
		for _, n := range drawChunks(rt, T) {
			c.run(rt, conv, ssm, pos, pos+n, got)
			pos += n
		}
		checkEqual(rt, "Mamba2 chunked vs dense", got, want)
		gc, gs := make([]float32, len(wconv)), make([]float32, len(wssm))
		decodeRow(m.ConvDtype, gc, conv)
		decodeRow(m.SSMDtype, gs, ssm)
		checkEqual(rt, "conv state", gc, wconv)
		checkEqual(rt, "ssm state", gs, wssm)
	})
}

// TestMamba2SnapshotRestore: snapshot the slot after a prefix (CopyBlocks),
// continue; restoring the snapshot into another slot and continuing gives
// the same bits; continuing from a stale snapshot does not.
func TestMamba2SnapshotRestore(t *testing.T) {
	m := kernelspec.Mamba2{Heads: 4, HeadDim: 4, State: 8, Groups: 2, ConvKernel: 4, ConvDtype: kernelspec.BF16, SSMDtype: kernelspec.F32, Eps: 1e-5}
	r := rand.New(rand.NewPCG(41, 42))
	const T, cut = 20, 12
	c := newMambaCase(r, m, T)
	p, slot := c.pool(r, 4, 3)
	conv0, ssm0 := slot(0)
	clear(conv0)
	clear(ssm0)
	a := make([]float32, T*m.Inner())
	c.run(t, conv0, ssm0, 0, cut-1, a)
	if err := CopyBlocks([]Pool{p}, []kvcache.Copy{{SrcPool: 0, SrcBlock: 0, DstPool: 0, DstBlock: 3}}); err != nil { // stale snapshot
		t.Fatal(err)
	}
	c.run(t, conv0, ssm0, cut-1, cut, a)
	if err := CopyBlocks([]Pool{p}, []kvcache.Copy{{SrcPool: 0, SrcBlock: 0, DstPool: 0, DstBlock: 1}}); err != nil { // snapshot
		t.Fatal(err)
	}
	c.run(t, conv0, ssm0, cut, T, a)
	if err := CopyBlocks([]Pool{p}, []kvcache.Copy{{SrcPool: 0, SrcBlock: 1, DstPool: 0, DstBlock: 2}}); err != nil { // restore
		t.Fatal(err)
	}
	b := make([]float32, T*m.Inner())
	conv2, ssm2 := slot(2)
	c.run(t, conv2, ssm2, cut, T, b)
	di := m.Inner()
	checkEqual(t, "restored continuation", b[cut*di:], a[cut*di:])
	s := make([]float32, T*m.Inner())
	conv3, ssm3 := slot(3)
	c.run(t, conv3, ssm3, cut, T, s)
	if sameBits(s[cut*di:], a[cut*di:]) < 0 {
		t.Errorf("continuing from a snapshot one token stale: same output, want different")
	}
}

// TestMamba2DtMin: the floor changes the steps it raises and nothing else:
// a floor below every step gives the unfloored bits, one above some steps
// changes the output, and a negative floor is invalid.
func TestMamba2DtMin(t *testing.T) {
	m := kernelspec.Mamba2{Heads: 4, HeadDim: 2, State: 4, Groups: 2, ConvKernel: 3, ConvDtype: kernelspec.F32, SSMDtype: kernelspec.F32, Eps: 1e-5}
	r := rand.New(rand.NewPCG(8, 9))
	const T = 6
	c := newMambaCase(r, m, T)
	run := func(m kernelspec.Mamba2) []float32 {
		out := make([]float32, T*m.Inner())
		if _, _, err := DenseMamba2(m, c.w, c.z, c.xBC, c.dt, out); err != nil {
			t.Fatal(err)
		}
		return out
	}
	lo, hi := float32(math.Inf(1)), float32(0)
	for i, v := range c.dt {
		s := Softplus(v + c.w.DtBias[i%m.Heads])
		lo, hi = min(lo, s), max(hi, s)
	}
	plain := run(m)
	below := m
	below.DtMin = lo / 2
	if i := sameBits(run(below), plain); i >= 0 {
		t.Errorf("DtMin %v below every step (smallest %v): output %d differs from no floor", below.DtMin, lo, i)
	}
	above := m
	above.DtMin = (lo + hi) / 2
	if sameBits(run(above), plain) < 0 {
		t.Errorf("DtMin %v above some steps (%v..%v): output equals no floor's", above.DtMin, lo, hi)
	}
	neg := m
	neg.DtMin = -1
	if err := neg.Validate(); !errors.Is(err, kernelspec.ErrInvalid) {
		t.Errorf("DtMin -1: Validate = %v, want kernelspec.ErrInvalid", err)
	}
}

func TestMamba2Errors(t *testing.T) {
	m := kernelspec.Mamba2{Heads: 2, HeadDim: 2, State: 2, Groups: 1, ConvKernel: 3, ConvDtype: kernelspec.F32, SSMDtype: kernelspec.F32}
	r := rand.New(rand.NewPCG(1, 1))
	c := newMambaCase(r, m, 2)
	conv, ssm := make([]byte, m.ConvBytes()), make([]byte, m.SSMBytes())
	out := make([]float32, 2*m.Inner())
	badM := m
	badM.Groups = 3
	fp8 := m
	fp8.SSMDtype = kernelspec.FP8
	for _, tc := range []struct {
		name string
		err  error
	}{
		{"groups", Mamba2(badM, c.w, conv, ssm, c.z, c.xBC, c.dt, out)},
		{"ssm dtype", fp8.Validate()},
		{"xBC", Mamba2(m, c.w, conv, ssm, c.z, c.xBC[1:], c.dt, out)},
		{"dt", Mamba2(m, c.w, conv, ssm, c.z, c.xBC, c.dt[1:], out)},
		{"state", Mamba2(m, c.w, conv[1:], ssm, c.z, c.xBC, c.dt, out)},
		{"weights", Mamba2(m, &Mamba2Weights{}, conv, ssm, c.z, c.xBC, c.dt, out)},
	} {
		if !errors.Is(tc.err, kernelspec.ErrInvalid) {
			t.Errorf("%s: %v, want kernelspec.ErrInvalid", tc.name, tc.err)
		} else {
			t.Logf("%s: %v", tc.name, tc.err)
		}
	}
}

// TestMamba2OneTokenOracle checks one token from zero state against the
// Mamba2 step written out in float64 (transformers' decode step): the conv
// over a zero state is w[K-1]·u + bias, so the conv bias, the silu, the dt
// floor, the D skip, the gate and the grouped norm all show.
func TestMamba2OneTokenOracle(t *testing.T) {
	for _, dtMin := range []float32{0, 0.8} {
		m := kernelspec.Mamba2{Heads: 4, HeadDim: 2, State: 3, Groups: 2, ConvKernel: 3, ConvDtype: kernelspec.F32, SSMDtype: kernelspec.F32, Eps: 1e-5, DtMin: dtMin}
		r := rand.New(rand.NewPCG(12, 13))
		c := newMambaCase(r, m, 1)
		out := make([]float32, m.Inner())
		conv, ssm := make([]byte, m.ConvBytes()), make([]byte, m.SSMBytes())
		c.run(t, conv, ssm, 0, 1, out)

		silu := func(v float64) float64 { return v / (1 + math.Exp(-v)) }
		cd, di, K, N, P, G := m.ConvDim(), m.Inner(), m.ConvKernel, m.State, m.HeadDim, m.Groups
		xc := make([]float64, cd)
		for ch := range cd {
			xc[ch] = silu(float64(c.w.ConvW[ch*K+K-1])*float64(c.xBC[ch]) + float64(c.w.ConvB[ch]))
		}
		y := make([]float64, di)
		for h := range m.Heads {
			g := h / (m.Heads / G)
			dt := math.Log1p(math.Exp(float64(c.dt[h]) + float64(c.w.DtBias[h])))
			dt = math.Max(dt, float64(dtMin))
			for p := range P {
				x := xc[h*P+p]
				for n := range N {
					b, cc := xc[di+g*N+n], xc[di+G*N+g*N+n]
					y[h*P+p] += dt * x * b * cc // zero state: s = dt·x·B
				}
				y[h*P+p] += float64(c.w.D[h]) * x
			}
		}
		gs := di / G
		for g := range G {
			ms := 0.0
			for i := g * gs; i < (g+1)*gs; i++ {
				y[i] *= silu(float64(c.z[i]))
				ms += y[i] * y[i]
			}
			inv := 1 / math.Sqrt(ms/float64(gs)+float64(m.Eps))
			for i := g * gs; i < (g+1)*gs; i++ {
				want := y[i] * inv * float64(c.w.NormW[i])
				if math.Abs(float64(out[i])-want) > 1e-5*(1+math.Abs(want)) {
					t.Errorf("DtMin %v: out[%d] = %v, float64 step %v", dtMin, i, out[i], want)
				}
			}
		}
	}
}
