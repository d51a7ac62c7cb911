// Row-wise ops: the dense half of the model's arithmetic (hf.RowOps). Every
// kernel mirrors the cpu reference kernel it replaces (device/cpu/kernel)
// operation for operation, with explicit round-to-nearest intrinsics and
// compiled with -fmad=false: the four-lane Dot (lane = k % 4, ascending k,
// (s0+s1)+(s2+s3)), Go's math.Exp as amd64 computes it (go_exp), Go's
// math.Sincos (go_sincos), sequential float64 sums where the cpu has them.
// Reductions whose order matters run in one thread in the cpu's order; only
// order-free work (products, exps, copies, max with index ties) is spread.

#include "gomath.cuh"
#include "pdl.cuh"


// ---- copies and element-wise ops (grid-stride over n elements) ----

extern "C" __global__ void kvx_fill(float* p, ll n, float v) {
	for (ll i = (ll)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (ll)gridDim.x * blockDim.x) {
		p[i] = v;
	}
}

// kvx_gather_rows sets row i of out (cols wide) to row idx[i] of src.
extern "C" __global__ void kvx_gather_rows(float* out, const float* src, const int* idx, ll rows, ll cols) {
	pdl_wait();
	for (ll r = blockIdx.x; r < rows; r += gridDim.x) {
		const float* s = src + (ll)idx[r] * cols;
		float* d = out + r * cols;
		for (ll i = threadIdx.x; i < cols; i += blockDim.x) {
			d[i] = s[i];
		}
	}
}

// kvx_copy2d copies rows × groups runs of w values: run (r, g) from
// src + r*srs + g*sgs + soff to dst + r*drs + g*dgs + doff.
extern "C" __global__ void kvx_copy2d(float* dst, ll drs, ll dgs, ll doff, const float* src, ll srs, ll sgs, ll soff,
				      ll rows, ll groups, ll w) {
	pdl_wait();
	ll per = groups * w, n = rows * per;
	for (ll e = (ll)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += (ll)gridDim.x * blockDim.x) {
		ll r = e / per, rem = e - r * per, g = rem / w, j = rem - g * w;
		dst[r * drs + g * dgs + doff + j] = src[r * srs + g * sgs + soff + j];
	}
}

extern "C" __global__ void kvx_add(float* dst, const float* src, ll n) {
	pdl_wait();
	for (ll i = (ll)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (ll)gridDim.x * blockDim.x) {
		dst[i] = __fadd_rn(dst[i], src[i]);
	}
}

extern "C" __global__ void kvx_scale(float* x, ll n, float s) {
	pdl_wait();
	for (ll i = (ll)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (ll)gridDim.x * blockDim.x) {
		x[i] = __fmul_rn(x[i], s);
	}
}

// kvx_add_bias sets x[r][i] += b[i].
extern "C" __global__ void kvx_add_bias(float* x, const float* b, ll n, ll cols) {
	pdl_wait();
	for (ll i = (ll)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (ll)gridDim.x * blockDim.x) {
		x[i] = __fadd_rn(x[i], b[i % cols]);
	}
}

// kvx_swiglu is kernel.SiLU(g) * u: g / (1 + exp32(-g)), times u.
extern "C" __global__ void kvx_swiglu(float* out, const float* g, const float* u, ll n, ll fma) {
	pdl_wait();
	for (ll i = (ll)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (ll)gridDim.x * blockDim.x) {
		float v = g[i];
		float s = __fdiv_rn(v, __fadd_rn(1.0f, exp32(-v, fma)));
		out[i] = __fmul_rn(s, u[i]);
	}
}

// kvx_relu2 is Go's r := max(v, 0); r * r (NaN stays NaN, -0 becomes +0).
extern "C" __global__ void kvx_relu2(float* out, const float* x, ll n) {
	pdl_wait();
	for (ll i = (ll)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (ll)gridDim.x * blockDim.x) {
		float v = x[i];
		float r = (v != v) ? v : (v > 0.0f ? v : 0.0f);
		out[i] = __fmul_rn(r, r);
	}
}

