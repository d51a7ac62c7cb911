// Paged GQA decode attention for long contexts (flash-decoding): one query
// token per sequence, bf16 K/V rows in the paged pool (kernel.GQA's row
// format: K[kv_heads][128] then V[kv_heads][128]), head dim 128.
//
// The context is cut into splits of a fixed number of logical positions;
// each thread block runs one (split, kv head, sequence) with 8 token streams
// (4 warps, two 16-lane halves each, in lockstep; every lane holds 8 of the
// 128 dimensions, one 16-byte load per row) and an online softmax per query
// head of the group, then merges its streams in stream order. A second
// kernel merges the splits in split order. Every partition is by logical
// position, so the result does not depend on block placement or on the
// other sequences of the batch; it is not the exact kernel (the cpu's
// ascending sums): its sums are reassociated and it uses exp2f, so it
// agrees with the exact kernel to float32 rounding, not bit for bit.

#define D 128
#define STREAMS 8
#define ROWS 4 // rows in flight per half-warp (each 16 bytes of K and of V per lane)

__device__ __forceinline__ float bf16lo(unsigned int w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float bf16hi(unsigned int w) { return __uint_as_float(w & 0xffff0000u); }

__device__ __forceinline__ void unpack8(uint4 u, float* f) {
	f[0] = bf16lo(u.x); f[1] = bf16hi(u.x);
	f[2] = bf16lo(u.y); f[3] = bf16hi(u.y);
	f[4] = bf16lo(u.z); f[5] = bf16hi(u.z);
	f[6] = bf16lo(u.w); f[7] = bf16hi(u.w);
}

// decode_split: grid (splits, kv_heads, batch), block 128, G query heads per
// kv head. part: batch × heads × splits × 128 unnormalized outputs; ml:
// batch × heads × splits × 2 (running max in log2 units, sum). q: batch ×
// heads × 128. tables: batch × max_blocks int32; ctx: batch context lengths
// (positions 0..ctx-1 are read; the new token's K/V are already written).
template <int G>
__device__ void decode_split(float* part, float* ml, const float* q, const char* base,
		const int* tables, const long long* ctx, long long block_bytes, long long offset, long long stride,
		long long tpb, long long max_blocks, long long heads, long long kv_heads, long long split_tokens,
		long long splits, float scale) {
	const int split = blockIdx.x, kvh = blockIdx.y, b = blockIdx.z;
	const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
	const int half = lane / 16, l16 = lane % 16;
	const int stream = warp * 2 + half;
	const long long n = ctx[b];
	const long long lo = (long long)split * split_tokens;
	const long long hi = min(n, lo + split_tokens);
	const int* table = tables + (long long)b * max_blocks;
	const float qs = scale * 1.4426950408889634f; // log2(e): scores in log2 units

	float qr[G][8], acc[G][8], m[G], l[G];
#pragma unroll
	for (int g = 0; g < G; g++) {
		m[g] = -INFINITY;
		l[g] = 0.f;
#pragma unroll
		for (int i = 0; i < 8; i++) {
			acc[g][i] = 0.f;
			qr[g][i] = q[((long long)b * heads + kvh * G + g) * D + l16 * 8 + i] * qs;
		}
	}
	const long long koff = offset + (long long)kvh * D * 2 + l16 * 16;
	const long long voff = koff + kv_heads * D * 2;
	// The loop runs the same trips on both halves of a warp (the shuffles
	// need every lane): a warp takes positions w0, w0+1 (its halves),
	// w0+STREAMS, w0+STREAMS+1, ... ROWS rows in flight per half; a lane
	// past the split's end computes with a zero row and keeps nothing.
	const uint4 zero = make_uint4(0, 0, 0, 0);
	for (long long w0 = lo + warp * 2; w0 < hi; w0 += ROWS * STREAMS) {
		uint4 ku[ROWS], vu[ROWS];
		bool ok[ROWS];
#pragma unroll
		for (int u = 0; u < ROWS; u++) {
			long long t = w0 + half + u * STREAMS;
			ok[u] = t < hi;
			ku[u] = zero;
			vu[u] = zero;
			if (ok[u]) {
				const char* row = base + (long long)table[t / tpb] * block_bytes + (t % tpb) * stride;
				ku[u] = *(const uint4*)(row + koff);
				vu[u] = *(const uint4*)(row + voff);
			}
		}
#pragma unroll
		for (int u = 0; u < ROWS; u++) {
			float kf[8], vf[8];
			unpack8(ku[u], kf);
			unpack8(vu[u], vf);
#pragma unroll
			for (int g = 0; g < G; g++) {
				float s = 0.f;
#pragma unroll
				for (int i = 0; i < 8; i++) s = __fmaf_rn(qr[g][i], kf[i], s);
				s += __shfl_xor_sync(0xffffffffu, s, 8);
				s += __shfl_xor_sync(0xffffffffu, s, 4);
				s += __shfl_xor_sync(0xffffffffu, s, 2);
				s += __shfl_xor_sync(0xffffffffu, s, 1);
				if (!ok[u]) continue;
				float mn = fmaxf(m[g], s);
				float corr = exp2f(m[g] - mn);
				float p = exp2f(s - mn);
				l[g] = __fmaf_rn(l[g], corr, p);
#pragma unroll
				for (int i = 0; i < 8; i++) acc[g][i] = __fmaf_rn(p, vf[i], acc[g][i] * corr);
				m[g] = mn;
			}
		}
	}
	__shared__ float sm[STREAMS][G], sl[STREAMS][G];
	__shared__ float sacc[STREAMS][G][D];
#pragma unroll
	for (int g = 0; g < G; g++) {
		if (l16 == 0) {
			sm[stream][g] = m[g];
			sl[stream][g] = l[g];
		}
#pragma unroll
		for (int i = 0; i < 8; i++) sacc[stream][g][l16 * 8 + i] = acc[g][i];
	}
	__syncthreads();
	for (int e = threadIdx.x; e < G * D; e += blockDim.x) {
		const int g = e / D, d = e % D;
		float M = -INFINITY;
		for (int s = 0; s < STREAMS; s++) M = fmaxf(M, sm[s][g]);
		float L = 0.f, A = 0.f;
		if (M != -INFINITY) {
			for (int s = 0; s < STREAMS; s++) {
				float w = exp2f(sm[s][g] - M);
				L += sl[s][g] * w;
				A += sacc[s][g][d] * w;
			}
		}
		const long long h = (long long)b * heads + kvh * G + g;
		part[(h * splits + split) * D + d] = A;
		if (d == 0) {
			ml[(h * splits + split) * 2] = M;
			ml[(h * splits + split) * 2 + 1] = L;
		}
	}
}

#define DECODE_SPLIT(G) \
	extern "C" __global__ void __launch_bounds__(128) kvx_decode_gqa_split_g##G(float* part, float* ml, const float* q, \
			const char* base, const int* tables, const long long* ctx, long long block_bytes, long long offset, \
			long long stride, long long tpb, long long max_blocks, long long heads, long long kv_heads, \
			long long split_tokens, long long splits, float scale) { \
		decode_split<G>(part, ml, q, base, tables, ctx, block_bytes, offset, stride, tpb, max_blocks, heads, kv_heads, \
			split_tokens, splits, scale); \
	}
