//go:build cuda && cgo

package cuda

import (
	"fmt"

	"gorgonia.org/cu"
)

// The fast MLA decode and DSA kernels (kernels/mla_decode.cu) run only in the
// benchmarks (mla_decode_test.go) today; the device's MLA and DSA are the
// exact kernels of attn.cu.
const (
	mlaDK     = 576 // latent row: 512 of c_kv, 64 of k_pe
	mlaDV     = 512
	mlaHeads  = 64 // query heads per thread block
	mlaTile   = 32 // positions per tile
	mlaStages = 3
	// mlaSmem is MLA_SMEM of mla_decode.cu.
	mlaSmem = mlaHeads*584*2 + mlaStages*mlaTile*584*2 + mlaHeads*36*4 + mlaHeads*40*2 + 3*mlaHeads*4

	dsaIndexHeads = 64
	dsaIndexDim   = 128
)

// mlaDecode is absorbed MLA attention for one query token per sequence on
// tensor cores: q is batch × heads × 576 bf16 (device address), v the paged
// bf16 latent rows (16-byte aligned), tables batch × maxBlocks int32 block
// ids, ctx batch int64 lengths. Dense when sel is 0 (positions 0..ctx-1);
// otherwise sel is batch × topk int32 ascending positions and the first
// min(ctx, topk) of each row are attended (DSA's sparse MLA). maxN bounds
// the positions any sequence attends. The result is batch × heads*512
// float32. splitTokens (a multiple of 32) is the positions one thread block
// reads; the splits merge in order, so the result depends on it but not on
// block placement or the batch.
func (o *ops) mlaDecode(q cu.DevicePtr, v pagedView, tables, ctx, sel cu.DevicePtr, topk, batch, heads, maxBlocks, maxN, splitTokens int, scale float32) *tensor {
	switch {
	case heads%mlaHeads != 0:
		panic(fmt.Sprintf("cuda: mlaDecode: %d heads: the kernel runs heads in groups of %d", heads, mlaHeads))
	case splitTokens <= 0 || splitTokens%mlaTile != 0:
		panic(fmt.Sprintf("cuda: mlaDecode: split of %d positions, want a positive multiple of %d", splitTokens, mlaTile))
	case v.blockBytes%16 != 0 || v.stride%16 != 0 || v.offset%16 != 0:
		panic("cuda: mlaDecode: latent rows must be 16-byte aligned")
	}
	splits := max(1, blocks(maxN, splitTokens))
	out := o.newTensor(batch, heads*mlaDV)
	part := o.scratch(int64(batch) * int64(heads) * int64(splits) * mlaDV * 4)
	ml := o.scratch(int64(batch) * int64(heads) * int64(splits) * 2 * 4)
	o.runShared("kvx_mla_decode_split", dim{heads / mlaHeads, splits, batch}, dim{512, 1, 1}, mlaSmem,
		part, ml, q, v.base, tables, ctx, sel, topk, v.blockBytes, v.offset, v.stride, v.tokensPerBlock, maxBlocks,
		heads, splitTokens, splits, scale)
	o.run("kvx_mla_decode_merge", dim{heads, batch, 1}, dim{128, 1, 1}, 0, out.p, part, ml, heads, splits)
	return out
}

// mlaSplitFor picks the positions per split so that a launch has about four
// thread blocks per streaming multiprocessor (132 on an H200; one block fits
// on one), at least 64 positions each.
func mlaSplitFor(batch, heads, n int) int {
	const target = 4 * 132
	splits := max(1, target/max(1, batch*(heads/mlaHeads)))
	return max(64, blocks(blocks(n, splits), mlaTile)*mlaTile)
}

// dsaScores is the DSA lightning indexer's scan for one query token per
// sequence: scores[b][j] = Σ_h w[b][h] · ReLU(q[b][h] · k[j]) over the 64
// index heads, for j < ctx[b]. q is batch × 64 × 128 bf16, w batch × 64
// float32 (every scale folded in), v the paged bf16 index-key rows (128
// values, 16-byte aligned). The result is batch × maxCtx float32 (entries at
// and past a sequence's length are not written).
func (o *ops) dsaScores(q, w cu.DevicePtr, v pagedView, tables, ctx cu.DevicePtr, batch, maxBlocks, maxCtx int) cu.DevicePtr {
	if v.blockBytes%16 != 0 || v.stride%16 != 0 || v.offset%16 != 0 {
		panic("cuda: dsaScores: index-key rows must be 16-byte aligned")
	}
	scores := o.scratch(int64(batch) * int64(maxCtx) * 4)
	o.run("kvx_dsa_index_scores", dim{blocks(maxCtx, 1024), batch, 1}, dim{128, 1, 1}, 0,
		scores, q, w, v.base, tables, ctx, v.blockBytes, v.offset, v.stride, v.tokensPerBlock, maxBlocks, maxCtx)
	return scores
}

// dsaTopK selects, for each sequence, the k largest of scores[b][0..ctx[b]-1]
// (stride floats a row; ties go to the lower position) and returns them as
// batch × k int32 positions in ascending order; a sequence with ctx <= k
// gets 0..ctx-1 (the rest of its row is not written).
func (o *ops) dsaTopK(scores, ctx cu.DevicePtr, batch, stride, k int) cu.DevicePtr {
	sel := o.scratch(int64(batch) * int64(k) * 4)
	o.run("kvx_dsa_topk_radix", dim{batch, 1, 1}, dim{1024, 1, 1}, 0, sel, scores, ctx, stride, k)
	return sel
}