// kvx_axpy_rows adds, for i < nrows, wt[i] * row i of y to row rows[i] of acc
// (kernel.Axpy: acc += float32(w * y)).
extern "C" __global__ void kvx_axpy_rows(float* acc, const float* y, const int* rows, const float* wt, ll nrows, ll cols) {
	for (ll i = blockIdx.x; i < nrows; i += gridDim.x) {
		float a = wt[i];
		float* d = acc + (ll)rows[i] * cols;
		const float* s = y + i * cols;
		for (ll j = threadIdx.x; j < cols; j += blockDim.x) {
			d[j] = __fadd_rn(d[j], __fmul_rn(a, s[j]));
		}
	}
}

// ---- norms: one warp per row, 4 rows per 128-thread block ----

// kvx_rmsnorm is kernel.RMSNorm of every cols-wide row: inv = 1/sqrt(Dot(x,
// x)/cols + eps) (the sqrt and division in float64), out = float32(x*inv)*w.
extern "C" __global__ void kvx_rmsnorm(float* out, const float* x, const float* w, ll rows, ll cols, float eps) {
	__shared__ float sh[4][256];
	int wp = threadIdx.x >> 5, ln = threadIdx.x & 31;
	ll r = (ll)blockIdx.x * 4 + wp;
	if (r >= rows) {
		return;
	}
	const float* xr = x + r * cols;
	float s = 0.0f; // lanes 0..3: partial sum s_lane
	for (ll base = 0; base < cols; base += 256) {
		for (int u = 0; u < 8; u++) {
			ll i = base + u * 32 + ln;
			float v = i < cols ? xr[i] : 0.0f;
			sh[wp][u * 32 + ln] = __fmul_rn(v, v);
		}
		__syncwarp();
		if (ln < 4) {
			ll lim = cols - base < 256 ? cols - base : 256;
			for (int i = ln; i < lim; i += 4) {
				s = __fadd_rn(s, sh[wp][i]);
			}
		}
		__syncwarp();
	}
	float s0 = __shfl_sync(0xffffffffu, s, 0), s1 = __shfl_sync(0xffffffffu, s, 1);
	float s2 = __shfl_sync(0xffffffffu, s, 2), s3 = __shfl_sync(0xffffffffu, s, 3);
	float dot = __fadd_rn(__fadd_rn(s0, s1), __fadd_rn(s2, s3));
	float ms = __fdiv_rn(dot, __ll2float_rn(cols));
	float inv = __double2float_rn(__ddiv_rn(1.0, __dsqrt_rn((double)__fadd_rn(ms, eps))));
	float* o = out + r * cols;
	for (ll i = ln; i < cols; i += 32) {
		o[i] = __fmul_rn(__fmul_rn(xr[i], inv), w[i]);
	}
}

// kvx_layernorm is kernel.LayerNorm of every row: mean and variance summed
// in float64 in ascending order (lane 0), the normalization in float32.
// b may be 0 (no biases).
extern "C" __global__ void kvx_layernorm(float* out, const float* x, const float* w, const float* b, ll rows, ll cols,
					 float eps) {
	__shared__ double sh[4][32];
	int wp = threadIdx.x >> 5, ln = threadIdx.x & 31;
	ll r = (ll)blockIdx.x * 4 + wp;
	if (r >= rows) {
		return;
	}
	const float* xr = x + r * cols;
	double s = 0.0;
	for (ll base = 0; base < cols; base += 32) {
		ll i = base + ln;
		sh[wp][ln] = i < cols ? (double)xr[i] : 0.0;
		__syncwarp();
		if (ln == 0) {
			ll lim = cols - base < 32 ? cols - base : 32;
			for (int u = 0; u < lim; u++) {
				s = __dadd_rn(s, sh[wp][u]);
			}
		}
		__syncwarp();
	}
	s = __shfl_sync(0xffffffffu, s, 0);
	double mean = __ddiv_rn(s, (double)cols);
	double q = 0.0;
	for (ll base = 0; base < cols; base += 32) {
		ll i = base + ln;
		double d = i < cols ? __dsub_rn((double)xr[i], mean) : 0.0;
		sh[wp][ln] = __dmul_rn(d, d);
		__syncwarp();
		if (ln == 0) {
			ll lim = cols - base < 32 ? cols - base : 32;
			for (int u = 0; u < lim; u++) {
				q = __dadd_rn(q, sh[wp][u]);
			}
		}
		__syncwarp();
	}
	q = __shfl_sync(0xffffffffu, q, 0);
	float rstd = __double2float_rn(__ddiv_rn(1.0, __dsqrt_rn(__dadd_rn(__ddiv_rn(q, (double)cols), (double)eps))));
	float m = __double2float_rn(mean);
	float* o = out + r * cols;
	for (ll i = ln; i < cols; i += 32) {
		float y = __fmul_rn(__fmul_rn(__fsub_rn(xr[i], m), rstd), w[i]);
		if (b) {
			y = __fadd_rn(y, b[i]);
		}
		o[i] = y;
	}
}

