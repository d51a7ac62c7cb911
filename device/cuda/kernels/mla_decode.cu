// Fast MLA decode (benchmark-only, like decode.cu): DeepSeek-V3's absorbed
// multi-head latent attention for one query token per sequence over a paged
// bf16 latent cache, on tensor cores (mma.sync m16n8k16, bf16 in, float32
// accumulate), split-K flash-decoding with an ordered merge; and the DSA
// pieces around it: the lightning indexer's scan (64 index heads × 128 dims,
// ReLU-weighted), an exact top-k, and the sparse form of the same attention
// kernel over the selected positions.
//
// Shapes: a latent row is 576 bf16 (512 of c_kv, then 64 of the rotated
// k_pe); the value is its first 512. The query is already absorbed: heads ×
// 576 bf16 (q_nope·W_UK, then q_pe). Every reduction runs over logical
// positions in a fixed order (tiles of 32 positions inside a split, splits in
// order), so the result does not depend on block placement or on the other
// sequences of the batch. It is not the exact kernel (attn.cu): the scores
// are reassociated sums and the probabilities are rounded to bf16 before
// P·V (as FlashAttention and FlashMLA do), so it agrees with the exact
// attention to about 2^-8 of the values' scale.
#include "mma.cuh"

#define MLA_DK 576   // latent + rope
#define MLA_DV 512   // latent
#define MLA_HB 64    // query heads per thread block (4 m16 tiles)
#define MLA_T 32     // positions per tile
#define MLA_STAGES 3 // tiles in flight
#define MLA_LD 584   // shared row of Q and K in bf16: 576 + 8, so ldmatrix rows fall in distinct banks
#define MLA_PLD 40   // shared row of P in bf16
#define MLA_SLD 36   // shared row of S in floats

// The dynamic shared memory of kvx_mla_decode_split (mla_decode.go sets the
// function's limit to it): Q, the K tiles, S, P, and m, l, corr per head.
#define MLA_SMEM (MLA_HB * MLA_LD * 2 + MLA_STAGES * MLA_T * MLA_LD * 2 + MLA_HB * MLA_SLD * 4 + MLA_HB * MLA_PLD * 2 + 3 * MLA_HB * 4)

