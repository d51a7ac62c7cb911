// The fast matmul (dtype bfloat16): C = A · W^T with A M × K activations
// rounded to bf16, W N × K a linear layer's bf16 weight, float32
// accumulation on tensor cores, C M × N float32.
//
// # Reduction order: fixed by K alone, whatever M
//
// Both operands are stored with a row stride ld, a multiple of 64 that
// depends on K alone (fgemm.go pads K with zeros to it). The k range is
// cut into parts of FG_PART values (the last one shorter). Every output
// element is, per part, one float32 accumulator that a tensor-core step
// (mma.sync.m16n8k16 here, wgmma in sm90a/fgemm_wg.cu) advances over the
// part's k16 steps in ascending order from zero, and the
// parts' sums are added in ascending order: ((p0 + p1) + p2) + ... . No
// atomics, no split chosen by the shape of the call. Every kernel here
// (the skinny one for few rows, whose warps run different parts at once
// to keep enough loads in flight, and the tiled one for many) computes
// exactly that, so a row's outputs do not depend on how many rows the
// call has, where the row sits in a tile, which kernel ran or the grid:
// the fast matmul is batch-invariant (fgemm_test.go checks it bit for
// bit).
#include "mma.cuh"
#include "pdl.cuh"
#include "fold.cuh"

// cp_async16_zfill copies 16 bytes global -> shared when ok, and writes 16
// zero bytes (reading nothing) when not: rows past M or N.
__device__ __forceinline__ void cp_async16_zfill(void* dst, const void* src, bool ok) {
	asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src), "r"(ok ? 16 : 0));
}

// # A k16 step's values in any order
//
// Weights and activations keep the logical k order. One tensor-core step
// (mma.sync m16n8k16, wgmma m64nNk16) sums its 16 products as one fused
// operation: on the H200 a permutation of the 16 k values of a step (the
// same on both operands) gives the same bits on every output
// (scripts/kperm-probe.cu: 16.8 million outputs, operands spread from
// 2^-3..2^3 to 2^-60..2^60, random permutations, halves swapped; moving
// one value to the next step changes 31-78% of them), and wgmma with both
// operands in shared memory gives mma.sync's. So a step is defined by its
// set of k values (16s..16s+15), not by which lane holds which: the ring,
// split and tiled kernels load the standard fragments with ldmatrix, the
// direct decode kernel hands each lane of a quad 4 consecutive k values of
// a step (fgemm_gemv), and the wgmma kernels read k-contiguous rows from
// shared memory; all run the same chains.

// kvx_to_bf16: y (rows × ld bf16) = x (rows × cols float32) rounded to
// nearest even, columns cols..ld-1 zero. Grid-stride over rows × ld.
extern "C" __global__ void kvx_to_bf16(unsigned short* y, const float* x, long long rows, long long cols, long long ld) {
	pdl_wait();
	const long long n = rows * ld;
	for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
		const long long r = i / ld, c = i - r * ld;
		y[i] = c < cols ? to_bf16(x[r * cols + c]) : (unsigned short)0;
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
	pdl_wait();
	const long long n = rows * cols;
	for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
		const long long r = i / cols, c = i - r * cols;
		y[i] = bf16_float(x[r * ld + c]);
	}
}

// kvx_gather_bf16: out row i (cols float32) = row idx[i] of table (ld bf16),
// exactly. Grid: one block per row (grid-stride past 65535).
extern "C" __global__ void kvx_gather_bf16(float* out, const unsigned short* table, const int* idx, long long rows, long long cols, long long ld) {
	pdl_wait();
	for (long long i = blockIdx.x; i < rows; i += gridDim.x) {
		const unsigned short* src = table + (long long)idx[i] * ld;
		for (long long c = threadIdx.x; c < cols; c += blockDim.x) out[i * cols + c] = bf16_float(src[c]);
	}
}

#define FG_PART 1024 // k values a part

// The skinny kernels, for few rows (decode): a block has WC × WK warps and
// covers 16·MT rows and 8·WC columns (a warp owns one n8 tile of columns
// and all the block's rows). The WK k slots take the parts in turn: slot
// ks runs parts ks, ks + WK, ...; after each round of WK parts the block
// folds them into the running sum (held by slot 0's warps) in part order,
// so the sum is the same as one warp adding the parts one after another.
// The grid's x walks the row tiles, so the blocks that read the same
// weight columns run together and all but the first find them in L2.
//
// Two ways to feed the warps: kvx_fgemm_gemv* loads each lane's weight
// fragments straight from global memory into registers (two 8-byte loads
// a 32-wide k block, U blocks a chunk, two chunks in flight), and its A
// fragments from global memory too (L1 keeps the few rows); the ring
// kernels kvx_fgemm_skinny* stage A and W through a cp.async ring of
// STAGES BK-wide k tiles a slot, shared by its WC warps with a named
// barrier.
//
// Rows of A past M are not loaded: mma rows are independent, so whatever
// the registers hold reaches only outputs that are never stored. Parts are
// whole k16 steps (ld is a multiple of 64), and a k block past a part's end
// is not loaded or run: the chains are the same for every variant.
//
// A call may cover up to three weights of the same K read by one A (a
// layer's q, k and v, or gate and up): the columns are the concatenation
// of W0's N0 rows, W1's N1 and W2's N2, and output column c goes to the C
// of its weight. Every output is the same sum as in a call of its weight
// alone.
struct skinnyOut {
	float *C0, *C1, *C2;
	const unsigned short *W0, *W1, *W2;
	long long N0, N1, N2; // columns of each weight

