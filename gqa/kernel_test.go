package gqa_test

import (
	"slices"
	"testing"

	"github.com/kvx-dev/kvx/device"
	"github.com/kvx-dev/kvx/gqa"
	"github.com/kvx-dev/kvx/plugins/v1/spec"
)

// The GQA backend runs attention layers with GQA and Mamba layers with
// Mamba2; it also runs mixer-less layers, which need no kernel.
func TestKernel(t *testing.T) {
	for _, tt := range []struct {
		mixer  spec.Mixer
		want   device.Kernel
		listed bool
	}{
		{spec.MixerGQA, device.KernelGQA, true},
		{spec.MixerMamba, device.KernelMamba2, true},
		{spec.MixerNone, device.KernelNone, true},
		{spec.MixerMLA, device.KernelNone, false},
		{spec.MixerDSA, device.KernelNone, false},
	} {
		if got := gqa.Backend.Kernel(tt.mixer); got != tt.want {
			t.Errorf("Kernel(%q) = %v, want %v", tt.mixer, got, tt.want)
		}
		if got := slices.Contains(gqa.Backend.Mixers(), tt.mixer); got != tt.listed {
			t.Errorf("Mixers() lists %q: %v, want %v", tt.mixer, got, tt.listed)
		}
	}
}
