// wgemm-check.cu: the TMA + wgmma tiled matmul (device/cuda/sm90a/
// fgemm_wg.cu) and a few decode kernels against the mma.sync tiled one
// (device/cuda/kernels/fgemm.cu's wide256s3s) on the GPU machine, without
// Go: bit equality of every output, then each tiled kernel's rate and
// cuBLAS's at Llama-3-8B's prefill shapes. Run from the repository root on the GPU
// machine (a device call over the working tree; it needs no bundle):
//   nvcc -O3 -gencode arch=compute_90a,code=sm_90a -fmad=false -Idevice/cuda/kernels \
//     scripts/wgemm-check.cu -lcublas -lcuda -o /tmp/wgemm-check && /tmp/wgemm-check [iterations [shape]]
// It exits 1 when any output differs from the mma.sync kernel's.
#include <cstdio>
#include <cstdlib>
#include <cstdint>
#include <cstring>
#include <cmath>
#include <vector>
#include <cuda_runtime.h>
#include <cublas_v2.h>
#include <cuda.h>

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
// tmap is the tensor map of a bf16 matrix of rows × ld (row stride ld) with
// a box of 64 × boxRows and the 128-byte swizzle, as fgemm.go makes it.
static kvx_tmap tmap(const unsigned short* p, long long rows, long long ld, int boxRows) {
	kvx_tmap t;
	cuuint64_t dims[2] = {(cuuint64_t)ld, (cuuint64_t)rows}, strides[1] = {(cuuint64_t)ld * 2};
	cuuint32_t box[2] = {64, (cuuint32_t)boxRows}, es[2] = {1, 1};
	CUresult r = cuTensorMapEncodeTiled((CUtensorMap*)&t, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, (void*)p, dims, strides, box, es,
		CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
	if (r != CUDA_SUCCESS) {
		printf("cuTensorMapEncodeTiled: %d\n", (int)r);
		exit(1);
	}
	return t;
}

typedef void (*wideFn)(float*, const unsigned short*, const unsigned short*, long long, long long, long long);
typedef void (*tmaFn)(const kvx_tmap, const kvx_tmap, float*, long long, long long, long long);
typedef void (*skinnyFn)(const unsigned short*, long long, long long, float*, const unsigned short*, long long, float*,
	const unsigned short*, long long, float*, const unsigned short*, long long);
typedef void (*splitFn)(const unsigned short*, long long, long long, float*, const unsigned short*, long long, float*,
	const unsigned short*, long long, float*, const unsigned short*, long long, float*);

struct kern {
	const char* name;
	wideFn wide;
	tmaFn tma;
	skinnyFn skinny; // a direct or ring kernel (mt m16 tiles, wc column warps, wk k slots)
	splitFn split;   // a split kernel (nw n8 tiles a warp), then kvx_fgemm_fold
	int rows, cols, threads, smem, maxM;
	bool tsplit; // a split TMA kernel: one part a block, then kvx_fgemm_fold
};

#define SK_SMEM(MT, WC, WK, BK, ST, NW) ((WK) * (ST) * (16 * (MT) + 8 * (WC) * ((NW) > 0 ? (NW) : 1)) * (BK) * 2 + ((WK) - 1) * (MT) * (WC) * 32 * 4 * 4)
static kern kerns[] = {
	{"wide256s3s (mma.sync)", kvx_fgemm_wide256s3s, 0, 0, 0, 256, 128, 256, 3 * (256 + 128) * 32 * 2 + 256 * 128 * 4, 1 << 30},
	{"tma128s4 (wgmma)", 0, kvx_fgemm_tma128s4, 0, 0, 128, 128, 384, 4 * (128 + 128) * 64 * 2 + 16 * 4 + 1024, 1 << 30},
	{"tma128s6 (wgmma)", 0, kvx_fgemm_tma128s6, 0, 0, 128, 128, 384, 6 * (128 + 128) * 64 * 2 + 16 * 6 + 1024, 1 << 30},
	{"tmap128s4 (wgmma split)", 0, kvx_fgemm_tmap128s4, 0, 0, 128, 128, 384, 4 * (128 + 128) * 64 * 2 + 16 * 4 + 1024, 1 << 30, true},
	{"tmap64s6 (wgmma split)", 0, kvx_fgemm_tmap64s6, 0, 0, 64, 128, 256, 6 * (64 + 128) * 64 * 2 + 16 * 6 + 1024, 1 << 30, true},
	{"tmap64s8 (wgmma split)", 0, kvx_fgemm_tmap64s8, 0, 0, 64, 128, 256, 8 * (64 + 128) * 64 * 2 + 16 * 8 + 1024, 1 << 30, true},
	{"gemv1c2k4u4 (direct)", 0, 0, kvx_fgemm_gemv1c2k4u4, 0, 16, 16, 256, SK_SMEM(1, 2, 4, 0, 0, 0), 16},
	{"gemv2c2k4u4 (direct)", 0, 0, kvx_fgemm_gemv2c2k4u4, 0, 32, 16, 256, SK_SMEM(2, 2, 4, 0, 0, 0), 64},
	{"skinny1c2k4b64s4 (ring)", 0, 0, kvx_fgemm_skinny1c2k4b64s4, 0, 16, 16, 256, SK_SMEM(1, 2, 4, 64, 4, 0), 64},
	{"split4c4n2b64s4", 0, 0, 0, kvx_fgemm_split4c4n2b64s4, 64, 64, 128, SK_SMEM(4, 4, 1, 64, 4, 2), 1 << 30},
};
static const int NK = sizeof(kerns) / sizeof(kerns[0]);

static void launch(const kern& k, float* C, const unsigned short* A, const unsigned short* W, long long M, long long N, long long ld,
	float* P) {
	const unsigned gx = (unsigned)((M + k.rows - 1) / k.rows), gy = (unsigned)((N + k.cols - 1) / k.cols);
	if (k.wide) {
		k.wide<<<gx * gy, k.threads, k.smem>>>(C, A, W, M, N, ld);
	} else if (k.tma && k.tsplit) {
		const long long parts = (ld + 1023) / 1024;
		k.tma<<<dim3(gx * gy, (unsigned)parts), k.threads, k.smem>>>(tmap(A, M, ld, k.rows), tmap(W, N, ld, k.cols), P, M, N, ld);
		kvx_fgemm_fold<<<1024, 256>>>(P, parts, M, C, N, 0, 0, 0, 0);
	} else if (k.tma) {
		k.tma<<<gx * gy, k.threads, k.smem>>>(tmap(A, M, ld, k.rows), tmap(W, N, ld, k.cols), C, M, N, ld);
	} else if (k.skinny) {
		k.skinny<<<dim3(gx, gy), k.threads, k.smem>>>(A, M, ld, C, W, N, 0, W, 0, 0, W, 0);
	} else {
		const long long parts = (ld + 1023) / 1024;
		k.split<<<dim3(gx, gy, (unsigned)parts), k.threads, k.smem>>>(A, M, ld, C, W, N, 0, W, 0, 0, W, 0, P);
		kvx_fgemm_fold<<<1024, 256>>>(P, parts, M, C, N, 0, 0, 0, 0);
	}
}

int main(int argc, char** argv) {
	// wgemm-check [iterations [shape]]: shape i alone (for a profiler).
	int iters = argc > 1 ? atoi(argv[1]) : 20, only = argc > 2 ? atoi(argv[2]) : -1;
	for (int i = 0; i < NK; i++) {
		const void* f = kerns[i].wide ? (const void*)kerns[i].wide : kerns[i].tma ? (const void*)kerns[i].tma
			: kerns[i].skinny ? (const void*)kerns[i].skinny : (const void*)kerns[i].split;
		CK(cudaFuncSetAttribute(f, cudaFuncAttributeMaxDynamicSharedMemorySize, kerns[i].smem));
	}
	cublasHandle_t hb;
	cublasCreate(&hb);
	struct shape {
		long long M, N, K;
		bool timed;
	} shapes[] = {
		{1, 4096, 4096, false}, {3, 6144, 1088, false}, {16, 200, 14336, false}, {37, 1000, 4096, false}, {64, 4096, 14336, false},
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
		std::vector<unsigned short> A(M * ld, 0), Wl(N * ld, 0);
		for (long long r = 0; r < M; r++)
			for (long long c = 0; c < K; c++) A[r * ld + c] = hbf16(uni() * ldexpf(1, (int)(next() % 9) - 4));
		for (long long r = 0; r < N; r++)
			for (long long c = 0; c < K; c++) Wl[r * ld + c] = hbf16(uni() * 0.05f);
		unsigned short *dA, *dW;
		float* dC[NK + 1];
		float* dP;
		CK(cudaMalloc(&dA, A.size() * 2));
		CK(cudaMalloc(&dW, Wl.size() * 2));
		CK(cudaMalloc(&dP, ((ld + 1023) / 1024) * M * N * 4));
		CK(cudaMemcpy(dA, A.data(), A.size() * 2, cudaMemcpyHostToDevice));
		CK(cudaMemcpy(dW, Wl.data(), Wl.size() * 2, cudaMemcpyHostToDevice));
		for (int i = 0; i <= NK; i++) {
			CK(cudaMalloc(&dC[i], M * N * 4));
			CK(cudaMemset(dC[i], 0xff, M * N * 4)); // NaN: an output never written shows
		}
		for (int i = 0; i < NK; i++)
			if (M <= kerns[i].maxM) launch(kerns[i], dC[i], dA, dW, M, N, ld, dP);
		CK(cudaGetLastError());
		CK(cudaDeviceSynchronize());
		std::vector<float> ref(M * N), got(M * N);
		CK(cudaMemcpy(ref.data(), dC[0], M * N * 4, cudaMemcpyDeviceToHost));
		printf("M %lld N %lld K %lld:\n", M, N, K);
		for (int i = 1; i < NK; i++) {
			if (M > kerns[i].maxM) continue;
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
				if (i < NK && !kerns[i].wide && (!kerns[i].tma || kerns[i].tsplit)) continue;
				auto run = [&]() {
					if (i < NK) {
						launch(kerns[i], dC[i], dA, dW, M, N, ld, dP);
					} else {
						// cuBLAS: C^T (N × M, column major) = W (logical) · A^T.
						const float one = 1, zero = 0;
						cublasGemmEx(hb, CUBLAS_OP_T, CUBLAS_OP_N, (int)N, (int)M, (int)ld, &one, dW, CUDA_R_16BF, (int)ld, dA,
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
		cudaFree(dA), cudaFree(dW), cudaFree(dP);
		for (int i = 0; i <= NK; i++) cudaFree(dC[i]);
	}
	printf(bad ? "wgemm-check: %d kernel/shape pairs differ from wide256s3s\n" : "wgemm-check: every output bit-equal to wide256s3s\n", bad);
	return bad != 0;
}
