//go:build cuda && cgo

package cuda

import (
	"fmt"

	"gorgonia.org/cu"
)

// gemmSmem is GEMM_SMEM of kernels/gemm_tc.cu.
const gemmSmem = 4 * (128 + 128) * 32 * 2

// gemmBF16 is C = A · B^T on tensor cores (kernels/gemm_tc.cu): a is m × k,
// b n × k, both row-major bf16 device memory; the result is m × n bf16 in
// the step's arena, each entry one float32 sum rounded once. m and n must be
// multiples of 128, k of 32. It runs only in the benchmarks today: the
// device's MatMul is the exact float32 kernel of dense.cu.
func (o *ops) gemmBF16(a, b cu.DevicePtr, m, n, k int) cu.DevicePtr {
	if m%128 != 0 || n%128 != 0 || k%32 != 0 || m <= 0 || n <= 0 || k <= 0 {
		panic(fmt.Sprintf("cuda: gemmBF16: %d × %d × %d: m and n must be multiples of 128, k of 32", m, n, k))
	}
	c := o.scratch(int64(m) * int64(n) * 2)
	o.runShared("kvx_gemm_bf16_tn", dim{n / 128, m / 128, 1}, dim{128, 1, 1}, gemmSmem, c, a, b, m, n, k)
	return c
}
