// The fast matmul's tiled kernel on Hopper's TMA and wgmma, for sm_90a
// only: compiled by make ptx-sm90a (nvcc 12 or later) into ptx/sm90a/, and
// loaded only on a device of compute capability 9.0 (gpu.go). C = A · W^T
// as in kernels/fgemm.cu, with its reduction order: per 1024-wide part of k
// one float32 chain of k16 steps from zero, in ascending k, and the parts
// added in order. On the H200, wgmma.mma_async m64nNk16 with both operands
// in shared memory gives mma.sync m16n8k16's bits for the same chain
// (scripts/kperm-probe.cu, mode 5), so this kernel and the mma.sync ones
// are interchangeable bit for bit and the fast matmul stays batch-invariant
// whichever runs a call (scripts/wgemm-check.cu and fgemm_test.go check
// it).
//
// # The block
//
// Warp-specialized: CW computing warpgroups of 64 tokens each (a 64·CW-
// token × 128-feature tile of C) and one copying warpgroup, of which one
// thread issues the copies. A ring of STAGES k stages, 64 k wide: a stage
// is A's 64·CW token rows and W's 128 feature rows, each row
// 128 bytes, brought by the tensor memory accelerator (TMA) with the
// 128-byte swizzle (chunk c of row r at c ^ (r % 8)), which is the K-major
// layout wgmma reads without bank conflicts; the stage's full barrier
// counts its bytes. A computing warpgroup runs a stage's four k16 steps as
// wgmma with both operands in shared memory (the descriptors advance 32
// bytes a step inside the swizzled rows), keeps one stage's wgmma in flight
// while it waits for the next stage, and frees a stage on its empty
// barrier once the wgmma that read it are done. The first step of a part
// starts from zero (scale-d 0); at a part's end the warpgroup waits for its
// wgmma and adds the part to its running sums, in registers (64
// accumulators and 64 sums a thread), in part order. Tokens past M and
// feature rows past N are zero-filled by TMA and never stored.
#include "mma.cuh"
#include "fsilu.cuh"

#define WG_PART 1024 // k values a part, FG_PART in kernels/fgemm.cu
#define WG_BK 64     // k values a stage: one 128-byte row
#define WG_GROUP 8   // token tiles a column of blocks walks before the next feature tile

// kvx_tmap is a CUtensorMap (cuda.h, CUDA 12): 128 opaque bytes, made on
// the host by cuTensorMapEncodeTiled and passed by value as a kernel
// parameter (__grid_constant__).
struct __align__(64) kvx_tmap {
	unsigned long long v[16];
};

__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wg_wait() { asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory"); }

#define WG_F8(i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), "+f"(d[i + 6]), "+f"(d[i + 7])
#define WG_F32(i) WG_F8(i), WG_F8(i + 8), WG_F8(i + 16), WG_F8(i + 24)

// wg_desc is the shared memory descriptor of a K-major operand in the
// 128-byte swizzle: start address >> 4, the stride between 8-row groups
// (1024 bytes) >> 4, layout type 1 (128B) in bits 62-63; the leading byte
// offset is not used by a swizzled K-major layout. The stage's rows start
// 1024-byte aligned, so the base offset is 0.
__device__ __forceinline__ unsigned long long wg_desc(const void* p) {
	return (unsigned long long)((smem_addr(p) & 0x3FFFF) >> 4) | (1ull << 16) | ((unsigned long long)(1024 >> 4) << 32) | (1ull << 62);
}

// wg_mma: d (64 × 128 float32 a warpgroup, 64 a thread) = a · b^T (+ d
// when acc), a and b the K-major descriptors of 64 and 128 rows × 16 k.
__device__ __forceinline__ void wg_mma128(float (&d)[64], unsigned long long a, unsigned long long b, int acc) {
	asm volatile(
		"{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
		"wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
		"{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, "
		"%64, %65, p, 1, 1, 0, 0;\n}\n"
		: WG_F32(0), WG_F32(32)
		: "l"(a), "l"(b), "r"(acc));
}

// wg_keep tells the compiler that d is live here, so that it neither moves
// nor reuses the accumulators while a wgmma that writes them is in flight.
template <int V>
__device__ __forceinline__ void wg_keep(float (&d)[V]) {
#pragma unroll
	for (int i = 0; i < V; i++) asm volatile("" : "+f"(d[i])::"memory");
}

// mbarrier primitives (shared::cta).
__device__ __forceinline__ void mb_init(unsigned long long* b, int count) {
	asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_addr(b)), "r"(count) : "memory");
}
__device__ __forceinline__ void mb_wait(unsigned long long* b, int parity) {
	asm volatile(
		"{\n.reg .pred p;\nWAIT_%=:\n"
		"mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
		"@!p bra WAIT_%=;\n}\n" ::"r"(smem_addr(b)),
		"r"(parity)
		: "memory");
}
__device__ __forceinline__ void mb_arrive(unsigned long long* b) {
	asm volatile("{\n.reg .b64 st;\nmbarrier.arrive.shared::cta.b64 st, [%0];\n}\n" ::"r"(smem_addr(b)) : "memory");
}
// mb_arrive_if arrives on b when ok, without a branch.
__device__ __forceinline__ void mb_arrive_if(unsigned long long* b, bool ok) {
	asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %1, 0;\n@p mbarrier.arrive.shared::cta.b64 _, [%0];\n}\n" ::"r"(smem_addr(b)), "r"((int)ok) : "memory");
}
// mb_expect arrives on b and adds bytes to the transaction count its phase
// waits for (the TMA copies complete them).
__device__ __forceinline__ void mb_expect(unsigned long long* b, unsigned bytes) {
	asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_addr(b)), "r"(bytes) : "memory");
}

