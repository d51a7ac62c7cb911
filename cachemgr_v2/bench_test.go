package cachemgrv2

import (
	"testing"

	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
)

// BenchmarkReserveCommit is one decode step of 256 running sequences (1
// token + 1 MTP draft each, half the drafts rejected): one Reserve batch and
// one Commit batch per op. ns/req-step is the cost per sequence per step.
func BenchmarkReserveCommit(b *testing.B) {
	const seqs, tpb, maxSeq = 256, 64, 1 << 17
	layers := dsaStage(0, 4, true)
	m, _ := configure(b, kvcache.Config{
		Layers: layers, TokensPerBlock: tpb, DeviceBytes: int64(seqs*maxSeq/tpb+seqs) * stageBlockBytes(layers, tpb),
		MaxBatchSize: seqs, MaxNumTokens: 8192, MaxSeqLen: maxSeq, MaxDraftTokens: 1, EnableBlockReuse: true,
	})
	start := func(id kvcache.SeqID) {
		p := tokens(1000, int32(id))
		mustGrant(b, m, kvcache.ReserveItem{Seq: id, Tokens: len(p), New: true, Prompt: p})
		mustCommit(b, m, id, len(p))
	}
	res := make([]kvcache.ReserveItem, seqs)
	com := make([]kvcache.CommitItem, seqs)
	hist := make([]int, seqs)
	for i := range seqs {
		id := kvcache.SeqID(i + 1)
		start(id)
		hist[i] = 1000
		res[i] = kvcache.ReserveItem{Seq: id, Tokens: 1, Draft: 1}
		com[i] = kvcache.CommitItem{Seq: id, Accepted: 1 + i%2}
	}
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		gs, err := m.Reserve(ctx, res)
		if err != nil || !gs[0].OK || !gs[seqs-1].OK {
			b.Fatalf("Reserve: %v %+v", err, gs[0])
		}
		if _, err := m.Commit(ctx, com); err != nil {
			b.Fatal(err)
		}
		if hist[0] += 2; hist[0] > maxSeq-8 { // restart all sequences (untimed)
			b.StopTimer()
			for i := range seqs {
				m.Release(ctx, []kvcache.SeqID{res[i].Seq})
				start(res[i].Seq)
			}
			hist[0] = 1000
			b.StartTimer()
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/seqs, "ns/req-step")
}

// BenchmarkLookup looks up one 4096-token prompt (64 blocks of 64) that is
// fully cached in a tree of 256 prompts sharing 16 system prefixes.
func BenchmarkLookup(b *testing.B) {
	const tpb, n = 64, 4096
	layers := dsaStage(0, 4, false)
	m, _ := configure(b, kvcache.Config{
		Layers: layers, TokensPerBlock: tpb, DeviceBytes: int64(256*n/tpb+64) * stageBlockBytes(layers, tpb),
		MaxBatchSize: 256, MaxNumTokens: n, MaxSeqLen: n, EnableBlockReuse: true,
	})
	var probe []int32
	for i := range 256 {
		p := append(tokens(2048, int32(i%16)), tokens(2048, int32(1000+i))...)
		id := kvcache.SeqID(i + 1)
		mustGrant(b, m, kvcache.ReserveItem{Seq: id, Tokens: n, New: true, Prompt: p})
		mustCommit(b, m, id, n)
		m.Release(ctx, []kvcache.SeqID{id})
		probe = append(p, 7)
	}
	items := []kvcache.LookupItem{{Prompt: probe}}
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		got, _ := m.Lookup(ctx, items)
		if got[0] != n {
			b.Fatalf("Lookup = %d, want %d", got[0], n)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/n, "ns/token")
}

// BenchmarkBlockPool takes and frees 64 blocks per op (ns/block is the
// allocate + free cost of one block).
func BenchmarkBlockPool(b *testing.B) {
	p := NewBlockPool(0, kvcache.TierDevice, 1024)
	buf := make([]kvcache.BlockID, 0, 64)
	b.ReportAllocs()
	for b.Loop() {
		buf = p.Take(buf[:0], 64)
		for _, id := range buf {
			p.Unref(id)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/64, "ns/block")
}

// TestSteadyStateAllocs: a decode step allocates only the caller-owned grant
// slice (plus, amortized, the delta arrays of steps that cross a block).
func TestSteadyStateAllocs(t *testing.T) {
	layers := dsaStage(0, 2, true)
	m, _ := configure(t, kvcache.Config{
		Layers: layers, TokensPerBlock: 64, DeviceBytes: 16 * 80 * stageBlockBytes(layers, 64),
		MaxBatchSize: 16, MaxNumTokens: 4096, MaxSeqLen: 4096, MaxDraftTokens: 1, EnableBlockReuse: true,
	})
	var res []kvcache.ReserveItem
	var com []kvcache.CommitItem
	for i := range 16 {
		id := kvcache.SeqID(i + 1)
		mustGrant(t, m, kvcache.ReserveItem{Seq: id, Tokens: 100, New: true, Prompt: tokens(100, int32(i))})
		mustCommit(t, m, id, 100)
		res = append(res, kvcache.ReserveItem{Seq: id, Tokens: 1, Draft: 1})
		com = append(com, kvcache.CommitItem{Seq: id, Accepted: 1 + i%2})
	}
	allocs := testing.AllocsPerRun(200, func() {
		if _, err := m.Reserve(ctx, res); err != nil {
			t.Fatal(err)
		}
		if _, err := m.Commit(ctx, com); err != nil {
			t.Fatal(err)
		}
	})
	if allocs > 1.5 {
		t.Errorf("allocations per decode step = %.2f, want <= 1.5", allocs)
	}
}
