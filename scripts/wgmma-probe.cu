// wgmma-probe.cu: do Hopper's wgmma.mma_async (m64nNk16, bf16 in, float32
// accumulate) and mma.sync.m16n8k16 give the same bits for the same chain
// of k16 steps? The fast matmul's batch invariance (device/cuda/kernels/
// fgemm.cu) holds only while every kernel runs the same instruction
// semantics; a wgmma kernel for prefill could join the mma.sync kernels for
// decode only if they agree bit for bit. Compiled and run on the GPU
// machine (nvcc -arch=sm_90a), it prints, for random tiles with operands
// spread over 2^-12..2^12 and a chain of 64 k16 steps from zero:
// mismatches of wgmma n128 / n8 (each descriptor encoding tried) against
// mma.sync, and each one's error against a float64 sum.
#include <cstdio>
#include <cstdlib>
#include <cstdint>
#include <cmath>
#include <cstring>
#include <vector>
#include <cuda_runtime.h>

#define STEPS 64
#define N 128

__device__ __forceinline__ unsigned saddr(const void* p) { return (unsigned)__cvta_generic_to_shared(p); }

__device__ __forceinline__ void mma16816(float* c, const unsigned* a, unsigned b0, unsigned b1) {
	asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
		: "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3]) : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint64_t desc(const void* p, unsigned lbo, unsigned sbo) {
	uint64_t d = 0;
	d |= (uint64_t)((saddr(p) & 0x3FFFF) >> 4);
	d |= (uint64_t)((lbo & 0x3FFFF) >> 4) << 16;
	d |= (uint64_t)((sbo & 0x3FFFF) >> 4) << 32;
	return d; // base offset 0, no swizzle
}

