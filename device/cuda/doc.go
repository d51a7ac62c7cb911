// Package cuda is the cuda device of the worker runtime: the models of
// packages synth and hf run over synth.Ops and hf.Ops implemented with GPU
// kernels, on KV pools allocated in GPU memory exactly as the cache
// manager's layout says (package paged reads it, as on the cpu).
//
// Every file that imports gorgonia.org/cu is behind the build tag
// "cuda && cgo": cu's package init calls cuInit and exits the process when
// there is no GPU, so only the worker plugin binaries built with -tags cuda
// link it (cmd/builtin's TestLayout checks kvx never does). Without the tag
// Open is a stub that says how to build the real device.
//
// # Kernels
//
// The kernels are CUDA C in kernels/, compiled to sm_90 PTX (make ptx) and
// embedded from ptx/. ptx/SOURCES records the sha256 of every source the
// PTX was made from; TestPTXFresh fails when a source changed and the PTX
// was not remade. They are compiled with -fmad=false and mirror the cpu
// reference kernels' order of operations (package kernel: the four-lane
// Dot, the ascending softmax sums, the bf16 and fp8 row formats), so the
// cuda device's outputs equal the cpu device's; every reduction runs in a
// fixed order over logical positions, never over blocks, threads that
// happen to finish first or the batch, so outputs do not depend on block
// placement or batch order.
//
// # Threads and memory
//
// One CUDA context lives on one OS-locked goroutine (gpu.do); the device's
// entry points (Open, Forward, CopyBlocks) hop onto it, and the ops run
// there. Pools and weights are plain device allocations (never managed
// memory); host-tier pools are pinned, device-mapped host memory, so one
// copy kernel moves a whole batch of blocks in either direction.
// Activations come from a per-step arena, reset when Forward returns.
package cuda

// Name is the device's config name (Config.Device).
const Name = "cuda"
