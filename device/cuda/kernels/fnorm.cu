// The fast RMSNorm (dtype bfloat16): one block of FN_THREADS threads a row
// instead of the exact kernel's one warp with four summing lanes, which
// leaves a decode step's few rows on few SMs for tens of microseconds.
//
// A row's sum of squares has one order whatever the call: thread t adds
// x[i]·x[i] for i = t, t + FN_THREADS, ... in ascending i; each warp's 32
// sums meet in an xor butterfly (at every level both lanes of a pair add the
// same two values, so every lane holds the same sum); the 8 warps' sums are
// added in warp order. Then, as the exact kernel: inv = 1/sqrt(sum/cols +
// eps) in float64, out = float32(x·inv)·w. A row's output depends on its
// own values only: batch-invariant.
//
// When ob is not 0 the kernel also writes the output rounded to bf16 (row
// stride ld, columns past cols zero): the fast matmul's input, which it
// would otherwise make in a launch of its own (kvx_to_bf16, the same
// rounding). kvx_fswiglu does the same for SwiGLU.
//
// Both also take their input straight from a split matmul's parts (P:
// parts × n float32, n = rows × the launch's columns), added here in
// kvx_fgemm_fold's order, so the fold's own launch (and its write and read
// of the sum) is skipped: the values and so the bits are the fold's
// (device/cuda's pendingFold).
#include "mma.cuh"
#include "pdl.cuh"
#include "gomath.cuh" // ll, and exp32 for SiLU

#define FN_THREADS 256

// fold_at is element i of a split matmul's sum: P[i] + P[n + i] + ... in
// part order, each add rounded, as kvx_fgemm_fold (kernels/fgemm.cu) adds
// them. The two must stay one order: TestFusedFold compares them bit for
// bit.
__device__ __forceinline__ float fold_at(const float* P, ll parts, ll n, ll i) {
	float v = P[i];
	for (ll p = 1; p < parts; p++) v = __fadd_rn(v, P[p * n + i]);
	return v;
}

// kvx_frmsnorm: grid min(rows, 65535) (grid-stride), FN_THREADS threads.
// When y is not 0 the residual add before the norm is done here too: x +=
// y (in place, kvx_add's sum), then out = RMSNorm(x): one launch and one
// read of x instead of two (hf.AddNormer). When P is not 0 (and y is), y
// is the fold of P's parts (a rows × cols matmul's alone in its launch).
extern "C" __global__ void __launch_bounds__(FN_THREADS) kvx_frmsnorm(float* out, unsigned short* ob, float* x,
		const float* y, const float* P, ll parts, const float* w, ll rows, ll cols, ll ld, float eps) {
	pdl_wait();
	__shared__ float ws[FN_THREADS / 32];
	const int t = threadIdx.x, lane = t % 32, warp = t / 32;
	for (ll r = blockIdx.x; r < rows; r += gridDim.x) {
		float* xr = x + r * cols;
		float s = 0.0f;
		// Unrolled so that a thread's loads are in flight together (the adds
		// stay one chain in ascending i). With y, x's row becomes x + y
		// first, as kvx_add makes it; the thread reads back only what it
		// wrote itself below.
		if (y) {
			const float* yr = y + r * cols;
#pragma unroll 8
			for (ll i = t; i < cols; i += FN_THREADS) {
				const float v = __fadd_rn(xr[i], yr[i]);
				xr[i] = v;
				s = __fadd_rn(s, __fmul_rn(v, v));
			}
		} else if (P) {
			const float* pr = P + r * cols;
			const ll n = rows * cols;
#pragma unroll 8
			for (ll i = t; i < cols; i += FN_THREADS) {
				const float v = __fadd_rn(xr[i], fold_at(pr, parts, n, i));
				xr[i] = v;
				s = __fadd_rn(s, __fmul_rn(v, v));
			}
		} else {
#pragma unroll 8
			for (ll i = t; i < cols; i += FN_THREADS) s = __fadd_rn(s, __fmul_rn(xr[i], xr[i]));
		}
#pragma unroll
		for (int m = 16; m > 0; m >>= 1) s = __fadd_rn(s, __shfl_xor_sync(0xffffffffu, s, m));
		if (lane == 0) ws[warp] = s;
		__syncthreads();
		float dot = ws[0];
#pragma unroll
		for (int i = 1; i < FN_THREADS / 32; i++) dot = __fadd_rn(dot, ws[i]);
		const float ms = __fdiv_rn(dot, __ll2float_rn(cols));
		const float inv = __double2float_rn(__ddiv_rn(1.0, __dsqrt_rn((double)__fadd_rn(ms, eps))));
		// The row's outputs, 8 a thread at a time: all 8 loads are issued
		// before the first store (out may be x itself).
		float* o = out + r * cols;
		unsigned short* b = ob ? ob + r * ld : nullptr;
		for (ll i0 = t; i0 < cols; i0 += 8 * FN_THREADS) {
			float xv[8], wv[8];
#pragma unroll
			for (int j = 0; j < 8; j++) {
				const ll i = i0 + j * FN_THREADS;
				xv[j] = i < cols ? xr[i] : 0.0f;
				wv[j] = i < cols ? w[i] : 0.0f;
			}
#pragma unroll
			for (int j = 0; j < 8; j++) {
				const ll i = i0 + j * FN_THREADS;
				if (i >= cols) break;
				const float y = __fmul_rn(__fmul_rn(xv[j], inv), wv[j]);
				o[i] = y;
				if (b) b[i] = to_bf16(y);
			}
		}
		if (b) {
			for (ll i = cols + t; i < ld; i += FN_THREADS) b[i] = 0;
		}
		__syncthreads(); // ws is read by every thread before the next row writes it
	}
}

// kvx_fswiglu is kvx_swiglu (kernel.SiLU(g) * u, the same arithmetic) of a
// rows × cols tensor, plus its bf16 copy ob (row stride ld). Grid-stride
// over rows × ld.
extern "C" __global__ void kvx_fswiglu(float* out, unsigned short* ob, const float* g, const float* u, ll rows, ll cols,
		ll ld, ll fma) {
	pdl_wait();
	const ll n = rows * ld;
	for (ll i = (ll)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (ll)gridDim.x * blockDim.x) {
		const ll r = i / ld, c = i - r * ld;
		if (c >= cols) {
			ob[i] = 0;
			continue;
		}
		const ll at = r * cols + c;
		const float v = g[at];
		const float y = __fmul_rn(__fdiv_rn(v, __fadd_rn(1.0f, exp32(-v, fma))), u[at]);
		out[at] = y;
		ob[i] = to_bf16(y);
	}
}

// kvx_fswiglu_fold is kvx_fswiglu with g and u the folds of one split
// matmul's parts: P holds rows × N sums (N the launch's columns), g's at
// columns gc.., u's at uc.. of each row.
extern "C" __global__ void kvx_fswiglu_fold(float* out, unsigned short* ob, const float* P, ll parts, ll N, ll gc,
		ll uc, ll rows, ll cols, ll ld, ll fma) {
	pdl_wait();
	const ll n = rows * ld, np = rows * N;
	for (ll i = (ll)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (ll)gridDim.x * blockDim.x) {
		const ll r = i / ld, c = i - r * ld;
		if (c >= cols) {
			ob[i] = 0;
			continue;
		}
		const float v = fold_at(P, parts, np, r * N + gc + c);
		const float y = __fmul_rn(__fdiv_rn(v, __fadd_rn(1.0f, exp32(-v, fma))), fold_at(P, parts, np, r * N + uc + c));
		out[r * cols + c] = y;
		ob[i] = to_bf16(y);
	}
}
