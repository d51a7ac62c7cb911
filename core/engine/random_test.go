package engine_test

import (
	"math/rand/v2"
	"testing"

	cachemgrv1 "github.com/kvx-dev/kvx/cachemgr_v1"
	cachemgrv2 "github.com/kvx-dev/kvx/cachemgr_v2"
	"github.com/kvx-dev/kvx/core/engine"
	"github.com/kvx-dev/kvx/core/sched"
	"github.com/kvx-dev/kvx/core/workload"
	"github.com/kvx-dev/kvx/device"
	"github.com/kvx-dev/kvx/dsa"
	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
	"github.com/kvx-dev/kvx/plugins/v1/worker"
)

// TestRandomTracesV1V2 drives cachemgr_v1 and cachemgr_v2 through the whole
// engine with the same seeded random traces — pipeline depth 1 to 4, 0 to 2
// drafts, reuse on and off, both capacity policies, caches from roomy to
// barely one request, with and without a host tier to suspend to — for at
// least 10^5 engine steps in all. Every step is
// checked against the managers' ledgers (every 8th deeply); no request may
// fail, and both managers must produce the same tokens.
func TestRandomTracesV1V2(t *testing.T) {
	target := int64(100_000)
	if testing.Short() {
		target = 10_000
	}
	managers := map[string]func() kvcache.Manager{
		"v1": func() kvcache.Manager { return cachemgrv1.New() },
		"v2": func() kvcache.Manager { return cachemgrv2.New() },
	}
	var steps int64
	for seed := uint64(1); steps < target; seed++ {
		rng := rand.New(rand.NewPCG(seed, 0x5eed))
		pp := 1 + rng.IntN(4)
		draft := rng.IntN(3)
		reuse := rng.IntN(2) == 0
		policy := sched.Policy(rng.IntN(2))
		if rng.IntN(2) == 0 {
			policy = sched.MaxUtilization
		}
		const maxSeqLen = 2048
		cache := maxSeqLen + 600 + rng.IntN(6*maxSeqLen) // one request end to end plus a chunk, and up
		hostTier := rng.IntN(2) == 0                     // v2 suspends to it under MAX_UTILIZATION; v1 has none
		wl, err := workload.GenerateWorkload(workload.GenOptions{
			Requests: 10 + rng.IntN(40), PromptMin: 64, PromptMax: 64 + rng.IntN(1500),
			OutputMin: 1, OutputMax: 1 + rng.IntN(200), SharedPrefix: rng.IntN(2) * 64,
			SharedGroups: 1 + rng.IntN(3), Rate: float64(5 + rng.IntN(200)), Seed: seed,
		})
		if err != nil {
			t.Fatal(err)
		}
		ts := testSpec{pp: pp, draft: draft, reuse: reuse, policy: policy, cacheTokens: cache, reqs: wl, maxSeqLen: maxSeqLen}
		digests := map[string]string{}
		for name, mk := range managers {
			s := buildSpec(t, ts)
			s.DeepEvery = 8
			if hostTier && name == "v2" {
				for i := range s.Managers {
					s.Managers[i].HostBytes = 2 * s.Managers[i].DeviceBytes
				}
			}
			rep, err := engine.Run(t.Context(), s, inproc{manager: mk, worker: func() worker.Worker { return device.NewWorker(dsa.Backend) }})
			if err != nil {
				t.Fatalf("seed %d (pp %d draft %d reuse %v policy %v cache %d) %s: %v\nviolations: %v", seed, pp, draft, reuse, policy, cache, name, err, rep.Invariants.First)
			}
			if rep.Requests.Failed != 0 || rep.Requests.Completed+rep.Requests.Rejected != rep.Requests.Total {
				t.Fatalf("seed %d %s: requests %+v", seed, name, rep.Requests)
			}
			for _, rj := range rep.Requests.Rejections {
				if rj.Reason == "" {
					t.Fatalf("seed %d %s: rejection of %d without a reason", seed, name, rj.ID)
				}
			}
			digests[name] = rep.Outputs.Digest
			steps += rep.Engine.Steps
		}
		if digests["v1"] != digests["v2"] {
			t.Fatalf("seed %d: outputs digest v1 %s, v2 %s", seed, digests["v1"], digests["v2"])
		}
	}
	t.Logf("%d engine steps", steps)
}
