// The fast GQA attention (dtype bfloat16): paged bf16 K/V, queries rounded
// to bf16, scores and the weighted sum of V on tensor cores (mma.sync
// m16n8k16, float32 accumulation), an online softmax in float32.
//
// # One order of operations per query row, whatever its call
//
// A query row's output depends only on its own query, its sequence's keys
// and values and its position, never on which kernel ran it, the other
// rows of its block or call, the chunk it came in or where its blocks lie:
//
//   - A warp's 16 rows are (token, query head) pairs of one sequence and
//     one kv head; rows are independent in every mma, so packing heads or
//     tokens together changes no row's bits.
//   - Keys come in tiles of FA_KT absolute positions (tile i covers
//     positions FA_KT·i ... FA_KT·i + FA_KT - 1) and every tile a row sees
//     updates its softmax state the same way: scores from the d16 steps in
//     ascending order, masked to -inf outside [lo(p), p], the running max,
//     the rescale, the sum of the tile's 64 exponentials in a fixed order,
//     then P·V over the tile's k16 steps in ascending order. A tile with no
//     visible key leaves the state as it was (exp2(-inf) = 0, a factor of
//     exactly 1), so a kernel may run more tiles than a row needs.
//   - Tiles group into partitions of FA_PART absolute positions. Each
//     partition's state (m, l, acc) starts from nothing, and a row's
//     partitions are folded in ascending order by faMerge, starting from the
//     first one the row sees. The prefill kernel folds them in registers as
//     it goes; the split kernel (few rows, long contexts: flash-decoding)
//     writes each partition's state and kvx_fa_merge folds them, with the
//     same arithmetic in the same order.
//   - Every float operation outside the mma is written with its rounding
//     (__fmul_rn, __fadd_rn, ...) and the module is compiled with
//     -fmad=false, so no kernel contracts one differently.
//
// So the fast attention is deterministic and batch-invariant: a request
// gets the same bits alone, batched, chunked, or recomputed after a
// preemption (fattn_test.go checks each, and that both kernels agree).
#include "mma.cuh"
#include "pdl.cuh"

#define FA_KT 64                   // keys a tile
#define FA_PART 256                // keys a partition
#define FA_TPP (FA_PART / FA_KT)   // tiles a partition

// cp_async16_ok copies 16 bytes global -> shared when ok, else writes 16
// zero bytes and reads nothing.
__device__ __forceinline__ void fa_cp16(void* dst, const void* src, bool ok) {
	asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src), "r"(ok ? 16 : 0));
}

// A tile's K (or V) rows in shared memory: FA_KT rows of D bf16, 16-byte
// chunk c of row r stored at c ^ (r % 8), so the 8 rows an ldmatrix reads
// hit 8 bank groups.
template <int D>
__device__ __forceinline__ int fa_swz(int r, int ch) { return r * D + ((ch ^ (r & 7)) * 8); }

// The paged pool: the row of logical position t of a sequence whose block
// table is tab lives at base + tab[t / tpb]·blockBytes + offset + (t %
// tpb)·stride; K of kv head h at h·D bf16 into the row, V at (kvHeads +
// h)·D.
struct faPool {
	const char* base;
	long long blockBytes, offset, stride;
	int tpb;
};

__device__ __forceinline__ const char* fa_row(const faPool& v, const int* tab, long long t) {
	const int b = (int)(t / v.tpb);
	return v.base + (long long)tab[b] * v.blockBytes + v.offset + (t - (long long)b * v.tpb) * v.stride;
}

// fa_lo is the first position a query at p sees (window 0: all).
__device__ __forceinline__ long long fa_lo(long long p, int window) {
	return window > 0 && p - window + 1 > 0 ? p - window + 1 : 0;
}

