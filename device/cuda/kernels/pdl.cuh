// pdl.cuh: programmatic dependent launch (sm_90). gpu.go launches a kernel
// whose PTX has griddepcontrol.wait with the programmatic stream
// serialization attribute: it may start while the kernel before it in the
// stream still runs, and must not touch memory that kernel writes or reads
// before pdl_wait returns. Weights, which no kernel of a step writes, may
// be loaded before it (the matmuls do: their first weight loads overlap the
// end of the kernel before). Launched without the attribute, or first in
// the stream, both calls return at once.
#pragma once

// pdl_wait waits until the grids this one depends on have finished and
// their writes are visible, then lets the next kernel in the stream launch
// (its blocks wait in their own pdl_wait until this grid has finished).
// Every thread of a block calls it before its first load or store of
// activations; a block that exits without touching memory need not.
__device__ __forceinline__ void pdl_wait() {
	asm volatile("griddepcontrol.wait;\n" ::: "memory");
	asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
}
