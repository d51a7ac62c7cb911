//go:build cuda && cgo

package cuda

// The fast GQA attention (dtype bfloat16; kernels/fattn.cu): flash
// attention on tensor cores over the paged bf16 pool, one order of
// operations per query row whatever its batch, chunk or kernel. Segments of
// many rows (prefill) run kvx_fa_prefill_d*, which folds the context's
// partitions in registers; segments of at most faSplitRows rows (decode and
// short verification steps) run kvx_fa_split_d*, a block of faSplitWarps
// warps a partition, and kvx_fa_merge folds the partitions in the same
// order with the same arithmetic, so both give the same bits (a call of one
// partition skips the merge: the split kernel divides by the sum itself).

import (
	"cmp"
	"math"
	"slices"

	"gorgonia.org/cu"

	"github.com/kvx-dev/kvx/device/kernelspec"
	"github.com/kvx-dev/kvx/device/synth"
)

// The tiling of kernels/fattn.cu (FA_* there).
const (
	faKT   = 64  // keys a tile
	faPart = 256 // keys a partition
	// faSplitRows is the most (token, query head) rows of a segment the
	// split kernel takes: one warp's m16 tile.
	faSplitRows = 16
	// faSplitWarps is the warps of a split block (FA_SW), which share each
	// tile's copy, scores and P·V; faScoreStride is the floats between two
	// rows of their scores in shared memory (FA_SS).
	faSplitWarps  = 4
	faScoreStride = faKT + 8
	// faMergeThreads is kvx_fa_merge's block.
	faMergeThreads = 256
)

// faForcePrefill, set by tests, runs every segment on the prefill kernel,
// so that the split kernel's rows can be compared with it; faForceWarps
// (4 or 8) picks the prefill kernel's warps a block.
var (
	faForcePrefill bool
	faForceWarps   int
)

// faWarpsFor is the warps a prefill block of the call takes: 8 (more rows
// share each K and V tile) when some segment has 128 rows or more.
func faWarpsFor(most int) int {
	switch {
	case faForceWarps != 0:
		return faForceWarps
	case most >= 128:
		return 8
	}
	return 4
}

// faSmem is the dynamic shared memory of the fast attention kernels of
// head dim d: two stages of a tile's K and V.
func faSmem(d int) int { return 2 * 2 * faKT * d * 2 }

// faPrefillSmem is the prefill kernel's (w warps): faSmem's stages and,
// above head dim 64, the warps' folded partitions (kernels/fattn.cu's
// faFold: 32 threads × d/8 × 4 float32 a warp), which would not fit in
// registers beside the running state.
func faPrefillSmem(d, w int) int {
	if d <= 64 {
		return faSmem(d)
	}
	return faSmem(d) + w*32*(d/8)*4*4
}

// faSplitSmem is the split kernel's: faSmem's stages and a tile's scores
// of its 16 rows.
func faSplitSmem(d int) int { return faSmem(d) + faSplitRows*faScoreStride*4 }

// fastGQA reports whether GQA layer g over pool view v runs on the fast
// kernels: bf16 rows, head dim 64 or 128, every row and head 16-byte
// aligned for cp.async. Other layers (fp8 or float32 KV, other head dims)
// run the exact kernel in fast mode too.
func fastGQA(g kernelspec.GQA, v pagedView) bool {
	return g.Dtype == kernelspec.BF16 && (g.HeadDim == 64 || g.HeadDim == 128) && g.KVHeads > 0 && g.Heads%g.KVHeads == 0 &&
		v.blockBytes%16 == 0 && v.offset%16 == 0 && v.stride%16 == 0 && int64(v.base)%16 == 0
}