DECODE_SPLIT(1)
DECODE_SPLIT(2)
DECODE_SPLIT(4)
DECODE_SPLIT(8)

// kvx_decode_gqa_merge: grid (heads, batch), block 128: out = the splits'
// outputs merged in split order, normalized.
extern "C" __global__ void kvx_decode_gqa_merge(float* out, const float* part, const float* ml, long long heads, long long splits) {
	const long long h = (long long)blockIdx.y * heads + blockIdx.x;
	const int d = threadIdx.x;
	float M = -INFINITY;
	for (long long s = 0; s < splits; s++) M = fmaxf(M, ml[(h * splits + s) * 2]);
	float L = 0.f, A = 0.f;
	if (M != -INFINITY) {
		for (long long s = 0; s < splits; s++) {
			float w = exp2f(ml[(h * splits + s) * 2] - M);
			L += ml[(h * splits + s) * 2 + 1] * w;
			A += part[(h * splits + s) * D + d] * w;
		}
	}
	out[h * D + d] = L > 0.f ? A / L : 0.f;
}

// kvx_fill_bf16: fills n bf16 values at p with a hash of their index and
// seed, uniform in [-1, 1): benchmark data without a host upload.
extern "C" __global__ void kvx_fill_bf16(unsigned short* p, long long n, long long seed) {
	for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
		unsigned long long x = (unsigned long long)i * 0x9E3779B97F4A7C15ull + (unsigned long long)seed;
		x ^= x >> 31;
		x *= 0xBF58476D1CE4E5B9ull;
		x ^= x >> 29;
		float f = (float)(x >> 40) / 8388608.0f - 1.0f;
		p[i] = (unsigned short)(__float_as_uint(f) >> 16);
	}
}