// ---- RoPE ----

// kvx_rope_table sets cs/sn[r*half+i] to float32(cos/sin(pos[r]*freq[i]))
// (times scale when hasScale; scale is a float64's bits), as
// kernel.RoPE.Apply rounds them.
extern "C" __global__ void kvx_rope_table(float* cs, float* sn, const ll* pos, const double* freq, ll rows, ll half,
					  ll scaleBits, ll hasScale) {
	pdl_wait();
	double scale = __longlong_as_double(scaleBits);
	ll n = rows * half;
	for (ll e = (ll)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += (ll)gridDim.x * blockDim.x) {
		ll r = e / half, i = e - r * half;
		double s, c;
		go_sincos(__dmul_rn((double)pos[r], freq[i]), &s, &c);
		if (hasScale) {
			s = __dmul_rn(s, scale);
			c = __dmul_rn(c, scale);
		}
		cs[e] = __double2float_rn(c);
		sn[e] = __double2float_rn(s);
	}
}

// kvx_rope_apply rotates the first dim elements of every head (stride apart,
// stride >= dim: the host checks that every head fits, which needs it) of
// each row by the row's table entries. One block per row.
extern "C" __global__ void kvx_rope_apply(float* x, const float* cs, const float* sn, ll rows, ll cols, ll stride, ll dim,
					  ll interleaved) {
	pdl_wait();
	ll half = dim / 2, heads = (cols + stride - 1) / stride;
	for (ll r = blockIdx.x; r < rows; r += gridDim.x) {
		float* row = x + r * cols;
		const float* c = cs + r * half;
		const float* s = sn + r * half;
		// A row's heads × half pairs fit an int (its columns do): 32-bit
		// division, several times cheaper than 64-bit.
		const int hh = (int)half, pairs = (int)(heads * half);
		for (int e = threadIdx.x; e < pairs; e += blockDim.x) {
			const int h = e / hh, i = e - h * hh;
			float* v = row + h * stride;
			ll a = interleaved ? 2 * i : i, b = interleaved ? 2 * i + 1 : i + half;
			float x0 = v[a], x1 = v[b];
			v[a] = __fsub_rn(__fmul_rn(x0, c[i]), __fmul_rn(x1, s[i]));
			v[b] = __fadd_rn(__fmul_rn(x0, s[i]), __fmul_rn(x1, c[i]));
		}
	}
}

// ---- routing: one block per row; exps in parallel, the rest in thread 0 ----

