// fold_at, the one order in which a split matmul's parts are added: shared
// by kvx_fgemm_fold (fgemm.cu) and the kernels that read a pending
// matmul's parts themselves instead of its folded output (fnorm.cu's
// kvx_frmsnorm_fold and kvx_fswiglu_fold, attn.cu's kvx_rope_write_fold).
// One function, so that every reader gets the fold launch's bits
// (TestFusedFold, TestRoPEGQAFold).
#pragma once

// fold_at is element i of a split matmul's sum: P[i] + P[n + i] + ... in
// part order, each add rounded. P holds parts × n float32.
__device__ __forceinline__ float fold_at(const float* P, long long parts, long long n, long long i) {
	float v = P[i];
	for (long long p = 1; p < parts; p++) v = __fadd_rn(v, P[p * n + i]);
	return v;
}
