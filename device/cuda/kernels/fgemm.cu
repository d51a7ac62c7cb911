// The fast matmul (dtype bfloat16): C = A · W^T with A M × K activations
// rounded to bf16, W N × K a linear layer's bf16 weight, float32
// accumulation on tensor cores, C M × N float32.
//
// # Reduction order: one chain per output, whatever M
//
// Both operands are stored with a row stride ld, a multiple of 64 that
// depends on K alone (fgemm.go pads K with zeros to it). Every output
// element is one float32 accumulator that mma.sync.m16n8k16 advances over
// the k16 steps 0, 16, ..., ld-16 in ascending order, starting from zero:
// no split-K, no atomics, no reduction across threads. Every kernel here
// (the skinny one for few rows, the tiled one for many) runs that same
// chain, so a row's outputs do not depend on how many rows the call has,
// where the row sits in a tile, which kernel ran or the grid: the fast
// matmul is batch-invariant (fgemm_test.go checks it bit for bit).
#include "mma.cuh"

// cp_async16_zfill copies 16 bytes global -> shared when ok, and writes 16
// zero bytes (reading nothing) when not: rows past M or N.
__device__ __forceinline__ void cp_async16_zfill(void* dst, const void* src, bool ok) {
	asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src), "r"(ok ? 16 : 0));
}

// kvx_to_bf16: y (rows × ld bf16) = x (rows × cols float32) rounded to
// nearest even, columns cols..ld-1 zero. Grid-stride over rows × ld.
extern "C" __global__ void kvx_to_bf16(unsigned short* y, const float* x, long long rows, long long cols, long long ld) {
	const long long n = rows * ld;
	for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
		const long long r = i / ld, c = i - r * ld;
		unsigned short h = 0;
		if (c < cols) {
			const unsigned u = __float_as_uint(x[r * cols + c]);
			h = (u & 0x7fffffffu) > 0x7f800000u ? (unsigned short)((u >> 16) | 0x40u) : (unsigned short)bf16_rne(__uint_as_float(u));
		}
		y[i] = h;
	}
}

// kvx_pad_bf16: y (rows × ld bf16) = x (rows × cols bf16), columns
// cols..ld-1 zero. Grid-stride over rows × ld.
extern "C" __global__ void kvx_pad_bf16(unsigned short* y, const unsigned short* x, long long rows, long long cols, long long ld) {
	const long long n = rows * ld;
	for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
		const long long r = i / ld, c = i - r * ld;
		y[i] = c < cols ? x[r * cols + c] : (unsigned short)0;
	}
}

// kvx_bf16_to_f32: y (rows × cols float32) = x (rows × ld bf16), exactly.
extern "C" __global__ void kvx_bf16_to_f32(float* y, const unsigned short* x, long long rows, long long cols, long long ld) {
	const long long n = rows * cols;
	for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
		const long long r = i / cols, c = i - r * cols;
		y[i] = bf16_float(x[r * ld + c]);
	}
}

// kvx_gather_bf16: out row i (cols float32) = row idx[i] of table (ld bf16),
// exactly. Grid: one block per row (grid-stride past 65535).
extern "C" __global__ void kvx_gather_bf16(float* out, const unsigned short* table, const int* idx, long long rows, long long cols, long long ld) {
	for (long long i = blockIdx.x; i < rows; i += gridDim.x) {
		const unsigned short* src = table + (long long)idx[i] * ld;
		for (long long c = threadIdx.x; c < cols; c += blockDim.x) out[i * cols + c] = bf16_float(src[c]);
	}
}

// The skinny kernel: a block of WARPS warps covers 16·MT rows and
// 8·WARPS columns; every warp owns 8 columns (one n8 tile) and all the
// block's rows, the A tile is shared. Few warps a block and one warp per 8
// columns keep many blocks streaming the weight when M is small (decode),
// which is what bounds the time there. Operands travel global -> shared by
// cp.async in an SK_STAGES ring of SK_BK-wide k tiles, shared -> registers
// by ldmatrix. Shared rows are SK_BK bf16 = 8 chunks of 16 bytes; chunk c
// of row r is stored at c ^ (r % 8), so the 8 rows an ldmatrix reads hit 8
// bank groups. The grid's x walks the row tiles, so the blocks that read
// the same weight columns run together and all but the first find them in
// L2.
#define SK_BK 64
#define SK_STAGES 6

__device__ __forceinline__ int sk_swz(int r, int ch) { return r * SK_BK + ((ch ^ (r & 7)) * 8); }

