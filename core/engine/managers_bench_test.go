//go:build unix

package engine_test

import (
	"context"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kvx-dev/kvx/cmd/builtin"
	"github.com/kvx-dev/kvx/core/config"
	"github.com/kvx-dev/kvx/core/engine"
	"github.com/kvx-dev/kvx/core/setup"
)

// BenchmarkManagersOnScenario replays each bundled sim scenario (a bounded
// prefix of its requests, so that one iteration of all of them takes a few
// seconds) in-process with every manager that serves its model, back to
// back in each iteration, and reports each manager's CPU time per run
// (user + system of the whole process: the engine, the sim worker and the
// GC included, as in a kvx compare on the sim) and its ratio to v1's,
// "v2/v1" and "mamba/v1". DESIGN §8: v2 within 1.25x of v1, so that an A/B
// on the sim measures the policies, not the managers' bookkeeping. The
// outputs must not depend on the manager where the scenario's figures say
// so; that is core/equiv's to prove, not this benchmark's.
func BenchmarkManagersOnScenario(b *testing.B) {
	cases := []struct {
		name     string
		file     string
		sets     []string
		managers []string // v1 first: the baseline
	}{
		{"demo", "demo.yaml", []string{"workload.limit=150"}, []string{"v1", "v2", "mamba"}},
		{"host-tier", "host-tier.yaml", []string{"workload.limit=250"}, []string{"v1", "v2", "mamba"}},
		{"seed-a", "seed-a.yaml", []string{"workload.requests=16", "workload.output_tokens=1024"}, []string{"v1", "v2", "mamba"}},
		{"seed-a-reuse", "seed-a-reuse.yaml", []string{"workload.requests=16", "workload.output_tokens=1024"}, []string{"v1", "v2", "mamba"}},
		{"seed-b", "seed-b.yaml", nil, []string{"v1", "mamba"}}, // hybrid: v2 serves no SSM layer
	}
	for _, tc := range cases {
		b.Run(tc.name, func(b *testing.B) {
			runs := make([]func() time.Duration, len(tc.managers))
			for i, m := range tc.managers {
				runs[i] = prepareRun(b, "../../scenarios/"+tc.file, append([]string{"cache_manager=" + m}, tc.sets...))
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

// prepareRun loads and resolves file with sets in-process and returns a
// function that runs it once and returns the process CPU time it took (after
// a GC, so that the last run's garbage is not charged to this one).
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
		defer l.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		runtime.GC()
		start := cpuTime(b)
		rep, err := engine.Run(ctx, res.Spec, l)
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

// cpuTime is the process's user and system CPU time so far.
func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatalf("getrusage: %v", err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
