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
// Each also has a variant that takes its input straight from a split
// matmul's parts (P: parts × n float32, n = rows × the launch's columns),
// added in kvx_fgemm_fold's order, so the fold's own launch (and its write
// and read of the sum) is skipped with the fold's values and so its bits:
// kvx_frmsnorm_fold and kvx_fswiglu_fold (device/cuda's pendingFold).
#include "mma.cuh"
#include "pdl.cuh"
#include "gomath.cuh" // ll
#include "fold.cuh"
#include "fsilu.cuh"

#define FN_THREADS 256

// frms_inv is a row's 1/sqrt(sum/cols + eps) from s, the sum of squares
// of each of the block's first FN_THREADS threads (0 in the others): the
// warps' sums meet in the xor butterfly and then in warp order. Every
// thread gets it; ws is the block's FN_THREADS/32 floats.
__device__ __forceinline__ float frms_inv(float s, float* ws, ll cols, float eps) {
	const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
#pragma unroll
	for (int m = 16; m > 0; m >>= 1) s = __fadd_rn(s, __shfl_xor_sync(0xffffffffu, s, m));
	if (lane == 0 && warp < FN_THREADS / 32) ws[warp] = s;
	__syncthreads();
	float dot = ws[0];
#pragma unroll
	for (int i = 1; i < FN_THREADS / 32; i++) dot = __fadd_rn(dot, ws[i]);
	const float ms = __fdiv_rn(dot, __ll2float_rn(cols));
	return __double2float_rn(__ddiv_rn(1.0, __dsqrt_rn((double)__fadd_rn(ms, eps))));
}

// frms_out writes row r's outputs float32(x·inv)·w (and their bf16 copy
// when ob is not 0), nt threads, each value the same whatever nt. A
// thread's 8 loads are issued before its first store (out may be x).
__device__ __forceinline__ void frms_out(float* out, unsigned short* ob, const float* xr, const float* w, float inv,
		ll r, ll cols, ll ld, int nt) {
	const int t = threadIdx.x;
	float* o = out + r * cols;
	unsigned short* b = ob ? ob + r * ld : nullptr;
	for (ll i0 = t; i0 < cols; i0 += 8 * nt) {
		float xv[8], wv[8];
#pragma unroll
		for (int j = 0; j < 8; j++) {
			const ll i = i0 + j * nt;
			xv[j] = i < cols ? xr[i] : 0.0f;
			wv[j] = i < cols ? w[i] : 0.0f;
		}
#pragma unroll
		for (int j = 0; j < 8; j++) {
			const ll i = i0 + j * nt;
			if (i >= cols) break;
			const float y = __fmul_rn(__fmul_rn(xv[j], inv), wv[j]);
			o[i] = y;
			if (b) b[i] = to_bf16(y);
		}
	}
	if (b) {
		for (ll i = cols + t; i < ld; i += nt) b[i] = 0;
	}
}

// kvx_frmsnorm: grid min(rows, 65535) (grid-stride), FN_THREADS threads.
// When y is not 0 the residual add before the norm is done here too: x +=
// y (in place, kvx_add's sum), then out = RMSNorm(x): one launch and one
// read of x instead of two (hf.AddNormer).
extern "C" __global__ void __launch_bounds__(FN_THREADS) kvx_frmsnorm(float* out, unsigned short* ob, float* x,
		const float* y, const float* w, ll rows, ll cols, ll ld, float eps) {
	pdl_wait();
	__shared__ float ws[FN_THREADS / 32];
	const int t = threadIdx.x;
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
		} else {
#pragma unroll 8
			for (ll i = t; i < cols; i += FN_THREADS) s = __fadd_rn(s, __fmul_rn(xr[i], xr[i]));
		}
		frms_out(out, ob, xr, w, frms_inv(s, ws, cols, eps), r, cols, ld, FN_THREADS);
		__syncthreads(); // ws is read by every thread before the next row writes it
	}
}

