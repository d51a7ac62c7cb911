// Attention kernels on the paged pools: GQA (sliding window included), MLA
// in absorbed form and DSA (lightning indexer, top-k, sparse MLA). They
// mirror device/cpu/kernel (gqa.go, mla.go, dsa.go) operation for
// operation:
//
//   - every dot product is kernel.Dot's: four lanes, lane i%4 accumulating
//     x[i]*y[i] in ascending i, each product rounded before the add, then
//     (s0+s1)+(s2+s3);
//   - per (query, head) the softmax is expNormalize's: m = the first score
//     if it is NaN, else the largest (which of equal maxima does not
//     matter: exp(s - m) is the same for m = +0 and -0), e_j =
//     exp32g(s_j - m) (Go's float32(math.Exp(float64(s_j - m))),
//     gomath.cuh), l = Σ e_j one float add at a time in ascending logical
//     order, acc += e_j * V_j in the same order (Axpy);
//   - rows are decoded exactly (bf16, fp8 e4m3fn, float32) and encoded as
//     kernel.BF16FromFloat32 and FP8FromFloat32 do.
//
// One thread block (ATT threads) computes one (query row, head). Each
// score is computed by one thread, for the max; a context of up to keep
// positions (the caller sizes the shared memory) keeps them, a longer one
// computes them again per tile of ATT positions for the sums (the same
// value), so no per-context scratch is needed; the sum runs on thread 0 and the weighted sum on threads over
// the head dimension, both looping over the tile's positions in order.
//
// Segment descriptors (long long x4 per segment): table address (int32
// block ids), pos, rows, first row. rowSeg maps a call row to its segment.
// A row of logical position t lives at
// base + table[t/tpb]*blockBytes + offset + (t%tpb)*stride.

#define ATT 128   // threads of an attention block (one tile of positions)
#define TOPK 256  // threads of a top-k block

#define DT_BF16 0
#define DT_FP8 1
#define DT_F32 2

struct view {
	const long long* desc;
	const int* rowSeg;
	char* base;
	long long blockBytes, offset, stride, tpb;
};

// seg returns row's segment descriptor.
__device__ __forceinline__ const long long* segOf(const view& v, long long row) {
	return v.desc + 4 * (long long)v.rowSeg[row];
}

// rowAt returns the address of logical position t of the sequence whose
// table is tab.
__device__ __forceinline__ char* rowAt(const view& v, const int* tab, long long t) {
	long long b = t / v.tpb;
	return v.base + (long long)tab[b] * v.blockBytes + v.offset + (t - b * v.tpb) * v.stride;
}

__device__ __forceinline__ int dtSize(long long dt) {
	return dt == DT_BF16 ? 2 : (dt == DT_FP8 ? 1 : 4);
}

__device__ __forceinline__ float fromFP8(unsigned int c) {
	unsigned int sign = (c & 0x80u) << 24;
	unsigned int e = (c >> 3) & 0xfu, man = c & 7u;
	if (e == 0xfu && man == 7u) {
		return __uint_as_float(sign | 0x7fc00000u);
	}
	if (e == 0) {
		return __uint_as_float(sign | __float_as_uint((float)man / 512.0f));
	}
	return __uint_as_float(sign | ((e - 7u + 127u) << 23) | (man << 20));
}

// ld reads element i of a row at dtype dt.
__device__ __forceinline__ float ld(const char* row, long long i, long long dt) {
	if (dt == DT_BF16) {
		return __uint_as_float((unsigned int)((const unsigned short*)row)[i] << 16);
	}
	if (dt == DT_FP8) {
		return fromFP8((unsigned char)row[i]);
	}
	return ((const float*)row)[i];
}

__device__ __forceinline__ unsigned short toBF16(float f) {
	unsigned int b = __float_as_uint(f);
	if ((b & 0x7fffffffu) > 0x7f800000u) {
		return (unsigned short)((b >> 16) | 0x0040u);
	}
	b += 0x7fffu + ((b >> 16) & 1u);
	return (unsigned short)(b >> 16);
}