// fa_load copies the K and V rows of kv head kvh at positions k0 ... k0 +
// FA_KT - 1 into a stage, by NT threads; positions outside [kfirst, klast]
// are zeros (never read: their blocks may be freed). A thread copies the
// same chunk of every NT / (D / 8)-th row, so it finds its rows' blocks by
// stepping, with one division a tile.
template <int D, int NT>
__device__ __forceinline__ void fa_load(unsigned short* sK, unsigned short* sV, const faPool& v, const int* tab,
		long long k0, long long kfirst, long long klast, int kvh, int kvHeads, int tid) {
	constexpr int CH = D / 8, STEP = NT / CH; // 16-byte chunks a head row; rows between a thread's
	static_assert(NT % CH == 0, "threads must cover whole rows");
	const int ch = tid % CH;
	int r = tid / CH;
	long long t = k0 + r;
	long long b = t / v.tpb, in = t - b * v.tpb;
	const long long kOff = ((long long)kvh * D + ch * 8) * 2, vOff = ((long long)(kvHeads + kvh) * D + ch * 8) * 2;
	for (; r < FA_KT; r += STEP, t += STEP) {
		const bool ok = t >= kfirst && t <= klast;
		const char* row = ok ? v.base + (long long)tab[b] * v.blockBytes + v.offset + in * v.stride : v.base;
		fa_cp16(sK + fa_swz<D>(r, ch), row + kOff, ok);
		fa_cp16(sV + fa_swz<D>(r, ch), row + vOff, ok);
		for (in += STEP; in >= v.tpb; in -= v.tpb) b++;
	}
}

// faRows is what a thread knows of its two rows of a warp's 16 (g and g +
// 8, g = lane / 4): positions (-1: no row) and first visible positions.
struct faRows {
	long long p[2], lo[2];
};

// fa_scores computes S = Q·Kᵀ of the tile at positions tb ... tb + FA_KT
// - 1 (in sK) for its key n8 tiles j0 ... j0 + NJ - 1 (keys 8j ... 8j + 7),
// each over the d16 steps in ascending order, masked to -inf outside
// [lo(p), p] and scaled by qs (the softmax scale times log2(e)). qa: the
// warp's queries as mma A fragments. A score's value does not depend on
// which warp computes it or on the other key tiles it computes.
template <int D, int NJ>
__device__ __forceinline__ void fa_scores(float (&s)[NJ][4], const unsigned short* sK, long long tb, int j0,
		const unsigned (&qa)[D / 16][4], const faRows& rw, float qs, int lane) {
	const int t = lane % 4;
#pragma unroll
	for (int j = 0; j < NJ; j++) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.f;
#pragma unroll
	for (int kk = 0; kk < D / 16; kk += 2) {
#pragma unroll
		for (int j = 0; j < NJ; j++) {
			unsigned kb[4];
			ldsm_x4(kb, sK + fa_swz<D>(8 * (j0 + j) + lane % 8, 2 * kk + lane / 8));
			mma_bf16(s[j], qa[kk], kb[0], kb[1]);
			mma_bf16(s[j], qa[kk + 1], kb[2], kb[3]);
		}
	}
#pragma unroll
	for (int j = 0; j < NJ; j++)
#pragma unroll
		for (int e = 0; e < 4; e++) {
			const int h = e / 2;
			const long long kp = tb + 8 * (j0 + j) + 2 * t + (e % 2);
			s[j][e] = kp <= rw.p[h] && kp >= rw.lo[h] ? __fmul_rn(s[j][e], qs) : -INFINITY;
		}
}

// fa_softmax advances a row pair's softmax state (m, l in log2 units) over
// a tile's masked, scaled scores s (a thread's two rows g and g + 8, g =
// lane / 4, of the quad that holds their 64), and returns the factor corr
// that the unnormalized output must be scaled by and P = exp2(S - m),
// rounded to bf16, as the A fragments of P·V. The row sums are taken in a
// fixed order: the thread's 16 in j order, then the quad's butterfly, whose
// sums are the same on all four lanes.
__device__ __forceinline__ void fa_softmax(const float (&s)[FA_KT / 8][4], float (&m)[2], float (&l)[2],
		unsigned (&pa)[FA_KT / 16][4], float (&corr)[2]) {
	float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
	for (int j = 0; j < FA_KT / 8; j++)
#pragma unroll
		for (int e = 0; e < 4; e++) mx[e / 2] = fmaxf(mx[e / 2], s[j][e]);
	float mu[2];
#pragma unroll
	for (int h = 0; h < 2; h++) {
		mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));
		mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));
		const float mn = fmaxf(m[h], mx[h]);
		mu[h] = mn == -INFINITY ? 0.f : mn; // no visible key yet: exponents of -inf, all 0
		corr[h] = exp2f(__fsub_rn(m[h], mu[h]));
		m[h] = mn;
	}
	float rs[2] = {0.f, 0.f};