// kvx_frmsnorm_fold is kvx_frmsnorm with y the fold of P's parts (a rows
// × cols matmul alone in its launch), FNF_THREADS threads a row: first x
// += the fold, every thread 4 values at a time and their parts 4 at a time
// (a decode step's one row is one block: its loads must be many in
// flight), then the sum of squares by the first FN_THREADS threads in
// kvx_frmsnorm's order, so the bits are the fold launch's and then
// kvx_frmsnorm's.
#define FNF_THREADS 1024
extern "C" __global__ void __launch_bounds__(FNF_THREADS) kvx_frmsnorm_fold(float* out, unsigned short* ob, float* x,
		const float* P, ll parts, const float* w, ll rows, ll cols, ll ld, float eps) {
	pdl_wait();
	__shared__ float ws[FN_THREADS / 32];
	const int t = threadIdx.x;
	const ll n = rows * cols;
	for (ll r = blockIdx.x; r < rows; r += gridDim.x) {
		float* xr = x + r * cols;
		const float* pr = P + r * cols;
		for (ll i0 = t; i0 < cols; i0 += 4 * FNF_THREADS) {
			float v[4];
#pragma unroll
			for (int j = 0; j < 4; j++) {
				const ll i = i0 + j * FNF_THREADS;
				v[j] = i < cols ? pr[i] : 0.0f;
			}
			for (ll p = 1; p < parts; p += 4) {
				float q[4][4];
#pragma unroll
				for (int a = 0; a < 4; a++) {
#pragma unroll
					for (int j = 0; j < 4; j++) {
						const ll i = i0 + j * FNF_THREADS;
						q[a][j] = p + a < parts && i < cols ? pr[(p + a) * n + i] : 0.0f;
					}
				}
#pragma unroll
				for (int a = 0; a < 4; a++) {
					if (p + a >= parts) break;
#pragma unroll
					for (int j = 0; j < 4; j++) v[j] = __fadd_rn(v[j], q[a][j]);
				}
			}
#pragma unroll
			for (int j = 0; j < 4; j++) {
				const ll i = i0 + j * FNF_THREADS;
				if (i < cols) xr[i] = __fadd_rn(xr[i], v[j]);
			}
		}
		__syncthreads(); // x's row is whole before any thread reads it back
		float s = 0.0f;
		if (t < FN_THREADS) {
			for (ll i = t; i < cols; i += FN_THREADS) s = __fadd_rn(s, __fmul_rn(xr[i], xr[i]));
		}
		frms_out(out, ob, xr, w, frms_inv(s, ws, cols, eps), r, cols, ld, FNF_THREADS);
		__syncthreads(); // ws and x's row are read before the next row writes them
	}
}

