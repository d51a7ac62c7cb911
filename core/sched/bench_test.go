package sched

import (
	"testing"

	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
)

// grantAll grants every ask without allocating, so the benchmark measures
// the scheduler alone.
type grantAll struct{ ok []bool }

func (g *grantAll) Lookup(ids []kvcache.SeqID) []int { return nil }
func (g *grantAll) Reserve(asks []kvcache.ReserveItem) []bool {
	for len(g.ok) < len(asks) {
		g.ok = append(g.ok, true)
	}
	return g.ok[:len(asks)]
}
func (g *grantAll) Release(ids []kvcache.SeqID) {}

// BenchmarkScheduleDecode is one decode step of 256 running requests with
// MTP (Schedule + 256 Completes), the steady state of seed A's traffic.
func BenchmarkScheduleDecode(b *testing.B) {
	const n = 256
	s, err := New(Config{
		MaxBatchSize: n, MaxResident: 2 * n, MaxNumTokens: 8192, MaxSeqLen: 1 << 20, MaxSeqTokens: 1 << 21,
		ChunkedPrefill: true, TokensPerBlock: 32, Draft: 1, Policy: MaxUtilization,
	})
	if err != nil {
		b.Fatal(err)
	}
	c := &grantAll{}
	for i := range n {
		s.Add(Request{ID: kvcache.SeqID(i), Prompt: 16, MaxNew: 1 << 19})
	}
	for st := s.Schedule(c); len(st.Items) > 0; st = s.Schedule(c) {
		for _, it := range st.Items {
			s.Complete(it.ID, it.Tokens, 1) // every prompt is one final chunk
		}
		if !st.Items[0].Prefill {
			break
		}
	}
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		st := s.Schedule(c)
		if len(st.Items) != n {
			b.Fatalf("Schedule gave %d items, want %d", len(st.Items), n)
		}
		for _, it := range st.Items {
			s.Complete(it.ID, 1, 1)
		}
	}
}