// kvx_route is kernel.Route of every row of logits (n experts): softmax,
// the kk most probable (lowest index among equals), renormalized; experts
// ascending in experts/weights[r*kk ...]. Dynamic shared memory: n floats
// and n bytes.
extern "C" __global__ void kvx_route(const float* logits, ll rows, ll n, ll kk, int* experts, float* weights, ll fma) {
	extern __shared__ float dsh[];
	float* p = dsh;
	unsigned char* chosen = (unsigned char*)(dsh + n);
	__shared__ float smax;
	ll r = blockIdx.x;
	const float* lr = logits + r * n;
	if (threadIdx.x == 0) {
		float m = lr[0];
		for (ll e = 1; e < n; e++) {
			if (lr[e] > m) {
				m = lr[e];
			}
		}
		smax = m;
	}
	__syncthreads();
	for (ll e = threadIdx.x; e < n; e += blockDim.x) {
		p[e] = exp32(__fsub_rn(lr[e], smax), fma);
		chosen[e] = 0;
	}
	__syncthreads();
	if (threadIdx.x != 0) {
		return;
	}
	float sum = 0.0f;
	for (ll e = 0; e < n; e++) {
		sum = __fadd_rn(sum, p[e]);
	}
	for (ll e = 0; e < n; e++) {
		p[e] = __fdiv_rn(p[e], sum);
	}
	for (ll it = 0; it < kk; it++) {
		ll best = -1;
		for (ll e = 0; e < n; e++) {
			if (!chosen[e] && (best < 0 || p[e] > p[best])) {
				best = e;
			}
		}
		chosen[best] = 1;
	}
	float s2 = 0.0f;
	for (ll e = 0; e < n; e++) {
		if (chosen[e]) {
			s2 = __fadd_rn(s2, p[e]);
		}
	}
	ll o = r * kk;
	for (ll e = 0; e < n; e++) {
		if (chosen[e]) {
			experts[o] = (int)e;
			weights[o] = __fdiv_rn(p[e], s2);
			o++;
		}
	}
}

// kvx_route_grouped is kernel.GroupedRoute.Route of every row (n experts in
// groups of per, bias may be 0): nallow groups allowed, kk experts chosen.
// Dynamic shared memory: 2n + groups floats, n + groups bytes.
extern "C" __global__ void kvx_route_grouped(const float* logits, const float* bias, ll rows, ll n, ll groups, ll nallow,
					     ll kk, ll norm, float scale, int* experts, float* weights, ll fma) {
	extern __shared__ float dsh[];
	float* scores = dsh;
	float* choice = dsh + n;
	float* gs = dsh + 2 * n;
	unsigned char* chosen = (unsigned char*)(dsh + 2 * n + groups);
	unsigned char* allowed = chosen + n;
	ll r = blockIdx.x, per = n / groups;
	const float* lr = logits + r * n;
	for (ll e = threadIdx.x; e < n; e += blockDim.x) {
		float sc = __double2float_rn(__ddiv_rn(1.0, __dadd_rn(1.0, go_exp(-(double)lr[e], fma))));
		scores[e] = sc;
		choice[e] = bias ? __fadd_rn(sc, bias[e]) : sc;
		chosen[e] = 0;
	}
	for (ll g = threadIdx.x; g < groups; g += blockDim.x) {
		allowed[g] = 0;
	}
	__syncthreads();
	if (threadIdx.x != 0) {
		return;
	}
	for (ll g = 0; g < groups; g++) {
		const float* part = choice + g * per;
		ll a = -1;
		for (ll i = 0; i < per; i++) {
			if (a < 0 || part[i] > part[a]) {
				a = i;
			}
		}
		ll b = -1;
		for (ll i = 0; i < per; i++) {
			if (i != a && (b < 0 || part[i] > part[b])) {
				b = i;
			}
		}
		gs[g] = b >= 0 ? __fadd_rn(part[a], part[b]) : part[a];
	}
	for (ll it = 0; it < nallow; it++) {
		ll best = -1;
		for (ll g = 0; g < groups; g++) {
			if (!allowed[g] && (best < 0 || gs[g] > gs[best])) {
				best = g;
			}
		}
		allowed[best] = 1;
	}
	float sum = 0.0f;
	for (ll it = 0; it < kk; it++) {
		ll best = -1;
		for (ll e = 0; e < n; e++) {
			if (allowed[e / per] && !chosen[e] && (best < 0 || choice[e] > choice[best])) {
				best = e;
			}
		}
		chosen[best] = 1;
		sum = __fadd_rn(sum, scores[best]);
	}
	float den = __fadd_rn(sum, KEPS20);
	ll o = r * kk;
	for (ll e = 0; e < n; e++) {
		if (chosen[e]) {
			float w = scores[e];
			if (norm) {
				w = __fdiv_rn(w, den);
			}
			experts[o] = (int)e;
			weights[o] = __fmul_rn(w, scale);
			o++;
		}
	}
}

