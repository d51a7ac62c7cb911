package paged

import (
	"testing"

	"github.com/kvx-dev/kvx/device"
	"github.com/kvx-dev/kvx/device/kernelspec"
	"github.com/kvx-dev/kvx/device/synth"
	"github.com/kvx-dev/kvx/plugins/model"
	"github.com/kvx-dev/kvx/plugins/v1/spec"
)

// TestWithScales: a call's MLA and index scales replace the kernel's
// defaults; 0 keeps them, and the layer's own configuration is untouched.
func TestWithScales(t *testing.T) {
	x := &Mixer{DSA: kernelspec.DSA{MLA: kernelspec.MLA{Scale: 0}, Indexer: kernelspec.Indexer{Scale: 0}}}
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

// TestGDNMixer: a Qwen3-Next checkpoint's Mamba-mapped layers run
// KernelGDN where the backend chose KernelMamba2, with plugins/model's
// mapping (value heads, value dim, key dim, key heads) and its buffers'
// widths; a Nemotron-H checkpoint's Mamba layers keep Mamba2.
func TestGDNMixer(t *testing.T) {
	state := func(spec.Mixer) device.Kernel { return device.KernelMamba2 }
	for _, c := range []struct {
		dir  string
		want device.Kernel
	}{{"../hf/testdata/qwen3_next", device.KernelGDN}, {"../hf/testdata/nemotron_h", device.KernelMamba2}} {
		m, err := model.Load(c.dir)
		if err != nil {
			t.Fatal(err)
		}
		if err := model.FillBuffers(&m, model.Dtypes{KV: "float32"}, 1); err != nil {
			t.Fatal(err)
		}
		l := m.Layers[0]
		x, err := NewMixer(&m, l, state(l.Mixer), kernelspec.F32, kernelspec.F32, kernelspec.F32)
		if err != nil {
			t.Fatalf("%s: NewMixer: %v", c.dir, err)
		}
		if x.Kind != c.want {
			t.Errorf("%s: kernel %v, want %v", c.dir, x.Kind, c.want)
		}
		if err := CheckWidths(x, l); err != nil {
			t.Errorf("%s: CheckWidths: %v", c.dir, err)
		}
		if c.want == device.KernelGDN {
			g := x.GDN
			if g.Heads != 4 || g.VDim != 16 || g.KDim != 16 || g.KHeads != 2 || g.ConvKernel != 4 || x.OutWidth() != 64 {
				t.Errorf("GDN = %+v, out %d; want 4 value heads of 16, 2 key heads of 16, conv 4, out 64", g, x.OutWidth())
			}
		}
	}
}
