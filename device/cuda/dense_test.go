//go:build cuda && cgo

package cuda

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/kvx-dev/kvx/device/cpu"
	"github.com/kvx-dev/kvx/device/hf"
	"github.com/kvx-dev/kvx/device/synth"
)

func randVals(r *rand.Rand, n int, scale float64) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = float32(r.NormFloat64() * scale)
	}
	return v
}

func clone(v []float32) []float32 { return append([]float32(nil), v...) }

// pair holds the same host values as a cpu tensor and a cuda one.
type pair struct {
	c, g synth.Tensor
}

func mk(o *ops, v []float32, rows, cols int) pair {
	return pair{cpu.RowOps().FromHost(clone(v), rows, cols), o.FromHost(clone(v), rows, cols)}
}

func check(t testing.TB, o *ops, name string, want, got synth.Tensor) {
	t.Helper()
	if got.Rows() != want.Rows() || got.Cols() != want.Cols() {
		t.Errorf("%s: %d × %d, want %d × %d", name, got.Rows(), got.Cols(), want.Rows(), want.Cols())
		return
	}
	sameBits(t, name, cpu.RowOps().ToHost(want), o.ToHost(got))
}

func TestExpEmulation(t *testing.T) {
	mode, err := detectExp()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("math.Exp path: fma=%d", mode)
	r := rand.New(rand.NewPCG(7, 7))
	for range 200000 {
		x := (r.Float64()*2 - 1) * 750
		if r.IntN(2) == 0 {
			x = r.NormFloat64() * 10
		}
		if got, want := emulExp(x, mode == 1), math.Exp(x); math.Float64bits(got) != math.Float64bits(want) {
			t.Fatalf("emulExp(%v) = %v, want %v", x, got, want)
		}
	}
}

func TestMatMul(t *testing.T) {
	o := newTestOps(t)
	c := cpu.RowOps()
	r := rand.New(rand.NewPCG(1, 2))
	for _, s := range [][3]int{{1, 1, 1}, {3, 5, 7}, {8, 33, 130}, {9, 65, 64}, {17, 33, 129}, {64, 256, 512},
		{130, 70, 1000}, {2, 3, 0}, {65, 1, 3}, {9, 3, 0}, {1, 300, 4099}, {2, 31, 255}, {3, 100, 128}, {5, 64, 9}, {6, 7, 513}, {7, 40, 33}} {
		n, m, k := s[0], s[1], s[2]
		xv, wv := randVals(r, n*k, 1), randVals(r, m*k, 0.1)
		want := c.MatMul(c.FromHost(clone(xv), n, k), c.FromHost(clone(wv), m, k))
		on(t, o, func() {
			got := o.MatMul(o.FromHost(clone(xv), n, k), o.Weight(clone(wv), m, k))
			check(t, o, fmt.Sprintf("MatMul %d×%d×%d", n, m, k), want, got)
		})
	}
}

func TestCopies(t *testing.T) {
	o := newTestOps(t)
	c := cpu.RowOps()
	r := rand.New(rand.NewPCG(3, 4))
	on(t, o, func() {
		x := mk(o, randVals(r, 7*24, 1), 7, 24)
		check(t, o, "FromHost", x.c, x.g)
		check(t, o, "Zeros", c.Zeros(5, 3), o.Zeros(5, 3))
		tab := mk(o, randVals(r, 11*6, 1), 11, 6)
		toks := []int32{3, 0, 10, 3, 7}
		check(t, o, "Embed", c.Embed(tab.c, toks), o.Embed(tab.g, toks))
		idx := []int{6, 0, 0, 3}
		check(t, o, "Rows", c.Rows(x.c, idx), o.Rows(x.g, idx))
		for _, sp := range []struct {
			groups int
			widths []int
		}{{1, []int{24}}, {2, []int{5, 7}}, {4, []int{1, 2, 3}}, {3, []int{8, 0}}} {
			want, got := c.Split(x.c, sp.groups, sp.widths...), o.Split(x.g, sp.groups, sp.widths...)
			for i := range want {
				check(t, o, fmt.Sprintf("Split %d %v part %d", sp.groups, sp.widths, i), want[i], got[i])
			}
		}
		b := mk(o, randVals(r, 7*5, 1), 7, 5)
		check(t, o, "Concat", c.Concat(x.c, b.c), o.Concat(x.g, b.g))
	})
}

