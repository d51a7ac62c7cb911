package main

import (
	"bytes"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/kvx-dev/kvx/cmd/builtin"
	"github.com/kvx-dev/kvx/core/hw"
	"github.com/kvx-dev/kvx/device/sim"
	"github.com/kvx-dev/kvx/plugins/v1/spec"
)

// calibrate runs kvx calibrate on the small cpu scenario into a fresh
// directory and returns the file it wrote, kvx's stdout and stderr.
func calibrate(t *testing.T) (string, string, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "cal.json")
	stdout, stderr, code := kvx(t, "calibrate", "-c", "../../scenarios/calib-cpu.yaml", "--out", path, "--json")
	if code != 0 {
		t.Fatalf("calibrate: exit %d\n%s", code, stderr)
	}
	return path, stdout, stderr
}

// TestCalibrateEndToEnd: kvx calibrate measures the designed forwards
// through the plugins on the cpu device, writes a file that loads, whose
// every point is consistent, and prints it with --json; the table and the
// progress go to stderr.
func TestCalibrateEndToEnd(t *testing.T) {
	t.Parallel()
	path, stdout, stderr := calibrate(t)
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(data, []byte(stdout)) {
		t.Errorf("--json printed something else than the file it wrote")
	}
	for _, want := range []string{"calibrate: [  1] prefill", "kernel class", "calibrated sim, held-out points", "datasheet roofline, held-out points", "held-out error by kind",
		"plugin crossings' share of an engine step", "wrote " + path} {
		if !strings.Contains(stderr, want) {
			t.Errorf("stderr lacks %q:\n%s", want, stderr)
		}
	}
	c, err := hw.LoadCalibration(path)
	if err != nil {
		t.Fatalf("the calibration kvx wrote does not load: %v", err)
	}
	if c.Hardware != "h200" || c.Device != "cpu" || c.Schema != hw.CalibrationSchema || !strings.HasPrefix(c.Generator, "kvx ") || c.Created == "" ||
		!slices.Equal(c.Models, []string{"llama-3.1-8b-synthetic"}) {
		t.Errorf("calibration header = %+v", c)
	}
	kinds := map[string]int{}
	held := 0
	for i, p := range c.Points {
		kinds[p.Kind]++
		if p.HeldOut {
			held++
		}
		if !(p.MeasuredS > 0) || p.HostForwardS < p.MeasuredS || p.StepS < p.HostForwardS {
			t.Errorf("point %d: measured %g s, host forward %g s, step %g s: want 0 < measured <= host forward <= step", i, p.MeasuredS, p.HostForwardS, p.StepS)
		}
		if len(p.Features) == 0 || !(p.DatasheetS > 0) {
			t.Errorf("point %d: %d features, datasheet %g s", i, len(p.Features), p.DatasheetS)
		}
		if got := builtin.SimCost().Predict(&c.Params, p.Features); math.Abs(got-p.PredictedS) > 1e-12*p.PredictedS {
			t.Errorf("point %d: predicted_s %g, but its features and the parameters give %g", i, p.PredictedS, got)
		}
	}
	// Design of calib-cpu.yaml: 4 sequences to 256 tokens, 3 rungs.
	if kinds["prefill"] < 20 || kinds["decode"] != 3*2*3 || kinds["mixed"] != 3*2 {
		t.Errorf("points by kind %v, want >= 20 prefill, 18 decode (batches 1, 2, 4, twice, at 3 rungs) and 6 mixed", kinds)
	}
	if held != len(c.Points)/4 || c.HeldOut.Points != held || c.Fit.Points != len(c.Points)-held {
		t.Errorf("%d of %d points held out (stats: fit %d, held out %d), want every 4th", held, len(c.Points), c.Fit.Points, c.HeldOut.Points)
	}
	byKind := 0
	for _, s := range c.HeldOutByKind {
		byKind += s.Points
	}
	if byKind != held || len(c.HeldOutByKind) == 0 {
		t.Errorf("held_out_by_kind %+v has %d points, want the %d held out", c.HeldOutByKind, byKind, held)
	}
	if !(c.Crossing.Total > 0 && c.Crossing.Total < 1) {
		t.Errorf("crossing share %+v, want in (0, 1)", c.Crossing)
	}
	// Errors are reported, not promised: the shared cpu of a test machine
	// is no GPU. The calibrated sim must still beat the datasheet roofline,
	// which has no idea this is a cpu.
	if !(c.HeldOut.Median < c.Datasheet.Median) {
		t.Errorf("held-out median error %.3f is not below the datasheet roofline's %.3f", c.HeldOut.Median, c.Datasheet.Median)
	}

	// --refit alone fits the same points again.
	again := filepath.Join(t.TempDir(), "again.json")
	if _, stderr, code := kvx(t, "calibrate", "--refit", path, "--out", again); code != 0 {
		t.Fatalf("calibrate --refit: exit %d\n%s", code, stderr)
	}
	c2, err := hw.LoadCalibration(again)
	if err != nil {
		t.Fatal(err)
	}
	if len(c2.Points) != len(c.Points) || !slices.Equal(c2.Params.Classes, c.Params.Classes) {
		t.Errorf("refit of the same points: %d points, classes %+v; want %d, %+v", len(c2.Points), c2.Params.Classes, len(c.Points), c.Params.Classes)
	}
}

