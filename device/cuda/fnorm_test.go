//go:build cuda && cgo

package cuda

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

// TestFastRMSNorm: the fast numerics' RMSNorm of rows from 512 columns
// (the block-a-row kernel) against float64 within 2^-17 relative (its sum
// of squares is reassociated, about 40 roundings deep; the rest is the
// exact kernel's), every row the same bits alone and inside the batch;
// narrower rows (per-head norms) equal the exact kernel's bits.
func TestFastRMSNorm(t *testing.T) {
	fast, exact := fastOps(t), newTestOps(t)
	for _, cols := range []int{64, 511, 512, 4096, 7168 + 3} {
		t.Run(fmt.Sprintf("%d", cols), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(uint64(cols), 5))
			const rows = 7
			xv, wv := randVals(rng, rows*cols, 2), randVals(rng, cols, 1)
			var got, ref []float32
			alone := make([][]float32, rows)
			on(t, fast, func() {
				x, w := hostTensor(fast, xv, rows, cols), hostTensor(fast, wv, 1, cols)
				got = fast.ToHost(fast.RMSNorm(x, w, 1e-5))
				for i := range rows {
					alone[i] = fast.ToHost(fast.RMSNorm(hostTensor(fast, xv[i*cols:(i+1)*cols], 1, cols), w, 1e-5))
				}
			})
			on(t, exact, func() {
				ref = exact.ToHost(exact.RMSNorm(hostTensor(exact, xv, rows, cols), hostTensor(exact, wv, 1, cols), 1e-5))
			})
			for i := range rows {
				sameBits(t, fmt.Sprintf("row %d alone", i), alone[i], got[i*cols:(i+1)*cols])
			}
			if cols < fastNormCols {
				sameBits(t, "narrow rows: the exact kernel", ref, got)
				return
			}
			worst := 0.0
			for i := range rows {
				var ss float64
				for _, v := range xv[i*cols : (i+1)*cols] {
					ss += float64(v) * float64(v)
				}
				inv := 1 / math.Sqrt(ss/float64(cols)+1e-5)
				for j := range cols {
					want := float64(xv[i*cols+j]) * inv * float64(wv[j])
					d := math.Abs(float64(got[i*cols+j])-want) / (math.Abs(want) + 1e-30)
					worst = max(worst, d)
				}
			}
			if worst > math.Ldexp(1, -17) {
				t.Errorf("largest relative difference from float64 %.3g, above 2^-17", worst)
			}
			t.Logf("largest relative difference from float64: %.3g", worst)
		})
	}
}

// TestFastSwiGLU: the fast numerics' SwiGLU (fsilu_mul: float32's
// exponential) against float64 within 2^-20 relative, over gates from -90 to
// 90 (past -88 e^-g overflows float32 and SiLU is -0), every
// row the same bits alone and inside the batch.
func TestFastSwiGLU(t *testing.T) {
	o := fastOps(t)
	rng := rand.New(rand.NewPCG(4, 4))
	const rows, cols = 6, 1500
	gv, uv := make([]float32, rows*cols), randVals(rng, rows*cols, 3)
	for i := range gv {
		gv[i] = float32(-90 + 180*float64(i)/float64(len(gv)-1))
	}
	var got []float32
	alone := make([][]float32, rows)
	on(t, o, func() {
		got = o.ToHost(o.SwiGLU(hostTensor(o, gv, rows, cols), hostTensor(o, uv, rows, cols)))
		for i := range rows {
			alone[i] = o.ToHost(o.SwiGLU(hostTensor(o, gv[i*cols:(i+1)*cols], 1, cols), hostTensor(o, uv[i*cols:(i+1)*cols], 1, cols)))
		}
	})
	worst := 0.0
	for i, g := range gv {
		want := float64(g) / (1 + math.Exp(-float64(g))) * float64(uv[i])
		if math.Abs(want) < 0x1p-100 { // e^-g near or past float32's largest
			if math.Abs(float64(got[i])) > 0x1p-99 {
				t.Fatalf("SwiGLU(%v, %v) = %v, want %v", g, uv[i], got[i], want)
			}
			continue
		}
		worst = max(worst, math.Abs(float64(got[i])-want)/math.Abs(want))
	}
	if worst > 0x1p-20 {
		t.Errorf("largest relative difference from float64 %.3g, above 2^-20", worst)
	}
	t.Logf("largest relative difference from float64: %.3g", worst)
	for i := range rows {
		sameBits(t, fmt.Sprintf("row %d alone", i), alone[i], got[i*cols:(i+1)*cols])
	}
}

