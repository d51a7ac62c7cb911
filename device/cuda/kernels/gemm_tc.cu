// A bf16 tensor-core GEMM (benchmark-only: the device's matmul is dense.cu's
// exact float32 kernel, whose sums are the cpu's order): C = A · B^T with A
// M × K and B N × K, both row major (B as a linear layer's weight), bf16 in,
// float32 accumulate, C M × N bf16 (rounded to nearest even).
//
// Thread block tile 128 × 128 × 32, 4 warps of 64 × 64 (4 × 8 mma.sync
// m16n8k16 tiles, 128 float32 accumulators a thread), operands moved global
// -> shared by cp.async in a 4-stage ring (GEMM_STAGES tiles in flight, the
// multi-stage form of double buffering) and shared -> registers by ldmatrix.
// Shared rows are 64 bytes (32 bf16, four 16-byte chunks); chunk c of row r
// is stored at chunk c ^ ((r / 2) % 4), so the 8 rows an ldmatrix reads fall
// in 8 distinct bank groups. Each output is one float32 sum in ascending k
// tiles, so the result does not depend on the grid.
#include "mma.cuh"

#define GEMM_BM 128
#define GEMM_BN 128
#define GEMM_BK 32
#define GEMM_STAGES 4
// The dynamic shared memory of kvx_gemm_bf16_tn (gemm_tc.go sets the limit).
#define GEMM_SMEM (GEMM_STAGES * (GEMM_BM + GEMM_BN) * GEMM_BK * 2)

__device__ __forceinline__ int gemm_swz(int r, int ch) { return r * GEMM_BK + ((ch ^ ((r >> 1) & 3)) * 8); }

// kvx_gemm_bf16_tn: grid (N / 128, M / 128), block 128, GEMM_SMEM bytes of
// dynamic shared memory. M and N multiples of 128, K of 32; rows 16-byte
// aligned.
extern "C" __global__ void __launch_bounds__(128)
kvx_gemm_bf16_tn(unsigned short* C, const unsigned short* A, const unsigned short* B, long long M, long long N, long long K) {
	extern __shared__ __align__(16) unsigned char smem[];
	unsigned short* sA = (unsigned short*)smem;
	unsigned short* sB = sA + GEMM_STAGES * GEMM_BM * GEMM_BK;
	const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
	const int g = lane / 4, t4 = lane % 4;
	const long long bm = (long long)blockIdx.y * GEMM_BM, bn = (long long)blockIdx.x * GEMM_BN;
	const int wm = (warp / 2) * 64, wn = (warp % 2) * 64;
	const int KT = (int)(K / GEMM_BK);
	const unsigned short* Ab = A + bm * K;
	const unsigned short* Bb = B + bn * K;

	auto load = [&](int kt) {
		const int st = kt % GEMM_STAGES;
		unsigned short* a = sA + st * GEMM_BM * GEMM_BK;
		unsigned short* b = sB + st * GEMM_BN * GEMM_BK;
		const long long k0 = (long long)kt * GEMM_BK;
#pragma unroll
		for (int i = 0; i < 4; i++) {
			const int c = tid + i * 128, r = c / 4, ch = c % 4;
			cp_async16(a + gemm_swz(r, ch), Ab + r * K + k0 + ch * 8);
			cp_async16(b + gemm_swz(r, ch), Bb + r * K + k0 + ch * 8);
		}
	};

	float acc[4][8][4];
#pragma unroll
	for (int i = 0; i < 4; i++)
#pragma unroll
		for (int j = 0; j < 8; j++) acc[i][j][0] = acc[i][j][1] = acc[i][j][2] = acc[i][j][3] = 0.f;

#pragma unroll
	for (int s = 0; s < GEMM_STAGES - 1; s++) {
		if (s < KT) load(s);
		cp_async_commit();
	}
	for (int kt = 0; kt < KT; kt++) {
		cp_async_wait<GEMM_STAGES - 2>();
		__syncthreads(); // tile kt landed; every warp is done with tile kt-1's stage
		if (kt + GEMM_STAGES - 1 < KT) load(kt + GEMM_STAGES - 1);
		cp_async_commit();
		const int st = kt % GEMM_STAGES;
		const unsigned short* a = sA + st * GEMM_BM * GEMM_BK;
		const unsigned short* b = sB + st * GEMM_BN * GEMM_BK;
#pragma unroll
		for (int kk = 0; kk < GEMM_BK / 16; kk++) {
			unsigned af[4][4], bf[4][4];
#pragma unroll
			for (int mt = 0; mt < 4; mt++) {
				const int r = wm + mt * 16 + lane % 16;
				ldsm_x4(af[mt], a + gemm_swz(r, kk * 2 + lane / 16));
			}
#pragma unroll
			for (int np = 0; np < 4; np++) {
				const int r = wn + np * 16 + lane % 8 + (lane / 16) * 8;
				ldsm_x4(bf[np], b + gemm_swz(r, kk * 2 + (lane / 8) % 2));
			}
#pragma unroll
			for (int mt = 0; mt < 4; mt++)
#pragma unroll
				for (int np = 0; np < 4; np++) {
					mma_bf16(acc[mt][2 * np], af[mt], bf[np][0], bf[np][1]);
					mma_bf16(acc[mt][2 * np + 1], af[mt], bf[np][2], bf[np][3]);
				}
		}
	}
	cp_async_wait<0>();
#pragma unroll
	for (int mt = 0; mt < 4; mt++)
#pragma unroll
		for (int nt = 0; nt < 8; nt++) {
			const long long r = bm + wm + mt * 16 + g, c = bn + wn + nt * 8 + 2 * t4;
			*(unsigned*)(C + r * N + c) = pack_bf16(acc[mt][nt][0], acc[mt][nt][1]);
			*(unsigned*)(C + (r + 8) * N + c) = pack_bf16(acc[mt][nt][2], acc[mt][nt][3]);
		}
}
