// Package hw holds hardware presets for sizing and for the sim cost model.
//
// The figures are datasheet values, not measurements: every preset has
// Uncalibrated set. A calibrated figure belongs in a measured preset (or in
// NVML at run time on a real GPU), never in an edit of these numbers without
// saying where the new number came from.
//
// All functions are safe for concurrent use; returned values are copies.
package hw

import (
	"fmt"
	"slices"
	"strings"

	"github.com/kvx-dev/kvx/plugins/v1/spec"
)

const (
	gb   = 1e9  // decimal gigabyte, as datasheets count memory
	tb   = 1e12 // decimal terabyte per second for bandwidth
	tera = 1e12 // TFLOP/s
)

// launchLatency is a guess at the fixed per-layer, per-step overhead with CUDA
// graphs (a few kernel launches per layer, a few microseconds). Uncalibrated.
const launchLatency = 5e-6

// copyLatency is the fixed cost of one block-copy transfer between host and
// device (one cudaMemcpyAsync of pinned memory): driver submission and DMA
// setup, paid per call whatever its size. Public measurements of Hopper-class
// hosts with PCIe Gen 5 put it at 2.3 us (FlexKV PR #193, H20: "the per-call
// overhead (~2.3 us) dominates chunk-sized transfers") to 5-7 us (DualPath,
// arXiv 2602.21548, sec. 5.2: "submitting a single copy operation via
// cudaMemcpyAsync incurs a latency overhead of approximately 5-7 us"); a
// device-to-device call pays the same order (torchcomms PR #2195, H100: 3.5
// us for a 1-byte cudaMemcpyAsync). 5 us is used: at ~55 GB/s a 64 KiB block
// then moves at ~11 GB/s, a 1 MiB transfer at ~43 GB/s and 4 MiB at ~52 GB/s,
// which is why engines coalesce contiguous blocks (vLLM PR #48434, H100 PCIe
// Gen 5: 8 KiB pages at 12.5 GB/s one per descriptor, 54 GB/s in runs of
// 16). Uncalibrated.
const copyLatency = 5e-6

// presets is keyed by lower-case name. Dense (not sparse) FLOP/s.
var presets = map[string]spec.Hardware{
	// NVIDIA H200 SXM: 141 GB HBM3e (nvidia-smi reports 143,771 MiB; the
	// datasheet figure is used), 4.8 TB/s, 989 TFLOP/s bf16, 1979 fp8,
	// NVLink 4 at 900 GB/s bidirectional, PCIe 5 x16 at ~55 GB/s effective.
	"h200": {
		Name:          "h200",
		MemoryBytes:   141 * gb,
		MemBandwidth:  4.8 * tb,
		FLOPSBF16:     989 * tera,
		FLOPSFP8:      1979 * tera,
		NVLinkBW:      450 * gb,
		PCIeBW:        55 * gb,
		Uncalibrated:  true,
		LaunchLatency: launchLatency,
		CopyLatency:   copyLatency,
	},
	// NVIDIA H100 SXM: 80 GB HBM3, 3.35 TB/s, same tensor cores as H200.
	"h100": {
		Name:          "h100",
		MemoryBytes:   80 * gb,
		MemBandwidth:  3.35 * tb,
		FLOPSBF16:     989 * tera,
		FLOPSFP8:      1979 * tera,
		NVLinkBW:      450 * gb,
		PCIeBW:        55 * gb,
		Uncalibrated:  true,
		LaunchLatency: launchLatency,
		CopyLatency:   copyLatency,
	},
	// NVIDIA B200: 192 GB HBM3e of which ~180 GB is usable, 8 TB/s, ~2250
	// TFLOP/s bf16, 4500 fp8, 9000 fp4, NVLink 5 at 1.8 TB/s bidirectional.
	// PCIe is Gen 5 like Hopper (~55 GB/s effective).
	"b200": {
		Name:          "b200",
		MemoryBytes:   180 * gb,
		MemBandwidth:  8 * tb,
		FLOPSBF16:     2250 * tera,
		FLOPSFP8:      4500 * tera,
		FLOPSFP4:      9000 * tera,
		NVLinkBW:      900 * gb,
		PCIeBW:        55 * gb,
		Uncalibrated:  true,
		LaunchLatency: launchLatency,
		CopyLatency:   copyLatency,
	},
}

// Names returns the preset names, sorted. The slice is the caller's.
func Names() []string {
	names := make([]string, 0, len(presets))
	for n := range presets {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// Lookup returns the preset called name (case-insensitive, surrounding
// spaces ignored). An unknown name is an error that lists the known names.
func Lookup(name string) (spec.Hardware, error) {
	h, ok := presets[strings.ToLower(strings.TrimSpace(name))]
	if !ok {
		return spec.Hardware{}, fmt.Errorf("unknown hardware %q; known: %s", name, strings.Join(Names(), ", "))
	}
	return h, nil
}
