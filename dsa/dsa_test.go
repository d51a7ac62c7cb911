package dsa_test

import (
	"context"
	"errors"
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/kvx-dev/kvx/device"
	"github.com/kvx-dev/kvx/device/sim"
	"github.com/kvx-dev/kvx/device/sim/simtest"
	"github.com/kvx-dev/kvx/dsa"
	"github.com/kvx-dev/kvx/dsa/mla"
	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
	"github.com/kvx-dev/kvx/plugins/v1/spec"
	"github.com/kvx-dev/kvx/plugins/v1/worker"
)

var ctx = context.Background()

// h200 is the shared H200-like fixture.
var h200 = simtest.H200

const (
	latentBytes = 656 // vLLM's fp8_ds_mla: 512 fp8 latent + 4 fp32 scales + 64 bf16 rope dims
	indexBytes  = 132 // 128 fp8 index key dims + an fp32 scale
)

// deepseekV32 is DeepSeek-V3.2: 61 DSA layers (the first 3 with a dense
// MLP, then MoE) and one MTP layer.
func deepseekV32() spec.Model {
	m := spec.Model{
		Name: "deepseek-v3.2", Arch: "DeepseekV32ForCausalLM", Hidden: 7168, Vocab: 129280, MaxPosition: 163840,
		Heads: 128, KVHeads: 128, QLoraRank: 1536, KVLoraRank: 512, QKNopeHeadDim: 128, QKRopeHeadDim: 64, VHeadDim: 128,
		IndexHeads: 64, IndexHeadDim: 128, IndexTopK: 2048,
		Intermediate: 18432, MoEIntermediate: 2048, Experts: 256, ExpertsPerToken: 8, SharedExperts: 1, NumNextN: 1,
	}
	bufs := []spec.Buffer{{Role: spec.RoleLatent, BytesPerToken: latentBytes}, {Role: spec.RoleIndexKey, BytesPerToken: indexBytes}}
	for i := range 62 {
		l := spec.Layer{Index: i, Mixer: spec.MixerDSA, FFN: spec.FFNMoE, Buffers: bufs, MTP: i == 61}
		if i < 3 {
			l.FFN = spec.FFNDense
		}
		m.Layers = append(m.Layers, l)
	}
	return m
}

// deepseekV3 is the same model without the indexer: MLA layers.
func deepseekV3() spec.Model {
	m := deepseekV32()
	m.Name, m.Arch = "deepseek-v3", "DeepseekV3ForCausalLM"
	m.IndexHeads, m.IndexHeadDim, m.IndexTopK = 0, 0, 0
	for i := range m.Layers {
		m.Layers[i].Mixer = spec.MixerMLA
		m.Layers[i].Buffers = m.Layers[i].Buffers[:1]
	}
	return m
}

const tpb = 64

func config(m spec.Model, backend string, drafts int) worker.Config {
	return worker.Config{
		Stage: 0, Stages: 1, Model: m, First: 0, Last: len(m.Layers), Backend: backend,
		Device: "sim", Hardware: h200, TensorParallel: 8, WeightsDtype: "fp8", KVDtype: "fp8",
		DraftTokens: drafts, DraftAcceptance: 0.7, Seed: 7,
		Layout: kvcache.Layout{Pools: []kvcache.Pool{{ID: 0, Name: "full", Tier: kvcache.TierDevice, TokensPerBlock: tpb, Blocks: 1 << 24}}},
	}
}

// decodeNanos is one generation step of batch sequences at context pos
// (1 token plus drafts each).
func decodeNanos(t *testing.T, be device.Backend, cfg worker.Config, batch, pos int) int64 {
	t.Helper()
	w := device.NewWorker(be)
	if _, err := w.Configure(ctx, cfg); err != nil {
		t.Fatalf("Configure: %v", err)
	}
	var b worker.Batch
	n := 1 + cfg.DraftTokens
	for i := range batch {
		blocks := make([]kvcache.BlockID, (pos+n+tpb-1)/tpb)
		for k := range blocks {
			blocks[k] = kvcache.BlockID(i*len(blocks) + k)
		}
		b.Items = append(b.Items, worker.Item{Seq: kvcache.SeqID(i + 1), Pos: pos, Tokens: make([]int32, n), Draft: cfg.DraftTokens, Sample: true,
			Tables: []kvcache.TableDelta{{Pool: 0, Blocks: blocks}}})
	}
	res, err := w.Forward(ctx, b)
	if err != nil {
		t.Fatalf("Forward: %v", err)
	}
	return res.Nanos
}

