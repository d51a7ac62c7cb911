//go:build cuda && cgo

package cuda

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"gorgonia.org/cu"

	"github.com/kvx-dev/kvx/device/cpu/kernel"
	"github.com/kvx-dev/kvx/device/synth"
)

// fastOps returns test ops with the fast numerics (dtype bfloat16).
func fastOps(t testing.TB) *ops {
	o := newTestOps(t)
	o.fast = true
	t.Cleanup(func() { o.g.do(func() error { o.freeStage(); return nil }) })
	return o
}

// fgemmShapes are (rows, outputs, inputs) of the fast-matmul tests: rows
// around every kernel's edges (1, a skinny tile, several, the tiled
// kernel's threshold and a ragged tiled tail), outputs not a multiple of a
// block, inputs not a multiple of the 64-value pad, and Llama-3-8B's
// projections.
var fgemmShapes = [][3]int{
	{1, 40, 100}, {3, 17, 64}, {16, 96, 200}, {33, 130, 128}, {70, 64, 64},
	{255, 136, 320}, {256, 128, 64}, {300, 200, 96}, {1, 4096, 4096}, {64, 1024, 4096}, {384, 512, 14336},
	{40, 72, 1600}, {300, 96, 2112}, {7, 300, 9000}, // parts of the k range: a short last one, one of 64, 9
	{9, 70, 1100}, {24, 200, 2048}, // the stream kernels' 16 and 32 rows, a partial feature tile
}

// TestFastMatMul: MatMul with a bf16 weight equals x (rounded to bf16) ·
// wᵀ (rounded to bf16) in float64 within the float32 chain's error: 2^-22
// of Σ|x_k w_k| per 16-value step, plus 64 steps of slack.
func TestFastMatMul(t *testing.T) {
	o := fastOps(t)
	for _, s := range fgemmShapes {
		n, m, k := s[0], s[1], s[2]
		t.Run(fmt.Sprintf("%dx%dx%d", n, m, k), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(uint64(n), uint64(m*k)))
			xv, wv := randVals(rng, n*k, 1), randVals(rng, m*k, 1)
			var got []float32
			on(t, o, func() {
				w := o.Weight(wv, m, k)
				if wt := cudaTensor(w); wt.h == 0 || wt.p != 0 {
					t.Errorf("fast Weight(%d × %d): bf16 %#x, float32 %#x; want only bf16", m, k, wt.h, wt.p)
				}
				got = o.ToHost(o.MatMul(hostTensor(o, xv, n, k), w))
			})
			tol := (float64(k)/16 + 64) * math.Ldexp(1, -22)
			bad, worst := 0, 0.0
			for i := range n {
				for j := range m {
					var want, mag float64
					for l := range k {
						p := float64(bf16Round(xv[i*k+l])) * float64(bf16Round(wv[j*k+l]))
						want += p
						mag += math.Abs(p)
					}
					d := math.Abs(float64(got[i*m+j]) - want)
					worst = max(worst, d/(tol*mag+1e-30))
					if !(d <= tol*mag) {
						if bad++; bad <= 3 {
							t.Errorf("C[%d][%d] = %v, want %v (tolerance %.3g)", i, j, got[i*m+j], want, tol*mag)
						}
					}
				}
			}
			if bad > 0 {
				t.Errorf("%d of %d values out of tolerance", bad, n*m)
			}
			t.Logf("largest difference: %.3g of the tolerance", worst)
		})
	}
}

func bf16Round(f float32) float32 { return kernel.Float32FromBF16(kernel.BF16FromFloat32(f)) }

