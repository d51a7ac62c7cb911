//go:build cuda && cgo

package cuda

import (
	"fmt"
	"unsafe"

	"gorgonia.org/cu"

	"github.com/kvx-dev/kvx/device"
	"github.com/kvx-dev/kvx/device/hf"
	"github.com/kvx-dev/kvx/device/synth"
	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
	"github.com/kvx-dev/kvx/plugins/v1/worker"
)

// tensor is the cuda device's synth.Tensor: r × c float32 values, row-major
// and contiguous, in device memory at p. A weight of the fast numerics
// (bf16Weights) holds bf16 values at h instead, rows ld values apart (the
// columns padded with zeros to fgemmPad); its p is 0 until a kernel that
// takes float32 asks for it (ops.f32).
//
// An activation of the fast numerics may also carry b, its values rounded
// to bf16 (rows padded to padK(c)), written by the op that made it
// (RMSNorm, SwiGLU) for the fast matmul, which then skips rounding them
// itself. An op that changes a tensor in place drops b (dropBF16).
//
// The output of a split fast matmul may be pending (fold not nil): its
// values are the launch's parts, not yet added. cudaTensor adds them (one
// fold launch for every output of the matmul) before any op reads p; the
// ops that take the parts themselves (SwiGLU, AddRMSNorm) read t through
// unfolded instead.
//
// An output of a tiled fast matmul of two weights may be lazy (lazy not
// nil): the launch has not run, and p is 0 until it does. unfolded (and so
// cudaTensor) runs it; SwiGLU of the two outputs runs the matmul with
// SwiGLU in its epilogue instead (pendingTiled), and reads t through
// asTensor.
type tensor struct {
	p    cu.DevicePtr
	r, c int
	h    cu.DevicePtr
	ld   int
	b    cu.DevicePtr
	fold *pendingFold
	lazy *pendingTiled
}

// dropBF16 forgets t's bf16 copy: an in-place op is about to change it.
func dropBF16(t synth.Tensor) { unfolded(t).b = 0 }

func (t *tensor) Rows() int { return t.r }
func (t *tensor) Cols() int { return t.c }

// bytes is the tensor's size in bytes.
func (t *tensor) bytes() int64 { return int64(t.r) * int64(t.c) * 4 }

// row returns the address of row i.
func (t *tensor) row(i int) cu.DevicePtr { return t.p + cu.DevicePtr(int64(i)*int64(t.c)*4) }

// cudaTensor returns t as the cuda device's tensor, its values in place
// (a pending fold run first). It panics on another device's tensor (a
// programmer error: tensors are valid only on their device).
func cudaTensor(t synth.Tensor) *tensor {
	ct := unfolded(t)
	if ct.fold != nil {
		ct.fold.run()
	}
	return ct
}

// unfolded is cudaTensor without running t's pending fold: for the ops that
// read the parts themselves. A lazy matmul of t runs (its outputs are never
// pending folds: the tiled kernels fold their parts themselves).
func unfolded(t synth.Tensor) *tensor {
	ct := asTensor(t)
	if ct.lazy != nil {
		ct.lazy.run()
	}
	return ct
}

// asTensor is t as the cuda device's tensor, as it is: lazy or pending,
// for SwiGLU, which may take both.
func asTensor(t synth.Tensor) *tensor {
	ct, ok := t.(*tensor)
	if !ok {
		panic(fmt.Sprintf("cuda: tensor %T is not the cuda device's", t))
	}
	return ct
}

func shape(name string, t *tensor, r, c int) {
	if t.r != r || t.c != c {
		panic(fmt.Sprintf("cuda: %s: tensor is %d × %d, want %d × %d", name, t.r, t.c, r, c))
	}
}

