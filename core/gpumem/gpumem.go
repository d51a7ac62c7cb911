// Package gpumem reads an NVIDIA GPU's name and memory through NVML
// (github.com/NVIDIA/go-nvml), so that setup can size the cuda device's
// cache budget before any worker starts, as TensorRT-LLM sizes its KV cache
// from the free memory it measures.
//
// NVML is loaded at run time (libnvidia-ml.so.1 comes with the driver), so
// a kvx built with cgo starts on a machine without a GPU and Query returns
// an error there. Without cgo (go-nvml needs it) Query always fails. Only
// the engine side uses this package: device/ and plugins/ never import it.
package gpumem

import "errors"

// Info is one GPU as NVML reports it.
type Info struct {
	Name  string // product name, e.g. "NVIDIA H200"
	Total int64  // bytes of device memory
	Free  int64  // bytes not allocated by any process when queried
}

// ErrUnavailable is returned (wrapped) by Query when NVML cannot be used
// at all: no cgo in this build, no NVML library (no NVIDIA driver), or NVML
// failed to initialise.
var ErrUnavailable = errors.New("NVML unavailable")

// ErrNoGPU is returned (wrapped) by Query for an index past the last GPU.
var ErrNoGPU = errors.New("no such GPU")
