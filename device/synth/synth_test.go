package synth

import (
	"math"
	"reflect"
	"slices"
	"testing"

	"pgregory.net/rapid"

	"github.com/kvx-dev/kvx/plugins/v1/worker"
)

func TestWeightsDeterminism(t *testing.T) {
	a := Weights{Seed: 7, Layers: 4}
	b := Weights{Seed: 7, Layers: 4}
	c := Weights{Seed: 8, Layers: 4}
	bits := func(x []float32) []uint32 {
		out := make([]uint32, len(x))
		for i, v := range x {
			out[i] = math.Float32bits(v)
		}
		return out
	}
	x, y := a.Linear("layers.1.mlp.up", 32, 16), b.Linear("layers.1.mlp.up", 32, 16)
	if !slices.Equal(bits(x), bits(y)) {
		t.Fatal("same seed and name gave different bits")
	}
	if slices.Equal(bits(x), bits(c.Linear("layers.1.mlp.up", 32, 16))) {
		t.Fatal("seeds 7 and 8 gave the same tensor")
	}
	if slices.Equal(bits(x), bits(a.Linear("layers.2.mlp.up", 32, 16))) {
		t.Fatal("two names gave the same tensor")
	}
	bound := float32(math.Sqrt(3.0 / 16))
	for _, v := range x {
		if v < -bound || v >= bound {
			t.Fatalf("Linear element %v outside ±%v", v, bound)
		}
	}
	out := a.Output("o", 8, 16)
	ob := bound / float32(math.Sqrt(8))
	for _, v := range out {
		if v < -ob*1.0001 || v > ob*1.0001 {
			t.Fatalf("Output element %v outside ±%v", v, ob)
		}
	}
	for _, v := range a.Norm("n", 64) {
		if v < 0.9 || v >= 1.1 {
			t.Fatalf("Norm gain %v outside [0.9, 1.1)", v)
		}
	}
}

func TestVerify(t *testing.T) {
	tests := []struct {
		name   string
		tokens []int32
		draft  int
		greedy []int32
		want   []int32
	}{
		{"no drafts", []int32{5}, 0, []int32{9}, []int32{9}},
		{"prefill no drafts", []int32{1, 2, 3}, 0, []int32{4}, []int32{4}},
		{"all accepted", []int32{5, 6, 7}, 2, []int32{6, 7, 8}, []int32{6, 7, 8}},
		{"first rejected", []int32{5, 6, 7}, 2, []int32{1, 7, 8}, []int32{1}},
		{"second rejected", []int32{5, 6, 7}, 2, []int32{6, 1, 8}, []int32{6, 1}},
		{"later match after a miss is not accepted", []int32{5, 6, 7}, 2, []int32{0, 7, 8}, []int32{0}},
		{"one draft accepted", []int32{5, 6}, 1, []int32{6, 2}, []int32{6, 2}},
	}
	for _, tt := range tests {
		if got := Verify(tt.tokens, tt.draft, tt.greedy); !slices.Equal(got, tt.want) {
			t.Errorf("%s: Verify(%v, %d, %v) = %v, want %v", tt.name, tt.tokens, tt.draft, tt.greedy, got, tt.want)
		}
	}
}

func TestHiddenRoundTrip(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		raw := rapid.SliceOf(rapid.Uint32()).Draw(t, "bits") // NaN payloads, -0, subnormals
		h := make([]float32, len(raw))
		for i, b := range raw {
			h[i] = math.Float32frombits(b)
		}
		enc := EncodeHidden(nil, h)
		got, err := DecodeHidden(enc, len(h), 1)
		if err != nil {
			t.Fatal(err)
		}
		for i := range h {
			if math.Float32bits(got[i]) != raw[i] {
				t.Fatalf("element %d: %#x, want %#x", i, math.Float32bits(got[i]), raw[i])
			}
		}
		if _, err := DecodeHidden(append(enc, 0), len(h), 1); err == nil {
			t.Fatal("DecodeHidden accepted a wrong length")
		}
	})
}

// TopLogprobs: a float64 log-softmax, the k best by logit with ties to the
// lower id (as Argmax), NaNs left out, k capped by the logits there are.
func TestTopLogprobs(t *testing.T) {
	nan := float32(math.NaN())
	lse := func(xs ...float64) float64 {
		var s float64
		for _, x := range xs {
			s += math.Exp(x - 3)
		}
		return 3 + math.Log(s)
	}
	for _, tc := range []struct {
		logits []float32
		k      int
		want   []worker.TokenLogprob
	}{
		{[]float32{1, 3, 2}, 2, []worker.TokenLogprob{tl(1, 3-lse(1, 3, 2)), tl(2, 2-lse(1, 3, 2))}},
		{[]float32{3, 1, 3}, 3, []worker.TokenLogprob{tl(0, 3-lse(3, 1, 3)), tl(2, 3-lse(3, 1, 3)), tl(1, 1-lse(3, 1, 3))}},
		{[]float32{nan, 3, 2}, 5, []worker.TokenLogprob{tl(1, 3-lse(3, 2)), tl(2, 2-lse(3, 2))}},
		{[]float32{2, 3}, 0, nil},
		{[]float32{nan}, 1, nil},
	} {
		got := TopLogprobs(tc.logits, tc.k)
		if !reflect.DeepEqual(got, tc.want) {
			t.Errorf("TopLogprobs(%v, %d) = %v, want %v", tc.logits, tc.k, got, tc.want)
		}
	}
	// Against Argmax's rule on random rows with ties: the first entry is the
	// greedy token, the list is sorted, and the probabilities sum to 1.
	for seed := range uint64(50) {
		row := make([]float32, 300)
		for i := range row {
			row[i] = float32(int(mix(seed*1000+uint64(i))%16)) / 4 // many ties
		}
		top := TopLogprobs(row, len(row))
		var p float64
		for i, e := range top {
			p += math.Exp(e.Logprob)
			if i > 0 && (e.Logprob > top[i-1].Logprob || e.Logprob == top[i-1].Logprob && e.ID < top[i-1].ID) {
				t.Fatalf("seed %d: entry %d %v after %v: not sorted", seed, i, e, top[i-1])
			}
		}
		if best := argmax(row); top[0].ID != best || math.Abs(p-1) > 1e-12 {
			t.Fatalf("seed %d: first %v, argmax %d; probabilities sum to %v", seed, top[0], best, p)
		}
	}
}

func tl(id int32, lp float64) worker.TokenLogprob { return worker.TokenLogprob{ID: id, Logprob: lp} }

func mix(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	return x ^ x>>31
}

func argmax(x []float32) int32 {
	best := 0
	for i, v := range x {
		if v > x[best] {
			best = i
		}
	}
	return int32(best)
}
