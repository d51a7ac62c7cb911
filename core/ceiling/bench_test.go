package ceiling

import (
	"math/rand/v2"
	"testing"
)

// mooncakeLike records a run shaped like the bundled Mooncake replay
// (mooncakeTrace).
func mooncakeLike() *Recorder {
	r := NewRecorder(mooncakeTPB)
	mooncakeTrace().replay(r)
	return r
}

const mooncakeTPB = 64

// trace is a run's recorder calls, to replay into a Recorder.
type trace []traceCall

type traceCall struct {
	admit []int32 // the prompt of an Admit and Count; else
	hold  int     // Hold of this many tokens, or, when negative, Drop
	seq   uint64
}

func (tr trace) replay(r *Recorder) {
	for _, c := range tr {
		switch {
		case c.admit != nil:
			r.Admit(c.seq, "", c.admit, 0)
			r.Count(c.seq)
		case c.hold < 0:
			r.Drop(c.seq)
		default:
			r.Hold(c.seq, c.hold)
		}
	}
}

// mooncakeTrace is a run shaped like the bundled Mooncake replay: 2000
// requests of about 200 blocks of 64 tokens in conversations that extend
// their earlier turns, 64 running at once, prefill in chunks of 128 blocks.
func mooncakeTrace() trace {
	rng := rand.New(rand.NewPCG(1, 2))
	const tpb, reqs, running = mooncakeTPB, 2000, 64
	var tr trace
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
		tr = append(tr, traceCall{admit: p, seq: i})
		for h := 128 * tpb; ; h += 128 * tpb {
			tr = append(tr, traceCall{hold: min(h, len(p)), seq: i})
			if h >= len(p) {
				break
			}
		}
		active = append(active, i)
		if len(active) > running {
			k := rng.IntN(len(active))
			tr = append(tr, traceCall{hold: -1, seq: active[k]})
			active = append(active[:k], active[k+1:]...)
		}
	}
	return tr
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

// BenchmarkRecord: recording a Mooncake-shaped run (mooncakeLike), which
// a run pays as it goes: each prompt hashed into its chain of blocks once.
func BenchmarkRecord(b *testing.B) {
	tr := mooncakeTrace()
	for b.Loop() {
		tr.replay(NewRecorder(mooncakeTPB))
	}
}
