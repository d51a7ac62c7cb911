// Mamba2's sequence part (kernel.Mamba2.Forward of package kernel, the cpu
// device's reference), for every segment of one call in one pass:
//
//   kvx_mamba_dt          dt = Softplus(dt + bias), floored per row; dA = exp(dt*A)
//   kvx_mamba_conv        the causal depthwise conv1d and SiLU of every row
//   kvx_mamba_conv_state  the conv state after saves and after the segment
//   kvx_mamba_scan        the recurrence, token by token, and the D skip
//   kvx_mamba_norm        the silu(z) gate and the grouped RMSNorm
//   kvx_mamba_zero        zeroes state slots (a sequence at position 0)
//
// Every float32 operation is the Go code's, in its order, with explicit
// round-to-nearest intrinsics (the PTX is also built with -fmad=false);
// exp and log1p are Go's math.Exp (gomath.cuh, on the path the device sets)
// and math.Log1p (go_log1p) in double, sqrt IEEE double, then rounded.
//
// A segment's state is read from its live slot once and written back once:
// the conv state holds rounded conv inputs and the ssm state is rounded to
// its dtype after every token, so the bytes are what the cpu device's
// chunked passes leave. Saves (snapshots, draft-tail states) write the state
// after m tokens of the segment into other slots on the way.
//
// Segment descriptors, SEG_WORDS long long each: the live conv and ssm state
// addresses, the segment's first row and row count, its first save and save
// count. Saves, SAVE_WORDS each, in increasing m: m (tokens of the segment
// the state covers), the conv and ssm destinations (0: none).

#include "gomath.cuh"

#define SEG_CONV 0
#define SEG_SSM 1
#define SEG_ROW0 2
#define SEG_ROWS 3
#define SEG_SAVE0 4
#define SEG_SAVES 5
#define SEG_WORDS 6

#define SAVE_M 0
#define SAVE_CONV 1
#define SAVE_SSM 2
#define SAVE_WORDS 3

// bf16_bits is kernel.BF16FromFloat32: round to nearest even, NaN kept quiet.
__device__ __forceinline__ unsigned short bf16_bits(float f) {
	unsigned int b = __float_as_uint(f);
	if ((b & 0x7fffffffu) > 0x7f800000u) {
		return (unsigned short)((b >> 16) | 0x0040u);
	}
	b += 0x7fffu + ((b >> 16) & 1u);
	return (unsigned short)(b >> 16);
}

__device__ __forceinline__ float bf16_value(unsigned short h) {
	return __uint_as_float(((unsigned int)h) << 16);
}

// rounded is kernel.Round for float32 (no-op) or bf16.
__device__ __forceinline__ float rounded(float v, long long bf16) {
	return bf16 ? bf16_value(bf16_bits(v)) : v;
}

// Element i of a state buffer at dtype float32 or bf16. A slot's buffers
// start at even byte offsets but a float32 buffer after a bf16 one may be
// only 2-byte aligned: its elements then move as two 16-bit halves
// (little-endian).
__device__ __forceinline__ bool aligned4(const void* p) { return ((unsigned long long)p & 3) == 0; }

__device__ __forceinline__ float load_state(const void* p, long long i, long long bf16) {
	if (bf16) {
		return bf16_value(((const unsigned short*)p)[i]);
	}
	const float* f = (const float*)p + i;
	if (aligned4(f)) {
		return *f;
	}
	const unsigned short* u = (const unsigned short*)f;
	return __uint_as_float((unsigned int)u[0] | ((unsigned int)u[1] << 16));
}

__device__ __forceinline__ void store_state(void* p, long long i, float v, long long bf16) {
	if (bf16) {
		((unsigned short*)p)[i] = bf16_bits(v);
		return;
	}
	float* f = (float*)p + i;
	if (aligned4(f)) {
		*f = v;
		return;
	}
	unsigned int b = __float_as_uint(v);
	unsigned short* u = (unsigned short*)f;
	u[0] = (unsigned short)b;
	u[1] = (unsigned short)(b >> 16);
}