__device__ __forceinline__ unsigned char toFP8(float f) {
	unsigned int b = __float_as_uint(f);
	unsigned int sign = (b >> 24) & 0x80u;
	unsigned int a = b & 0x7fffffffu;
	if (a > 0x7f800000u) {
		return (unsigned char)(sign | 0x7fu);
	}
	if (a >= 0x43e00000u) {
		return (unsigned char)(sign | 0x7eu);
	}
	if (a < 0x3c800000u) {
		double q = rint((double)__uint_as_float(a) * 512.0);
		return (unsigned char)(sign | (unsigned int)q);
	}
	a += 0x7ffffu + ((a >> 20) & 1u);
	unsigned int e = (a >> 23) - 127u + 7u;
	return (unsigned char)(sign | ((e << 3) & 0xffu) | ((a >> 20) & 7u));
}

// st stores element i of a row at dtype dt.
__device__ __forceinline__ void st(char* row, long long i, long long dt, float x) {
	if (dt == DT_BF16) {
		((unsigned short*)row)[i] = toBF16(x);
	} else if (dt == DT_FP8) {
		((unsigned char*)row)[i] = toFP8(x);
	} else {
		((float*)row)[i] = x;
	}
}

// dotRow is kernel.Dot(q[:n], row decoded at dt). Rows aligned for it are
// read four elements per load; the arithmetic is the same.
__device__ __forceinline__ float dotRow(const float* q, const char* row, long long n, long long dt) {
	float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f;
	long long i = 0;
	unsigned long long at = (unsigned long long)row;
	if (dt == DT_BF16 && (at & 7) == 0) {
		const uint2* r8 = (const uint2*)row;
		for (; i + 4 <= n; i += 4) {
			uint2 w = r8[i / 4];
			s0 = __fadd_rn(s0, __fmul_rn(q[i], __uint_as_float(w.x << 16)));
			s1 = __fadd_rn(s1, __fmul_rn(q[i + 1], __uint_as_float(w.x & 0xffff0000u)));
			s2 = __fadd_rn(s2, __fmul_rn(q[i + 2], __uint_as_float(w.y << 16)));
			s3 = __fadd_rn(s3, __fmul_rn(q[i + 3], __uint_as_float(w.y & 0xffff0000u)));
		}
	} else if (dt == DT_F32 && (at & 15) == 0) {
		const float4* r16 = (const float4*)row;
		for (; i + 4 <= n; i += 4) {
			float4 w = r16[i / 4];
			s0 = __fadd_rn(s0, __fmul_rn(q[i], w.x));
			s1 = __fadd_rn(s1, __fmul_rn(q[i + 1], w.y));
			s2 = __fadd_rn(s2, __fmul_rn(q[i + 2], w.z));
			s3 = __fadd_rn(s3, __fmul_rn(q[i + 3], w.w));
		}
	} else if (dt == DT_FP8 && (at & 3) == 0) {
		const unsigned int* r4 = (const unsigned int*)row;
		for (; i + 4 <= n; i += 4) {
			unsigned int w = r4[i / 4];
			s0 = __fadd_rn(s0, __fmul_rn(q[i], fromFP8(w & 0xffu)));
			s1 = __fadd_rn(s1, __fmul_rn(q[i + 1], fromFP8((w >> 8) & 0xffu)));
			s2 = __fadd_rn(s2, __fmul_rn(q[i + 2], fromFP8((w >> 16) & 0xffu)));
			s3 = __fadd_rn(s3, __fmul_rn(q[i + 3], fromFP8(w >> 24)));
		}
	}
	for (; i + 4 <= n; i += 4) {
		s0 = __fadd_rn(s0, __fmul_rn(q[i], ld(row, i, dt)));
		s1 = __fadd_rn(s1, __fmul_rn(q[i + 1], ld(row, i + 1, dt)));
		s2 = __fadd_rn(s2, __fmul_rn(q[i + 2], ld(row, i + 2, dt)));
		s3 = __fadd_rn(s3, __fmul_rn(q[i + 3], ld(row, i + 3, dt)));
	}
	if (i < n) {
		s0 = __fadd_rn(s0, __fmul_rn(q[i], ld(row, i, dt)));
	}
	if (i + 1 < n) {
		s1 = __fadd_rn(s1, __fmul_rn(q[i + 1], ld(row, i + 1, dt)));
	}
	if (i + 2 < n) {
		s2 = __fadd_rn(s2, __fmul_rn(q[i + 2], ld(row, i + 2, dt)));
	}
	return __fadd_rn(__fadd_rn(s0, s1), __fadd_rn(s2, s3));
}