	__device__ __forceinline__ long long n() const { return N0 + N1 + N2; }
	// row is weight column n's row (n < n()).
	__device__ __forceinline__ const unsigned short* row(long long n, long long ld) const {
		return n < N0 ? W0 + n * ld : (n < N0 + N1 ? W1 + (n - N0) * ld : W2 + (n - N0 - N1) * ld);
	}
};

// sk_fold adds the round's parts (WK slots' acc, in slot order) into slot
// 0's tot; red is (WK - 1) slots' partial sums in shared memory. Every
// thread of the block calls it once a round; acc is zero after.
template <int MT, int WC, int WK>
__device__ __forceinline__ void sk_fold(float (&acc)[MT][4], float (&tot)[MT][4], float* red, int rd, int inRound, int ks, int wc, int lane) {
	if (ks > 0 && ks < inRound) {
#pragma unroll
		for (int mt = 0; mt < MT; mt++)
#pragma unroll
			for (int e = 0; e < 4; e++) red[((((ks - 1) * MT + mt) * WC + wc) * 32 + lane) * 4 + e] = acc[mt][e];
	}
	if (WK > 1) __syncthreads();
	if (ks == 0) {
#pragma unroll
		for (int mt = 0; mt < MT; mt++)
#pragma unroll
			for (int e = 0; e < 4; e++) {
				float v = rd == 0 ? acc[mt][e] : __fadd_rn(tot[mt][e], acc[mt][e]);
				for (int q = 1; q < inRound; q++) v = __fadd_rn(v, red[((((q - 1) * MT + mt) * WC + wc) * 32 + lane) * 4 + e]);
				tot[mt][e] = v;
			}
	}
	if (WK > 1) __syncthreads(); // red is free for the next round
#pragma unroll
	for (int mt = 0; mt < MT; mt++) acc[mt][0] = acc[mt][1] = acc[mt][2] = acc[mt][3] = 0.f;
}

// sk_store writes slot 0's sums: this warp's 8 columns from n0 + wc·8, the
// block's rows from m0.
template <int MT>
__device__ __forceinline__ void sk_store(const skinnyOut& o, const float (&tot)[MT][4], long long M, long long m0, long long n0, int wc, int lane) {
	const int g = lane / 4, t4 = lane % 4;
#pragma unroll
	for (int e = 0; e < 2; e++) {
		long long c = n0 + wc * 8 + 2 * t4 + e;
		if (c >= o.n()) continue;
		float* C = o.C0;
		long long ldc = o.N0;
		if (c >= o.N0 + o.N1) {
			C = o.C2, ldc = o.N2, c -= o.N0 + o.N1;
		} else if (c >= o.N0) {
			C = o.C1, ldc = o.N1, c -= o.N0;
		}
#pragma unroll
		for (int mt = 0; mt < MT; mt++) {
			const long long r = m0 + mt * 16 + g;
			if (r < M) C[r * ldc + c] = tot[mt][e];
			if (r + 8 < M) C[(r + 8) * ldc + c] = tot[mt][2 + e];
		}
	}
}

// The ring kernels' shared rows are BK bf16 = BK/8 chunks of 16 bytes;
// chunk c of row r is stored at c ^ s(r), s(r) = (r % 8) ^ 4·(r % 2): the 8
// rows an ldmatrix reads (A) hit 8 bank groups, and so do the two rows ×
// four chunks a quarter warp's 16-byte loads read (W, one 32-wide k block
// of two rows).
__device__ __forceinline__ int sk_swz(int r, int ch, int bk) { return r * bk + ((ch ^ (r & 7) ^ ((r & 1) << 2)) * 8); }

// sk_bar synchronizes the nthreads threads of named barrier id (1...).
__device__ __forceinline__ void sk_bar(int id, int nthreads) { asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(nthreads)); }

// sk_load copies one BK-wide k tile from k0 into a ring stage: A's arows
// rows from m0 into a, and br weight columns from n0 into b (zeros past the
// weights' columns or past ld). Thread t of the nthreads that share the
// stage copies chunks t, t + nthreads, ...
template <int BK>
__device__ __forceinline__ void sk_load(unsigned short* a, unsigned short* b, const unsigned short* A, const skinnyOut& o,
		long long m0, long long n0, int arows, int br, long long k0, long long ld, int t, int nthreads) {
	constexpr int CH = BK / 8;
	const long long N = o.n();
	for (int c = t; c < (arows + br) * CH; c += nthreads) {
		const int r = c / CH, ch = c % CH;
		const bool kin = k0 + ch * 8 < ld;
		if (r < arows) {
			cp_async16_zfill(a + sk_swz(r, ch, BK), A + (m0 + r) * ld + (kin ? k0 + ch * 8 : 0), kin);
		} else {
			const long long n = n0 + r - arows;
			const bool ok = n < N && kin;
			cp_async16_zfill(b + sk_swz(r - arows, ch, BK), ok ? o.row(n, ld) + k0 + ch * 8 : o.W0, ok);
		}
	}
}