// TestFastMatMulBatchInvariant: a row's outputs are the same bits whatever
// else is in the call: the row alone, inside a batch at any offset, in
// reverse order, and through every kernel (every skinny variant and the
// tiled ones, and every stream kernel that takes the rows), for every
// shape of fgemmShapes.
func TestFastMatMulBatchInvariant(t *testing.T) {
	o := fastOps(t)
	for _, s := range fgemmShapes {
		n, m, k := s[0], s[1], s[2]
		t.Run(fmt.Sprintf("%dx%dx%d", n, m, k), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(uint64(m), uint64(n+k)))
			xv, wv := randVals(rng, n*k, 1), randVals(rng, m*k, 1)
			// alone[i] is row i computed by itself (the skinny kernel, one row).
			alone := make([][]float32, n)
			rows := make([]int, n)
			for i := range rows {
				rows[i] = n - 1 - i
			}
			var whole, reversed []float32
			kernels := map[string][]float32{}
			on(t, o, func() {
				w := cudaTensor(o.Weight(wv, m, k))
				x := hostTensor(o, xv, n, k)
				for i := range n {
					alone[i] = o.ToHost(o.MatMul(o.Rows(x, []int{i}), w))
				}
				whole = o.ToHost(o.MatMul(x, w))
				reversed = o.ToHost(o.MatMul(o.Rows(x, rows), w))
				xa := o.scratch(int64(n) * int64(w.ld) * 2)
				g, b := flat(n * w.ld)
				o.run("kvx_to_bf16", g, b, 0, xa, x.p, n, k, w.ld)
				for _, v := range skinnyVariants {
					c := o.newTensor(n, m)
					o.fgemmSkinny(xa, n, w.ld, []gemmOut{{c.p, w.h, m, nil}}, v)
					kernels[v.name] = o.ToHost(c)
				}
				for _, v := range tiledVariants {
					if !o.g.loaded(v) {
						continue // an sm90a kernel on another device (TestTiledWGMMALoaded)
					}
					c := o.newTensor(n, m)
					o.fgemmTiled(c.p, xa, w.h, n, m, w.ld, v)
					kernels[v.name] = o.ToHost(c)
				}
				for _, v := range streamVariants {
					if _, ok := o.g.fns[v.name]; !ok || n > v.nt {
						continue // sm90a only (TestStreamLoaded), or too many rows
					}
					c := o.newTensor(n, m)
					o.fgemmStream(xa, n, w.ld, []gemmOut{{c.p, w.h, m, nil}}, v)
					kernels[v.name] = o.ToHost(c)
				}
			})
			for i := range n {
				sameBits(t, fmt.Sprintf("row %d in the whole call", i), alone[i], whole[i*m:(i+1)*m])
				sameBits(t, fmt.Sprintf("row %d reversed", i), alone[i], reversed[(n-1-i)*m:(n-i)*m])
				for name, c := range kernels {
					sameBits(t, fmt.Sprintf("row %d, kernel %s", i, name), alone[i], c[i*m:(i+1)*m])
				}
			}
		})
	}
}

