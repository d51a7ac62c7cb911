package sim

import (
	"fmt"
	"math"
	"strings"

	"github.com/kvx-dev/kvx/plugins/v1/spec"
)

// A calibration (spec.SimCalibration, written by kvx calibrate) replaces the
// datasheet roofline with measured factors: a kernel of class c costs
//
//	max(FLOPs/peak * ComputeScale_c, Bytes/bandwidth * MemoryScale_c) + LaunchSeconds
//
// and each forward of a stage StepSeconds more. The per-layer
// HW.LaunchLatency is not added (the launch cost per kernel stands for it).
// A class the calibration does not list keeps scale 1 on both sides.
//
// The same formula is written once more, over recorded Features, in
// Predict: the fit (Fit) minimises its error, and TestPredictMatchesStage
// pins the two to each other.

// Class names as a calibration spells them.
const (
	ClassNameGEMM   = "gemm"
	ClassNameMoE    = "moe"
	ClassNameMemory = "memory"
	mixerPrefix     = "mixer."
)

// ClassName returns the calibration's name of class c for kernels added
// under layer mixer m ("mixer.<m>" for ClassMixer).
func ClassName(c Class, m spec.Mixer) string {
	switch c {
	case ClassGEMM:
		return ClassNameGEMM
	case ClassMoE:
		return ClassNameMoE
	case ClassMemory:
		return ClassNameMemory
	}
	if m == "" {
		m = "unknown"
	}
	return mixerPrefix + string(m)
}

type scales struct{ compute, memory float64 }

var unit = scales{1, 1}

// calibration is a spec.SimCalibration checked and indexed for Work.Add.
type calibration struct {
	fixed  [4]scales // by Class; ClassMixer unused
	mixers map[spec.Mixer]scales
	launch float64
	step   float64
}

func (c *calibration) scale(k Class, m spec.Mixer) scales {
	if k == ClassMixer {
		if s, ok := c.mixers[m]; ok {
			return s
		}
		return unit
	}
	return c.fixed[k]
}

// newCalibration checks c: every figure finite and >= 0, every class named
// once and known. Errors name the field, the value and the limit.
func newCalibration(c *spec.SimCalibration) (*calibration, error) {
	bad := func(v float64) bool { return !(v >= 0) || math.IsInf(v, 0) }
	if bad(c.LaunchSeconds) {
		return nil, fmt.Errorf("calibration %q: launch_seconds %g must be finite and >= 0", c.Name, c.LaunchSeconds)
	}
	if bad(c.StepSeconds) {
		return nil, fmt.Errorf("calibration %q: step_seconds %g must be finite and >= 0", c.Name, c.StepSeconds)
	}
	out := &calibration{launch: c.LaunchSeconds, step: c.StepSeconds, mixers: map[spec.Mixer]scales{}}
	for i := range out.fixed {
		out.fixed[i] = unit
	}
	seen := map[string]bool{}
	for i, k := range c.Classes {
		if bad(k.ComputeScale) || bad(k.MemoryScale) {
			return nil, fmt.Errorf("calibration %q: classes[%d] (%s): compute_scale %g and memory_scale %g must be finite and >= 0",
				c.Name, i, k.Class, k.ComputeScale, k.MemoryScale)
		}
		if seen[k.Class] {
			return nil, fmt.Errorf("calibration %q: classes[%d]: class %q is listed twice", c.Name, i, k.Class)
		}
		seen[k.Class] = true
		s := scales{k.ComputeScale, k.MemoryScale}
		switch {
		case k.Class == ClassNameGEMM:
			out.fixed[ClassGEMM] = s
		case k.Class == ClassNameMoE:
			out.fixed[ClassMoE] = s
		case k.Class == ClassNameMemory:
			out.fixed[ClassMemory] = s
		case strings.HasPrefix(k.Class, mixerPrefix) && len(k.Class) > len(mixerPrefix):
			out.mixers[spec.Mixer(strings.TrimPrefix(k.Class, mixerPrefix))] = s
		default:
			return nil, fmt.Errorf("calibration %q: classes[%d]: class %q is not one of %s, %s, %s or %s<mixer>",
				c.Name, i, k.Class, ClassNameGEMM, ClassNameMoE, ClassNameMemory, mixerPrefix)
		}
	}
	return out, nil
}

// CheckCalibration reports whether c is a calibration NewEnv accepts.
func CheckCalibration(c *spec.SimCalibration) error {
	_, err := newCalibration(c)
	return err
}

// Calibrated is the name of the Env's calibration, "" when it uses the
// datasheet roofline.
func (e *Env) Calibrated() string {
	if e.cal == nil {
		return ""
	}
	return e.HW.Calibration.Name
}

// Feature is one kernel of a recorded forward (Stage.Record), in what a
// calibration needs: its class, its two roofline sides on the datasheet
// hardware (ComputeSeconds = FLOPs/peak, MemorySeconds = Bytes/bandwidth),
// and Count, the identical kernels it stands for (one per identical layer).
type Feature struct {
	Class          string  `json:"class"`
	ComputeSeconds float64 `json:"compute_s"`
	MemorySeconds  float64 `json:"memory_s"`
	Count          float64 `json:"count"`
}

func (w *Work) record(k Kernel, tc, tm float64) {
	*w.rec = append(*w.rec, Feature{Class: ClassName(k.Class, w.mixer), ComputeSeconds: tc, MemorySeconds: tm, Count: w.weight})
}

// Predict returns the calibrated seconds of a forward whose kernels are fs
// (Stage.Record on an Env of the same hardware), for calibration c: the
// formula at the top of this file. Communication (all-reduce) is not in fs:
// calibrations are measured on one GPU. A class c does not list has scale 1.
func Predict(c *spec.SimCalibration, fs []Feature) float64 {
	sc := make(map[string]scales, len(c.Classes))
	for _, k := range c.Classes {
		sc[k.Class] = scales{k.ComputeScale, k.MemoryScale}
	}
	t := c.StepSeconds
	for _, f := range fs {
		s, ok := sc[f.Class]
		if !ok {
			s = unit
		}
		t += f.Count * (max(f.ComputeSeconds*s.compute, f.MemorySeconds*s.memory) + c.LaunchSeconds)
	}
	return t
}
