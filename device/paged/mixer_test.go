package paged

import (
	"testing"

	"github.com/kvx-dev/kvx/device/cpu/kernel"
	"github.com/kvx-dev/kvx/device/synth"
)

// TestWithScales: a call's MLA and index scales replace the kernel's
// defaults; 0 keeps them, and the layer's own configuration is untouched.
func TestWithScales(t *testing.T) {
	x := &Mixer{DSA: kernel.DSA{MLA: kernel.MLA{Scale: 0}, Indexer: kernel.Indexer{Scale: 0}}}
	d := x.WithScales(synth.MLAIn{Scale: 0.5}, &synth.IndexIn{Scale: 0.25})
	if d.MLA.Scale != 0.5 || d.Indexer.Scale != 0.25 {
		t.Errorf("WithScales(0.5, 0.25) = %v, %v", d.MLA.Scale, d.Indexer.Scale)
	}
	if x.DSA.MLA.Scale != 0 || x.DSA.Indexer.Scale != 0 {
		t.Errorf("WithScales modified the layer's kernel: %v, %v", x.DSA.MLA.Scale, x.DSA.Indexer.Scale)
	}
	if d := x.WithScales(synth.MLAIn{}, nil); d.MLA.Scale != 0 || d.Indexer.Scale != 0 {
		t.Errorf("WithScales(0, nil) = %v, %v, want the defaults 0, 0", d.MLA.Scale, d.Indexer.Scale)
	}
}
