// Block copies: one thread block per (src, dst) pair, 16-byte words where
// both addresses and the size allow, bytes otherwise. Pools of the host tier
// are pinned, device-mapped host memory, so the same kernel moves blocks
// device->device, device->host and host->device; a launch carries a whole
// batch of copies (a 16 KiB block is not its own transfer).

extern "C" __global__ void kvx_copy_blocks(const unsigned long long* pairs, long long size) {
	const char* src = (const char*)pairs[2 * blockIdx.x];
	char* dst = (char*)pairs[2 * blockIdx.x + 1];
	if ((((unsigned long long)src | (unsigned long long)dst | (unsigned long long)size) & 15) == 0) {
		const int4* s = (const int4*)src;
		int4* d = (int4*)dst;
		long long n = size / 16;
		for (long long i = threadIdx.x; i < n; i += blockDim.x) {
			d[i] = s[i];
		}
		return;
	}
	for (long long i = threadIdx.x; i < size; i += blockDim.x) {
		dst[i] = src[i];
	}
}

// kvx_fault_store writes to addr, which the fault injection (CUDA_KVX_FAULT,
// fault.go) gives as an address nothing is mapped at: the launch ends in an
// illegal address, the error after which a context is lost.
extern "C" __global__ void kvx_fault_store(unsigned long long addr) {
	*(volatile float*)addr = 1.0f;
}