// sharedCapability is the shared GPU and its compute capability.
func sharedCapability(t *testing.T) (g *gpu, major, minor int) {
	t.Helper()
	g, err := sharedGPU()
	if err != nil {
		t.Fatalf("no GPU: %v", err)
	}
	if err := g.do(func() error {
		var err error
		major, minor, err = g.dev.ComputeCapability()
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return g, major, minor
}

// TestTiledWGMMALoaded checks that a device of compute capability 9.0 has
// loaded the sm90a (wgmma) tiled kernels and runs them by default, and that
// another device has neither (TestFastMatMulBatchInvariant runs every
// loaded tiled kernel against the skinny ones, bit for bit).
func TestTiledWGMMALoaded(t *testing.T) {
	g, major, minor := sharedCapability(t)
	sm90 := major == 9 && minor == 0
	for _, v := range tiledVariants {
		if want := !v.sm90a || sm90; g.loaded(v) != want {
			t.Errorf("compute capability %d.%d: %s loaded %v, want %v", major, minor, v.name, g.loaded(v), want)
		}
	}
	if g.loaded(tiledGLU) != sm90 {
		t.Errorf("compute capability %d.%d: %s loaded %v, want %v", major, minor, tiledGLU.name, g.loaded(tiledGLU), sm90)
	}
	if want := map[bool]string{true: tiledWGMMA.name, false: tiledWide.name}[sm90]; g.tiled().name != want {
		t.Errorf("compute capability %d.%d: the tiled kernel is %s, want %s", major, minor, g.tiled().name, want)
	}
}

// TestStreamLoaded checks that a device of compute capability 9.0 has
// loaded every stream kernel and runs it up to 64 rows (the kernel for the
// rows), and that another device has none and runs the others.
func TestStreamLoaded(t *testing.T) {
	g, major, minor := sharedCapability(t)
	sm90 := major == 9 && minor == 0
	for _, v := range streamVariants {
		if _, ok := g.fns[v.name]; ok != sm90 {
			t.Errorf("compute capability %d.%d: %s loaded %v, want %v", major, minor, v.name, ok, sm90)
		}
	}
	for _, n := range []int{1, 8, 9, 16, 17, 32, 33, 64, 65} {
		k, ok := g.streamFor(n, 4096)
		if want := sm90 && n <= 64; ok != want {
			t.Errorf("compute capability %d.%d: streamFor(%d) = %s, %v; want ok %v", major, minor, n, k.name, ok, want)
		}
		if ok && (k.nt < n || k.nt >= 2*n && k.nt > 8) {
			t.Errorf("streamFor(%d) = %s: not the kernel for %d rows", n, k.name, n)
		}
	}
	if g.sms < 1 {
		t.Errorf("the device has %d multiprocessors", g.sms)
	}
}

// TestFastMatMuls: MatMuls of several weights (q, k and v; gate and up;
// four, past one launch's three) gives each weight's MatMul bit for bit,
// at widths that split a warp's 8 columns between two weights, for rows of
// the skinny and the tiled kernel.
func TestFastMatMuls(t *testing.T) {
	o := fastOps(t)
	for _, s := range []struct {
		rows, k int
		widths  []int
	}{
		{1, 200, []int{36, 12, 12}}, {5, 64, []int{100, 29}}, {40, 320, []int{17, 8, 130, 64}}, {300, 128, []int{96, 50, 50}},
	} {
		t.Run(fmt.Sprintf("%dx%d/%v", s.rows, s.k, s.widths), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(uint64(s.rows), uint64(s.k)))
			xv := randVals(rng, s.rows*s.k, 1)
			var alone, grouped [][]float32
			on(t, o, func() {
				x := hostTensor(o, xv, s.rows, s.k)
				var ws []synth.Tensor
				for _, m := range s.widths {
					w := o.Weight(randVals(rng, m*s.k, 1), m, s.k)
					ws = append(ws, w)
					alone = append(alone, o.ToHost(o.MatMul(x, w)))
				}
				for _, y := range o.MatMuls(x, ws...) {
					grouped = append(grouped, o.ToHost(y))
				}
			})
			for i := range alone {
				sameBits(t, fmt.Sprintf("weight %d", i), alone[i], grouped[i])
			}
		})
	}
}

// TestFastWeights: a bf16 weight's rows come back exactly rounded through
// Embed (the bf16 gather) and through f32 (the float32 copy MLA reads); a
// vector or a narrow matrix stays float32, bit for bit.
func TestFastWeights(t *testing.T) {
	o := fastOps(t)
	rng := rand.New(rand.NewPCG(3, 4))
	const rows, cols = 50, 70
	tv := randVals(rng, rows*cols, 1)
	gains := randVals(rng, cols, 1)
	conv := randVals(rng, 64*4, 1)
	toks := []int32{7, 0, 49, 7}
	var emb, back, g, c []float32
	on(t, o, func() {
		tb := o.Weight(tv, rows, cols)
		emb = o.ToHost(o.Embed(tb, toks))
		p := o.f32(cudaTensor(tb))
		back = make([]float32, rows*cols)
		o.fail(download(back, p))
		gt, ct := o.Weight(gains, 1, cols), o.Weight(conv, 64, 4)
		if cudaTensor(gt).h != 0 || cudaTensor(ct).h != 0 {
			t.Errorf("a 1 × %d and a 64 × 4 weight became bf16", cols)
		}
		g, c = o.ToHost(gt), o.ToHost(ct)
	})
	want := make([]float32, len(tv))
	for i, v := range tv {
		want[i] = bf16Round(v)
	}
	sameBits(t, "f32 copy", want, back)
	for i, tok := range toks {
		sameBits(t, fmt.Sprintf("Embed row %d (token %d)", i, tok), want[int(tok)*cols:int(tok+1)*cols], emb[i*cols:(i+1)*cols])
	}
	sameBits(t, "gains", gains, g)
	sameBits(t, "conv taps", conv, c)
}