#pragma unroll
	for (int j = 0; j < FA_KT / 8; j++) {
		float e[4];
#pragma unroll
		for (int i = 0; i < 4; i++) e[i] = exp2f(__fsub_rn(s[j][i], mu[i / 2]));
		rs[0] = __fadd_rn(__fadd_rn(rs[0], e[0]), e[1]);
		rs[1] = __fadd_rn(__fadd_rn(rs[1], e[2]), e[3]);
		pa[j / 2][(j % 2) * 2] = pack_bf16(e[0], e[1]);
		pa[j / 2][(j % 2) * 2 + 1] = pack_bf16(e[2], e[3]);
	}
#pragma unroll
	for (int h = 0; h < 2; h++) {
		rs[h] = __fadd_rn(rs[h], __shfl_xor_sync(0xffffffffu, rs[h], 1));
		rs[h] = __fadd_rn(rs[h], __shfl_xor_sync(0xffffffffu, rs[h], 2));
		l[h] = __fadd_rn(__fmul_rn(l[h], corr[h]), rs[h]);
	}
}

// fa_pv scales a warp's unnormalized outputs of d n8 tiles jd0 ... jd0 +
// NJD - 1 by corr and adds P·V over the tile (in sV): each d n8 tile over
// the tile's k16 steps in ascending order, whichever d tiles the warp has.
template <int D, int NJD>
__device__ __forceinline__ void fa_pv(float (&o)[NJD][4], const unsigned (&pa)[FA_KT / 16][4], const float (&corr)[2],
		const unsigned short* sV, int jd0, int lane) {
	static_assert(NJD % 2 == 0, "d tiles go in pairs (one ldmatrix.x4)");
#pragma unroll
	for (int jd = 0; jd < NJD; jd++) {
		o[jd][0] = __fmul_rn(o[jd][0], corr[0]);
		o[jd][1] = __fmul_rn(o[jd][1], corr[0]);
		o[jd][2] = __fmul_rn(o[jd][2], corr[1]);
		o[jd][3] = __fmul_rn(o[jd][3], corr[1]);
	}
#pragma unroll
	for (int kk = 0; kk < FA_KT / 16; kk++) {
#pragma unroll
		for (int jd = 0; jd < NJD; jd += 2) {
			unsigned vb[4];
			ldsm_x4_trans(vb, sV + fa_swz<D>(16 * kk + lane % 8 + ((lane / 8) % 2) * 8, jd0 + jd + lane / 16));
			mma_bf16(o[jd], pa[kk], vb[0], vb[1]);
			mma_bf16(o[jd + 1], pa[kk], vb[2], vb[3]);
		}
	}
}

// fa_tile advances one warp's softmax states (m, l in log2 units, o
// unnormalized) over the tile at positions tb ... tb + FA_KT - 1 held in
// sK, sV: its scores, the softmax, P·V, all of them in the warp.
template <int D>
__device__ __forceinline__ void fa_tile(const unsigned short* sK, const unsigned short* sV, long long tb,
		const unsigned (&qa)[D / 16][4], float (&o)[D / 8][4], float (&m)[2], float (&l)[2], const faRows& rw,
		float qs, int lane) {
	float s[FA_KT / 8][4], corr[2];
	unsigned pa[FA_KT / 16][4];
	fa_scores<D, FA_KT / 8>(s, sK, tb, 0, qa, rw, qs, lane);
	fa_softmax(s, m, l, pa, corr);
	fa_pv<D, D / 8>(o, pa, corr, sV, 0, lane);
}

