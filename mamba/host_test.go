package mamba_test

import (
	"context"
	"testing"

	"github.com/kvx-dev/kvx/cmd/builtin"
	"github.com/kvx-dev/kvx/core/config"
	"github.com/kvx-dev/kvx/core/engine"
	"github.com/kvx-dev/kvx/core/report"
	"github.com/kvx-dev/kvx/core/setup"
)

// runScenario runs scenarios/cpu-hybrid.yaml (real Mamba2 and attention
// kernels on the cpu device) in-process with sets.
func runScenario(t *testing.T, sets ...string) report.Report {
	t.Helper()
	cfg, _, err := config.Load(builtin.Registry(), []string{"../scenarios/cpu-hybrid.yaml"}, nil, append([]string{"isolation=inprocess"}, sets...))
	if err != nil {
		t.Fatalf("config: %v", err)
	}
	res, err := setup.Resolve(cfg, cfg.CacheManager, true)
	if err != nil {
		t.Fatalf("resolve: %v", err)
	}
	l := setup.NewLauncher(cfg, builtin.Registry(), nil)
	defer l.Close()
	rep, err := engine.Run(context.Background(), res.Spec, l)
	if err != nil {
		t.Fatalf("run: %v", err)
	}
	if rep.Invariants.Violations != 0 {
		t.Fatalf("%d violations: %v", rep.Invariants.Violations, rep.Invariants.First)
	}
	return rep
}

// TestSuspendedStatesResumeExactly: under memory pressure with a host tier
// and MAX_UTILIZATION, the mamba manager suspends requests mid-generation
// (their live Mamba2 states copied to the host-ssm pool and back into other
// live slots), on one stage and on two, and the outputs equal cachemgr_v1's,
// which frees and recomputes instead.
func TestSuspendedStatesResumeExactly(t *testing.T) {
	pressure := []string{"kv_cache_config.max_tokens=640", "kv_cache_config.host_cache_size=1048576",
		"scheduler_config.capacity_scheduler_policy=MAX_UTILIZATION", "workload.concurrency=6", "workload.requests=16"}
	for _, pp := range []string{"1", "2"} {
		t.Run("pp="+pp, func(t *testing.T) {
			sets := append([]string{"pipeline_parallel_size=" + pp}, pressure...)
			ref := runScenario(t, append([]string{"cache_manager=v1"}, sets...)...)
			got := runScenario(t, append([]string{"cache_manager=mamba"}, sets...)...)
			if got.Requests.Suspensions == 0 {
				t.Fatalf("mamba suspended nothing (preemptions %d): the test needs pressure", got.Requests.Preemptions)
			}
			if got.Requests.Completed != got.Requests.Total || got.Outputs.Digest != ref.Outputs.Digest || got.Tokens.Generated != ref.Tokens.Generated {
				t.Fatalf("mamba: %d/%d completed, outputs %s (%d tokens); v1 %s (%d)", got.Requests.Completed, got.Requests.Total,
					got.Outputs.Digest, got.Tokens.Generated, ref.Outputs.Digest, ref.Tokens.Generated)
			}
			t.Logf("mamba: %d suspensions of %d preemptions, outputs %s as v1's", got.Requests.Suspensions, got.Requests.Preemptions, got.Outputs.Digest)
		})
	}
}

// TestSnapshotsReusedFromHost: with an ssm pool of a few snapshot slots
// (pool_ratio) and a host tier, the snapshots the device evicts move to
// host-ssm slots and later requests reuse them from there: more prefix
// reuse than the same run without host_cache_size, none of it through host
// attention blocks (the attention pool never evicts), so the difference
// came through host snapshots; and the outputs equal cachemgr_v1's, which
// recomputes every prompt.
func TestSnapshotsReusedFromHost(t *testing.T) {
	sets := []string{"kv_cache_config.pool_ratio=[0.9998,0.0002]", "workload.requests=24"}
	ref := runScenario(t, append([]string{"cache_manager=v1"}, sets...)...)
	dev := runScenario(t, append([]string{"cache_manager=mamba"}, sets...)...)
	host := runScenario(t, append([]string{"cache_manager=mamba", "kv_cache_config.host_cache_size=33554432"}, sets...)...)
	for _, r := range []struct {
		name string
		rep  report.Report
	}{{"device only", dev}, {"host tier", host}} {
		got := r.rep
		if got.Requests.Completed != got.Requests.Total || got.Outputs.Digest != ref.Outputs.Digest || got.Tokens.Generated != ref.Tokens.Generated {
			t.Fatalf("mamba (%s): %d/%d completed, outputs %s (%d tokens); v1 %s (%d)", r.name, got.Requests.Completed, got.Requests.Total,
				got.Outputs.Digest, got.Tokens.Generated, ref.Outputs.Digest, ref.Tokens.Generated)
		}
	}
	if dev.Snapshots == nil || dev.Snapshots.Evicted == 0 {
		t.Fatalf("device-only snapshots %+v: the test needs snapshot evictions", dev.Snapshots)
	}
	if host.Tokens.PrefixReused <= dev.Tokens.PrefixReused || host.Tokens.PrefixReusedByTier.Host != 0 {
		t.Fatalf("prefix reuse with the host tier %d (%d through host blocks), without %d: want more, none through host blocks",
			host.Tokens.PrefixReused, host.Tokens.PrefixReusedByTier.Host, dev.Tokens.PrefixReused)
	}
	t.Logf("prefix reuse %d tokens with host snapshots, %d without; snapshots %+v; outputs %s as v1's",
		host.Tokens.PrefixReused, dev.Tokens.PrefixReused, *host.Snapshots, host.Outputs.Digest)
}
