// mma.cuh: the sm_80+ tensor-core and asynchronous-copy primitives the fast
// kernels (mla_decode.cu, gemm_tc.cu) are written with: cp.async into shared
// memory, ldmatrix, and mma.sync m16n8k16 with bf16 inputs and float32
// accumulators. Fragment layouts (PTX ISA, "Matrix fragments for mma.m16n8k16"),
// with g = lane / 4 and t = lane % 4:
//   A (16 × 16, row major): a0 (row g, cols 2t, 2t+1), a1 (row g+8, the same
//       cols), a2 (row g, cols 2t+8, 2t+9), a3 (row g+8, cols 2t+8, 2t+9)
//   B (16 × 8, k × n): b0 (k 2t, 2t+1; n g), b1 (k 2t+8, 2t+9; n g)
//   C (16 × 8): c0, c1 (row g, cols 2t, 2t+1), c2, c3 (row g+8, the same cols)
// A register holds two bf16 values, the lower index in its low half.
#pragma once

__device__ __forceinline__ unsigned smem_addr(const void* p) { return (unsigned)__cvta_generic_to_shared(p); }

// cp_async16 copies 16 bytes global -> shared without passing through
// registers (cached in L2 only).
__device__ __forceinline__ void cp_async16(void* dst, const void* src) {
	asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(smem_addr(dst)), "l"(src));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
// cp_async_wait waits until at most N committed groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

// ldsm_x4 loads four 8 × 8 bf16 matrices; lanes 8i..8i+7 give the row
// addresses of matrix i, and r[i] is this lane's fragment of matrix i
// (row lane/4, cols 2(lane%4), +1; with .trans, rows 2(lane%4), +1 of col lane/4).
__device__ __forceinline__ void ldsm_x4(unsigned* r, const void* p) {
	asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
		: "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(smem_addr(p)));
}
__device__ __forceinline__ void ldsm_x4_trans(unsigned* r, const void* p) {
	asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
		: "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(smem_addr(p)));
}

// lds128 loads 16 bytes of shared memory into four registers.
__device__ __forceinline__ void lds128(unsigned* r, const void* p) {
	asm volatile("ld.shared.v4.u32 {%0,%1,%2,%3}, [%4];\n" : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(smem_addr(p)));
}

// ldg_stream loads 16 bytes of read-only global memory that is read once
// (a weight streamed by a decode matmul): not kept in L1. Not volatile:
// the memory never changes while a kernel runs, so the compiler may move it.
__device__ __forceinline__ uint4 ldg_stream(const void* p) {
	uint4 v;
	asm("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];\n"
		: "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
	return v;
}

// ldg_stream64 is ldg_stream's 8-byte load.
__device__ __forceinline__ uint2 ldg_stream64(const void* p) {
	uint2 v;
	asm("ld.global.nc.L1::no_allocate.v2.u32 {%0,%1}, [%2];\n" : "=r"(v.x), "=r"(v.y) : "l"(p));
	return v;
}

// mma_bf16: c += a · b, one m16n8k16 tile.
__device__ __forceinline__ void mma_bf16(float* c, const unsigned* a, unsigned b0, unsigned b1) {
	asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
		: "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
		: "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// bf16_rne rounds a finite float to bf16 (to nearest, ties to even).
__device__ __forceinline__ unsigned bf16_rne(float f) {
	unsigned u = __float_as_uint(f);
	return (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
}
__device__ __forceinline__ float bf16_float(unsigned h) { return __uint_as_float(h << 16); }
// to_bf16 rounds any float to bf16 as kvx_to_bf16 does: to nearest, ties
// to even, a NaN kept a (quiet) NaN. Every kernel that hands the fast
// matmul a bf16 copy of its output rounds with it, so the copy is the one
// kvx_to_bf16 would make.
__device__ __forceinline__ unsigned short to_bf16(float f) {
	const unsigned u = __float_as_uint(f);
	return (u & 0x7fffffffu) > 0x7f800000u ? (unsigned short)((u >> 16) | 0x40u) : (unsigned short)bf16_rne(f);
}
// pack_bf16 packs two floats (lo at the lower index) into one register.
__device__ __forceinline__ unsigned pack_bf16(float lo, float hi) { return bf16_rne(lo) | (bf16_rne(hi) << 16); }