// TestCalibrationChangesTheSim: a sim run with the calibration names it in
// its report and takes other times than the datasheet roofline's; with
// sim_calibration: none it is the datasheet sim, as before.
func TestCalibrationChangesTheSim(t *testing.T) {
	t.Parallel()
	path, _, _ := calibrate(t)
	dir := t.TempDir()
	run := func(cal string) (string, float64) {
		out := filepath.Join(dir, "r.json")
		_, stderr, code := kvx(t, "run", "-c", "testdata/small.yaml", "--set", "isolation=inprocess", "--set", "workload.requests=20",
			"--set", "sim_calibration="+cal, "--json", out)
		if code != 0 {
			t.Fatalf("run with sim_calibration %s: exit %d\n%s", cal, code, stderr)
		}
		r := readReports(t, out)[0]
		return r.Config.Calibration, r.Throughput.SimulatedS
	}
	name, calibratedS := run(path)
	if name != path {
		t.Errorf("report config.calibration = %q, want %q", name, path)
	}
	none, datasheetS := run("none")
	if none != "none" {
		t.Errorf("report config.calibration = %q, want none", none)
	}
	if calibratedS == datasheetS {
		t.Errorf("simulated %g s with the calibration and without: it changed nothing", calibratedS)
	}
}

// TestCalibrateRefuses: what calibrate cannot measure, and bad flags, are
// usage errors naming the problem; a bad calibration file is refused by
// every command that loads the config.
func TestCalibrateRefuses(t *testing.T) {
	t.Parallel()
	bad := filepath.Join(t.TempDir(), "bad.json")
	if err := os.WriteFile(bad, []byte(`{"schema": "kvx.calibration/v0", "hardware": "h200"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"calibrate", "-c", "testdata/small.yaml"}, `device "sim" measures nothing`},
		{[]string{"calibrate", "-c", "../../scenarios/calib-cpu.yaml", "--set", "pipeline_parallel_size=2"}, "pipeline_parallel_size 2: calibrate measures one stage"},
		{[]string{"calibrate", "-c", "../../scenarios/calib-cpu.yaml", "--hold-out-every", "1"}, "--hold-out-every 1: allowed: >= 2"},
		{[]string{"calibrate", "-c", "../../scenarios/calib-cpu.yaml", "--set", "kv_cache_config.max_tokens=1024"}, "needs (max_batch_size 4 + 1) x max_seq_len 256 = 1280 tokens of KV cache; the layout holds 1024"},
		{[]string{"calibrate"}, "--config FILE is required"},
		{[]string{"calibrate", "-c", "../../scenarios/calib-cpu.yaml", "--repeat", "0"}, "--repeat 0: allowed: 1 to 100"},
		{[]string{"calibrate", "--refit", bad}, `schema "kvx.calibration/v0" is not "kvx.calibration/v1"`},
		{[]string{"run", "-c", "testdata/small.yaml", "--set", "sim_calibration=" + bad}, `sim_calibration: "` + bad + `"`},
	} {
		_, stderr, code := kvx(t, c.args...)
		if code != 2 || !strings.Contains(stderr, c.want) {
			t.Errorf("kvx %v: exit %d, stderr %q; want exit 2 and %q", c.args, code, stderr, c.want)
		}
	}
}

// TestCalibrationChecksAgree: the config's check of a calibration file
// (hw.CheckParams, at load) and the sim's (at a worker's Configure) accept
// and refuse the same parameters, with the same message.
func TestCalibrationChecksAgree(t *testing.T) {
	for _, p := range []spec.SimCalibration{
		{Name: "ok", LaunchSeconds: 1e-6, Classes: []spec.KernelClassScale{{Class: "gemm", ComputeScale: 3}, {Class: "mixer.dsa"}, {Class: "moe"}, {Class: "memory"}}},
		{Name: "launch", LaunchSeconds: -1},
		{Name: "step", StepSeconds: math.Inf(1)},
		{Name: "nan", Classes: []spec.KernelClassScale{{Class: "gemm", MemoryScale: math.NaN()}}},
		{Name: "twice", Classes: []spec.KernelClassScale{{Class: "moe"}, {Class: "moe"}}},
		{Name: "unknown", Classes: []spec.KernelClassScale{{Class: "attention"}}},
		{Name: "bare", Classes: []spec.KernelClassScale{{Class: "mixer."}}},
	} {
		a, b := hw.CheckParams(&p), sim.CheckCalibration(&p)
		if (a == nil) != (b == nil) || (a != nil && a.Error() != b.Error()) {
			t.Errorf("%s: hw.CheckParams = %v, sim.CheckCalibration = %v", p.Name, a, b)
		}
		if p.Name != "ok" && a == nil {
			t.Errorf("%s: accepted %+v", p.Name, p)
		}
	}
}
