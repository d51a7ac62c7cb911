package hw

import (
	"strings"
	"testing"
	"testing/fstest"
)

const h200Cal = `{"schema": "kvx.calibration/v1", "hardware": "h200", "device": "cuda",
 "params": {"classes": [{"class": "gemm", "compute_scale": 47, "memory_scale": 2.5}, {"class": "mixer.gqa", "compute_scale": 9, "memory_scale": 2}],
  "launch_seconds": 3e-6, "step_seconds": 2e-4}}`

// TestDefaultCalibration: a file calibrations/<hardware>.json is that
// preset's default, named embedded:<file>; none is no default; a file of
// another hardware or a broken one is an error.
func TestDefaultCalibration(t *testing.T) {
	fsys := fstest.MapFS{
		"calibrations/h200.json": {Data: []byte(h200Cal)},
		"calibrations/h100.json": {Data: []byte(h200Cal)},
		"calibrations/b200.json": {Data: []byte(`{"schema": "kvx.calibration/v1", "hardware": "b200", "params": {"launch_seconds": -1}}`)},
	}
	c, err := defaultIn(fsys, "H200")
	if err != nil || c == nil || c.Params.Name != "embedded:h200.json" || c.Params.Classes[0].ComputeScale != 47 || c.Params.StepSeconds != 2e-4 {
		t.Errorf("default of h200 = %+v, %v; want the file's parameters named embedded:h200.json", c, err)
	}
	if c, err := defaultIn(fsys, "tpu"); c != nil || err != nil {
		t.Errorf("default of a hardware without a file = %+v, %v; want nil, nil", c, err)
	}
	if _, err := defaultIn(fsys, "h100"); err == nil || !strings.Contains(err.Error(), `hardware "h200", want "h100"`) {
		t.Errorf("a default measured on other hardware: error %v", err)
	}
	if _, err := defaultIn(fsys, "b200"); err == nil || !strings.Contains(err.Error(), "launch_seconds -1") {
		t.Errorf("a broken default: error %v", err)
	}
	// What ships: every embedded file is a sound default of its preset.
	for _, name := range Names() {
		if _, err := DefaultCalibration(name); err != nil {
			t.Errorf("the embedded default of %s: %v", name, err)
		}
	}
}

// TestHeldOutByKindChecked: a file without held_out_by_kind (written before
// kvx kept it) parses as before; one with it must name known kinds, give
// sound figures and agree with its points.
func TestHeldOutByKindChecked(t *testing.T) {
	c, err := ParseCalibration([]byte(h200Cal), "old.json")
	if err != nil || c.HeldOutByKind != nil {
		t.Fatalf("a file without held_out_by_kind: %+v, %v", c, err)
	}
	file := func(byKind, points string) []byte {
		return []byte(strings.Replace(h200Cal, `"params"`, `"held_out_by_kind": `+byKind+`, "points": `+points+`, "params"`, 1))
	}
	points := `[{"kind": "decode", "held_out": true}, {"kind": "decode", "held_out": false}, {"kind": "prefill", "held_out": true}]`
	good := `{"decode": {"points": 1, "median": 0.02, "p90": 0.02, "max": 0.02}, "prefill": {"points": 1, "median": 0.5, "p90": 0.5, "max": 0.5}}`
	c, err = ParseCalibration(file(good, points), "new.json")
	if err != nil || c.HeldOutByKind[KindDecode].Median != 0.02 || c.HeldOutByKind[KindPrefill].Points != 1 {
		t.Fatalf("a sound held_out_by_kind: %+v, %v", c, err)
	}
	if _, err := ParseCalibration(file(good, `[]`), "nopoints.json"); err != nil {
		t.Errorf("held_out_by_kind without the points to check it against: %v", err)
	}
	for _, bad := range []struct{ byKind, points, want string }{
		{`{"verify": {"points": 1, "median": 0, "p90": 0, "max": 0}}`, `[]`, `kind "verify" is not one of prefill, decode, mixed`},
		{`{"decode": {"points": 0, "median": 0, "p90": 0, "max": 0}}`, `[]`, "held_out_by_kind.decode: points 0"},
		{`{"decode": {"points": 1, "median": 0.3, "p90": 0.2, "max": 0.4}}`, `[]`, "0 <= median <= p90 <= max"},
		{`{"decode": {"points": 1, "median": -1, "p90": 0.2, "max": 0.4}}`, `[]`, "0 <= median <= p90 <= max"},
		{`{"decode": {"points": 2, "median": 0.02, "p90": 0.02, "max": 0.02}, "prefill": {"points": 1, "median": 0.5, "p90": 0.5, "max": 0.5}}`, points,
			"held_out_by_kind.decode: 2 points, but the file has 1 held-out decode points"},
		{`{"decode": {"points": 1, "median": 0.02, "p90": 0.02, "max": 0.02}}`, points,
			"held_out_by_kind.prefill: 0 points, but the file has 1 held-out prefill points"},
	} {
		if _, err := ParseCalibration(file(bad.byKind, bad.points), "bad.json"); err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("held_out_by_kind %s with points %s: error %v, want %q", bad.byKind, bad.points, err, bad.want)
		}
	}
}
