//go:build cuda && cgo

package cuda

/*
#include <cuda.h>
*/
import "C"

import (
	"fmt"
	"sync"
)

// bigShared records the kernels whose dynamic shared memory limit has been
// raised, per context.
var bigShared struct {
	sync.Mutex
	done map[*gpu]map[string]int
	// resident is residentBlocks' answers, per context and launch shape.
	resident map[*gpu]map[residentKey]int
}

type residentKey struct {
	name           string
	threads, shmem int
}

// allowShared raises kernel name's dynamic shared memory limit to bytes
// (above the 48 KiB a launch may use by default; sm_90 allows up to 227
// KiB), once per context. cu has no cuFuncSetAttribute, so this calls the
// driver itself. The caller must be on the context's goroutine.
func (g *gpu) allowShared(name string, bytes int) error {
	bigShared.Lock()
	defer bigShared.Unlock()
	if bigShared.done == nil {
		bigShared.done = map[*gpu]map[string]int{}
	}
	if bigShared.done[g][name] >= bytes {
		return nil
	}
	fn, ok := g.fns[name]
	if !ok {
		return fmt.Errorf("cuda: no kernel %s in the embedded PTX", name)
	}
	if r := C.cuFuncSetAttribute(cfn(fn), C.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, C.int(bytes)); r != C.CUDA_SUCCESS {
		return fmt.Errorf("cuda: %s: allow %d bytes of shared memory: CUresult %d", name, bytes, int(r))
	}
	if bigShared.done[g] == nil {
		bigShared.done[g] = map[string]int{}
	}
	bigShared.done[g][name] = bytes
	return nil
}

// runShared is run for a kernel that needs more than 48 KiB of dynamic
// shared memory.
func (o *ops) runShared(name string, grid, block dim, shmem int, args ...any) {
	if o.err != nil {
		return
	}
	o.fail(o.g.allowShared(name, shmem))
	o.run(name, grid, block, shmem, args...)
}

// residentBlocks is how many blocks of kernel name (threads each, shmem
// bytes of dynamic shared memory, which allowShared has allowed) one
// multiprocessor holds at once, as the driver's occupancy calculator says;
// asked once per context and shape. The caller must be on the context's
// goroutine.
func (g *gpu) residentBlocks(name string, threads, shmem int) (int, error) {
	bigShared.Lock()
	defer bigShared.Unlock()
	key := residentKey{name, threads, shmem}
	if n, ok := bigShared.resident[g][key]; ok {
		return n, nil
	}
	fn, ok := g.fns[name]
	if !ok {
		return 0, fmt.Errorf("cuda: no kernel %s in the embedded PTX", name)
	}
	var n C.int
	if r := C.cuOccupancyMaxActiveBlocksPerMultiprocessor(&n, cfn(fn), C.int(threads), C.size_t(shmem)); r != C.CUDA_SUCCESS {
		return 0, fmt.Errorf("cuda: %s: resident blocks of %d threads and %d bytes of shared memory: CUresult %d", name, threads, shmem, int(r))
	}
	if n < 1 {
		return 0, fmt.Errorf("cuda: %s: no block of %d threads and %d bytes of shared memory fits a multiprocessor", name, threads, shmem)
	}
	if bigShared.resident == nil {
		bigShared.resident = map[*gpu]map[residentKey]int{}
	}
	if bigShared.resident[g] == nil {
		bigShared.resident[g] = map[residentKey]int{}
	}
	bigShared.resident[g][key] = int(n)
	return int(n), nil
}
