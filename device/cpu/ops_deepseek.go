package cpu

import (
	"fmt"

	"github.com/kvx-dev/kvx/device/cpu/kernel"
	"github.com/kvx-dev/kvx/device/hf"
	"github.com/kvx-dev/kvx/device/synth"
)

// LayerNorm implements hf.Ops: kernel.LayerNorm of every row with gains w
// and biases b (1 × Cols each; b may be nil).
func (hostOps) LayerNorm(x, w, b synth.Tensor, eps float32) synth.Tensor {
	xt, wt := cpuTensor(x), cpuTensor(w)
	shape("LayerNorm gains", wt, 1, xt.c)
	var bd []float32
	if b != nil {
		bt := cpuTensor(b)
		shape("LayerNorm biases", bt, 1, xt.c)
		bd = bt.d
	}
	out := newTensor(xt.r, xt.c)
	for r := range xt.r {
		kernel.LayerNorm(out.rowsOf(r, r+1), xt.rowsOf(r, r+1), wt.d, bd, eps)
	}
	return out
}

// RouteGrouped implements hf.Ops: kernel.GroupedRoute.Route of every row
// of the router logits, with the correction bias (1 × experts, or nil).
func (hostOps) RouteGrouped(logits, bias synth.Tensor, g hf.GroupedRoute) synth.Routing {
	lt := cpuTensor(logits)
	var bd []float32
	if bias != nil {
		bt := cpuTensor(bias)
		shape("RouteGrouped bias", bt, 1, lt.c)
		bd = bt.d
	}
	if g.Groups <= 0 || lt.c%g.Groups != 0 || lt.c/g.Groups < 2 {
		panic(fmt.Sprintf("cpu: RouteGrouped: %d experts in %d groups: want groups of at least 2", lt.c, g.Groups))
	}
	kg := kernel.GroupedRoute{K: g.K, Groups: g.Groups, TopKGroup: g.TopKGroup, Norm: g.Norm, Scale: g.Scale}
	r := &routing{rows: lt.r, of: make([][]int, lt.c), w: make([][]float32, lt.c)}
	for row := range lt.r {
		experts, weights := kg.Route(lt.rowsOf(row, row+1), bd)
		for i, e := range experts {
			r.of[e] = append(r.of[e], row)
			r.w[e] = append(r.w[e], weights[i])
		}
	}
	return r
}
