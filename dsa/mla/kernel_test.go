package mla_test

import (
	"slices"
	"testing"

	"github.com/kvx-dev/kvx/device"
	"github.com/kvx-dev/kvx/dsa/mla"
	"github.com/kvx-dev/kvx/plugins/v1/spec"
)

// The dense MLA backend runs MLA layers and DSA layers alike with dense
// absorbed MLA (the sparse-against-dense A/B); no other mixer.
func TestKernel(t *testing.T) {
	for _, tt := range []struct {
		mixer spec.Mixer
		want  device.Kernel
	}{
		{spec.MixerMLA, device.KernelMLA},
		{spec.MixerDSA, device.KernelMLA},
		{spec.MixerGQA, device.KernelNone},
		{spec.MixerMamba, device.KernelNone},
		{spec.MixerNone, device.KernelNone},
	} {
		if got := mla.Backend.Kernel(tt.mixer); got != tt.want {
			t.Errorf("Kernel(%q) = %v, want %v", tt.mixer, got, tt.want)
		}
		if listed := slices.Contains(mla.Backend.Mixers(), tt.mixer); listed != (tt.want != device.KernelNone) {
			t.Errorf("Mixers() lists %q: %v, but Kernel(%q) = %v", tt.mixer, listed, tt.mixer, tt.want)
		}
	}
}