__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_wait() { asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory"); }

__device__ __forceinline__ void wg_n8(float* d, const unsigned* a, uint64_t b) {
	// scale-d is a predicate operand (accumulate into d when true), as
	// CUTLASS writes it; an immediate there is not what the ISA takes.
	asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
		"wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16 {%0,%1,%2,%3}, {%4,%5,%6,%7}, %8, p, 1, 1, 0;\n}\n"
		: "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]) : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b));
}

#define R8(i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), "+f"(d[i + 6]), "+f"(d[i + 7])
__device__ __forceinline__ void wg_n128(float* d, const unsigned* a, uint64_t b) {
	asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
		"wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
		"{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,"
		"%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, "
		"{%64,%65,%66,%67}, %68, p, 1, 1, 0;\n}\n"
		: R8(0), R8(8), R8(16), R8(24), R8(32), R8(40), R8(48), R8(56)
		: "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b));
}

#define R8b(i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), "+f"(d[i + 6]), "+f"(d[i + 7])
__device__ __forceinline__ void wg_n64(float* d, const unsigned* a, uint64_t b) {
	asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
		"wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
		"{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, "
		"{%32,%33,%34,%35}, %36, p, 1, 1, 0;\n}\n"
		: R8b(0), R8b(8), R8b(16), R8b(24)
		: "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b));
}

// One tile: A 64 × (16·STEPS), B N × (16·STEPS) (K-major, as a linear
// layer's weight), out[mode][64][N]. mode 0: mma.sync; 1, 2: wgmma n128 with
// (lbo, sbo) = (128, 256) or (256, 128); 3, 4: wgmma n8 likewise; 5: the
// roles swapped, as a prefill kernel over weights kept in the fragments' k
// order would run it: wgmma m64n64k16 with B's first 64 rows (the weight)
// as the register operand and A's 64 rows (the activations) from shared
// memory, so D[n][r] is out[r][n] (columns 64..127 of mode 5 are zero).
__global__ void probe(const unsigned short* A, const unsigned short* B, float* out) {
	// Core matrices (n/8, k/8): 128 bytes each; 256 bytes of slack past them,
	// which the wrong encoding's last n8 tile reads (lbo 256 from the last
	// tile's base), so a wrong guess gives wrong values, not a fault.
	__shared__ __align__(128) unsigned short sb[N * 16 + 128];
	__shared__ __align__(128) unsigned short sa[64 * 16]; // A's step, core matrices as sb
	const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
	const unsigned short* At = A + (size_t)blockIdx.x * 64 * 16 * STEPS;
	const unsigned short* Bt = B + (size_t)blockIdx.x * N * 16 * STEPS;
	float* o = out + (size_t)blockIdx.x * 6 * 64 * N;
	float m[16][4], w1[64], w2[64], w3[16][4], w4[16][4], w5[32];
	for (int i = 0; i < 64; i++) w1[i] = w2[i] = 0.f;
	for (int i = 0; i < 32; i++) w5[i] = 0.f;
	for (int j = 0; j < 16; j++) for (int e = 0; e < 4; e++) m[j][e] = w3[j][e] = w4[j][e] = 0.f;
	const int K = 16 * STEPS;
	for (int s = 0; s < STEPS; s++) {
		__syncthreads();
		for (int i = tid; i < N * 16; i += 128) { // element (n, k) of this step
			const int n = i / 16, k = i % 16;
			sb[((n / 8) * 2 + k / 8) * 64 + (n % 8) * 8 + k % 8] = Bt[(size_t)n * K + s * 16 + k];
			if (n < 64) sa[((n / 8) * 2 + k / 8) * 64 + (n % 8) * 8 + k % 8] = At[(size_t)n * K + s * 16 + k];
		}
		asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
		__syncthreads();
		// A fragment: rows 16·warp + g (+8), cols 2t, 2t+1 (+8).
		unsigned a[4];
		auto av = [&](int r, int c) -> unsigned {
			const unsigned short* p = At + (size_t)(16 * warp + r) * K + s * 16 + c;
			return (unsigned)p[0] | ((unsigned)p[1] << 16);
		};
		a[0] = av(g, 2 * t), a[1] = av(g + 8, 2 * t), a[2] = av(g, 2 * t + 8), a[3] = av(g + 8, 2 * t + 8);
		auto bv = [&](int n, int k) -> unsigned {
			const unsigned short* p = &sb[((n / 8) * 2 + k / 8) * 64 + (n % 8) * 8 + k % 8];
			return (unsigned)p[0] | ((unsigned)p[1] << 16);
		};
		for (int j = 0; j < 16; j++) mma16816(m[j], a, bv(8 * j + g, 2 * t), bv(8 * j + g, 2 * t + 8));
		wg_fence();
		wg_n128(w1, a, desc(sb, 128, 256));
		wg_commit();
		wg_wait();
		wg_fence();
		wg_n128(w2, a, desc(sb, 256, 128));
		wg_commit();
		wg_wait();
		{
			// The weight's rows 16·warp + g (+8) as the register operand.
			auto wv = [&](int r, int c) -> unsigned {
				const unsigned short* p = Bt + (size_t)(16 * warp + r) * K + s * 16 + c;
				return (unsigned)p[0] | ((unsigned)p[1] << 16);
			};
			unsigned b[4] = {wv(g, 2 * t), wv(g + 8, 2 * t), wv(g, 2 * t + 8), wv(g + 8, 2 * t + 8)};
			wg_fence();
			wg_n64(w5, b, desc(sa, 128, 256));
			wg_commit();
			wg_wait();
		}
		for (int j = 0; j < 16; j++) {
			wg_fence();
			wg_n8(w3[j], a, desc(sb + j * 128, 128, 256));
			wg_n8(w4[j], a, desc(sb + j * 128, 256, 128));
			wg_commit();
			wg_wait();
		}
	}
	for (int j = 0; j < 16; j++)
		for (int e = 0; e < 4; e++) {
			const int r = 16 * warp + g + (e / 2) * 8, c = 8 * j + 2 * t + e % 2;
			o[0 * 64 * N + r * N + c] = m[j][e];
			o[1 * 64 * N + r * N + c] = w1[4 * j + e];
			o[2 * 64 * N + r * N + c] = w2[4 * j + e];
			o[3 * 64 * N + r * N + c] = w3[j][e];
			o[4 * 64 * N + r * N + c] = w4[j][e];
		}
	// Mode 5's D (64 weight rows × 64 activation rows): this thread holds
	// D[16·warp + g (+8)][8·j + 2t (+1)], i.e. out[8·j + 2t (+1)][16·warp + g (+8)].
	for (int j = 0; j < 8; j++)
		for (int e = 0; e < 4; e++) {
			const int n = 16 * warp + g + (e / 2) * 8, r = 8 * j + 2 * t + e % 2;
			o[5 * 64 * N + r * N + n] = w5[4 * j + e];
			o[5 * 64 * N + r * N + n + 64] = 0.f;
		}
}

static unsigned short bf16(float f) {
	unsigned u;
	memcpy(&u, &f, 4);
	return (unsigned short)((u + 0x7fff + ((u >> 16) & 1)) >> 16);
}
static double fl(unsigned short h) {
	unsigned u = (unsigned)h << 16;
	float f;
	memcpy(&f, &u, 4);
	return f;
}

int main() {
	const int tiles = 256, K = 16 * STEPS;
	uint64_t st = 0x9E3779B97F4A7C15ull;
	auto next = [&]() { st ^= st << 13, st ^= st >> 7, st ^= st << 17; return st; };
	auto uni = [&]() { return (double)(next() >> 11) * 0x1p-53; };
	auto nd = [&]() { return (float)(sqrt(-2 * log(uni() + 1e-300)) * cos(6.283185307179586 * uni())); };
	auto ex = [&]() { return (int)(next() % 25) - 12; };
	std::vector<unsigned short> A((size_t)tiles * 64 * K), B((size_t)tiles * N * K);
	for (auto& v : A) v = bf16(ldexpf(nd(), ex()));
	for (auto& v : B) v = bf16(ldexpf(nd(), ex()));
	unsigned short *dA, *dB;
	float* dO;
	cudaMalloc(&dA, A.size() * 2);
	cudaMalloc(&dB, B.size() * 2);
	cudaMalloc(&dO, (size_t)tiles * 6 * 64 * N * 4);
	cudaMemcpy(dA, A.data(), A.size() * 2, cudaMemcpyHostToDevice);
	cudaMemcpy(dB, B.data(), B.size() * 2, cudaMemcpyHostToDevice);
	probe<<<tiles, 128>>>(dA, dB, dO);
	cudaError_t err = cudaDeviceSynchronize();
	if (err != cudaSuccess) {
		printf("probe: %s\n", cudaGetErrorString(err));
		return 1;
	}
	std::vector<float> O((size_t)tiles * 6 * 64 * N);
	cudaMemcpy(O.data(), dO, O.size() * 4, cudaMemcpyDeviceToHost);
	const char* names[6] = {"mma.sync m16n8k16", "wgmma n128 lbo128/sbo256", "wgmma n128 lbo256/sbo128", "wgmma n8 lbo128/sbo256", "wgmma n8 lbo256/sbo128", "wgmma n64, roles swapped"};
	long long same[6] = {0}, total = (long long)tiles * 64 * N, totals[6];
	double worst[6] = {0};
	for (int md = 0; md < 6; md++) totals[md] = md == 5 ? total / 2 : total;
	for (int ti = 0; ti < tiles; ti++)
		for (int r = 0; r < 64; r++)
			for (int c = 0; c < N; c++) {
				double want = 0, mag = 0;
				for (int k = 0; k < K; k++) {
					double p = fl(A[((size_t)ti * 64 + r) * K + k]) * fl(B[((size_t)ti * N + c) * K + k]);
					want += p, mag += fabs(p);
				}
				const float* o = &O[(size_t)ti * 6 * 64 * N];
				for (int md = 0; md < 6; md++) {
					if (md == 5 && c >= 64) continue; // mode 5 covers the first 64 weight rows
					float v = o[md * 64 * N + r * N + c], m0 = o[r * N + c];
					if (memcmp(&v, &m0, 4) == 0) same[md]++;
					double e = fabs(v - want) / (mag + 1e-300);
					if (!(e <= worst[md])) worst[md] = std::isnan(e) ? INFINITY : e;
				}
			}
	for (int md = 0; md < 6; md++)
		printf("%-26s bit-equal to mma.sync: %lld / %lld   worst |err| / sum|ab|: %.3g\n", names[md], same[md], totals[md], worst[md]);
	return 0;
}
