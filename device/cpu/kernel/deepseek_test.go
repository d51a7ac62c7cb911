package kernel

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/kvx-dev/kvx/device/kernelspec"
)

func TestGroupedRoute(t *testing.T) {
	logit := func(p float64) float32 { return float32(math.Log(p / (1 - p))) } // sigmoid⁻¹
	// 8 experts in 4 groups of 2; sigmoid scores s, bias b.
	s := []float64{0.9, 0.1, 0.5, 0.45, 0.6, 0.55, 0.2, 0.3}
	logits := make([]float32, len(s))
	for i, p := range s {
		logits[i] = logit(p)
	}
	for _, tc := range []struct {
		name    string
		g       GroupedRoute
		bias    []float32
		experts []int
	}{
		// group sums 1.0, 0.95, 1.15, 0.5: groups 2 and 0; best experts 0 (0.9), 4 (0.6).
		{"no bias", GroupedRoute{K: 2, Groups: 4, TopKGroup: 2, Norm: true, Scale: 2.5}, nil, []int{0, 4}},
		// bias lifts group 3 (0.2+1, 0.3+1): groups 3 and 2; experts 7, 6.
		{"bias chooses", GroupedRoute{K: 2, Groups: 4, TopKGroup: 2, Norm: true, Scale: 2.5}, []float32{0, 0, 0, 0, 0, 0, 1, 1}, []int{6, 7}},
		// one group: group 2 (sum 1.15), though expert 0 is the best of all.
		{"one group", GroupedRoute{K: 2, Groups: 4, TopKGroup: 1, Norm: false, Scale: 1}, nil, []int{4, 5}},
	} {
		es, ws := tc.g.Route(logits, tc.bias)
		if !slices.Equal(es, tc.experts) {
			t.Errorf("%s: experts %v, want %v", tc.name, es, tc.experts)
			continue
		}
		var sum float64
		for _, e := range es {
			sum += float64(Sigmoid(logits[e]))
		}
		for i, e := range es {
			want := float64(Sigmoid(logits[e])) * float64(tc.g.Scale) // uncorrected scores
			if tc.g.Norm {
				want /= sum
			}
			if math.Abs(float64(ws[i])-want) > 1e-6 {
				t.Errorf("%s: weight of expert %d = %v, want %v", tc.name, e, ws[i], want)
			}
		}
	}
	// Ties break to the lower index: all scores equal.
	if es, _ := (GroupedRoute{K: 3, Groups: 4, TopKGroup: 2, Scale: 1}).Route(make([]float32, 8), nil); !slices.Equal(es, []int{0, 1, 2}) {
		t.Errorf("all tied: experts %v, want [0 1 2]", es)
	}
}

func TestLayerNorm(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	x, w, b := randVec(r, 16, 3), randVec(r, 16, 1), randVec(r, 16, 1)
	for i := range x {
		x[i] += 5 // an offset the mean must remove
	}
	out := make([]float32, 16)
	LayerNorm(out, x, w, b, 1e-6)
	var mean, v float64
	for _, e := range x {
		mean += float64(e) / 16
	}
	for _, e := range x {
		v += (float64(e) - mean) * (float64(e) - mean) / 16
	}
	for i, e := range x {
		want := (float64(e)-mean)/math.Sqrt(v+1e-6)*float64(w[i]) + float64(b[i])
		if math.Abs(float64(out[i])-want) > 1e-5 {
			t.Errorf("LayerNorm[%d] = %v, want %v", i, out[i], want)
		}
	}
}

// TestPlainIndexerIsTransformers: with Plain, the selection is the top k of
// Σ_h w_h ReLU(q_h·k_s · Scale) computed in float64 (no fp8, no scale per
// key), the score transformers' deepseek_v32 indexer uses.
func TestPlainIndexerIsTransformers(t *testing.T) {
	m := kernelspec.MLA{Heads: 2, KVLoraRank: 8, QKNopeHeadDim: 4, QKRopeHeadDim: 2, VHeadDim: 4, Dtype: kernelspec.F32}
	x := kernelspec.Indexer{Heads: 3, HeadDim: 8, TopK: 5, Plain: true, Keys: kernelspec.F32, Scale: 0.35}
	r := rand.New(rand.NewPCG(9, 10))
	const T = 24
	c := newMLACase(r, m, x, T)
	in, ix := c.dense(0)
	sel := make([][]int32, T)
	if err := DenseDSA(kernelspec.DSA{MLA: m, Indexer: x}, c.w, in, ix, make([]float32, T*m.Heads*m.VHeadDim), sel); err != nil {
		t.Fatal(err)
	}
	D, H := x.HeadDim, x.Heads
	for p := range T {
		score := make([]float64, p+1)
		idx := make([]int32, p+1)
		for s := range p + 1 {
			idx[s] = int32(s)
			for h := range H {
				var dot float64
				for d := range D {
					dot += float64(ix.Q[(p*H+h)*D+d]) * float64(ix.K[s*D+d])
				}
				score[s] += float64(ix.W[p*H+h]) * max(dot*float64(x.Scale), 0)
			}
		}
		slices.SortStableFunc(idx, func(a, b int32) int { return -cmpF(score[a], score[b]) })
		want := slices.Clone(idx[:min(len(idx), x.TopK)])
		slices.Sort(want)
		if !slices.Equal(sel[p], want) {
			t.Errorf("query %d: selected %v, transformers' score picks %v", p, sel[p], want)
		}
	}
	if got, want := x.RowBytes(), 4*D; got != want {
		t.Errorf("RowBytes() = %d, want %d (float32 keys, no scale)", got, want)
	}
}

func cmpF(a, b float64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}
