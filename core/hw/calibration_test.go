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