// fa_merge_factors: the factors of folding a partition's state (m, l)
// into the state folded so far (M, L): M' = max(M, m), and the old and the
// new state are scaled by a = 2^(M - M') and b = 2^(m - M'). Both states
// have seen a visible key (finite maxima).
__device__ __forceinline__ void fa_merge_factors(float M, float m, float* a, float* b, float* Mn) {
	*Mn = fmaxf(M, m);
	*a = exp2f(__fsub_rn(M, *Mn));
	*b = exp2f(__fsub_rn(m, *Mn));
}
__device__ __forceinline__ float fa_fold(float X, float a, float x, float b) {
	return __fadd_rn(__fmul_rn(X, a), __fmul_rn(x, b));
}

// fa_queries loads a warp's queries as mma A fragments: rows r of the
// block's sequence (flattened (token, head) index r: token r / G, head kvh
// · G + r % G), rows past R zero.
template <int D>
__device__ __forceinline__ void fa_queries(unsigned (&qa)[D / 16][4], const float* q, long long row0, long long wr0,
		long long R, int G, int kvh, int heads, int lane) {
	const int g = lane / 4, t = lane % 4;
#pragma unroll
	for (int h = 0; h < 2; h++) {
		const long long r = wr0 + g + 8 * h;
		const float* qr = r < R ? q + (row0 + r / G) * (long long)heads * D + (long long)(kvh * G + r % G) * D : nullptr;
#pragma unroll
		for (int kk = 0; kk < D / 16; kk++)
#pragma unroll
			for (int c = 0; c < 2; c++) {
				unsigned v = 0;
				if (qr) {
					const float2 x = *(const float2*)(qr + 16 * kk + 8 * c + 2 * t);
					v = pack_bf16(x.x, x.y);
				}
				qa[kk][2 * c + h] = v; // a0 (row g), a1 (g+8), a2 (g, cols +8), a3
			}
	}
}

// fa_rows fills a thread's rows of the warp whose first flattened row is
// wr0 (of R rows at positions pos + r / G).
__device__ __forceinline__ faRows fa_rows(long long wr0, long long R, int G, long long pos, int window, int lane) {
	faRows rw;
#pragma unroll
	for (int h = 0; h < 2; h++) {
		const long long r = wr0 + lane / 4 + 8 * h;
		rw.p[h] = r < R ? pos + r / G : -1;
		rw.lo[h] = r < R ? fa_lo(rw.p[h], window) : 0;
	}
	return rw;
}

// faFold holds a prefill warp's folded partitions (F: a thread's D / 8 × 4
// float32, the fold of every partition its rows have finished): in
// registers, or, where registers run short (D = 128: the running state,
// the fold and the queries would be 255 registers with spills), in shared
// memory, each thread's values 32 floats apart (lane-consecutive: no bank
// conflicts). Only its own thread reads or writes them, at a partition's
// end, so no barrier is needed. The same values either way.
template <int D, bool SHARED>
struct faFold;
template <int D>
struct faFold<D, false> {
	float F[D / 8][4];
	__device__ __forceinline__ faFold(float*, int, int) {}
	__device__ __forceinline__ float& at(int jd, int e) { return F[jd][e]; }
};
template <int D>
struct faFold<D, true> {
	float* p;
	__device__ __forceinline__ faFold(float* sF, int warp, int lane) : p(sF + warp * (D / 8) * 4 * 32 + lane) {}
	__device__ __forceinline__ float& at(int jd, int e) { return p[(jd * 4 + e) * 32]; }
};

// FA_FOLD_SHARED is whether a prefill kernel of head dim D keeps its fold in
// shared memory (fattn.go's faPrefillSmem counts it).
#define FA_FOLD_SHARED(D) ((D) > 64)

// The segment descriptors (long long ×4 a segment, as attn.cu's): block
// table address, tokens before the call, rows, first call row.