// TestWeightBF16: a checkpoint's bf16 bytes (hf.BF16Loader) make the same
// weight as their float32 values through Weight: MatMul gives the same bits,
// padded (70 columns) or not (64); a float32-kept shape is declined.
func TestWeightBF16(t *testing.T) {
	o := fastOps(t)
	rng := rand.New(rand.NewPCG(5, 6))
	for _, cols := range []int{64, 70} {
		const rows, n = 40, 5
		bits, vals := bf16Vals(rng, rows*cols, 1)
		raw := make([]byte, 2*len(bits))
		for i, b := range bits {
			raw[2*i], raw[2*i+1] = byte(b), byte(b>>8)
		}
		xv := randVals(rng, n*cols, 1)
		var viaRaw, viaF32 []float32
		on(t, o, func() {
			w, ok := o.WeightBF16(raw, rows, cols)
			if !ok {
				t.Errorf("WeightBF16(%d × %d) declined", rows, cols)
				return
			}
			x := hostTensor(o, xv, n, cols)
			viaRaw = o.ToHost(o.MatMul(x, w))
			viaF32 = o.ToHost(o.MatMul(x, o.Weight(vals, rows, cols)))
			if _, ok := o.WeightBF16(raw[:2*cols], 1, cols); ok {
				t.Errorf("WeightBF16(1 × %d) took a vector", cols)
			}
		})
		sameBits(t, fmt.Sprintf("%d columns", cols), viaF32, viaRaw)
	}
}

// gemmOperands are a benchmark's matmul operands on the device: A (n × ld
// bf16), the weight and C (n × m float32).
type gemmOperands struct {
	o    *ops
	x, c cu.DevicePtr
	w    *tensor
}

// lazyOperands returns a function that makes a shape's operands on its
// first call and returns the same ones after, so a shape's variants share
// one weight (made on the device: a host-made 14336 × 4096 takes seconds)
// that lives until outer ends.
func lazyOperands(outer *testing.B, n, m, k int) func(b *testing.B) *gemmOperands {
	var p *gemmOperands
	return func(b *testing.B) *gemmOperands {
		if p != nil {
			return p
		}
		p = &gemmOperands{o: newTestOps(outer)}
		o := p.o
		o.fast = true
		r := rand.New(rand.NewPCG(1, 1))
		on(b, o, func() {
			p.w = cudaTensor(o.Weight(randVals(r, m*k, 1), m, k))
			xt := keptTensor(o, randVals(r, n*k, 1), n, k)
			var err error
			if p.x, err = o.g.alloc(int64(n) * int64(p.w.ld) * 2); err != nil {
				o.fail(err)
				return
			}
			if p.c, err = o.g.alloc(int64(n) * int64(m) * 4); err != nil {
				o.fail(err)
				return
			}
			*o.weights = append(*o.weights, p.x, p.c)
			g, bl := flat(n * p.w.ld)
			o.run("kvx_to_bf16", g, bl, 0, p.x, xt.p, n, k, p.w.ld)
			o.freeStage()
		})
		return p
	}
}

