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
// checks of Output.TopLogprobs and Output.Logprobs see real values.
func TestWorkerConformanceCPU(t *testing.T) {
	m := synthModel(t, "deepseek-v3", model.SyntheticSpec{MTPLayers: 2, Vocab: 32000}, "bf16") // the suite's prompt ids are below 30001
	conformance.TestWorker(t, func() worker.Worker { return device.NewWorker(backends["mla"], device.WithDevice("cpu", cpu.Open)) },
		conformance.WorkerOptions{Model: &m, Device: "cpu", Backend: "mla", Seed: seed})
}