// fa_prefill: grid (work items, kv heads), W warps; work item i is
// (segment, first flattened row) at work[2i], work[2i+1]; each block takes
// 16·W rows of its segment and folds every partition as it goes. W does
// not change a row's arithmetic: more warps share each K and V tile.
// Dynamic shared memory: 2 stages × (K, V) × FA_KT × D bf16, then the
// warps' folds when FA_FOLD_SHARED(D) (W × 32 × D / 2 float32). When ob is
// not 0 the block writes out's bf16 copy there too (out's layout), for the
// next matmul (o_proj).
template <int D, int W>
__device__ void fa_prefill(const long long* desc, const int* work, const float* q, float* out, unsigned short* ob,
		faPool v, int heads, int kvHeads, int window, float qs) {
	extern __shared__ __align__(16) unsigned char fa_smem[];
	unsigned short* sK = (unsigned short*)fa_smem;
	unsigned short* sV = sK + 2 * FA_KT * D;
	const int kvh = blockIdx.y, tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
	const long long* sd = desc + 4 * (long long)work[2 * blockIdx.x];
	const long long r0 = work[2 * blockIdx.x + 1];
	const int* tab = (const int*)sd[0];
	const long long pos = sd[1], row0 = sd[3];
	const int G = heads / kvHeads;
	const long long R = sd[2] * G, rEnd = min(R, r0 + 16 * W);
	const long long kfirst = fa_lo(pos + r0 / G, window), klast = pos + (rEnd - 1) / G;
	const long long t0 = kfirst / FA_KT, t1 = klast / FA_KT;

	const long long wr0 = r0 + 16 * warp;
	const bool wAny = wr0 < rEnd;
	const long long wlo = wAny ? fa_lo(pos + wr0 / G, window) : 0, whi = wAny ? pos + (min(rEnd, wr0 + 16) - 1) / G : -1;
	const faRows rw = fa_rows(wr0, rEnd, G, pos, window, lane);
	unsigned qa[D / 16][4];
	fa_queries<D>(qa, q, row0, wr0, rEnd, G, kvh, heads, lane);

	faFold<D, FA_FOLD_SHARED(D)> F((float*)(sV + 2 * FA_KT * D), warp, lane);
	float o[D / 8][4], m[2], l[2], FM[2], FL[2];
#pragma unroll
	for (int jd = 0; jd < D / 8; jd++)
#pragma unroll
		for (int e = 0; e < 4; e++) o[jd][e] = F.at(jd, e) = 0.f;
	m[0] = m[1] = FM[0] = FM[1] = -INFINITY;
	l[0] = l[1] = FL[0] = FL[1] = 0.f;

	fa_load<D, 32 * W>(sK, sV, v, tab, t0 * FA_KT, kfirst, klast, kvh, kvHeads, tid);
	cp_async_commit();
	for (long long tile = t0; tile <= t1; tile++) {
		const int st = (int)((tile - t0) & 1);
		if (tile < t1)
			fa_load<D, 32 * W>(sK + (st ^ 1) * FA_KT * D, sV + (st ^ 1) * FA_KT * D, v, tab, (tile + 1) * FA_KT, kfirst,
				klast, kvh, kvHeads, tid);
		cp_async_commit();
		cp_async_wait<1>();
		__syncthreads();
		const long long tb = tile * FA_KT;
		if (wAny && tb <= whi && tb + FA_KT - 1 >= wlo)
			fa_tile<D>(sK + st * FA_KT * D, sV + st * FA_KT * D, tb, qa, o, m, l, rw, qs, lane);
		if ((tile + 1) % FA_TPP == 0 || tile == t1) {
			// The end of partition j: fold it into every row that sees it.
			const long long j = tile / FA_TPP;
#pragma unroll
			for (int h = 0; h < 2; h++) {
				if (rw.p[h] < 0 || j < rw.lo[h] / FA_PART || j > rw.p[h] / FA_PART) continue;
				if (j == rw.lo[h] / FA_PART) {
					FM[h] = m[h], FL[h] = l[h];
#pragma unroll
					for (int jd = 0; jd < D / 8; jd++) F.at(jd, 2 * h) = o[jd][2 * h], F.at(jd, 2 * h + 1) = o[jd][2 * h + 1];
				} else {
					float a, b, Mn;
					fa_merge_factors(FM[h], m[h], &a, &b, &Mn);
					FM[h] = Mn;
					FL[h] = fa_fold(FL[h], a, l[h], b);
#pragma unroll
					for (int jd = 0; jd < D / 8; jd++) {
						F.at(jd, 2 * h) = fa_fold(F.at(jd, 2 * h), a, o[jd][2 * h], b);
						F.at(jd, 2 * h + 1) = fa_fold(F.at(jd, 2 * h + 1), a, o[jd][2 * h + 1], b);
					}
				}
			}
#pragma unroll
			for (int jd = 0; jd < D / 8; jd++) o[jd][0] = o[jd][1] = o[jd][2] = o[jd][3] = 0.f;
			m[0] = m[1] = -INFINITY;
			l[0] = l[1] = 0.f;
		}
		__syncthreads(); // every warp is done with stage st before it is loaded again
	}
	const int t = lane % 4;
#pragma unroll
	for (int h = 0; h < 2; h++) {
		const long long r = wr0 + lane / 4 + 8 * h;
		if (r >= rEnd) continue;
		const long long at = (row0 + r / G) * (long long)heads * D + (long long)(kvh * G + r % G) * D;
#pragma unroll
		for (int jd = 0; jd < D / 8; jd++) {
			const float y0 = __fdiv_rn(F.at(jd, 2 * h), FL[h]), y1 = __fdiv_rn(F.at(jd, 2 * h + 1), FL[h]);
			*(float2*)(out + at + 8 * jd + 2 * t) = make_float2(y0, y1);
			if (ob) *(unsigned*)(ob + at + 8 * jd + 2 * t) = (unsigned)to_bf16(y0) | (unsigned)to_bf16(y1) << 16;
		}
	}
}

