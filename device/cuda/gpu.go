//go:build cuda && cgo

package cuda

/*
#cgo LDFLAGS: -lcuda
#include <cuda.h>
#include <string.h>

// kvx_launch launches f with n arguments (copied by the driver before it
// returns): argument i's bytes start at vals[offs[i]] (at vals[i] when
// offs is NULL: every argument 8 bytes), as a programmatic dependent of the
// kernel before it in the stream when pdl is not 0 (kernels/pdl.cuh).
static CUresult kvx_launch(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
		unsigned smem, CUstream s, unsigned long long* vals, const int* offs, int n, int pdl) {
	void* args[64];
	if (n > 64) return CUDA_ERROR_INVALID_VALUE;
	for (int i = 0; i < n; i++) args[i] = &vals[offs ? offs[i] : i];
	if (!pdl) return cuLaunchKernel(f, gx, gy, gz, bx, by, bz, smem, s, args, NULL);
	CUlaunchAttribute a;
	memset(&a, 0, sizeof a);
	a.id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
	a.value.programmaticStreamSerializationAllowed = 1;
	CUlaunchConfig c;
	memset(&c, 0, sizeof c);
	c.gridDimX = gx, c.gridDimY = gy, c.gridDimZ = gz;
	c.blockDimX = bx, c.blockDimY = by, c.blockDimZ = bz;
	c.sharedMemBytes = smem;
	c.hStream = s;
	c.attrs = &a;
	c.numAttrs = 1;
	return cuLaunchKernelEx(&c, f, args, NULL);
}

// cuTensorMapEncodeTiled (CUDA 12; this cuda.h is 11.8's, so its type and
// the enumerators used here are written out), looked up in the driver once.
typedef CUresult (*kvx_encode_fn)(void*, int, cuuint32_t, void*, const cuuint64_t*, const cuuint64_t*, const cuuint32_t*,
	const cuuint32_t*, int, int, int, int);
static kvx_encode_fn kvx_encode;

// kvx_tmap_encode writes into out (128 bytes) the tensor map of a bf16
// matrix of rows × ld at p (row stride ld) with boxes of 64 × box rows and
// the 128-byte swizzle, zeros past the rows (sm90a/fgemm_wg.cu's TMA).
static CUresult kvx_tmap_encode(void* out, CUdeviceptr p, unsigned long long rows, unsigned long long ld, unsigned box) {
	if (!kvx_encode) {
		void* fn = NULL;
		CUresult r = cuGetProcAddress("cuTensorMapEncodeTiled", &fn, 12000, 0);
		if (r != CUDA_SUCCESS) return r;
		if (!fn) return CUDA_ERROR_NOT_FOUND;
		kvx_encode = (kvx_encode_fn)fn;
	}
	cuuint64_t dims[2] = {ld, rows}, strides[1] = {ld * 2};
	cuuint32_t boxes[2] = {64, box}, elems[2] = {1, 1};
	// BFLOAT16 = 9, INTERLEAVE_NONE = 0, SWIZZLE_128B = 3, L2_PROMOTION_L2_256B = 3, FLOAT_OOB_FILL_NONE = 0.
	return kvx_encode(out, 9, 2, (void*)p, dims, strides, boxes, elems, 0, 3, 3, 0);
}
*/
import "C"

import (
	"embed"
	"fmt"
	"io/fs"
	"math"
	"os"
	"path"
	"runtime"
	"strings"
	"unsafe"

	"gorgonia.org/cu"
)

// Built reports whether this binary has the cuda device (the cuda build tag).
const Built = true

//go:embed ptx/*.ptx ptx/sm90a/*.ptx
var ptxFS embed.FS

