package workload

import (
	"fmt"
	"testing"

	"pgregory.net/rapid"
)

// blocks builds a prompt from 4-token blocks named by small integers
// (block k is k, k, k, k) plus tail extra tokens.
func blocks(tail int, names ...int32) []int32 {
	var p []int32
	for _, n := range names {
		p = append(p, n, n, n, n)
	}
	for i := range tail {
		p = append(p, 1000+int32(i))
	}
	return p
}

func TestAnalyzeHandmade(t *testing.T) {
	reqs := []Request{
		// Listed out of arrival order: Span is last minus first arrival.
		{ID: 0, Arrival: 30, Prompt: blocks(0, 1, 2, 3), OutputLen: 5}, // 1,2 hit (after ID 1); 3 hits (ID 2 had 1,2,3)
		{ID: 1, Arrival: 10, Prompt: blocks(2, 1, 2), OutputLen: 1},    // first: no hits
		{ID: 2, Arrival: 20, Prompt: blocks(0, 1, 2, 3, 4), OutputLen: 2},
		{ID: 3, Arrival: 40, Prompt: blocks(3, 9, 2), OutputLen: 1},    // 2 follows 9: a different chain, no hit
		{ID: 4, Arrival: 50, Prompt: blocks(0, 5, 5), OutputLen: 1},    // repeated block in one request: no self hit
		{ID: 5, Arrival: 60, Prompt: blocks(0, 1, 7, 3), OutputLen: 1}, // 1 hits, then 7 misses, so 3 cannot hit
		{ID: 6, Arrival: 60, Prompt: blocks(1, 5), OutputLen: 1},       // 5 hits (ID 4's first block)
	}
	got := Analyze(reqs, 4)
	want := Stats{
		Requests: 7, InputTokens: 10 + 16 + 12 + 11 + 8 + 12 + 5, OutputTokens: 12, MaxInput: 16, Span: 50,
		BlockTokens: 4, FullBlocks: 2 + 4 + 3 + 2 + 2 + 3 + 1,
		HitBlocks: 2 /*ID2*/ + 3 /*ID0*/ + 0 + 0 + 1 /*ID5*/ + 1, /*ID6*/
	}
	if got != want {
		t.Fatalf("Analyze = %+v\nwant        %+v", got, want)
	}
	if r := got.HitRatio(); r != float64(want.HitBlocks*4)/float64(want.InputTokens) {
		t.Errorf("HitRatio() = %v, want %v", r, float64(want.HitBlocks*4)/float64(want.InputTokens))
	}
	if z := Analyze(nil, 0); z.HitRatio() != 0 || z.BlockTokens != DefaultBlockTokens {
		t.Errorf("Analyze(nil, 0) = %+v, want zero stats with BlockTokens %d", z, DefaultBlockTokens)
	}
}

// Analyze agrees with a naive reference that keys blocks by the full token
// prefix they end.
func TestAnalyzeMatchesReference(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		bt := rapid.IntRange(1, 4).Draw(t, "blockTokens")
		n := rapid.IntRange(0, 12).Draw(t, "requests")
		reqs := make([]Request, n)
		for i := range reqs {
			reqs[i] = Request{
				ID:      uint64(i),
				Arrival: int64(rapid.IntRange(0, 5).Draw(t, "arrival")),
				Prompt:  rapid.SliceOfN(rapid.Int32Range(0, 2), 0, 14).Draw(t, "prompt"),
			}
		}
		got := Analyze(reqs, bt)

		// Reference: string keys, in slice order. An infinite cache's hits
		// do not depend on the order, so Analyze of a permutation agrees too.
		order := rapid.Permutation(reqs).Draw(t, "permutation")
		if p := Analyze(order, bt); p != got {
			t.Fatalf("Analyze of a permutation = %+v, of the original %+v", p, got)
		}
		seen := map[string]bool{}
		var hits, full, input int64
		for _, r := range reqs {
			p := r.Prompt
			input += int64(len(p))
			var mine []string
			for end := bt; end <= len(p); end += bt {
				key := fmt.Sprint(p[:end])
				full++
				if seen[key] {
					hits++
				}
				mine = append(mine, key)
			}
			for _, k := range mine {
				seen[k] = true
			}
		}
		if got.HitBlocks != hits || got.FullBlocks != full || got.InputTokens != input {
			t.Fatalf("Analyze: hits %d, full blocks %d, input %d; reference %d, %d, %d", got.HitBlocks, got.FullBlocks, got.InputTokens, hits, full, input)
		}
	})
}
