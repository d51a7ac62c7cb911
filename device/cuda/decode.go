//go:build cuda && cgo

package cuda

import (
	"fmt"

	"gorgonia.org/cu"
)

// decodeGQA is the long-context decode kernel (kernels/decode.cu): one query
// token per sequence, bf16 K/V of head dim 128 in a paged pool, full
// attention over positions 0..ctx[b]-1. q and the result are batch × heads ×
// 128. tables is batch × maxBlocks int32 block ids, ctx batch int64 lengths
// (device addresses). splitTokens is the positions one thread block reads;
// the splits are merged in order, so the result depends on it but not on
// block placement or the batch.
//
// It is the fast path of decode, agreeing with the exact GQA kernel to
// float32 rounding (reassociated sums, exp2f), and today runs only in the
// benchmarks (decode_test.go): the device's GQA is the exact kernel.
func (o *ops) decodeGQA(q *tensor, v pagedView, tables, ctx cu.DevicePtr, batch, heads, kvHeads, maxBlocks, maxCtx, splitTokens int) *tensor {
	const d = 128
	g := heads / kvHeads
	switch {
	case heads%kvHeads != 0 || (g != 1 && g != 2 && g != 4 && g != 8):
		panic(fmt.Sprintf("cuda: decodeGQA: %d heads over %d kv heads: the kernel runs 1, 2, 4 or 8 query heads per kv head", heads, kvHeads))
	case q.r != batch || q.c != heads*d:
		panic(fmt.Sprintf("cuda: decodeGQA: q is %d × %d, want %d × %d", q.r, q.c, batch, heads*d))
	case splitTokens <= 0:
		panic("cuda: decodeGQA: split tokens must be > 0")
	}
	splits := blocks(maxCtx, splitTokens)
	out := o.newTensor(batch, heads*d)
	part := o.scratch(int64(batch) * int64(heads) * int64(splits) * d * 4)
	ml := o.scratch(int64(batch) * int64(heads) * int64(splits) * 2 * 4)
	scale := float32(1 / 11.313708498984761) // 1/sqrt(128)
	o.run(fmt.Sprintf("kvx_decode_gqa_split_g%d", g), dim{splits, kvHeads, batch}, dim{128, 1, 1}, 0,
		part, ml, q.p, v.base, tables, ctx, v.blockBytes, v.offset, v.stride, v.tokensPerBlock, maxBlocks, heads, kvHeads,
		splitTokens, splits, scale)
	o.run("kvx_decode_gqa_merge", dim{heads, batch, 1}, dim{d, 1, 1}, 0, out.p, part, ml, heads, splits)
	return out
}

// splitFor picks the positions per split so that a decode launch has about
// four thread blocks per streaming multiprocessor (132 on an H200), at
// least 256 positions each.
func splitFor(batch, kvHeads, maxCtx int) int {
	const target = 4 * 132
	splits := max(1, target/max(1, batch*kvHeads))
	return max(256, blocks(blocks(maxCtx, splits), 64)*64)
}
