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