// ---- argmax: the first largest non-NaN element of each row ----
//
// The first maximum is the same whatever the order of comparisons (ties go
// to the lower column), so a row is cut into chunks of AM_CHUNK columns
// that blocks scan at once (kvx_argmax_part), and one block a row reduces
// the chunks' winners (kvx_argmax_final): a vocabulary-wide row is read by
// many SMs instead of one.
#define AM_THREADS 256
#define AM_PER 32 // columns a thread scans
#define AM_CHUNK (AM_THREADS * AM_PER)

// am_take reports whether candidate (vb, ib) beats (va, ia): an index < 0
// is no candidate.
__device__ __forceinline__ bool am_take(float va, ll ia, float vb, ll ib) {
	return ib >= 0 && (ia < 0 || vb > va || (!(va > vb) && ib < ia));
}

// am_block reduces every thread's (v, i) to thread 0's in a tree.
__device__ __forceinline__ void am_block(float* v, ll* i, float* sv, ll* si) {
	sv[threadIdx.x] = *v;
	si[threadIdx.x] = *i;
	__syncthreads();
	for (int h = AM_THREADS / 2; h > 0; h >>= 1) {
		if (threadIdx.x < h && am_take(sv[threadIdx.x], si[threadIdx.x], sv[threadIdx.x + h], si[threadIdx.x + h])) {
			sv[threadIdx.x] = sv[threadIdx.x + h];
			si[threadIdx.x] = si[threadIdx.x + h];
		}
		__syncthreads();
	}
	*v = sv[0];
	*i = si[0];
}

// kvx_argmax_part: grid (ceil(cols / AM_CHUNK), rows), AM_THREADS threads;
// the winner of chunk c of row r goes to pv/pi[r · chunks + c] (index -1:
// only NaNs).
extern "C" __global__ void kvx_argmax_part(const float* x, ll rows, ll cols, float* pv, ll* pi) {
	pdl_wait();
	__shared__ float sv[AM_THREADS];
	__shared__ ll si[AM_THREADS];
	const ll r = blockIdx.y, c0 = (ll)blockIdx.x * AM_CHUNK;
	const float* xr = x + r * cols;
	float vals[AM_PER];
#pragma unroll
	for (int u = 0; u < AM_PER; u++) {
		const ll i = c0 + u * AM_THREADS + threadIdx.x;
		vals[u] = i < cols ? xr[i] : __int_as_float(0x7fc00000); // past the row: NaN, never taken
	}
	ll best = -1;
	float bv = 0.0f;
#pragma unroll
	for (int u = 0; u < AM_PER; u++) {
		const float v = vals[u];
		if (v == v && (best < 0 || v > bv)) {
			best = c0 + u * AM_THREADS + threadIdx.x;
			bv = v;
		}
	}
	am_block(&bv, &best, sv, si);
	if (threadIdx.x == 0) {
		pv[r * gridDim.x + blockIdx.x] = bv;
		pi[r * gridDim.x + blockIdx.x] = best;
	}
}

// kvx_argmax_final: grid rows, AM_THREADS threads; out[r] is the best of
// row r's chunks (-1 when every element is NaN).
extern "C" __global__ void kvx_argmax_final(const float* pv, const ll* pi, ll chunks, int* out) {
	pdl_wait();
	__shared__ float sv[AM_THREADS];
	__shared__ ll si[AM_THREADS];
	const ll r = blockIdx.x;
	ll best = -1;
	float bv = 0.0f;
	for (ll c = threadIdx.x; c < chunks; c += AM_THREADS) {
		if (am_take(bv, best, pv[r * chunks + c], pi[r * chunks + c])) {
			bv = pv[r * chunks + c];
			best = pi[r * chunks + c];
		}
	}
	am_block(&bv, &best, sv, si);
	if (threadIdx.x == 0) {
		out[r] = (int)best;
	}
}