// tma_load copies the box of tm at (x, y) (x the k index, y the row) into
// shared memory at dst, completing its bytes on barrier b.
__device__ __forceinline__ void tma_load(void* dst, const kvx_tmap* tm, int x, int y, unsigned long long* b) {
	asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::"r"(smem_addr(dst)),
		"l"((unsigned long long)tm), "r"(x), "r"(y), "r"(smem_addr(b))
		: "memory");
}

// fgemm_tma is the kernel described at the top, with CW computing
// warpgroups (64·CW tokens a block; warpgroup CW copies). Split, a block
// runs one part (blockIdx.y) and writes its chain's sums to P (parts × M ×
// N float32) for kvx_fgemm_fold to add in part order (kernels/fgemm.cu): at
// a few tens of rows the tiles alone are too few blocks to stream the
// weight on every SM.
//
// GLU, the block's 128 weight rows are 64 features of the gate weight (tmW)
// and the same 64 of the up weight (tmU), and the epilogue writes SwiGLU's
// output instead of the two products: C (M × N, N the features) = SiLU(gate)
// · up with kvx_fswiglu's arithmetic (fsilu_mul, kernels/fsilu.cuh), and ob
// its bf16 copy (rows ldo apart, the columns past N zero). Each product is the same
// chain and part sums as without GLU, and a thread holds feature f's gate
// sum (accumulator 4j + e) and up sum (4(j + 8) + e) both, so the bits are
// those of the matmul followed by kvx_fswiglu.
template <int CW, int STAGES, bool SPLIT, bool GLU>
__device__ __forceinline__ void fgemm_tma(const kvx_tmap* tmA, const kvx_tmap* tmW, const kvx_tmap* tmU, float* C,
		unsigned short* ob, long long M, long long N, long long ld, long long ldo) {
	static_assert(!(SPLIT && GLU), "a split GLU tile");
	// FN is the features of C a tile: 128, or 64 of each weight with GLU.
	constexpr int BN = 128, FN = GLU ? BN / 2 : BN, BM = 64 * CW, V = BN / 2, SA = BM * WG_BK * 2, SW = BN * WG_BK * 2,
		STAGE = SA + SW;
	extern __shared__ __align__(1024) unsigned char wg_smem[];
	// The dynamic shared memory is 1024-byte aligned for the swizzle
	// (tiledKernel.smem asks for 1 KiB more and the base is rounded up).
	unsigned char* ring = (unsigned char*)(((unsigned long long)wg_smem + 1023) & ~1023ull);
	unsigned long long* full = (unsigned long long*)(ring + STAGES * STAGE);
	unsigned long long* empty = full + STAGES;
	const int tid = threadIdx.x, wg = tid / 128;
	long long bm, bn;
	{
		const long long mt = (M + BM - 1) / BM, nt = (N + FN - 1) / FN, pid = blockIdx.x;
		const long long per = WG_GROUP * nt, grp = pid / per, first = grp * WG_GROUP;
		const long long rows = mt - first < WG_GROUP ? mt - first : WG_GROUP;
		bm = (first + (pid % per) % rows) * BM;
		bn = ((pid % per) / rows) * FN;
	}
	const int SPP = WG_PART / WG_BK, KS = (int)(ld / WG_BK);
	// The block's k stages: all of them, or its part's.
	const int kb = SPLIT ? (int)blockIdx.y * SPP : 0, ke = SPLIT ? (kb + SPP < KS ? kb + SPP : KS) : KS;
	if (tid == 0) {
		for (int i = 0; i < STAGES; i++) mb_init(full + i, 1), mb_init(empty + i, 4 * CW);
		asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
	}
	__syncthreads();

	if (wg == CW) { // the copier: one thread issues every stage's two copies
		if (tid == 128 * CW) {
			for (int ks = kb; ks < ke; ks++) {
				const int i = ks - kb, st = i % STAGES;
				if (i >= STAGES) mb_wait(empty + st, (i / STAGES - 1) & 1);
				unsigned char* s = ring + st * STAGE;
				mb_expect(full + st, STAGE);
				tma_load(s, tmA, ks * WG_BK, (int)bm, full + st);
				tma_load(s + SA, tmW, ks * WG_BK, (int)bn, full + st);
				if (GLU) tma_load(s + SA + FN * 128, tmU, ks * WG_BK, (int)bn, full + st);
			}
		}
		return;
	}

	const int warp = (tid / 32) % 4, lane = tid % 32, g = lane / 4, t = lane % 4;
	float d[V], tot[SPLIT ? 1 : V];
#pragma unroll
	for (int i = 0; i < V; i++) d[i] = 0.f;
	for (int p = kb / SPP; p * SPP < ke; p++) {
		// The part's chain. Nothing but wgmma writes the accumulators in
		// this loop, and no branch depends on a lane (a stage is freed by a
		// predicated arrive): either would make ptxas wait for every wgmma
		// before the next is issued.
		const int k0 = p * SPP, k1 = k0 + SPP < ke ? k0 + SPP : ke;
		for (int ks = k0; ks < k1; ks++) {
			const int i = ks - kb, st = i % STAGES;
			mb_wait(full + st, (i / STAGES) & 1);
			const unsigned char* s = ring + st * STAGE;
			const unsigned char* a = s + wg * 64 * 128; // this warpgroup's 64 token rows
			const unsigned char* w = s + SA;
			wg_fence();
#pragma unroll
			for (int kk = 0; kk < WG_BK / 16; kk++) wg_mma128(d, wg_desc(a + 32 * kk), wg_desc(w + 32 * kk), kk > 0 || ks > k0);
			wg_commit();
			wg_wait<1>(); // the stage before this one is read: free it
			mb_arrive_if(empty + (i + STAGES - 1) % STAGES, lane == 0 && ks > k0);
		}
		wg_wait<0>();
		mb_arrive_if(empty + (k1 - 1 - kb) % STAGES, lane == 0);
		if (!SPLIT) {
			// The end of a part: add it to the running sum, in part order.
			wg_keep(d);
#pragma unroll
			for (int v = 0; v < V; v++) tot[SPLIT ? 0 : v] = p == 0 ? d[v] : __fadd_rn(tot[SPLIT ? 0 : v], d[v]);
			wg_keep(d);
		}
	}
	// out[4j + e] is token bm + 64·wg + 16·warp + g + 8·(e / 2), feature
	// bn + 8j + 2t + e % 2 (with GLU: of the gate weight for j < 8, of the
	// up weight, feature bn + 8(j - 8) + 2t + e % 2, from 8).
	auto out = [&](int v) { return SPLIT ? d[v] : tot[SPLIT ? 0 : v]; };
	float* dst = SPLIT ? C + (long long)blockIdx.y * M * N : C;
	const long long r0 = bm + wg * 64 + warp * 16 + g;
	if constexpr (GLU) {
#pragma unroll
		for (int j = 0; j < FN / 8; j++) {
			const long long f = bn + 8 * j + 2 * t; // < ldo: the tiles end at N padded to 64
#pragma unroll
			for (int h = 0; h < 2; h++) {
				const long long r = r0 + 8 * h;
				if (r >= M) continue;
				float y[2];
#pragma unroll
				for (int e = 0; e < 2; e++) {
					// Past N both sums are of TMA's zero rows: y is 0.
					const float gv = out(4 * j + 2 * h + e), uv = out(4 * (j + FN / 8) + 2 * h + e);
					y[e] = fsilu_mul(gv, uv);
				}
				float* c = C + r * N + f;
				if (f + 1 < N && (N & 1) == 0) {
					*(float2*)c = make_float2(y[0], y[1]);
				} else {
					if (f < N) c[0] = y[0];
					if (f + 1 < N) c[1] = y[1];
				}
				*(unsigned*)(ob + r * ldo + f) = (unsigned)to_bf16(y[0]) | (unsigned)to_bf16(y[1]) << 16;
			}
		}
	} else {
#pragma unroll
		for (int j = 0; j < BN / 8; j++) {
			const long long f = bn + 8 * j + 2 * t;
#pragma unroll
			for (int h = 0; h < 2; h++) {
				const long long r = r0 + 8 * h;
				if (r >= M) continue;
				float* c = dst + r * N + f;
				if (f + 1 < N && (N & 1) == 0) {
					*(float2*)c = make_float2(out(4 * j + 2 * h), out(4 * j + 2 * h + 1));
				} else {
					if (f < N) c[0] = out(4 * j + 2 * h);
					if (f + 1 < N) c[1] = out(4 * j + 2 * h + 1);
				}
			}
		}
	}
}

