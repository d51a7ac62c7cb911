// Package kernel holds the pure-Go reference kernels of the cpu device: paged
// GQA attention (with sliding window), MLA in absorbed form, DSA (lightning
// indexer, top-k and sparse MLA), the Mamba2 mixer, block copies, cache dtype
// converters (bf16, fp8 e4m3) and the small dense helpers a model needs
// (RMSNorm, RoPE, matvec, softmax, SiLU, argmax, MoE top-k routing). The cpu
// device's synth.Ops are loops over these functions.
//
// What each kernel computes (its shape, cache dtype, row or state layout
// and order of operations) is its spec's in device/kernelspec, which the
// cuda device runs too: kernel.GQA(g, ...) runs the spec g here, and the
// cuda device's tests compare their results with these.
//
// # Storage
//
// The device owns each pool as one []byte of Blocks × BlockBytes. A paged
// buffer of one layer is seen through a Paged view: token t of the sequence
// lives in block Table[t/TokensPerBlock], at byte
//
//	Table[t/TokensPerBlock]*BlockBytes + Offset + (t%TokensPerBlock)*Stride
//
// and its row is the kernel's RowBytes long. Rows are little-endian at the
// cache dtype; each kernel documents its row layout, and the row widths equal
// the per-token bytes plugins/model.FillBuffers sizes pools with. A state buffer
// (Mamba conv and SSM state) is a plain []byte of one state slot.
//
// # Determinism
//
// For a given query token every kernel's output is bit-identical whatever the
// physical block placement, the block size, the chunk split (one chunk of 64
// or 64 chunks of 1), whether the prefix was written by this call or an
// earlier one, and GOMAXPROCS. Kernels first write the new tokens' rows, then
// read every position (new ones included) back from the cache in logical
// order; every reduction (dot products, softmax sums, weighted sums) has one
// fixed order per output element, documented on Dot; goroutines split only
// independent outputs (query tokens, heads), never a reduction. No
// floating-point fusion: products are rounded to float32 before they are
// added (explicit conversions), so the compiler cannot emit FMA differently
// in two call sites. Each paged kernel has an exported dense reference over
// contiguous []float32 that computes the same formulas in the same order;
// the tests check bit equality.
//
// # Errors and panics
//
// Kernels validate shapes and tables and return errors wrapping kernelspec.ErrInvalid
// that name the field, the value and the limit. They panic only on
// programmer errors that validation rules out (documented per function).
// Kernels are safe for concurrent use on disjoint outputs and caches; an
// output slice must not overlap an input or the cache. Kernels retain
// nothing and allocate their scratch per call (O(context) floats per
// goroutine).
package kernel

import (
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"

	"github.com/kvx-dev/kvx/device/kernelspec"
	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
)

func invalidf(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{kernelspec.ErrInvalid}, args...)...)
}

// Paged is a view of one layer's paged buffer in one pool, for one sequence.
// The kernel reads and writes through it; it never retains it. Data is the
// device's and is written in place.
type Paged struct {
	Data           []byte            // the pool: Blocks × BlockBytes bytes
	BlockBytes     int               // bytes of one block (kvcache.Pool.BlockBytes)
	Offset         int               // byte offset of this layer's buffer inside a block
	TokensPerBlock int               // tokens per block (kvcache.Pool.TokensPerBlock)
	Stride         int               // bytes between consecutive tokens' rows in a block; 0 = the kernel's RowBytes
	Table          []kvcache.BlockID // the sequence's blocks in logical token order
}

// Blocks returns the number of whole blocks in Data.
func (p Paged) Blocks() int {
	if p.BlockBytes <= 0 {
		return 0
	}
	return len(p.Data) / p.BlockBytes
}

// check validates p for rows of rowBytes bytes and an access to the logical
// positions lo..hi-1 (table entries before block lo/TokensPerBlock are not
// read and may hold anything, e.g. -1 for blocks a sliding window freed).
// It returns the resolved stride.
func (p Paged) check(name string, rowBytes, lo, hi int) (int, error) {
	if p.BlockBytes <= 0 {
		return 0, invalidf("%s: block bytes %d must be > 0", name, p.BlockBytes)
	}
	if p.TokensPerBlock <= 0 {
		return 0, invalidf("%s: tokens per block %d must be > 0", name, p.TokensPerBlock)
	}
	if p.Offset < 0 {
		return 0, invalidf("%s: offset %d must be >= 0", name, p.Offset)
	}
	stride := p.Stride
	if stride == 0 {
		stride = rowBytes
	}
	if stride < rowBytes {
		return 0, invalidf("%s: stride %d is below the row width %d", name, stride, rowBytes)
	}
	if end := p.Offset + (p.TokensPerBlock-1)*stride + rowBytes; end > p.BlockBytes {
		return 0, invalidf("%s: offset %d + %d tokens × stride %d reaches byte %d, beyond block bytes %d",
			name, p.Offset, p.TokensPerBlock, stride, end, p.BlockBytes)
	}
	if hi <= lo {
		return stride, nil
	}
	need := (hi + p.TokensPerBlock - 1) / p.TokensPerBlock
	if len(p.Table) < need {
		return 0, invalidf("%s: table has %d blocks, positions up to %d need %d (tokens per block %d)",
			name, len(p.Table), hi-1, need, p.TokensPerBlock)
	}
	nb := p.Blocks()
	for b := lo / p.TokensPerBlock; b < need; b++ {
		if id := p.Table[b]; id < 0 || int(id) >= nb {
			return 0, invalidf("%s: table[%d] = block %d, pool has %d blocks", name, b, id, nb)
		}
	}
	return stride, nil
}

// rowAt returns the row of logical position t (no validation).
func (p Paged) rowAt(stride, rowBytes, t int) []byte {
	b := t / p.TokensPerBlock
	at := int(p.Table[b])*p.BlockBytes + p.Offset + (t-b*p.TokensPerBlock)*stride
	return p.Data[at : at+rowBytes : at+rowBytes]
}

// parallelMin is the work (multiply-adds, roughly) below which a kernel runs
// on the calling goroutine. Tests lower it to exercise the parallel path.
var parallelMin = 1 << 16

// parallelFor runs fn(s, u) for every unit u in [0, units) on up to
// GOMAXPROCS goroutines, each with its own scratch from newScratch. Units
// must be independent: the split never changes which unit computes which
// output, so results do not depend on it.
func parallelFor[S any](units, work int, newScratch func() S, fn func(s S, u int)) {
	workers := runtime.GOMAXPROCS(0)
	if workers > units {
		workers = units
	}
	if workers <= 1 || work < parallelMin {
		s := newScratch()
		for u := 0; u < units; u++ {
			fn(s, u)
		}
		return
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s := newScratch()
			for {
				u := int(next.Add(1)) - 1
				if u >= units {
					return
				}
				fn(s, u)
			}
		}()
	}
	wg.Wait()
}