// fastAttend launches the fast attention of every query row of segs (q:
// rows × heads·d) into out, the new tokens' K and V already written.
func (o *ops) fastAttend(g kernelspec.GQA, segs []synth.Seg, desc cu.DevicePtr, v pagedView, q, out *tensor, scale float32) {
	d, grp := g.HeadDim, g.Heads/g.KVHeads
	wk := o.fastWork(segs, grp)
	qs := float32(float64(scale) * math.Log2E)
	pool := []any{v.base, v.blockBytes, v.offset, v.stride, v.tokensPerBlock, g.Heads, g.KVHeads, g.Window, qs}
	// The kernels write out's bf16 copy too, for the next matmul (o_proj),
	// which then skips its own rounding launch; out's row is its padded
	// row.
	if out.c%fgemmPad == 0 {
		out.b = o.scratch(int64(out.r) * int64(out.c) * 2)
	}
	if wk.npre > 0 {
		o.runShared(faPrefillName(d, wk.warps), dim{wk.npre, g.KVHeads, 1}, dim{32 * wk.warps, 1, 1}, faPrefillSmem(d, wk.warps),
			append([]any{desc, wk.pre, q.p, out.p, out.b}, pool...)...)
	}
	if wk.nsplit > 0 {
		var part, ml cu.DevicePtr
		if wk.parts > 1 {
			n := int64(wk.nsplit) * int64(g.KVHeads) * int64(wk.parts) * faSplitRows
			part, ml = o.scratch(n*int64(d)*4), o.scratch(n*2*4)
		}
		// With one partition (every split row's context within the first
		// faPart positions) part and ml stay 0 and the split kernel writes
		// the merge's output itself: the same division of the same values,
		// a launch fewer a layer.
		o.runShared(faSplitName(d), dim{wk.parts, g.KVHeads, wk.nsplit}, dim{32 * faSplitWarps, 1, 1}, faSplitSmem(d),
			append([]any{desc, wk.split, q.p, part, ml, out.p, out.b}, pool...)...)
		if wk.parts > 1 {
			o.run("kvx_fa_merge", dim{wk.nsplit, g.KVHeads, 1}, dim{faMergeThreads, 1, 1}, 0, desc, wk.split, part, ml, out.p, out.b, wk.parts, g.Heads, g.KVHeads, d, g.Window)
		}
	}
}

// faWork is a call's work lists on the device: prefill items (segment,
// first row) for blocks of warps warps, split items (segments) of parts
// partitions at most.
type faWork struct {
	pre, split   cu.DevicePtr
	npre, nsplit int
	warps, parts int
}

// fastWork returns the work lists of segs for grp query heads per kv
// head, made once a step (every layer of a model has the same).
func (o *ops) fastWork(segs []synth.Seg, grp int) faWork {
	most := 0
	for _, sg := range segs {
		if r := sg.Rows * grp; r > faSplitRows || faForcePrefill {
			most = max(most, r)
		}
	}
	w := faWarpsFor(most)
	m, key := o.memoFor(segs), workKey{grp: grp, warps: w}
	if v, ok := m.work[key]; ok {
		return faWork{v.pre, v.split, v.npre, v.nsplit, w, v.parts}
	}
	type item struct{ seg, r0, keys int }
	var items []item
	var pre, split []int32
	parts := 0
	for i, sg := range segs {
		if r := sg.Rows * grp; r <= faSplitRows && !faForcePrefill {
			split = append(split, int32(i))
			parts = max(parts, blocks(sg.Pos+sg.Rows, faPart))
		} else {
			for r0 := 0; r0 < r; r0 += 16 * w {
				// The keys its last row sees (without a window: the
				// list serves every layer of the step).
				items = append(items, item{i, r0, sg.Pos + (min(r, r0+16*w)-1)/grp + 1})
			}
		}
	}
	// The longest blocks first: a causal prefill's last rows see the most
	// keys, and in row order they would start last and run alone at the
	// end. The order changes no row's arithmetic.
	slices.SortStableFunc(items, func(a, b item) int { return cmp.Compare(b.keys, a.keys) })
	for _, it := range items {
		pre = append(pre, int32(it.seg), int32(it.r0))
	}
	v := workVal{npre: len(pre) / 2, nsplit: len(split), parts: parts}
	if len(pre) > 0 {
		v.pre = put(o, pre)
	}
	if len(split) > 0 {
		v.split = put(o, split)
	}
	if m.work == nil {
		m.work = map[workKey]workVal{}
	}
	m.work[key] = v
	return faWork{v.pre, v.split, v.npre, v.nsplit, w, v.parts}
}

// The fast attention's entry points (not made per call).
func faPrefillName(d, warps int) string {
	switch {
	case d == 64 && warps == 4:
		return "kvx_fa_prefill_d64w4"
	case d == 64:
		return "kvx_fa_prefill_d64w8"
	case warps == 4:
		return "kvx_fa_prefill_d128w4"
	}
	return "kvx_fa_prefill_d128w8"
}

func faSplitName(d int) string {
	if d == 64 {
		return "kvx_fa_split_d64"
	}
	return "kvx_fa_split_d128"
}