// dotF is kernel.Dot(x[:n], y[:n]) on float32 values.
__device__ __forceinline__ float dotF(const float* x, const float* y, long long n) {
	float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f;
	long long i = 0;
	for (; i + 4 <= n; i += 4) {
		s0 = __fadd_rn(s0, __fmul_rn(x[i], y[i]));
		s1 = __fadd_rn(s1, __fmul_rn(x[i + 1], y[i + 1]));
		s2 = __fadd_rn(s2, __fmul_rn(x[i + 2], y[i + 2]));
		s3 = __fadd_rn(s3, __fmul_rn(x[i + 3], y[i + 3]));
	}
	if (i < n) {
		s0 = __fadd_rn(s0, __fmul_rn(x[i], y[i]));
	}
	if (i + 1 < n) {
		s1 = __fadd_rn(s1, __fmul_rn(x[i + 1], y[i + 1]));
	}
	if (i + 2 < n) {
		s2 = __fadd_rn(s2, __fmul_rn(x[i + 2], y[i + 2]));
	}
	return __fadd_rn(__fadd_rn(s0, s1), __fadd_rn(s2, s3));
}

#include "gomath.cuh"
#include "pdl.cuh"
#include "fold.cuh"

// blockMax returns, on every thread of an ATT block, m of expNormalize
// from each thread's largest score (-Inf when it had none; NaN never
// enters) and whether the first score was NaN.
__device__ float blockMax(float mx, bool firstNaN) {
	__shared__ float red[ATT];
	__shared__ int nan0;
	int t = threadIdx.x;
	if (t == 0) {
		nan0 = 0;
	}
	red[t] = mx;
	__syncthreads();
	if (firstNaN) {
		nan0 = 1;
	}
	for (int w = ATT / 2; w > 0; w /= 2) {
		if (t < w && red[t + w] > red[t]) {
			red[t] = red[t + w];
		}
		__syncthreads();
	}
	float m = nan0 ? __int_as_float(0x7fc00000) : red[0];
	__syncthreads();
	return m;
}

// kvx_attn_write encodes rows of a (aw values) then b (bw values) of every
// call row, back to back at dtype dt, into the row of its position. Grid:
// one block per call row.
extern "C" __global__ void kvx_attn_write(const long long* desc, const int* rowSeg, const float* a, long long aw,
                                          const float* b, long long bw, char* base, long long blockBytes,
                                          long long offset, long long stride, long long tpb, long long dt) {
	pdl_wait();
	view v = {desc, rowSeg, base, blockBytes, offset, stride, tpb};
	long long row = blockIdx.x;
	const long long* sd = segOf(v, row);
	char* dst = rowAt(v, (const int*)sd[0], sd[1] + row - sd[3]);
	for (long long i = threadIdx.x; i < aw + bw; i += blockDim.x) {
		st(dst, i, dt, i < aw ? a[row * aw + i] : b[row * bw + i - aw]);
	}
}

// rowMem reads a row's values from memory; rowFold reads them from a
// pending split matmul's parts (fold.cuh's order: the fold launch's bits),
// the row's values starting at element base of the parts' n.
struct rowMem {
	const float* p;
	__device__ __forceinline__ float operator()(int i) const { return p[i]; }
};
struct rowFold {
	const float* P;
	long long parts, n, base;
	__device__ __forceinline__ float operator()(int i) const { return fold_at(P, parts, n, base + i); }
};

// roped is element j of a row x after kvx_rope_apply (dense.cu) with the
// row's tables c, s: the first dim elements of every head (stride apart)
// rotated in pairs, NeoX (i, i + dim/2) or interleaved (2i, 2i+1), with
// its roundings; the rest as they are.
template <class Row>
__device__ __forceinline__ float roped(Row x, int j, int stride, int dim, bool interleaved, const float* c, const float* s) {
	const int h = j / stride, e = j - h * stride, half = dim / 2;
	if (e >= 2 * half) {
		return x(j);
	}
	const int i = interleaved ? e / 2 : (e < half ? e : e - half);
	const bool first = interleaved ? (e % 2 == 0) : e < half;
	const float x0 = x(h * stride + (interleaved ? 2 * i : i)), x1 = x(h * stride + (interleaved ? 2 * i + 1 : i + half));
	return first ? __fsub_rn(__fmul_rn(x0, c[i]), __fmul_rn(x1, s[i])) : __fadd_rn(__fmul_rn(x0, s[i]), __fmul_rn(x1, c[i]));
}

