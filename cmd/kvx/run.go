package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/kvx-dev/kvx/cmd/builtin"
	"github.com/kvx-dev/kvx/core/config"
	"github.com/kvx-dev/kvx/core/engine"
	"github.com/kvx-dev/kvx/core/host"
	"github.com/kvx-dev/kvx/core/report"
	"github.com/kvx-dev/kvx/core/setup"
	"github.com/kvx-dev/kvx/core/workload"
	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
	"github.com/kvx-dev/kvx/scenarios"
)

// runExitStatus is the exit status paragraph of run's and compare's help.
const runExitStatus = `Exit status: 0 when every run finished, 1 when an engine failed or an
invariant broke, 2 for bad configuration or usage (every variant's
configuration, plugin paths and output paths are checked before the first
run), 130, 143 or 129 when SIGINT, SIGTERM or SIGHUP stopped it (the partial
report is written first).`

// runOpts are the flags of run and compare.
type runOpts struct {
	jsonOut    string
	htmlOut    string
	noProgress bool
	requests   bool
	varies     []string
	explain    []string // --explain: request ids, repeatable or comma lists
	explainIDs []uint64 // parsed by prepare
	capacity   string   // compare --capacity: the load key swept
	sloTTFT    float64  // compare --slo-ttft-p95-ms
}

func newRunCmd(g *globals) *cobra.Command {
	o := &runOpts{}
	cmd := &cobra.Command{
		Use:   "run",
		Short: "Replay a trace or scenario and print the report",
		Long: `Replay a trace or scenario and print the report.
Without --config, the bundled demo scenario runs.

` + runExitStatus,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runVariants(cmd.Context(), g, o, []setup.Variant{{}})
		},
	}
	addRunFlags(cmd, o)
	return cmd
}

func newCompareCmd(g *globals) *cobra.Command {
	o := &runOpts{}
	cmd := &cobra.Command{
		Use:   "compare",
		Short: "Run variants of one config on the same workload and print them side by side",
		Long: `Run variants of one config on the same workload and print them side by side.
Each --vary key=a,b,c adds one variant per value; several --vary flags give
every combination; without --vary, compare varies cache_manager=v1,v2.
Without --config, the bundled demo scenario runs.

` + runExitStatus,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			vs, err := setup.Variants(o.varies)
			if err != nil {
				return usageErr(err)
			}
			if err := checkCapacityFlags(o); err != nil {
				return usageErr(err)
			}
			return runVariants(cmd.Context(), g, o, vs)
		},
	}
	addRunFlags(cmd, o)
	cmd.Flags().StringArrayVar(&o.varies, "vary", nil, "key=a,b[,c]: one variant per value (repeatable; default "+setup.DefaultVary+")")
	cmd.Flags().StringVar(&o.capacity, "capacity", "", "KEY: report each configuration's capacity, the largest KEY value (a --vary sweep, e.g. workload.concurrency) kept at p95 TTFT within --slo-ttft-p95-ms")
	cmd.Flags().Float64Var(&o.sloTTFT, "slo-ttft-p95-ms", 0, "the p95 TTFT SLO of --capacity, in ms")
	return cmd
}

// checkCapacityFlags: --capacity needs its SLO and a --vary of its key,
// and the SLO needs --capacity.
func checkCapacityFlags(o *runOpts) error {
	switch {
	case o.capacity == "" && o.sloTTFT != 0:
		return fmt.Errorf("--slo-ttft-p95-ms %v: it is --capacity's SLO; give --capacity KEY too", o.sloTTFT)
	case o.capacity == "":
		return nil
	case !(o.sloTTFT > 0):
		return fmt.Errorf("--capacity %s: give the SLO as --slo-ttft-p95-ms MS (a positive number; got %v)", o.capacity, o.sloTTFT)
	case !slices.ContainsFunc(o.varies, func(v string) bool { return strings.HasPrefix(strings.TrimSpace(v), o.capacity+"=") }):
		return fmt.Errorf("--capacity %s: no --vary sweeps it; add --vary %s=a,b,c", o.capacity, o.capacity)
	}
	return nil
}

func addRunFlags(cmd *cobra.Command, o *runOpts) {
	cmd.Flags().StringVar(&o.jsonOut, "json", "", "write the report as JSON to this file ('-' for stdout)")
	cmd.Flags().StringVar(&o.htmlOut, "html", "", "write the report as an HTML page with charts to this file")
	cmd.Flags().BoolVar(&o.noProgress, "no-progress", false, "do not show the progress bar")
	cmd.Flags().BoolVar(&o.requests, "requests", false, "put one record per request in the JSON report (requests.records): arrival, first token, finish, TTFT, TPOT, tokens, reuse, preemptions")
	cmd.Flags().StringArrayVar(&o.explain, "explain", nil, "after the run, print how the prefix cache served request REQ (its id, as in requests.records): tokens reused from each tier, computed and why, preemptions (repeatable, or a comma list)")
}

