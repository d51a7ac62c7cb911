package dsa_test

import (
	"slices"
	"testing"

	"github.com/kvx-dev/kvx/device"
	"github.com/kvx-dev/kvx/dsa"
	"github.com/kvx-dev/kvx/plugins/v1/spec"
)

// The DSA backend runs its layers sparse: indexer top-k, then sparse MLA.
// It runs no other mixer, so it picks no kernel for one.
func TestKernel(t *testing.T) {
	for _, tt := range []struct {
		mixer spec.Mixer
		want  device.Kernel
	}{
		{spec.MixerDSA, device.KernelDSA},
		{spec.MixerMLA, device.KernelNone},
		{spec.MixerGQA, device.KernelNone},
		{spec.MixerMamba, device.KernelNone},
		{spec.MixerNone, device.KernelNone},
	} {
		if got := dsa.Backend.Kernel(tt.mixer); got != tt.want {
			t.Errorf("Kernel(%q) = %v, want %v", tt.mixer, got, tt.want)
		}
		if listed := slices.Contains(dsa.Backend.Mixers(), tt.mixer); listed != (tt.want != device.KernelNone) {
			t.Errorf("Mixers() lists %q: %v, but Kernel(%q) = %v", tt.mixer, listed, tt.mixer, tt.want)
		}
	}
}