// kvx_rope_write is kvx_rope_apply of every call row's q (qw values, in
// place) and k (kw values), then kvx_attn_write of the rotated k and of v
// (kw values) into the row of its position at dtype dt: the same bits as
// the three launches, in one. k itself is left as it was. cs, sn are the
// rows' tables (half = dim/2 entries a row); stride >= dim, and every head
// fits (the host checks both). Grid (call rows, blocks a row): a row's
// units (q's pairs, then the k and v values it writes) are spread over
// gridDim.y blocks, one unit a thread, so a decode step's few rows do not
// wait on one block's loads in turn.
extern "C" __global__ void kvx_rope_write(const long long* desc, const int* rowSeg, float* q, long long qw, const float* k,
                                          const float* vv, long long kw, const float* cs, const float* sn, long long stride,
                                          long long dim, long long interleaved, char* base, long long blockBytes,
                                          long long offset, long long rstride, long long tpb, long long dt) {
	pdl_wait();
	view v = {desc, rowSeg, base, blockBytes, offset, rstride, tpb};
	const long long row = blockIdx.x;
	const int half = (int)(dim / 2), st_ = (int)stride, d = (int)dim;
	const bool il = interleaved != 0;
	const float* c = cs + row * half;
	const float* s = sn + row * half;
	float* qr = q + row * qw;
	const int heads = (int)((qw + stride - 1) / stride), pairs = heads * half, kv = (int)kw;
	const long long* sd = segOf(v, row);
	char* dst = rowAt(v, (const int*)sd[0], sd[1] + row - sd[3]);
	const float* kr = k + row * kw;
	const float* vr = vv + row * kw;
	for (int u = blockIdx.y * blockDim.x + threadIdx.x; u < pairs + 2 * kv; u += gridDim.y * blockDim.x) {
		if (u < pairs) {
			// q in place: a thread rotates a whole pair, as kvx_rope_apply does.
			const int h = u / half, i = u - h * half;
			float* x = qr + h * st_;
			const int a = il ? 2 * i : i, b = il ? 2 * i + 1 : i + half;
			const float x0 = x[a], x1 = x[b];
			x[a] = __fsub_rn(__fmul_rn(x0, c[i]), __fmul_rn(x1, s[i]));
			x[b] = __fadd_rn(__fmul_rn(x0, s[i]), __fmul_rn(x1, c[i]));
		} else {
			const int i = u - pairs;
			st(dst, i, dt, i < kv ? roped(rowMem{kr}, i, st_, d, il, c, s) : vr[i - kv]);
		}
	}
}

// kvx_rope_write_fold is kvx_rope_write with q, k and v the outputs of one
// pending split matmul (P: parts × n float32, n = rows × m, the launch's m
// columns; q, k and v at columns qc, kc and vc of a row), read from the
// parts in the fold's order: q is written folded and rotated (every value:
// the columns past the rotary dims as the fold leaves them), the rotated k
// and v go to the row of its position at dtype dt. The bits of the fold
// launch and kvx_rope_write, without the fold's launch and its write and
// read of q, k and v. k and v themselves are not written (they stay
// pending). Grid (call rows, blocks a row), one value a thread.
extern "C" __global__ void kvx_rope_write_fold(const long long* desc, const int* rowSeg, float* q, long long qw,
                                               const float* P, long long parts, long long m, long long qc, long long kc,
                                               long long vc, long long kw, const float* cs, const float* sn,
                                               long long stride, long long dim, long long interleaved, char* base,
                                               long long blockBytes, long long offset, long long rstride, long long tpb,
                                               long long dt) {
	pdl_wait();
	view v = {desc, rowSeg, base, blockBytes, offset, rstride, tpb};
	const long long row = blockIdx.x, n = (long long)gridDim.x * m;
	const int st_ = (int)stride, d = (int)dim, kv = (int)kw, w = (int)qw;
	const bool il = interleaved != 0;
	const float* c = cs + row * (dim / 2);
	const float* s = sn + row * (dim / 2);
	const rowFold qr = {P, parts, n, row * m + qc}, kr = {P, parts, n, row * m + kc}, vr = {P, parts, n, row * m + vc};
	const long long* sd = segOf(v, row);
	char* dst = rowAt(v, (const int*)sd[0], sd[1] + row - sd[3]);
	for (int u = blockIdx.y * blockDim.x + threadIdx.x; u < w + 2 * kv; u += gridDim.y * blockDim.x) {
		if (u < w) {
			q[row * qw + u] = roped(qr, u, st_, d, il, c, s);
		} else {
			const int i = u - w;
			st(dst, i, dt, i < kv ? roped(kr, i, st_, d, il, c, s) : vr(i - kv));
		}
	}
}