// arena hands out the device memory of one step's activations: bump
// allocation in chunks, every chunk reused after reset (a step fills them
// in order, from the first). After a step that needed more than one
// chunk, reset replaces them by one chunk of their total size, so a
// steady workload allocates nothing. Chunks grow by doubling up to
// arenaStep, so a step's memory is what it uses rounded up by at most
// arenaStep, never a power of two past it.
//
// The arena also stages the small host tables of a step (put): in pinned
// host memory, copied to the device asynchronously in stream order, so
// uploading them never waits for the kernels already queued.
type arena struct {
	g      *gpu
	chunks []chunk
	cur    int // the chunk allocations come from; those before it are full
	peak   int64

	pin     unsafe.Pointer // pinned staging of put, pinSize bytes
	pinSize int64
	pinOff  int64
	pinPeak int64  // the most put asked of it in a step (it grows to that at reset)
	gen     uint64 // resets so far: what an arena address is valid for
}

type chunk struct {
	p         cu.DevicePtr
	size, off int64
}

const (
	arenaAlign = 256
	arenaMin   = 64 << 20
	arenaStep  = 1 << 30
	pinMin     = 1 << 20
)

func (a *arena) alloc(n int64) (cu.DevicePtr, error) {
	n = (n + arenaAlign - 1) / arenaAlign * arenaAlign
	if n == 0 {
		n = arenaAlign
	}
	for ; a.cur < len(a.chunks); a.cur++ {
		if c := &a.chunks[a.cur]; c.off+n <= c.size {
			p := c.p + cu.DevicePtr(c.off)
			c.off += n
			return p, nil
		}
	}
	size := int64(arenaMin)
	if k := len(a.chunks); k > 0 {
		size = max(size, min(2*a.chunks[k-1].size, arenaStep))
	}
	size = max(size, n)
	p, err := a.g.alloc(size)
	if err != nil {
		return 0, a.grown(err, n)
	}
	a.chunks = append(a.chunks, chunk{p: p, size: size, off: n})
	a.cur = len(a.chunks) - 1
	return p, nil
}

// grown says, of an allocation of the step's workspace that failed, how
// much the step already holds and how much the device has left, so that
// an out-of-memory names what took the memory (err is kept for
// lostContext).
func (a *arena) grown(err error, n int64) error {
	var held, used int64
	for _, c := range a.chunks {
		held += c.size
		used += c.off
	}
	device := ""
	if free, total, ierr := a.g.memInfo(); ierr == nil {
		device = fmt.Sprintf("; %d of %d bytes free on the device", free, total)
	}
	return fmt.Errorf("cuda: step workspace: %d more bytes (this step holds %d bytes in %d chunks, %d of them in use; the most a step held: %d%s): %w",
		n, held, len(a.chunks), used, a.peak, device, err)
}

// stage copies n bytes at src to dst (device memory of this step) in
// stream order: through the pinned staging buffer when it has room (the
// host does not wait), else with a synchronous copy.
func (a *arena) stage(dst cu.DevicePtr, src unsafe.Pointer, n int64) error {
	if n <= 0 {
		return nil
	}
	off := (a.pinOff + 15) / 16 * 16
	a.pinPeak = max(a.pinPeak, off+n)
	if a.pin == nil || off+n > a.pinSize {
		if err := cu.MemcpyHtoD(dst, src, n); err != nil {
			return fmt.Errorf("cuda: copy %d bytes to the device: %w", n, err)
		}
		return nil
	}
	p := unsafe.Add(a.pin, off)
	copy(unsafe.Slice((*byte)(p), n), unsafe.Slice((*byte)(src), n))
	a.pinOff = off + n
	if err := cu.MemcpyHtoDAsync(dst, p, n, a.g.stream); err != nil {
		return fmt.Errorf("cuda: copy %d bytes to the device: %w", n, err)
	}
	return nil
}