// kvx_mla_decode_split: grid (heads / 64, splits, batch), block 512 (16
// warps), MLA_SMEM bytes of dynamic shared memory.
//
// part: batch × heads × splits × 512 unnormalized outputs; ml: batch ×
// heads × splits × 2 (running max in log2 units, sum of the bf16-rounded
// probabilities). q: batch × heads × 576 bf16. base, block_bytes, offset,
// stride, tpb: the paged latent buffer (16-byte aligned rows); tables: batch
// × max_blocks int32; ctx: batch lengths. Dense when sel is 0: positions
// 0..ctx-1. Sparse otherwise: sel is batch × topk ascending positions, the
// first min(ctx, topk) of each row are read.
//
// Work of one tile (32 positions): warp w computes S for heads (w%4)*16..+15
// and positions (w/4)*8..+7 over all 576 dims; the block's threads turn S
// into bf16 probabilities with the online softmax (8 threads a head); warp w
// then adds P·V for heads (w%4)*16.. and dims (w/4)*128..+127 (64 float32
// accumulators a thread).
extern "C" __global__ void __launch_bounds__(512, 1)
kvx_mla_decode_split(float* part, float* ml, const unsigned short* q, const char* base, const int* tables,
		const long long* ctx, const int* sel, long long topk, long long block_bytes, long long offset, long long stride,
		long long tpb, long long max_blocks, long long heads, long long split_tokens, long long splits, float scale) {
	extern __shared__ __align__(16) unsigned char smem[];
	unsigned short* sQ = (unsigned short*)smem;
	unsigned short* sK = sQ + MLA_HB * MLA_LD;
	float* sS = (float*)(sK + MLA_STAGES * MLA_T * MLA_LD);
	unsigned short* sP = (unsigned short*)(sS + MLA_HB * MLA_SLD);
	float* sM = (float*)(sP + MLA_HB * MLA_PLD);
	float* sL = sM + MLA_HB;
	float* sC = sL + MLA_HB;

	const int hg = blockIdx.x, split = blockIdx.y, b = blockIdx.z;
	const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
	const int g = lane / 4, t4 = lane % 4;
	long long n = ctx[b];
	if (sel && n > topk) n = topk;
	const long long lo = (long long)split * split_tokens;
	const long long hi = min(n, lo + split_tokens);
	const long long h0 = (long long)b * heads + (long long)hg * MLA_HB; // first head of the block
	if (lo >= hi) { // an empty split: the merge skips it
		if (tid < MLA_HB) {
			ml[((h0 + tid) * splits + split) * 2] = -INFINITY;
			ml[((h0 + tid) * splits + split) * 2 + 1] = 0.f;
		}
		return;
	}
	const int* table = tables + (long long)b * max_blocks;
	const int* srow = sel ? sel + (long long)b * topk : 0;
	const int ntiles = (int)((hi - lo + MLA_T - 1) / MLA_T);

	// Q: 64 rows of 72 chunks of 16 bytes, in the first group with tile 0.
	for (int c = tid; c < MLA_HB * 72; c += 512) {
		const int r = c / 72, ch = c % 72;
		cp_async16(sQ + r * MLA_LD + ch * 8, q + (h0 + r) * MLA_DK + ch * 8);
	}
	auto load_tile = [&](int tile) {
		unsigned short* dst = sK + (tile % MLA_STAGES) * MLA_T * MLA_LD;
		for (int c = tid; c < MLA_T * 72; c += 512) {
			const int r = c / 72, ch = c % 72;
			const long long j = lo + (long long)tile * MLA_T + r;
			if (j < hi) {
				const long long pos = srow ? (long long)srow[j] : j;
				const char* row = base + (long long)table[pos / tpb] * block_bytes + (pos % tpb) * stride + offset;
				cp_async16(dst + r * MLA_LD + ch * 8, row + ch * 16);
			} else { // past the end: zeros (P is 0 there, and 0 · garbage could be NaN)
				*(uint4*)(dst + r * MLA_LD + ch * 8) = make_uint4(0, 0, 0, 0);
			}
		}
	};
	if (tid < MLA_HB) {
		sM[tid] = -INFINITY;
		sL[tid] = 0.f;
	}
#pragma unroll
	for (int s = 0; s < MLA_STAGES - 1; s++) {
		if (s < ntiles) load_tile(s);
		cp_async_commit();
	}

	const int mt = warp % 4;     // heads mt*16..+15
	const int nq = warp / 4;     // S: positions nq*8..+7 of a tile; P·V: dims nq*128..+127
	const float qs = scale * 1.4426950408889634f; // scores in log2 units
	float o[16][4];
#pragma unroll
	for (int i = 0; i < 16; i++) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;

	for (int tile = 0; tile < ntiles; tile++) {
		cp_async_wait<MLA_STAGES - 2>();
		__syncthreads(); // tile's bytes have landed; every warp is done with tile-1's stage
		if (tile + MLA_STAGES - 1 < ntiles) load_tile(tile + MLA_STAGES - 1);
		cp_async_commit();
		const unsigned short* kt = sK + (tile % MLA_STAGES) * MLA_T * MLA_LD;

		// S = Q · K^T for 16 heads × 8 positions.
		float s[4] = {0.f, 0.f, 0.f, 0.f};
		const unsigned short* qa = sQ + (mt * 16 + (lane % 16)) * MLA_LD + (lane / 16) * 8;
		const unsigned short* kb = kt + (nq * 8 + (lane % 8)) * MLA_LD + (lane / 8) * 8;
#pragma unroll 6
		for (int ks = 0; ks < MLA_DK / 16; ks += 2) {
			unsigned a0[4], a1[4], bb[4];
			ldsm_x4(bb, kb + ks * 16);
			ldsm_x4(a0, qa + ks * 16);
			ldsm_x4(a1, qa + ks * 16 + 16);
			mma_bf16(s, a0, bb[0], bb[1]);
			mma_bf16(s, a1, bb[2], bb[3]);
		}
		float* sr = sS + (mt * 16 + g) * MLA_SLD + nq * 8 + 2 * t4;
		*(float2*)sr = make_float2(s[0] * qs, s[1] * qs);
		*(float2*)(sr + 8 * MLA_SLD) = make_float2(s[2] * qs, s[3] * qs);
		__syncthreads();

		// Online softmax: head tid/8, positions (tid%8)*4..+3.
		{
			const int r = tid / 8, c0 = (tid % 8) * 4;
			const int valid = (int)min((long long)MLA_T, hi - lo - (long long)tile * MLA_T);
			float v[4], mx = -INFINITY;
#pragma unroll
			for (int i = 0; i < 4; i++) {
				v[i] = c0 + i < valid ? sS[r * MLA_SLD + c0 + i] : -INFINITY;
				mx = fmaxf(mx, v[i]);
			}
			mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
			mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
			mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 4));
			const float mold = sM[r];
			const float mnew = fmaxf(mold, mx); // finite: every tile has a valid position
			unsigned pb[4];
			float sum = 0.f;
#pragma unroll
			for (int i = 0; i < 4; i++) {
				pb[i] = bf16_rne(exp2f(v[i] - mnew));
				sum += bf16_float(pb[i]);
			}
			sum += __shfl_xor_sync(0xffffffffu, sum, 1);
			sum += __shfl_xor_sync(0xffffffffu, sum, 2);
			sum += __shfl_xor_sync(0xffffffffu, sum, 4);
			*(uint2*)(sP + r * MLA_PLD + c0) = make_uint2(pb[0] | (pb[1] << 16), pb[2] | (pb[3] << 16));
			if (tid % 8 == 0) {
				const float corr = exp2f(mold - mnew);
				sL[r] = sL[r] * corr + sum;
				sM[r] = mnew;
				sC[r] = corr;
			}
		}
		__syncthreads();

		// O = O · corr + P · V for 16 heads × 128 dims.
		const float c_lo = sC[mt * 16 + g], c_hi = sC[mt * 16 + g + 8];
