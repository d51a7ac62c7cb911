package device_test

import (
	"math"
	"testing"

	"github.com/kvx-dev/kvx/device/sim"
	"github.com/kvx-dev/kvx/plugins/v1/spec"
	"github.com/kvx-dev/kvx/plugins/v1/worker"
)

// TestSimDeviceUsesCalibration: with Hardware.Calibration the sim worker's
// forward takes the calibrated time of its kernels (sim.Predict over what
// the stage records), and without one the datasheet roofline's, as before.
func TestSimDeviceUsesCalibration(t *testing.T) {
	cal := &spec.SimCalibration{
		Name: "test.json", LaunchSeconds: 2e-6, StepSeconds: 5e-4,
		Classes: []spec.KernelClassScale{
			{Class: "gemm", ComputeScale: 47, MemoryScale: 2.5},
			{Class: "mixer.gqa", ComputeScale: 3, MemoryScale: 4},
			{Class: "mixer.mamba", ComputeScale: 5, MemoryScale: 6},
		},
	}
	batch := func() worker.Batch {
		return worker.Batch{Step: 1, Items: []worker.Item{item(1, 0, 40, 0, true), item(2, 0, 1, 0, true)}}
	}
	c := config(0, 1)
	c.DraftTokens = 0
	plainW := configured(t, c)
	c.Hardware.Calibration = cal
	calW := configured(t, c)
	plain, err := plainW.Forward(ctx, batch())
	if err != nil {
		t.Fatal(err)
	}
	got, err := calW.Forward(ctx, batch())
	if err != nil {
		t.Fatal(err)
	}

	// The same stage on the datasheet roofline, recorded.
	m := smallModel()
	layers := m.Layers
	m.Layers = nil
	env, err := sim.NewEnv(&m, h200, 1, "bf16")
	if err != nil {
		t.Fatal(err)
	}
	st, err := sim.NewStage(sim.StageConfig{Env: env, Layers: layers, Embed: true, Head: true, Mixer: fake{}.MixerWork})
	if err != nil {
		t.Fatal(err)
	}
	step := &sim.Step{
		Batch:   sim.Batch{Seqs: []sim.Seq{{Context: 40, New: 40}, {Context: 1, New: 1}}, Tokens: 41},
		Logits:  2,
		Sampled: sim.Batch{Seqs: []sim.Seq{{Context: 41, New: 1}, {Context: 2, New: 1}}, Tokens: 2},
	}
	w, fs := st.Record(step)
	if want := int64(math.Round(w.Seconds * 1e9)); abs(plain.Nanos-want) > 1 {
		t.Errorf("uncalibrated forward = %d ns, want the datasheet stage's %d ns", plain.Nanos, want)
	}
	if want := int64(math.Round(sim.Predict(cal, fs) * 1e9)); abs(got.Nanos-want) > 1 {
		t.Errorf("calibrated forward = %d ns, want sim.Predict's %d ns", got.Nanos, want)
	}
	if got.Nanos < 2*plain.Nanos {
		t.Errorf("calibrated forward %d ns, datasheet %d ns: scales of 2.5 and more did not slow it down", got.Nanos, plain.Nanos)
	}
}

func abs(x int64) int64 {
	if x < 0 {
		return -x
	}
	return x
}