// kvx_dsa_index_write stores every call row's indexer key (d values) as
// kernel.QuantizeIndexKey does: fp8 codes of k/scale, then the float32
// scale = max(max|k|, 1e-4)/448. Grid: one block of ATT threads per row.
extern "C" __global__ void kvx_dsa_index_write(const long long* desc, const int* rowSeg, const float* k, long long d,
                                               char* base, long long blockBytes, long long offset, long long stride,
                                               long long tpb) {
	__shared__ float red[ATT];
	view v = {desc, rowSeg, base, blockBytes, offset, stride, tpb};
	long long row = blockIdx.x;
	int t = threadIdx.x;
	const long long* sd = segOf(v, row);
	unsigned char* dst = (unsigned char*)rowAt(v, (const int*)sd[0], sd[1] + row - sd[3]);
	const float* kr = k + row * d;
	float amax = 0.0f;
	for (long long i = t; i < d; i += ATT) {
		float x = fabsf(kr[i]);
		if (x > amax) {
			amax = x;
		}
	}
	red[t] = amax;
	__syncthreads();
	for (int w = ATT / 2; w > 0; w /= 2) {
		if (t < w && red[t + w] > red[t]) {
			red[t] = red[t + w];
		}
		__syncthreads();
	}
	float scale = __fdiv_rn(fmaxf(red[0], 1e-4f), 448.0f);
	for (long long i = t; i < d; i += ATT) {
		dst[i] = toFP8(__fdiv_rn(kr[i], scale));
	}
	if (t < 4) {
		dst[d + t] = (unsigned char)(__float_as_uint(scale) >> (8 * t));
	}
}