template <int MT, int WC, int WK, int BK, int STAGES>
__device__ __forceinline__ void fgemm_skinny(const unsigned short* A, const skinnyOut& o, long long M, long long ld) {
	pdl_wait();
	extern __shared__ __align__(16) unsigned char sk_smem[];
	constexpr int AR = 16 * MT, BR = 8 * WC, SLOT = STAGES * (AR + BR) * BK; // bf16 a slot's ring
	const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
	const int ks = warp / WC, wc = warp % WC, st0 = tid - ks * 32 * WC; // k slot, column warp, thread in slot
	unsigned short* sA = (unsigned short*)sk_smem + ks * SLOT;
	unsigned short* sB = sA + STAGES * AR * BK;
	float* red = (float*)((unsigned short*)sk_smem + WK * SLOT); // (WK - 1) slots' partial sums
	const long long m0 = (long long)blockIdx.x * AR, n0 = (long long)blockIdx.y * BR;
	const int arows = (int)(M - m0 < AR ? M - m0 : AR);
	const int parts = (int)((ld + FG_PART - 1) / FG_PART);

	// The slot's k tiles, in order over its parts: tile i of the slot is
	// part ks + WK·(i / TPP), k tile i % TPP of it (some past a short last
	// part's end: not loaded, not run).
	constexpr int TPP = FG_PART / BK;
	const int myParts = parts > ks ? (parts - ks + WK - 1) / WK : 0;
	const int tiles = myParts * TPP;
	auto kOf = [&](int i) -> long long { return (long long)(ks + WK * (i / TPP)) * FG_PART + (long long)(i % TPP) * BK; };
	auto load = [&](int i) {
		const int st = i % STAGES;
		const long long k0 = kOf(i);
		if (k0 >= ld) return;
		sk_load<BK>(sA + st * AR * BK, sB + st * BR * BK, A, o, m0, n0, arows, BR, k0, ld, st0, 32 * WC);
	};

	float acc[MT][4], tot[MT][4];
#pragma unroll
	for (int i = 0; i < MT; i++)
#pragma unroll
		for (int e = 0; e < 4; e++) acc[i][e] = tot[i][e] = 0.f;

#pragma unroll
	for (int s = 0; s < STAGES - 1; s++) {
		if (s < tiles) load(s);
		cp_async_commit();
	}
	const int rounds = (parts + WK - 1) / WK;
	for (int rd = 0; rd < rounds; rd++) {
		// This slot's part of the round (none when the round is short).
		if (rd < myParts) {
			for (int i = rd * TPP; i < (rd + 1) * TPP; i++) {
				cp_async_wait<STAGES - 2>();
				sk_bar(1 + ks, 32 * WC); // tile i landed; the slot is done with tile i-1's stage
				if (i + STAGES - 1 < tiles) load(i + STAGES - 1);
				cp_async_commit();
				const long long k0 = kOf(i);
				if (k0 >= ld) continue;
				const int st = i % STAGES;
				const unsigned short* a = sA + st * AR * BK;
				const unsigned short* b = sB + st * BR * BK;
				const int steps = (int)(ld - k0 < BK ? (ld - k0) / 16 : BK / 16);
#pragma unroll
				for (int kk = 0; kk < BK / 16; kk += 2) {
					if (kk >= steps) break; // ld is a multiple of 64: steps is even
					// bf[0], bf[1]: this warp's 8 columns at k16 step kk; bf[2], bf[3] at kk+1.
					unsigned bf[4];
					ldsm_x4(bf, b + sk_swz(wc * 8 + lane % 8, kk * 2 + lane / 8, BK));
#pragma unroll
					for (int j = 0; j < 2; j++) {
#pragma unroll
						for (int mt = 0; mt < MT; mt++) {
							unsigned af[4];
							ldsm_x4(af, a + sk_swz(mt * 16 + lane % 16, (kk + j) * 2 + lane / 16, BK));
							mma_bf16(acc[mt], af, bf[2 * j], bf[2 * j + 1]);
						}
					}
				}
			}
		}
		sk_fold<MT, WC, WK>(acc, tot, red, rd, parts - rd * WK < WK ? parts - rd * WK : WK, ks, wc, lane);
	}
	cp_async_wait<0>();
	if (ks == 0) sk_store<MT>(o, tot, M, m0, n0, wc, lane);
}

