package setup

import (
	"context"
	"errors"
	"fmt"
	"io"
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

// RunOptions are what a batch of runs (kvx run and compare) asks of each.
type RunOptions struct {
	Log      hclog.Logger
	Progress io.Writer // a progress bar per run; nil for none
	// Requests keeps one record per request in each report; Explain keeps
	// them too, for these request ids, in Outcome.Records only.
	Requests bool
	Explain  []uint64
}

// Outcome is what a batch of runs gives: a report per variant that ran, in
// order, and the failures.
type Outcome struct {
	Reports []report.Report
	// Records are each report's request records (also without
	// RunOptions.Requests when Explain asks for some).
	Records [][]report.RequestRecord
	// Failed holds each failed run's error, prefixed "variant NAME: ";
	// ConfigError says whose fault each is.
	Failed []error
	// Ran is whether any run took a step (a run that failed before its
	// first, e.g. a plugin that did not start, has nothing to tabulate).
	Ran bool
}

// RunAll runs every prepared variant in turn (Prepared.Run), with the
// same options, and stops before the next one, or at once, when ctx ends:
// the reports so far are the outcome.
func RunAll(ctx context.Context, ps []*Prepared, o RunOptions) Outcome {
	var out Outcome
	for _, p := range ps {
		if ctx.Err() != nil {
			break // interrupted: no next variant
		}
		p.Spec.Progress = o.Progress
		p.Spec.KeepRequests = o.Requests || len(o.Explain) > 0
		rep, err := p.Run(ctx, o.Log)
		out.Records = append(out.Records, rep.Requests.Records)
		if !o.Requests {
			rep.Requests.Records = nil // kept for Explain alone
		}
		out.Reports = append(out.Reports, rep)
		out.Ran = out.Ran || rep.Engine.Steps > 0
		if err != nil {
			out.Failed = append(out.Failed, fmt.Errorf("variant %s: %w", p.Spec.Variant, err))
		}
		if ctx.Err() != nil {
			break // interrupted: a comparison stops at once
		}
	}
	return out
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