// kvx_gqa_attend is GQA's attention of one (call row, head) per block
// (grid: rows × heads, ATT threads). Dynamic shared memory: 2*hd + ATT +
// keepCap floats (keepCap: the longest context whose scores are kept).
extern "C" __global__ void kvx_gqa_attend(const long long* desc, const int* rowSeg, const float* q, float* out,
                                          char* base, long long blockBytes, long long offset, long long stride,
                                          long long tpb, long long heads, long long kvHeads, long long hd,
                                          long long window, float scale, long long dt, long long keepCap) {
	extern __shared__ float sh[];
	__shared__ const char* rows[ATT];
	__shared__ float lsum;
	float* qs = sh;
	float* acc = sh + hd;
	float* e = sh + 2 * hd;
	float* kept = e + ATT;
	view v = {desc, rowSeg, base, blockBytes, offset, stride, tpb};
	long long row = blockIdx.x;
	long long h = blockIdx.y;
	int t = threadIdx.x;
	const long long* sd = segOf(v, row);
	const int* tab = (const int*)sd[0];
	long long p = sd[1] + row - sd[3];
	long long lo = (window > 0 && p - window + 1 > 0) ? p - window + 1 : 0;
	long long kh = h / (heads / kvHeads);
	int es = dtSize(dt);
	long long koff = kh * hd * es, voff = (kvHeads + kh) * hd * es;
	const float* qr = q + (row * heads + h) * hd;
	for (long long d = t; d < hd; d += ATT) {
		qs[d] = qr[d];
		acc[d] = 0.0f;
	}
	__syncthreads();

	bool keep = p + 1 - lo <= keepCap;
	float mx = __int_as_float(0xff800000);
	bool nan0 = false;
	for (long long j = lo + t; j <= p; j += ATT) {
		float s = __fmul_rn(dotRow(qs, rowAt(v, tab, j) + koff, hd, dt), scale);
		if (keep) {
			kept[j - lo] = s; // read back by this same thread
		}
		if (j == lo && s != s) {
			nan0 = true;
		}
		if (s > mx) {
			mx = s;
		}
	}
	float m = blockMax(mx, nan0);

	float l = 0.0f;
	for (long long j0 = lo; j0 <= p; j0 += ATT) {
		int cnt = (int)min((long long)ATT, p + 1 - j0);
		if (t < cnt) {
			const char* r = rowAt(v, tab, j0 + t);
			rows[t] = r;
			float s = keep ? kept[j0 + t - lo] : __fmul_rn(dotRow(qs, r + koff, hd, dt), scale);
			e[t] = exp32g(__fsub_rn(s, m));
		}
		__syncthreads();
		if (t == 0) {
			for (int k = 0; k < cnt; k++) {
				l = __fadd_rn(l, e[k]);
			}
		}
		for (long long d = t; d < hd; d += ATT) {
			float a = acc[d];
			for (int k = 0; k < cnt; k++) {
				a = __fadd_rn(a, __fmul_rn(e[k], ld(rows[k] + voff, d, dt)));
			}
			acc[d] = a;
		}
		__syncthreads();
	}
	if (t == 0) {
		lsum = l;
	}
	__syncthreads();
	float* o = out + (row * heads + h) * hd;
	for (long long d = t; d < hd; d += ATT) {
		o[d] = __fdiv_rn(acc[d], lsum);
	}
}

// kvx_mla_attend is MLA's absorbed attention of one (call row, head) per
// block (grid: rows × heads, ATT threads): dense over 0..p, or over the
// positions sel lists (topk per row, ascending; min(p+1, topk) of them)
// when sel is not null. Dynamic shared memory: n + 2*r + pe + ATT +
// keepCap floats.
extern "C" __global__ void kvx_mla_attend(const long long* desc, const int* rowSeg, const float* qnope,
                                          const float* qpe, const float* uk, const float* uv, float* out,
                                          char* base, long long blockBytes, long long offset, long long stride,
                                          long long tpb, long long heads, long long r, long long n, long long pe,
                                          long long vd, float scale, long long dt, const int* sel, long long topk,
                                          long long keepCap) {
	extern __shared__ float sh[];
	__shared__ const char* rows[ATT];
	__shared__ float lsum;
	float* qn = sh;
	float* qlat = sh + n;
	float* olat = qlat + r;
	float* qp = olat + r;
	float* e = qp + pe;
	float* kept = e + ATT;
	view v = {desc, rowSeg, base, blockBytes, offset, stride, tpb};
	long long row = blockIdx.x;
	long long h = blockIdx.y;
	int t = threadIdx.x;
	const long long* sd = segOf(v, row);
	const int* tab = (const int*)sd[0];
	long long p = sd[1] + row - sd[3];
	long long ctx = p + 1;
	const int* pick = 0;
	if (sel != 0) {
		pick = sel + row * topk;
		ctx = min(ctx, topk);
	}
	int es = dtSize(dt);
	long long peoff = r * es;
	for (long long d = t; d < n; d += ATT) {
		qn[d] = qnope[(row * heads + h) * n + d];
	}
	for (long long d = t; d < pe; d += ATT) {
		qp[d] = qpe[(row * heads + h) * pe + d];
	}
	__syncthreads();
	const float* ukh = uk + h * n * r;
	for (long long c = t; c < r; c += ATT) {
		float a = 0.0f;
		for (long long d = 0; d < n; d++) {
			a = __fadd_rn(a, __fmul_rn(qn[d], ukh[d * r + c]));
		}
		qlat[c] = a;
		olat[c] = 0.0f;
	}
	__syncthreads();

	bool keep = ctx <= keepCap;
	float mx = __int_as_float(0xff800000);
	bool nan0 = false;
	for (long long k = t; k < ctx; k += ATT) {
		const char* raw = rowAt(v, tab, pick ? (long long)pick[k] : k);
		float s = __fmul_rn(__fadd_rn(dotRow(qlat, raw, r, dt), dotRow(qp, raw + peoff, pe, dt)), scale);
		if (keep) {
			kept[k] = s; // read back by this same thread
		}
		if (k == 0 && s != s) {
			nan0 = true;
		}
		if (s > mx) {
			mx = s;
		}
	}
	float m = blockMax(mx, nan0);

	float l = 0.0f;
	for (long long k0 = 0; k0 < ctx; k0 += ATT) {
		int cnt = (int)min((long long)ATT, ctx - k0);
		if (t < cnt) {
			long long k = k0 + t;
			const char* raw = rowAt(v, tab, pick ? (long long)pick[k] : k);
			rows[t] = raw;
			float s = keep ? kept[k] : __fmul_rn(__fadd_rn(dotRow(qlat, raw, r, dt), dotRow(qp, raw + peoff, pe, dt)), scale);
			e[t] = exp32g(__fsub_rn(s, m));
		}
		__syncthreads();
		if (t == 0) {
			for (int k = 0; k < cnt; k++) {
				l = __fadd_rn(l, e[k]);
			}
		}
		for (long long c = t; c < r; c += ATT) {
			float a = olat[c];
			for (int k = 0; k < cnt; k++) {
				a = __fadd_rn(a, __fmul_rn(e[k], ld(rows[k], c, dt)));
			}
			olat[c] = a;
		}
		__syncthreads();
	}
	if (t == 0) {
		lsum = l;
	}
	__syncthreads();
	for (long long c = t; c < r; c += ATT) {
		olat[c] = __fdiv_rn(olat[c], lsum);
	}
	__syncthreads();
	const float* uvh = uv + h * vd * r;
	float* o = out + (row * heads + h) * vd;
	for (long long c = t; c < vd; c += ATT) {
		o[c] = dotF(uvh + c * r, olat, r);
	}
}

