package cachemgrv1

import (
	"fmt"
	"runtime"
	"testing"

	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
	"github.com/zeebo/xxh3"
)

func hashOf(i int) xxh3.Uint128 { return xxh3.Uint128{Hi: 1, Lo: uint64(i)} }

// benchConfig: one full-attention pool of 65,536 blocks of 64 tokens.
func benchConfig(reuse bool) kvcache.Config {
	c := smallConfig(64, 1<<16)
	c.MaxSeqLen = 1 << 17
	c.MaxDraftTokens = 1
	c.MaxNumTokens = 8192
	c.MaxBatchSize = 256
	c.EnableBlockReuse = reuse
	return c
}

// BenchmarkReserveCommit runs decode steps of 256 sequences with one MTP
// draft each (accepted every other step): one batched Reserve and one
// batched Commit per op. ns/req-step is the cost per sequence per step;
// allocs/op are the slices Reserve returns to the caller (grants, and the
// deltas of the sequences that crossed a block boundary).
func BenchmarkReserveCommit(b *testing.B) {
	const batch, prefill, restart = 256, 1000, 8192
	m := configured(b, benchConfig(false))
	res := make([]kvcache.ReserveItem, batch)
	com := make([]kvcache.CommitItem, batch)
	start := func(gen int) {
		for i := range batch {
			id := kvcache.SeqID(gen*batch + i)
			if _, err := m.Reserve(bg, []kvcache.ReserveItem{{Seq: id, New: true, Tokens: prefill}}); err != nil {
				b.Fatal(err)
			}
			if _, err := m.Commit(bg, []kvcache.CommitItem{{Seq: id, Accepted: prefill}}); err != nil {
				b.Fatal(err)
			}
			res[i] = kvcache.ReserveItem{Seq: id, Tokens: 1, Draft: 1}
			com[i].Seq = id
		}
	}
	start(0)
	b.ReportAllocs()
	b.ResetTimer()
	for n := 0; n < b.N; n++ {
		if n > 0 && n%restart == 0 {
			b.StopTimer()
			for i := range batch {
				if err := m.Release(bg, []kvcache.SeqID{res[i].Seq}); err != nil {
					b.Fatal(err)
				}
			}
			start(n / restart)
			b.StartTimer()
		}
		g, err := m.Reserve(bg, res)
		if err != nil || !g[batch-1].OK {
			b.Fatalf("Reserve: %v %+v", err, g[batch-1])
		}
		for i := range com {
			com[i].Accepted = 1 + (i+n)&1
		}
		if _, err := m.Commit(bg, com); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/batch, "ns/req-step")
}

// BenchmarkAllocateBlocks measures the pool's allocation of n blocks into a
// block table (the inner loop of Reserve): ns/block. When the pool runs dry
// every block is released with the timer stopped.
func BenchmarkAllocateBlocks(b *testing.B) {
	for _, n := range []int{10, 1000} {
		b.Run(fmt.Sprint(n), func(b *testing.B) {
			const total = 1 << 16
			p := newPool(0, 0, 64, total, true)
			all := make([]kvcache.BlockID, 0, total)
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if p.available() < n {
					b.StopTimer()
					for _, blk := range all {
						p.release(blk)
					}
					all = all[:0]
					b.StartTimer()
				}
				for range n {
					all = append(all, p.alloc())
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(n), "ns/block")
		})
	}
}

// BenchmarkFreeBlocks measures releasing n blocks of a table, tail first
// (Commit's rewind, Release): ns/block. "cached" releases registered blocks,
// which go to the LRU list instead of the free stack. When every block is
// released they are taken again with the timer stopped.
func BenchmarkFreeBlocks(b *testing.B) {
	for _, tc := range []struct {
		name   string
		n      int
		cached bool
	}{{"10", 10, false}, {"1000", 1000, false}, {"1000-cached", 1000, true}} {
		b.Run(tc.name, func(b *testing.B) {
			const total = 1 << 16
			p := newPool(0, 0, 64, total, true)
			all := make([]kvcache.BlockID, 0, total)
			for range total {
				blk := p.alloc()
				if tc.cached {
					p.register(blk, hashOf(int(blk)))
				}
				all = append(all, blk)
			}
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if len(all) < tc.n {
					b.StopTimer()
					if tc.cached {
						for _, blk := range all[len(all):total] {
							p.acquire(blk)
						}
						all = all[:total]
					}
					for len(all) < total {
						all = append(all, p.alloc())
					}
					b.StartTimer()
				}
				t := all[len(all)-tc.n:]
				for j := len(t) - 1; j >= 0; j-- {
					p.release(t[j])
				}
				all = all[:len(all)-tc.n]
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(tc.n), "ns/block")
		})
	}
}

