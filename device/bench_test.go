package device_test

import (
	"testing"

	"github.com/kvx-dev/kvx/device"
	"github.com/kvx-dev/kvx/dsa"
	"github.com/kvx-dev/kvx/gqa"
	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
	"github.com/kvx-dev/kvx/plugins/v1/spec"
	"github.com/kvx-dev/kvx/plugins/v1/worker"
)

// deepseekV32 is DeepSeek-V3.2's shape (61 DSA layers, the first 3 dense,
// one MTP layer) with fp8 latents (656 B in vLLM's fp8_ds_mla layout) and
// 132-byte index keys per token per layer.
func deepseekV32() spec.Model {
	m := spec.Model{
		Name: "deepseek-v3.2", Arch: "DeepseekV32ForCausalLM", Hidden: 7168, Vocab: 129280, MaxPosition: 163840,
		Heads: 128, KVHeads: 128, QLoraRank: 1536, KVLoraRank: 512, QKNopeHeadDim: 128, QKRopeHeadDim: 64, VHeadDim: 128,
		IndexHeads: 64, IndexHeadDim: 128, IndexTopK: 2048,
		Intermediate: 18432, MoEIntermediate: 2048, Experts: 256, ExpertsPerToken: 8, SharedExperts: 1, NumNextN: 1,
	}
	bufs := []spec.Buffer{{Role: spec.RoleLatent, BytesPerToken: 656}, {Role: spec.RoleIndexKey, BytesPerToken: 132}}
	for i := range 62 {
		l := spec.Layer{Index: i, Mixer: spec.MixerDSA, FFN: spec.FFNMoE, Buffers: bufs, MTP: i == 61}
		if i < 3 {
			l.FFN = spec.FFNDense
		}
		m.Layers = append(m.Layers, l)
	}
	return m
}

// llamaLike is Llama-3.1-8B's shape with 32 layers and bf16 KV.
func llamaLike() spec.Model {
	m := spec.Model{Name: "llama", Arch: "LlamaForCausalLM", Hidden: 4096, Vocab: 128256, Heads: 32, KVHeads: 8, HeadDim: 128, Intermediate: 14336}
	for i := range 32 {
		m.Layers = append(m.Layers, spec.Layer{Index: i, Mixer: spec.MixerGQA, FFN: spec.FFNDense, Buffers: []spec.Buffer{{Role: spec.RoleKV, BytesPerToken: 4096}}})
	}
	return m
}

// benchForward runs 256 decode items (1 token + drafts, at ~150k context)
// through a stage of the model's last 30 layers (plus MTP when it has one).
func benchForward(b *testing.B, be device.Backend, m spec.Model, drafts int) {
	const items, blockTokens = 256, 64
	c := worker.Config{
		Stage: 1, Stages: 2, Model: m, First: len(m.Layers) - 30 - m.NumNextN, Last: len(m.Layers),
		Device: "sim", Hardware: h200, TensorParallel: 1, WeightsDtype: "fp8", KVDtype: "fp8", Seed: 1,
		DraftTokens: drafts, DraftAcceptance: 0.7,
		Layout: kvcache.Layout{Pools: []kvcache.Pool{{ID: 0, Name: "full", Tier: kvcache.TierDevice, TokensPerBlock: blockTokens, BlockBytes: 1 << 20, Blocks: 1 << 20}}},
	}
	w := device.NewWorker(be)
	if _, err := w.Configure(ctx, c); err != nil {
		b.Fatal(err)
	}
	// One step gives every sequence all its blocks; the benchmark then
	// repeats one decode step (1 token + drafts each).
	var pre, batch worker.Batch
	for i := range items {
		pos := 150_000 + 37*i
		blocks := make([]kvcache.BlockID, (pos+1+drafts+blockTokens)/blockTokens)
		for k := range blocks {
			blocks[k] = kvcache.BlockID(i*len(blocks) + k)
		}
		pre.Items = append(pre.Items, worker.Item{Seq: kvcache.SeqID(i + 1), Pos: 0, Tokens: []int32{1}, Tables: []kvcache.TableDelta{{Pool: 0, Blocks: blocks}}})
		toks := make([]int32, 1+drafts)
		batch.Items = append(batch.Items, worker.Item{Seq: kvcache.SeqID(i + 1), Pos: pos, Tokens: toks, Draft: drafts, Sample: true})
	}
	// Stage 0 makes the hidden states that the benchmarked last stage checks.
	first := device.NewWorker(be)
	c0 := c
	c0.Stage = 0
	if _, err := first.Configure(ctx, c0); err != nil {
		b.Fatal(err)
	}
	r0, err := first.Forward(ctx, pre)
	if err != nil {
		b.Fatal(err)
	}
	pre.Hidden = r0.Hidden
	if _, err := w.Forward(ctx, pre); err != nil {
		b.Fatal(err)
	}
	r1, err := first.Forward(ctx, batch)
	if err != nil {
		b.Fatal(err)
	}
	batch.Hidden = r1.Hidden
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		res, err := w.Forward(ctx, batch)
		if err != nil || len(res.Outputs) != items {
			b.Fatal(err)
		}
	}
}

func BenchmarkForwardDSA256(b *testing.B)   { benchForward(b, dsa.Backend, deepseekV32(), 1) }
func BenchmarkForwardLlama256(b *testing.B) { benchForward(b, gqa.Backend, llamaLike(), 0) }