template <int MT, int WARPS>
__device__ __forceinline__ void fgemm_skinny(float* C, const unsigned short* A, const unsigned short* W, long long M, long long N, long long ld) {
	extern __shared__ __align__(16) unsigned char sk_smem[];
	constexpr int AR = 16 * MT, BR = 8 * WARPS, ROWS = AR + BR;
	unsigned short* sA = (unsigned short*)sk_smem;
	unsigned short* sB = sA + SK_STAGES * AR * SK_BK;
	const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
	const int g = lane / 4, t4 = lane % 4;
	const long long m0 = (long long)blockIdx.x * AR, n0 = (long long)blockIdx.y * BR;
	const int KT = (int)(ld / SK_BK);

	auto load = [&](int kt) {
		const int st = kt % SK_STAGES;
		const long long k0 = (long long)kt * SK_BK;
		for (int c = tid; c < ROWS * 8; c += 32 * WARPS) {
			const int r = c / 8, ch = c % 8;
			if (r < AR) {
				const long long row = m0 + r;
				const bool ok = row < M;
				cp_async16_zfill(sA + st * AR * SK_BK + sk_swz(r, ch), A + (ok ? row : 0) * ld + k0 + ch * 8, ok);
			} else {
				const int rb = r - AR;
				const long long row = n0 + rb;
				const bool ok = row < N;
				cp_async16_zfill(sB + st * BR * SK_BK + sk_swz(rb, ch), W + (ok ? row : 0) * ld + k0 + ch * 8, ok);
			}
		}
	};

	float acc[MT][4];
#pragma unroll
	for (int i = 0; i < MT; i++) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.f;

#pragma unroll
	for (int s = 0; s < SK_STAGES - 1; s++) {
		if (s < KT) load(s);
		cp_async_commit();
	}
	for (int kt = 0; kt < KT; kt++) {
		cp_async_wait<SK_STAGES - 2>();
		__syncthreads(); // tile kt landed; every warp is done with tile kt-1's stage
		if (kt + SK_STAGES - 1 < KT) load(kt + SK_STAGES - 1);
		cp_async_commit();
		const int st = kt % SK_STAGES;
		const unsigned short* a = sA + st * AR * SK_BK;
		const unsigned short* b = sB + st * BR * SK_BK;
#pragma unroll
		for (int kk = 0; kk < SK_BK / 16; kk += 2) {
			// bf[0], bf[1]: this warp's 8 columns at k16 step kk; bf[2], bf[3] at kk+1.
			unsigned bf[4];
			ldsm_x4(bf, b + sk_swz(warp * 8 + lane % 8, kk * 2 + lane / 8));
#pragma unroll
			for (int j = 0; j < 2; j++) {
#pragma unroll
				for (int mt = 0; mt < MT; mt++) {
					unsigned af[4];
					ldsm_x4(af, a + sk_swz(mt * 16 + lane % 16, (kk + j) * 2 + lane / 16));
					mma_bf16(acc[mt], af, bf[2 * j], bf[2 * j + 1]);
				}
			}
		}
	}
	cp_async_wait<0>();
	const long long c = n0 + warp * 8 + 2 * t4;
#pragma unroll
	for (int mt = 0; mt < MT; mt++) {
		const long long r = m0 + mt * 16 + g;
		if (r < M) {
			if (c < N) C[r * N + c] = acc[mt][0];
			if (c + 1 < N) C[r * N + c + 1] = acc[mt][1];
		}
		if (r + 8 < M) {
			if (c < N) C[(r + 8) * N + c] = acc[mt][2];
			if (c + 1 < N) C[(r + 8) * N + c + 1] = acc[mt][3];
		}
	}
}

// kvx_fgemm_skinny<MT>w<WARPS>: grid (ceil(M / (16·MT)), ceil(N /
// (8·WARPS))), block 32·WARPS, fgemmSkinnySmem(MT, WARPS) bytes of dynamic
// shared memory (fgemm.go). ld is a multiple of SK_BK.
#define SKINNY(MT, WARPS)                                                                                              \
	extern "C" __global__ void __launch_bounds__(32 * WARPS) kvx_fgemm_skinny##MT##w##WARPS(                        \
		float* C, const unsigned short* A, const unsigned short* W, long long M, long long N, long long ld) {         \
		fgemm_skinny<MT, WARPS>(C, A, W, M, N, ld);                                                                  \
	}
SKINNY(1, 1)
SKINNY(1, 2)
SKINNY(1, 4)
SKINNY(2, 1)
SKINNY(2, 2)
SKINNY(2, 4)
SKINNY(4, 1)
SKINNY(4, 2)
SKINNY(4, 4)
SKINNY(4, 8)

// The tiled kernel for many rows: block tile 128 × 128 × 32, 8 warps of
// 64 × 32 (4 × 4 m16n8k16 tiles, 64 float32 accumulators a thread), a
// 4-stage cp.async ring, ldmatrix from rows of 32 bf16 (4 chunks; chunk c of
// row r at c ^ ((r / 2) % 4)). The same k16 chain per output as the skinny
// kernel. Blocks go down TL_GROUP row tiles before the next column tile, so
// a wave of blocks reads a few row and column tiles that L2 holds instead
// of the whole weight once per row tile.
#define TL_BM 128
#define TL_BN 128
#define TL_BK 32
#define TL_STAGES 4
#define TL_THREADS 256
#define TL_GROUP 8