// gpu is one CUDA context on one OS-locked goroutine. Every cu call runs on
// that goroutine (do); the functions of the embedded PTX modules are looked
// up by name once. Errors of asynchronous work (a kernel that faults) are
// sticky in CUDA itself: sync reports them.
type gpu struct {
	calls  chan func()
	dev    cu.Device
	ctx    cu.CUContext
	name   string
	mods   []cu.Module
	fns    map[string]cu.Function
	stream cu.Stream   // the null stream: launches and copies run in issue order
	prof   *kernelProf // CUDA_KVX_PROFILE's kernel timer, or nil
	// pdl is the kernels launched as programmatic dependents of the kernel
	// before them (their PTX waits for it: ptxKernels); nil when that is
	// off (CUDA_KVX_PDL=0, or the kernel profile's events between launches).
	pdl map[string]bool
	// slots is launch's argument buffer and offs each argument's first
	// slot, reused by every launch (the driver copies the arguments before
	// the launch returns).
	slots []uint64
	offs  []C.int
	// sms is the device's multiprocessors (the stream matmul's grid).
	sms int
	// wmaps is the weights' tensor maps for the stream matmul (weightMap).
	wmaps map[weightMapKey]tensorMap
}

// tensorMap is a CUtensorMap (128 bytes), a kernel argument of the TMA
// kernels (sm90a/fgemm_wg.cu's kvx_tmap).
type tensorMap [16]uint64

// bf16Map returns the tensor map of a bf16 matrix of rows × ld at p with
// boxes of 64 × box rows (kvx_tmap_encode).
func bf16Map(p cu.DevicePtr, rows, ld, box int) (tensorMap, error) {
	var m tensorMap
	r := C.kvx_tmap_encode(unsafe.Pointer(&m[0]), C.CUdeviceptr(p), C.ulonglong(rows), C.ulonglong(ld), C.uint(box))
	if err := cuError(r); err != nil {
		return m, fmt.Errorf("cuda: tensor map of %d × %d bf16 (box %d rows): %w", rows, ld, box, err)
	}
	return m, nil
}

// newGPU makes a context on device ordinal and loads the kernels.
func newGPU(ordinal int) (*gpu, error) {
	g := &gpu{calls: make(chan func()), fns: map[string]cu.Function{}, prof: newKernelProf()}
	if g.prof == nil && os.Getenv(pdlEnv) != "0" {
		g.pdl = map[string]bool{}
	}
	started := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // the context is current on this thread only
		started <- g.init(ordinal)
		for f := range g.calls {
			f()
		}
	}()
	if err := <-started; err != nil {
		return nil, err
	}
	return g, nil
}

func (g *gpu) init(ordinal int) error {
	var err error
	if g.dev, err = cu.GetDevice(ordinal); err != nil {
		return fmt.Errorf("cuda device %d: %w", ordinal, err)
	}
	if g.name, err = g.dev.Name(); err != nil {
		return fmt.Errorf("cuda device %d name: %w", ordinal, err)
	}
	if g.ctx, err = g.dev.MakeContext(cu.SchedAuto); err != nil {
		return fmt.Errorf("cuda device %d (%s): context: %w", ordinal, g.name, err)
	}
	// ptx/sm90a's kernels (wgmma) are for compute capability 9.0 alone: the
	// driver cannot compile them for another device.
	major, minor, err := g.dev.ComputeCapability()
	if err != nil {
		return fmt.Errorf("cuda device %d (%s): compute capability: %w", ordinal, g.name, err)
	}
	if d := os.Getenv(ptxEnv); d != "" {
		fmt.Fprintf(os.Stderr, "cuda: kernels from %s/ptx (%s), not the embedded PTX\n", d, ptxEnv)
	}
	var sms C.int
	if r := C.cuDeviceGetAttribute(&sms, C.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, C.CUdevice(g.dev)); r != C.CUDA_SUCCESS {
		return fmt.Errorf("cuda device %d (%s): multiprocessors: %w", ordinal, g.name, cuError(r))
	}
	g.sms = int(sms)
	dirs := []string{"ptx"}
	if major == 9 && minor == 0 {
		dirs = append(dirs, "ptx/sm90a")
	}
	for _, dir := range dirs {
		if err := g.load(dir); err != nil {
			return err
		}
	}
	return nil
}

// ptxEnv names a directory whose ptx/ and ptx/sm90a/ replace the embedded
// PTX (the layout of device/cuda): for trying kernels compiled on the GPU
// machine (make ptx, scripts/ptx-sm90a.sh) without rebuilding the Go
// binaries. The device says so on stderr when it is set.
const ptxEnv = "CUDA_KVX_PTX"

