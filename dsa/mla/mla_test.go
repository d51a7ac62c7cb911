package mla_test

import (
	"math"
	"testing"

	"github.com/kvx-dev/kvx/device/sim"
	"github.com/kvx-dev/kvx/dsa/mla"
	"github.com/kvx-dev/kvx/plugins/v1/spec"
)

// h200 is an H200-like accelerator (datasheet figures).
var h200 = spec.Hardware{Name: "h200-test", MemBandwidth: 4.8e12, FLOPSBF16: 989e12, FLOPSFP8: 1979e12, NVLinkBW: 450e9, LaunchLatency: 5e-6}

// deepseekV3 has DeepSeek-V3's attention dimensions and one MLA layer with a
// bf16 latent (512 + 64 elements), and one DSA layer with an index key.
func deepseekV3() *spec.Model {
	return &spec.Model{
		Name: "deepseek-v3", Arch: "DeepseekV3ForCausalLM", Hidden: 7168, Vocab: 129280,
		Heads: 128, KVHeads: 128, QLoraRank: 1536, KVLoraRank: 512, QKNopeHeadDim: 128, QKRopeHeadDim: 64, VHeadDim: 128,
		IndexHeads: 64, IndexHeadDim: 128, IndexTopK: 2048,
		Layers: []spec.Layer{
			{Index: 0, Mixer: spec.MixerMLA, Buffers: []spec.Buffer{{Role: spec.RoleLatent, BytesPerToken: 1152}}},
			{Index: 1, Mixer: spec.MixerDSA, Buffers: []spec.Buffer{{Role: spec.RoleLatent, BytesPerToken: 1152}, {Role: spec.RoleIndexKey, BytesPerToken: 132}}},
		},
	}
}

func env(t *testing.T, tp int) (*sim.Env, *spec.Model) {
	t.Helper()
	m := deepseekV3()
	e, err := sim.NewEnv(m, h200, tp, "bf16")
	if err != nil {
		t.Fatal(err)
	}
	return e, m
}

func TestDensePicksTheCheaperForm(t *testing.T) {
	e, m := env(t, 2)
	h := 128.0 / 2
	absPair := 2 * h * (2*512 + 64)
	absTok := 2 * h * 512 * (128 + 128)
	mhaPair := 2 * h * (128 + 64 + 128)
	mhaCtx := 2 * h * 512 * (128 + 128)
	for _, tc := range []struct {
		name string
		s    sim.Seq
		want float64
	}{
		// Decode: absorbed MQA over the latent.
		{"decode at 100k", sim.Seq{Context: 100_000, New: 1}, 100_000*absPair + absTok},
		// Prefill from scratch: MHA after expanding the latents.
		{"prefill 8k", sim.Seq{Context: 8192, New: 8192}, 8192*8193/2*mhaPair + 8192*mhaCtx},
	} {
		var w sim.Work
		mla.Dense(e, &w, &m.Layers[0], &sim.Batch{Seqs: []sim.Seq{tc.s}, Tokens: tc.s.New})
		if math.Abs(w.FLOPs-tc.want) > 1e-9*tc.want {
			t.Errorf("%s: %g FLOPs, want %g", tc.name, w.FLOPs, tc.want)
		}
		wantBytes := mla.UpWeightBytes(e) + float64(tc.s.Context+tc.s.New)*1152
		if math.Abs(w.Bytes-wantBytes) > 1e-9*wantBytes {
			t.Errorf("%s: %g bytes, want the KV up weights, the context's latents and the new ones: %g", tc.name, w.Bytes, wantBytes)
		}
	}
}

func TestDenseOnDSALayerWritesIndexKeys(t *testing.T) {
	e, m := env(t, 1)
	b := &sim.Batch{Seqs: []sim.Seq{{Context: 5000, New: 3}, {Context: 40, New: 40}}, Tokens: 43}
	var onMLA, onDSA, keys sim.Work
	mla.Backend.MixerWork(e, &m.Layers[0], b, &onMLA)
	mla.Backend.MixerWork(e, &m.Layers[1], b, &onDSA)
	mla.IndexKeys(e, &keys, &m.Layers[1], b.Tokens)
	if got, want := onDSA.Bytes-onMLA.Bytes, keys.Bytes; math.Abs(got-want) > 1e-6 {
		t.Errorf("a DSA layer on mla moves %g more bytes than an MLA layer, want the index keys' %g", got, want)
	}
	if wantMin := 43.0 * 132; keys.Bytes < wantMin {
		t.Errorf("index keys: %g bytes, want at least the %g written", keys.Bytes, wantMin)
	}
}

func TestDenseDecodeGrowsWithContext(t *testing.T) {
	e, m := env(t, 1)
	at := func(c int) sim.Work {
		var w sim.Work
		mla.Dense(e, &w, &m.Layers[0], &sim.Batch{Seqs: []sim.Seq{{Context: c, New: 1}}, Tokens: 1})
		return w
	}
	a, b, c := at(50_000), at(100_000), at(150_000)
	if d1, d2 := b.Bytes-a.Bytes, c.Bytes-b.Bytes; math.Abs(d1-d2) > 1e-6 || math.Abs(d1-50_000*1152) > 1e-6 {
		t.Errorf("latent bytes grow by %g then %g per 50k tokens, want %d each", d1, d2, 50_000*1152)
	}
}