// kvx_fgemm_skinny<MT>c<WC>k<WK>b<BK>s<STAGES>: grid (ceil(M / (16·MT)),
// ceil((N0 + N1 + N2) / (8·WC))), block 32·WC·WK, skinnyKernel.smem() bytes
// of dynamic shared memory (fgemm.go). ld is a multiple of 64.
#define SKINNY(MT, WC, WK, BK, STAGES)                                                                                  \
	extern "C" __global__ void __launch_bounds__(32 * WC * WK) kvx_fgemm_skinny##MT##c##WC##k##WK##b##BK##s##STAGES( \
		const unsigned short* A, long long M, long long ld, float* C0, const unsigned short* W0, long long N0,          \
		float* C1, const unsigned short* W1, long long N1, float* C2, const unsigned short* W2, long long N2) {          \
		const skinnyOut o = {C0, C1, C2, W0, W1, W2, N0, N1, N2};                                                      \
		fgemm_skinny<MT, WC, WK, BK, STAGES>(A, o, M, ld);                                                             \
	}
SKINNY(1, 2, 4, 64, 4)
SKINNY(2, 2, 4, 64, 4)
SKINNY(2, 4, 2, 64, 4)
SKINNY(4, 4, 2, 64, 4)

// The split kernels, for tens of rows (decode of larger batches): the ring
// kernels' warps own one n8 tile each, so every warp reads all of the
// block's A fragments from shared memory for 8 columns, and each block
// copies all of A for 8·WC columns; at 64 rows that traffic is several
// times the weight's. Here a warp owns NW n8 tiles (one A fragment feeds NW
// mma), a block covers 8·WC·NW columns, and the parts run in separate
// blocks (grid z) instead of k slots, so there are blocks enough for the
// GPU however few the columns. Each block writes its part's sums to P
// (parts × M × N float32, N every weight's columns); kvx_fgemm_fold then
// adds each output's parts in part order, ((p0 + p1) + p2) + ..., the sum
// sk_fold makes: the same bits as every other kernel.
template <int MT, int WC, int NW, int BK, int STAGES>
__device__ __forceinline__ void fgemm_split(const unsigned short* A, const skinnyOut& o, float* P, long long M, long long ld) {
	pdl_wait();
	extern __shared__ __align__(16) unsigned char sp_smem[];
	constexpr int AR = 16 * MT, BR = 8 * WC * NW, TPP = FG_PART / BK;
	const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, t4 = lane % 4;
	unsigned short* sA = (unsigned short*)sp_smem;
	unsigned short* sB = sA + STAGES * AR * BK;
	const long long m0 = (long long)blockIdx.x * AR, n0 = (long long)blockIdx.y * BR;
	const long long N = o.n(), kb = (long long)blockIdx.z * FG_PART;
	const int arows = (int)(M - m0 < AR ? M - m0 : AR);
	auto load = [&](int i) {
		const int st = i % STAGES;
		const long long k0 = kb + (long long)i * BK;
		if (i >= TPP || k0 >= ld) return; // past a short last part's end
		sk_load<BK>(sA + st * AR * BK, sB + st * BR * BK, A, o, m0, n0, arows, BR, k0, ld, tid, 32 * WC);
	};

	float acc[MT][NW][4];
#pragma unroll
	for (int mt = 0; mt < MT; mt++)
#pragma unroll
		for (int j = 0; j < NW; j++) acc[mt][j][0] = acc[mt][j][1] = acc[mt][j][2] = acc[mt][j][3] = 0.f;
#pragma unroll
	for (int s = 0; s < STAGES - 1; s++) {
		load(s);
		cp_async_commit();
	}
	for (int i = 0; i < TPP; i++) {
		cp_async_wait<STAGES - 2>();
		__syncthreads(); // tile i landed; every warp is done with tile i-1's stage
		load(i + STAGES - 1);
		cp_async_commit();
		const long long k0 = kb + (long long)i * BK;
		if (k0 >= ld) break;
		const int st = i % STAGES;
		const unsigned short* a = sA + st * AR * BK;
		const unsigned short* b = sB + st * BR * BK;
		const int steps = (int)(ld - k0 < BK ? (ld - k0) / 16 : BK / 16);
#pragma unroll
		for (int kk = 0; kk < BK / 16; kk += 2) {
			if (kk >= steps) break; // ld is a multiple of 64: steps is even
			// bf[j]: n8 tile j's fragments of k16 steps kk and kk+1.
			unsigned bf[NW][4];
#pragma unroll
			for (int j = 0; j < NW; j++) ldsm_x4(bf[j], b + sk_swz((warp * NW + j) * 8 + lane % 8, kk * 2 + lane / 8, BK));
#pragma unroll
			for (int h = 0; h < 2; h++) {
#pragma unroll
				for (int mt = 0; mt < MT; mt++) {
					unsigned af[4];
					ldsm_x4(af, a + sk_swz(mt * 16 + lane % 16, (kk + h) * 2 + lane / 16, BK));
#pragma unroll
					for (int j = 0; j < NW; j++) mma_bf16(acc[mt][j], af, bf[j][2 * h], bf[j][2 * h + 1]);
				}
			}
		}
	}
	cp_async_wait<0>();
	float* Pp = P + (long long)blockIdx.z * M * N;
#pragma unroll
	for (int j = 0; j < NW; j++)
#pragma unroll
		for (int e = 0; e < 2; e++) {
			const long long c = n0 + (warp * NW + j) * 8 + 2 * t4 + e;
			if (c >= N) continue;
#pragma unroll
			for (int mt = 0; mt < MT; mt++) {
				const long long r = m0 + mt * 16 + g;
				if (r < M) Pp[r * N + c] = acc[mt][j][e];
				if (r + 8 < M) Pp[(r + 8) * N + c] = acc[mt][j][2 + e];
			}
		}
}