// kvx_frmsnorm_fold8 is kvx_frmsnorm_fold for a few rows (a decode
// step's): a row is a cluster of FNS_SLICES blocks (grid (FNS_SLICES,
// rows)), so that its fold's loads come from eight SMs instead of one. The
// block of rank s owns the columns i with (i mod FN_THREADS) / 32 == s: the
// columns whose squares kvx_frmsnorm's warp s sums. Each thread folds its
// columns and adds them to x (kvx_frmsnorm_fold's order), and keeps them in
// shared memory; warp 0 sums the squares of its lane's chain (kvx_frmsnorm's
// thread 32·s + lane: ascending i) and the warp's sums meet in the same xor
// butterfly; then every block of the cluster reads the eight warp sums from
// the others' shared memory in rank order, the order in which frms_inv adds
// them, so every block gets kvx_frmsnorm's inv and writes its own columns'
// outputs. The same bits as kvx_frmsnorm_fold (TestFusedFold).
#define FNS_SLICES (FN_THREADS / 32)
#define FNS_THREADS 512
#define FNS_MAXCOLS 16384 // xs's columns: FNS_MAXCOLS / FNS_SLICES a block (device/cuda's fnSliceCols)
__device__ __forceinline__ void cluster_sync() {
	asm volatile("barrier.cluster.arrive;\nbarrier.cluster.wait;\n" ::: "memory");
}
extern "C" __global__ void __cluster_dims__(FNS_SLICES, 1, 1) __launch_bounds__(FNS_THREADS)
		kvx_frmsnorm_fold8(float* out, unsigned short* ob, float* x, const float* P, ll parts, const float* w, ll rows,
		ll cols, ll ld, float eps) {
	pdl_wait();
	__shared__ float xs[FNS_MAXCOLS / FNS_SLICES]; // the block's columns of x, by (j, lane): column 256·j + 32·s + lane
	__shared__ float ws;                            // the warp sum of the block's chains
	const int s = blockIdx.x, t = threadIdx.x, lane = t % 32;
	const ll n = rows * cols, J = (cols + FN_THREADS - 1) / FN_THREADS;
	for (ll r = blockIdx.y; r < rows; r += gridDim.y) {
		float* xr = x + r * cols;
		const float* pr = P + r * cols;
		for (ll j = t / 32; j < J; j += FNS_THREADS / 32) {
			const ll i = FN_THREADS * j + 32 * s + lane;
			if (i >= cols) continue;
			const float x0 = xr[i];
			float v = pr[i];
			for (ll p = 1; p < parts; p += 8) {
				float q[8];
#pragma unroll
				for (int a = 0; a < 8; a++) q[a] = p + a < parts ? pr[(p + a) * n + i] : 0.0f;
#pragma unroll
				for (int a = 0; a < 8; a++) {
					if (p + a >= parts) break;
					v = __fadd_rn(v, q[a]);
				}
			}
			const float y = __fadd_rn(x0, v);
			xr[i] = y;
			xs[32 * j + lane] = y;
		}
		__syncthreads();
		if (t < 32) {
			float sq = 0.0f;
			for (ll j = 0; j < J && FN_THREADS * j + 32 * s + lane < cols; j++) sq = __fadd_rn(sq, __fmul_rn(xs[32 * j + lane], xs[32 * j + lane]));
#pragma unroll
			for (int m = 16; m > 0; m >>= 1) sq = __fadd_rn(sq, __shfl_xor_sync(0xffffffffu, sq, m));
			if (lane == 0) ws = sq;
		}
		cluster_sync(); // every block's ws is written
		const unsigned at = (unsigned)__cvta_generic_to_shared(&ws);
		float dot = 0.0f;
#pragma unroll
		for (unsigned k = 0; k < FNS_SLICES; k++) {
			unsigned ra;
			float v;
			asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(ra) : "r"(at), "r"(k));
			asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(v) : "r"(ra) : "memory");
			dot = k == 0 ? v : __fadd_rn(dot, v);
		}
		cluster_sync(); // every block has read the others' ws before any writes its next row's
		const float ms = __fdiv_rn(dot, __ll2float_rn(cols));
		const float inv = __double2float_rn(__ddiv_rn(1.0, __dsqrt_rn((double)__fadd_rn(ms, eps))));
		float* o = out + r * cols;
		unsigned short* b = ob ? ob + r * ld : nullptr;
		for (ll j = t / 32; j < J; j += FNS_THREADS / 32) {
			const ll i = FN_THREADS * j + 32 * s + lane;
			if (i >= cols) continue;
			const float y = __fmul_rn(__fmul_rn(xs[32 * j + lane], inv), w[i]);
			o[i] = y;
			if (b) b[i] = to_bf16(y);
		}
		if (b && s == 0) {
			for (ll i = cols + t; i < ld; i += FNS_THREADS) b[i] = 0;
		}
		__syncthreads(); // xs is read before the next row writes it
	}
}

// kvx_fswiglu is SiLU(g) * u (fsilu_mul) of a rows × cols tensor, plus
// its bf16 copy ob (row stride ld). Grid-stride over rows × ld.
extern "C" __global__ void kvx_fswiglu(float* out, unsigned short* ob, const float* g, const float* u, ll rows, ll cols,
		ll ld) {
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
		const float y = fsilu_mul(v, u[at]);
		out[at] = y;
		ob[i] = to_bf16(y);
	}
}

// kvx_fswiglu_fold is kvx_fswiglu with g and u the folds of one split
// matmul's parts: P holds rows × N sums (N the launch's columns), g's at
// columns gc.., u's at uc.. of each row.
extern "C" __global__ void kvx_fswiglu_fold(float* out, unsigned short* ob, const float* P, ll parts, ll N, ll gc,
		ll uc, ll rows, ll cols, ll ld) {
	pdl_wait();
	const ll n = rows * ld, np = rows * N;
	for (ll i = (ll)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (ll)gridDim.x * blockDim.x) {
		const ll r = i / ld, c = i - r * ld;
		if (c >= cols) {
			ob[i] = 0;
			continue;
		}
		const float v = fold_at(P, parts, np, r * N + gc + c);
		const float y = fsilu_mul(v, fold_at(P, parts, np, r * N + uc + c));
		out[r * cols + c] = y;
		ob[i] = to_bf16(y);
	}
}