// BenchmarkFastSkinny measures every skinny variant (m16 tiles × warps a
// block) at decode shapes, as GB/s of the weight read once: the data
// skinnyFor is chosen from.
func BenchmarkFastSkinny(b *testing.B) {
	for _, s := range [][3]int{{1, 6144, 4096}, {1, 4096, 4096}, {1, 28672, 4096}, {1, 4096, 14336}, {1, 128256, 4096},
		{2, 6144, 4096}, {2, 28672, 4096}, {4, 6144, 4096}, {4, 28672, 4096}, {4, 4096, 14336}, {8, 6144, 4096}, {8, 28672, 4096}, {8, 4096, 14336}, {32, 6144, 4096}, {32, 28672, 4096}, {64, 6144, 4096}, {64, 4096, 4096}, {64, 28672, 4096}, {64, 4096, 14336}} {
		n, m, k := s[0], s[1], s[2]
		setup := lazyOperands(b, n, m, k)
		for _, v := range skinnyVariants {
			if v.mt < skinnyTile(n) {
				continue
			}
			b.Run(fmt.Sprintf("%dx%dx%d/%s", n, m, k, strings.TrimPrefix(v.name, "kvx_fgemm_")), func(b *testing.B) {
				p := setup(b)
				f := func() { p.o.fgemmSkinny(p.x, n, p.w.ld, []gemmOut{{p.c, p.w.h, m, nil}}, v) }
				timeOps(b, p.o, 3, f)
				b.ResetTimer()
				d := timeOps(b, p.o, b.N, f)
				b.ReportMetric(float64(m)*float64(k)*2/(d.Seconds()/float64(b.N))/1e9, "GB/s")
			})
		}
		for _, v := range streamVariants {
			if n > v.nt {
				continue
			}
			b.Run(fmt.Sprintf("%dx%dx%d/%s", n, m, k, strings.TrimPrefix(v.name, "kvx_fgemm_")), func(b *testing.B) {
				p := setup(b)
				if _, ok := p.o.g.fns[v.name]; !ok {
					b.Skipf("%s is not loaded on this device (sm90a only)", v.name)
				}
				f := func() { p.o.fgemmStream(p.x, n, p.w.ld, []gemmOut{{p.c, p.w.h, m, nil}}, v) }
				timeOps(b, p.o, 3, f)
				b.ResetTimer()
				d := timeOps(b, p.o, b.N, f)
				b.ReportMetric(float64(m)*float64(k)*2/(d.Seconds()/float64(b.N))/1e9, "GB/s")
			})
		}
		if n >= 4 { // where a tiled kernel could take over: the default one and the split ones
			for _, v := range tiledVariants {
				if !v.split && v.name != tiledWGMMA.name {
					continue
				}
				b.Run(fmt.Sprintf("%dx%dx%d/%s", n, m, k, strings.TrimPrefix(v.name, "kvx_fgemm_")), func(b *testing.B) {
					p := setup(b)
					if !p.o.g.loaded(v) {
						b.Skipf("%s is not loaded on this device (sm90a only)", v.name)
					}
					f := func() { p.o.fgemmTiled(p.c, p.x, p.w.h, n, m, p.w.ld, v) }
					timeOps(b, p.o, 3, f)
					b.ResetTimer()
					d := timeOps(b, p.o, b.N, f)
					b.ReportMetric(float64(m)*float64(k)*2/(d.Seconds()/float64(b.N))/1e9, "GB/s")
				})
			}
		}
	}
}

