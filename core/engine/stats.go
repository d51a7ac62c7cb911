package engine

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/zeebo/xxh3"

	"github.com/kvx-dev/kvx/core/report"
	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
)

// finishReport fills in the figures that are known only at the end.
func (e *Engine) finishReport(ctx context.Context) {
	rep := &e.rep
	rep.Engine.Steps = int64(e.steps)
	rep.Engine.WallS = time.Since(e.started).Seconds()
	rep.Engine.Modelled = e.modelled
	rep.Engine.Uncalibrated = e.spec.Hardware.Uncalibrated && e.modelled
	var ttft, tpot, e2e []float64
	digest := xxh3.New()
	var buf [4]byte
	var end int64
	for _, r := range e.reqs {
		if r.state != stRejected { // a rejected request counts in no token total
			rep.Tokens.Prompt += int64(r.prompt)
		}
		switch r.state {
		case stDone:
			rep.Requests.Completed++
			ttft = append(ttft, float64(r.firstTok-r.arrival)/1e6)
			e2e = append(e2e, float64(r.finish-r.arrival)/1e6)
			if n := len(r.tok.Generated()); n > 1 {
				tpot = append(tpot, float64(r.finish-r.firstTok)/1e6/float64(n-1))
			}
			end = max(end, r.finish)
		case stRejected:
			rep.Requests.Rejected++
		case stFailed:
			rep.Requests.Failed++
		}
		for _, t := range r.tok.Generated() {
			buf[0], buf[1], buf[2], buf[3] = byte(t), byte(t>>8), byte(t>>16), byte(t>>24)
			digest.Write(buf[:])
		}
		buf = [4]byte{0xff, 0xff, 0xff, 0xff} // request separator
		digest.Write(buf[:])
		if e.spec.KeepOutputs {
			o := report.RequestOutput{
				ID: uint64(r.id), Tokens: slices.Clone(r.tok.Generated()), Logits: r.logits, LogitsAt: r.logitsAt,
			}
			if r.topK > 0 && len(r.logprobs) == len(o.Tokens) {
				o.TopLogprobs = make([][]report.TokenLogprob, len(r.logprobs))
				for j, l := range r.logprobs {
					o.TopLogprobs[j] = make([]report.TokenLogprob, len(l))
					for k, c := range l {
						o.TopLogprobs[j][k] = report.TokenLogprob{ID: c.ID, Logprob: c.Logprob}
					}
				}
			}
			if r.dec.Logprobs && len(r.chosen) == len(o.Tokens) {
				o.Logprobs = slices.Clone(r.chosen)
			}
			if r.state == stDone {
				o.FinishReason = "length"
				if r.stopped {
					o.FinishReason = "stop"
				}
			}
			rep.Outputs.Requests = append(rep.Outputs.Requests, o)
		}
		if e.spec.KeepRequests {
			rep.Requests.Records = append(rep.Requests.Records, record(r))
		}
	}
	rep.Workload = e.workloadSummary()
	rep.Series = e.series.Series()
	rep.Outputs.Digest = fmt.Sprintf("%016x", digest.Sum64())
	rep.Latency = report.Latency{
		TTFTP50: report.Percentile(ttft, 50), TTFTP99: report.Percentile(ttft, 99),
		TPOTP50: report.Percentile(tpot, 50), TPOTP99: report.Percentile(tpot, 99),
		E2EP50: report.Percentile(e2e, 50), E2EP99: report.Percentile(e2e, 99),
		Quantiles: report.NewQuantiles(ttft, tpot, e2e),
	}
	if end > 0 {
		s := float64(end) / 1e9
		rep.Throughput = report.Throughput{
			OutputTokensPerS: float64(rep.Tokens.Generated) / s,
			RequestsPerS:     float64(rep.Requests.Completed) / s,
			EngineS:          s,
			SimulatedS:       s,
		}
	}
	if rep.Tokens.MissReasons == nil {
		rep.Tokens.MissReasons = missHistogram()
	}
	if rep.Tokens.Prompt > 0 {
		rep.Tokens.HitRate = float64(rep.Tokens.PrefixReused) / float64(rep.Tokens.Prompt)
	}
	rep.Tokens.Ceiling = e.ceilingReport()
	rep.KV.Stages = rep.KV.Stages[:0]
	var snaps report.Snapshots
	hasSnaps := false
	for _, st := range e.stages {
		u := report.StageUsage{Stage: st.idx, PeakUsage: st.peak, MaxSeqTokens: st.layout.MaxSeqTokens}
		for _, p := range st.layout.Pools {
			u.Pools = append(u.Pools, report.Pool{Name: p.Name, Tier: string(p.Tier), Blocks: p.Blocks, BlockBytes: p.BlockBytes, Tokens: p.TokensPerBlock})
		}
		if st.m != nil {
			e.dog.arm(slotCall, fmt.Sprintf("stage %d: cache manager Info and Stats for the report", st.idx), e.spec.Liveness.Call, st.m)
			if info, err := st.m.Info(ctx); err == nil {
				u.Manager = info.Name + " " + info.Version
			}
			if s, err := st.m.Stats(ctx); err == nil {
				u.Evictions = s.Evictions + st.base.Evictions
				sn := addSnapshots(s.Snapshots, st.base.Snapshots)
				if sn != (kvcache.SnapshotStats{}) {
					hasSnaps = true
					snaps.Taken += sn.Taken
					snaps.Skipped += sn.Skipped
					snaps.Evicted += sn.Evicted
					snaps.ReusedTokens += sn.ReusedTokens
				}
			}
			e.dog.disarm(slotCall)
		}
		rep.KV.Stages = append(rep.KV.Stages, u)
		rep.KV.PeakUsage = max(rep.KV.PeakUsage, st.peak)
	}
	if hasSnaps {
		rep.Snapshots = &snaps
	}
	e.bar.finish(e)
}

// addSnapshots is the sum of two managers' (or two lives') snapshot counters.
func addSnapshots(a, b kvcache.SnapshotStats) kvcache.SnapshotStats {
	a.Taken += b.Taken
	a.Skipped += b.Skipped
	a.Evicted += b.Evicted
	a.ReusedTokens += b.ReusedTokens
	return a
}
