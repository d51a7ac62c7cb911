package calibrate_test

import (
	"bytes"
	"errors"
	"math"
	"regexp"
	"testing"

	"github.com/kvx-dev/kvx/core/calibrate"
	"github.com/kvx-dev/kvx/core/hw"
	"github.com/kvx-dev/kvx/plugins/v1/spec"
)

// echoSim predicts a point's first feature's compute seconds, whatever the
// fit: a test sets each point's error through its features.
type echoSim struct{}

func (echoSim) Stage(string, spec.Model, spec.Hardware, string, int, int) (calibrate.StageSim, error) {
	return nil, errors.New("echoSim has no stages")
}

func (echoSim) Fit([]calibrate.FitPoint) (spec.SimCalibration, error) {
	return spec.SimCalibration{}, nil
}

func (echoSim) Predict(_ *spec.SimCalibration, fs []hw.CalibrationFeature) float64 {
	return fs[0].ComputeSeconds
}

// point is a point of kind measured at 1 s that the sim predicts with
// relative error e.
func point(kind string, e float64) hw.CalibrationPoint {
	return hw.CalibrationPoint{Kind: kind, MeasuredS: 1, Features: []hw.CalibrationFeature{{Class: "gemm", ComputeSeconds: 1 + e}}}
}

// TestHeldOutByKind: each kind's held-out error is over the held-out points
// of that kind only (every fitted point here is 50% off, and each kind's
// held-out ones are off by their own amounts), a kind without a held-out
// point has no entry, the overall figure is over every held-out point,
// the file checks, and the table says which kind meets each goal.
func TestHeldOutByKind(t *testing.T) {
	// Every 2nd point (odd index) is held out.
	held := map[string][]float64{
		hw.KindPrefill: {0.01, 0.02, 0.03}, // meets both goals
		hw.KindDecode:  {0.04, 0.03, 0.20}, // median 4%: met; p90 20%: not met
		hw.KindMixed:   {0.12},             // neither
	}
	var m calibrate.Measurement
	m.Hardware, m.Device, m.Models = "H200", "cpu", []string{"test"}
	for _, kind := range hw.PointKinds {
		for _, e := range held[kind] {
			m.Points = append(m.Points, point(kind, 0.5), point(kind, -e))
		}
	}
	// A fitted point of a kind with no held-out point.
	m.Points = append(m.Points, point("warmup", 0.5))
	c, err := calibrate.Fit(m, 2, echoSim{})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]hw.ErrorStats{
		hw.KindPrefill: {Points: 3, Median: 0.02, P90: 0.03, Max: 0.03},
		hw.KindDecode:  {Points: 3, Median: 0.04, P90: 0.20, Max: 0.20},
		hw.KindMixed:   {Points: 1, Median: 0.12, P90: 0.12, Max: 0.12},
	}
	near := func(a, b hw.ErrorStats) bool {
		return a.Points == b.Points && math.Abs(a.Median-b.Median) < 1e-12 && math.Abs(a.P90-b.P90) < 1e-12 && math.Abs(a.Max-b.Max) < 1e-12
	}
	if len(c.HeldOutByKind) != len(want) {
		t.Errorf("HeldOutByKind = %+v, want the kinds %v", c.HeldOutByKind, want)
	}
	for kind, w := range want {
		if got := c.HeldOutByKind[kind]; !near(got, w) {
			t.Errorf("HeldOutByKind[%s] = %+v, want %+v", kind, got, w)
		}
	}
	if all := (hw.ErrorStats{Points: 7, Median: 0.03, P90: 0.20, Max: 0.20}); !near(c.HeldOut, all) {
		t.Errorf("HeldOut = %+v, want %+v", c.HeldOut, all)
	}
	if _, err := calibrate.Encode(c, "test.json"); err != nil {
		t.Errorf("Encode: %v", err)
	}

	var buf bytes.Buffer
	calibrate.WriteTable(&buf, c)
	for _, row := range []string{
		`held-out error by kind\s+points\s+median\s+p90\s+max\s+median <= 5\.0%\s+p90 <= 10\.0%`,
		`prefill\s+3\s+2\.0%\s+3\.0%\s+3\.0%\s+met\s+met\n`,
		`decode\s+3\s+4\.0%\s+20\.0%\s+20\.0%\s+met\s+not met\n`,
		`mixed\s+1\s+12\.0%\s+12\.0%\s+12\.0%\s+not met\s+not met\n`,
		`calibrated sim, held-out points\s+7\s+3\.0%\s+20\.0%`, // the overall rows stay
	} {
		if !regexp.MustCompile(row).MatchString(buf.String()) {
			t.Errorf("the table lacks a row %q:\n%s", row, buf.String())
		}
	}

	// A measurement whose held-out points are all of one kind: the others
	// say they have none.
	m = calibrate.Measurement{Hardware: "h200", Device: "cpu", Points: []hw.CalibrationPoint{point(hw.KindMixed, 0), point(hw.KindDecode, 0.01)}}
	c, err = calibrate.Fit(m, 2, echoSim{})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := c.HeldOutByKind[hw.KindMixed]; ok || c.HeldOutByKind[hw.KindDecode].Points != 1 {
		t.Errorf("HeldOutByKind = %+v, want decode alone", c.HeldOutByKind)
	}
	buf.Reset()
	calibrate.WriteTable(&buf, c)
	if !regexp.MustCompile(`mixed\s+0\s+-\s+-\s+-\s+no held-out point`).MatchString(buf.String()) {
		t.Errorf("the table does not say mixed has no held-out point:\n%s", buf.String())
	}
}