// kvx_fgemm_split<MT>c<WC>n<NW>b<BK>s<STAGES>: grid (ceil(M / (16·MT)),
// ceil((N0 + N1 + N2) / (8·WC·NW)), parts), block 32·WC, skinnyKernel.smem()
// bytes of dynamic shared memory; P as above. Then kvx_fgemm_fold.
#define SPLIT(MT, WC, NW, BK, STAGES)                                                                                  \
	extern "C" __global__ void __launch_bounds__(32 * WC) kvx_fgemm_split##MT##c##WC##n##NW##b##BK##s##STAGES(        \
		const unsigned short* A, long long M, long long ld, float* C0, const unsigned short* W0, long long N0,         \
		float* C1, const unsigned short* W1, long long N1, float* C2, const unsigned short* W2, long long N2, float* P) { \
		const skinnyOut o = {C0, C1, C2, W0, W1, W2, N0, N1, N2};                                                     \
		fgemm_split<MT, WC, NW, BK, STAGES>(A, o, P, M, ld);                                                          \
	}
SPLIT(4, 4, 4, 64, 4)
SPLIT(4, 4, 2, 64, 4)
SPLIT(4, 8, 2, 64, 4)
SPLIT(4, 4, 1, 64, 4)
SPLIT(2, 4, 2, 64, 4)
SPLIT(4, 4, 4, 64, 3)
SPLIT(4, 4, 2, 64, 3)
SPLIT(4, 8, 2, 64, 3)
SPLIT(2, 4, 2, 64, 3)
SPLIT(2, 8, 2, 64, 3)

// kvx_fgemm_fold: every output of a split call, its parts of P added in
// part order, into its weight's C. Grid-stride over M × (N0 + N1 + N2).
// An output whose C is 0 is skipped: its values were taken from the parts
// already (kvx_rope_write_fold's q).
extern "C" __global__ void kvx_fgemm_fold(const float* P, long long parts, long long M, float* C0, long long N0, float* C1,
		long long N1, float* C2, long long N2) {
	pdl_wait();
	const long long N = N0 + N1 + N2, n = M * N;
	for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
		const long long r = i / N;
		long long c = i - r * N;
		float* dst;
		if (c < N0) {
			dst = C0 ? C0 + r * N0 + c : nullptr;
		} else if ((c -= N0) < N1) {
			dst = C1 ? C1 + r * N1 + c : nullptr;
		} else {
			c -= N1;
			dst = C2 ? C2 + r * N2 + c : nullptr;
		}
		if (dst) {
			*dst = fold_at(P, parts, n, i);
		}
	}
}