// kvx_fgemm_tma<64·CW>s<STAGES>: grid ceil(M / (64·CW)) · ceil(N / 128)
// blocks of 128·(CW + 1) threads; dynamic shared memory STAGES·(64·CW +
// 128)·64·2 bytes, 16·STAGES for the barriers and 1024 of alignment slack
// (fgemm.go's tiledKernel.smem). tmA and tmW are A's (ld × M) and W's (ld ×
// N) bf16 tensor maps with boxes of 64 × 64·CW and 64 × 128 and the
// 128-byte swizzle. ld a multiple of 64. kvx_fgemm_tmap<64·CW>s<STAGES>,
// the split one: grid y the parts, C is P.
#define FGEMM_TMA(CW, STAGES, SPLIT, NAME)                                                                         \
	extern "C" __global__ void __launch_bounds__(128 * (CW + 1), 1) NAME(                                          \
		const __grid_constant__ kvx_tmap tmA, const __grid_constant__ kvx_tmap tmW, float* C, long long M, long long N, \
		long long ld) {                                                                                            \
		fgemm_tma<CW, STAGES, SPLIT, false>(&tmA, &tmW, &tmW, C, nullptr, M, N, ld, 0);                             \
	}
FGEMM_TMA(2, 4, false, kvx_fgemm_tma128s4)
FGEMM_TMA(2, 6, false, kvx_fgemm_tma128s6)
FGEMM_TMA(2, 4, true, kvx_fgemm_tmap128s4)
FGEMM_TMA(1, 6, true, kvx_fgemm_tmap64s6)
FGEMM_TMA(1, 8, true, kvx_fgemm_tmap64s8)