#pragma unroll
		for (int i = 0; i < 16; i++) {
			o[i][0] *= c_lo;
			o[i][1] *= c_lo;
			o[i][2] *= c_hi;
			o[i][3] *= c_hi;
		}
#pragma unroll
		for (int ks = 0; ks < MLA_T / 16; ks++) {
			unsigned a[4];
			ldsm_x4(a, sP + (mt * 16 + (lane % 16)) * MLA_PLD + ks * 16 + (lane / 16) * 8);
			const unsigned short* vb = kt + (ks * 16 + (lane % 8) + ((lane / 8) % 2) * 8) * MLA_LD + nq * 128 + (lane / 16) * 8;
#pragma unroll
			for (int np = 0; np < 8; np++) {
				unsigned bb[4];
				ldsm_x4_trans(bb, vb + np * 16);
				mma_bf16(o[2 * np], a, bb[0], bb[1]);
				mma_bf16(o[2 * np + 1], a, bb[2], bb[3]);
			}
		}
	}
	cp_async_wait<0>();

	float* p0 = part + ((h0 + mt * 16 + g) * splits + split) * MLA_DV + nq * 128 + 2 * t4;
	float* p1 = p0 + 8 * splits * MLA_DV;
#pragma unroll
	for (int i = 0; i < 16; i++) {
		*(float2*)(p0 + i * 8) = make_float2(o[i][0], o[i][1]);
		*(float2*)(p1 + i * 8) = make_float2(o[i][2], o[i][3]);
	}
	if (tid < MLA_HB) { // sM, sL were last written before the last tile's P·V barrier
		ml[((h0 + tid) * splits + split) * 2] = sM[tid];
		ml[((h0 + tid) * splits + split) * 2 + 1] = sL[tid];
	}
}

// kvx_mla_decode_merge: grid (heads, batch), block 128 (4 dims a thread):
// out (batch × heads × 512 float32) = the splits merged in split order,
// normalized. Empty splits (max -inf) are skipped.
extern "C" __global__ void kvx_mla_decode_merge(float* out, const float* part, const float* ml, long long heads, long long splits) {
	const long long h = (long long)blockIdx.y * heads + blockIdx.x;
	float M = -INFINITY;
	for (long long s = 0; s < splits; s++) M = fmaxf(M, ml[(h * splits + s) * 2]);
	float L = 0.f;
	float4 A = make_float4(0.f, 0.f, 0.f, 0.f);
	if (M != -INFINITY) {
		for (long long s = 0; s < splits; s++) {
			const float m = ml[(h * splits + s) * 2];
			if (m == -INFINITY) continue;
			const float w = exp2f(m - M);
			L += ml[(h * splits + s) * 2 + 1] * w;
			const float4 p = *(const float4*)(part + (h * splits + s) * MLA_DV + threadIdx.x * 4);
			A.x += p.x * w;
			A.y += p.y * w;
			A.z += p.z * w;
			A.w += p.w * w;
		}
	}
	const float r = L > 0.f ? 1.f / L : 0.f;
	*(float4*)(out + h * MLA_DV + threadIdx.x * 4) = make_float4(A.x * r, A.y * r, A.z * r, A.w * r);
}

// ---- DSA: the lightning indexer's scan and the top-k ----

#define IDX_H 64   // index heads
#define IDX_D 128  // index head dim
#define IDX_QLD 136 // shared row of q in bf16
#define IDX_TOK 1024 // positions per thread block