// fa_split: grid (partitions, kv heads, work items), FA_SW warps; work
// item i is segment work[i], of at most 16 flattened rows (decode). The
// block computes partition blockIdx.x's state of every row that sees it
// into part (items × kvHeads × parts × 16 × D) and ml (the same × 2: m, l).
// When part is 0 the call has one partition (every row's context lies in
// the first FA_PART positions), so each row's fold is that partition's
// state alone and the block writes kvx_fa_merge's output itself: out =
// acc / l, the merge's one division of the same two values (and ob, its
// bf16 copy, when not 0), and the merge's launch is skipped.
//
// The warps share the 16 rows' work on each tile without changing a value
// of fa_tile's: all of them copy the tile, warp w computes the scores of
// key n8 tiles w·NJ ... (fa_scores), the scores meet in shared memory,
// every warp runs the softmax on the whole tile (the same values in the
// same order, so every warp holds the same P, m and l), and warp w adds
// P·V to its D / FA_SW output columns (fa_pv). So the rows' bits are the
// prefill kernel's (TestFastGQAInvariant).
// Dynamic shared memory: fa_prefill's, then 16 rows of FA_KT scores
// (FA_SS floats apart).
#define FA_SW 4
#define FA_SS (FA_KT + 8)
template <int D>
__device__ void fa_split(const long long* desc, const int* work, const float* q, float* part, float* ml, float* out,
		unsigned short* ob, faPool v, int heads, int kvHeads, int window, float qs) {
	constexpr int NJ = FA_KT / 8 / FA_SW, NJD = D / 8 / FA_SW;
	static_assert(NJ * FA_SW == FA_KT / 8 && NJD * FA_SW == D / 8, "warps must share key and d tiles evenly");
	extern __shared__ __align__(16) unsigned char fa_smem[];
	unsigned short* sK = (unsigned short*)fa_smem;
	unsigned short* sV = sK + 2 * FA_KT * D;
	float* sS = (float*)(sV + 2 * FA_KT * D);
	const long long j = blockIdx.x;
	const int kvh = blockIdx.y, item = blockIdx.z, tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
	const int g = lane / 4, t = lane % 4;
	const long long* sd = desc + 4 * (long long)work[item];
	const int* tab = (const int*)sd[0];
	const long long pos = sd[1], row0 = sd[3];
	const int G = heads / kvHeads;
	const long long R = sd[2] * G;
	const long long kfirst = max(fa_lo(pos, window), j * FA_PART), klast = min(pos + (R - 1) / G, j * FA_PART + FA_PART - 1);
	if (kfirst > klast) return; // no row sees this partition
	const long long t0 = kfirst / FA_KT, t1 = klast / FA_KT;
	const faRows rw = fa_rows(0, R, G, pos, window, lane);
	unsigned qa[D / 16][4];
	fa_queries<D>(qa, q, row0, 0, R, G, kvh, heads, lane);
	float o[NJD][4], m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
#pragma unroll
	for (int jd = 0; jd < NJD; jd++) o[jd][0] = o[jd][1] = o[jd][2] = o[jd][3] = 0.f;

	fa_load<D, 32 * FA_SW>(sK, sV, v, tab, t0 * FA_KT, kfirst, klast, kvh, kvHeads, tid);
	cp_async_commit();
	for (long long tile = t0; tile <= t1; tile++) {
		const int st = (int)((tile - t0) & 1);
		if (tile < t1)
			fa_load<D, 32 * FA_SW>(sK + (st ^ 1) * FA_KT * D, sV + (st ^ 1) * FA_KT * D, v, tab, (tile + 1) * FA_KT, kfirst,
				klast, kvh, kvHeads, tid);
		cp_async_commit();
		cp_async_wait<1>();
		__syncthreads();
		{
			float sw[NJ][4];
			fa_scores<D, NJ>(sw, sK + st * FA_KT * D, tile * FA_KT, warp * NJ, qa, rw, qs, lane);
#pragma unroll
			for (int jj = 0; jj < NJ; jj++) {
				const int c = 8 * (warp * NJ + jj) + 2 * t;
				*(float2*)(sS + g * FA_SS + c) = make_float2(sw[jj][0], sw[jj][1]);
				*(float2*)(sS + (g + 8) * FA_SS + c) = make_float2(sw[jj][2], sw[jj][3]);
			}
		}
		__syncthreads();
		float s[FA_KT / 8][4], corr[2];
#pragma unroll
		for (int jj = 0; jj < FA_KT / 8; jj++) {
			const float2 a = *(const float2*)(sS + g * FA_SS + 8 * jj + 2 * t);
			const float2 b = *(const float2*)(sS + (g + 8) * FA_SS + 8 * jj + 2 * t);
			s[jj][0] = a.x, s[jj][1] = a.y, s[jj][2] = b.x, s[jj][3] = b.y;
		}
		unsigned pa[FA_KT / 16][4];
		fa_softmax(s, m, l, pa, corr);
		fa_pv<D, NJD>(o, pa, corr, sV + st * FA_KT * D, warp * NJD, lane);
		__syncthreads(); // every warp is done with stage st and the scores before they are written again
	}
	const long long parts = gridDim.x, base = ((long long)item * kvHeads + kvh) * parts + j;
	const int c0 = 8 * NJD * warp; // the warp's first output column
#pragma unroll
	for (int h = 0; h < 2; h++) {
		const int r = g + 8 * h;
		if (rw.p[h] < 0 || j < rw.lo[h] / FA_PART || j > rw.p[h] / FA_PART) continue;
		if (!part) {
			const long long oa = (row0 + r / G) * (long long)heads * D + (long long)(kvh * G + r % G) * D + c0;
#pragma unroll
			for (int jd = 0; jd < NJD; jd++) {
				const long long i = oa + 8 * jd + 2 * t;
				const float y0 = __fdiv_rn(o[jd][2 * h], l[h]), y1 = __fdiv_rn(o[jd][2 * h + 1], l[h]);
				*(float2*)(out + i) = make_float2(y0, y1);
				if (ob) {
					ob[i] = to_bf16(y0);
					ob[i + 1] = to_bf16(y1);
				}
			}
			continue;
		}
		float* pr = part + (base * 16 + r) * D + c0;
#pragma unroll
		for (int jd = 0; jd < NJD; jd++) *(float2*)(pr + 8 * jd + 2 * t) = make_float2(o[jd][2 * h], o[jd][2 * h + 1]);
		if (warp == 0 && t == 0) {
			ml[(base * 16 + r) * 2] = m[h];
			ml[(base * 16 + r) * 2 + 1] = l[h];
		}
	}
}