__device__ __forceinline__ float relu(float x) { return x < 0.0f ? 0.0f : x; }

// kvx_dsa_index_score writes the indexer score of every position s <= p of
// every call row whose p+1 > topk, at scores[offs[row] + s] (offs -1: the
// row selects all its positions, nothing to score). Quantized layout
// (plain 0): Σ_h w_h*ReLU(Dot(q_h, codes_s)), times scale_s; plain: Σ_h
// w_h*ReLU(Dot(q_h, k_s)*sc), keys at dtype kdt. Grid: rows × position
// blocks (a grid-stride loop over positions), ATT threads.
extern "C" __global__ void kvx_dsa_index_score(const long long* desc, const int* rowSeg, const float* q, const float* w,
                                               float* scores, const long long* offs, char* base, long long blockBytes,
                                               long long offset, long long stride, long long tpb, long long heads,
                                               long long d, long long plain, long long kdt, float sc) {
	view v = {desc, rowSeg, base, blockBytes, offset, stride, tpb};
	long long row = blockIdx.x;
	long long off = offs[row];
	if (off < 0) {
		return;
	}
	const long long* sd = segOf(v, row);
	const int* tab = (const int*)sd[0];
	long long p = sd[1] + row - sd[3];
	const float* qr = q + row * heads * d;
	const float* wr = w + row * heads;
	for (long long s = (long long)blockIdx.y * ATT + threadIdx.x; s <= p; s += (long long)gridDim.y * ATT) {
		const char* raw = rowAt(v, tab, s);
		float acc = 0.0f;
		if (plain) {
			for (long long hh = 0; hh < heads; hh++) {
				float x = __fmul_rn(dotRow(qr + hh * d, raw, d, kdt), sc);
				acc = __fadd_rn(acc, __fmul_rn(wr[hh], relu(x)));
			}
		} else {
			for (long long hh = 0; hh < heads; hh++) {
				float x = dotRow(qr + hh * d, raw, d, DT_FP8);
				acc = __fadd_rn(acc, __fmul_rn(wr[hh], relu(x)));
			}
			const unsigned char* sb = (const unsigned char*)raw + d;
			unsigned int bits = (unsigned int)sb[0] | ((unsigned int)sb[1] << 8) | ((unsigned int)sb[2] << 16) |
			                    ((unsigned int)sb[3] << 24);
			acc = __fmul_rn(acc, __uint_as_float(bits));
		}
		scores[off + s] = acc;
	}
}