// ---- matmul: out (n × m) = x (n × k) · wᵀ (w m × k) ----
//
// Every output is kernel.Dot(w row, x row): four partial sums, lane k % 4,
// ascending k. The tiled kernel gives each lane to its own thread: thread
// (lane l, group q) of 256 sums, for the 8 × 8 outputs of group q, the
// products of k ≡ l (mod 4) in ascending order (k tiles in order, and within
// a tile k = 4s + l for ascending s; a tile starts at a multiple of 4), and
// the lanes are combined as (s0+s1)+(s2+s3) through shared memory at the
// end. Zero padding past k adds +0 products, which change no sum (a sum that
// starts at +0 is never -0).

#define MT 64  // outputs per tile side
#define KT 32  // k per tile
#define TS 68  // shared row stride (floats): float4-aligned, conflict-free

extern "C" __global__ void __launch_bounds__(256, 2)
    kvx_matmul(float* out, const float* x, const float* w, ll n, ll m, ll K) {
	__shared__ __align__(16) float sh[2 * 2 * KT * TS];
	const int t = threadIdx.x, l = t >> 6, q = t & 63, gy = q >> 3, gx = q & 7;
	const ll row0 = (ll)blockIdx.y * MT, col0 = (ll)blockIdx.x * MT;
	float acc[8][8];
#pragma unroll
	for (int i = 0; i < 8; i++) {
#pragma unroll
		for (int j = 0; j < 8; j++) {
			acc[i][j] = 0.0f;
		}
	}
	float ra[8], rb[8];
	const ll T = (K + KT - 1) / KT;
	// Loading: thread t brings rows t>>3 and 32 + (t>>3) of the tile, at k
	// offsets (t&7) + 8q (q < 4): element 2q + h of ra/rb is row h*32 +
	// (t>>3), k (t&7) + 8q.
	const int lr = t >> 3, lc = t & 7;
	const bool xv0 = row0 + lr < n, xv1 = row0 + 32 + lr < n;
	const bool wv0 = col0 + lr < m, wv1 = col0 + 32 + lr < m;
	const float* xp0 = x + (xv0 ? (row0 + lr) * K : 0) + lc;
	const float* xp1 = x + (xv1 ? (row0 + 32 + lr) * K : 0) + lc;
	const float* wp0 = w + (wv0 ? (col0 + lr) * K : 0) + lc;
	const float* wp1 = w + (wv1 ? (col0 + 32 + lr) * K : 0) + lc;
#define KVX_LOAD(k0)                                                                  \
	{                                                                             \
		const ll kb = (k0);                                                   \
		if (kb + KT <= K) {                                                   \
			_Pragma("unroll") for (int q = 0; q < 4; q++) {               \
				ra[2 * q] = xv0 ? xp0[kb + 8 * q] : 0.0f;             \
				ra[2 * q + 1] = xv1 ? xp1[kb + 8 * q] : 0.0f;         \
				rb[2 * q] = wv0 ? wp0[kb + 8 * q] : 0.0f;             \
				rb[2 * q + 1] = wv1 ? wp1[kb + 8 * q] : 0.0f;         \
			}                                                             \
		} else {                                                              \
			_Pragma("unroll") for (int q = 0; q < 4; q++) {               \
				const bool kin = kb + lc + 8 * q < K;                 \
				ra[2 * q] = (xv0 && kin) ? xp0[kb + 8 * q] : 0.0f;    \
				ra[2 * q + 1] = (xv1 && kin) ? xp1[kb + 8 * q] : 0.0f; \
				rb[2 * q] = (wv0 && kin) ? wp0[kb + 8 * q] : 0.0f;    \
				rb[2 * q + 1] = (wv1 && kin) ? wp1[kb + 8 * q] : 0.0f; \
			}                                                             \
		}                                                                     \
	}
#define KVX_STORE(buf)                                                                \
	{                                                                             \
		float* As = sh + (buf) * 2 * KT * TS + lc * TS + lr;                  \
		_Pragma("unroll") for (int q = 0; q < 4; q++) {                       \
			As[8 * q * TS] = ra[2 * q];                                   \
			As[8 * q * TS + 32] = ra[2 * q + 1];                          \
			As[KT * TS + 8 * q * TS] = rb[2 * q];                         \
			As[KT * TS + 8 * q * TS + 32] = rb[2 * q + 1];                \
		}                                                                     \
	}
	if (T > 0) {
		KVX_LOAD(0);
		KVX_STORE(0);
	}
	__syncthreads();
	for (ll ti = 0; ti < T; ti++) {
		const int cur = (int)(ti & 1);
		if (ti + 1 < T) {
			KVX_LOAD((ti + 1) * KT);
		}
		const float* As = sh + cur * 2 * KT * TS;
		const float* Bs = As + KT * TS;
#pragma unroll
		for (int s = 0; s < KT / 4; s++) {
			const int kk = 4 * s + l;
			float4 a0 = *(const float4*)&As[kk * TS + gy * 4];
			float4 a1 = *(const float4*)&As[kk * TS + 32 + gy * 4];
			float4 b0 = *(const float4*)&Bs[kk * TS + gx * 4];
			float4 b1 = *(const float4*)&Bs[kk * TS + 32 + gx * 4];
			float a[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
			float b[8] = {b0.x, b0.y, b0.z, b0.w, b1.x, b1.y, b1.z, b1.w};
#pragma unroll
			for (int i = 0; i < 8; i++) {
#pragma unroll
				for (int j = 0; j < 8; j++) {
					acc[i][j] = __fadd_rn(acc[i][j], __fmul_rn(b[j], a[i]));
				}
			}
		}
		if (ti + 1 < T) {
			KVX_STORE(cur ^ 1);
		}
		__syncthreads();
	}
#undef KVX_LOAD
#undef KVX_STORE
	// Combine the lanes: s01 = s0+s1 and s23 = s2+s3, then s01+s23.
	float* red = sh;
	if (l & 1) {
		float* base = red + (l >> 1) * 4096;
#pragma unroll
		for (int i = 0; i < 8; i++) {
#pragma unroll
			for (int j = 0; j < 8; j++) {
				base[(i * 8 + j) * 64 + q] = acc[i][j];
			}
		}
	}
	__syncthreads();
	if (!(l & 1)) {
		const float* base = red + (l >> 1) * 4096;
#pragma unroll
		for (int i = 0; i < 8; i++) {
#pragma unroll
			for (int j = 0; j < 8; j++) {
				acc[i][j] = __fadd_rn(acc[i][j], base[(i * 8 + j) * 64 + q]);
			}
		}
	}
	__syncthreads();
	if (l == 2) {
#pragma unroll
		for (int i = 0; i < 8; i++) {
#pragma unroll
			for (int j = 0; j < 8; j++) {
				red[(i * 8 + j) * 64 + q] = acc[i][j];
			}
		}
	}
	__syncthreads();
	float* tile = sh + 4096; // MT rows of TS
	if (l == 0) {
#pragma unroll
		for (int i = 0; i < 8; i++) {
			const int rr = (i < 4) ? gy * 4 + i : 32 + gy * 4 + (i - 4);
#pragma unroll
			for (int j = 0; j < 8; j++) {
				const int cc = (j < 4) ? gx * 4 + j : 32 + gx * 4 + (j - 4);
				tile[rr * TS + cc] = __fadd_rn(acc[i][j], red[(i * 8 + j) * 64 + q]);
			}
		}
	}
	__syncthreads();
	for (int e = t; e < MT * MT; e += 256) {
		const int rr = e >> 6, cc = e & 63;
		if (row0 + rr < n && col0 + cc < m) {
			out[(row0 + rr) * m + col0 + cc] = tile[rr * TS + cc];
		}
	}
}

// kvx_matmul_skinnyN is the same product for N ≤ 8 rows of x (decode):
// thread (w row r, lane l) of a 128-thread block (32 w rows) sums lane l of
// the N x rows, and the four lanes, adjacent threads of a warp, are
// combined with shuffles as (s0+s1)+(s2+s3). The weights and x rows go
// through shared memory in chunks of SKC k, loaded coalesced into registers
// one chunk ahead.
#define SKC 256 // a multiple of 128
#define SKS 260

template <int NR>
__device__ __forceinline__ void matmul_skinny(float* out, const float* x, const float* w, ll m, ll K) {
	__shared__ float ws[32 * SKS];
	__shared__ float xs[NR * SKC];
	const int t = threadIdx.x, l = t & 3, r = t >> 2;
	const ll j0 = (ll)blockIdx.x * 32, j = j0 + r;
	const int rv = (int)(m - j0 < 32 ? m - j0 : 32); // valid weight rows of the block
	float acc[NR];
#pragma unroll
	for (int i = 0; i < NR; i++) {
		acc[i] = 0.0f;
	}
	float sw[32 * (SKC / 128)], sx[NR * (SKC / 128)];
	const ll T = (K + SKC - 1) / SKC;
	// Chunk at c0: thread t loads columns c0 + 128h + t of the block's
	// weight rows and of the x rows.
#define KVX_SKLOAD(c0)                                                          \
	_Pragma("unroll") for (int h = 0; h < SKC / 128; h++) {                 \
		const ll k = (c0) + 128 * h + t;                                \
		const bool kin = k < K;                                         \
		const float* p = w + j0 * K + k;                                \
		_Pragma("unroll") for (int it = 0; it < 32; it++) {             \
			sw[32 * h + it] = (kin && it < rv) ? *p : 0.0f;         \
			p += K;                                                 \
		}                                                               \
		_Pragma("unroll") for (int i = 0; i < NR; i++) {                \
			sx[NR * h + i] = kin ? x[i * K + k] : 0.0f;             \
		}                                                               \
	}
	if (T > 0) {
		KVX_SKLOAD(0);
	}
	for (ll c = 0; c < T; c++) {
		const ll c0 = c * SKC;
		__syncthreads(); // the last chunk's reads are done
#pragma unroll
		for (int h = 0; h < SKC / 128; h++) {
#pragma unroll
			for (int it = 0; it < 32; it++) {
				ws[it * SKS + 128 * h + t] = sw[32 * h + it];
			}
#pragma unroll
			for (int i = 0; i < NR; i++) {
				xs[i * SKC + 128 * h + t] = sx[NR * h + i];
			}
		}
		__syncthreads();
		if (c + 1 < T) {
			KVX_SKLOAD(c0 + SKC);
		}
		const int cl = (int)(K - c0 < SKC ? K - c0 : SKC);
		const float* wr = ws + r * SKS;
#pragma unroll 8
		for (int s = 0; s < SKC / 4; s++) {
			const int kk = 4 * s + l;
			if (kk < cl) {
				const float wv = wr[kk];
#pragma unroll
				for (int i = 0; i < NR; i++) {
					acc[i] = __fadd_rn(acc[i], __fmul_rn(wv, xs[i * SKC + kk]));
				}
			}
		}
	}
#undef KVX_SKLOAD
#pragma unroll
	for (int i = 0; i < NR; i++) {
		float s = __fadd_rn(acc[i], __shfl_down_sync(0xffffffffu, acc[i], 1)); // lanes 0, 2: s0+s1, s2+s3
		float v = __fadd_rn(s, __shfl_down_sync(0xffffffffu, s, 2));             // lane 0: (s0+s1)+(s2+s3)
		if (l == 0 && j < m) {
			out[i * m + j] = v;
		}
	}
}

#define KVX_SKINNY(N)                                                                                           \
	extern "C" __global__ void __launch_bounds__(128)                                                       \
	    kvx_matmul_skinny##N(float* out, const float* x, const float* w, ll m, ll K) {                    \
		matmul_skinny<N>(out, x, w, m, K);                                                              \
	}
KVX_SKINNY(1)
KVX_SKINNY(2)
KVX_SKINNY(3)
KVX_SKINNY(4)
KVX_SKINNY(5)
KVX_SKINNY(6)
KVX_SKINNY(7)
KVX_SKINNY(8)