// kvx_dsa_index_scores: grid (ceil(max ctx / 1024), batch), block 128.
// scores[b][j] = sum over the 64 heads h of w[b][h] · ReLU(q[b][h] · k[j]) for
// j < ctx[b]; q: batch × 64 × 128 bf16, w: batch × 64 float32 (the per-head
// weights with every scale folded in), k: the paged bf16 index-key rows
// (128 values, one per position, 16-byte aligned).
//
// Each warp takes 16-position tiles: S^T (16 positions × 64 heads) = K · Q^T
// on tensor cores, K as the A operand loaded straight from the pool into
// registers. The 128 dims are taken in a permuted order (lane t of a quad
// holds dims 32t..32t+31 of its two positions, 64 contiguous bytes), the same
// for q and k, which leaves every dot product unchanged.
extern "C" __global__ void __launch_bounds__(128)
kvx_dsa_index_scores(float* scores, const unsigned short* q, const float* w, const char* base, const int* tables,
		const long long* ctx, long long block_bytes, long long offset, long long stride, long long tpb,
		long long max_blocks, long long score_stride) {
	__shared__ __align__(16) unsigned short sQ[IDX_H * IDX_QLD];
	__shared__ float sW[IDX_H];
	const int b = blockIdx.y, tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
	const int g = lane / 4, t4 = lane % 4;
	const long long n = ctx[b];
	const long long lo = (long long)blockIdx.x * IDX_TOK;
	if (lo >= n) return;
	const long long hi = min(n, lo + IDX_TOK);
	for (int c = tid; c < IDX_H * 16; c += 128) {
		const int r = c / 16, ch = c % 16;
		*(uint4*)(sQ + r * IDX_QLD + ch * 8) = *(const uint4*)(q + ((long long)b * IDX_H + r) * IDX_D + ch * 8);
	}
	if (tid < IDX_H) sW[tid] = w[(long long)b * IDX_H + tid];
	__syncthreads();
	const int* table = tables + (long long)b * max_blocks;
	float* out = scores + (long long)b * score_stride;
	for (long long t0 = lo + warp * 16; t0 < hi; t0 += 4 * 16) {
		uint4 ka[4], kb[4];
		const long long ja = t0 + g, jb = t0 + g + 8;
#pragma unroll
		for (int i = 0; i < 4; i++) ka[i] = kb[i] = make_uint4(0, 0, 0, 0);
		if (ja < hi) {
			const char* row = base + (long long)table[ja / tpb] * block_bytes + (ja % tpb) * stride + offset + t4 * 64;
#pragma unroll
			for (int i = 0; i < 4; i++) ka[i] = ((const uint4*)row)[i];
		}
		if (jb < hi) {
			const char* row = base + (long long)table[jb / tpb] * block_bytes + (jb % tpb) * stride + offset + t4 * 64;
#pragma unroll
			for (int i = 0; i < 4; i++) kb[i] = ((const uint4*)row)[i];
		}
		float sa = 0.f, sb = 0.f;
#pragma unroll
		for (int nt = 0; nt < IDX_H / 8; nt++) {
			float c[4] = {0.f, 0.f, 0.f, 0.f};
			const unsigned short* qb = sQ + (nt * 8 + g) * IDX_QLD + t4 * 32;
#pragma unroll
			for (int ks = 0; ks < 8; ks++) {
				const uint4 x = ka[ks / 2], y = kb[ks / 2];
				unsigned a[4];
				a[0] = ks % 2 ? x.z : x.x;
				a[2] = ks % 2 ? x.w : x.y;
				a[1] = ks % 2 ? y.z : y.x;
				a[3] = ks % 2 ? y.w : y.y;
				const uint2 bq = *(const uint2*)(qb + ks * 4);
				mma_bf16(c, a, bq.x, bq.y);
			}
			const float w0 = sW[nt * 8 + 2 * t4], w1 = sW[nt * 8 + 2 * t4 + 1];
			sa += w0 * fmaxf(c[0], 0.f) + w1 * fmaxf(c[1], 0.f);
			sb += w0 * fmaxf(c[2], 0.f) + w1 * fmaxf(c[3], 0.f);
		}
		sa += __shfl_xor_sync(0xffffffffu, sa, 1);
		sa += __shfl_xor_sync(0xffffffffu, sa, 2);
		sb += __shfl_xor_sync(0xffffffffu, sb, 1);
		sb += __shfl_xor_sync(0xffffffffu, sb, 2);
		if (t4 == 0) {
			if (ja < hi) out[ja] = sa;
			if (jb < hi) out[jb] = sb;
		}
	}
}

