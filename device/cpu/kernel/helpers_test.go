package kernel

import (
	"math"
	"math/rand/v2"
	"runtime"
	"testing"

	"github.com/kvx-dev/kvx/device/kernelspec"
	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
	"pgregory.net/rapid"
)

// randVec returns n normal values times scale.
func randVec(r *rand.Rand, n int, scale float64) []float32 {
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(r.NormFloat64() * scale)
	}
	return x
}

// layout is a paged placement: tpb tokens per block, logical block b in
// physical block perm[b], rows at offset with a stride, garbage elsewhere.
type layout struct {
	tpb    int
	perm   []int // logical -> physical; len(perm) >= blocks needed
	offset int   // bytes before this layer's rows in a block
	pad    int   // extra stride bytes per row
	extra  int   // spare physical blocks
}

// newPaged makes a pool filled with garbage bytes and a view through l.
func newPaged(r *rand.Rand, l layout, rowBytes int) Paged {
	stride := rowBytes + l.pad
	bb := l.offset + l.tpb*stride + 3
	nb := len(l.perm) + l.extra
	data := make([]byte, nb*bb)
	for i := range data {
		data[i] = byte(r.Uint32())
	}
	tab := make([]kvcache.BlockID, len(l.perm))
	for i, p := range l.perm {
		tab[i] = kvcache.BlockID(p)
	}
	return Paged{Data: data, BlockBytes: bb, Offset: l.offset, TokensPerBlock: l.tpb, Stride: stride, Table: tab}
}

// drawLayout draws a random layout for T tokens.
func drawLayout(t *rapid.T, T int) layout {
	tpb := rapid.IntRange(1, 9).Draw(t, "tpb")
	need := (T + tpb - 1) / tpb
	extra := rapid.IntRange(0, 3).Draw(t, "extra")
	perm := rapid.Permutation(seq(need+extra)).Draw(t, "perm")[:need]
	return layout{tpb: tpb, perm: perm, offset: rapid.IntRange(0, 5).Draw(t, "offset"),
		pad: rapid.IntRange(0, 3).Draw(t, "pad"), extra: extra}
}

// drawChunks splits T tokens into consecutive chunk lengths.
func drawChunks(t *rapid.T, T int) []int {
	var c []int
	for left := T; left > 0; {
		n := rapid.IntRange(1, left).Draw(t, "chunk")
		c = append(c, n)
		left -= n
	}
	return c
}

func seq(n int) []int {
	s := make([]int, n)
	for i := range s {
		s[i] = i
	}
	return s
}

// sameBits reports the first index where a and b differ bitwise, or -1.
func sameBits(a, b []float32) int {
	if len(a) != len(b) {
		return 0
	}
	for i := range a {
		if math.Float32bits(a[i]) != math.Float32bits(b[i]) {
			return i
		}
	}
	return -1
}

// withProcs runs f with GOMAXPROCS p and the parallel threshold at 0 (so
// every kernel takes its goroutine path whenever p > 1).
func withProcs(p int, f func()) {
	old := runtime.GOMAXPROCS(p)
	oldMin := parallelMin
	parallelMin = 0
	defer func() { runtime.GOMAXPROCS(old); parallelMin = oldMin }()
	f()
}

func drawDtype(t *rapid.T) kernelspec.Dtype {
	return rapid.SampledFrom([]kernelspec.Dtype{kernelspec.BF16, kernelspec.FP8, kernelspec.F32}).Draw(t, "dtype")
}

func drawRoPE(t *rapid.T, dim int) kernelspec.RoPE {
	if dim < 2 || !rapid.Bool().Draw(t, "rope") {
		return kernelspec.RoPE{}
	}
	return kernelspec.RoPE{Dim: 2 * rapid.IntRange(1, dim/2).Draw(t, "ropeHalf"), Theta: 10000, Interleaved: rapid.Bool().Draw(t, "interleaved")}
}

func checkEqual(t tb, what string, got, want []float32) {
	t.Helper()
	if i := sameBits(got, want); i >= 0 {
		if len(got) != len(want) {
			t.Fatalf("%s: len %d, want %d", what, len(got), len(want))
		}
		t.Fatalf("%s: [%d] = %g (%#08x), want %g (%#08x)", what, i, got[i], math.Float32bits(got[i]), want[i], math.Float32bits(want[i]))
	}
}

// tb is what both *testing.T and *rapid.T provide.
type tb interface {
	Helper()
	Fatalf(format string, args ...any)
}

var _ tb = (*testing.T)(nil)

func nanF() float32 { return float32(math.NaN()) }

func abs32(x float32) float32 { return float32(math.Abs(float64(x))) }
