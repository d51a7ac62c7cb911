package setup

import (
	"context"
	"errors"
	"os"
	"runtime"
	"slices"

	"github.com/hashicorp/go-hclog"

	"github.com/kvx-dev/kvx/core/config"
	"github.com/kvx-dev/kvx/core/engine"
	"github.com/kvx-dev/kvx/core/host"
	"github.com/kvx-dev/kvx/core/registry"
	"github.com/kvx-dev/kvx/core/report"
	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
	"github.com/kvx-dev/kvx/scenarios"
)

// DemoScenario names what runs without a configuration file, for a report.
const DemoScenario = "bundled demo scenario (scenarios/demo.yaml)"

// LoadConfig loads one configuration from files (later ones override
// earlier ones), the KVX_* environment, sets and varies (a variant's --vary
// values; config.LoadVaried). Without files it loads the bundled demo
// scenario, written to the temporary directory with its trace. The notices
// are config.LoadVaried's, for the caller to print, also on an error.
func LoadConfig(reg *registry.Registry, files, sets, varies []string) (*config.Config, []string, error) {
	sets = slices.Clone(sets)
	if len(files) == 0 {
		path, trace, err := scenarios.WriteDemo(os.TempDir())
		if err != nil {
			return nil, nil, err
		}
		files = []string{path}
		sets = append([]string{"workload.trace=" + trace}, sets...)
	}
	return config.LoadVaried(reg, files, os.Environ(), sets, varies)
}

// Run runs p's spec once, as kvx run and kvx generate do: on the threads
// its device wants (Threads), with a fresh launcher of p's plugins, closed
// when the run ends. The caller sets what else the spec carries (Progress,
// KeepRequests, KeepOutputs, a workload) before. An error is BudgetHint's
// and is recorded in the report too (Error, and Status failed, or
// interrupted when ctx ended); the report always carries the resolved
// configuration, and what the run reached.
func (p *Prepared) Run(ctx context.Context, log hclog.Logger) (report.Report, error) {
	p.Spec.Log = log
	Threads(p.Config.Device)
	l := p.Launcher(log)
	rep, err := engine.Run(ctx, p.Spec, l)
	l.Close()
	if err != nil {
		err = p.BudgetHint(err)
		rep.Error = err.Error()
		rep.Status = report.StatusFailed
		if ctx.Err() != nil {
			rep.Status = report.StatusInterrupted
		}
	}
	rep.ResolvedConfig = p.Config.Flatten()
	return rep, err
}

// ConfigError reports whether err, from starting or running an engine, is
// the configuration's fault rather than the engine's: a plugin that is
// missing, of the wrong kind or protocol, or a configuration a manager or
// worker refused.
func ConfigError(err error) bool {
	switch kvcache.KindOf(err) {
	case kvcache.KindInvalidConfig, kvcache.KindUnsupported:
		return true
	}
	return errors.Is(err, host.ErrNotFound) || errors.Is(err, host.ErrProtocol)
}

// Threads runs this process on one OS thread at a time for the sim device:
// the step loop is sequential and plugin calls wait on the network, so more
// threads only spin (measured on 2 cores: a third of the wall time). A
// device that computes in this process keeps every core. GOMAXPROCS in the
// environment always wins. (A server keeps every core on any device: its
// HTTP connections run beside the engine loop.)
func Threads(device string) {
	if os.Getenv("GOMAXPROCS") != "" {
		return
	}
	if !config.Computing(device) {
		runtime.GOMAXPROCS(1)
	} else {
		runtime.GOMAXPROCS(runtime.NumCPU())
	}
}