// kvx_fgemm_tma128s4g: kvx_fgemm_tma128s4 of the gate and up weights (tmG,
// tmU: N × ld each, boxes of 64 × 64) with SwiGLU in the epilogue (GLU
// above): grid ceil(M / 128) · ceil(N / 64), C the M × N float32 output and
// ob its bf16 copy (M × ldo, ldo = N padded to 64).
extern "C" __global__ void __launch_bounds__(384, 1) kvx_fgemm_tma128s4g(const __grid_constant__ kvx_tmap tmA,
		const __grid_constant__ kvx_tmap tmG, const __grid_constant__ kvx_tmap tmU, float* C, unsigned short* ob, long long M,
		long long N, long long ld, long long ldo) {
	fgemm_tma<2, 4, false, true>(&tmA, &tmG, &tmU, C, ob, M, N, ld, ldo);
}

// # The stream kernel: decode and small batches
//
// At a few rows a matmul only streams its weight: the GPU is bound by
// reading it, and what costs is every SM not reading at every moment. The
// stream kernel swaps the operands (wgmma's A is the weight, 64 features a
// unit, and its B the NT token rows: m64nNTk16), so neither operand is
// padded to 64 tokens, and it is persistent: the grid is the blocks that
// fit the GPU at once, and block b takes the units b·U/G .. (b+1)·U/G - 1
// of the U = feature tiles × parts, in order (a tile's parts one after
// another), through one ring that runs on across units, so no SM waits
// for a block to start or drain. The weights of the first STAGES stages
// are requested before the kernel waits for the one before it (pdl.cuh):
// no kernel of a step writes them. A unit's chain is the part's k16
// steps in ascending order from zero, as every other kernel's (wgmma's
// product sums do not depend on which operand is A: each output is the
// same 16 products a step); its sums go to P (parts × M × N float32, N
// every weight's features) and kvx_fgemm_fold adds the parts in part
// order. One computing warpgroup and one copying warp a block. (Folding
// in the kernel instead, the block that stores a tile's last part adding
// its parts, counted by an atomic counter a tile, was slower on the H200:
// 6.33 ms a Llama-3-8B decode step at batch 1 against 5.79, 13.4 at 64
// against 8.50; the consumers wait on the fence and the count.)
// A unit is FW m64 blocks of features (64·FW): at tens of rows the token
// rows a stage are as large as its weight rows, and every unit reads them
// again, so FW = 2 halves what the blocks read of them.

