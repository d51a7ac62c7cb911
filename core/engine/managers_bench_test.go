//go:build unix

package engine_test

import (
	"context"
	"os"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kvx-dev/kvx/cmd/builtin"
	"github.com/kvx-dev/kvx/core/config"
	"github.com/kvx-dev/kvx/core/engine"
	"github.com/kvx-dev/kvx/core/setup"
	"github.com/kvx-dev/kvx/core/testbin"
)

// managerScenarios are the bundled sim scenarios, each a bounded prefix of
// its requests (so that one iteration of all of them in process takes a
// few seconds), with the managers that serve its model, v1 first: the
// baseline.
var managerScenarios = []struct {
	name     string
	file     string
	sets     []string
	managers []string
}{
	{"demo", "demo.yaml", []string{"workload.limit=150"}, []string{"v1", "v2", "mamba"}},
	{"host-tier", "host-tier.yaml", []string{"workload.limit=250"}, []string{"v1", "v2", "mamba"}},
	{"seed-a", "seed-a.yaml", []string{"workload.requests=16", "workload.output_tokens=1024"}, []string{"v1", "v2", "mamba"}},
	{"seed-a-reuse", "seed-a-reuse.yaml", []string{"workload.requests=16", "workload.output_tokens=1024"}, []string{"v1", "v2", "mamba"}},
	{"seed-b", "seed-b.yaml", nil, []string{"v1", "mamba"}}, // hybrid: v2 serves no SSM layer
	{"seed-b-avg9000", "seed-b-avg9000.yaml", nil, []string{"v1", "mamba"}},
}

// BenchmarkManagersOnScenario replays each bundled sim scenario
// (managerScenarios) in-process with every manager that serves its model,
// back to back in each iteration, and reports each manager's CPU time per
// run (user + system of the whole process: the engine, the sim worker and
// the GC included, as in a kvx compare on the sim) and its ratio to v1's,
// "v2/v1" and "mamba/v1". DESIGN §8: v2 within 1.25x of v1, so that an A/B
// on the sim measures the policies, not the managers' bookkeeping. The
// outputs must not depend on the manager where the scenario's figures say
// so; that is core/equiv's to prove, not this benchmark's.
func BenchmarkManagersOnScenario(b *testing.B) {
	benchManagers(b, "isolation=inprocess")
}

// BenchmarkManagersOnScenarioPlugins is BenchmarkManagersOnScenario with
// the cache manager and the worker as plugin processes (isolation:
// plugin, the default), kvx's binaries from core/testbin: the CPU time is
// the engine's and its plugin processes' together (they are waited for
// before it is read), so the transport is in it as a user sees it.
func BenchmarkManagersOnScenarioPlugins(b *testing.B) {
	dir, err := testbin.Build()
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { os.RemoveAll(dir) })
	benchManagers(b, "isolation=plugin", "plugin_dirs="+dir)
}

func benchManagers(b *testing.B, isolation ...string) {
	for _, tc := range managerScenarios {
		b.Run(tc.name, func(b *testing.B) {
			runs := make([]func() time.Duration, len(tc.managers))
			for i, m := range tc.managers {
				sets := append(append([]string{"cache_manager=" + m}, isolation...), tc.sets...)
				runs[i] = prepareRun(b, "../../scenarios/"+tc.file, sets)
			}
			cpu := make([]time.Duration, len(tc.managers))
			for range b.N {
				for i, run := range runs {
					cpu[i] += run()
				}
			}
			for i, m := range tc.managers {
				b.ReportMetric(float64(cpu[i].Milliseconds())/float64(b.N), m+"-cpu-ms")
				if i > 0 && cpu[0] > 0 {
					b.ReportMetric(float64(cpu[i])/float64(cpu[0]), m+"/v1")
				}
			}
		})
	}
}

// prepareRun loads and resolves file with sets (isolation=inprocess unless
// they say otherwise) and returns a function that runs it once and returns
// the CPU time it took: the process's and its plugin processes', which the
// launcher's Close waits for (after a GC, so that the last run's garbage is
// not charged to this one).
func prepareRun(b *testing.B, file string, sets []string) func() time.Duration {
	b.Helper()
	cfg, _, err := config.Load(builtin.Registry(), []string{file}, nil, append([]string{"isolation=inprocess"}, sets...))
	if err != nil {
		b.Fatalf("config %s %v: %v", file, sets, err)
	}
	return func() time.Duration {
		res, err := setup.Resolve(cfg, strings.Join(sets, " "), true)
		if err != nil {
			b.Fatalf("resolve %s %v: %v", file, sets, err)
		}
		l := setup.NewLauncher(cfg, builtin.Registry(), nil)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		runtime.GC()
		start := cpuTime(b)
		rep, err := engine.Run(ctx, res.Spec, l)
		l.Close()
		took := cpuTime(b) - start
		if err != nil {
			b.Fatalf("run %s %v: %v", file, sets, err)
		}
		if rep.Invariants.Violations > 0 {
			b.Fatalf("run %s %v: %d invariant violations, first %q", file, sets, rep.Invariants.Violations, rep.Invariants.First)
		}
		return took
	}
}

// cpuTime is the user and system CPU time so far of the process and of its
// children that have been waited for (the plugin processes of finished
// runs).
func cpuTime(b *testing.B) time.Duration {
	var t time.Duration
	for _, who := range []int{syscall.RUSAGE_SELF, syscall.RUSAGE_CHILDREN} {
		var ru syscall.Rusage
		if err := syscall.Getrusage(who, &ru); err != nil {
			b.Fatalf("getrusage: %v", err)
		}
		t += time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	return t
}