// TestFastBF16Copies: the bf16 copy RMSNorm and SwiGLU write for the fast
// matmul is the rounding the matmul would make itself: MatMul of their
// outputs equals MatMul of the same values uploaded afresh, bit for bit;
// and an in-place op (Add) drops the copy, so MatMul sees the new values.
func TestFastBF16Copies(t *testing.T) {
	o := fastOps(t)
	rng := rand.New(rand.NewPCG(9, 9))
	const rows, cols, outs = 5, 1000, 70
	xv, gv, wv, nv := randVals(rng, rows*cols, 2), randVals(rng, rows*cols, 2), randVals(rng, outs*cols, 1), randVals(rng, cols, 1)
	on(t, o, func() {
		w := o.Weight(wv, outs, cols)
		norm := o.RMSNorm(hostTensor(o, xv, rows, cols), hostTensor(o, nv, 1, cols), 1e-5)
		glu := o.SwiGLU(hostTensor(o, xv, rows, cols), hostTensor(o, gv, rows, cols))
		for name, y := range map[string]*tensor{"RMSNorm": cudaTensor(norm), "SwiGLU": cudaTensor(glu)} {
			if y.b == 0 {
				t.Errorf("%s: no bf16 copy", name)
			}
			fresh := hostTensor(o, o.ToHost(y), rows, cols)
			sameBits(t, name+": MatMul through its bf16 copy", o.ToHost(o.MatMul(fresh, w)), o.ToHost(o.MatMul(y, w)))
		}
		o.Add(norm, glu)
		if cudaTensor(norm).b != 0 {
			t.Error("Add kept the bf16 copy of the tensor it changed")
		}
		fresh := hostTensor(o, o.ToHost(norm), rows, cols)
		sameBits(t, "MatMul after Add", o.ToHost(o.MatMul(fresh, w)), o.ToHost(o.MatMul(norm, w)))
	})
}

// TestFastAddRMSNorm: AddRMSNorm (the residual add inside the fast
// RMSNorm's launch) gives the bits of Add and then RMSNorm, in x and in the
// output and its bf16 copy, at the widths the fast kernel takes and those
// it leaves to the exact one (where AddRMSNorm is the two launches).
func TestFastAddRMSNorm(t *testing.T) {
	o := fastOps(t)
	for _, cols := range []int{64, 512, 4096, 7168 + 3} {
		t.Run(fmt.Sprintf("%d", cols), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(uint64(cols), 7))
			const rows = 9
			xv, yv, wv := randVals(rng, rows*cols, 2), randVals(rng, rows*cols, 2), randVals(rng, cols, 1)
			on(t, o, func() {
				w := o.Weight(randVals(rng, 70*cols, 1), 70, cols)
				g := hostTensor(o, wv, 1, cols)
				x1, y1 := hostTensor(o, xv, rows, cols), hostTensor(o, yv, rows, cols)
				o.Add(x1, y1)
				want := o.RMSNorm(x1, g, 1e-5)
				x2, y2 := hostTensor(o, xv, rows, cols), hostTensor(o, yv, rows, cols)
				got := o.AddRMSNorm(x2, y2, g, 1e-5)
				sameBits(t, "x += y", o.ToHost(x1), o.ToHost(x2))
				sameBits(t, "RMSNorm(x)", o.ToHost(want), o.ToHost(got))
				sameBits(t, "MatMul of RMSNorm(x) (its bf16 copy)", o.ToHost(o.MatMul(want, w)), o.ToHost(o.MatMul(got, w)))
			})
		})
	}
}

