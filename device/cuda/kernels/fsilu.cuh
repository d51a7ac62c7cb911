// fsilu_mul, the fast numerics' SwiGLU arithmetic: shared by fnorm.cu's
// kvx_fswiglu and kvx_fswiglu_fold (decode, and prefill where the fused
// matmul is not loaded) and sm90a/fgemm_wg.cu's kvx_fgemm_tma128s4g (the
// prefill matmul with SwiGLU in its epilogue). One function, so that a
// token's values do not depend on which kernel made them (TestFusedGLU,
// TestFusedFold).
#pragma once

// fsilu_mul is SiLU(g) · u = g / (1 + e^-g) · u in float32, each step
// rounded, e^-g by CUDA's expf (within 2 ulp; one instruction sequence, so
// the same bits at every call). The exact numerics' kvx_swiglu takes Go's
// math.Exp in float64 instead (exp32, gomath.cuh), the cpu's bits; in a
// matmul's epilogue, run by the 8 computing warps an SM has, that float64
// sequence took longer than the unfused kernel's whole pass over memory.
__device__ __forceinline__ float fsilu_mul(float g, float u) {
	return __fmul_rn(__fdiv_rn(g, __fadd_rn(1.0f, expf(-g))), u);
}
