// kperm-probe.cu: is one tensor-core k16 step of mma.sync.m16n8k16 (bf16 in,
// float32 accumulate) invariant under a permutation of its 16 k values (the
// same permutation on both operands)? The fast matmul keeps batch invariance
// by giving every kernel the same chain of k16 steps (device/cuda/kernels/
// fgemm.cu). If the order of k inside a step cannot change the bits, the
// decode kernels may feed a step's 16 values to the lanes in any order (a
// lane's two 8-byte halves of a weight row, say) while a wgmma kernel reads
// the same 16 values from shared memory in k order, so the weights can be kept
// in k order for both. Compiled and run on the GPU machine (nvcc
// -arch=sm_90a); argv[1] is the exponent spread (default 12: operands over
// 2^-12..2^12). It prints, per mode, the outputs bit-equal to mode 0's:
//   0  k in order (index i of the step is k i)
//   1  the lanes' 8-byte mapping: index 2t+e is k 4t+e, 2t+8+e is k 4t+2+e
//   2  a random permutation per step and tile
//   3  the two halves of the step swapped (index i is k i^8)
//   4  each half reversed (index i is k (i & 8) | (7 - i % 8))
//   5  wgmma m64n128k16, both operands from shared memory (k in order)
//   6  the control: k 15 and 16 trade steps (steps 2j and 2j+1 swap their
//      last and first value), which must change bits: a probe that cannot
//      tell chains apart would pass every mode
#include <cstdio>
#include <cstdlib>
#include <cstdint>
#include <cmath>
#include <cstring>
#include <vector>
#include <cuda_runtime.h>

#define STEPS 64
#define N 128
#define MODES 7
#define MMA_MODES 6 // modes run on mma.sync (all but 5)

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

#define R8(i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), "+f"(d[i + 6]), "+f"(d[i + 7])
__device__ __forceinline__ void wg_ss_n128(float* d, uint64_t a, uint64_t b) {
	asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, 1, 0;\n"
		"wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
		"{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,"
		"%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, "
		"%64, %65, p, 1, 1, 0, 0;\n}\n"
		: R8(0), R8(8), R8(16), R8(24), R8(32), R8(40), R8(48), R8(56)
		: "l"(a), "l"(b));
}

// permute is the k offset, from the step's first k 16s, of index i of step s.
__device__ __forceinline__ int permute(int mode, int i, const unsigned char* rp, int s) {
	switch (mode) {
	case 6:
		if (s % 2 == 0 && i == 15) return 16;
		if (s % 2 == 1 && i == 0) return -1;
		return i;
	case 1: return (i < 8) ? 4 * (i / 2) + i % 2 : 4 * ((i - 8) / 2) + 2 + i % 2;
	case 2: return rp[i];
	case 3: return i ^ 8;
	case 4: return (i & 8) | (7 - i % 8);
	}
	return i;
}

// One tile: A 64 × (16·STEPS), B N × (16·STEPS) (K-major), out[mode][64][N].
__global__ void probe(const unsigned short* A, const unsigned short* B, float* out) {
	__shared__ __align__(128) unsigned short sb[N * 16];
	__shared__ __align__(128) unsigned short sa[64 * 16];
	__shared__ unsigned char rp[16];
	const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
	const unsigned short* At = A + (size_t)blockIdx.x * 64 * 16 * STEPS;
	const unsigned short* Bt = B + (size_t)blockIdx.x * N * 16 * STEPS;
	float* o = out + (size_t)blockIdx.x * MODES * 64 * N;
	float m[MMA_MODES][16][4], w[64];
	for (int i = 0; i < 64; i++) w[i] = 0.f;
	for (int md = 0; md < MMA_MODES; md++)
		for (int j = 0; j < 16; j++) for (int e = 0; e < 4; e++) m[md][j][e] = 0.f;
	const int K = 16 * STEPS;
	for (int s = 0; s < STEPS; s++) {
		__syncthreads();
		if (tid == 0) { // a Fisher-Yates shuffle seeded by (tile, step)
			unsigned x = 0x9E3779B9u * (blockIdx.x * STEPS + s + 1);
			for (int i = 0; i < 16; i++) rp[i] = (unsigned char)i;
			for (int i = 15; i > 0; i--) {
				x ^= x << 13, x ^= x >> 17, x ^= x << 5;
				const int j = x % (i + 1);
				const unsigned char c = rp[i];
				rp[i] = rp[j], rp[j] = c;
			}
		}
		for (int i = tid; i < N * 16; i += 128) { // element (n, k) of this step
			const int n = i / 16, k = i % 16;
			sb[((n / 8) * 2 + k / 8) * 64 + (n % 8) * 8 + k % 8] = Bt[(size_t)n * K + s * 16 + k];
			if (n < 64) sa[((n / 8) * 2 + k / 8) * 64 + (n % 8) * 8 + k % 8] = At[(size_t)n * K + s * 16 + k];
		}
		asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
		__syncthreads();
		for (int mi = 0; mi < MMA_MODES; mi++) {
			const int md = mi < 5 ? mi : 6;
			auto av = [&](int r, int c) -> unsigned {
				const unsigned short* p = At + (size_t)(16 * warp + r) * K + s * 16;
				return (unsigned)p[permute(md, c, rp, s)] | ((unsigned)p[permute(md, c + 1, rp, s)] << 16);
			};
			unsigned a[4] = {av(g, 2 * t), av(g + 8, 2 * t), av(g, 2 * t + 8), av(g + 8, 2 * t + 8)};
			for (int j = 0; j < 16; j++) {
				const unsigned short* p = Bt + (size_t)(8 * j + g) * K + s * 16;
				const unsigned b0 = (unsigned)p[permute(md, 2 * t, rp, s)] | ((unsigned)p[permute(md, 2 * t + 1, rp, s)] << 16);
				const unsigned b1 = (unsigned)p[permute(md, 2 * t + 8, rp, s)] | ((unsigned)p[permute(md, 2 * t + 9, rp, s)] << 16);
				mma16816(m[mi][j], a, b0, b1);
			}
		}
		asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
		wg_ss_n128(w, desc(sa, 128, 256), desc(sb, 128, 256));
		asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
		asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
	}
	for (int j = 0; j < 16; j++)
		for (int e = 0; e < 4; e++) {
			const int r = 16 * warp + g + (e / 2) * 8, c = 8 * j + 2 * t + e % 2;
			for (int mi = 0; mi < MMA_MODES; mi++) o[(mi < 5 ? mi : 6) * 64 * N + r * N + c] = m[mi][j][e];
			o[5 * 64 * N + r * N + c] = w[4 * j + e];
		}
}

