package hf_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/kvx-dev/kvx/device/hf"
	"github.com/kvx-dev/kvx/device/hf/hftest"
	"github.com/kvx-dev/kvx/device/synth"
	"github.com/kvx-dev/kvx/plugins/model"
	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
	"github.com/kvx-dev/kvx/plugins/v1/spec"
)

// writeMTP writes the DeepSeek golden fam with the MTP layers of s, its
// tensors edited by edit (nil: none), and returns its directory.
func writeMTP(t *testing.T, fam string, s hftest.MTPSpec, edit func([]hf.Named) []hf.Named) string {
	t.Helper()
	ts, cfg, err := hftest.MTPTensors(filepath.Join("testdata", fam), s)
	if err != nil {
		t.Fatal(err)
	}
	if edit != nil {
		ts = edit(ts)
	}
	dir := filepath.Join(t.TempDir(), fam+"_mtp")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := hftest.WriteCheckpoint(dir, cfg, ts); err != nil {
		t.Fatal(err)
	}
	return dir
}

// The MTP layers of a DeepSeek checkpoint load on the last stage: the
// decoder block as any layer's, enorm, hnorm, eh_proj and shared_head.norm
// always, the layer's own embed_tokens and shared_head.head when the
// checkpoint has them; the other stages load none of them.
func TestNewLoadsMTPLayers(t *testing.T) {
	const h, v = 64, 256
	for _, fam := range []string{"deepseek_v3", "deepseek_v32"} {
		plain, err := model.Load(filepath.Join("testdata", fam))
		if err != nil {
			t.Fatal(err)
		}
		whole := &loader{}
		if _, err := hf.New(plain, filepath.Join("testdata", fam), 0, 3, whole); err != nil {
			t.Fatal(err)
		}
		// A decoder block shaped as layer 2's (MoE): what layer 2 loads.
		block := &loader{}
		if _, err := hf.New(plain, filepath.Join("testdata", fam), 2, 3, block); err != nil {
			t.Fatal(err)
		}
		block.n -= h + v*h // less the final norm and the LM head
		for _, shared := range []bool{false, true} {
			dir := writeMTP(t, fam, hftest.MTPSpec{Layers: 2, Seed: 3, Shared: shared}, nil)
			m, err := model.Load(dir)
			if err != nil {
				t.Fatal(err)
			}
			if m.NumNextN != 2 || len(m.Layers) != 5 || !m.Layers[3].MTP || !m.Layers[4].MTP {
				t.Fatalf("%s: model.Load: %d MTP layers of %d, want 2 of 5", fam, m.NumNextN, len(m.Layers))
			}
			all, first, last := &loader{}, &loader{}, &loader{}
			s, err := hf.New(m, dir, 0, 5, all)
			if err != nil {
				t.Fatalf("%s shared %v: New: %v", fam, shared, err)
			}
			if s.MTPLayers() != 2 {
				t.Errorf("%s: MTPLayers() = %d, want 2", fam, s.MTPLayers())
			}
			// Per MTP layer: the block, enorm, hnorm, shared_head.norm,
			// eh_proj; with shared, embed_tokens and shared_head.head.
			per := block.n + 3*h + 2*h*h
			if shared {
				per += 2 * v * h
			}
			if want := whole.n + 2*per; all.n != want {
				t.Errorf("%s shared %v: New(0, 5) loaded %d values, want %d (the model's %d + 2 MTP layers of %d)", fam, shared, all.n, want, whole.n, per)
			}
			if sf, err := hf.New(m, dir, 0, 2, first); err != nil || sf.MTPLayers() != 0 {
				t.Fatalf("%s: New(0, 2) = %v, want no MTP layer", fam, err)
			}
			sl, err := hf.New(m, dir, 2, 5, last)
			if err != nil || sl.MTPLayers() != 2 {
				t.Fatalf("%s: New(2, 5) = %v, want 2 MTP layers", fam, err)
			}
			// The last stage loads the embedding table for the MTP layers
			// unless they have their own.
			embed := v * h
			if shared {
				embed = 0
			}
			if want := all.n + embed; first.n+last.n != want {
				t.Errorf("%s shared %v: stages loaded %d + %d values, want %d", fam, shared, first.n, last.n, want)
			}
		}
	}
}

