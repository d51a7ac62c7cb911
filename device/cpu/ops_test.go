package cpu

import (
	"context"
	"github.com/kvx-dev/kvx/device/kernelspec"
	"github.com/kvx-dev/kvx/device/paged"
	"math"
	"math/rand/v2"
	"runtime"
	"slices"
	"testing"

	"github.com/kvx-dev/kvx/device"
	"github.com/kvx-dev/kvx/device/cpu/kernel"
	"github.com/kvx-dev/kvx/device/synth"
	"github.com/kvx-dev/kvx/plugins/v1/spec"
)

// The cpu's ops are loops over the kernel functions they wrap; these tests
// pin each one to that function, bit for bit (STYLE rule 20), on shapes that
// take every path (one row, fewer rows than goroutines, many rows) and on
// values where an op picks (ties, NaN, infinities).

func randT(rng *rand.Rand, r, c int) *tensor {
	t := newTensor(r, c)
	for i := range t.d {
		t.d[i] = float32(rng.NormFloat64())
	}
	return t
}

func sameBits(a, b []float32) bool {
	return slices.EqualFunc(a, b, func(x, y float32) bool { return math.Float32bits(x) == math.Float32bits(y) })
}

func TestOpsMatMulIsKernelMatMul(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(8)) // take the column split whatever the machine
	rng := rand.New(rand.NewPCG(1, 2))
	var o hostOps
	for _, s := range []struct{ n, m, k int }{{1, 7, 5}, {1, 512, 256}, {3, 300, 256}, {7, 1000, 96}, {64, 64, 64}, {9, 8, 1}} {
		x, w := randT(rng, s.n, s.k), randT(rng, s.m, s.k)
		want := make([]float32, s.n*s.m)
		kernel.MatMul(want, x.d, w.d, s.k)
		if got := cpuTensor(o.MatMul(x, w)); !sameBits(got.d, want) || got.r != s.n || got.c != s.m {
			t.Errorf("MatMul(%d × %d, (%d × %d)ᵀ) differs from kernel.MatMul", s.n, s.k, s.m, s.k)
		}
	}
}

func TestOpsElementWiseAreKernels(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	var o hostOps
	x, y, g := randT(rng, 5, 24), randT(rng, 5, 24), randT(rng, 1, 24)
	x.d[3] = float32(math.NaN())
	x.d[7] = float32(math.Inf(-1))
	x.d[8] = float32(math.Copysign(0, -1))

	norm := cpuTensor(o.RMSNorm(x, g, synth.NormEps))
	for r := range 5 {
		want := make([]float32, 24)
		kernel.RMSNorm(want, x.rowsOf(r, r+1), g.d, synth.NormEps)
		if !sameBits(norm.rowsOf(r, r+1), want) {
			t.Errorf("RMSNorm row %d differs from kernel.RMSNorm", r)
		}
	}
	sw, re := cpuTensor(o.SwiGLU(x, y)), cpuTensor(o.ReLU2(x))
	sum := cpuTensor(o.FromHost(slices.Clone(x.d), 5, 24))
	o.Add(sum, y)
	o.Scale(sum, 0.375)
	for i, v := range x.d {
		r := max(v, 0)
		want := []float32{kernel.SiLU(v) * y.d[i], r * r, (v + y.d[i]) * 0.375}
		if got := []float32{sw.d[i], re.d[i], sum.d[i]}; !sameBits(got, want) {
			t.Errorf("element %d (%v): SwiGLU, ReLU2, (Add, Scale) = %v, want %v", i, v, got, want)
		}
	}
	lg := randT(rng, 4, 9)
	lg.d[2], lg.d[5] = lg.d[4], lg.d[4]+0 // a tie
	lg.d[10] = float32(math.NaN())
	for i := 27; i < 36; i++ {
		lg.d[i] = float32(math.NaN()) // an all-NaN row
	}
	got := o.Argmax(lg)
	for r := range 4 {
		if want := int32(kernel.Argmax(lg.rowsOf(r, r+1))); got[r] != want {
			t.Errorf("Argmax row %d = %d, kernel.Argmax %d", r, got[r], want)
		}
	}
}