// explainIDs parses the --explain values into request ids of wl; a value
// that is not a number or not a request of wl is an error naming it and
// the range of ids.
func explainIDs(vals []string, wl workload.Workload) ([]uint64, error) {
	var ids []uint64
	if len(vals) == 0 {
		return nil, nil
	}
	known := make(map[uint64]bool, len(wl.Requests))
	var lo, hi uint64
	for i, r := range wl.Requests {
		known[r.ID] = true
		if i == 0 || r.ID < lo {
			lo = r.ID
		}
		hi = max(hi, r.ID)
	}
	span := "the workload has no requests"
	if len(wl.Requests) > 0 {
		span = fmt.Sprintf("the workload's %d requests have ids %d..%d", len(wl.Requests), lo, hi)
	}
	var errs []error
	for _, v := range vals {
		for _, f := range strings.Split(v, ",") {
			f = strings.TrimSpace(f)
			id, err := strconv.ParseUint(f, 10, 64)
			switch {
			case err != nil:
				errs = append(errs, fmt.Errorf("--explain %q: not a request id (a number): %s", f, span))
			case !known[id]:
				errs = append(errs, fmt.Errorf("--explain %d: no such request: %s", id, span))
			case !slices.Contains(ids, id):
				ids = append(ids, id)
			}
		}
	}
	return ids, errors.Join(errs...)
}

// loadConfig loads the configuration of one variant (varies: its --vary
// values); without --config it uses the bundled demo scenario.
func loadConfig(g *globals, varies []string) (*config.Config, error) {
	files := g.configs
	sets := slices.Clone(g.sets)
	if len(files) == 0 {
		path, trace, err := scenarios.WriteDemo(os.TempDir())
		if err != nil {
			return nil, err
		}
		files = []string{path}
		sets = append([]string{"workload.trace=" + trace}, sets...)
	}
	cfg, notices, err := config.LoadVaried(builtin.Registry(), files, os.Environ(), sets, varies)
	for _, n := range notices {
		fmt.Fprintln(os.Stderr, "notice:", n)
	}
	return cfg, err
}

// prepare loads and checks every variant before any runs
// (setup.PrepareAll: its config, its resolved spec with the memory budgets
// and the workload, its plugin binaries, and the --explain ids), and the
// output paths. Problems are reported together as a usage error (exit 2).
func prepare(g *globals, o *runOpts, vs []setup.Variant) ([]*setup.Prepared, error) {
	load := func(sets []string) (*config.Config, error) { return loadConfig(g, sets) }
	ps, err := setup.PrepareAll(vs, builtin.Registry(), load, func(p *setup.Prepared) (err error) {
		o.explainIDs, err = explainIDs(o.explain, p.Spec.Workload)
		return err
	})
	var errs []error
	if err != nil {
		errs = append(errs, err)
	}
	if o.jsonOut == "-" && o.htmlOut == "-" {
		errs = append(errs, errors.New("--json - and --html - both write to stdout; give one of them a file"))
	}
	for _, out := range []struct{ flag, path string }{{"--json", o.jsonOut}, {"--html", o.htmlOut}} {
		if err := checkWritable(out.path); err != nil {
			errs = append(errs, fmt.Errorf("%s %s: %w", out.flag, out.path, err))
		}
	}
	if len(errs) > 0 {
		return nil, usageErr(errors.Join(errs...))
	}
	return ps, nil
}

// checkWritable reports why path ("" for none, "-" for stdout) cannot be
// written, without truncating or leaving anything behind: an existing file
// is opened for writing, else a file is created and removed in its
// directory.
func checkWritable(path string) error {
	if path == "" || path == "-" {
		return nil
	}
	if fi, err := os.Stat(path); err == nil {
		if fi.IsDir() {
			return errors.New("is a directory")
		}
		f, err := os.OpenFile(path, os.O_WRONLY, 0)
		if err != nil {
			return err
		}
		return f.Close()
	}
	f, err := os.CreateTemp(filepath.Dir(path), ".kvx-check-*")
	if err != nil {
		return fmt.Errorf("cannot create files in %s: %w", filepath.Dir(path), errors.Unwrap(err))
	}
	f.Close()
	return os.Remove(f.Name())
}

// configError reports whether err, from a run, is the configuration's fault
// rather than the engine's: a plugin that is missing, of the wrong kind or
// protocol, or a configuration a manager or worker refused.
func configError(err error) bool {
	switch kvcache.KindOf(err) {
	case kvcache.KindInvalidConfig, kvcache.KindUnsupported:
		return true
	}
	return errors.Is(err, host.ErrNotFound) || errors.Is(err, host.ErrProtocol)
}