#define FA_ENTRIES(D)                                                                                                   \
	FA_PREFILL(D, 4)                                                                                                    \
	FA_PREFILL(D, 8)                                                                                                    \
	extern "C" __global__ void __launch_bounds__(32 * FA_SW) kvx_fa_split_d##D(const long long* desc, const int* work,         \
		const float* q, float* part, float* ml, float* out, unsigned short* ob, const char* base, long long blockBytes,  \
		long long offset, long long stride, int tpb, int heads, int kvHeads, int window, float qs) {                    \
		pdl_wait();                                                                                                      \
		fa_split<D>(desc, work, q, part, ml, out, ob, faPool{base, blockBytes, offset, stride, tpb}, heads, kvHeads,     \
			window, qs);                                                                                                 \
	}
#define FA_PREFILL(D, W)                                                                                                \
	extern "C" __global__ void __launch_bounds__(32 * W) kvx_fa_prefill_d##D##w##W(const long long* desc,              \
		const int* work, const float* q, float* out, unsigned short* ob, const char* base, long long blockBytes,         \
		long long offset, long long stride, int tpb, int heads, int kvHeads, int window, float qs) {                    \
		pdl_wait();                                                                                                      \
		fa_prefill<D, W>(desc, work, q, out, ob, faPool{base, blockBytes, offset, stride, tpb}, heads, kvHeads, window, \
			qs);                                                                                                         \
	}
