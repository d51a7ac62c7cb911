package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"slices"
	"strings"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/kvx-dev/kvx/cmd/builtin"
	"github.com/kvx-dev/kvx/core/config"
	"github.com/kvx-dev/kvx/core/engine"
	"github.com/kvx-dev/kvx/core/report"
	"github.com/kvx-dev/kvx/core/setup"
	"github.com/kvx-dev/kvx/scenarios"
)

// runOpts are the flags of run and compare.
type runOpts struct {
	jsonOut    string
	htmlOut    string
	noProgress bool
	varies     []string
}

func newRunCmd(g *globals) *cobra.Command {
	o := &runOpts{}
	cmd := &cobra.Command{
		Use:   "run",
		Short: "Replay a trace or scenario and print the report",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runVariants(cmd.Context(), g, o, []variant{{name: "run"}})
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
Without --config, the bundled demo scenario runs.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			vs, err := variants(o.varies)
			if err != nil {
				return usageErr(err)
			}
			return runVariants(cmd.Context(), g, o, vs)
		},
	}
	addRunFlags(cmd, o)
	cmd.Flags().StringArrayVar(&o.varies, "vary", nil, "key=a,b[,c]: one variant per value (repeatable; default "+defaultVary+")")
	return cmd
}

func addRunFlags(cmd *cobra.Command, o *runOpts) {
	cmd.Flags().StringVar(&o.jsonOut, "json", "", "write the report as JSON to this file ('-' for stdout)")
	cmd.Flags().StringVar(&o.htmlOut, "html", "", "write the report as an HTML page with charts to this file")
	cmd.Flags().BoolVar(&o.noProgress, "no-progress", false, "do not show the progress bar")
}

// defaultVary is what compare varies without --vary: the cache managers.
const defaultVary = "cache_manager=v1,v2"

// variant is one configuration of a comparison: the base plus some sets.
type variant struct {
	name string
	sets []string
}

// variants expands --vary flags into their cartesian product.
func variants(varies []string) ([]variant, error) {
	if len(varies) == 0 {
		varies = []string{defaultVary}
	}
	out := []variant{{}}
	for _, v := range varies {
		key, vals, ok := strings.Cut(v, "=")
		key = strings.TrimSpace(key)
		if !ok || key == "" || vals == "" {
			return nil, fmt.Errorf("--vary %q: want key=a,b[,c]", v)
		}
		var next []variant
		for _, base := range out {
			for _, val := range strings.Split(vals, ",") {
				val = strings.TrimSpace(val)
				nv := variant{sets: append(slices.Clone(base.sets), key+"="+val)}
				nv.name = strings.TrimPrefix(base.name+" "+key+"="+val, " ")
				next = append(next, nv)
			}
		}
		out = next
	}
	return out, nil
}

// loadConfig loads the configuration of one variant; without --config it
// uses the bundled demo scenario.
func loadConfig(g *globals, extra []string) (*config.Config, error) {
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
	cfg, notices, err := config.Load(files, os.Environ(), append(sets, extra...))
	for _, n := range notices {
		fmt.Fprintln(os.Stderr, "notice:", n)
	}
	return cfg, err
}

func runVariants(ctx context.Context, g *globals, o *runOpts, vs []variant) error {
	log := g.logger()
	var reports []report.Report
	var failed error
	for _, v := range vs {
		if ctx.Err() != nil {
			break // interrupted: no next variant
		}
		cfg, err := loadConfig(g, v.sets)
		if err != nil {
			return usageErr(err)
		}
		name := v.name
		if name == "run" {
			name = cfg.CacheManager
		}
		res, err := setup.Resolve(cfg, name, true)
		if err != nil {
			return usageErr(err)
		}
		if !o.noProgress && term.IsTerminal(int(os.Stderr.Fd())) {
			res.Spec.Progress = os.Stderr
		}
		res.Spec.Log = log
		oneThreadForSim(cfg.Device)
		l := setup.NewLauncher(cfg, builtin.Registry(), log)
		rep, err := engine.Run(ctx, res.Spec, l)
		l.Close()
		reports = append(reports, rep)
		if err != nil {
			failed = errors.Join(failed, fmt.Errorf("variant %s: %w", name, err))
		}
		if ctx.Err() != nil {
			break // interrupted: compare stops at once
		}
	}
	if err := report.WriteTable(os.Stdout, reports); err != nil {
		return err
	}
	if o.jsonOut != "" {
		if err := writeFile(o.jsonOut, reports, report.WriteJSON); err != nil {
			return err
		}
	}
	if o.htmlOut != "" {
		if err := writeFile(o.htmlOut, reports, report.WriteHTML); err != nil {
			return err
		}
	}
	if failed != nil {
		return engineErr(failed)
	}
	return nil
}

// writeFile writes the reports with write to path ('-' for stdout).
func writeFile(path string, reports []report.Report, write func(io.Writer, []report.Report) error) error {
	if path == "-" {
		return write(os.Stdout, reports)
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := write(f, reports); err != nil {
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