// wg_mma_st: d (64 features × NT tokens float32 a warpgroup, NT / 2 a
// thread) = a · b^T (+ d when acc), a and b the K-major descriptors of 64
// and NT rows × 16 k.
template <int NT>
__device__ __forceinline__ void wg_mma_st(float (&d)[NT / 2], unsigned long long a, unsigned long long b, int acc);
template <>
__device__ __forceinline__ void wg_mma_st<8>(float (&d)[4], unsigned long long a, unsigned long long b, int acc) {
	asm volatile(
		"{\n.reg .pred p;\nsetp.ne.b32 p, %6, 0;\n"
		"wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16 {%0,%1,%2,%3}, %4, %5, p, 1, 1, 0, 0;\n}\n"
		: "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
		: "l"(a), "l"(b), "r"(acc));
}
template <>
__device__ __forceinline__ void wg_mma_st<16>(float (&d)[8], unsigned long long a, unsigned long long b, int acc) {
	asm volatile(
		"{\n.reg .pred p;\nsetp.ne.b32 p, %10, 0;\n"
		"wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7}, %8, %9, p, 1, 1, 0, 0;\n}\n"
		: WG_F8(0)
		: "l"(a), "l"(b), "r"(acc));
}
template <>
__device__ __forceinline__ void wg_mma_st<32>(float (&d)[16], unsigned long long a, unsigned long long b, int acc) {
	asm volatile(
		"{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
		"wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 "
		"{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15}, %16, %17, p, 1, 1, 0, 0;\n}\n"
		: WG_F8(0), WG_F8(8)
		: "l"(a), "l"(b), "r"(acc));
}
template <>
__device__ __forceinline__ void wg_mma_st<64>(float (&d)[32], unsigned long long a, unsigned long long b, int acc) {
	asm volatile(
		"{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
		"wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
		"{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, "
		"%32, %33, p, 1, 1, 0, 0;\n}\n"
		: WG_F32(0)
		: "l"(a), "l"(b), "r"(acc));
}

// stUnits is the stream kernel's work: up to three weights of N0, N1, N2
// features (tiles of bf), each tile's parts.
struct stUnits {
	long long t0, t1, t2; // tiles of each weight
	long long n0, n1;     // features before weight 1 and before weight 2
	int parts, last;      // parts, and k stages of the last one
	int bf;               // features a tile

