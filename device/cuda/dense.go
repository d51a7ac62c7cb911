//go:build cuda && cgo

package cuda

// Placeholder: the row-wise ops are being written (dense.go, kernels/dense.cu).

import (
	"github.com/kvx-dev/kvx/device/hf"
	"github.com/kvx-dev/kvx/device/synth"
)

func (o *ops) Weight(data []float32, rows, cols int) synth.Tensor { panic("cuda: Weight not built") }
func (o *ops) FromHost(data []float32, rows, cols int) synth.Tensor {
	panic("cuda: FromHost not built")
}
func (o *ops) ToHost(t synth.Tensor) []float32   { panic("cuda: ToHost not built") }
func (o *ops) Zeros(rows, cols int) synth.Tensor { panic("cuda: Zeros not built") }
func (o *ops) Embed(table synth.Tensor, tokens []int32) synth.Tensor {
	panic("cuda: Embed not built")
}
func (o *ops) Rows(x synth.Tensor, idx []int) synth.Tensor { panic("cuda: Rows not built") }
func (o *ops) Split(x synth.Tensor, groups int, widths ...int) []synth.Tensor {
	panic("cuda: Split not built")
}
func (o *ops) Concat(a, b synth.Tensor) synth.Tensor               { panic("cuda: Concat not built") }
func (o *ops) MatMul(x, w synth.Tensor) synth.Tensor               { panic("cuda: MatMul not built") }
func (o *ops) RMSNorm(x, w synth.Tensor, eps float32) synth.Tensor { panic("cuda: RMSNorm not built") }
func (o *ops) Add(dst, src synth.Tensor)                           { panic("cuda: Add not built") }
func (o *ops) Scale(x synth.Tensor, s float32)                     { panic("cuda: Scale not built") }
func (o *ops) SwiGLU(gate, up synth.Tensor) synth.Tensor           { panic("cuda: SwiGLU not built") }
func (o *ops) ReLU2(x synth.Tensor) synth.Tensor                   { panic("cuda: ReLU2 not built") }
func (o *ops) RoPE(x synth.Tensor, segs []synth.Seg, stride int, r synth.RoPE) {
	panic("cuda: RoPE not built")
}
func (o *ops) Route(logits synth.Tensor, k int) synth.Routing { panic("cuda: Route not built") }
func (o *ops) Gather(x synth.Tensor, r synth.Routing, e int) synth.Tensor {
	panic("cuda: Gather not built")
}
func (o *ops) AddRouted(acc, y synth.Tensor, r synth.Routing, e int) {
	panic("cuda: AddRouted not built")
}
func (o *ops) Argmax(x synth.Tensor) []int32 { panic("cuda: Argmax not built") }
func (o *ops) AddBias(x, b synth.Tensor)     { panic("cuda: AddBias not built") }
func (o *ops) RMSNormGroups(x, w synth.Tensor, eps float32) synth.Tensor {
	panic("cuda: RMSNormGroups not built")
}
func (o *ops) LayerNorm(x, w, b synth.Tensor, eps float32) synth.Tensor {
	panic("cuda: LayerNorm not built")
}
func (o *ops) RouteGrouped(logits, bias synth.Tensor, g hf.GroupedRoute) synth.Routing {
	panic("cuda: RouteGrouped not built")
}
