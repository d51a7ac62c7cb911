// Package simtest holds the fixtures that the sim cost model's tests and the
// backends' cost tests share, so that every cost figure they assert is
// computed on one hardware description.
package simtest

import "github.com/kvx-dev/kvx/plugins/v1/spec"

// H200 is an H200-like accelerator (datasheet figures). Callers may copy it
// and change the copy; they must not modify H200 itself.
var H200 = spec.Hardware{
	Name:          "h200-test",
	MemoryBytes:   141e9,
	MemBandwidth:  4.8e12,
	FLOPSBF16:     989e12,
	FLOPSFP8:      1979e12,
	NVLinkBW:      450e9,
	PCIeBW:        55e9,
	LaunchLatency: 5e-6,
	CopyLatency:   5e-6,
}