// BenchmarkFastTiled measures every tiled kernel at Llama-3-8B's prefill
// shapes (a 2048- and an 8192-token step's q, o, gate and up, and down), in
// TFLOP/s: the data tiled's choice is made from.
func BenchmarkFastTiled(b *testing.B) {
	for _, s := range [][3]int{{2048, 6144, 4096}, {8192, 4096, 4096}, {8192, 28672, 4096}, {8192, 4096, 14336}} {
		n, m, k := s[0], s[1], s[2]
		setup := lazyOperands(b, n, m, k)
		for _, v := range tiledVariants {
			b.Run(fmt.Sprintf("%dx%dx%d/%s", n, m, k, strings.TrimPrefix(v.name, "kvx_fgemm_")), func(b *testing.B) {
				p := setup(b)
				if !p.o.g.loaded(v) {
					b.Skipf("%s is not loaded on this device (sm90a only)", v.name)
				}
				f := func() { p.o.fgemmTiled(p.c, p.x, p.w.h, n, m, p.w.ld, v) }
				timeOps(b, p.o, 3, f)
				b.ResetTimer()
				d := timeOps(b, p.o, b.N, f)
				b.ReportMetric(2*float64(n)*float64(m)*float64(k)/(d.Seconds()/float64(b.N))/1e12, "TFLOP/s")
			})
		}
	}
}

// BenchmarkFastMatMul measures the fast matmul at decode shapes (reported
// as GB/s of the weight read once) and prefill shapes (TFLOP/s), Llama-3-8B's
// projections; scripts/cuda-bench.py sets them against torch.matmul (cuBLAS
// bf16) on the same shapes in the same run. host-us is the time the host
// takes to issue one call (both launches): where it is near us, the
// launches, not the GPU, bound the loop.
func BenchmarkFastMatMul(b *testing.B) {
	for _, s := range [][3]int{
		{1, 1024, 4096}, {1, 4096, 4096}, {1, 14336, 4096}, {1, 4096, 14336}, {1, 128256, 4096},
		{8, 14336, 4096}, {16, 14336, 4096}, {32, 14336, 4096}, {64, 14336, 4096}, {64, 4096, 14336},
		{128, 14336, 4096}, {256, 14336, 4096}, {512, 14336, 4096},
		{2048, 4096, 4096}, {8192, 4096, 4096}, {8192, 14336, 4096}, {8192, 4096, 14336},
	} {
		n, m, k := s[0], s[1], s[2]
		b.Run(fmt.Sprintf("%dx%dx%d", n, m, k), func(b *testing.B) {
			o := fastOps(b)
			r := rand.New(rand.NewPCG(1, 1))
			xv, wv := randVals(r, n*k, 1), randVals(r, m*k, 1)
			var x, w synth.Tensor
			on(b, o, func() { x, w = keptTensor(o, xv, n, k), o.Weight(wv, m, k) })
			timeOps(b, o, 3, func() { o.MatMul(x, w) })
			b.ResetTimer()
			var issued time.Duration
			d := timeOps(b, o, b.N, func() {
				t := time.Now()
				o.MatMul(x, w)
				issued += time.Since(t)
			})
			sec := d.Seconds() / float64(b.N)
			b.ReportMetric(2*float64(n)*float64(m)*float64(k)/sec/1e12, "TFLOP/s")
			b.ReportMetric(float64(m)*float64(k)*2/sec/1e9, "GB/s")
			b.ReportMetric(sec*1e6, "us")
			b.ReportMetric(issued.Seconds()/float64(b.N)*1e6, "host-us")
		})
	}
}

