package builtin

import (
	"fmt"

	"github.com/kvx-dev/kvx/core/calibrate"
	"github.com/kvx-dev/kvx/core/hw"
	"github.com/kvx-dev/kvx/device/sim"
	"github.com/kvx-dev/kvx/plugins/v1/spec"
)

// SimCost is the sim device's cost model over the built-in backends' mixer
// costs, as core/calibrate fits it (the engine never imports the worker
// wing; this registry imports both).
func SimCost() calibrate.Sim { return simCost{} }

type simCost struct{}

var _ calibrate.Sim = simCost{}

// Stage implements calibrate.Sim.
func (simCost) Stage(backend string, m spec.Model, h spec.Hardware, weights string, first, last int) (calibrate.StageSim, error) {
	b := Backend(backend)
	if b == nil {
		return nil, fmt.Errorf("attention_backend %q: %w", backend, calibrate.ErrNoCostModel)
	}
	h.Calibration = nil
	layers := m.Layers
	m.Layers = nil
	env, err := sim.NewEnv(&m, h, 1, weights)
	if err != nil {
		return nil, err
	}
	st, err := sim.NewStage(sim.StageConfig{Env: env, Layers: layers[first:last], Embed: true, Head: true, Mixer: b.MixerWork})
	if err != nil {
		return nil, err
	}
	return simStage{st}, nil
}

// Fit implements calibrate.Sim.
func (simCost) Fit(points []calibrate.FitPoint) (spec.SimCalibration, error) {
	fps := make([]sim.FitPoint, len(points))
	for i, p := range points {
		fps[i] = sim.FitPoint{Features: fromFeatures(p.Features), Measured: p.Measured}
	}
	res, err := sim.Fit(fps)
	return res.Calibration, err
}

// Predict implements calibrate.Sim.
func (simCost) Predict(c *spec.SimCalibration, fs []hw.CalibrationFeature) float64 {
	return sim.Predict(c, fromFeatures(fs))
}

type simStage struct{ st *sim.Stage }

// Record implements calibrate.StageSim: work as the sim's step (a sampling
// sequence adds a position of logits and a 1-token decode of the sampler).
func (s simStage) Record(work []calibrate.Work) (float64, []hw.CalibrationFeature) {
	step := &sim.Step{}
	for _, w := range work {
		step.Seqs = append(step.Seqs, sim.Seq{Context: w.Context, New: w.New})
		step.Tokens += w.New
		if w.Sample {
			step.Logits++
			step.Sampled.Seqs = append(step.Sampled.Seqs, sim.Seq{Context: w.Context + 1, New: 1})
			step.Sampled.Tokens++
		}
	}
	total, fs := s.st.Record(step)
	out := make([]hw.CalibrationFeature, len(fs))
	for i, f := range fs {
		out[i] = hw.CalibrationFeature(f)
	}
	return total.Seconds, out
}

// fromFeatures converts a calibration file's features to the sim's.
func fromFeatures(fs []hw.CalibrationFeature) []sim.Feature {
	out := make([]sim.Feature, len(fs))
	for i, f := range fs {
		out[i] = sim.Feature(f)
	}
	return out
}
