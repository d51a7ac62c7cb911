package report

import (
	"math"
	"testing"
)

// TestSamplerBounded: a run of any length gives at most MaxPoints points,
// in time order, each interval's maximum kept for usage and queues and its
// last value for the running counts.
func TestSamplerBounded(t *testing.T) {
	for _, n := range []int{1, 10, MaxPoints, MaxPoints + 1, 100_000} {
		var sp Sampler
		spikeAt := n / 3
		for k := range n {
			s := Sample{At: int64(k) * 7e6, KVUsage: 0.25, Running: 3, Waiting: 1, Preemptions: k, Reused: int64(k), Admitted: int64(2 * k)}
			if k == spikeAt {
				s.KVUsage, s.Running, s.Waiting = 0.9, 40, 17
			}
			sp.Add(s)
		}
		s := sp.Series()
		m := len(s.TS)
		if m == 0 || m > MaxPoints || m > n {
			t.Fatalf("%d samples: %d points, want 1..min(%d, %d)", n, m, n, MaxPoints)
		}
		for _, l := range []int{len(s.KVUsage), len(s.Running), len(s.Waiting), len(s.Preemptions), len(s.HitRate)} {
			if l != m {
				t.Fatalf("%d samples: lists of %d and %d points", n, m, l)
			}
		}
		kv, run, wait := 0.0, 0, 0
		for i := range m {
			if i > 0 && s.TS[i] <= s.TS[i-1] {
				t.Fatalf("%d samples: t_s[%d] = %v after %v", n, i, s.TS[i], s.TS[i-1])
			}
			kv, run, wait = math.Max(kv, s.KVUsage[i]), max(run, s.Running[i]), max(wait, s.Waiting[i])
		}
		if kv != 0.9 || run != 40 || wait != 17 {
			t.Errorf("%d samples: maxima %v, %d, %d; want the spike 0.9, 40, 17 kept", n, kv, run, wait)
		}
		if last := float64(n-1) * 7e6 / 1e9; s.TS[m-1] != last || s.Preemptions[m-1] != n-1 {
			t.Errorf("%d samples: last point at %v with %d preemptions, want %v and %d", n, s.TS[m-1], s.Preemptions[m-1], last, n-1)
		}
		if n > 1 && s.HitRate[m-1] != 0.5 {
			t.Errorf("%d samples: last hit rate %v, want 0.5", n, s.HitRate[m-1])
		}
		if n == 100_000 && m < MaxPoints/2 {
			t.Errorf("%d samples down-sampled to %d points; doubling intervals should keep at least %d", n, m, MaxPoints/2)
		}
	}
}

// TestSamplerUnknownUsage: without invariant checks the KV usage is not
// known, and the series says so with an empty list rather than zeros.
func TestSamplerUnknownUsage(t *testing.T) {
	var sp Sampler
	if sp.Series() != nil {
		t.Fatalf("a sampler with no samples gives a series")
	}
	for k := range 10 {
		sp.Add(Sample{At: int64(k) * 1e9, KVUsage: -1, Running: 1})
	}
	if s := sp.Series(); len(s.KVUsage) != 0 || len(s.Running) != 10 {
		t.Errorf("kv_usage %v, running %v; want no usage and 10 points", s.KVUsage, s.Running)
	}
}

func TestNewQuantiles(t *testing.T) {
	if NewQuantiles(nil, nil, nil) != nil {
		t.Errorf("quantiles of no request")
	}
	var ttft, e2e []float64
	for k := 200; k >= 1; k-- {
		ttft = append(ttft, float64(k))
		e2e = append(e2e, float64(10*k))
	}
	q := NewQuantiles(ttft, nil, e2e)
	if len(q.P) != len(QuantilePoints) || len(q.TTFTMs) != len(q.P) || len(q.E2EMs) != len(q.P) || len(q.TPOTMs) != 0 {
		t.Fatalf("lengths p %d, ttft %d, e2e %d, tpot %d", len(q.P), len(q.TTFTMs), len(q.E2EMs), len(q.TPOTMs))
	}
	for i := range q.P {
		if i > 0 && (q.P[i] <= q.P[i-1] || q.TTFTMs[i] < q.TTFTMs[i-1]) {
			t.Errorf("not increasing at %d: p %v, ttft %v", i, q.P[i-1:i+1], q.TTFTMs[i-1:i+1])
		}
	}
	if q.TTFTMs[0] != 1 || q.TTFTMs[len(q.P)-1] != 200 || q.E2EMs[50] != 1000 {
		t.Errorf("p0 %v, p100 %v, e2e p50 %v; want 1, 200, 1000", q.TTFTMs[0], q.TTFTMs[len(q.P)-1], q.E2EMs[50])
	}
}
