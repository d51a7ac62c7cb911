package conformance_test

import (
	"context"
	"flag"
	"testing"
	"time"

	cachemgrv1 "github.com/kvx-dev/kvx/cachemgr_v1"
	cachemgrv2 "github.com/kvx-dev/kvx/cachemgr_v2"
	"github.com/kvx-dev/kvx/device"
	"github.com/kvx-dev/kvx/dsa"
	"github.com/kvx-dev/kvx/dsa/mla"
	"github.com/kvx-dev/kvx/gqa"
	"github.com/kvx-dev/kvx/internal/race"
	"github.com/kvx-dev/kvx/plugins/conformance"
	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
	"github.com/kvx-dev/kvx/plugins/v1/pluginrpc"
	"github.com/kvx-dev/kvx/plugins/v1/spec"
	"github.com/kvx-dev/kvx/plugins/v1/worker"
)

// cachemgr_v2 has a host tier: the suite's suspend checks run for it.
var _ kvcache.Suspender = (*cachemgrv2.Manager)(nil)

// managers are the repo's cache managers, each with the options it is run
// under.
var managers = []struct {
	name string
	new  func() kvcache.Manager
}{
	{"cachemgr_v1", func() kvcache.Manager { return cachemgrv1.New() }},
	{"cachemgr_v2", func() kvcache.Manager { return cachemgrv2.New() }},
	{"cachemgr_v1-host", func() kvcache.Manager { return hostV1{cachemgrv1.New()} }},
}

// hostV1 is cachemgr_v1 with a host tier for reuse: the suite sends
// HostBytes only to a Suspender, which v1 is not, so it adds them (half the
// device budget, the suite's own default).
type hostV1 struct{ *cachemgrv1.Manager }

func (m hostV1) Configure(ctx context.Context, cfg kvcache.Config) (kvcache.Layout, error) {
	if cfg.HostBytes == 0 {
		cfg.HostBytes = cfg.DeviceBytes / 2
	}
	return m.Manager.Configure(ctx, cfg)
}

// windowed is a Gemma-style model: GQA layers alternating full attention
// and a 64-token sliding window.
func windowed() []spec.Layer {
	m, err := conformance.SmallModel(spec.MixerGQA)
	if err != nil {
		panic(err)
	}
	for i := range m.Layers {
		if i%2 == 1 {
			m.Layers[i].Window = 64
		}
	}
	return m.Layers
}

// variants are the option sets every manager is checked under.
var variants = []struct {
	name string
	opts conformance.ManagerOptions
}{
	{"default", conformance.ManagerOptions{}},
	{"reuse", conformance.ManagerOptions{Reuse: true}},
	{"window-reuse", conformance.ManagerOptions{Layers: windowed(), Reuse: true, Seed: 2}},
	{"tpb32-draft1-reuse", conformance.ManagerOptions{TokensPerBlock: 32, MaxDraftTokens: 1, Reuse: true, Seed: 3}},
}

// raceVariant and raceManager are the one variant and the one manager the
// race pass runs, over gRPC only. The suite calls a manager from one
// goroutine; what there is to race is the gRPC pair's transport, which every
// variant drives through the same calls (pluginrpc's own tests race it too),
// and cachemgr_v2 implements every optional interface the others do
// (Suspender, Explainer, EventReporter, Forker), so its run makes every call
// theirs make. The plain pass runs them all, in process and over gRPC; under
// -race they took 200 CPU-seconds, and the three managers' reuse variant
// over gRPC 22 s.
const (
	raceVariant = "reuse"
	raceManager = "cachemgr_v2"
)

// checkTimeout bounds each check of the suite's own runs, so a call that
// never returns fails naming its check instead of holding the package
// until go test's timeout (once seen under -race on CI, not reproduced).
const checkTimeout = 4 * time.Minute

func TestManagers(t *testing.T) {
	for _, m := range managers {
		for _, v := range variants {
			opts := v.opts
			opts.CheckTimeout = checkTimeout
			name := m.name + "/" + v.name
			t.Run(name+"/inprocess", func(t *testing.T) {
				skipUnderRace(t)
				t.Parallel()
				conformance.TestManager(t, m.new, opts)
			})
			t.Run(name+"/grpc", func(t *testing.T) {
				if v.name != raceVariant || m.name != raceManager {
					skipUnderRace(t)
				}
				t.Parallel()
				conformance.TestManager(t, func() kvcache.Manager { return pluginrpc.TestManagerPair(t, m.new()) }, opts)
			})
		}
	}
}

var seeds = flag.Int("seeds", 0, "run the Random check of every manager and variant under this many more seeds (5,000 operations each)")

// TestManagersManySeeds is the long random search, off by default:
// go test ./plugins/conformance -run ManySeeds -seeds 50
func TestManagersManySeeds(t *testing.T) {
	if *seeds == 0 {
		t.Skip("-seeds 0")
	}
	for _, m := range managers {
		for _, v := range variants {
			t.Run(m.name+"/"+v.name, func(t *testing.T) {
				t.Parallel()
				for seed := uint64(100); seed < 100+uint64(*seeds); seed++ {
					opts := v.opts
					opts.Checks, opts.Seed, opts.RandomOps = []string{"Random"}, seed, 5000
					if err := conformance.CheckManager(context.Background(), m.new, opts); err != nil {
						t.Errorf("seed %d: %v", seed, err)
					}
				}
			})
		}
	}
}

var backends = []struct {
	name string
	b    device.Backend
}{
	{"dsa", dsa.Backend},
	{"mla", mla.Backend},
	{"gqa", gqa.Backend},
}

func TestWorkers(t *testing.T) {
	for _, b := range backends {
		newWorker := func() worker.Worker { return device.NewWorker(b.b) }
		t.Run(b.name+"/inprocess", func(t *testing.T) {
			skipUnderRace(t)
			t.Parallel()
			conformance.TestWorker(t, newWorker, conformance.WorkerOptions{CheckTimeout: checkTimeout})
		})
		t.Run(b.name+"/grpc", func(t *testing.T) {
			t.Parallel()
			conformance.TestWorker(t, func() worker.Worker { return pluginrpc.TestWorkerPair(t, newWorker()) }, conformance.WorkerOptions{CheckTimeout: checkTimeout})
		})
	}
}

// skipUnderRace skips a check in the race detector's pass (make
// test-race), which the plain pass runs: a manager or worker called in
// process (nothing runs on a second goroutine), or, over gRPC, any manager
// and variant but raceManager under raceVariant (whose run makes the same
// transport calls and more).
func skipUnderRace(t *testing.T) {
	t.Helper()
	if race.Enabled {
		t.Skip("raced by the gRPC runs the race pass keeps: run without -race (make test's main pass)")
	}
}
