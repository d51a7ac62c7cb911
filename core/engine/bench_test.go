package engine_test

import (
	"testing"

	"github.com/kvx-dev/kvx/core/sched"
	"github.com/kvx-dev/kvx/core/workload"
)

// BenchmarkReplayMooncake replays the first 500 requests of the bundled
// Mooncake trace on DeepSeek-V3.2 (PP 2, MTP 1, block reuse, MAX_UTILIZATION)
// in-process with cachemgr_v1 and the sim worker, checking invariants after
// every step. It reports engine steps per second and ns per step.
func BenchmarkReplayMooncake(b *testing.B) {
	reqs, err := workload.LoadMooncake("../../scenarios/traces/mooncake_conversation.jsonl", workload.MooncakeOptions{Limit: 500})
	if err != nil {
		b.Fatal(err)
	}
	s := buildSpec(b, testSpec{pp: 2, draft: 1, reuse: true, policy: sched.MaxUtilization, cacheTokens: 1 << 20,
		reqs: workload.Workload{Requests: reqs}, maxSeqLen: 131072})
	s.DeepEvery = 64
	b.ResetTimer()
	var steps int64
	for range b.N {
		rep := runSpec(b, s, v1Launcher())
		steps += rep.Engine.Steps
	}
	b.ReportMetric(float64(steps)/b.Elapsed().Seconds(), "steps/s")
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(steps), "ns/step")
}