func env(t *testing.T, m *spec.Model, tp int) *sim.Env {
	t.Helper()
	e, err := sim.NewEnv(m, h200, tp, "fp8")
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func decode(contexts ...int) *sim.Batch {
	b := &sim.Batch{}
	for _, c := range contexts {
		b.Seqs = append(b.Seqs, sim.Seq{Context: c, New: 1})
		b.Tokens++
	}
	return b
}

func TestSparseDecodeBeatsDenseAtLongContext(t *testing.T) {
	m := deepseekV32()
	for _, batch := range []int{1, 32} {
		sparse := decodeNanos(t, dsa.Backend, config(m, "dsa", 1), batch, 150_000)
		dense := decodeNanos(t, mla.Backend, config(m, "mla", 1), batch, 150_000)
		if !(sparse < dense) {
			t.Errorf("batch %d at 150k: dsa step %d ns, mla step %d ns; want dsa faster", batch, sparse, dense)
		}
	}
	// Per layer: sparse beats dense, and the attention part alone (indexer
	// scan plus sparse MLA against dense MLA) by far at batch 32.
	e := env(t, &m, 8)
	l := &m.Layers[10]
	var s, d sim.Work
	dsa.Backend.MixerWork(e, l, decode(150_000), &s)
	mla.Backend.MixerWork(e, l, decode(150_000), &d)
	if !(s.Seconds < d.Seconds) {
		t.Errorf("one DSA layer at 150k: sparse %.1f us, dense %.1f us; want sparse faster", s.Seconds*1e6, d.Seconds*1e6)
	}
	b := decode(slices.Repeat([]int{150_000}, 32)...)
	var sa, da sim.Work
	dsa.Indexer(e, &sa, l, b)
	dsa.Sparse(e, &sa, l, b)
	mla.Dense(e, &da, l, b)
	if !(sa.Seconds < da.Seconds/3) {
		t.Errorf("attention of 32 sequences at 150k: indexer + sparse %.1f us, dense %.1f us; want under a third", sa.Seconds*1e6, da.Seconds*1e6)
	}
	// At short context both attend to everything, and sparse pays for the indexer on top.
	var s2, d2 sim.Work
	dsa.Backend.MixerWork(e, l, decode(1000), &s2)
	mla.Backend.MixerWork(e, l, decode(1000), &d2)
	if !(s2.Seconds > d2.Seconds) {
		t.Errorf("one DSA layer at 1k: sparse %.2f us, dense %.2f us; want sparse slower (it runs the indexer too)", s2.Seconds*1e6, d2.Seconds*1e6)
	}
}

func TestIndexerGrowsLinearly(t *testing.T) {
	m := deepseekV32()
	e := env(t, &m, 1)
	l := &m.Layers[5]
	at := func(c int) sim.Work {
		var w sim.Work
		dsa.Indexer(e, &w, l, decode(c))
		return w
	}
	base := at(10_000)
	for _, c := range []int{20_000, 40_000, 80_000, 150_000} {
		w := at(c)
		more := float64(c - 10_000)
		if got, want := w.FLOPs-base.FLOPs, more*2*64*128; math.Abs(got-want) > 1e-6*want {
			t.Errorf("context %d: indexer FLOPs grow by %g, want %g (2*index_heads*index_head_dim per token)", c, got, want)
		}
		if got, want := w.Bytes-base.Bytes, more*indexBytes; math.Abs(got-want) > 1e-6*want {
			t.Errorf("context %d: indexer bytes grow by %g, want %g (one index key per token)", c, got, want)
		}
	}
}

func TestSparseAttentionStopsAtTopK(t *testing.T) {
	m := deepseekV32()
	e := env(t, &m, 1)
	l := &m.Layers[5]
	at := func(b *sim.Batch) sim.Work {
		var w sim.Work
		dsa.Sparse(e, &w, l, b)
		return w
	}
	if a, b := at(decode(2048)), at(decode(150_000)); a != b {
		t.Errorf("sparse attention at 2048 %+v differs from 150k %+v; want capped at index_topk", a, b)
	}
	// Under index_topk it is exactly dense (absorbed) MLA.
	for _, c := range []int{700, 2048} { // (at a handful of tokens dense MLA takes the MHA form)
		var d sim.Work
		mla.Dense(e, &d, l, decode(c))
		if s := at(decode(c)); s != d {
			t.Errorf("context %d: sparse %+v, dense %+v; want equal under index_topk", c, s, d)
		}
	}
	// A prefill chunk reads each cached latent at most once.
	chunk := &sim.Batch{Seqs: []sim.Seq{{Context: 100_000, New: 8192}}, Tokens: 8192}
	if got, max := at(chunk).Bytes, mla.UpWeightBytes(e)+(100_000+8192)*latentBytes; got > max+1e-6 {
		t.Errorf("8k chunk at 100k reads %g bytes, want at most the context once (%g)", got, max)
	}
}

func TestBackendsCheckMixers(t *testing.T) {
	w := device.NewWorker(dsa.Backend)
	_, err := w.Configure(ctx, config(deepseekV3(), "dsa", 0))
	if !errors.Is(err, kvcache.ErrUnsupported) || !strings.Contains(err.Error(), "layer 0") || !strings.Contains(err.Error(), `"mla"`) {
		t.Errorf("dsa on DeepSeek-V3 (MLA): Configure = %v, want ErrUnsupported naming layer 0 and mixer mla", err)
	}
	for _, m := range []spec.Model{deepseekV3(), deepseekV32()} {
		if _, err := device.NewWorker(mla.Backend).Configure(ctx, config(m, "mla", 1)); err != nil {
			t.Errorf("mla on %s: Configure = %v, want nil", m.Name, err)
		}
	}
	info, err := device.NewWorker(dsa.Backend).Info(ctx)
	if err != nil || info.Name != "dsa" || len(info.Mixers) != 1 || info.Mixers[0] != spec.MixerDSA {
		t.Errorf("dsa Info = %+v, %v", info, err)
	}
}

func TestMTPCostsOnlyWithDrafts(t *testing.T) {
	m := deepseekV32()
	none := decodeNanos(t, dsa.Backend, config(m, "dsa", 0), 16, 20_000)
	one := decodeNanos(t, dsa.Backend, config(m, "dsa", 1), 16, 20_000)
	two := decodeNanos(t, dsa.Backend, config(m, "dsa", 2), 16, 20_000)
	if !(none < one && one < two) {
		t.Errorf("step with 0, 1, 2 MTP drafts: %d, %d, %d ns; want increasing", none, one, two)
	}
	// Without drafts the MTP layer is not run: same as a model without it.
	noMTP := m
	noMTP.Layers = m.Layers[:61]
	noMTP.NumNextN = 0
	if base := decodeNanos(t, dsa.Backend, config(noMTP, "dsa", 0), 16, 20_000); base != none {
		t.Errorf("0 drafts: %d ns with the MTP layer, %d ns without; want equal", none, base)
	}
}