// The direct kernel: the weight's fragments go from global memory straight
// into registers, with no shared memory between; U 32-wide k blocks make a
// chunk, and the next chunk's loads are issued before the current one's
// mma, so two chunks (2·U·512 bytes a warp) are in flight. A lane's values
// of each k16 step are in another order than mma's (which gives the same
// bits: see the top of the file):
//   - plain (XCH false): lane t of a quad takes k 4t..4t+3 of each step,
//     two 8-byte loads a block;
//   - exchanged (XCH true): lane t loads k 8t..8t+7 of a block (one
//     16-byte load), all of one step, and trades half of it with lane t^2
//     (two shuffles), so lane t takes k o..o+3 of each step, o = 8·(t%2) +
//     4·(t/2).
// A's fragments, in the same order, are 4-byte loads of the few rows,
// which L1 keeps.
template <int MT, int WC, int WK, int U, bool XCH>
__device__ __forceinline__ void fgemm_gemv(const unsigned short* A, const skinnyOut& o, long long M, long long ld) {
	constexpr int NCH = FG_PART / 32 / U; // chunks a part
	static_assert(NCH >= 2 && NCH % 2 == 0, "a part is an even number of chunks");
	extern __shared__ __align__(16) unsigned char gv_smem[];
	float* red = (float*)gv_smem; // (WK - 1) slots' partial sums
	const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t4 = lane % 4;
	const int ks = warp / WC, wc = warp % WC;
	const long long m0 = (long long)blockIdx.x * 16 * MT, n0 = (long long)blockIdx.y * 8 * WC;
	const long long n = n0 + wc * 8 + g;
	const int off = XCH ? 8 * (t4 & 1) + 4 * (t4 >> 1) : 4 * t4; // this lane's first k of a step
	const unsigned short* wr = n < o.n() ? o.row(n, ld) + (XCH ? 8 * t4 : 4 * t4) : nullptr;
	const int parts = (int)((ld + FG_PART - 1) / FG_PART);
	const int myParts = parts > ks ? (parts - ks + WK - 1) / WK : 0;

	// ar[mt][h]: row m0 + 16·mt + g + 8·h of A at k off, or none past M.
	const unsigned short* ar[MT][2];
#pragma unroll
	for (int mt = 0; mt < MT; mt++)
#pragma unroll
		for (int h = 0; h < 2; h++) {
			const long long r = m0 + mt * 16 + g + 8 * h;
			ar[mt][h] = r < M ? A + r * ld + off : nullptr;
		}
	auto a32 = [&](int mt, int h, long long k) -> unsigned {
		return ar[mt][h] ? __ldg((const unsigned*)(ar[mt][h] + k)) : 0u;
	};
	// ldw loads chunk ch of part p: blocks past ld are not loaded. Plain,
	// w[u].x, .y are the block's first k16 step's fragments and .z, .w its
	// second's; exchanged, w[u] is k 8t..8t+7 of the block.
	auto ldw = [&](uint4 (&w)[U], int p, int ch) {
		const long long k0 = (long long)p * FG_PART + (long long)ch * U * 32;
#pragma unroll
		for (int u = 0; u < U; u++) {
			const long long kb = k0 + u * 32;
			if (wr && kb < ld) {
				if (XCH) {
					w[u] = ldg_stream(wr + kb);
				} else {
					const uint2 s0 = ldg_stream64(wr + kb), s1 = ldg_stream64(wr + kb + 16);
					w[u] = make_uint4(s0.x, s0.y, s1.x, s1.y);
				}
			}
		}
	};
	// frag is the block's fragments in the plain layout: exchanged, lanes 0
	// and 1 (k of the first step) give their upper halves to lanes 2 and 3
	// (k of the second) for their lower halves. Every lane shuffles.
	const bool hi = t4 >= 2;
	auto frag = [&](const uint4& w) -> uint4 {
		if (!XCH) return w;
		const unsigned r0 = __shfl_xor_sync(0xffffffffu, hi ? w.x : w.z, 2), r1 = __shfl_xor_sync(0xffffffffu, hi ? w.y : w.w, 2);
		return hi ? make_uint4(r0, r1, w.z, w.w) : make_uint4(w.x, w.y, r0, r1);
	};
	// mm runs chunk ch of part p: two k16 steps a block, in k order.
	auto mm = [&](const uint4 (&w)[U], int p, int ch, float (&acc)[MT][4]) {
		const long long k0 = (long long)p * FG_PART + (long long)ch * U * 32;
#pragma unroll
		for (int u = 0; u < U; u++) {
			const long long kb = k0 + u * 32;
			if (kb >= ld) break;
			const uint4 f = frag(w[u]);
#pragma unroll
			for (int j = 0; j < 2; j++) {
				const unsigned b0 = j ? f.z : f.x, b1 = j ? f.w : f.y;
#pragma unroll
				for (int mt = 0; mt < MT; mt++) {
					const long long k = kb + 16 * j;
					const unsigned af[4] = {a32(mt, 0, k), a32(mt, 1, k), a32(mt, 0, k + 2), a32(mt, 1, k + 2)};
					mma_bf16(acc[mt], af, b0, b1);
				}
			}
		}
	};

	float acc[MT][4], tot[MT][4];
#pragma unroll
	for (int i = 0; i < MT; i++)
#pragma unroll
		for (int e = 0; e < 4; e++) acc[i][e] = tot[i][e] = 0.f;
	uint4 w0[U], w1[U];
#pragma unroll
	for (int u = 0; u < U; u++) w0[u] = w1[u] = make_uint4(0, 0, 0, 0);
	if (myParts > 0) ldw(w0, ks, 0);
	// The first chunk of weights is in flight before the wait: it overlaps
	// the end of the kernel before (pdl.cuh); A is loaded after it.
	pdl_wait();
	const int rounds = (parts + WK - 1) / WK;
	for (int rd = 0; rd < rounds; rd++) {
		if (rd < myParts) {
			const int p = ks + WK * rd;
#pragma unroll 1
			for (int c = 0; c < NCH; c += 2) {
				ldw(w1, p, c + 1);
				mm(w0, p, c, acc);
				if (c + 2 < NCH) {
					ldw(w0, p, c + 2);
				} else if (rd + 1 < myParts) {
					ldw(w0, p + WK, 0); // the slot's next part, before this one's last chunk runs
				}
				mm(w1, p, c + 1, acc);
			}
		}
		sk_fold<MT, WC, WK>(acc, tot, red, rd, parts - rd * WK < WK ? parts - rd * WK : WK, ks, wc, lane);
	}
	if (ks == 0) sk_store<MT>(o, tot, M, m0, n0, wc, lane);
}

