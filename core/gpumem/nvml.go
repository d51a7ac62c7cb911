//go:build cgo

package gpumem

import (
	"fmt"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// Query returns the name and memory of GPU index (NVML's numbering, which
// CUDA_VISIBLE_DEVICES does not change). It initialises NVML and shuts it
// down again, so it may be called at any time, from any goroutine. Errors
// wrap ErrUnavailable (no NVML) or ErrNoGPU (index out of range).
func Query(index int) (Info, error) {
	if ret := nvml.Init(); ret != nvml.SUCCESS {
		return Info{}, fmt.Errorf("nvml.Init (libnvidia-ml.so.1, installed with the NVIDIA driver): %v: %w", nvml.ErrorString(ret), ErrUnavailable)
	}
	defer nvml.Shutdown()
	n, ret := nvml.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return Info{}, fmt.Errorf("nvml.DeviceGetCount: %v: %w", nvml.ErrorString(ret), ErrUnavailable)
	}
	if index < 0 || index >= n {
		return Info{}, fmt.Errorf("GPU %d: NVML sees %d GPUs: %w", index, n, ErrNoGPU)
	}
	d, ret := nvml.DeviceGetHandleByIndex(index)
	if ret != nvml.SUCCESS {
		return Info{}, fmt.Errorf("GPU %d: nvml.DeviceGetHandleByIndex: %v", index, nvml.ErrorString(ret))
	}
	name, ret := d.GetName()
	if ret != nvml.SUCCESS {
		return Info{}, fmt.Errorf("GPU %d: nvml GetName: %v", index, nvml.ErrorString(ret))
	}
	mem, ret := d.GetMemoryInfo()
	if ret != nvml.SUCCESS {
		return Info{}, fmt.Errorf("GPU %d (%s): nvml GetMemoryInfo: %v", index, name, nvml.ErrorString(ret))
	}
	return Info{Name: name, Total: int64(mem.Total), Free: int64(mem.Free)}, nil
}
