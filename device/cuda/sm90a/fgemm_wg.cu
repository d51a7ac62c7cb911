// The fast matmul's tiled kernel on Hopper's wgmma, for sm_90a only:
// compiled by make ptx-sm90a (nvcc 12 or later) into ptx/sm90a/, and loaded
// only on a device of compute capability 9.0 (gpu.go). C = A · W^T as in
// kernels/fgemm.cu, with its reduction order: per 1024-wide part of k one
// float32 chain of k16 steps from zero, in ascending k, and the parts added
// in order. On the H200, wgmma.mma_async m64nNk16 with the weight's rows as
// the register operand and the activations from shared memory gives
// mma.sync m16n8k16's bits for the same chain (scripts/wgmma-probe.cu, mode
// 5), so this kernel and the mma.sync ones are interchangeable bit for bit
// and the fast matmul stays batch-invariant whichever runs a call
// (scripts/wgemm-check.cu and fgemm_test.go check it).
//
// # The roles
//
// The weight is stored in the fragments' k order (kernels/fgemm.cu, wperm):
// lane t of a quad finds the fragments of both k16 steps of a 32-wide k
// block in one 16-byte chunk of its row. wgmma's register operand (64 rows
// × 16 k a warpgroup, warp w rows 16w..16w+15) has mma.sync's A layout, so
// a thread loads chunk t of rows g and g + 8 of its warp's 16 weight rows
// (r0, r1) and passes {r0.x, r1.x, r0.y, r1.y} for the block's first k16
// step and {r0.z, r1.z, r0.w, r1.w} for its second. The activations
// (logical order) are wgmma's B, NT tokens × 16 k from shared memory in the
// K-major core-matrix layout without swizzle: the 8 tokens × 8 k of core
// matrix (n8, k8) are 128 contiguous bytes at (K8·n8 + k8)·128, so a k16
// step's descriptor has leading byte offset 128 (k8 to k8 + 1) and stride
// byte offset 128·K8 (n8 to n8 + 1). The accumulators are D = W · A^T: 64
// features × NT tokens a warpgroup, stored transposed into C.
//
// # The block
//
// Warp-specialized: WG computing warpgroups of 64 features each over NT
// tokens (a (64·WG) × NT tile of C) and one copying warpgroup. The copier
// fills a ring of STAGES k stages (32·KPI wide: A's tokens and W's rows)
// with cp.async, each stage's copies tracked by its full barrier; a
// computing warpgroup waits for a stage, loads its weight fragments from
// it, runs the stage's wgmma to completion and frees the stage on its empty
// barrier. No barrier joins the computing warpgroups, so one's wgmma run
// while another waits; each waits for its own wgmma before it loads the
// next fragments, because a register a wgmma reads must not be written
// while it runs. At a part's end a thread adds its accumulators to its
// running sums (registers when TREG, else shared memory, value-major) and
// starts the next part from zero. Tokens past M and weight rows past N are
// zero-filled and never stored.
//
// # Speed (scripts/wgemm-check.cu on the H200, Llama-3-8B prefill shapes)
//
// kvx_fgemm_ws256w2s4k1s: 239-250 TFLOP/s against the mma.sync wide256s3s
// kernel's 209-224 and cuBLAS's 725-795 (without the fragment order's
// constraint). What holds it there: each computing warpgroup runs one
// stage's wgmma at a time (a weight fragment loaded from shared memory
// while a wgmma runs makes ptxas serialize them anyway), and the kernel's
// 168 registers a thread at 384 threads (setmaxnreg does not raise what
// ptxas allocates here) spill a few. The synchronous variants tried first
// (every warpgroup copying, __syncthreads a stage, the weight loaded
// straight into registers DW blocks ahead) ran at 161-235.
#include "mma.cuh"

#define WG_PART 1024 // k values a part, FG_PART in kernels/fgemm.cu
#define WG_BK 32     // k values a stage: one block of the fragments' order
#define WG_GROUP 8   // token tiles a column of blocks walks before the next feature tile

