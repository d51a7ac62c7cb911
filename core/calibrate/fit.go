package calibrate

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/kvx-dev/kvx/core/hw"
	"github.com/kvx-dev/kvx/plugins/v1/spec"
)

// Goals of issue 17 (DESIGN.md section 8), printed beside the figures.
const (
	goalMedian   = 0.05 // sim per-step error on held-out points, median
	goalP90      = 0.10 // and p90
	goalCrossing = 0.02 // plugin crossings' share of an engine step
)

// Fit splits m's points (every holdEvery-th held out), fits the sim to
// the rest, and fills in every point's prediction, the errors on either
// set (the held-out ones also by kind, hw.PointKinds), the datasheet
// roofline's on the held-out points and the plugin crossings' share of a
// step. It writes into m.Points. The calibration
// names m's hardware (lower case), device, models and notes; Created and
// Generator are the caller's.
func Fit(m Measurement, holdEvery int, sim Sim) (hw.Calibration, error) {
	points := m.Points
	var train, held []FitPoint
	heldByKind := map[string][]FitPoint{}
	for i := range points {
		p := &points[i]
		p.HeldOut = i%holdEvery == holdEvery-1
		fp := FitPoint{Features: p.Features, Measured: p.MeasuredS}
		switch {
		case !p.HeldOut:
			train = append(train, fp)
		case slices.Contains(hw.PointKinds, p.Kind):
			heldByKind[p.Kind] = append(heldByKind[p.Kind], fp)
			fallthrough
		default:
			held = append(held, fp)
		}
	}
	if len(held) == 0 {
		return hw.Calibration{}, fmt.Errorf("%d points: none is held out of the fit (need at least %d)", len(points), holdEvery)
	}
	params, err := sim.Fit(train)
	if err != nil {
		return hw.Calibration{}, err
	}
	notes := m.Notes
	if notes == nil {
		notes = []string{} // a list in the file
	}
	c := hw.Calibration{Schema: hw.CalibrationSchema, Hardware: strings.ToLower(m.Hardware), Device: m.Device, Models: m.Models, Notes: notes,
		Params: params, Points: make([]hw.CalibrationPoint, len(points))}
	var heldDS []float64
	var share []float64
	var fwd, step float64
	for i := range points {
		p := &points[i]
		p.PredictedS = sim.Predict(&params, p.Features)
		c.Points[i] = *p
		if p.HeldOut {
			heldDS = append(heldDS, math.Abs(p.DatasheetS-p.MeasuredS)/p.MeasuredS)
		}
		if p.StepS > 0 {
			share = append(share, 1-p.MeasuredS/p.StepS)
			fwd += p.MeasuredS
			step += p.StepS
		}
	}
	c.Fit = errorStats(relErrors(sim, &params, train))
	c.HeldOut = errorStats(relErrors(sim, &params, held))
	c.HeldOutByKind = map[string]hw.ErrorStats{}
	for kind, ps := range heldByKind {
		c.HeldOutByKind[kind] = errorStats(relErrors(sim, &params, ps))
	}
	c.Datasheet = errorStats(heldDS)
	if len(share) > 0 {
		s := errorStats(share)
		c.Crossing = hw.CrossingStats{Median: s.Median, P90: s.P90, Total: 1 - fwd/step}
	}
	return c, nil
}

// relErrors returns |Predict - Measured| / Measured of every point, in
// order.
func relErrors(sim Sim, c *spec.SimCalibration, points []FitPoint) []float64 {
	out := make([]float64, len(points))
	for i, p := range points {
		out[i] = math.Abs(sim.Predict(c, p.Features)-p.Measured) / p.Measured
	}
	return out
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

// Encode returns c as a calibration file holds it (kvx.calibration/v1:
// indented JSON and a final newline), checked as hw.ParseCalibration reads
// it back (name: where it goes, for the message), so that kvx never writes
// a file sim_calibration would refuse.
func Encode(c hw.Calibration, name string) ([]byte, error) {
	data, err := json.MarshalIndent(c, "", " ")
	if err != nil {
		return nil, err
	}
	data = append(data, '\n')
	if _, err := hw.ParseCalibration(data, name); err != nil {
		return nil, fmt.Errorf("the calibration does not check: %w", err)
	}
	return data, nil
}

// WriteTable prints c's fitted parameters, its errors against the goals
// (on all held-out points, then on those of each kind), the figures of
// each kind over all points and the plugin crossings' share of a step.
func WriteTable(w io.Writer, c hw.Calibration) {
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

	// The goal holds for each kind of step on its own: a sim good on
	// average can still be off on decode.
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "held-out error by kind\tpoints\tmedian\tp90\tmax\tmedian <= %s\tp90 <= %s\n", pct(goalMedian), pct(goalP90))
	for _, kind := range hw.PointKinds {
		s, ok := c.HeldOutByKind[kind]
		if !ok {
			fmt.Fprintf(tw, "%s\t0\t-\t-\t-\tno held-out point\t-\n", kind)
			continue
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\t%s\n", kind, s.Points, pct(s.Median), pct(s.P90), pct(s.Max), goal(s.Median, goalMedian), goal(s.P90, goalP90))
	}
	tw.Flush()
	fmt.Fprintln(w)

	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "kind, all points\tpoints\tmeasured ms (median)\tsim error (median)\tcrossing share (median)")
	for _, kind := range hw.PointKinds {
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
