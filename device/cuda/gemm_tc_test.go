//go:build cuda && cgo

package cuda

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"gorgonia.org/cu"

	"github.com/kvx-dev/kvx/device/cpu/kernel"
)

// TestGEMMBF16: the tensor-core GEMM equals C = A·B^T in float64 on the
// same bf16 inputs, rounded to bf16, within: half a bf16 step of the value
// (|want| · 2^-8, the output's rounding, with room for the sum's own error
// to move a value across a rounding boundary) plus 1e-5 of Σ_k |a_k b_k|
// (float32 accumulation over up to 4096 products).
func TestGEMMBF16(t *testing.T) {
	o := newTestOps(t)
	for _, s := range [][3]int{{128, 128, 32}, {256, 384, 96}, {384, 256, 4096}} {
		m, n, k := s[0], s[1], s[2]
		t.Run(fmt.Sprintf("%dx%dx%d", m, n, k), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(uint64(m), uint64(k)))
			abits, a := bf16Vals(rng, m*k, 1)
			bbits, b := bf16Vals(rng, n*k, 1)
			got := make([]uint16, m*n)
			on(t, o, func() {
				c := o.gemmBF16(o.weightU16s(abits), o.weightU16s(bbits), m, n, k)
				o.fail(download(got, c))
			})
			bad, worst := 0, 0.0
			for i := range m {
				for j := range n {
					var want, mag float64
					for l := range k {
						p := float64(a[i*k+l]) * float64(b[j*k+l])
						want += p
						mag += math.Abs(p)
					}
					g := float64(kernel.Float32FromBF16(got[i*n+j]))
					tol := math.Abs(want)/256 + 1e-5*mag
					worst = max(worst, math.Abs(g-want)/tol)
					if !(math.Abs(g-want) <= tol) {
						if bad++; bad <= 3 {
							t.Errorf("C[%d][%d] = %v, want %v (tolerance %.3g)", i, j, g, want, tol)
						}
					}
				}
			}
			if bad > 0 {
				t.Errorf("%d of %d values out of tolerance", bad, m*n)
			}
			t.Logf("largest difference: %.3g of the tolerance", worst)
		})
	}
}

// BenchmarkGEMM measures the tensor-core GEMM at the shapes of an 8k-token
// prefill chunk (M = 8192 tokens; N × K of a 4096-wide projection and of
// DeepSeek-V3's 2048 → 7168 expert down-projection shape) and reports its
// TFLOP/s; scripts/cuda-bench.py sets it against cuBLAS's bf16 GEMM
// (torch.matmul) on the same shapes in the same run.
func BenchmarkGEMM(b *testing.B) {
	for _, s := range [][3]int{{8192, 4096, 4096}, {8192, 7168, 2048}} {
		m, n, k := s[0], s[1], s[2]
		b.Run(fmt.Sprintf("%dx%dx%d", m, n, k), func(b *testing.B) {
			o := newTestOps(b)
			var a, w cu.DevicePtr
			on(b, o, func() {
				var err error
				if a, err = o.g.alloc(int64(m) * int64(k) * 2); err != nil {
					o.fail(err)
					return
				}
				if w, err = o.g.alloc(int64(n) * int64(k) * 2); err != nil {
					o.fail(err)
					return
				}
				*o.weights = append(*o.weights, a, w)
				o.run("kvx_fill_bf16", dim{4096, 1, 1}, dim{256, 1, 1}, 0, a, int64(m)*int64(k), int64(1))
				o.run("kvx_fill_bf16", dim{4096, 1, 1}, dim{256, 1, 1}, 0, w, int64(n)*int64(k), int64(2))
			})
			timeOps(b, o, 3, func() { o.gemmBF16(a, w, m, n, k) })
			b.ResetTimer()
			d := timeOps(b, o, b.N, func() { o.gemmBF16(a, w, m, n, k) })
			b.ReportMetric(2*float64(m)*float64(n)*float64(k)*float64(b.N)/d.Seconds()/1e12, "TFLOP/s")
		})
	}
}
