package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/kvx-dev/kvx/cmd/builtin"
	"github.com/kvx-dev/kvx/core/config"
	"github.com/kvx-dev/kvx/core/report"
	"github.com/kvx-dev/kvx/core/setup"
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

A compare that varies device over the sim and a device that computes
(--vary device=sim,cpu) also gives, for each sim variant and the measured
variant of the same other --vary values, the sim's error against the
measured figures (TTFT and TPOT p50 and p99, output tok/s, preemptions),
each against a goal of 10%: "sim against measured" after the table, and
sim_against_measured in the JSON and the HTML page.

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

// loadConfig loads the configuration of one variant (varies: its --vary
// values; setup.LoadConfig: without --config, the bundled demo scenario)
// and prints its notices.
func loadConfig(g *globals, varies []string) (*config.Config, error) {
	cfg, notices, err := setup.LoadConfig(builtin.Registry(), g.configs, g.sets, varies)
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
		o.explainIDs, err = setup.ExplainIDs(o.explain, p.Spec.Workload)
		return err
	})
	var errs []error
	if err != nil {
		errs = append(errs, err)
	}
	errs = append(errs, report.CheckOutputs(o.jsonOut, o.htmlOut)...)
	if len(errs) > 0 {
		return nil, usageErr(errors.Join(errs...))
	}
	return ps, nil
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
	var progress io.Writer
	if !o.noProgress && term.IsTerminal(int(os.Stderr.Fd())) {
		progress = os.Stderr
	}
	out := setup.RunAll(ctx, ps, setup.RunOptions{Log: log, Progress: progress, Requests: o.requests, Explain: o.explainIDs})
	reports, failed := out.Reports, out.Failed
	// A run that failed before its first step (a plugin that did not
	// start) has nothing to tabulate: the message below says it all.
	if out.Ran || len(failed) == 0 {
		if err := report.WriteTable(table, reports); err != nil {
			return err
		}
	}
	sims := report.NewSimPairs(reports) // compare --vary device=sim,cpu: the sim against the measured runs
	if err := report.WriteSimPairs(table, sims); err != nil {
		return err
	}
	if err := report.WriteExplains(table, o.explainIDs, reports, out.Records); err != nil {
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
	if err := writeDocument(reports, scenarioName(g), o.jsonOut, o.htmlOut, capacity, sims); err != nil {
		return err
	}
	if len(failed) > 0 {
		code := 1
		if slices.ContainsFunc(failed, setup.ConfigError) {
			code = 2 // a plugin missing or of the wrong kind, a configuration refused
		}
		return &exitError{code: code, err: errors.Join(failed...)}
	}
	return nil
}

// scenarioName names what ran, for the report: the configuration files,
// or the bundled demo scenario.
func scenarioName(g *globals) string {
	if len(g.configs) == 0 {
		return setup.DemoScenario
	}
	return strings.Join(g.configs, " + ")
}

// writeDocument writes the kvx.report/v1 document of reports, named for
// scenario, as JSON to jsonOut and as the HTML page to htmlOut (either ""
// for none, "-" for standard output), with capacity (compare --capacity)
// when not nil and the sim's errors against the measured runs (sims,
// report.NewSimPairs) when any.
func writeDocument(reports []report.Report, scenario, jsonOut, htmlOut string, capacity *report.Capacity, sims []report.SimPair) error {
	doc := report.NewDocument("kvx "+kvxVersion(), reports)
	doc.Capacity = capacity
	doc.SimAgainstMeasured = sims
	doc.Created = time.Now().UTC().Format(time.RFC3339)
	doc.Scenario = scenario
	doc.Command = os.Args
	return report.WriteFiles(doc, jsonOut, htmlOut)
}
