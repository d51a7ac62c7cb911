// Command kvx-backend-mla is the dense MLA attention backend as a worker plugin.
// The kvx host starts it (plugins/sdk serves it over go-plugin gRPC).
// It links the worker runtime and its devices (device/, device/sim,
// device/cpu, device/cuda) and the backend, never the engine or a cache
// manager. Built with -tags cuda (make cuda-build) it has the real cuda
// device and links gorgonia.org/cu, whose init exits on a machine without a
// GPU; without the tag device cuda is a stub that says how to build it.
package main

import (
	"github.com/kvx-dev/kvx/device"
	"github.com/kvx-dev/kvx/device/cpu"
	"github.com/kvx-dev/kvx/device/cuda"
	"github.com/kvx-dev/kvx/dsa/mla"
	"github.com/kvx-dev/kvx/plugins/sdk"
	"github.com/kvx-dev/kvx/plugins/v1/worker"
)

func main() {
	sdk.ServeWorker(func() worker.Worker {
		return device.NewWorker(mla.Backend, device.WithDevice("cpu", cpu.Open), device.WithDevice(cuda.Name, cuda.Open))
	})
}