// kvx_fgemm_gemv<MT>c<WC>k<WK>u<U> (plain) and kvx_fgemm_gemvx... (the
// exchanged loads; x is "x" or empty): grid and arguments as the ring
// kernels', skinnyKernel.smem() bytes of dynamic shared memory.
#define GEMV_(X, XCH, MT, WC, WK, U)                                                                             \
	extern "C" __global__ void __launch_bounds__(32 * WC * WK) kvx_fgemm_gemv##X##MT##c##WC##k##WK##u##U(     \
		const unsigned short* A, long long M, long long ld, float* C0, const unsigned short* W0, long long N0, \
		float* C1, const unsigned short* W1, long long N1, float* C2, const unsigned short* W2, long long N2) { \
		const skinnyOut o = {C0, C1, C2, W0, W1, W2, N0, N1, N2};                                             \
		fgemm_gemv<MT, WC, WK, U, XCH>(A, o, M, ld);                                                          \
	}
#define GEMV(MT, WC, WK, U) GEMV_(, false, MT, WC, WK, U)
#define GEMVX(MT, WC, WK, U) GEMV_(x, true, MT, WC, WK, U)
GEMV(1, 2, 4, 4)
GEMV(1, 2, 8, 4)
GEMV(1, 2, 4, 8)
GEMV(1, 1, 4, 8)
GEMV(1, 4, 4, 4)
GEMV(1, 4, 1, 8)
GEMV(2, 2, 4, 4)
GEMV(4, 4, 2, 4)
GEMVX(1, 2, 4, 4)
GEMVX(1, 2, 8, 4)
GEMVX(1, 1, 4, 8)
GEMVX(1, 4, 4, 4)
GEMVX(2, 2, 4, 4)

// kvx_fgemm_gemv[x]<MT>c<WC>k<WK>u<U>m<MINB>: GEMV with registers bounded so
// that MINB blocks fit an SM (88 registers a thread leave a 256-thread
// block two an SM: 384 blocks of a 6144-column weight take two waves).
#define GEMVB_(X, XCH, MT, WC, WK, U, MINB)                                                                            \
	extern "C" __global__ void __launch_bounds__(32 * WC * WK, MINB) kvx_fgemm_gemv##X##MT##c##WC##k##WK##u##U##m##MINB( \
		const unsigned short* A, long long M, long long ld, float* C0, const unsigned short* W0, long long N0,          \
		float* C1, const unsigned short* W1, long long N1, float* C2, const unsigned short* W2, long long N2) {          \
		const skinnyOut o = {C0, C1, C2, W0, W1, W2, N0, N1, N2};                                                      \
		fgemm_gemv<MT, WC, WK, U, XCH>(A, o, M, ld);                                                                   \
	}
#define GEMVB(MT, WC, WK, U, MINB) GEMVB_(, false, MT, WC, WK, U, MINB)
#define GEMVBX(MT, WC, WK, U, MINB) GEMVB_(x, true, MT, WC, WK, U, MINB)
GEMVB(1, 2, 4, 4, 3)
GEMVB(1, 2, 4, 4, 4)
GEMVB(1, 2, 8, 4, 2)
GEMVB(1, 2, 4, 8, 3)
GEMVBX(1, 2, 4, 4, 3)
GEMVBX(1, 2, 4, 8, 3)

// The tile width, k tile and row grouping of the tiled kernels below:
// blocks go down TL_GROUP row tiles before the next column tile, so a wave
// of blocks reads a few row and column tiles that L2 holds instead of the
// whole weight once per row tile. Shared rows are 32 bf16 (4 chunks; chunk
// c of row r at c ^ ((r / 2) % 4)).
#define TL_BN 128
#define TL_BK 32
#define TL_GROUP 8

__device__ __forceinline__ int tl_swz(int r, int ch) { return r * TL_BK + ((ch ^ ((r >> 1) & 3)) * 8); }