// ptxSource is where the PTX modules are read from: the embedded ones, or
// ptxEnv's directory.
func ptxSource() fs.FS {
	if d := os.Getenv(ptxEnv); d != "" {
		return os.DirFS(d)
	}
	return ptxFS
}

// load loads every PTX module of directory dir (of ptxSource) and looks up
// its kernels.
func (g *gpu) load(dir string) error {
	src := ptxSource()
	files, err := fs.ReadDir(src, dir)
	if err != nil {
		return fmt.Errorf("cuda: PTX directory %s: %w", dir, err)
	}
	for _, f := range files {
		if !strings.HasSuffix(f.Name(), ".ptx") {
			continue
		}
		name := path.Join(dir, f.Name())
		text, err := fs.ReadFile(src, name)
		if err != nil {
			return err
		}
		mod, err := cu.LoadData(string(text))
		if err != nil {
			return fmt.Errorf("cuda: load %s: %w", name, err)
		}
		g.mods = append(g.mods, mod)
		if err := setExpMode(mod); err != nil {
			return fmt.Errorf("cuda: %s: %w", name, err)
		}
		names, waits := ptxKernels(string(text))
		for _, fn := range names {
			h, err := mod.Function(fn)
			if err != nil {
				return fmt.Errorf("cuda: %s: function %s: %w", name, fn, err)
			}
			if _, dup := g.fns[fn]; dup {
				return fmt.Errorf("cuda: kernel %s is defined twice (%s)", fn, name)
			}
			g.fns[fn] = h
			if waits[fn] && g.pdl != nil {
				g.pdl[fn] = true
			}
		}
	}
	return nil
}

// setExpMode writes the path of this process's math.Exp into the module's
// kvx_exp_fma (kernels/gomath.cuh), when it has one.
func setExpMode(mod cu.Module) error {
	p, size, err := mod.Global("kvx_exp_fma")
	if err != nil || size != 8 {
		return nil // the module does not include gomath.cuh
	}
	mode, err := goExpMode()
	if err != nil {
		return err
	}
	return upload(p, []int64{int64(mode)})
}

// do runs f on the context's goroutine and returns its error.
func (g *gpu) do(f func() error) error {
	done := make(chan error, 1)
	g.calls <- func() { done <- f() }
	return <-done
}

// close destroys the context and ends the goroutine.
func (g *gpu) close() error {
	err := g.do(func() error { return g.ctx.Destroy() })
	close(g.calls)
	return err
}

// sync waits for all issued work and returns the first error of any of it.
func (g *gpu) sync() error {
	if err := cu.Synchronize(); err != nil {
		return fmt.Errorf("cuda: %w", err)
	}
	return nil
}

// dim is a launch's grid or block shape.
type dim struct{ x, y, z int }

// launch runs kernel name on the context's goroutine (the caller must be
// on it). Arguments: cu.DevicePtr, int, int64 (a kernel's long long), float32
// (a kernel's float), each passed as 8 bytes (smaller scalars travel in the
// low bytes of a 64-bit slot), and tensorMap (128 bytes).
func (g *gpu) launch(name string, grid, block dim, shmem int, args ...any) error {
	fn, ok := g.fns[name]
	if !ok {
		return fmt.Errorf("cuda: no kernel %s in the embedded PTX", name)
	}
	slots, offs := g.slots[:0], g.offs[:0]
	wide := false // an argument of more than 8 bytes
	for i, a := range args {
		offs = append(offs, C.int(len(slots)))
		switch v := a.(type) {
		case cu.DevicePtr:
			slots = append(slots, uint64(v))
		case int:
			slots = append(slots, uint64(int64(v)))
		case int64:
			slots = append(slots, uint64(v))
		case float32:
			slots = append(slots, uint64(math.Float32bits(v)))
		case tensorMap:
			slots = append(slots, v[:]...)
			wide = true
		default:
			panic(fmt.Sprintf("cuda: launch %s: argument %d of type %T", name, i, a))
		}
	}
	g.slots, g.offs = slots, offs
	if grid.x <= 0 || grid.y <= 0 || grid.z <= 0 {
		return nil // nothing to do (an empty tensor)
	}
	pdl := 0
	if g.pdl[name] {
		pdl = 1
	}
	var vals *C.ulonglong
	if len(slots) > 0 {
		vals = (*C.ulonglong)(unsafe.Pointer(&slots[0]))
	}
	var offp *C.int
	if wide {
		offp = &offs[0]
	}
	run := func() error {
		r := C.kvx_launch(cfn(fn), C.uint(grid.x), C.uint(grid.y), C.uint(grid.z), C.uint(block.x), C.uint(block.y),
			C.uint(block.z), C.uint(shmem), nil, vals, offp, C.int(len(args)), C.int(pdl))
		return cuError(r)
	}
	var err error
	if g.prof != nil {
		err = g.prof.around(name, g.stream, run)
	} else {
		err = run()
	}
	if err != nil {
		return fmt.Errorf("cuda: launch %s grid %v block %v: %w", name, grid, block, err)
	}
	return nil
}