// reset makes all of the arena's memory free again. The caller must have
// synchronized: no kernel or copy may still use it (reset synchronizes
// itself when the pinned staging was used, so no host write can overtake
// a copy still reading it).
func (a *arena) reset() error {
	a.gen++
	if a.pinOff > 0 {
		if err := a.g.sync(); err != nil {
			return err
		}
	}
	var total int64
	for _, c := range a.chunks {
		total += c.size
	}
	a.peak = max(a.peak, total)
	if len(a.chunks) > 1 {
		// The old chunks go first (nothing uses them now), so the merge
		// needs no room beside them; should it fail all the same, the
		// next step grows the arena again.
		a.release()
		if p, err := a.g.alloc(total); err == nil {
			a.chunks = []chunk{{p: p, size: total}}
		}
	}
	for i := range a.chunks {
		a.chunks[i].off = 0
	}
	a.cur = 0
	if want := max(a.pinPeak, pinMin); want > a.pinSize {
		if a.pin != nil {
			a.g.freeHost(a.pin)
			a.pin, a.pinSize = nil, 0
		}
		p, _, err := a.g.allocHost(want)
		if err != nil {
			return err
		}
		a.pin, a.pinSize = p, want
	}
	a.pinOff, a.pinPeak = 0, 0
	return nil
}

// release frees the arena's chunks.
func (a *arena) release() {
	for _, c := range a.chunks {
		cu.MemFree(c.p)
	}
	a.chunks, a.cur = nil, 0
}

func (a *arena) free() {
	a.release()
	if a.pin != nil {
		a.g.freeHost(a.pin)
		a.pin, a.pinSize = nil, 0
	}
}

// ops implements hf.Ops (and so synth.Ops) on the GPU for one step: every
// tensor it returns lives in the step's arena, weights in memory kept as
// long as the device. Ops calls run on the context's goroutine. A CUDA
// failure does not panic: the first one is kept (err) and every later op
// is skipped, and Forward returns it.
type ops struct {
	g       *gpu
	ar      *arena
	weights *[]cu.DevicePtr // where Weight records what it allocates
	err     error
	// fast selects the fast numerics (dtype bfloat16): Weight keeps linear
	// weights as bf16 and MatMul runs them on tensor cores (fgemm.go).
	fast bool
	// stage is the device staging buffer of Weight and WeightBF16 in fast
	// mode (loading only; freeStage releases it).
	stage struct {
		p    cu.DevicePtr
		size int64
	}

	// The paged state of a Forward (nil for ops without a device, as in the
	// op tests): the device, the runtime's tables, the step's items.
	d     *Device
	t     *device.Tables
	items map[kvcache.SeqID]*worker.Item
	memo  stepMemo // uploads the step's layers share (memo.go)
}

var _ hf.Ops = (*ops)(nil)

// fail keeps the first error.
func (o *ops) fail(err error) {
	if err != nil && o.err == nil {
		o.err = err
	}
}

// newTensor returns an r × c tensor of the step's arena (uninitialized).
func (o *ops) newTensor(r, c int) *tensor {
	t := &tensor{r: r, c: c}
	if o.err != nil {
		return t
	}
	p, err := o.ar.alloc(t.bytes())
	o.fail(err)
	t.p = p
	return t
}

// scratch returns n bytes of the step's arena.
func (o *ops) scratch(n int64) cu.DevicePtr {
	if o.err != nil {
		return 0
	}
	p, err := o.ar.alloc(n)
	o.fail(err)
	return p
}

// put copies host values (int32, int64, uint64, float32) into the step's
// arena and returns their address. The copy is in stream order (arena.stage):
// v may be reused as soon as put returns.
func put[T any](o *ops, v []T) cu.DevicePtr {
	var zero T
	n := int64(len(v)) * int64(sizeOf(zero))
	p := o.scratch(n)
	if o.err == nil && n > 0 {
		o.fail(o.ar.stage(p, unsafe.Pointer(unsafe.SliceData(v)), n))
	}
	return p
}

func sizeOf(v any) int {
	switch v.(type) {
	case int32, float32, uint32:
		return 4
	case int64, uint64, float64:
		return 8
	case int16, uint16:
		return 2
	case int8, uint8:
		return 1
	}
	panic(fmt.Sprintf("cuda: put of %T", v))
}

// run launches kernel name unless an earlier op failed.
func (o *ops) run(name string, grid, block dim, shmem int, args ...any) {
	if o.err != nil {
		return
	}
	o.fail(o.g.launch(name, grid, block, shmem, args...))
}

// blocks returns the number of blocks of size per covering n threads.
func blocks(n, per int) int { return (n + per - 1) / per }