func TestOpsShapesAreCopies(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	var o hostOps
	x := randT(rng, 3, 2*(4+3))
	parts := o.Split(x, 2, 4, 3)
	a, b := cpuTensor(parts[0]), cpuTensor(parts[1])
	for r := range 3 {
		row := x.rowsOf(r, r+1)
		if want := slices.Concat(row[0:4], row[7:11]); !sameBits(a.rowsOf(r, r+1), want) {
			t.Errorf("Split row %d part 0 = %v, want %v", r, a.rowsOf(r, r+1), want)
		}
		if want := slices.Concat(row[4:7], row[11:14]); !sameBits(b.rowsOf(r, r+1), want) {
			t.Errorf("Split row %d part 1 = %v, want %v", r, b.rowsOf(r, r+1), want)
		}
		if got := cpuTensor(o.Concat(a, b)).rowsOf(r, r+1); !sameBits(got, slices.Concat(a.rowsOf(r, r+1), b.rowsOf(r, r+1))) {
			t.Errorf("Concat row %d = %v", r, got)
		}
	}
	table := randT(rng, 10, 5)
	toks := []int32{3, 0, 9, 3}
	e, rs := cpuTensor(o.Embed(table, toks)), cpuTensor(o.Rows(table, []int{3, 0, 9, 3}))
	for i, tok := range toks {
		if !sameBits(e.rowsOf(i, i+1), table.rowsOf(int(tok), int(tok)+1)) || !sameBits(rs.rowsOf(i, i+1), table.rowsOf(int(tok), int(tok)+1)) {
			t.Errorf("Embed/Rows row %d is not table row %d", i, tok)
		}
	}
	if h := o.ToHost(x); !sameBits(h, x.d) || &h[0] == &x.d[0] {
		t.Errorf("ToHost is not a copy of the elements")
	}
}

// The MoE ops, run over all experts in ascending order as the model does,
// equal the per-row definition: kernel.Route, then for each chosen expert in
// ascending order kernel.Axpy of its weight times the expert's output row.
func TestOpsRoutingIsKernelRoute(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	var o hostOps
	const rows, experts, k, width = 6, 5, 2, 8
	logits := randT(rng, rows, experts)
	copy(logits.d[experts:2*experts], []float32{1, 1, 1, 1, 1}) // all tied
	x := randT(rng, rows, width)
	checkRoutedSum(t, o, x, o.Route(logits, k), experts, width, func(row int) ([]int, []float32) {
		return kernel.Route(logits.rowsOf(row, row+1), k)
	})
}

// testExpert is a distinct function per expert e, applied to one row.
func testExpert(e int, row []float32) []float32 {
	out := make([]float32, len(row))
	for i, v := range row {
		out[i] = v*float32(e+1) - float32(e)
	}
	return out
}

// checkRoutedSum runs every expert (testExpert) over the rows r gathers for
// it, in ascending expert order as the model does, adds them with
// AddRouted, and checks every row against the per-row definition: for each
// expert route(row) chose, in order, kernel.Axpy of its weight times the
// expert's output row.
func checkRoutedSum(t *testing.T, o hostOps, x *tensor, r synth.Routing, experts, width int, route func(row int) ([]int, []float32)) {
	t.Helper()
	rows := x.Rows()
	acc := o.Zeros(rows, width)
	for e := range experts {
		xe := o.Gather(x, r, e)
		if xe == nil {
			continue
		}
		ye := newTensor(xe.Rows(), width)
		for i := range xe.Rows() {
			copy(ye.rowsOf(i, i+1), testExpert(e, cpuTensor(xe).rowsOf(i, i+1)))
		}
		o.AddRouted(acc, ye, r, e)
	}
	for row := range rows {
		es, ws := route(row)
		want := make([]float32, width)
		for i, e := range es {
			kernel.Axpy(want, ws[i], testExpert(e, x.rowsOf(row, row+1)))
		}
		if got := cpuTensor(acc).rowsOf(row, row+1); !sameBits(got, want) {
			t.Errorf("row %d (experts %v): routed sum %v, want %v", row, es, got, want)
		}
	}
}

