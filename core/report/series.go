package report

// MaxPoints bounds the points of a Series: a run of any length is
// down-sampled to at most this many.
const MaxPoints = 500

// Series is a run's figures over engine time (simulated on device sim,
// measured otherwise), one entry per point in every list. A point covers
// an interval of IntervalS seconds of engine time and is stamped with the
// time of its last sample (the end of the last step that fell in it);
// kv_usage, running and waiting are the interval's maximum, preemptions and
// hit_rate the value at its last sample.
type Series struct {
	IntervalS float64   `json:"interval_s"`
	TS        []float64 `json:"t_s"`
	// KVUsage is the fullest stage's device blocks in use over its device
	// blocks, a fraction in [0, 1]; it is read from the invariant checks'
	// snapshots, so it is empty when check_invariants is off.
	KVUsage []float64 `json:"kv_usage"`
	Running []int     `json:"running"`
	Waiting []int     `json:"waiting"`
	// Preemptions is the count since the start of the run.
	Preemptions []int `json:"preemptions"`
	// HitRate is the prefix hit rate since the start of the run: prompt
	// tokens the prefix cache supplied over the prompt tokens of the
	// requests admitted so far (at the end, tokens.hit_rate).
	HitRate []float64 `json:"hit_rate"`
}

// Sample is what the engine knows at the end of one step.
type Sample struct {
	At          int64   // engine time in ns
	KVUsage     float64 // fraction in [0, 1]; negative when not known
	Running     int
	Waiting     int
	Preemptions int   // since the start
	Reused      int64 // prompt tokens the prefix cache supplied, since the start
	Admitted    int64 // prompt tokens of the requests admitted, since the start
}

// Sampler down-samples a run's samples to at most MaxPoints points: each
// point covers an interval of engine time, and when a sample would make one
// point too many, the intervals double and neighbours merge. It keeps
// MaxPoints+1 points at most, whatever the run's length, and allocates only
// while it first grows. The zero value is ready to use.
type Sampler struct {
	width  int64 // ns of engine time per point
	pts    []point
	kvSeen bool // some sample knew the KV usage
}

// point is one interval's summary.
type point struct {
	last     Sample // the interval's last sample
	kv       float64
	running  int
	waiting  int
	interval int64 // At / width when the point was made
}

// initialWidth is the first interval: 1 ms of engine time.
const initialWidth = int64(1e6)

// Add records s; samples come in non-decreasing At.
func (sp *Sampler) Add(s Sample) {
	if sp.width == 0 {
		sp.width = initialWidth
	}
	sp.kvSeen = sp.kvSeen || s.KVUsage >= 0
	k := s.At / sp.width
	if n := len(sp.pts); n > 0 && sp.pts[n-1].interval >= k {
		p := &sp.pts[n-1]
		p.last = s
		p.kv, p.running, p.waiting = max(p.kv, s.KVUsage), max(p.running, s.Running), max(p.waiting, s.Waiting)
		return
	}
	sp.pts = append(sp.pts, point{last: s, kv: s.KVUsage, running: s.Running, waiting: s.Waiting, interval: k})
	for len(sp.pts) > MaxPoints {
		sp.widen()
	}
}

// widen doubles the intervals and merges the points that now share one.
func (sp *Sampler) widen() {
	sp.width *= 2
	out := sp.pts[:0]
	for _, p := range sp.pts {
		p.interval = p.last.At / sp.width
		if n := len(out); n > 0 && out[n-1].interval == p.interval {
			q := &out[n-1]
			q.last = p.last
			q.kv, q.running, q.waiting = max(q.kv, p.kv), max(q.running, p.running), max(q.waiting, p.waiting)
			continue
		}
		out = append(out, p)
	}
	sp.pts = out
}

// Series returns what was recorded; nil when nothing was.
func (sp *Sampler) Series() *Series {
	if len(sp.pts) == 0 {
		return nil
	}
	n := len(sp.pts)
	s := &Series{
		IntervalS: float64(sp.width) / 1e9,
		TS:        make([]float64, n), KVUsage: []float64{}, Running: make([]int, n), Waiting: make([]int, n),
		Preemptions: make([]int, n), HitRate: make([]float64, n),
	}
	for i, p := range sp.pts {
		s.TS[i] = float64(p.last.At) / 1e9
		if sp.kvSeen {
			s.KVUsage = append(s.KVUsage, max(p.kv, 0))
		}
		s.Running[i], s.Waiting[i], s.Preemptions[i] = p.running, p.waiting, p.last.Preemptions
		if p.last.Admitted > 0 {
			s.HitRate[i] = float64(p.last.Reused) / float64(p.last.Admitted)
		}
	}
	return s
}