FA_ENTRIES(64)
FA_ENTRIES(128)

// kvx_fa_merge: grid (work items, kv heads), any threads; folds every
// row's partition states (kvx_fa_split_d*'s part and ml, parts a row) in
// ascending order, as fa_prefill does, and writes out; when ob is not 0,
// also out rounded to bf16 (to_bf16, kvx_to_bf16's rounding) at the same
// index: the next matmul's input, whose padded row is out's row when
// heads·D is a multiple of its pad (the host checks). A thread loads
// FA_MU partitions' states before it folds them, so that many loads are in
// flight at once; the folds keep their order.
#define FA_MU 8
extern "C" __global__ void kvx_fa_merge(const long long* desc, const int* work, const float* part, const float* ml,
		float* out, unsigned short* ob, int parts, int heads, int kvHeads, int D, int window) {
	pdl_wait();
	const int kvh = blockIdx.y, item = blockIdx.x;
	const long long* sd = desc + 4 * (long long)work[item];
	const long long pos = sd[1], row0 = sd[3];
	const int G = heads / kvHeads;
	const long long R = sd[2] * G;
	const long long base = ((long long)item * kvHeads + kvh) * parts;
	for (long long i = threadIdx.x; i < R * D; i += blockDim.x) {
		const long long r = i / D, d = i % D, p = pos + r / G;
		const long long jlo = fa_lo(p, window) / FA_PART, jhi = p / FA_PART;
		const long long at = (base + jlo) * 16 + r;
		float F = part[at * D + d], M = ml[at * 2], L = ml[at * 2 + 1];
		for (long long j = jlo + 1; j <= jhi; j += FA_MU) {
			float pm[FA_MU], pl[FA_MU], px[FA_MU];
#pragma unroll
			for (int u = 0; u < FA_MU; u++) {
				if (j + u > jhi) break;
				const long long aj = (base + j + u) * 16 + r;
				pm[u] = ml[aj * 2], pl[u] = ml[aj * 2 + 1], px[u] = part[aj * D + d];
			}
#pragma unroll
			for (int u = 0; u < FA_MU; u++) {
				if (j + u > jhi) break;
				float a, b, Mn;
				fa_merge_factors(M, pm[u], &a, &b, &Mn);
				F = fa_fold(F, a, px[u], b);
				L = fa_fold(L, a, pl[u], b);
				M = Mn;
			}
		}
		const long long o = (row0 + r / G) * (long long)heads * D + (long long)(kvh * G + r % G) * D + d;
		const float y = __fdiv_rn(F, L);
		out[o] = y;
		if (ob) {
			ob[o] = to_bf16(y);
		}
	}
}