__device__ __forceinline__ int tl_swz(int r, int ch) { return r * TL_BK + ((ch ^ ((r >> 1) & 3)) * 8); }

// kvx_fgemm_tiled: grid (ceil(M / 128) · ceil(N / 128)), block 256,
// fgemmTiledSmem bytes of dynamic shared memory.
extern "C" __global__ void __launch_bounds__(TL_THREADS)
kvx_fgemm_tiled(float* C, const unsigned short* A, const unsigned short* W, long long M, long long N, long long ld) {
	extern __shared__ __align__(16) unsigned char smem[];
	unsigned short* sA = (unsigned short*)smem;
	unsigned short* sB = sA + TL_STAGES * TL_BM * TL_BK;
	const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
	const int g = lane / 4, t4 = lane % 4;
	long long bm, bn;
	{
		const long long mt = (M + TL_BM - 1) / TL_BM, nt = (N + TL_BN - 1) / TL_BN, pid = blockIdx.x;
		const long long per = TL_GROUP * nt, grp = pid / per, first = grp * TL_GROUP;
		const long long rows = mt - first < TL_GROUP ? mt - first : TL_GROUP;
		bm = (first + (pid % per) % rows) * TL_BM;
		bn = ((pid % per) / rows) * TL_BN;
	}
	const int wm = (warp / 4) * 64, wn = (warp % 4) * 32;
	const int KT = (int)(ld / TL_BK);

	auto load = [&](int kt) {
		const int st = kt % TL_STAGES;
		unsigned short* a = sA + st * TL_BM * TL_BK;
		unsigned short* b = sB + st * TL_BN * TL_BK;
		const long long k0 = (long long)kt * TL_BK;
#pragma unroll
		for (int i = 0; i < 2; i++) {
			const int c = tid + i * TL_THREADS, r = c / 4, ch = c % 4;
			const bool oka = bm + r < M, okb = bn + r < N;
			cp_async16_zfill(a + tl_swz(r, ch), A + (oka ? bm + r : 0) * ld + k0 + ch * 8, oka);
			cp_async16_zfill(b + tl_swz(r, ch), W + (okb ? bn + r : 0) * ld + k0 + ch * 8, okb);
		}
	};

	float acc[4][4][4];
#pragma unroll
	for (int i = 0; i < 4; i++)
#pragma unroll
		for (int j = 0; j < 4; j++) acc[i][j][0] = acc[i][j][1] = acc[i][j][2] = acc[i][j][3] = 0.f;

#pragma unroll
	for (int s = 0; s < TL_STAGES - 1; s++) {
		if (s < KT) load(s);
		cp_async_commit();
	}
	for (int kt = 0; kt < KT; kt++) {
		cp_async_wait<TL_STAGES - 2>();
		__syncthreads();
		if (kt + TL_STAGES - 1 < KT) load(kt + TL_STAGES - 1);
		cp_async_commit();
		const int st = kt % TL_STAGES;
		const unsigned short* a = sA + st * TL_BM * TL_BK;
		const unsigned short* b = sB + st * TL_BN * TL_BK;
#pragma unroll
		for (int kk = 0; kk < TL_BK / 16; kk++) {
			unsigned af[4][4], bf[2][4];
#pragma unroll
			for (int mt = 0; mt < 4; mt++) ldsm_x4(af[mt], a + tl_swz(wm + mt * 16 + lane % 16, kk * 2 + lane / 16));
#pragma unroll
			for (int np = 0; np < 2; np++)
				ldsm_x4(bf[np], b + tl_swz(wn + np * 16 + lane % 8 + (lane / 16) * 8, kk * 2 + (lane / 8) % 2));
#pragma unroll
			for (int mt = 0; mt < 4; mt++)
#pragma unroll
				for (int np = 0; np < 2; np++) {
					mma_bf16(acc[mt][2 * np], af[mt], bf[np][0], bf[np][1]);
					mma_bf16(acc[mt][2 * np + 1], af[mt], bf[np][2], bf[np][3]);
				}
		}
	}
	cp_async_wait<0>();
#pragma unroll
	for (int mt = 0; mt < 4; mt++)
#pragma unroll
		for (int nt = 0; nt < 4; nt++) {
			const long long r = bm + wm + mt * 16 + g, c = bn + wn + nt * 8 + 2 * t4;
			if (r < M) {
				if (c < N) C[r * N + c] = acc[mt][nt][0];
				if (c + 1 < N) C[r * N + c + 1] = acc[mt][nt][1];
			}
			if (r + 8 < M) {
				if (c < N) C[(r + 8) * N + c] = acc[mt][nt][2];
				if (c + 1 < N) C[(r + 8) * N + c + 1] = acc[mt][nt][3];
			}
		}
}