// The wide tiled kernels for many rows: block tile BM × 128 × 32 with
// BM / 32 warps of 64 × 64 (4 × 8 m16n8k16 tiles, 128 float32 accumulators
// a thread: a 32-wide k tile reads 8 ldmatrix fragments of A and 8 of W
// for 64 mma), a
// STAGES-deep cp.async ring. The part sums
// are those of every kernel above: at a part's end the thread adds its
// accumulators, in part order, to a running sum that lives outside its
// registers (128 more would not fit), in shared memory (TOT_SMEM: BM × 128
// float32 a block, value-major so a warp's stores hit 32 banks) or in C
// itself (each thread reads back only what it wrote, so no other thread's
// order enters), and starts the next part from zero; the last part's sum
// is the output. Rows past M and columns past N are zero-filled on load and
// never stored.
template <int BM, int STAGES, bool TOT_SMEM>
__device__ __forceinline__ void fgemm_wide(float* C, const unsigned short* A, const unsigned short* W, long long M, long long N, long long ld) {
	pdl_wait();
	constexpr int BN = TL_BN, BK = TL_BK, THREADS = BM / 64 * 2 * 32;
	extern __shared__ __align__(16) unsigned char wd_smem[];
	unsigned short* sA = (unsigned short*)wd_smem;
	unsigned short* sB = sA + STAGES * BM * BK;
	float* sTot = (float*)(sB + STAGES * BN * BK);
	const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
	const int g = lane / 4, t4 = lane % 4;
	long long bm, bn;
	{
		const long long mt = (M + BM - 1) / BM, nt = (N + BN - 1) / BN, pid = blockIdx.x;
		const long long per = TL_GROUP * nt, grp = pid / per, first = grp * TL_GROUP;
		const long long rows = mt - first < TL_GROUP ? mt - first : TL_GROUP;
		bm = (first + (pid % per) % rows) * BM;
		bn = ((pid % per) / rows) * BN;
	}
	const int wm = (warp / 2) * 64, wn = (warp % 2) * 64;
	const int KT = (int)(ld / BK);

	auto load = [&](int kt) {
		const int st = kt % STAGES;
		unsigned short* a = sA + st * BM * BK;
		unsigned short* b = sB + st * BN * BK;
		const long long k0 = (long long)kt * BK;
#pragma unroll
		for (int c = tid; c < (BM + BN) * 4; c += THREADS) {
			const int r = c / 4, ch = c % 4;
			if (r < BM) {
				const bool ok = bm + r < M;
				cp_async16_zfill(a + tl_swz(r, ch), A + (ok ? bm + r : 0) * ld + k0 + ch * 8, ok);
			} else {
				const int rb = r - BM;
				const bool ok = bn + rb < N;
				cp_async16_zfill(b + tl_swz(rb, ch), W + (ok ? bn + rb : 0) * ld + k0 + ch * 8, ok);
			}
		}
	};

	float acc[4][8][4];
#pragma unroll
	for (int i = 0; i < 4; i++)
#pragma unroll
		for (int j = 0; j < 8; j++) acc[i][j][0] = acc[i][j][1] = acc[i][j][2] = acc[i][j][3] = 0.f;

#pragma unroll
	for (int s = 0; s < STAGES - 1; s++) {
		if (s < KT) load(s);
		cp_async_commit();
	}
	for (int kt = 0; kt < KT; kt++) {
		cp_async_wait<STAGES - 2>();
		__syncthreads(); // tile kt landed; every warp is done with tile kt-1's stage
		if (kt + STAGES - 1 < KT) load(kt + STAGES - 1);
		cp_async_commit();
		const int st = kt % STAGES;
		const unsigned short* a = sA + st * BM * BK;
		const unsigned short* b = sB + st * BN * BK;
		// bf[nt]: n tile nt's fragments of the tile's two k16 steps.
		unsigned bf[8][4];
#pragma unroll
		for (int nt = 0; nt < 8; nt++) ldsm_x4(bf[nt], b + tl_swz(wn + nt * 8 + lane % 8, lane / 8));
#pragma unroll
		for (int kk = 0; kk < BK / 16; kk++) {
			unsigned af[4][4];
#pragma unroll
			for (int mt = 0; mt < 4; mt++) ldsm_x4(af[mt], a + tl_swz(wm + mt * 16 + lane % 16, kk * 2 + lane / 16));
#pragma unroll
			for (int mt = 0; mt < 4; mt++)
#pragma unroll
				for (int nt = 0; nt < 8; nt++) mma_bf16(acc[mt][nt], af[mt], bf[nt][2 * kk], bf[nt][2 * kk + 1]);
		}
		if ((kt + 1) % (FG_PART / BK) == 0 || kt == KT - 1) {
			// The end of a part: add it to the running sum, in part order.
			const bool first = kt < FG_PART / BK, last = kt == KT - 1;
#pragma unroll
			for (int i = 0; i < 4; i++)
#pragma unroll
				for (int j = 0; j < 8; j++)
#pragma unroll
					for (int e = 0; e < 4; e++) {
						float v = acc[i][j][e];
						if (TOT_SMEM) {
							float* t = sTot + ((i * 8 + j) * 4 + e) * THREADS + tid;
							if (!first) v = __fadd_rn(*t, v);
							if (!last) *t = v;
						} else {
							const long long r = bm + wm + i * 16 + g + (e / 2) * 8, c = bn + wn + j * 8 + 2 * t4 + e % 2;
							if (r < M && c < N) {
								float* p = C + r * N + c;
								if (!first) v = __fadd_rn(*p, v);
								if (!last) *p = v;
							}
						}
						acc[i][j][e] = last ? v : 0.f;
					}
		}
	}
	cp_async_wait<0>();
#pragma unroll
	for (int mt = 0; mt < 4; mt++)
#pragma unroll
		for (int nt = 0; nt < 8; nt++) {
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

// kvx_fgemm_wide<BM>s<STAGES><s|g>: grid (ceil(M / BM) · ceil(N / 128)),
// block BM threads, tiledKernel.smem() bytes of dynamic shared memory
// (fgemm.go); s keeps the running sums in shared memory, g in C.
#define WIDE(BM, STAGES, TOT, SUFFIX, MINB)                                                                     \
	extern "C" __global__ void __launch_bounds__(BM, MINB) kvx_fgemm_wide##BM##s##STAGES##SUFFIX(               \
		float* C, const unsigned short* A, const unsigned short* W, long long M, long long N, long long ld) { \
		fgemm_wide<BM, STAGES, TOT>(C, A, W, M, N, ld);                                                     \
	}
WIDE(128, 3, true, s, 2)
WIDE(256, 3, true, s, 1)
WIDE(128, 4, false, g, 2)
