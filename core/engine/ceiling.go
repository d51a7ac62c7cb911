package engine

import (
	"time"

	"github.com/kvx-dev/kvx/core/report"
	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
)

// The reuse ceiling (core/ceiling) hears of every request's admission with
// the reuse it took (admission.Reserve), whether that admission's reuse is
// the one the report counts (accountCache), the prompt blocks it holds as
// its prefill commits (complete, and a resume) and when it stops holding
// them (release, the end of a step that finishes it, a suspension, a
// plugin restart). None of this changes a figure the engine had before.

// ceilingReport replays the recorded events at the stages' capacities; nil
// when nothing was recorded.
func (e *Engine) ceilingReport() *report.Ceiling {
	if e.ceil == nil {
		return nil
	}
	start := time.Now()
	dev, total, sized := e.ceilingCapacity()
	var caps []int
	if sized {
		caps = append(caps, dev)
		if total > dev {
			caps = append(caps, total)
		}
	}
	res := e.ceil.Result(caps...)
	rate := func(n int64) float64 {
		if e.rep.Tokens.Prompt == 0 {
			return 0
		}
		return float64(n) / float64(e.rep.Tokens.Prompt)
	}
	c := &report.Ceiling{
		Infinite: res.Infinite, InfiniteHitRate: rate(res.Infinite),
		Requests: res.Requests, Reachable: res.Reachable, PinnedPeakBlocks: res.PinnedPeak,
	}
	if sized {
		c.Device = &report.CeilingAt{CapacityBlocks: dev, Reused: res.At[0], HitRate: rate(res.At[0])}
		if total > dev {
			c.DeviceHost = &report.CeilingAt{CapacityBlocks: total, Reused: res.At[1], HitRate: rate(res.At[1])}
		}
	}
	e.log.Debug("reuse ceiling", "took", time.Since(start), "requests", res.Requests, "blocks", res.Blocks, "uses", res.Uses, "infinite", res.Infinite, "capacities", caps, "reused", res.At)
	return c
}

// ceilingCapacity is the run's cache capacity in blocks of the recorder's
// size: per stage and tier its smallest full-attention pool (a reused
// prefix needs every block of it in each), and over the stages the least
// device capacity and the least device plus host capacity (a prefix is
// reused only where every stage holds it). sized is false when a stage has
// no full-attention device pool (windowed or state pools alone, whose reuse
// this model does not bound).
func (e *Engine) ceilingCapacity() (device, total int, sized bool) {
	tpb := e.ceil.TokensPerBlock()
	for i, st := range e.stages {
		d, h := -1, 0
		for _, p := range st.layout.Pools {
			if p.Window != 0 || p.TokensPerBlock <= 0 {
				continue
			}
			n := int(int64(p.Blocks) * int64(p.TokensPerBlock) / int64(tpb))
			switch {
			case p.Tier == kvcache.TierHost && (h == 0 || n < h):
				h = n
			case p.Tier != kvcache.TierHost && (d < 0 || n < d):
				d = n
			}
		}
		if d < 0 {
			return 0, 0, false
		}
		if i == 0 {
			device, total = d, d+h
		}
		device, total = min(device, d), min(total, d+h)
	}
	return device, total, len(e.stages) > 0
}