func runVariants(ctx context.Context, g *globals, o *runOpts, vs []setup.Variant) error {
	ps, err := prepare(g, o, vs)
	if err != nil {
		return err
	}
	log := g.logger()
	// With --json - (or --html -) stdout carries only that document.
	table := io.Writer(os.Stdout)
	if o.jsonOut == "-" || o.htmlOut == "-" {
		table = os.Stderr
	}
	var reports []report.Report
	var explained [][]report.RequestRecord // per report, for --explain
	var failed []error
	code, ran := 0, false
	for _, p := range ps {
		if ctx.Err() != nil {
			break // interrupted: no next variant
		}
		if !o.noProgress && term.IsTerminal(int(os.Stderr.Fd())) {
			p.Spec.Progress = os.Stderr
		}
		p.Spec.Log = log
		p.Spec.KeepRequests = o.requests || len(o.explainIDs) > 0
		oneThreadForSim(p.Config.Device)
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
		explained = append(explained, rep.Requests.Records)
		if !o.requests {
			rep.Requests.Records = nil // kept for --explain alone
		}
		reports = append(reports, rep)
		ran = ran || rep.Engine.Steps > 0
		if err != nil {
			failed = append(failed, fmt.Errorf("variant %s: %w", p.Spec.Variant, err))
			c := 1
			if configError(err) {
				c = 2
			}
			code = max(code, c)
		}
		if ctx.Err() != nil {
			break // interrupted: compare stops at once
		}
	}
	// A run that failed before its first step (a plugin that did not
	// start) has nothing to tabulate: the message below says it all.
	if ran || len(failed) == 0 {
		if err := report.WriteTable(table, reports); err != nil {
			return err
		}
	}
	if err := writeExplain(table, o.explainIDs, reports, explained); err != nil {
		return err
	}
	var capacity *report.Capacity
	if o.capacity != "" && len(reports) > 0 {
		c, err := report.NewCapacity(reports, o.capacity, o.sloTTFT)
		if err != nil {
			return err
		}
		if err := report.WriteCapacity(table, c); err != nil {
			return err
		}
		capacity = c
	}
	if err := writeDocument(reports, scenarioName(g), o.jsonOut, o.htmlOut, capacity); err != nil {
		return err
	}
	if len(failed) > 0 {
		return &exitError{code: code, err: errors.Join(failed...)}
	}
	return nil
}

// writeExplain prints, per report, the records of the requests ids asked
// for (kvx run --explain); a request the run did not reach says so.
func writeExplain(w io.Writer, ids []uint64, reports []report.Report, records [][]report.RequestRecord) error {
	for _, id := range ids {
		for i, rep := range reports {
			fmt.Fprintln(w)
			j := slices.IndexFunc(records[i], func(r report.RequestRecord) bool { return r.ID == id })
			if j < 0 {
				fmt.Fprintf(w, "request %d (%s): the run stopped before it\n", id, rep.Variant)
				continue
			}
			if err := report.WriteExplain(w, rep.Variant, records[i][j]); err != nil {
				return err
			}
		}
	}
	return nil
}

// scenarioName names what ran, for the report: the configuration files,
// or the bundled demo scenario.
func scenarioName(g *globals) string {
	if len(g.configs) == 0 {
		return "bundled demo scenario (scenarios/demo.yaml)"
	}
	return strings.Join(g.configs, " + ")
}

// writeFile writes with write to path ('-' for stdout).
// writeDocument writes the kvx.report/v1 document of reports, named for
// scenario, as JSON to jsonOut and as the HTML page to htmlOut (either ""
// for none, "-" for standard output), with capacity (compare --capacity)
// when not nil.
func writeDocument(reports []report.Report, scenario, jsonOut, htmlOut string, capacity *report.Capacity) error {
	doc := report.NewDocument("kvx "+kvxVersion(), reports)
	doc.Capacity = capacity
	doc.Created = time.Now().UTC().Format(time.RFC3339)
	doc.Scenario = scenario
	doc.Command = os.Args
	if jsonOut != "" {
		if err := writeFile(jsonOut, func(w io.Writer) error { return report.WriteJSON(w, doc) }); err != nil {
			return err
		}
	}
	if htmlOut != "" {
		if err := writeFile(htmlOut, func(w io.Writer) error { return report.WriteHTML(w, doc) }); err != nil {
			return err
		}
	}
	return nil
}

func writeFile(path string, write func(io.Writer) error) error {
	if path == "-" {
		return write(os.Stdout)
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := write(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// oneThreadForSim runs kvx on one OS thread at a time for the sim device:
// the step loop is sequential and plugin calls wait on the network, so more
// threads only spin (measured on 2 cores: a third of the wall time). A
// device that computes in this process keeps every core. GOMAXPROCS in the
// environment always wins.
func oneThreadForSim(device string) {
	if os.Getenv("GOMAXPROCS") != "" {
		return
	}
	if !config.Computing(device) {
		runtime.GOMAXPROCS(1)
	} else {
		runtime.GOMAXPROCS(runtime.NumCPU())
	}
}