// BenchmarkHashTokens measures the prefix hash chain (xxh3-128 over parent
// hash + 64 tokens per block) on a 16,384-token prompt: ns/token.
func BenchmarkHashTokens(b *testing.B) {
	const tokens, tpb = 16384, 64
	h := newHasher(tpb)
	p := make([]int32, tokens)
	for i := range p {
		p[i] = int32(i * 7919 % 151000)
	}
	dst := make([]xxh3.Uint128, 0, tokens/tpb)
	b.SetBytes(4 * tokens)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		dst = h.chain(dst[:0], "", p, tokens/tpb)
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/tokens, "ns/token")
}

// BenchmarkCacheFullBlocks measures Commit registering 1,000 full prompt
// blocks for reuse (hash-index insert per block): ns/block. Reserve and
// Release run with the timer stopped.
func BenchmarkCacheFullBlocks(b *testing.B) {
	const nblocks, tpb = 1000, 64
	m := configured(b, benchConfig(true))
	p := make([]int32, nblocks*tpb)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		for j := range p {
			p[j] = int32(i*len(p) + j) // a new prompt every time
		}
		id := kvcache.SeqID(i)
		if g, _ := m.Reserve(bg, []kvcache.ReserveItem{{Seq: id, New: true, Tokens: len(p), Prompt: p}}); !g[0].OK {
			b.Fatal(g[0].Reason)
		}
		b.StartTimer()
		if _, err := m.Commit(bg, []kvcache.CommitItem{{Seq: id, Accepted: len(p)}}); err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		if err := m.Release(bg, []kvcache.SeqID{id}); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/nblocks, "ns/block")
}

// TestSteadyStateAllocations: a decode step allocates nothing but the
// slices Reserve hands to the caller (grants, and deltas when a table grew).
func TestSteadyStateAllocations(t *testing.T) {
	const batch = 64
	m := configured(t, benchConfig(true))
	res := make([]kvcache.ReserveItem, batch)
	com := make([]kvcache.CommitItem, batch)
	for i := range batch {
		id := kvcache.SeqID(i)
		mustGrant(t, m, kvcache.ReserveItem{Seq: id, New: true, Tokens: 100, Prompt: make([]int32, 100)})
		commit(t, m, id, 100)
		res[i] = kvcache.ReserveItem{Seq: id, Tokens: 1, Draft: 1}
		com[i] = kvcache.CommitItem{Seq: id, Accepted: 1}
	}
	step := 0
	reserveAllocs := testing.AllocsPerRun(50, func() {
		g, _ := m.Reserve(bg, res)
		if !g[0].OK {
			t.Fatal(g[0].Reason)
		}
		if step++; step%2 == 0 {
			com[0].Accepted = 2
		} else {
			com[0].Accepted = 1
		}
		if _, err := m.Commit(bg, com); err != nil {
			t.Fatal(err)
		}
	})
	if reserveAllocs > 3 {
		t.Errorf("a Reserve+Commit step allocates %.1f times, want <= 3 (the returned slices)", reserveAllocs)
	}
	// Commit alone never allocates. The count is the process's: on one P,
	// as AllocsPerRun measures, no other goroutine allocates between the
	// two reads.
	var before, after runtime.MemStats
	var mallocs uint64
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	for range 50 {
		if _, err := m.Reserve(bg, res); err != nil {
			t.Fatal(err)
		}
		runtime.ReadMemStats(&before)
		_, err := m.Commit(bg, com)
		runtime.ReadMemStats(&after)
		if err != nil {
			t.Fatal(err)
		}
		mallocs += after.Mallocs - before.Mallocs
	}
	if mallocs != 0 {
		t.Errorf("50 batched Commits allocated %d times, want 0", mallocs)
	}
}