	__device__ __forceinline__ int stages(long long u) const { return (int)(u % parts) == parts - 1 ? last : WG_PART / WG_BK; }
	__device__ __forceinline__ long long k(long long u, int s) const { return (u % parts) * WG_PART + (long long)s * WG_BK; }
	// weight is unit u's weight (0, 1, 2) and its first feature in it.
	__device__ __forceinline__ int weight(long long u, long long& f) const {
		long long t = u / parts;
		if (t < t0) return f = t * bf, 0;
		if ((t -= t0) < t1) return f = t * bf, 1;
		return f = (t - t1) * bf, 2;
	}
};

template <int NT, int FW, int STAGES>
__device__ __forceinline__ void fgemm_stream(const kvx_tmap* tmA, const kvx_tmap* tmW0, const kvx_tmap* tmW1, const kvx_tmap* tmW2, float* P,
		long long M, long long N0, long long N1, long long N2, long long ld) {
	constexpr int BF = 64 * FW, SW = BF * WG_BK * 2, SA = NT * WG_BK * 2, STAGE = SW + SA, V = NT / 2;
	static_assert(SA % 1024 == 0, "a stage's token rows are whole 1024-byte swizzle patterns");
	extern __shared__ __align__(1024) unsigned char st_smem[];
	unsigned char* ring = (unsigned char*)(((unsigned long long)st_smem + 1023) & ~1023ull);
	unsigned long long* full = (unsigned long long*)(ring + STAGES * STAGE);
	unsigned long long* empty = full + STAGES;
	const int tid = threadIdx.x;
	const stUnits w = {(N0 + BF - 1) / BF, (N1 + BF - 1) / BF, (N2 + BF - 1) / BF, N0, N0 + N1,
		(int)((ld + WG_PART - 1) / WG_PART), (int)((ld - ((ld - 1) / WG_PART) * WG_PART) / WG_BK), BF};
	const long long units = (w.t0 + w.t1 + w.t2) * w.parts;
	const long long u0 = units * blockIdx.x / gridDim.x, u1 = units * (blockIdx.x + 1) / gridDim.x;
	if (tid == 0) {
		for (int i = 0; i < STAGES; i++) mb_init(full + i, 1), mb_init(empty + i, 4);
		asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
	}
	__syncthreads();

	if (tid >= 128) { // the copier: one thread issues every copy
		if (tid != 128) return;
		auto loadW = [&](long long u, int s, int st) {
			long long f;
			const int wi = w.weight(u, f);
			tma_load(ring + st * STAGE, wi == 0 ? tmW0 : (wi == 1 ? tmW1 : tmW2), (int)w.k(u, s), (int)f, full + st);
		};
		// The weights of the first stages, before the wait; then their
		// token rows, then the rest in turn.
		long long u = u0;
		int s = 0, i = 0;
		for (; i < STAGES && u < u1; i++) {
			mb_expect(full + i, STAGE);
			loadW(u, s, i);
			if (++s == w.stages(u)) s = 0, u++;
		}
		asm volatile("griddepcontrol.wait;\n" ::: "memory");
		asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
		{
			long long v = u0;
			int r = 0;
			for (int j = 0; j < i; j++) {
				tma_load(ring + j * STAGE + SW, tmA, (int)w.k(v, r), 0, full + j);
				if (++r == w.stages(v)) r = 0, v++;
			}
		}
		for (; u < u1; i++) {
			const int st = i % STAGES;
			mb_wait(empty + st, (i / STAGES - 1) & 1);
			mb_expect(full + st, STAGE);
			loadW(u, s, st);
			tma_load(ring + st * STAGE + SW, tmA, (int)w.k(u, s), 0, full + st);
			if (++s == w.stages(u)) s = 0, u++;
		}
		return;
	}

	// P may be scratch the kernel before still reads.
	asm volatile("griddepcontrol.wait;\n" ::: "memory");
	asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
	const int warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
	const long long N = N0 + N1 + N2;
	float d[FW][V];
#pragma unroll
	for (int b = 0; b < FW; b++)
#pragma unroll
		for (int v = 0; v < V; v++) d[b][v] = 0.f;
	int i = 0;
	for (long long u = u0; u < u1; u++) {
		const int ns = w.stages(u);
		for (int s = 0; s < ns; s++, i++) {
			const int st = i % STAGES;
			mb_wait(full + st, (i / STAGES) & 1);
			const unsigned char* wt = ring + st * STAGE; // the weight's BF feature rows
			const unsigned char* a = wt + SW;            // the NT token rows
			wg_fence();
#pragma unroll
			for (int kk = 0; kk < WG_BK / 16; kk++)
#pragma unroll
				for (int b = 0; b < FW; b++) wg_mma_st<NT>(d[b], wg_desc(wt + 8192 * b + 32 * kk), wg_desc(a + 32 * kk), kk > 0 || s > 0);
			wg_commit();
			wg_wait<1>(); // the stage before this one is read: free it
			mb_arrive_if(empty + (i + STAGES - 1) % STAGES, lane == 0 && s > 0);
		}
		wg_wait<0>();
		mb_arrive_if(empty + (i + STAGES - 1) % STAGES, lane == 0);
#pragma unroll
		for (int b = 0; b < FW; b++) wg_keep(d[b]);
		// d[b][4j + e] is feature f0 + 64·b + 16·warp + g + 8·(e / 2), token
		// 8j + 2t + e % 2.
		long long f0;
		const int wi = w.weight(u, f0);
		const long long nw = wi == 0 ? N0 : (wi == 1 ? N1 : N2), cb = wi == 0 ? 0 : (wi == 1 ? w.n0 : w.n1);
		float* dst = P + (u % w.parts) * M * N + cb;
#pragma unroll
		for (int b = 0; b < FW; b++)
#pragma unroll
			for (int j = 0; j < NT / 8; j++)
#pragma unroll
				for (int e = 0; e < 4; e++) {
					const long long f = f0 + 64 * b + 16 * warp + g + 8 * (e / 2), tok = 8 * j + 2 * t + e % 2;
					if (f < nw && tok < M) dst[tok * N + f] = d[b][4 * j + e];
				}
#pragma unroll
		for (int b = 0; b < FW; b++) wg_keep(d[b]);
	}
}

