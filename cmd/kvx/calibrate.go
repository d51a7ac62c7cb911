package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/kvx-dev/kvx/core/hw"
	"github.com/kvx-dev/kvx/device/sim"
)

// minPoints is the fewest points a measurement that stopped early is
// still fitted with.
const minPoints = 12

// Goals of issue 17 (DESIGN.md section 8), printed beside the figures.
const (
	goalMedian   = 0.05 // sim per-step error on held-out points, median
	goalP90      = 0.10 // and p90
	goalCrossing = 0.02 // plugin crossings' share of an engine step
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
held out, with the uncalibrated roofline's for comparison, and the plugin
crossings' share of a step, 1 - forward / step.

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
	if err := checkWritable(o.out); err != nil {
		return usageErr(fmt.Errorf("calibrate: --out %s: %w", o.out, err))
	}

	var points []calibPoint
	notes := []string{}
	var hardware, device string
	var models []string
	if len(g.configs) > 0 {
		cfg, err := loadConfig(g, nil)
		if err != nil {
			return usageErr(err)
		}
		name := strings.Join(g.configs, "+")
		s, res, done, err := newSession(cmd.Context(), g, cfg, name, progress, o.budget)
		if err != nil {
			return err
		}
		s.repeat = o.repeat
		fmt.Fprintf(progress, "calibrate: %s: %s on device %s (hardware %s), max_batch_size %d, max_seq_len %d, max_num_tokens %d\n",
			name, res.Model.Name, cfg.Device, cfg.Hardware, cfg.MaxBatchSize, cfg.MaxSeqLen, cfg.MaxNumTokens)
		skipped, err := s.calibDesign(cmd.Context(), res.Spec.Workers[0].Layout)
		done()
		var ee *exitError
		switch {
		case errors.As(err, &ee):
			return err
		case err != nil && (errors.Is(err, errBudget) || cmd.Context().Err() != nil) && len(s.points) >= minPoints:
			// Stopped early: what was measured is still worth a fit.
			notes = append(notes, fmt.Sprintf("%s: measuring stopped after %d points: %v", name, len(s.points), err))
			fmt.Fprintf(progress, "calibrate: %s: measuring stopped after %d points (%v); fitting them\n", name, len(s.points), err)
		case err != nil:
			return engineErr(fmt.Errorf("calibrate: %s: %w", name, err))
		case skipped > 0:
			notes = append(notes, fmt.Sprintf("%s: the time budget (--budget %s) skipped %d context rungs", name, o.budget, skipped))
		}
		points = s.points
		hardware, device, models = cfg.Hardware, cfg.Device, []string{res.Model.Name}
	}
	for _, f := range o.refit {
		c, err := hw.LoadCalibration(f)
		if err != nil {
			return usageErr(fmt.Errorf("calibrate: --refit %s: %w", f, err))
		}
		if hardware == "" {
			hardware, device = c.Hardware, c.Device
		}
		if !strings.EqualFold(c.Hardware, hardware) || c.Device != device {
			return usageErr(fmt.Errorf("calibrate: --refit %s: measured on hardware %q, device %q; the other points are hardware %q, device %q",
				f, c.Hardware, c.Device, hardware, device))
		}
		for _, p := range c.Points {
			points = append(points, calibPoint{CalibrationPoint: p, features: fromFeatures(p.Features)})
		}
		for _, m := range c.Models {
			if !slices.Contains(models, m) {
				models = append(models, m)
			}
		}
	}
	cal, err := fitPoints(points, o.holdEvery)
	if err != nil {
		return engineErr(fmt.Errorf("calibrate: %w", err))
	}
	cal.Hardware, cal.Device, cal.Models = strings.ToLower(hardware), device, models
	cal.Created = time.Now().UTC().Format(time.RFC3339)
	cal.Generator = "kvx " + kvxVersion()
	cal.Notes = notes

	data, err := json.MarshalIndent(cal, "", " ")
	if err != nil {
		return engineErr(fmt.Errorf("calibrate: %w", err))
	}
	data = append(data, '\n')
	if _, err := hw.ParseCalibration(data, o.out); err != nil {
		return engineErr(fmt.Errorf("calibrate: the calibration does not check: %w", err))
	}
	if err := os.WriteFile(o.out, data, 0o644); err != nil {
		return usageErr(fmt.Errorf("calibrate: --out: %w", err))
	}
	writeCalibrationTable(table, cal)
	fmt.Fprintf(table, "wrote %s; use it with --set sim_calibration=%s\n", o.out, o.out)
	if o.json {
		if _, err := stdout.Write(data); err != nil {
			return err
		}
	}
	return nil
}

