package cpu_test

import (
	"testing"

	"github.com/kvx-dev/kvx/device"
	"github.com/kvx-dev/kvx/device/cpu"
	"github.com/kvx-dev/kvx/plugins/conformance"
	"github.com/kvx-dev/kvx/plugins/model"
	"github.com/kvx-dev/kvx/plugins/v1/worker"
)

// TestWorkerConformanceCPU runs the worker checks on the cpu device, whose
// outputs carry top logprobs and logprobs (the sim's carry none), so the
// checks of Output.TopLogprobs and Output.Logprobs see real values. The
// worker runs in process: what runs on other goroutines is the device's
// parallel loops (matMul's column split, the kernels' parallelFor), which
// the race pass reaches through the equivalence and metamorphic tests (every
// branch of both that starts a goroutine is covered there), so it runs in
// the plain pass only; under -race it took 21 of the package's 33 CPU-s.
func TestWorkerConformanceCPU(t *testing.T) {
	skipUnderRace(t)
	m := synthModel(t, "deepseek-v3", model.SyntheticSpec{MTPLayers: 2, Vocab: 32000}, "bf16") // the suite's prompt ids are below 30001
	conformance.TestWorker(t, func() worker.Worker { return device.NewWorker(backends["mla"], device.WithDevice("cpu", cpu.Open)) },
		conformance.WorkerOptions{Model: &m, Device: "cpu", Backend: "mla", Seed: seed})
}