// cfn is fn's driver handle (cu.Function is a struct holding just it).
func cfn(fn cu.Function) C.CUfunction {
	var _ [unsafe.Sizeof(fn) - unsafe.Sizeof(C.CUfunction(nil))]struct{}
	var _ [unsafe.Sizeof(C.CUfunction(nil)) - unsafe.Sizeof(fn)]struct{}
	return *(*C.CUfunction)(unsafe.Pointer(&fn))
}

// cuError is the error of a driver call's result, nil on success.
func cuError(r C.CUresult) error {
	if r == C.CUDA_SUCCESS {
		return nil
	}
	e := &resultError{code: int(r)}
	var name *C.char
	if C.cuGetErrorName(r, &name) == C.CUDA_SUCCESS && name != nil {
		e.name = C.GoString(name)
	}
	return e
}

// alloc returns n bytes of device memory (never managed memory).
func (g *gpu) alloc(n int64) (cu.DevicePtr, error) {
	if n <= 0 {
		n = 1
	}
	p, err := cu.MemAlloc(n)
	if err != nil {
		return 0, fmt.Errorf("cuda: allocate %d bytes of device memory: %w", n, err)
	}
	return p, nil
}

// allocHost returns n bytes of pinned, device-mapped host memory and the
// address kernels read and write it at (on a unified-addressing context,
// the host address itself).
func (g *gpu) allocHost(n int64) (unsafe.Pointer, cu.DevicePtr, error) {
	if n <= 0 {
		n = 1
	}
	var p unsafe.Pointer
	if r := C.cuMemHostAlloc(&p, C.size_t(n), C.CU_MEMHOSTALLOC_DEVICEMAP|C.CU_MEMHOSTALLOC_PORTABLE); r != C.CUDA_SUCCESS {
		return nil, 0, fmt.Errorf("cuda: allocate %d bytes of pinned host memory: CUresult %d", n, int(r))
	}
	var d C.CUdeviceptr
	if r := C.cuMemHostGetDevicePointer(&d, p, 0); r != C.CUDA_SUCCESS {
		C.cuMemFreeHost(p)
		return nil, 0, fmt.Errorf("cuda: device address of %d bytes of pinned host memory: CUresult %d", n, int(r))
	}
	return p, cu.DevicePtr(d), nil
}

func (g *gpu) freeHost(p unsafe.Pointer) { C.cuMemFreeHost(p) }

// memInfo returns the device's free and total memory as the driver sees it.
func (g *gpu) memInfo() (free, total int64, err error) { return cu.MemInfo() }

// upload copies host bytes to device memory.
func upload[T any](dst cu.DevicePtr, src []T) error {
	if len(src) == 0 {
		return nil
	}
	n := int64(len(src)) * int64(unsafe.Sizeof(src[0]))
	if err := cu.MemcpyHtoD(dst, unsafe.Pointer(&src[0]), n); err != nil {
		return fmt.Errorf("cuda: copy %d bytes to the device: %w", n, err)
	}
	return nil
}

// download copies device memory to host.
func download[T any](dst []T, src cu.DevicePtr) error {
	if len(dst) == 0 {
		return nil
	}
	n := int64(len(dst)) * int64(unsafe.Sizeof(dst[0]))
	if err := cu.MemcpyDtoH(unsafe.Pointer(&dst[0]), src, n); err != nil {
		return fmt.Errorf("cuda: copy %d bytes from the device: %w", n, err)
	}
	return nil
}