// copy_state copies element src of a state buffer to element dst of another,
// bit for bit.
__device__ __forceinline__ void copy_state(void* d, long long dst, const void* s, long long src, long long bf16) {
	if (bf16) {
		((unsigned short*)d)[dst] = ((const unsigned short*)s)[src];
		return;
	}
	unsigned short* to = (unsigned short*)((float*)d + dst);
	const unsigned short* from = (const unsigned short*)((const float*)s + src);
	to[0] = from[0];
	to[1] = from[1];
}

// silu is kernel.SiLU: x / (1 + exp32(-x)).
__device__ __forceinline__ float silu(float x) { return __fdiv_rn(x, __fadd_rn(1.0f, exp32g(-x))); }

// kvx_mamba_dt: one thread per (row, head). dts = Softplus(dt + bias) (x for
// x > 20, else float32(Log1p(Exp(x))) in double), then max(dts, floor)
// where the row's floor is > 0 (a NaN stays); dAs = exp32(dts * A).
extern "C" __global__ void kvx_mamba_dt(const float* dt, const float* bias, const float* A, const float* floors,
	float* dts, float* dAs, long long rows, long long heads) {
	long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
	if (i >= rows * heads) {
		return;
	}
	long long r = i / heads, h = i - r * heads;
	float v = __fadd_rn(dt[i], bias[h]);
	float sp = v;
	if (!(v > 20.0f)) {
		sp = __double2float_rn(go_log1p(go_exp((double)v, kvx_exp_fma)));
	}
	float f = floors[r];
	if (f > 0.0f && sp == sp && !(sp > f)) {
		sp = f;
	}
	dts[i] = sp;
	dAs[i] = exp32g(__fmul_rn(sp, A[h]));
}

// kvx_mamba_conv: grid (rows, channel blocks). Row i of a segment at channel
// c: acc = bias, then acc += w[k] * in_k for k ascending, in_k the rounded
// conv input k-(K-1) tokens back: a row of this call, or the segment's conv
// state for tokens before it. xc = SiLU(acc).
extern "C" __global__ void kvx_mamba_conv(const float* xbc, const long long* segs, const int* rowSeg,
	const float* convW, const float* convB, float* xc, long long rows, long long cd, long long K, long long bf16) {
	long long r = blockIdx.x;
	long long c = (long long)blockIdx.y * blockDim.x + threadIdx.x;
	if (r >= rows || c >= cd) {
		return;
	}
	const long long* sg = segs + SEG_WORDS * (long long)rowSeg[r];
	const void* conv = (const void*)sg[SEG_CONV];
	long long row0 = sg[SEG_ROW0];
	long long i = r - row0;
	float acc = convB[c];
	for (long long k = 0; k < K; k++) {
		long long src = i - (K - 1) + k;
		float in;
		if (src >= 0) {
			in = rounded(xbc[(row0 + src) * cd + c], bf16);
		} else {
			in = load_state(conv, (i + k) * cd + c, bf16); // state entry K-1+src
		}
		acc = __fadd_rn(acc, __fmul_rn(convW[c * K + k], in));
	}
	xc[r * cd + c] = silu(acc);
}