// special are values that stress the element-wise ops' edges.
var special = []float32{0, float32(math.Copysign(0, -1)), 1, -1, 20, -20, 88, -88, 89, -89, 100, -100, 104, -104,
	1e-30, -1e-30, 1e-45, 3e38, -3e38, 0.5, -0.5, 745, -746} // no Inf: NaN bits differ between cpus and gpus

func TestElementwise(t *testing.T) {
	o := newTestOps(t)
	c := cpu.RowOps()
	r := rand.New(rand.NewPCG(5, 6))
	for _, s := range [][2]int{{1, 1}, {3, 37}, {129, 300}} {
		n, m := s[0], s[1]
		gv, uv := randVals(r, n*m, 4), randVals(r, n*m, 1)
		for i := range min(len(special), len(gv)) {
			gv[i] = special[i]
		}
		on(t, o, func() {
			g, u := mk(o, gv, n, m), mk(o, uv, n, m)
			name := fmt.Sprintf("%d×%d", n, m)
			check(t, o, "SwiGLU "+name, c.SwiGLU(g.c, u.c), o.SwiGLU(g.g, u.g))
			check(t, o, "ReLU2 "+name, c.ReLU2(g.c), o.ReLU2(g.g))
			c.Add(u.c, g.c)
			o.Add(u.g, g.g)
			check(t, o, "Add "+name, u.c, u.g)
			c.Scale(u.c, 0.37)
			o.Scale(u.g, 0.37)
			check(t, o, "Scale "+name, u.c, u.g)
			b := mk(o, randVals(r, m, 1), 1, m)
			c.AddBias(u.c, b.c)
			o.AddBias(u.g, b.g)
			check(t, o, "AddBias "+name, u.c, u.g)
		})
	}
	// SwiGLU over a sweep of arguments: go_exp against math.Exp.
	const n = 1 << 16
	gv := make([]float32, n)
	for i := range gv {
		gv[i] = float32(-110 + 220*float64(i)/n + r.Float64()*1e-3)
	}
	uv := randVals(r, n, 1)
	on(t, o, func() {
		g, u := mk(o, gv, 256, n/256), mk(o, uv, 256, n/256)
		check(t, o, "SwiGLU sweep", c.SwiGLU(g.c, u.c), o.SwiGLU(g.g, u.g))
	})
}

func TestNorms(t *testing.T) {
	o := newTestOps(t)
	c := cpu.RowOps()
	r := rand.New(rand.NewPCG(7, 8))
	for _, s := range [][2]int{{1, 1}, {3, 7}, {5, 128}, {9, 1000}, {2, 4099}} {
		n, m := s[0], s[1]
		xv := randVals(r, n*m, 3)
		for i := range xv {
			xv[i] += 0.5 // a mean for LayerNorm
		}
		on(t, o, func() {
			x, w, b := mk(o, xv, n, m), mk(o, randVals(r, m, 1), 1, m), mk(o, randVals(r, m, 1), 1, m)
			name := fmt.Sprintf("%d×%d", n, m)
			check(t, o, "RMSNorm "+name, c.RMSNorm(x.c, w.c, 1e-6), o.RMSNorm(x.g, w.g, 1e-6))
			check(t, o, "LayerNorm "+name, c.LayerNorm(x.c, w.c, b.c, 1e-5), o.LayerNorm(x.g, w.g, b.g, 1e-5))
			check(t, o, "LayerNorm nil bias "+name, c.LayerNorm(x.c, w.c, nil, 1e-5), o.LayerNorm(x.g, w.g, nil, 1e-5))
		})
	}
	on(t, o, func() {
		x, w := mk(o, randVals(r, 6*8*64, 2), 6, 8*64), mk(o, randVals(r, 64, 1), 1, 64)
		check(t, o, "RMSNormGroups", c.RMSNormGroups(x.c, w.c, 1e-6), o.RMSNormGroups(x.g, w.g, 1e-6))
		x2, w2 := mk(o, randVals(r, 3*15, 2), 3, 15), mk(o, randVals(r, 5, 1), 1, 5)
		check(t, o, "RMSNormGroups 5", c.RMSNormGroups(x2.c, w2.c, 1e-6), o.RMSNormGroups(x2.g, w2.g, 1e-6))
	})
}