// rankKey maps a score to a key whose unsigned order is kernel.TopK's
// ranking (ties aside): NaN lowest, -0 equal to +0.
__device__ __forceinline__ unsigned int rankKey(float s) {
	if (s != s) {
		return 0u;
	}
	unsigned int u = __float_as_uint(s);
	if ((u & 0x7fffffffu) == 0) {
		u = 0; // -0 ties with +0
	}
	return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// blockScan returns the exclusive prefix sum of x over a TOPK block and
// sets *total to the sum.
__device__ int blockScan(int x, int* total) {
	__shared__ int warpSum[TOPK / 32];
	int t = threadIdx.x, lane = t & 31, wid = t >> 5;
	int inc = x;
	for (int o = 1; o < 32; o *= 2) {
		int y = __shfl_up_sync(0xffffffffu, inc, o);
		if (lane >= o) {
			inc += y;
		}
	}
	if (lane == 31) {
		warpSum[wid] = inc;
	}
	__syncthreads();
	int before = 0, all = 0;
	for (int i = 0; i < TOPK / 32; i++) {
		if (i < wid) {
			before += warpSum[i];
		}
		all += warpSum[i];
	}
	__syncthreads();
	*total = all;
	return before + inc - x;
}

// kvx_dsa_topk writes every call row's selected positions, ascending, at
// sel[row*topk]: all of 0..p when p+1 <= topk, else kernel.TopK's choice
// from the row's scores (higher score first, NaN below every number, then
// the lower position), found by a radix select of the topk-th key. Grid:
// one block of TOPK threads per row.
extern "C" __global__ void kvx_dsa_topk(const long long* desc, const int* rowSeg, const float* scores,
                                        const long long* offs, int* sel, long long topk) {
	__shared__ int hist[256];
	__shared__ unsigned int prefixS;
	__shared__ long long needS;
	long long row = blockIdx.x;
	int t = threadIdx.x;
	const long long* sd = desc + 4 * (long long)rowSeg[row];
	long long p = sd[1] + row - sd[3];
	int* out = sel + row * topk;
	long long off = offs[row];
	if (off < 0) {
		for (long long j = t; j <= p; j += TOPK) {
			out[j] = (int)j;
		}
		return;
	}
	const float* s = scores + off;
	long long n = p + 1;
	unsigned int prefix = 0, mask = 0;
	long long need = topk; // rank, among the keys matching prefix, of the topk-th key
	for (int shift = 24; shift >= 0; shift -= 8) {
		hist[t] = 0; // TOPK == 256 bins
		__syncthreads();
		for (long long j = t; j < n; j += TOPK) {
			unsigned int k = rankKey(s[j]);
			if ((k & mask) == prefix) {
				atomicAdd(&hist[(k >> shift) & 255u], 1);
			}
		}
		__syncthreads();
		if (t == 0) {
			long long cum = 0;
			for (int b = 255; b >= 0; b--) {
				if (cum + hist[b] >= need) {
					prefixS = prefix | ((unsigned int)b << shift);
					needS = need - cum;
					break;
				}
				cum += hist[b];
			}
		}
		__syncthreads();
		prefix = prefixS;
		need = needS;
		mask |= 255u << shift;
		__syncthreads();
	}
	// prefix is the topk-th key; take every larger key and the need lowest
	// positions of that key, ascending.
	long long eqSeen = 0, base = 0;
	for (long long c = 0; c < n; c += TOPK) {
		long long j = c + t;
		unsigned int k = j < n ? rankKey(s[j]) : 0u;
		int gt = j < n && k > prefix;
		int eq = j < n && k == prefix;
		int eqAll, selAll;
		int eqRank = blockScan(eq, &eqAll);
		int take = gt || (eq && eqSeen + eqRank < need);
		int at = blockScan(take, &selAll);
		if (take) {
			out[base + at] = (int)j;
		}
		eqSeen += eqAll;
		base += selAll;
	}
}