// kvx_mamba_conv_state: grid (segments, channel blocks), K > 1. The conv
// state after m tokens of a segment holds, oldest first, the conv inputs of
// tokens m-(K-1) .. m-1: rows of the call, or entries of the state before
// it. A thread owns one channel: it writes the segment's saves from the old
// state, then shifts the live state in place (entry k reads entry n+k > k,
// not yet overwritten in ascending k).
extern "C" __global__ void kvx_mamba_conv_state(const float* xbc, const long long* segs, const long long* saves,
	long long cd, long long K, long long bf16) {
	const long long* sg = segs + SEG_WORDS * (long long)blockIdx.x;
	long long c = (long long)blockIdx.y * blockDim.x + threadIdx.x;
	if (c >= cd || K < 2) {
		return;
	}
	void* live = (void*)sg[SEG_CONV];
	long long row0 = sg[SEG_ROW0], n = sg[SEG_ROWS];
	const long long* sv = saves + SAVE_WORDS * sg[SEG_SAVE0];
	for (long long s = 0; s < sg[SEG_SAVES]; s++) {
		long long m = sv[SAVE_WORDS * s + SAVE_M];
		void* dst = (void*)sv[SAVE_WORDS * s + SAVE_CONV];
		if (dst == 0) {
			continue;
		}
		for (long long k = 0; k < K - 1; k++) {
			long long src = m - (K - 1) + k;
			if (src >= 0) {
				store_state(dst, k * cd + c, xbc[(row0 + src) * cd + c], bf16);
			} else {
				copy_state(dst, k * cd + c, live, (m + k) * cd + c, bf16);
			}
		}
	}
	for (long long k = 0; k < K - 1; k++) {
		long long src = n - (K - 1) + k;
		if (src >= 0) {
			store_state(live, k * cd + c, xbc[(row0 + src) * cd + c], bf16);
		} else {
			copy_state(live, k * cd + c, live, (n + k) * cd + c, bf16);
		}
	}
}

// kvx_mamba_scan: grid (segments, heads, head-dim tiles of PT <= 32 rows),
// PT*N <= 2048, blockDim SCAN_UPDATERS + 32, dynamic shared memory
// 2*PT*(N+1) + 3*(PT+2N+2) floats. The block keeps its tile of the ssm
// state in registers (element e = p*N + n, owned by one updater thread)
// and walks the segment's tokens in order:
//
//   s = s*dA + (dt*x[p]) * B[n], rounded to the state dtype
//   y[p] = 0 + s[0]*C[0] + s[1]*C[1] + ... (n ascending) + D*x[p]
//
// Per token i, between two barriers: the updaters compute token i's state
// and its products s*C (into one of two buffers) from the token's inputs
// (x tile, B, C, dt, dA) staged in shared memory, and start the copies of
// token i+1's inputs (cp.async, three stages); the last warp (one thread
// per p) sums token i-1's products in order. ys gets y (before the gate);
// the live state the final s; saves the state after their m tokens.
#define SCAN_UPDATERS 256
#define SCAN_MAXQ 8 // state elements per updater thread: PT*N <= 2048

__device__ __forceinline__ void cp_async4(float* dst, const float* src) {
	unsigned int d = (unsigned int)__cvta_generic_to_shared(dst);
	asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(d), "l"(src) : "memory");
}

// scan_stage copies token r's inputs of the block into tok (by the updaters).
__device__ __forceinline__ void scan_stage(float* tok, const float* xc, const float* dts, const float* dAs, long long r,
	long long cd, long long di, long long H, long long h, long long P, long long p0, int pt, long long G, long long g,
	int n_, int tid) {
	int L = pt + 2 * n_ + 2;
	const float* row = xc + r * cd;
	for (int a = tid; a < L; a += SCAN_UPDATERS) {
		const float* src;
		if (a < pt) {
			src = row + h * P + p0 + a;
		} else if (a < pt + n_) {
			src = row + di + g * n_ + (a - pt);
		} else if (a < pt + 2 * n_) {
			src = row + di + G * n_ + g * n_ + (a - pt - n_);
		} else if (a == pt + 2 * n_) {
			src = dts + r * H + h;
		} else {
			src = dAs + r * H + h;
		}
		cp_async4(tok + a, src);
	}
	asm volatile("cp.async.commit_group;\n" ::: "memory");
}

