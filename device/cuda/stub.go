//go:build !(cuda && cgo)

package cuda

import (
	"errors"

	"github.com/kvx-dev/kvx/device"
)

// Built reports whether this binary has the cuda device (the cuda build tag).
const Built = false

// Open refuses: this binary was built without the cuda device.
func Open(device.Stage) (device.Device, error) {
	return nil, errors.New(`device "cuda": this worker binary was built without it; build the backends with "make cuda-build" (the cuda build tag, cgo and CUDA 11.8's cuda.h from "make cuda-deps") and run them on a machine with an NVIDIA GPU`)
}