// fitPoints splits the points (every holdEvery-th held out), fits the sim
// to the rest, and fills in every point's predictions and the errors.
func fitPoints(points []calibPoint, holdEvery int) (hw.Calibration, error) {
	var train, held []sim.FitPoint
	for i := range points {
		p := &points[i]
		p.HeldOut = i%holdEvery == holdEvery-1
		fp := sim.FitPoint{Features: p.features, Measured: p.MeasuredS}
		if p.HeldOut {
			held = append(held, fp)
		} else {
			train = append(train, fp)
		}
	}
	if len(held) == 0 {
		return hw.Calibration{}, fmt.Errorf("%d points: none is held out of the fit (need at least %d)", len(points), holdEvery)
	}
	res, err := sim.Fit(train)
	if err != nil {
		return hw.Calibration{}, err
	}
	c := hw.Calibration{Schema: hw.CalibrationSchema, Params: res.Calibration, Points: make([]hw.CalibrationPoint, len(points))}
	var heldDS []float64
	var share []float64
	var fwd, step float64
	for i := range points {
		p := &points[i]
		p.PredictedS = sim.Predict(&res.Calibration, p.features)
		p.Features = asFeatures(p.features)
		c.Points[i] = p.CalibrationPoint
		if p.HeldOut {
			heldDS = append(heldDS, math.Abs(p.DatasheetS-p.MeasuredS)/p.MeasuredS)
		}
		if p.StepS > 0 {
			share = append(share, 1-p.MeasuredS/p.StepS)
			fwd += p.MeasuredS
			step += p.StepS
		}
	}
	c.Fit = errorStats(sim.RelErrors(&res.Calibration, train))
	c.HeldOut = errorStats(sim.RelErrors(&res.Calibration, held))
	c.Datasheet = errorStats(heldDS)
	if len(share) > 0 {
		s := errorStats(share)
		c.Crossing = hw.CrossingStats{Median: s.Median, P90: s.P90, Total: 1 - fwd/step}
	}
	return c, nil
}

// errorStats summarises xs (not modified).
func errorStats(xs []float64) hw.ErrorStats {
	if len(xs) == 0 {
		return hw.ErrorStats{}
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	q := func(f float64) float64 { return s[min(len(s)-1, int(math.Ceil(f*float64(len(s))))-1)] }
	return hw.ErrorStats{Points: len(s), Median: q(0.5), P90: q(0.9), Max: s[len(s)-1]}
}

func pct(x float64) string { return fmt.Sprintf("%.1f%%", 100*x) }

func goal(x, limit float64) string {
	if x <= limit {
		return "met"
	}
	return "not met"
}

// writeCalibrationTable prints the fitted parameters, the errors and the
// crossings' share.
func writeCalibrationTable(w io.Writer, c hw.Calibration) {
	held := 0
	for _, p := range c.Points {
		if p.HeldOut {
			held++
		}
	}
	fmt.Fprintf(w, "\ncalibration of hardware %s on device %s (%s): %d points, %d fitted, %d held out\n",
		c.Hardware, c.Device, strings.Join(c.Models, ", "), len(c.Points), len(c.Points)-held, held)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "kernel class\tcompute scale\tof peak\tmemory scale\tof bandwidth")
	eff := func(s float64) string {
		if s == 0 {
			return "-"
		}
		return pct(1 / s)
	}
	for _, k := range c.Params.Classes {
		fmt.Fprintf(tw, "%s\t%.3g\t%s\t%.3g\t%s\n", k.Class, k.ComputeScale, eff(k.ComputeScale), k.MemoryScale, eff(k.MemoryScale))
	}
	tw.Flush()
	fmt.Fprintf(w, "launch per kernel %.3g µs, overhead per step %.3g µs\n\n", 1e6*c.Params.LaunchSeconds, 1e6*c.Params.StepSeconds)

	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "per-step error |sim-measured|/measured\tpoints\tmedian\tp90\tmax")
	for _, r := range []struct {
		name string
		s    hw.ErrorStats
	}{{"calibrated sim, fitted points", c.Fit}, {"calibrated sim, held-out points", c.HeldOut}, {"datasheet roofline, held-out points", c.Datasheet}} {
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\n", r.name, r.s.Points, pct(r.s.Median), pct(r.s.P90), pct(r.s.Max))
	}
	tw.Flush()
	fmt.Fprintf(w, "held-out goal: median <= %s (%s), p90 <= %s (%s)\n\n", pct(goalMedian), goal(c.HeldOut.Median, goalMedian), pct(goalP90), goal(c.HeldOut.P90, goalP90))

	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "kind\tpoints\tmeasured ms (median)\tsim error (median)\tcrossing share (median)")
	for _, kind := range []string{"prefill", "decode", "mixed"} {
		var ms, errs, share []float64
		for _, p := range c.Points {
			if p.Kind != kind {
				continue
			}
			ms = append(ms, 1e3*p.MeasuredS)
			errs = append(errs, math.Abs(p.PredictedS-p.MeasuredS)/p.MeasuredS)
			if p.StepS > 0 {
				share = append(share, 1-p.MeasuredS/p.StepS)
			}
		}
		if len(ms) == 0 {
			continue
		}
		fmt.Fprintf(tw, "%s\t%d\t%.3f\t%s\t%s\n", kind, len(ms), errorStats(ms).Median, pct(errorStats(errs).Median), pct(errorStats(share).Median))
	}
	tw.Flush()
	fmt.Fprintf(w, "plugin crossings' share of an engine step (1 - worker forward / host step): median %s, p90 %s, all steps %s; goal <= %s (%s)\n",
		pct(c.Crossing.Median), pct(c.Crossing.P90), pct(c.Crossing.Total), pct(goalCrossing), goal(c.Crossing.Total, goalCrossing))
}