// Four blocks per SM (at most 56 registers a thread): a prefill segment's
// 512 blocks of a 128-head layer then run in one wave.
extern "C" __global__ void __launch_bounds__(SCAN_UPDATERS + 32, 4) kvx_mamba_scan(const float* xc, const float* dts, const float* dAs, const long long* segs,
	const long long* saves, const float* D, float* ys, long long H, long long P, long long N, long long G, long long PT,
	long long bf16) {
	extern __shared__ float sh[];
	const int n_ = (int)N;
	const int stride = n_ + 1;
	const int tokLen = (int)PT + 2 * n_ + 2;
	float* prod = sh;                     // two buffers of PT*(N+1)
	float* toks = prod + 2 * PT * stride; // three buffers of tokLen
	const long long* sg = segs + SEG_WORDS * (long long)blockIdx.x;
	long long h = blockIdx.y;
	long long p0 = (long long)blockIdx.z * PT;
	int pt = (int)(P - p0 < PT ? P - p0 : PT);
	int E = pt * n_;
	int tid = threadIdx.x;
	bool updater = tid < SCAN_UPDATERS;
	void* live = (void*)sg[SEG_SSM];
	long long row0 = sg[SEG_ROW0], n = sg[SEG_ROWS];
	const long long* sv = saves + SAVE_WORDS * sg[SEG_SAVE0];
	long long nsv = sg[SEG_SAVES];
	long long di = H * P, cd = di + 2 * G * N;
	long long g = h / (H / G);
	long long base = (h * P + p0) * N; // the tile's first element in the state
	long long k = 0;
	// An updater's elements e = tid + q*SCAN_UPDATERS (E <= SCAN_UPDATERS*SCAN_MAXQ).
	float s[SCAN_MAXQ];
	int at[SCAN_MAXQ]; // (p << 16) | n of element q
	if (updater) {
		if (n > 0) {
			scan_stage(toks, xc, dts, dAs, row0, cd, di, H, h, P, p0, pt, G, g, n_, tid);
		}
#pragma unroll
		for (int q = 0; q < SCAN_MAXQ; q++) {
			int e = tid + q * SCAN_UPDATERS;
			at[q] = ((e / n_) << 16) | (e % n_);
			s[q] = e < E ? load_state(live, base + e, bf16) : 0.0f;
		}
		for (; k < nsv && sv[SAVE_WORDS * k + SAVE_M] == 0; k++) {
			void* dst = (void*)sv[SAVE_WORDS * k + SAVE_SSM];
#pragma unroll
			for (int q = 0; q < SCAN_MAXQ; q++) {
				int e = tid + q * SCAN_UPDATERS;
				if (dst != 0 && e < E) {
					store_state(dst, base + e, s[q], bf16);
				}
			}
		}
		asm volatile("cp.async.wait_group 0;\n" ::: "memory");
	}
	__syncthreads();
	float Dh = D[h];
	for (long long i = 0; i <= n; i++) {
		if (updater && i < n) {
			if (i + 1 < n) {
				scan_stage(toks + ((i + 1) % 3) * tokLen, xc, dts, dAs, row0 + i + 1, cd, di, H, h, P, p0, pt, G, g, n_, tid);
			}
			const float* tk = toks + (i % 3) * tokLen;
			const float* Bg = tk + pt;
			const float* Cg = Bg + n_;
			float dth = Bg[2 * n_], dA = Bg[2 * n_ + 1];
			float* pr = prod + (i & 1) * PT * stride;
#pragma unroll
			for (int q = 0; q < SCAN_MAXQ; q++) {
				if (tid + q * SCAN_UPDATERS < E) {
					int pl = at[q] >> 16, j = at[q] & 0xffff;
					float dtx = __fmul_rn(dth, tk[pl]);
					float v = __fadd_rn(__fmul_rn(s[q], dA), __fmul_rn(dtx, Bg[j]));
					if (bf16) {
						v = rounded(v, 1);
					}
					s[q] = v;
					pr[pl * stride + j] = __fmul_rn(v, Cg[j]);
				}
			}
			for (; k < nsv && sv[SAVE_WORDS * k + SAVE_M] == i + 1; k++) {
				void* dst = (void*)sv[SAVE_WORDS * k + SAVE_SSM];
#pragma unroll
				for (int q = 0; q < SCAN_MAXQ; q++) {
					int e = tid + q * SCAN_UPDATERS;
					if (dst != 0 && e < E) {
						store_state(dst, base + e, s[q], bf16);
					}
				}
			}
			asm volatile("cp.async.wait_group 0;\n" ::: "memory");
		}
		int q = tid - SCAN_UPDATERS;
		if (!updater && i > 0 && q < pt) {
			long long r = row0 + i - 1;
			const float* pr = prod + ((i - 1) & 1) * PT * stride + q * stride;
			// In order from 0; the loads of a chunk go out before its adds.
			float y = 0.0f;
			int j = 0;
			for (; j + 16 <= n_; j += 16) {
				float a[16];
#pragma unroll
				for (int u = 0; u < 16; u++) {
					a[u] = pr[j + u];
				}
#pragma unroll
				for (int u = 0; u < 16; u++) {
					y = __fadd_rn(y, a[u]);
				}
			}
			for (; j < n_; j++) {
				y = __fadd_rn(y, pr[j]);
			}
			float xv = toks[((i - 1) % 3) * tokLen + q];
			ys[r * di + h * P + p0 + q] = __fadd_rn(y, __fmul_rn(Dh, xv));
		}
		__syncthreads();
	}
	if (updater) {
#pragma unroll
		for (int q = 0; q < SCAN_MAXQ; q++) {
			int e = tid + q * SCAN_UPDATERS;
			if (e < E) {
				store_state(live, base + e, s[q], bf16);
			}
		}
	}
}

