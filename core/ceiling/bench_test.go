package ceiling

import (
	"math/rand/v2"
	"testing"
)

// mooncakeLike records a run shaped like the bundled Mooncake replay: 2000
// requests of about 200 blocks of 64 tokens in conversations that extend
// their earlier turns, 64 running at once, prefill in chunks of 128 blocks.
func mooncakeLike() *Recorder {
	rng := rand.New(rand.NewPCG(1, 2))
	const tpb, reqs, running = 64, 2000, 64
	r := NewRecorder(tpb)
	var convs [][]int32
	next := int32(0)
	block := func() []int32 {
		b := make([]int32, tpb)
		for i := range b {
			b[i] = next
		}
		next++
		return b
	}
	var active []uint64
	prompts := map[uint64][]int32{}
	for i := range uint64(reqs) {
		var p []int32
		if len(convs) > 0 && rng.IntN(3) > 0 {
			c := rng.IntN(len(convs))
			p = append(p, convs[c]...)
			for range 1 + rng.IntN(20) {
				p = append(p, block()...)
			}
			convs[c] = p
		} else {
			for range 50 + rng.IntN(300) {
				p = append(p, block()...)
			}
			convs = append(convs, p)
		}
		p = append(p, 7) // a partial block
		prompts[i] = p
		r.Admit(i, "", p, 0)
		r.Count(i)
		for h := 128 * tpb; ; h += 128 * tpb {
			r.Hold(i, min(h, len(p)))
			if h >= len(p) {
				break
			}
		}
		active = append(active, i)
		if len(active) > running {
			k := rng.IntN(len(active))
			r.Drop(active[k])
			active = append(active[:k], active[k+1:]...)
		}
	}
	return r
}

// BenchmarkResult: the ceiling of a Mooncake-shaped run at a device and a
// device + host capacity.
func BenchmarkResult(b *testing.B) {
	r := mooncakeLike()
	b.ResetTimer()
	for range b.N {
		res := r.Result(5271, 290034)
		b.ReportMetric(float64(res.Infinite)/float64(res.Reachable), "infinite/reachable")
	}
}
