package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvx-dev/kvx/core/hw"
)

const goodCalibration = `{"schema": "kvx.calibration/v1", "hardware": "h200", "device": "cuda",
 "params": {"classes": [{"class": "gemm", "compute_scale": 40, "memory_scale": 2.5}], "launch_seconds": 3e-6, "step_seconds": 1e-4}}`

// TestSimCalibration: a calibration file next to the YAML file is loaded
// into the hardware spec; none and a default-less hardware keep the
// datasheet roofline.
func TestSimCalibration(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "cal.json"), []byte(goodCalibration), 0o644); err != nil {
		t.Fatal(err)
	}
	yaml := filepath.Join(dir, "c.yaml")
	if err := os.WriteFile(yaml, []byte("model: llama-3.1-8b\nsim_calibration: cal.json\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	c, _ := load(t, []string{yaml}, nil, nil)
	h := c.HardwareSpec()
	if h.Calibration == nil || h.Calibration.Name != filepath.Join(dir, "cal.json") || h.Calibration.Classes[0].ComputeScale != 40 || h.Uncalibrated {
		t.Errorf("HardwareSpec() = %+v (calibration %+v), want cal.json's parameters and uncalibrated false", h, h.Calibration)
	}

	def, err := hw.DefaultCalibration("h200")
	if err != nil {
		t.Fatal(err)
	}
	c, _ = load(t, nil, nil, []string{"model=llama-3.1-8b"})
	switch h := c.HardwareSpec(); {
	case def == nil && (h.Calibration != nil || !h.Uncalibrated):
		t.Errorf("no default calibration ships, yet HardwareSpec() = %+v", h)
	case def != nil && (h.Calibration == nil || h.Calibration.Name != "embedded:h200.json"):
		t.Errorf("the h200 default ships, yet HardwareSpec().Calibration = %+v", h.Calibration)
	}
	c, _ = load(t, nil, nil, []string{"model=llama-3.1-8b", "sim_calibration=none"})
	if h := c.HardwareSpec(); h.Calibration != nil || !h.Uncalibrated {
		t.Errorf("sim_calibration none: HardwareSpec() = %+v, want the datasheet preset", h)
	}
}

func TestSimCalibrationRefused(t *testing.T) {
	dir := t.TempDir()
	file := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	for _, c := range []struct {
		name, path string
		sets       []string
		want       string
	}{
		{"missing", filepath.Join(dir, "nope.json"), nil, "no such file"},
		{"not json", file("bad.json", "hello"), nil, "not a calibration file"},
		{"schema", file("v9.json", strings.Replace(goodCalibration, "kvx.calibration/v1", "kvx.calibration/v9", 1)), nil,
			`schema "kvx.calibration/v9" is not "kvx.calibration/v1"`},
		{"hardware", file("h100.json", strings.Replace(goodCalibration, `"h200"`, `"h100"`, 1)), nil,
			`was measured for hardware "h100", but hardware is "h200"`},
		{"unknown hardware", file("x.json", strings.Replace(goodCalibration, `"h200"`, `"tpu"`, 1)), nil, `unknown hardware "tpu"`},
		{"negative", file("neg.json", strings.Replace(goodCalibration, "3e-6", "-3e-6", 1)), nil, "launch_seconds -3e-06 must be finite and >= 0"},
		{"class", file("cls.json", strings.Replace(goodCalibration, `"gemm"`, `"tensor"`, 1)), nil, `class "tensor" is not one of gemm, moe, memory or mixer.<mixer>`},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, _, err := Load(testReg, nil, nil, append([]string{"model=llama-3.1-8b", "sim_calibration=" + c.path}, c.sets...))
			if err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "sim_calibration: \""+c.path+"\"") {
				t.Fatalf("Load with sim_calibration %s: error %v, want one naming the key and value and containing %q", c.path, err, c.want)
			}
		})
	}
}
