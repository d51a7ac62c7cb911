package model

import (
	"slices"
	"strings"
	"testing"

	"pgregory.net/rapid"

	"github.com/kvx-dev/kvx/plugins/v1/spec"
)

func kindsOf(layers []spec.Layer) []layerKind {
	var out []layerKind
	for _, l := range layers {
		if k := kindOf(l); !slices.Contains(out, k) {
			out = append(out, k)
		}
	}
	return out
}

// Every preset scales down with the defaults: same arch, every decoder layer
// kind kept, the MTP layers kept, small dimensions, and FillBuffers sizes the
// synthetic layers with the same formulas as the real ones.
func TestSyntheticPresetsDefaults(t *testing.T) {
	for _, name := range Presets() {
		base, err := Load(name)
		if err != nil {
			t.Fatal(err)
		}
		m, err := Synthetic(base, SyntheticSpec{})
		if err != nil {
			t.Errorf("Synthetic(%s, {}) = %v", name, err)
			continue
		}
		if m.Arch != base.Arch || m.Hidden != 64 || m.Vocab != 258 || m.NumNextN != base.NumNextN {
			t.Errorf("%s: arch %s hidden %d vocab %d mtp %d, want %s 64 258 %d", name, m.Arch, m.Hidden, m.Vocab, m.NumNextN, base.Arch, base.NumNextN)
		}
		if wantLatent := min(base.MoELatent, 32); m.MoELatent != wantLatent {
			t.Errorf("%s: moe_latent %d, want %d", name, m.MoELatent, wantLatent)
		}
		bd, md := base.Layers[:len(base.Layers)-base.NumNextN], m.Layers[:len(m.Layers)-m.NumNextN]
		if got, want := kindsOf(md), kindsOf(bd); len(got) != len(want) {
			t.Errorf("%s: kinds %v, want %v", name, got, want)
		}
		for i, l := range m.Layers[len(md):] {
			if !l.MTP || kindOf(l) != kindOf(base.Layers[len(bd)]) {
				t.Errorf("%s: MTP layer %d = %+v", name, i, l)
			}
		}
		if err := FillBuffers(&m, Dtypes{}, 1); err != nil {
			t.Errorf("%s: FillBuffers: %v", name, err)
			continue
		}
		for _, l := range m.Layers {
			for _, b := range l.Buffers {
				var want int64
				switch b.Role {
				case spec.RoleKV:
					want = int64(2 * m.KVHeads * m.HeadDim * 2)
				case spec.RoleLatent:
					want = int64((m.KVLoraRank + m.QKRopeHeadDim) * 2)
				case spec.RoleIndexKey:
					want = int64(m.IndexHeadDim + 4)
				case spec.RoleSSMState:
					want = int64(m.MambaHeads * m.MambaHeadDim * m.SSMStateSize * 4)
				case spec.RoleConvState:
					want = int64((m.MambaHeads*m.MambaHeadDim + 2*m.NGroups*m.SSMStateSize) * (m.ConvKernel - 1) * 4)
				}
				if got := b.BytesPerToken + b.BytesPerSeq; got != want {
					t.Errorf("%s layer %d %s = %d bytes, want %d", name, l.Index, b.Role, got, want)
				}
			}
		}
		if _, err := SplitStages(m, 2); err != nil {
			t.Errorf("%s: SplitStages(2): %v", name, err)
		}
	}
}

func TestSyntheticOverrides(t *testing.T) {
	base, err := Load("deepseek-v3.2")
	if err != nil {
		t.Fatal(err)
	}
	m, err := Synthetic(base, SyntheticSpec{Layers: 6, MTPLayers: 2, Hidden: 96, Heads: 6, KVLoraRank: 48, QKRopeHeadDim: 4,
		QKNopeHeadDim: 12, VHeadDim: 8, IndexTopK: 5, Experts: 4, ExpertsPerToken: 3, Vocab: 300, MaxPosition: 512})
	if err != nil {
		t.Fatal(err)
	}
	got := []int{len(m.Layers), m.NumNextN, m.Hidden, m.Heads, m.KVHeads, m.HeadDim, m.KVLoraRank, m.IndexTopK, m.Experts,
		m.ExpertsPerToken, m.Vocab, m.MaxPosition, m.SharedExperts, m.QLoraRank}
	want := []int{8, 2, 96, 6, 6, 16, 48, 5, 4, 3, 300, 512, 1, 32}
	if !slices.Equal(got, want) {
		t.Errorf("Synthetic = %v, want %v", got, want)
	}
	// Representative: both kinds (dense and MoE) and evenly spread layers.
	var dense, moe int
	for _, l := range m.Layers[:6] {
		if l.FFN == spec.FFNDense {
			dense++
		} else {
			moe++
		}
	}
	if dense == 0 || moe == 0 || !m.Layers[7].MTP || !m.Layers[6].MTP || m.Layers[5].MTP {
		t.Errorf("layers %+v", m.Layers)
	}

	// Sliding windows are kept (scaled) on windowed layers only.
	llama, err := Load("llama-3.1-8b")
	if err != nil {
		t.Fatal(err)
	}
	llama.Layers[3].Window = 4096
	m, err = Synthetic(llama, SyntheticSpec{Layers: 3})
	if err != nil {
		t.Fatal(err)
	}
	var windows []int
	for _, l := range m.Layers {
		windows = append(windows, l.Window)
	}
	if !slices.Equal(windows, []int{0, 32, 0}) || m.KVHeads != 1 || m.Heads != 4 {
		t.Errorf("windows %v kv_heads %d heads %d, want [0 32 0] 1 4", windows, m.KVHeads, m.Heads)
	}
}

