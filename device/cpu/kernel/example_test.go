package kernel_test

import (
	"fmt"
	"math"

	"github.com/kvx-dev/kvx/device/cpu/kernel"
	"github.com/kvx-dev/kvx/device/kernelspec"
	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
)

// A device holding one pool for two GQA layers: a block is 4 tokens of
// layer 0's rows followed by 4 tokens of layer 1's rows (BlockBytes covers
// both layers, as kvcache.Pool says). One sequence's table is [2 0]: its
// tokens 0..3 are in block 2, tokens 4..7 in block 0.
func ExampleGQA() {
	g := kernelspec.GQA{Heads: 4, KVHeads: 2, HeadDim: 8, Dtype: kernelspec.BF16, RoPE: kernelspec.RoPE{Dim: 8, Theta: 10000}}
	const tpb, blocks = 4, 3
	layerBytes := tpb * g.RowBytes()
	pool := kernel.Pool{Data: make([]byte, blocks*2*layerBytes), BlockBytes: 2 * layerBytes}
	table := []kvcache.BlockID{2, 0}
	layer1 := kernel.Paged{Data: pool.Data, BlockBytes: pool.BlockBytes, Offset: layerBytes, TokensPerBlock: tpb, Table: table}

	const T = 7
	q, k, v := make([]float32, T*32), make([]float32, T*16), make([]float32, T*16)
	for i := range q {
		q[i] = float32(math.Sin(float64(i)))
	}
	for i := range k {
		k[i], v[i] = float32(math.Cos(float64(i))), float32(math.Sin(float64(3*i)))
	}
	out := make([]float32, T*32)
	// Prefill 6 tokens, then decode the 7th.
	if err := kernel.GQA(g, layer1, 0, q[:6*32], k[:6*16], v[:6*16], out[:6*32]); err != nil {
		fmt.Println(err)
	}
	if err := kernel.GQA(g, layer1, 6, q[6*32:], k[6*16:], v[6*16:], out[6*32:]); err != nil {
		fmt.Println(err)
	}
	want := make([]float32, T*32)
	if err := kernel.DenseGQA(g, 0, q, k, v, want); err != nil {
		fmt.Println(err)
	}
	same := true
	for i := range out {
		same = same && math.Float32bits(out[i]) == math.Float32bits(want[i])
	}
	fmt.Println("paged == dense:", same)
	// Output: paged == dense: true
}
