// wgemm-check.cu: the wgmma tiled matmul (device/cuda/sm90a/fgemm_wg.cu)
// against the mma.sync one (device/cuda/kernels/fgemm.cu's wide256s3s, the
// cuda device's default for many rows) on the GPU machine, without Go:
// bit equality of every output, then each kernel's rate and cuBLAS's at
// Llama-3-8B's prefill shapes. Run from the repository root on the GPU
// machine (a device call over the working tree; it needs no bundle):
//   nvcc -O3 -gencode arch=compute_90a,code=sm_90a -fmad=false -Idevice/cuda/kernels \
//     scripts/wgemm-check.cu -lcublas -o /tmp/wgemm-check && /tmp/wgemm-check [iterations [shape]]
// It exits 1 when any output differs from the mma.sync kernel's.
#include <cstdio>
#include <cstdlib>
#include <cstdint>
#include <cstring>
#include <cmath>
#include <vector>
#include <cuda_runtime.h>
#include <cublas_v2.h>

#include "fgemm.cu"
#include "../sm90a/fgemm_wg.cu"

#define CK(x)                                                                           \
	do {                                                                                \
		cudaError_t e_ = (x);                                                           \
		if (e_ != cudaSuccess) {                                                        \
			printf("%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
			exit(1);                                                                    \
		}                                                                               \
	} while (0)

static unsigned short hbf16(float f) {
	unsigned u;
	memcpy(&u, &f, 4);
	return (unsigned short)((u + 0x7fff + ((u >> 16) & 1)) >> 16);
}
static long long hperm(long long c) {
	const int i = (int)(c & 31);
	return (c & ~31LL) | (long long)((((i >> 1) & 3) << 3) | ((i >> 3) << 1) | (i & 1));
}

struct kern {
	const char* name;
	void (*fn)(float*, const unsigned short*, const unsigned short*, long long, long long, long long);
	int rows, cols, threads, smem; // tile and launch
};

static kern kerns[] = {
	{"wide256s3s (mma.sync)", kvx_fgemm_wide256s3s, 256, 128, 256, 3 * (256 + 128) * 32 * 2 + 256 * 128 * 4},
#define WSK(NT, ST, KPI, SUF, TOTB) \
	{"ws" #NT "w2s" #ST "k" #KPI #SUF " (wgmma)", kvx_fgemm_ws##NT##w2s##ST##k##KPI##SUF, NT, 128, 384, ST * (NT + 128) * 32 * KPI * 2 + TOTB + 2 * ST * 8},
	WSK(256, 4, 1, s, 128 * 256 * 4)
	WSK(192, 5, 2, r, 0)
};
static const int NK = sizeof(kerns) / sizeof(kerns[0]);

static void launch(const kern& k, float* C, const unsigned short* A, const unsigned short* W, long long M, long long N, long long ld) {
	const long long grid = ((M + k.rows - 1) / k.rows) * ((N + k.cols - 1) / k.cols);
	k.fn<<<(unsigned)grid, k.threads, k.smem>>>(C, A, W, M, N, ld);
}

int main(int argc, char** argv) {
	// wgemm-check [iterations [shape]]: shape i alone (for a profiler).
	int iters = argc > 1 ? atoi(argv[1]) : 20, only = argc > 2 ? atoi(argv[2]) : -1;
	for (int i = 0; i < NK; i++) CK(cudaFuncSetAttribute(kerns[i].fn, cudaFuncAttributeMaxDynamicSharedMemorySize, kerns[i].smem));
	cublasHandle_t hb;
	cublasCreate(&hb);
	struct shape {
		long long M, N, K;
		bool timed;
	} shapes[] = {
		{300, 200, 1088, false}, {257, 131, 64, false}, {1000, 4096, 3072, false}, {2048, 6144, 4096, true},
		{8192, 4096, 4096, true}, {8192, 28672, 4096, true}, {8192, 4096, 14336, true},
	};
	int bad = 0;
	uint64_t st = 0x9E3779B97F4A7C15ull;
	auto next = [&]() { st ^= st << 13, st ^= st >> 7, st ^= st << 17; return st; };
	auto uni = [&]() { return (float)((double)(next() >> 11) * 0x1p-53 * 2 - 1); };
	for (int si = 0; si < (int)(sizeof(shapes) / sizeof(shapes[0])); si++) {
		const shape& s = shapes[si];
		if (only >= 0 && si != only) continue;
		const long long M = s.M, N = s.N, K = s.K, ld = (K + 63) / 64 * 64;
		std::vector<unsigned short> A(M * ld, 0), Wl(N * ld, 0), Wp(N * ld, 0);
		for (long long r = 0; r < M; r++)
			for (long long c = 0; c < K; c++) A[r * ld + c] = hbf16(uni() * ldexpf(1, (int)(next() % 9) - 4));
		for (long long r = 0; r < N; r++)
			for (long long c = 0; c < K; c++) Wl[r * ld + c] = hbf16(uni() * 0.05f);
		for (long long r = 0; r < N; r++)
			for (long long p = 0; p < ld; p++) Wp[r * ld + p] = Wl[r * ld + hperm(p)];
		unsigned short *dA, *dW, *dWl;
		float* dC[NK + 1];
		CK(cudaMalloc(&dA, A.size() * 2));
		CK(cudaMalloc(&dW, Wp.size() * 2));
		CK(cudaMalloc(&dWl, Wl.size() * 2));
		CK(cudaMemcpy(dA, A.data(), A.size() * 2, cudaMemcpyHostToDevice));
		CK(cudaMemcpy(dW, Wp.data(), Wp.size() * 2, cudaMemcpyHostToDevice));
		CK(cudaMemcpy(dWl, Wl.data(), Wl.size() * 2, cudaMemcpyHostToDevice));
		for (int i = 0; i <= NK; i++) {
			CK(cudaMalloc(&dC[i], M * N * 4));
			CK(cudaMemset(dC[i], 0xff, M * N * 4)); // NaN: an output never written shows
		}
		for (int i = 0; i < NK; i++) launch(kerns[i], dC[i], dA, dW, M, N, ld);
		CK(cudaGetLastError());
		CK(cudaDeviceSynchronize());
		std::vector<float> ref(M * N), got(M * N);
		CK(cudaMemcpy(ref.data(), dC[0], M * N * 4, cudaMemcpyDeviceToHost));
		printf("M %lld N %lld K %lld:\n", M, N, K);
		for (int i = 1; i < NK; i++) {
			CK(cudaMemcpy(got.data(), dC[i], M * N * 4, cudaMemcpyDeviceToHost));
			long long diff = 0, first = -1;
			for (long long j = 0; j < M * N; j++)
				if (memcmp(&ref[j], &got[j], 4) != 0) {
					if (first < 0) first = j;
					diff++;
				}
			printf("  %-24s %s: %lld of %lld outputs differ", kerns[i].name, diff ? "DIFFERS" : "bit-equal", diff, M * N);
			if (first >= 0) printf(" (first: token %lld feature %lld: %.9g vs %.9g)", first / N, first % N, got[first], ref[first]);
			printf("\n");
			bad += diff != 0;
		}
		if (!s.timed) goto done;
		{
			cudaEvent_t e0, e1;
			cudaEventCreate(&e0);
			cudaEventCreate(&e1);
			const double flop = 2.0 * M * N * K;
			for (int i = 0; i <= NK; i++) {
				auto run = [&]() {
					if (i < NK) {
						launch(kerns[i], dC[i], dA, dW, M, N, ld);
					} else {
						// cuBLAS: C^T (N × M, column major) = W (logical) · A^T.
						const float one = 1, zero = 0;
						cublasGemmEx(hb, CUBLAS_OP_T, CUBLAS_OP_N, (int)N, (int)M, (int)ld, &one, dWl, CUDA_R_16BF, (int)ld, dA,
							CUDA_R_16BF, (int)ld, &zero, dC[NK], CUDA_R_32F, (int)N, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
					}
				};
				run();
				cudaEventRecord(e0);
				for (int it = 0; it < iters; it++) run();
				cudaEventRecord(e1);
				CK(cudaEventSynchronize(e1));
				float ms;
				cudaEventElapsedTime(&ms, e0, e1);
				ms /= iters;
				printf("  %-24s %8.3f ms  %6.1f TFLOP/s\n", i < NK ? kerns[i].name : "cuBLAS (bf16, f32 out)", ms, flop / ms / 1e9);
			}
		}
	done:
		cudaFree(dA), cudaFree(dW), cudaFree(dWl);
		for (int i = 0; i <= NK; i++) cudaFree(dC[i]);
	}
	printf(bad ? "wgemm-check: %d kernel/shape pairs differ from mma.sync\n" : "wgemm-check: every output bit-equal to mma.sync\n", bad);
	return bad != 0;
}