func TestRoPE(t *testing.T) {
	o := newTestOps(t)
	c := cpu.RowOps()
	r := rand.New(rand.NewPCG(9, 10))
	inv := make([]float64, 32)
	for i := range inv {
		inv[i] = math.Pow(500000, -float64(2*i)/64) / (1 + float64(i)/8)
	}
	cases := []struct {
		name   string
		cols   int
		stride int
		rope   synth.RoPE
		segs   []synth.Seg
	}{
		{"neox", 4 * 64, 64, synth.RoPE{Dim: 64, Theta: 10000}, []synth.Seg{{Pos: 0, Rows: 5}, {Pos: 77, Rows: 3}}},
		{"interleaved partial", 3 * 192, 192, synth.RoPE{Dim: 64, Theta: 10000, Interleaved: true},
			[]synth.Seg{{Pos: 100000, Rows: 4}, {Pos: 3, Rows: 1}}},
		{"invfreq scale", 2 * 64, 64, synth.RoPE{Dim: 64, InvFreq: inv, Scale: 1.2},
			[]synth.Seg{{Pos: 31000, Rows: 6}}},
		{"odd heads", 40, 10, synth.RoPE{Dim: 6, Theta: 1e6, Interleaved: true}, []synth.Seg{{Pos: 12345, Rows: 7}}},
		{"host table", 64, 64, synth.RoPE{Dim: 64, Theta: 2}, []synth.Seg{{Pos: 1 << 30, Rows: 2}}},
	}
	for _, tc := range cases {
		rows := 0
		for _, s := range tc.segs {
			rows += s.Rows
		}
		on(t, o, func() {
			x := mk(o, randVals(r, rows*tc.cols, 1), rows, tc.cols)
			c.RoPE(x.c, tc.segs, tc.stride, tc.rope)
			o.RoPE(x.g, tc.segs, tc.stride, tc.rope)
			check(t, o, "RoPE "+tc.name, x.c, x.g)
		})
	}
}

// sameRouting checks two routings expert by expert through Gather and
// AddRouted (their weights).
func sameRouting(t testing.TB, o *ops, name string, rc, rg synth.Routing, experts, rows int, r *rand.Rand) {
	t.Helper()
	c := cpu.RowOps()
	if rc.Rows() != rg.Rows() {
		t.Errorf("%s: %d rows, want %d", name, rg.Rows(), rc.Rows())
	}
	const cols = 5
	x := mk(o, randVals(r, rows*cols, 1), rows, cols)
	acc := mk(o, make([]float32, rows*cols), rows, cols)
	for e := range experts {
		gc, gg := c.Gather(x.c, rc, e), o.Gather(x.g, rg, e)
		if (gc == nil) != (gg == nil) {
			t.Errorf("%s: expert %d: Gather nil %v, want %v", name, e, gg == nil, gc == nil)
			return
		}
		if gc == nil {
			continue
		}
		check(t, o, fmt.Sprintf("%s: Gather %d", name, e), gc, gg)
		c.AddRouted(acc.c, gc, rc, e)
		o.AddRouted(acc.g, gg, rg, e)
	}
	check(t, o, name+": AddRouted", acc.c, acc.g)
}

func TestRoute(t *testing.T) {
	o := newTestOps(t)
	c := cpu.RowOps()
	r := rand.New(rand.NewPCG(11, 12))
	for _, s := range [][3]int{{1, 1, 1}, {7, 8, 1}, {7, 8, 2}, {33, 64, 6}, {5, 3, 9}} {
		rows, n, k := s[0], s[1], s[2]
		lv := randVals(r, rows*n, 2)
		for i := 0; i+3 < len(lv); i += 5 { // ties
			lv[i+1] = lv[i]
		}
		if rows > 2 {
			for i := range n {
				lv[2*n+i] = 0.25 // a row of equals
			}
		}
		on(t, o, func() {
			l := mk(o, lv, rows, n)
			sameRouting(t, o, fmt.Sprintf("Route %d×%d k=%d", rows, n, k), c.Route(l.c, k), o.Route(l.g, k), n, rows, r)
		})
	}
}

