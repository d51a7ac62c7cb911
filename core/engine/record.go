package engine

import (
	"github.com/kvx-dev/kvx/core/report"
)

// sample records the end of a step that finished at engine time at (ns) in
// the report's series: the KV usage the last invariant check saw, the
// scheduler's running and waiting requests, the preemptions and the prefix
// hits of the requests admitted so far. complete calls it, so it sees the
// same engine whether or not the step overlapped a forward.
func (e *Engine) sample(at int64) {
	usage := -1.0
	for _, st := range e.stages {
		usage = max(usage, st.usage)
	}
	e.series.Add(report.Sample{
		At: at, KVUsage: usage, Running: e.sched.Running(), Waiting: e.sched.Waiting(),
		Preemptions: e.rep.Requests.Preemptions, Reused: e.admittedReused, Admitted: e.admitted,
	})
}

// record is r's entry in the report (Spec.KeepRequests).
func record(r *request) report.RequestRecord {
	ms := func(ns int64) *float64 {
		v := float64(ns) / 1e6
		return &v
	}
	rec := report.RequestRecord{
		ID: uint64(r.id), Status: report.RequestUnfinished, ArrivalMs: float64(r.arrival) / 1e6,
		PromptTokens: r.prompt, Generated: len(r.tok.Generated()), ReusedTokens: r.reused,
		RecomputedTokens: r.recomputed, Preemptions: r.preempts, Suspensions: r.suspends,
		Cache: cacheRecord(r),
	}
	switch r.state {
	case stDone:
		rec.Status = report.RequestFinished
	case stRejected:
		rec.Status = report.RequestRejected
		rec.Generated = 0
	case stFailed:
		rec.Status = report.RequestFailed
	}
	if r.firstTok >= 0 {
		rec.FirstTokenMs, rec.TTFTMs = ms(r.firstTok), ms(r.firstTok-r.arrival)
	}
	if r.state == stDone {
		rec.FinishMs, rec.E2EMs = ms(r.finish), ms(r.finish-r.arrival)
		if n := rec.Generated; n > 1 {
			v := float64(r.finish-r.firstTok) / 1e6 / float64(n-1)
			rec.TPOTMs = &v
		}
	}
	return rec
}

// workloadSummary describes the requests of the run.
func (e *Engine) workloadSummary() *report.Workload {
	wl := e.spec.Workload
	w := &report.Workload{Requests: len(wl.Requests), Concurrency: wl.Concurrency}
	for _, r := range wl.Requests {
		w.PromptTokens += int64(len(r.Prompt))
		w.PromptTokensMax = max(w.PromptTokensMax, len(r.Prompt))
		w.OutputTokens += int64(r.OutputLen)
		w.OutputTokensMax = max(w.OutputTokensMax, r.OutputLen)
		if wl.Concurrency == 0 {
			w.LastArrivalS = max(w.LastArrivalS, float64(r.Arrival)/1e9)
		}
		if r.Rejected != "" {
			w.RejectedOnArrival++
		}
	}
	return w
}