func TestSyntheticErrors(t *testing.T) {
	tests := []struct {
		base string
		s    SyntheticSpec
		want []string
	}{
		{"llama-3.1-8b", SyntheticSpec{Hidden: -1}, []string{"synthetic.hidden: -1 must be >= 0"}},
		{"llama-3.1-8b", SyntheticSpec{Heads: 6, KVHeads: 4}, []string{"synthetic.heads: 6 is not a multiple of synthetic.kv_heads 4"}},
		{"llama-3.1-8b", SyntheticSpec{Heads: 2, KVHeads: 4}, []string{"synthetic.kv_heads: 4 exceeds synthetic.heads 2"}},
		{"llama-3.1-8b", SyntheticSpec{HeadDim: 15}, []string{"synthetic.head_dim: 15 must be even"}},
		{"llama-3.1-8b", SyntheticSpec{Vocab: 100}, []string{"synthetic.vocab: 100 is out of range; allowed: 258"}},
		{"llama-3.1-8b", SyntheticSpec{Layers: 33}, []string{"synthetic.layers: 33 exceeds the 32 decoder layers"}},
		{"llama-3.1-8b", SyntheticSpec{MambaHeads: 4, Experts: 2}, []string{
			`synthetic.mamba_heads: 4 is set but model "llama-3.1-8b" has no Mamba layers`,
			`synthetic.experts: 2 is set but model "llama-3.1-8b" has no MoE layers`}},
		{"llama-3.1-8b", SyntheticSpec{Window: 8}, []string{"synthetic.window: 8 is set but model"}},
		{"llama-3.1-8b", SyntheticSpec{Hidden: 1 << 15}, []string{"synthetic.hidden: 32768 exceeds the synthetic limit 16384"}},
		{"deepseek-v3", SyntheticSpec{QKRopeHeadDim: 7}, []string{"synthetic.qk_rope_head_dim: 7 must be even"}},
		{"deepseek-v3", SyntheticSpec{Experts: 2, ExpertsPerToken: 3}, []string{"synthetic.experts_per_token: 3 exceeds synthetic.experts 2"}},
		{"deepseek-v3", SyntheticSpec{IndexTopK: 3}, []string{"synthetic.index_topk: 3 is set but model"}},
		{"deepseek-v3", SyntheticSpec{MoELatent: 8}, []string{"synthetic.moe_latent: 8 is set but model"}},
		{"nemotron-3-super-120b-a12b-fp8", SyntheticSpec{MoELatent: 1 << 15}, []string{"synthetic.moe_latent: 32768 exceeds the synthetic limit"}},
		{"deepseek-v3", SyntheticSpec{KVHeads: 3}, []string{"synthetic.kv_heads: 3 is set but model"}},
		{"deepseek-v3", SyntheticSpec{Layers: 1}, []string{"synthetic.layers: 1 is less than 2, the number of layer kinds"}},
		{"deepseek-v3.2", SyntheticSpec{IndexTopK: 5000}, []string{"synthetic.index_topk: 5000 exceeds synthetic.max_position 4096"}},
		{"nemotron-3-nano-30b-a3b", SyntheticSpec{MambaHeads: 6, NGroups: 4}, []string{"synthetic.mamba_heads: 6 is not a multiple of synthetic.n_groups 4"}},
		{"nemotron-3-nano-30b-a3b", SyntheticSpec{ConvKernel: 1}, []string{"synthetic.conv_kernel: 1 is out of range; allowed: >= 2"}},
		{"nemotron-3-nano-30b-a3b", SyntheticSpec{MTPLayers: 1, Intermediate: 8}, []string{
			"synthetic.mtp_layers: 1 is set but model", "synthetic.intermediate: 8 is set but model"}},
	}
	for _, tt := range tests {
		base, err := Load(tt.base)
		if err != nil {
			t.Fatal(err)
		}
		_, err = Synthetic(base, tt.s)
		if err == nil {
			t.Errorf("Synthetic(%s, %+v) = nil error, want %q", tt.base, tt.s, tt.want)
			continue
		}
		for _, w := range tt.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("Synthetic(%s, %+v) = %q, want it to contain %q", tt.base, tt.s, err, w)
			}
		}
	}
}

// For any layer count in range, the subsequence keeps every kind, keeps base
// order and is exactly the requested length.
func TestSyntheticLayersProperty(t *testing.T) {
	presets := Presets()
	rapid.Check(t, func(t *rapid.T) {
		base, err := Load(rapid.SampledFrom(presets).Draw(t, "preset"))
		if err != nil {
			t.Fatal(err)
		}
		dec := base.Layers[:len(base.Layers)-base.NumNextN]
		kinds := kindsOf(dec)
		n := rapid.IntRange(len(kinds), len(dec)).Draw(t, "layers")
		idx := representative(dec, n)
		if len(idx) != n || !slices.IsSorted(idx) || len(slices.Compact(slices.Clone(idx))) != n {
			t.Fatalf("representative(%d) = %v", n, idx)
		}
		m, err := Synthetic(base, SyntheticSpec{Layers: n})
		if err != nil {
			t.Fatal(err)
		}
		if got := kindsOf(m.Layers[:n]); len(got) != len(kinds) {
			t.Fatalf("kinds %v, want %v", got, kinds)
		}
		for j, i := range idx {
			if kindOf(m.Layers[j]) != kindOf(dec[i]) {
				t.Fatalf("layer %d kind %v, want base layer %d kind %v", j, kindOf(m.Layers[j]), i, kindOf(dec[i]))
			}
		}
	})
}