// The dense Reference's mixer ops are the kernels' Dense* references on each
// segment's rows.
func TestDenseOpsAreDenseKernels(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 10))
	m := spec.Model{Heads: 4, KVHeads: 2, HeadDim: 8, KVLoraRank: 16, QKNopeHeadDim: 8, QKRopeHeadDim: 4, VHeadDim: 8,
		IndexHeads: 2, IndexHeadDim: 8, IndexTopK: 3}
	segs := []synth.Seg{{Seq: 1, Rows: 5}, {Seq: 2, Rows: 3}}
	rows := 8
	for _, k := range []device.Kernel{device.KernelGQA, device.KernelMLA, device.KernelDSA} {
		x, err := paged.NewMixer(&m, spec.Layer{Index: 2, Mixer: spec.MixerDSA}, k, kernelspec.BF16, kernelspec.F32, kernelspec.F32)
		if err != nil {
			t.Fatal(err)
		}
		ops := denseOps{mix: map[int]*paged.Mixer{2: x}}
		H, N, P, R, V := m.Heads, m.QKNopeHeadDim, m.QKRopeHeadDim, m.KVLoraRank, m.VHeadDim
		q, kk, v := randT(rng, rows, H*8), randT(rng, rows, 2*8), randT(rng, rows, 2*8)
		in := synth.MLAIn{QNope: randT(rng, rows, H*N), QPE: randT(rng, rows, H*P), CKV: randT(rng, rows, R), KPE: randT(rng, rows, P)}
		ix := synth.IndexIn{Q: randT(rng, rows, 2*8), K: randT(rng, rows, 8), W: randT(rng, rows, 2)}
		w := synth.MLAWeights{UK: randT(rng, H*N, R), UV: randT(rng, H*V, R)}
		var got synth.Tensor
		switch k {
		case device.KernelGQA:
			got, err = ops.GQA(context.Background(), 2, segs, q, kk, v)
		case device.KernelMLA:
			got, err = ops.MLA(context.Background(), 2, segs, in, w)
		case device.KernelDSA:
			got, err = ops.DSA(context.Background(), 2, segs, in, ix, w)
		}
		if err != nil {
			t.Fatalf("%v: %v", k, err)
		}
		lo := 0
		for _, sg := range segs {
			hi := lo + sg.Rows
			want := make([]float32, sg.Rows*x.OutWidth())
			mw := mlaWeights(w)
			mi, ki := mlaRows(in, &ix, 0, lo, hi)
			switch k {
			case device.KernelGQA:
				err = kernel.DenseGQA(x.GQA, 0, q.rowsOf(lo, hi), kk.rowsOf(lo, hi), v.rowsOf(lo, hi), want)
			case device.KernelMLA:
				err = kernel.DenseMLA(x.DSA.MLA, &mw, mi, want)
			case device.KernelDSA:
				err = kernel.DenseDSA(x.DSA, &mw, mi, ki, want, nil)
			}
			if err != nil {
				t.Fatal(err)
			}
			if !sameBits(cpuTensor(got).rowsOf(lo, hi), want) {
				t.Errorf("%v: seq %d differs from the dense kernel", k, sg.Seq)
			}
			lo = hi
		}
		if _, err := ops.GQA(context.Background(), 2, []synth.Seg{{Seq: 1, Pos: 1, Rows: 8}}, q, kk, v); err == nil && k == device.KernelGQA {
			t.Errorf("GQA at pos 1: no error; the dense reference recomputes from pos 0")
		}
	}
}

