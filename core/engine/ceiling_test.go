package engine_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/kvx-dev/kvx/cmd/builtin"
	"github.com/kvx-dev/kvx/core/config"
	"github.com/kvx-dev/kvx/core/engine"
	"github.com/kvx-dev/kvx/core/report"
	"github.com/kvx-dev/kvx/core/setup"
	"github.com/kvx-dev/kvx/internal/race"
)

// runConfig runs files with sets in-process, keeping the request records.
func runConfig(t *testing.T, files []string, sets ...string) report.Report {
	t.Helper()
	cfg, _, err := config.Load(builtin.Registry(), files, nil, append([]string{"isolation=inprocess"}, sets...))
	if err != nil {
		t.Fatalf("config: %v", err)
	}
	res, err := setup.Resolve(cfg, strings.Join(sets, " "), true)
	if err != nil {
		t.Fatalf("resolve: %v", err)
	}
	res.Spec.KeepRequests = true
	l := setup.NewLauncher(cfg, builtin.Registry(), nil)
	defer l.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	rep, err := engine.Run(ctx, res.Spec, l)
	if err != nil {
		t.Fatalf("run: %v", err)
	}
	return rep
}

// TestCeilingBoundsEveryManager: on the bundled sim scenarios (shortened)
// and on a small cache under pressure, with and without a host tier, the
// reuse ceiling at the run's capacity is never below what v1, v2 or mamba
// reused, the infinite cache's never below it, and it counts the same
// admissions as the manager's figures. Somewhere the capacity binds (the
// ceiling at it is below the infinite cache's), so the bound is not only
// the infinite cache's. Nothing in it is concurrent: the race pass leaves it
// to the plain pass, and -short runs the demo and the small cache only.
func TestCeilingBoundsEveryManager(t *testing.T) {
	if race.Enabled {
		t.Skip("nothing concurrent: the plain pass runs it")
	}
	pressure := []string{
		"model=llama-3.1-8b", "attention_backend=gqa", "device=sim", "max_batch_size=4", "max_num_tokens=64",
		"max_seq_len=320", "enable_chunked_prefill=true", "kv_cache_config.enable_block_reuse=true",
		"kv_cache_config.tokens_per_block=16", "kv_cache_config.max_tokens=640",
		"scheduler_config.capacity_scheduler_policy=MAX_UTILIZATION", "workload.requests=40", "workload.concurrency=6",
		"workload.prompt_tokens={min: 120, max: 260}", "workload.output_tokens={min: 16, max: 48}",
		"workload.shared_prefix_tokens=96", "workload.shared_prefix_groups=5", "workload.seed=7",
	}
	cases := []struct {
		name     string
		files    []string
		sets     []string
		managers []string
		hosts    []string
	}{
		{"demo", []string{"../../scenarios/demo.yaml"}, []string{"workload.limit=150"}, []string{"v1", "v2", "mamba"}, []string{"0", "32GiB"}},
		{"host-tier", []string{"../../scenarios/host-tier.yaml"}, []string{"workload.limit=200", "kv_cache_config.free_gpu_memory_fraction=0.04"},
			[]string{"v1", "v2", "mamba"}, []string{"0", "400GB"}},
		{"seed-a-reuse", []string{"../../scenarios/seed-a-reuse.yaml"}, []string{"workload.requests=12"}, []string{"v1", "v2"}, []string{"0"}},
		{"seed-b", []string{"../../scenarios/seed-b.yaml"}, nil, []string{"v1", "mamba"}, []string{"0"}},
		{"pressure", nil, pressure, []string{"v1", "v2", "mamba"}, []string{"0", "20000000000"}},
	}
	binds := false
	for _, tc := range cases {
		if testing.Short() && tc.name != "demo" && tc.name != "pressure" {
			continue
		}
		for _, m := range tc.managers {
			for _, host := range tc.hosts {
				name := fmt.Sprintf("%s/%s/host=%s", tc.name, m, host)
				t.Run(name, func(t *testing.T) {
					sets := append(append([]string(nil), tc.sets...), "cache_manager="+m, "kv_cache_config.host_cache_size="+host)
					rep := runConfig(t, tc.files, sets...)
					tok := rep.Tokens
					c := tok.Ceiling
					if c == nil || c.Device == nil {
						t.Fatalf("no ceiling at the device capacity: %+v", c)
					}
					if (host != "0") != (c.DeviceHost != nil) {
						t.Errorf("host tier %s, device+host ceiling %+v", host, c.DeviceHost)
					}
					best := c.Best()
					if best.Reused < tok.PrefixReused {
						t.Errorf("ceiling %d tokens at %d blocks, below the manager's reuse %d", best.Reused, best.CapacityBlocks, tok.PrefixReused)
					}
					if c.DeviceHost == nil && c.Device.Reused < tok.PrefixReused {
						t.Errorf("device ceiling %d below the manager's reuse %d", c.Device.Reused, tok.PrefixReused)
					}
					if c.Infinite < best.Reused || c.Device.Reused > best.Reused || c.Reachable < c.Infinite {
						t.Errorf("device %d, best %d, infinite %d, reachable %d: want device <= best <= infinite <= reachable",
							c.Device.Reused, best.Reused, c.Infinite, c.Reachable)
					}
					counted := 0
					for _, r := range rep.Requests.Records {
						if r.Cache != nil {
							counted++
						}
					}
					if c.Requests != counted || counted == 0 {
						t.Errorf("ceiling over %d admissions, the manager's reuse over %d", c.Requests, counted)
					}
					binds = binds || best.Reused < c.Infinite
					t.Logf("reused %d, ceiling device %d (%d blocks), best %d (%d blocks), infinite %d; %d preemptions, %d suspended",
						tok.PrefixReused, c.Device.Reused, c.Device.CapacityBlocks, best.Reused, best.CapacityBlocks, c.Infinite,
						rep.Requests.Preemptions, rep.Requests.Suspensions)
				})
			}
		}
	}
	if !binds {
		t.Errorf("the capacity bound nowhere: every ceiling is the infinite cache's, and the test checks only that")
	}
}