// TestFusedGLU: gate and up of one MatMuls call for the tiled kernel stay
// lazy, and SwiGLU of them runs the matmul with SwiGLU in its epilogue
// (kvx_fgemm_tma128s4g, where it is loaded: compute capability 9.0): the
// bits of the tiled matmul and then kvx_fswiglu, in the output, in its bf16
// copy (MatMul through it, at widths whose last tile and padded columns are
// partial), and in gate and up read afterwards (which runs the deferred
// matmul). SwiGLU of the outputs the other way round takes the unfused path
// with the same bits as unfused.
func TestFusedGLU(t *testing.T) {
	o := fastOps(t)
	fused := o.g.loaded(tiledGLU)
	if !fused {
		t.Logf("%s is not loaded (sm90a only): both paths are unfused", tiledGLU.name)
	}
	for _, c := range []struct{ n, k, m int }{{256, 4096, 1100}, {300, 1000, 640}, {513, 512, 700}, {1000, 2048, 4096}} {
		t.Run(fmt.Sprintf("%dx%dx%d", c.n, c.k, c.m), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(uint64(c.n*c.k), uint64(c.m)))
			xv := randVals(rng, c.n*c.k, 2)
			on(t, o, func() {
				wg, wu := o.Weight(randVals(rng, c.m*c.k, 1), c.m, c.k), o.Weight(randVals(rng, c.m*c.k, 1), c.m, c.k)
				wd := o.Weight(randVals(rng, 96*c.m, 1), 96, c.m)
				x := hostTensor(o, xv, c.n, c.k)
				type run struct{ h, hw, gate, up []float32 }
				step := func(fuse, swap bool) run {
					gu := o.MatMuls(x, wg, wu)
					if fused && asTensor(gu[0]).lazy == nil {
						t.Error("gate of the tiled MatMuls is not lazy")
					}
					if !fuse {
						cudaTensor(gu[0])
						if asTensor(gu[1]).lazy != nil {
							t.Error("reading gate left up lazy")
						}
					}
					var h synth.Tensor
					if swap {
						h = o.SwiGLU(gu[1], gu[0])
					} else {
						h = o.SwiGLU(gu[0], gu[1])
					}
					if fused && fuse && !swap && (asTensor(gu[0]).lazy == nil || asTensor(gu[1]).lazy == nil) {
						t.Error("SwiGLU ran the deferred matmul instead of fusing it")
					}
					if cudaTensor(h).b == 0 {
						t.Error("SwiGLU's output has no bf16 copy")
					}
					return run{o.ToHost(h), o.ToHost(o.MatMul(h, wd)), o.ToHost(gu[0]), o.ToHost(gu[1])}
				}
				for _, swap := range []bool{false, true} {
					want, got := step(false, swap), step(true, swap)
					name := map[bool]string{false: "SwiGLU(gate, up)", true: "SwiGLU(up, gate)"}[swap]
					sameBits(t, name, want.h, got.h)
					sameBits(t, name+": MatMul through its bf16 copy", want.hw, got.hw)
					sameBits(t, name+": gate read afterwards", want.gate, got.gate)
					sameBits(t, name+": up read afterwards", want.up, got.up)
				}
			})
		})
	}
}

// BenchmarkFastGLU times an MLP's gate and up matmul and SwiGLU at
// Llama-3-8B's prefill shapes, fused (kvx_fgemm_tma128s4g) and unfused (the
// tiled matmul of each weight, then kvx_fswiglu), as TFLOP/s of the two
// products.
func BenchmarkFastGLU(b *testing.B) {
	const m, k = 14336, 4096
	for _, n := range []int{2048, 8192} {
		for _, fuse := range []bool{true, false} {
			b.Run(fmt.Sprintf("%dx%dx%d/%s", n, m, k, map[bool]string{true: "fused", false: "unfused"}[fuse]), func(b *testing.B) {
				o := fastOps(b)
				if fuse && !o.g.loaded(tiledGLU) {
					b.Skipf("%s is not loaded on this device (sm90a only)", tiledGLU.name)
				}
				r := rand.New(rand.NewPCG(uint64(n), 2))
				var x, wg, wu synth.Tensor
				on(b, o, func() {
					x = keptTensor(o, randVals(r, n*k, 1), n, k)
					wg, wu = o.Weight(randVals(r, m*k, 1), m, k), o.Weight(randVals(r, m*k, 1), m, k)
				})
				f := func() {
					gu := o.MatMuls(x, wg, wu)
					if !fuse {
						cudaTensor(gu[0])
					}
					o.SwiGLU(gu[0], gu[1])
				}
				timeOps(b, o, 3, f)
				b.ResetTimer()
				d := timeOps(b, o, b.N, f)
				sec := d.Seconds() / float64(b.N)
				b.ReportMetric(4*float64(n)*float64(m)*float64(k)/sec/1e12, "TFLOP/s")
				b.ReportMetric(sec*1e6, "us")
			})
		}
	}
}