// RoPE rotates row j of a segment at position Pos+j, as kernelspec.RoPE.
func TestOpsRoPEIsKernelRoPE(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 12))
	var o hostOps
	segs := []synth.Seg{{Seq: 1, Pos: 5, Rows: 3}, {Seq: 2, Pos: 0, Rows: 2}, {Seq: 3, Pos: 130, Rows: 1}}
	for _, r := range []synth.RoPE{{Dim: 8, Theta: 10000}, {Dim: 4, Theta: 10000, Interleaved: true}, {Dim: 6, Theta: 500000},
		{Dim: 8, InvFreq: []float64{1, 0.3, 0.01, 1e-4}, Scale: 1.25}, {Dim: 4, Theta: 7, InvFreq: []float64{0.5, 0.2}, Interleaved: true}} {
		x := randT(rng, 6, 3*8)
		orig := slices.Clone(x.d)
		want := slices.Clone(x.d)
		o.RoPE(x, segs, 8, r)
		if sameBits(x.d, orig) {
			t.Errorf("RoPE %+v left x as it was", r)
		}
		row := 0
		for _, sg := range segs {
			for j := range sg.Rows {
				kernel.RoPE(kernelspec.RoPE{Dim: r.Dim, Theta: r.Theta, Interleaved: r.Interleaved, InvFreq: r.InvFreq, Scale: r.Scale}, want[row*24:(row+1)*24], 8, sg.Pos+j)
				row++
			}
		}
		if !sameBits(x.d, want) {
			t.Errorf("RoPE %+v differs from kernelspec.RoPE at the segments' positions", r)
		}
	}
}

// AddBias adds the bias row to every row; RMSNormGroups is kernel.RMSNorm
// of every group (the per-head q/k norm), bit for bit.
func TestOpsHFAreKernels(t *testing.T) {
	rng := rand.New(rand.NewPCG(13, 14))
	var o hostOps
	x, b := randT(rng, 3, 12), randT(rng, 1, 12)
	want := slices.Clone(x.d)
	for r := range 3 {
		for i := range 12 {
			want[r*12+i] += b.d[i]
		}
	}
	o.AddBias(x, b)
	if !sameBits(x.d, want) {
		t.Errorf("AddBias differs from a row-wise add")
	}
	g := randT(rng, 1, 4)
	got := cpuTensor(o.RMSNormGroups(x, g, 1e-6))
	for i := 0; i < 36; i += 4 {
		w := make([]float32, 4)
		kernel.RMSNorm(w, x.d[i:i+4], g.d, 1e-6)
		if !sameBits(got.d[i:i+4], w) {
			t.Errorf("RMSNormGroups group at %d = %v, kernel.RMSNorm %v", i, got.d[i:i+4], w)
		}
	}
	if whole := cpuTensor(o.RMSNormGroups(x, randT(rng, 1, 12), 1e-6)); whole.r != 3 || whole.c != 12 {
		t.Errorf("RMSNormGroups with one group per row: %d × %d, want 3 × 12", whole.r, whole.c)
	}
}

// SigmoidMul multiplies by kernel.Sigmoid of the gate element-wise, or of
// each row's one gate, bit for bit.
func TestOpsSigmoidMulIsKernelSigmoid(t *testing.T) {
	rng := rand.New(rand.NewPCG(15, 16))
	var o hostOps
	for _, cols := range []int{12, 1} {
		x, g := randT(rng, 3, 12), randT(rng, 3, cols)
		want := slices.Clone(x.d)
		for r := range 3 {
			for i := range 12 {
				want[r*12+i] = float32(want[r*12+i] * kernel.Sigmoid(g.d[r*cols+min(i, cols-1)]))
			}
		}
		o.SigmoidMul(x, g)
		if !sameBits(x.d, want) {
			t.Errorf("SigmoidMul with a gate of %d columns differs from x · kernel.Sigmoid(gate)", cols)
		}
	}
}