// kvx_mamba_norm: grid (rows, groups), blockDim >= 4. y *= SiLU(z) in place,
// then RMSNorm over the group of di/G elements as kernel.RMSNorm: the mean
// square is kernel.Dot (four lanes, element i in lane i%4, ascending, then
// (s0+s1)+(s2+s3)), inv = 1/sqrt(ms + eps) in double, out = (y*inv)*w.
extern "C" __global__ void kvx_mamba_norm(float* ys, const float* z, const float* w, float* out, long long di,
	long long G, float eps) {
	__shared__ float part[4];
	__shared__ float sinv;
	long long r = blockIdx.x, grp = blockIdx.y;
	long long gs = di / G;
	long long off = r * di + grp * gs;
	float* y = ys + off;
	const float* zz = z + off;
	long long tid = threadIdx.x, T = blockDim.x;
	for (long long i = tid; i < gs; i += T) {
		y[i] = __fmul_rn(y[i], silu(zz[i]));
	}
	__syncthreads();
	if (tid < 4) {
		float s = 0.0f;
		for (long long i = tid; i < gs; i += 4) {
			s = __fadd_rn(s, __fmul_rn(y[i], y[i]));
		}
		part[tid] = s;
	}
	__syncthreads();
	if (tid == 0) {
		float ss = __fadd_rn(__fadd_rn(part[0], part[1]), __fadd_rn(part[2], part[3]));
		float ms = __fdiv_rn(ss, (float)gs);
		sinv = (float)__ddiv_rn(1.0, __dsqrt_rn((double)__fadd_rn(ms, eps)));
	}
	__syncthreads();
	float inv = sinv;
	const float* wg = w + grp * gs;
	for (long long i = tid; i < gs; i += T) {
		out[off + i] = __fmul_rn(__fmul_rn(y[i], inv), wg[i]);
	}
}

// kvx_mamba_zero: one block per (address, bytes) pair, zeroed.
extern "C" __global__ void kvx_mamba_zero(const unsigned long long* jobs) {
	char* dst = (char*)jobs[2 * blockIdx.x];
	long long size = (long long)jobs[2 * blockIdx.x + 1];
	if ((((unsigned long long)dst | (unsigned long long)size) & 15) == 0) {
		int4* d = (int4*)dst;
		for (long long i = threadIdx.x; i < size / 16; i += blockDim.x) {
			d[i] = make_int4(0, 0, 0, 0);
		}
		return;
	}
	for (long long i = threadIdx.x; i < size; i += blockDim.x) {
		dst[i] = 0;
	}
}