func TestRouteGrouped(t *testing.T) {
	o := newTestOps(t)
	c := cpu.RowOps()
	r := rand.New(rand.NewPCG(13, 14))
	for _, g := range []hf.GroupedRoute{
		{K: 8, Groups: 8, TopKGroup: 4, Norm: true, Scale: 2.5},
		{K: 2, Groups: 1, TopKGroup: 1, Norm: false, Scale: 1},
		{K: 6, Groups: 4, TopKGroup: 2, Norm: true, Scale: 1},
		{K: 100, Groups: 4, TopKGroup: 9, Norm: true, Scale: 0.5},
	} {
		const rows, n = 19, 64
		lv := randVals(r, rows*n, 1.5)
		for i := 0; i+7 < len(lv); i += 9 {
			lv[i+7] = lv[i]
		}
		for _, withBias := range []bool{false, true} {
			on(t, o, func() {
				l := mk(o, lv, rows, n)
				var bc, bg synth.Tensor
				if withBias {
					b := mk(o, randVals(r, n, 0.1), 1, n)
					bc, bg = b.c, b.g
				}
				sameRouting(t, o, fmt.Sprintf("RouteGrouped %+v bias %v", g, withBias),
					c.RouteGrouped(l.c, bc, g), o.RouteGrouped(l.g, bg, g), n, rows, r)
			})
		}
	}
}

// TestArgmax: the first largest non-NaN column of rows with ties, NaNs,
// all NaN, all -inf and signed zeros, as the cpu's, in rows of one chunk of
// the partial kernel and of several (ties across chunks).
func TestArgmax(t *testing.T) {
	o := newTestOps(t)
	c := cpu.RowOps()
	r := rand.New(rand.NewPCG(15, 16))
	nan := float32(math.NaN())
	for _, cols := range []int{1000, 20000} {
		rows := [][]float32{}
		for range 5 {
			rows = append(rows, randVals(r, cols, 1))
		}
		rows[1][10], rows[1][cols-100] = 9, 9 // a tie
		rows[2][0] = nan
		rows[2][500] = 50
		rows[2][501] = nan
		rows[3][cols-1] = 20 // the last column
		all := make([]float32, cols)
		for i := range all {
			all[i] = nan
		}
		neg := make([]float32, cols)
		for i := range neg {
			neg[i] = float32(math.Inf(-1))
		}
		zeros := make([]float32, cols)
		zeros[3] = float32(math.Copysign(0, -1))
		for i := range zeros[4:] {
			zeros[4+i] = -1
		}
		rows = append(rows, all, neg, zeros)
		var v []float32
		for _, row := range rows {
			v = append(v, row...)
		}
		want := c.Argmax(c.FromHost(clone(v), len(rows), cols))
		on(t, o, func() {
			got := o.Argmax(o.FromHost(clone(v), len(rows), cols))
			for i := range want {
				if got[i] != want[i] {
					t.Errorf("%d columns: Argmax row %d = %d, want %d", cols, i, got[i], want[i])
				}
			}
		})
	}
	on(t, o, func() {
		if one := o.Argmax(o.FromHost([]float32{3}, 1, 1)); one[0] != 0 {
			t.Errorf("Argmax of one = %d, want 0", one[0])
		}
	})
}

// BenchmarkMatMul reports the tiled kernel's rate on a prefill-sized
// product (2048 × 4096 by 4096 × 4096) and the skinny one's on decode.
func BenchmarkMatMul(b *testing.B) {
	for _, s := range [][3]int{{2048, 4096, 4096}, {1, 4096, 4096}, {8, 4096, 4096}, {1, 14336, 4096}} {
		n, m, k := s[0], s[1], s[2]
		b.Run(fmt.Sprintf("%dx%dx%d", n, m, k), func(b *testing.B) {
			o := newTestOps(b)
			r := rand.New(rand.NewPCG(1, 1))
			xv, wv := randVals(r, n*k, 1), randVals(r, m*k, 1)
			var x, w synth.Tensor
			on(b, o, func() { x, w = o.Weight(xv, n, k), o.Weight(wv, m, k) }) // not in the arena, which resets
			b.ResetTimer()
			start := time.Now()
			for range b.N {
				o.g.do(func() error {
					o.MatMul(x, w)
					return o.g.sync()
				})
				o.g.do(func() error { return o.ar.reset() }) // drop the output
			}
			el := time.Since(start).Seconds()
			b.ReportMetric(2*float64(n)*float64(m)*float64(k)*float64(b.N)/el/1e12, "TFLOP/s")
		})
	}
}