// A bad MTP layer is refused naming the tensor, its shape and the shape
// wanted; so is a model whose MTP layers are not the last ones or not all
// on the last stage.
func TestNewRejectsBadMTPLayers(t *testing.T) {
	drop := func(name string) func([]hf.Named) []hf.Named {
		return func(ts []hf.Named) []hf.Named {
			return slices.DeleteFunc(ts, func(n hf.Named) bool { return n.Name == name })
		}
	}
	reshape := func(name string, shape ...int) func([]hf.Named) []hf.Named {
		return func(ts []hf.Named) []hf.Named {
			for i := range ts {
				if ts[i].Name == name {
					ts[i].Shape, ts[i].Data = shape, make([]float32, shape[0]*shape[1])
				}
			}
			return ts
		}
	}
	for _, c := range []struct {
		name string
		edit func([]hf.Named) []hf.Named
		want string
	}{
		{"no eh_proj", drop("model.layers.3.eh_proj.weight"), `tensor "model.layers.3.eh_proj.weight" is missing (want shape [64 128])`},
		{"no shared_head.norm", drop("model.layers.4.shared_head.norm.weight"), `tensor "model.layers.4.shared_head.norm.weight" is missing (want shape [64])`},
		{"no expert", drop("model.layers.4.mlp.experts.5.up_proj.weight"), `tensor "model.layers.4.mlp.experts.5.up_proj.weight" is missing (want shape [32 64])`},
		{"eh_proj of one half", reshape("model.layers.3.eh_proj.weight", 64, 64), `tensor "model.layers.3.eh_proj.weight" has shape [64 64], want [64 128]`},
		{"narrow head", reshape("model.layers.3.shared_head.head.weight", 128, 64), `tensor "model.layers.3.shared_head.head.weight" has shape [128 64], want [256 64]`},
		{"attention of another rank", reshape("model.layers.4.self_attn.kv_b_proj.weight", 128, 16), `tensor "model.layers.4.self_attn.kv_b_proj.weight" has shape [128 16], want [128 32]`},
	} {
		dir := writeMTP(t, "deepseek_v3", hftest.MTPSpec{Layers: 2, Seed: 5, Shared: true}, c.edit)
		m, err := model.Load(dir)
		if err != nil {
			t.Fatal(err)
		}
		// Every stage checks every tensor, the MTP layers' too.
		for _, r := range [][2]int{{0, 5}, {0, 2}, {2, 5}} {
			if _, err := hf.New(m, dir, r[0], r[1], &loader{}); err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("%s: New(%d, %d) = %v, want an error containing %q", c.name, r[0], r[1], err, c.want)
			}
		}
		// Without the MTP layers (speculative decoding off) the same
		// tensors are allowed and still checked, but for a missing one.
		dec := m
		dec.Layers, dec.NumNextN = m.Layers[:3], 0
		_, err = hf.New(dec, dir, 0, 3, &loader{})
		if strings.Contains(c.want, "is missing") {
			if err != nil {
				t.Errorf("%s: New without MTP layers = %v, want nil (absent MTP tensors are not read)", c.name, err)
			}
		} else if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: New without MTP layers = %v, want an error containing %q", c.name, err, c.want)
		}
	}
	dir := writeMTP(t, "deepseek_v32", hftest.MTPSpec{Layers: 2, Seed: 5}, nil)
	m, err := model.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name        string
		edit        func(*spec.Model)
		first, last int
		want        string
	}{
		{"MTP layer split from the last", nil, 0, 4, "hold MTP layers but not the last layer 4"},
		{"MTP layer before a decoder layer", func(m *spec.Model) { m.Layers[3].MTP, m.Layers[2].MTP = false, true }, 0, 5, "layer 2: MTP true; the last 2 of its 5 layers"},
		{"no decoder layer", func(m *spec.Model) { m.NumNextN = 5 }, 0, 5, "5 MTP layers of 5 leave no decoder layer"},
	} {
		mm := m
		mm.Layers = slices.Clone(m.Layers)
		if c.edit != nil {
			c.edit(&mm)
		}
		if _, err := hf.New(mm, dir, c.first, c.last, &loader{}); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: New = %v, want an error containing %q", c.name, err, c.want)
		}
	}
}

// Forward refuses more drafts per step than MTP layers, naming the limit,
// and items whose drafts the stage cannot verify, before it computes
// anything (the ops are nil).
func TestForwardRefusesBadDrafts(t *testing.T) {
	dir := writeMTP(t, "deepseek_v3", hftest.MTPSpec{Layers: 2, Seed: 7}, nil)
	m, err := model.Load(dir)
	if err != nil {
		t.Fatal(err)
	}
	s, err := hf.New(m, dir, 0, 5, &loader{})
	if err != nil {
		t.Fatal(err)
	}
	plain := filepath.Join("testdata", "deepseek_v3")
	p, err := hf.New(mustLoad(t, plain), plain, 0, 3, &loader{})
	if err != nil {
		t.Fatal(err)
	}
	one := synth.Item{Seq: 1, Tokens: []int32{1, 2}, Sample: true}
	for _, c := range []struct {
		name  string
		stage *hf.Stage
		step  synth.Step
		want  string
		item  bool // a *kvcache.Error naming the sequence
	}{
		{"3 drafts of 2 layers", s, synth.Step{Items: []synth.Item{one}, Drafts: 3}, `3 drafts per step exceed the 2 MTP layers of model "deepseek_v3_mtp" (limit 2`, false},
		{"drafts without MTP layers", p, synth.Step{Items: []synth.Item{one}, Drafts: 1}, `1 drafts per step: model "deepseek_v3" has no MTP head (limit 0)`, false},
		{"a draft item without MTP layers", p, synth.Step{Items: []synth.Item{{Seq: 1, Tokens: []int32{1, 2}, Draft: 1, Sample: true}}}, "no MTP head (limit 0)", true},
		{"all drafts", s, synth.Step{Items: []synth.Item{{Seq: 1, Tokens: []int32{1, 2}, Draft: 2, Sample: true}}, Drafts: 1}, "draft 2 outside [0, 2)", true},
		{"drafts without sample", s, synth.Step{Items: []synth.Item{{Seq: 1, Tokens: []int32{1, 2}, Draft: 1}}, Drafts: 1}, "1 drafts without sample", true},
		{"lookahead outside the vocabulary", s, synth.Step{Items: []synth.Item{{Seq: 1, Tokens: []int32{1, 2}, Lookahead: []int32{256}}}, Drafts: 1}, "lookahead token 256 outside the vocabulary [0, 256)", true},
	} {
		_, err := c.stage.Forward(context.Background(), nil, c.step)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: Forward = %v, want an error containing %q", c.name, err, c.want)
			continue
		}
		var ke *kvcache.Error
		if ok := errors.As(err, &ke); ok != c.item || ok && !slices.Equal(ke.Seqs, []kvcache.SeqID{1}) {
			t.Errorf("%s: Forward = %#v: want an item error for sequence 1: %v", c.name, err, c.item)
		}
	}
}