// okey maps a float to an unsigned key of the same order.
__device__ __forceinline__ unsigned okey(float f) {
	const unsigned u = __float_as_uint(f);
	return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// block_scan: the inclusive prefix sum of v over the block's 1024 threads in
// thread order; *total gets the sum of all.
__device__ unsigned block_scan(unsigned v, unsigned* sw, unsigned* total) {
	const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
#pragma unroll
	for (int o = 1; o < 32; o <<= 1) {
		const unsigned x = __shfl_up_sync(0xffffffffu, v, o);
		if (lane >= o) v += x;
	}
	if (lane == 31) sw[warp] = v;
	__syncthreads();
	if (warp == 0) {
		unsigned x = sw[lane];
#pragma unroll
		for (int o = 1; o < 32; o <<= 1) {
			const unsigned y = __shfl_up_sync(0xffffffffu, x, o);
			if (lane >= o) x += y;
		}
		sw[lane] = x;
	}
	__syncthreads();
	const unsigned r = v + (warp ? sw[warp - 1] : 0u);
	*total = sw[31];
	__syncthreads();
	return r;
}

// kvx_dsa_topk_radix: grid (batch), block 1024. sel[b][0..k-1] = the positions of
// the k largest of scores[b][0..ctx[b]-1], ties taken from the lowest
// position, written in ascending position order; all positions when ctx[b] <= k
// (the rest of the row is not written). Exact: a radix select of the k-th
// largest key (11 + 11 + 10 bits), then an ordered compaction.
extern "C" __global__ void __launch_bounds__(1024)
kvx_dsa_topk_radix(int* sel, const float* scores, const long long* ctx, long long score_stride, long long k) {
	__shared__ unsigned hist[2048];
	__shared__ unsigned sw[32];
	__shared__ unsigned sh_prefix, sh_need;
	const int b = blockIdx.x, tid = threadIdx.x;
	const long long n = ctx[b];
	const float* s = scores + (long long)b * score_stride;
	int* out = sel + (long long)b * k;
	if (n <= k) {
		for (long long j = tid; j < n; j += 1024) out[j] = (int)j;
		return;
	}
	unsigned prefix = 0, mask = 0, need = (unsigned)k, tot;
#pragma unroll 1
	for (int pass = 0; pass < 3; pass++) {
		const int shift = pass == 0 ? 21 : pass == 1 ? 10 : 0;
		const int nb = pass < 2 ? 2048 : 1024;
		for (int i = tid; i < 2048; i += 1024) hist[i] = 0;
		__syncthreads();
		for (long long j = tid; j < n; j += 1024) {
			const unsigned key = okey(s[j]);
			if ((key & mask) == prefix) atomicAdd(&hist[(key >> shift) & (nb - 1)], 1u);
		}
		__syncthreads();
		// thread i holds bins nb-1-2i and nb-2-2i: the scan runs from the top bin down
		const int top = nb - 1 - 2 * tid;
		const unsigned c0 = top >= 0 ? hist[top] : 0u, c1 = top >= 1 ? hist[top - 1] : 0u;
		const unsigned inc = block_scan(c0 + c1, sw, &tot), exc = inc - c0 - c1;
		if (exc < need && need <= inc) {
			if (need <= exc + c0) {
				sh_prefix = prefix | ((unsigned)top << shift);
				sh_need = need - exc;
			} else {
				sh_prefix = prefix | ((unsigned)(top - 1) << shift);
				sh_need = need - exc - c0;
			}
		}
		__syncthreads();
		prefix = sh_prefix;
		need = sh_need;
		mask |= (unsigned)(nb - 1) << shift;
		__syncthreads();
	}
	// prefix is the k-th largest key; take every larger key and the first
	// `need` keys equal to it, in position order.
	const long long per = (n + 1023) / 1024;
	const long long j0 = min(n, tid * per), j1 = min(n, j0 + per);
	unsigned gt = 0, eq = 0;
	for (long long j = j0; j < j1; j++) {
		const unsigned key = okey(s[j]);
		gt += key > prefix;
		eq += key == prefix;
	}
	const unsigned eq_exc = block_scan(eq, sw, &tot) - eq;
	const unsigned take = need > eq_exc ? min(eq, need - eq_exc) : 0u;
	unsigned pos = block_scan(gt + take, sw, &tot) - gt - take;
	unsigned taken = 0;
	for (long long j = j0; j < j1; j++) {
		const unsigned key = okey(s[j]);
		if (key > prefix || (key == prefix && taken++ < take)) out[pos++] = (int)j;
	}
}
