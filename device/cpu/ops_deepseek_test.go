package cpu

import (
	"math/rand/v2"
	"testing"

	"github.com/kvx-dev/kvx/device/cpu/kernel"
	"github.com/kvx-dev/kvx/device/hf"
	"github.com/kvx-dev/kvx/device/synth"
)

func TestOpsLayerNormIsKernelLayerNorm(t *testing.T) {
	rng := rand.New(rand.NewPCG(15, 16))
	var o hostOps
	x, w, b := randT(rng, 4, 16), randT(rng, 1, 16), randT(rng, 1, 16)
	for _, bias := range []*tensor{b, nil} {
		var bt synth.Tensor
		var bd []float32
		if bias != nil {
			bt, bd = bias, bias.d
		}
		got := cpuTensor(o.LayerNorm(x, w, bt, 1e-6))
		for r := range 4 {
			want := make([]float32, 16)
			kernel.LayerNorm(want, x.rowsOf(r, r+1), w.d, bd, 1e-6)
			if !sameBits(got.rowsOf(r, r+1), want) {
				t.Errorf("LayerNorm row %d (bias %v) = %v, kernel.LayerNorm %v", r, bias != nil, got.rowsOf(r, r+1), want)
			}
		}
	}
}

func TestOpsRouteGroupedIsKernelGroupedRoute(t *testing.T) {
	rng := rand.New(rand.NewPCG(17, 18))
	var o hostOps
	const rows, experts, width = 7, 8, 6
	logits, bias, x := randT(rng, rows, experts), randT(rng, 1, experts), randT(rng, rows, width)
	copy(logits.d[:experts], make([]float32, experts)) // row 0 all tied
	g := hf.GroupedRoute{K: 2, Groups: 4, TopKGroup: 2, Norm: true, Scale: 2.5}
	kg := kernel.GroupedRoute{K: 2, Groups: 4, TopKGroup: 2, Norm: true, Scale: 2.5}
	checkRoutedSum(t, o, x, o.RouteGrouped(logits, bias, g), experts, width, func(row int) ([]int, []float32) {
		return kg.Route(logits.rowsOf(row, row+1), bias.d)
	})
}