static unsigned short bf16(float f) {
	unsigned u;
	memcpy(&u, &f, 4);
	return (unsigned short)((u + 0x7fff + ((u >> 16) & 1)) >> 16);
}

int main(int argc, char** argv) {
	const int spread = argc > 1 ? atoi(argv[1]) : 12;
	const int tiles = 512, K = 16 * STEPS;
	uint64_t st = 0x9E3779B97F4A7C15ull ^ (uint64_t)spread;
	auto next = [&]() { st ^= st << 13, st ^= st >> 7, st ^= st << 17; return st; };
	auto uni = [&]() { return (double)(next() >> 11) * 0x1p-53; };
	auto nd = [&]() { return (float)(sqrt(-2 * log(uni() + 1e-300)) * cos(6.283185307179586 * uni())); };
	auto ex = [&]() { return (int)(next() % (2 * spread + 1)) - spread; };
	std::vector<unsigned short> A((size_t)tiles * 64 * K), B((size_t)tiles * N * K);
	// One value in 16 is zero (as padded and ReLU'd activations are); the rest
	// normal with a random binary exponent.
	for (auto& v : A) v = next() % 16 == 0 ? 0 : bf16(ldexpf(nd(), ex()));
	for (auto& v : B) v = next() % 16 == 0 ? 0 : bf16(ldexpf(nd(), ex()));
	unsigned short *dA, *dB;
	float* dO;
	cudaMalloc(&dA, A.size() * 2);
	cudaMalloc(&dB, B.size() * 2);
	cudaMalloc(&dO, (size_t)tiles * MODES * 64 * N * 4);
	cudaMemcpy(dA, A.data(), A.size() * 2, cudaMemcpyHostToDevice);
	cudaMemcpy(dB, B.data(), B.size() * 2, cudaMemcpyHostToDevice);
	probe<<<tiles, 128>>>(dA, dB, dO);
	cudaError_t err = cudaDeviceSynchronize();
	if (err != cudaSuccess) {
		printf("kperm-probe: %s\n", cudaGetErrorString(err));
		return 1;
	}
	std::vector<float> O((size_t)tiles * MODES * 64 * N);
	cudaMemcpy(O.data(), dO, O.size() * 4, cudaMemcpyDeviceToHost);
	const char* names[MODES] = {"k in order", "lanes' 8-byte halves", "random per step", "halves swapped", "halves reversed", "wgmma SS m64n128k16", "control: k across steps"};
	long long same[MODES] = {0}, total = (long long)tiles * 64 * N;
	for (int ti = 0; ti < tiles; ti++)
		for (int i = 0; i < 64 * N; i++) {
			const float* o = &O[(size_t)ti * MODES * 64 * N];
			for (int md = 0; md < MODES; md++) same[md] += memcmp(&o[md * 64 * N + i], &o[i], 4) == 0;
		}
	printf("kperm-probe: spread 2^-%d..2^%d, %d k16 steps a chain, %lld outputs\n", spread, spread, STEPS, total);
	for (int md = 0; md < MODES; md++) printf("  mode %d %-22s bit-equal to mode 0: %lld / %lld\n", md, names[md], same[md], total);
	return 0;
}