// kvx_fgemm_stream<NT>s<STAGES> (64 features a unit) and
// kvx_fgemm_stream<NT>w<FW>s<STAGES> (64·FW): grid G (fgemm.go: the blocks
// that fit the GPU at once, at most the units) of 160 threads; dynamic
// shared memory STAGES·(64·FW + NT)·64·2 bytes, 16·STAGES for the barriers
// and 1024 of alignment slack. tmA is A's tensor map (ld × M, box 64 ×
// NT), tmW0..2 the weights' (ld × N_i, box 64 × 64·FW; an unused one
// repeats W0's with N_i 0); M ≤ NT. P as above, then kvx_fgemm_fold.
#define FGEMM_STREAM_(NAME, NT, FW, STAGES)                                                                            \
	extern "C" __global__ void __launch_bounds__(160, 1) NAME(const __grid_constant__ kvx_tmap tmA,                    \
		const __grid_constant__ kvx_tmap tmW0, const __grid_constant__ kvx_tmap tmW1, const __grid_constant__ kvx_tmap tmW2, \
		float* P, long long M, long long N0, long long N1, long long N2, long long ld) {                               \
		fgemm_stream<NT, FW, STAGES>(&tmA, &tmW0, &tmW1, &tmW2, P, M, N0, N1, N2, ld);                               \
	}
#define FGEMM_STREAM(NT, STAGES) FGEMM_STREAM_(kvx_fgemm_stream##NT##s##STAGES, NT, 1, STAGES)
#define FGEMM_STREAMW(NT, FW, STAGES) FGEMM_STREAM_(kvx_fgemm_stream##NT##w##FW##s##STAGES, NT, FW, STAGES)
FGEMM_STREAM(8, 4)
FGEMM_STREAM(8, 6)
FGEMM_STREAM(8, 8)
FGEMM_STREAM(8, 10)
FGEMM_STREAM(16, 4)
FGEMM_STREAM(16, 6)
FGEMM_STREAM(32, 4)
FGEMM_STREAM(32, 6)
FGEMM_STREAM(64, 4)
FGEMM_STREAM(64, 6)
FGEMM_STREAMW(32, 2, 4)
FGEMM_STREAMW(32, 2, 6)
FGEMM_STREAMW(64, 2, 3)
FGEMM_STREAMW(64, 2, 4)
FGEMM_STREAMW(16, 2, 6)
