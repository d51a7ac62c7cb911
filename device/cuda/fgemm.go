//go:build cuda && cgo

package cuda

// The fast matmul (dtype bfloat16; kernels/fgemm.cu): linear weights live
// on the device as bf16 rows padded with zeros to a stride of whole 64-value
// tiles, activations are rounded to bf16 on their way in, and every output
// is one float32 chain of tensor-core steps in ascending k, whatever the
// number of rows or the kernel, so the result of a row does not depend on
// its batch.

import (
	"fmt"

	"gorgonia.org/cu"
)

// fgemmPad is the k tile every fast-matmul kernel steps by (the skinny
// kernel's SK_BK, a multiple of the tiled one's): a weight's row stride
// (tensor.ld) is its columns rounded up to it.
const fgemmPad = 128

// fgemmTiledRows is the fewest rows the tiled kernel takes; fewer go to the
// skinny kernels (decode and small prefills), which keep more warps
// streaming the weight. Both give the same bits (fgemm_test.go).
const fgemmTiledRows = 256

// The shared memory of kernels/fgemm.cu's kernels (SK_* and TL_* there).
const (
	skWarps, skBK, skStages = 4, 128, 8
	tlBM, tlBN, tlBK        = 128, 128, 32
	tlStages, tlThreads     = 4, 256
	fgemmTiledSmem          = tlStages * (tlBM + tlBN) * tlBK * 2
)

// fgemmSkinnySmem is the dynamic shared memory of kvx_fgemm_skinny<mt>.
func fgemmSkinnySmem(mt int) int { return skStages * (16*mt + 8*skWarps) * skBK * 2 }

// bf16Weights reports whether a weight of rows × cols is kept as bf16 in
// fast mode: the matrices of linear layers (and embedding tables). Vectors
// (norm gains, biases) and narrow matrices (a Mamba2 conv's taps) stay
// float32: the kernels that read them take float32.
func bf16Weights(rows, cols int) bool { return rows >= 16 && cols >= 16 }

func padK(k int) int { return (k + fgemmPad - 1) / fgemmPad * fgemmPad }

// weightBF16 makes t (rows × cols, allocated by Weight) a bf16 weight: data
// goes through a float32 staging buffer on the device and is rounded there
// (kvx_to_bf16), so the host does no per-element work.
func (o *ops) weightBF16(t *tensor, data []float32) {
	t.ld = padK(t.c)
	h, err := o.g.alloc(int64(t.r) * int64(t.ld) * 2)
	if err != nil {
		o.fail(err)
		return
	}
	*o.weights = append(*o.weights, h)
	t.h = h
	need := int64(len(data)) * 4
	if o.stage.size < need {
		if o.stage.p != 0 {
			cu.MemFree(o.stage.p)
		}
		o.stage.p, o.stage.size = 0, 0
		p, err := o.g.alloc(need)
		if err != nil {
			o.fail(err)
			return
		}
		o.stage.p, o.stage.size = p, need
	}
	if o.fail(upload(o.stage.p, data)); o.err != nil {
		return
	}
	g, b := flat(t.r * t.ld)
	o.run("kvx_to_bf16", g, b, 0, t.h, o.stage.p, t.r, t.c, t.ld)
}

// freeStage releases Weight's staging buffer (after loading). The caller
// must be on the context's goroutine.
func (o *ops) freeStage() {
	if o.stage.p != 0 {
		cu.MemFree(o.stage.p)
	}
	o.stage.p, o.stage.size = 0, 0
}

// f32 returns the address of t's float32 values: a bf16 weight read by a
// kernel that takes float32 (MLA's absorbed projections) gets a float32
// copy once, kept as long as the weights (the values are the bf16 ones,
// exactly).
func (o *ops) f32(t *tensor) cu.DevicePtr {
	if t.p != 0 || t.h == 0 || o.err != nil {
		return t.p
	}
	p, err := o.g.alloc(t.bytes())
	if err != nil {
		o.fail(err)
		return 0
	}
	*o.weights = append(*o.weights, p)
	g, b := flat(t.r * t.c)
	o.run("kvx_bf16_to_f32", g, b, 0, p, t.h, t.r, t.c, t.ld)
	t.p = p
	return p
}

// fastMatMul is MatMul with a bf16 weight: x rounded to bf16 (padded to
// the weight's stride), then the skinny or the tiled kernel.
func (o *ops) fastMatMul(xt, wt *tensor) *tensor {
	n, m, k, ld := xt.r, wt.r, xt.c, wt.ld
	out := o.newTensor(n, m)
	if n == 0 || m == 0 {
		return out
	}
	if ld != padK(k) {
		panic(fmt.Sprintf("cuda: fast MatMul: weight stride %d for %d columns", ld, k))
	}
	xa := o.scratch(int64(n) * int64(ld) * 2)
	g, b := flat(n * ld)
	o.run("kvx_to_bf16", g, b, 0, xa, xt.p, n, k, ld)
	o.fgemm(out.p, xa, wt.h, n, m, ld)
	return out
}

// fgemm launches C (n × m float32) = A (n × ld bf16) · W (m × ld bf16)ᵀ.
func (o *ops) fgemm(c, a, w cu.DevicePtr, n, m, ld int) {
	if n >= fgemmTiledRows {
		o.fgemmTiled(c, a, w, n, m, ld)
		return
	}
	o.fgemmSkinny(c, a, w, n, m, ld, skinnyTile(n))
}

// skinnyTile is the m16 tiles a skinny block takes for n rows.
func skinnyTile(n int) int {
	switch {
	case n <= 16:
		return 1
	case n <= 32:
		return 2
	}
	return 4
}

// fgemmSkinny runs kvx_fgemm_skinny<mt> (any mt of 1, 2, 4, whatever n:
// the tests run every one on every shape).
func (o *ops) fgemmSkinny(c, a, w cu.DevicePtr, n, m, ld, mt int) {
	name := map[int]string{1: "kvx_fgemm_skinny1", 2: "kvx_fgemm_skinny2", 4: "kvx_fgemm_skinny4"}[mt]
	o.runShared(name, dim{blocks(n, 16*mt), blocks(m, 8*skWarps), 1}, dim{32 * skWarps, 1, 1}, fgemmSkinnySmem(mt), c, a, w, n, m, ld)
}

// fgemmTiled runs kvx_fgemm_tiled (any n).
func (o *ops) fgemmTiled(c, a, w cu.DevicePtr, n, m, ld int) {
	o.runShared("kvx_fgemm_tiled", dim{blocks(n, tlBM) * blocks(m, tlBN), 1, 1}, dim{tlThreads, 1, 1}, fgemmTiledSmem, c, a, w, n, m, ld)
}