__device__ __forceinline__ void wg_cp16(void* dst, const void* src, bool ok) {
	asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src), "r"(ok ? 16 : 0));
}
__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wg_wait() { asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory"); }
// wg_proxy makes this thread's generic-proxy writes to shared memory (the
// cp.async copies that landed) visible to wgmma's async proxy.
__device__ __forceinline__ void wg_proxy() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// wg_desc is the shared memory descriptor of a K-major operand without
// swizzle: start address, leading and stride byte offsets, each >> 4.
__device__ __forceinline__ unsigned long long wg_desc(const void* p, unsigned lbo, unsigned sbo) {
	return (unsigned long long)((smem_addr(p) & 0x3FFFF) >> 4) | ((unsigned long long)((lbo & 0x3FFFF) >> 4) << 16) |
	       ((unsigned long long)((sbo & 0x3FFFF) >> 4) << 32);
}

// wg_mma: d (64 × NT float32 a warpgroup, NT/2 a thread) += a (registers)
// · the NT × 16 operand at desc, accumulating (scale-d 1).
template <int NT>
__device__ __forceinline__ void wg_mma(float (&d)[NT / 2], const unsigned (&a)[4], unsigned long long desc);

#define WG_F8(i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), "+f"(d[i + 6]), "+f"(d[i + 7])
#define WG_F32(i) WG_F8(i), WG_F8(i + 8), WG_F8(i + 16), WG_F8(i + 24)

template <>
__device__ __forceinline__ void wg_mma<128>(float (&d)[64], const unsigned (&a)[4], unsigned long long desc) {
	asm volatile(
		"{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
		"wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
		"{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, "
		"{%64,%65,%66,%67}, %68, p, 1, 1, 0;\n}\n"
		: WG_F32(0), WG_F32(32)
		: "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc));
}

template <>
__device__ __forceinline__ void wg_mma<192>(float (&d)[96], const unsigned (&a)[4], unsigned long long desc) {
	asm volatile(
		"{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
		"wgmma.mma_async.sync.aligned.m64n192k16.f32.bf16.bf16 "
		"{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63,%64,%65,%66,%67,%68,%69,%70,%71,%72,%73,%74,%75,%76,%77,%78,%79,%80,%81,%82,%83,%84,%85,%86,%87,%88,%89,%90,%91,%92,%93,%94,%95}, "
		"{%96,%97,%98,%99}, %100, p, 1, 1, 0;\n}\n"
		: WG_F32(0), WG_F32(32), WG_F32(64)
		: "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc));
}

template <>
__device__ __forceinline__ void wg_mma<256>(float (&d)[128], const unsigned (&a)[4], unsigned long long desc) {
	asm volatile(
		"{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
		"wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 "
		"{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63,%64,%65,%66,%67,%68,%69,%70,%71,%72,%73,%74,%75,%76,%77,%78,%79,%80,%81,%82,%83,%84,%85,%86,%87,%88,%89,%90,%91,%92,%93,%94,%95,%96,%97,%98,%99,%100,%101,%102,%103,%104,%105,%106,%107,%108,%109,%110,%111,%112,%113,%114,%115,%116,%117,%118,%119,%120,%121,%122,%123,%124,%125,%126,%127}, "
		"{%128,%129,%130,%131}, %132, p, 1, 1, 0;\n}\n"
		: WG_F32(0), WG_F32(32), WG_F32(64), WG_F32(96)
		: "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc));
}

// wg_keep tells the compiler that d is live here, so that it neither moves
// nor reuses the accumulators while a wgmma that writes them is in flight.
template <int V>
__device__ __forceinline__ void wg_keep(float (&d)[V]) {
#pragma unroll
	for (int i = 0; i < V; i++) asm volatile("" : "+f"(d[i])::"memory");
}

// wg_hold is a use of r that the compiler cannot drop: a register operand
// of a wgmma stays allocated to it until that wgmma is known to be done.
__device__ __forceinline__ void wg_hold(const uint4& r) { asm volatile("" ::"r"(r.x), "r"(r.y), "r"(r.z), "r"(r.w)); }

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
// mb_arrive_copies arrives on b once this thread's cp.async copies issued so
// far have landed (the barrier's count includes this arrival).
__device__ __forceinline__ void mb_arrive_copies(unsigned long long* b) {
	asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(smem_addr(b)) : "memory");
}

// fgemm_ws is the kernel described at the top. Warpgroups 0..WG-1 compute,
// warpgroup WG copies.
template <int NT, int WG, int STAGES, int KPI, bool TREG>
__device__ __forceinline__ void fgemm_ws(float* C, const unsigned short* A, const unsigned short* W, long long M, long long N, long long ld) {
	constexpr int CT = 128 * WG, BF = 64 * WG, V = NT / 2, BK = WG_BK * KPI;
	constexpr int K8 = BK / 8, SA = NT * BK, STAGE = (NT + BF) * BK;
	extern __shared__ __align__(128) unsigned char wg_smem[];
	unsigned short* sA = (unsigned short*)wg_smem;
	float* sTot = (float*)(sA + STAGES * STAGE);
	unsigned long long* full = (unsigned long long*)(sTot + (TREG ? 0 : V * CT));
	unsigned long long* empty = full + STAGES;
	const int tid = threadIdx.x, wg = tid / 128;
	long long bm, bn;
	{
		const long long mt = (M + NT - 1) / NT, nt = (N + BF - 1) / BF, pid = blockIdx.x;
		const long long per = WG_GROUP * nt, grp = pid / per, first = grp * WG_GROUP;
		const long long rows = mt - first < WG_GROUP ? mt - first : WG_GROUP;
		bm = (first + (pid % per) % rows) * NT;
		bn = ((pid % per) / rows) * BF;
	}
	const int KS = (int)(ld / BK), SPP = WG_PART / BK;
	// W's rows in a stage: row-major, chunk ch of row r at ch ^ 4·(r % 2)
	// when a row has 8 chunks, so a quarter warp's 16-byte loads of rows g,
	// g + 1 hit 32 banks.
	auto wsw = [](int r, int ch) { return K8 == 8 ? ch ^ ((r & 1) << 2) : ch; };
	if (tid == 0) {
		for (int i = 0; i < STAGES; i++) mb_init(full + i, 128), mb_init(empty + i, CT);
		asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
	}
	__syncthreads();

	if (wg == WG) { // the copier: A's stage in core matrices (eight threads fill one), then W's
		const int pt = tid - CT;
		asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n");
		for (int ks = 0; ks < KS; ks++) {
			const int st = ks % STAGES;
			if (ks >= STAGES) mb_wait(empty + st, (ks / STAGES - 1) & 1);
			unsigned short* s = sA + st * STAGE;
			const long long k0 = (long long)ks * BK;
#pragma unroll 4
			for (int c = pt; c < NT * K8; c += 128) {
				const int r = c & 7, k8 = (c >> 3) % K8, n8 = c / (8 * K8), tok = 8 * n8 + r;
				const bool ok = bm + tok < M;
				wg_cp16(s + (K8 * n8 + k8) * 64 + 8 * r, A + (ok ? bm + tok : 0) * ld + k0 + 8 * k8, ok);
			}
#pragma unroll 4
			for (int c = pt; c < BF * K8; c += 128) {
				const int r = c / K8, ch = c % K8;
				const bool ok = bn + r < N;
				wg_cp16(s + SA + r * BK + wsw(r, ch) * 8, W + (ok ? bn + r : 0) * ld + k0 + 8 * ch, ok);
			}
			mb_arrive_copies(full + st);
		}
		asm volatile("cp.async.wait_all;\n" ::: "memory");
		return;
	}

	asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n");
	const int warp = (tid / 32) % 4, lane = tid % 32, g = lane / 4, t = lane % 4;
	const int fl = wg * 64 + warp * 16 + g; // this thread's weight rows in the tile: fl, fl + 8
	const long long f0 = bn + fl;
	float d[V], tot[TREG ? V : 1];
#pragma unroll
	for (int i = 0; i < V; i++) d[i] = 0.f;
	const int parts = (KS + SPP - 1) / SPP;
	for (int p = 0; p < parts; p++) {
		// The part's chain: only wgmma writes the accumulators in this loop
		// (an ordinary write of them in it would make ptxas wait for every
		// wgmma before the next is issued).
		const int ks1 = (p + 1) * SPP < KS ? (p + 1) * SPP : KS;
		for (int ks = p * SPP; ks < ks1; ks++) {
			const int st = ks % STAGES;
			mb_wait(full + st, (ks / STAGES) & 1);
			wg_proxy(); // the landed copies, to wgmma's proxy
			const unsigned short* s = sA + st * STAGE;
			uint4 r0[KPI], r1[KPI];
#pragma unroll
			for (int j = 0; j < KPI; j++) {
				lds128((unsigned*)&r0[j], s + SA + fl * BK + wsw(fl, 4 * j + t) * 8);
				lds128((unsigned*)&r1[j], s + SA + (fl + 8) * BK + wsw(fl + 8, 4 * j + t) * 8);
			}
			wg_fence();
#pragma unroll
			for (int j = 0; j < KPI; j++) {
				const uint4 x = r0[j], y = r1[j];
				const unsigned a0[4] = {x.x, y.x, x.y, y.y}, a1[4] = {x.z, y.z, x.w, y.w};
				wg_mma<NT>(d, a0, wg_desc(s + (4 * j) * 64, 128, 128 * K8));
				wg_mma<NT>(d, a1, wg_desc(s + (4 * j + 2) * 64, 128, 128 * K8));
			}
			wg_commit();
			wg_wait<0>();
#pragma unroll
			for (int j = 0; j < KPI; j++) wg_hold(r0[j]), wg_hold(r1[j]);
			mb_arrive(empty + st);
		}
		// The end of a part: add it to the running sum, in part order.
		wg_keep(d);
		const bool first = p == 0, last = p == parts - 1;
#pragma unroll
		for (int v = 0; v < V; v++) {
			float x = d[v];
			if (TREG) {
				if (!first) x = __fadd_rn(tot[TREG ? v : 0], x);
				tot[TREG ? v : 0] = x;
			} else {
				float* q = sTot + v * CT + tid;
				if (!first) x = __fadd_rn(*q, x);
				if (!last) *q = x;
			}
			d[v] = last ? x : 0.f;
		}
		wg_keep(d);
	}
	// d[4j + e] is feature f0 + 8·(e / 2), token bm + 8j + 2t + e % 2.
#pragma unroll
	for (int j = 0; j < NT / 8; j++)
#pragma unroll
		for (int e = 0; e < 4; e++) {
			const long long f = f0 + 8 * (e / 2), tok = bm + 8 * j + 2 * t + e % 2;
			if (f < N && tok < M) C[tok * N + f] = d[4 * j + e];
		}
}

// kvx_fgemm_ws<NT>w<WG>s<STAGES>k<KPI><s|r>: grid ceil(M / NT) ·
// ceil(N / (64·WG)) blocks of 128·(WG + 1) threads; dynamic shared memory
// STAGES·(NT + 64·WG)·32·KPI·2 bytes, the running sums' NT/2·128·WG·4 for s
// (r keeps them in registers), and 2·STAGES·8 for the barriers (fgemm.go's
// tiledKernel.smem). ld a multiple of 64.
#define FGEMM_WS(NT, WG, STAGES, KPI, TREG, SUF)                                                                         \
	extern "C" __global__ void __launch_bounds__(128 * (WG + 1), 1) kvx_fgemm_ws##NT##w##WG##s##STAGES##k##KPI##SUF( \
		float* C, const unsigned short* A, const unsigned short* W, long long M, long long N, long long ld) {            \
		fgemm_ws<NT, WG, STAGES, KPI, TREG>(C, A, W, M, N, ld);                                                       \
	}
FGEMM_WS(256, 2, 4, 1, false, s)
FGEMM_WS(192, 2, 5, 2, true, r)