// TestFusedFold: SwiGLU of gate and up pending from one split matmul
// (kvx_fswiglu_fold) and AddRMSNorm of a pending down projection
// (kvx_frmsnorm_fold8 up to fnSliceRows rows, a cluster of blocks a row,
// kvx_frmsnorm_fold above: the cases of 33 and 64 rows) give the bits of
// the fold's launch and
// then the op: in the output, its bf16 copy (MatMul through it), the
// residual x, and in the pending outputs folded afterwards. Where the
// stream kernel runs (compute capability 9.0, up to 64 rows) the ops must
// take the fused path: the matmuls' outputs are still pending after them.
func TestFusedFold(t *testing.T) {
	o := fastOps(t)
	for _, c := range []struct{ n, k, m int }{{1, 4096, 1100}, {5, 1000, 640}, {8, 4096, 2048}, {33, 2048, 700}, {64, 512, 1024}} {
		t.Run(fmt.Sprintf("%dx%dx%d", c.n, c.k, c.m), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(uint64(c.n*c.k), uint64(c.m)))
			xv, rv, nv := randVals(rng, c.n*c.k, 2), randVals(rng, c.n*c.k, 2), randVals(rng, c.k, 1)
			on(t, o, func() {
				wg, wu := o.Weight(randVals(rng, c.m*c.k, 1), c.m, c.k), o.Weight(randVals(rng, c.m*c.k, 1), c.m, c.k)
				wd, wn := o.Weight(randVals(rng, c.k*c.m, 1), c.k, c.m), o.Weight(randVals(rng, 70*c.k, 1), 70, c.k)
				gains := hostTensor(o, nv, 1, c.k)
				_, stream := o.g.streamFor(c.n, 0)
				type run struct{ gate, up, h, hw, y, x, norm, nw []float32 }
				step := func(fuse bool) run {
					gu := o.MatMuls(hostTensor(o, xv, c.n, c.k), wg, wu)
					if !fuse {
						cudaTensor(gu[0])
					}
					if stream && fuse && unfolded(gu[0]).fold == nil {
						t.Fatal("the stream matmul's gate is not pending")
					}
					h := o.SwiGLU(gu[0], gu[1])
					if stream && fuse && (unfolded(gu[0]).fold == nil || unfolded(gu[1]).fold == nil) {
						t.Error("SwiGLU folded its pending inputs in a launch of their own")
					}
					y := o.MatMul(h, wd)
					if !fuse {
						cudaTensor(y)
					}
					x := hostTensor(o, rv, c.n, c.k)
					norm := o.AddRMSNorm(x, y, gains, 1e-5)
					if stream && fuse && unfolded(y).fold == nil {
						t.Error("AddRMSNorm folded its pending addend in a launch of its own")
					}
					return run{o.ToHost(gu[0]), o.ToHost(gu[1]), o.ToHost(h), o.ToHost(o.MatMul(h, wd)), o.ToHost(y),
						o.ToHost(x), o.ToHost(norm), o.ToHost(o.MatMul(norm, wn))}
				}
				want, got := step(false), step(true)
				sameBits(t, "gate", want.gate, got.gate)
				sameBits(t, "up", want.up, got.up)
				sameBits(t, "SwiGLU", want.h, got.h)
				sameBits(t, "MatMul of SwiGLU (its bf16 copy)", want.hw, got.hw)
				sameBits(t, "down", want.y, got.y)
				sameBits(t, "x += down", want.x, got.x)
				sameBits(t, "RMSNorm(x)", want.norm, got.norm)
				sameBits(t, "MatMul of RMSNorm(x) (its bf16 copy)", want.nw, got.nw)
			})
		})
	}
}

// BenchmarkFoldNorm times AddRMSNorm of a pending split matmul's parts at
// Llama-3-8B's down projection (14 parts of 4096 columns) on both kernels,
// kvx_frmsnorm_fold8 (sliced) and kvx_frmsnorm_fold (block), a chain of
// launches as a step makes them; fnSliceRows is where the first stops
// being the faster.
func BenchmarkFoldNorm(b *testing.B) {
	const cols, parts = 4096, 14
	for _, rows := range []int{1, 8, 16, 32, 64} {
		for _, sliced := range []bool{true, false} {
			kind := "block"
			if sliced {
				kind = "sliced"
			}
			b.Run(fmt.Sprintf("rows-%d-%s", rows, kind), func(b *testing.B) {
				o := fastOps(b)
				rng := rand.New(rand.NewPCG(uint64(rows), 3))
				ld := padK(cols)
				var x, p, w, out, ob *tensor
				on(b, o, func() {
					x, p = keptTensor(o, randVals(rng, rows*cols, 1), rows, cols), keptTensor(o, randVals(rng, parts*rows*cols, 1e-3), parts*rows, cols)
					w, out = keptTensor(o, randVals(rng, cols, 1), 1, cols), keptTensor(o, make([]float32, rows*cols), rows, cols)
					ob = keptTensor(o, make([]float32, rows*ld/2), rows, ld/2)
				})
				f := func() { o.foldNorm(sliced, out.p, ob.p, x.p, p.p, parts, w.p, rows, cols, ld, 1e-5) }
				timeOps(b, o, 10, f)
				b.ResetTimer()
				per := timeOps(b, o, b.N, f).Seconds() / float64(b.N)
				b.ReportMetric(per*1e6, "us/call")
				b.ReportMetric(float64((parts+2)*rows*cols*4)/per/1e9, "GB/s")
			})
		}
	}
}
