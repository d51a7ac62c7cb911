package main

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/kvx-dev/kvx/cmd/builtin"
	calib "github.com/kvx-dev/kvx/core/calibrate"
	"github.com/kvx-dev/kvx/core/hw"
	"github.com/kvx-dev/kvx/core/report"
	"github.com/kvx-dev/kvx/core/setup"
)

type calibrateOpts struct {
	out       string
	json      bool
	refit     []string
	budget    time.Duration
	holdEvery int
	repeat    int
}

func newCalibrateCmd(g *globals) *cobra.Command {
	o := &calibrateOpts{}
	cmd := &cobra.Command{
		Use:   "calibrate",
		Short: "Measure forwards on a computing device and fit the sim's cost model to them",
		Long: `Run a designed set of forwards at the config's model shapes through the real
cache manager and worker plugins on a device that computes (cuda on a GPU
machine, cpu anywhere): prefill chunks of several lengths at several contexts,
decode batches of several sizes at several contexts, and mixed steps. The
design is sized by max_batch_size, max_seq_len and max_num_tokens (see
docs/cuda.md). Each forward's time is taken as the worker reports it (the
device time) and as the host sees it (the forward call, and the whole step:
reserve, forward, commit), and the sim records its kernels for the same
batch on the config's hardware preset.

The sim's calibration (per kernel class a compute and a memory scale against
the datasheet roofline, a launch cost per kernel and an overhead per step) is
then fitted by nonnegative least squares on 3 points in 4 (--hold-out-every)
and its per-step error |sim - measured| / measured is reported on the points
held out, all of them and those of each kind (prefill, decode, mixed) against
the goals of 5% median and 10% p90, with the uncalibrated roofline's for
comparison, and the plugin crossings' share of a step, 1 - forward / step.

--refit FILE adds the points of an earlier calibration file (same hardware
and device) before the fit; with no --config it only refits them. The result
(schema kvx.calibration/v1: hardware, device, models, date, kvx version,
parameters, errors and every raw point) goes to --out; use it with
sim_calibration: FILE.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runCalibrate(g, o, cmd)
		},
	}
	cmd.Flags().StringVarP(&o.out, "out", "o", "calibration.json", "write the calibration file here")
	cmd.Flags().BoolVar(&o.json, "json", false, "also print the calibration file on stdout (the progress and the table go to stderr)")
	cmd.Flags().StringArrayVar(&o.refit, "refit", nil, "add the points of an earlier calibration file (repeatable)")
	cmd.Flags().DurationVar(&o.budget, "budget", 150*time.Second, "stop climbing to longer contexts once measuring took this long (0: no limit)")
	cmd.Flags().IntVar(&o.holdEvery, "hold-out-every", 4, "hold every Nth point out of the fit, N >= 2")
	cmd.Flags().IntVar(&o.repeat, "repeat", 1, "run each measured forward this many times and keep the median time, 1..100 (for noisy machines)")
	return cmd
}

func runCalibrate(g *globals, o *calibrateOpts, cmd *cobra.Command) error {
	if o.holdEvery < 2 {
		return usageErr(fmt.Errorf("calibrate: --hold-out-every %d: allowed: >= 2", o.holdEvery))
	}
	if o.repeat < 1 || o.repeat > 100 {
		return usageErr(fmt.Errorf("calibrate: --repeat %d: allowed: 1 to 100", o.repeat))
	}
	if len(g.configs) == 0 && len(o.refit) == 0 {
		return usageErr(errors.New("calibrate: --config FILE is required (a model on a computing device, e.g. scenarios/calib-llama.yaml), or --refit FILE"))
	}
	stdout := cmd.OutOrStdout()
	progress := cmd.ErrOrStderr()
	table := stdout
	if o.json {
		table = progress
	}
	if o.out == "-" {
		return usageErr(errors.New("calibrate: --out -: give a file (--json prints the calibration on stdout)"))
	}
	if err := report.CheckWritable(o.out); err != nil {
		return usageErr(fmt.Errorf("calibrate: --out %s: %w", o.out, err))
	}

	var m calib.Measurement
	if len(g.configs) > 0 {
		cfg, err := loadConfig(g, nil)
		if err != nil {
			return usageErr(err)
		}
		setup.Threads(cfg.Device)
		m, err = calib.Measure(cmd.Context(), cfg, calib.Options{Name: strings.Join(g.configs, "+"), Budget: o.budget, Repeat: o.repeat,
			Progress: progress, Log: g.logger(), Registry: builtin.Registry(), Sim: builtin.SimCost()})
		switch {
		case errors.Is(err, calib.ErrUnmeasurable):
			return usageErr(err)
		case err != nil:
			return engineErr(err)
		}
	}
	for _, f := range o.refit {
		c, err := hw.LoadCalibration(f)
		if err != nil {
			return usageErr(fmt.Errorf("calibrate: --refit %s: %w", f, err))
		}
		if err := m.Add(*c); err != nil {
			return usageErr(fmt.Errorf("calibrate: --refit %s: %w", f, err))
		}
	}
	cal, err := calib.Fit(m, o.holdEvery, builtin.SimCost())
	if err != nil {
		return engineErr(fmt.Errorf("calibrate: %w", err))
	}
	cal.Created = time.Now().UTC().Format(time.RFC3339)
	cal.Generator = "kvx " + kvxVersion()

	data, err := calib.Encode(cal, o.out)
	if err != nil {
		return engineErr(fmt.Errorf("calibrate: %w", err))
	}
	if err := os.WriteFile(o.out, data, 0o644); err != nil {
		return usageErr(fmt.Errorf("calibrate: --out: %w", err))
	}
	calib.WriteTable(table, cal)
	fmt.Fprintf(table, "wrote %s; use it with --set sim_calibration=%s\n", o.out, o.out)
	if o.json {
		if _, err := stdout.Write(data); err != nil {
			return err
		}
	}
	return nil
}
