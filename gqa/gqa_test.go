package gqa_test

import (
	"context"
	"math"
	"testing"

	"github.com/kvx-dev/kvx/device"
	"github.com/kvx-dev/kvx/device/sim"
	"github.com/kvx-dev/kvx/device/sim/simtest"
	"github.com/kvx-dev/kvx/gqa"
	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
	"github.com/kvx-dev/kvx/plugins/v1/spec"
	"github.com/kvx-dev/kvx/plugins/v1/worker"
)

var ctx = context.Background()

// h200 is the shared H200-like fixture.
var h200 = simtest.H200

// llama is Llama-3.1-8B: 32 layers, hidden 4096, 32 heads of 128, 8 KV
// heads, MLP 14336, vocab 128256. KV per token per layer per rank: K and V of
// 8/tp heads of 128 in bf16.
func llama(tp int) spec.Model {
	m := spec.Model{Name: "llama-3.1-8b", Arch: "LlamaForCausalLM", Hidden: 4096, Vocab: 128256, MaxPosition: 131072,
		Heads: 32, KVHeads: 8, HeadDim: 128, Intermediate: 14336}
	kv := int64(2 * 8 / tp * 128 * 2)
	for i := range 32 {
		m.Layers = append(m.Layers, spec.Layer{Index: i, Mixer: spec.MixerGQA, FFN: spec.FFNDense,
			Buffers: []spec.Buffer{{Role: spec.RoleKV, BytesPerToken: kv}}})
	}
	return m
}

// llamaParams counts Llama-3.1-8B's parameters from its dimensions; the
// published figure is 8.03 billion.
func llamaParams() (total, embed float64) {
	h, v := 4096.0, 128256.0
	attn := h*h + 2*h*1024 + h*h
	mlp := 3 * h * 14336
	embed = v * h
	return 32*(attn+mlp) + 2*embed, embed // embedding and untied LM head
}

const tpb = 64

func stageConfig(m spec.Model, tp int, weights string) worker.Config {
	return worker.Config{
		Stage: 0, Stages: 1, Model: m, First: 0, Last: len(m.Layers), Backend: "gqa",
		Device: "sim", Hardware: h200, TensorParallel: tp, WeightsDtype: weights, KVDtype: "bf16",
		Layout: kvcache.Layout{Pools: []kvcache.Pool{{ID: 0, Name: "full", Tier: kvcache.TierDevice, TokensPerBlock: tpb, Blocks: 1 << 20}}},
	}
}

// stepNanos is the modelled time of one step of `batch` sequences, each with
// history pos writing n tokens and sampling.
func stepNanos(t *testing.T, cfg worker.Config, batch, pos, n int) int64 {
	t.Helper()
	w := device.NewWorker(gqa.Backend)
	if _, err := w.Configure(ctx, cfg); err != nil {
		t.Fatalf("Configure: %v", err)
	}
	var b worker.Batch
	for i := range batch {
		blocks := make([]kvcache.BlockID, (pos+n+tpb-1)/tpb)
		for k := range blocks {
			blocks[k] = kvcache.BlockID(i*len(blocks) + k)
		}
		b.Items = append(b.Items, worker.Item{Seq: kvcache.SeqID(i + 1), Pos: pos, Tokens: make([]int32, n), Sample: true,
			Tables: []kvcache.TableDelta{{Pool: 0, Blocks: blocks}}})
	}
	res, err := w.Forward(ctx, b)
	if err != nil {
		t.Fatalf("Forward: %v", err)
	}
	if !res.Modelled {
		t.Errorf("Modelled = false on sim")
	}
	return res.Nanos
}

func within(got, want, tol float64) bool { return math.Abs(got-want) <= tol*want }

func TestLlamaParams(t *testing.T) {
	if total, _ := llamaParams(); !within(total, 8.03e9, 0.005) {
		t.Fatalf("Llama-3.1-8B has %.4g parameters by its dimensions, want 8.03e9", total)
	}
}

func TestLlamaDecodeIsBandwidthBound(t *testing.T) {
	total, embed := llamaParams()
	want := (total - embed) * 2 / h200.MemBandwidth // every weight but the embedding table, read once
	got := float64(stepNanos(t, stageConfig(llama(1), 1, "bf16"), 1, 100, 1)) / 1e9
	if !within(got, want, 0.2) {
		t.Errorf("decode of 1 token at batch 1: %.3f ms, want weight bytes / bandwidth = %.3f ms (within 20%%)", got*1e3, want*1e3)
	}
	// fp8 halves the layers' weights; the LM head stays bf16.
	want = ((total-2*embed)*1 + embed*2) / h200.MemBandwidth
	fp8 := float64(stepNanos(t, stageConfig(llama(1), 1, "fp8"), 1, 100, 1)) / 1e9
	if !within(fp8, want, 0.2) || !(fp8 < 0.6*got) {
		t.Errorf("fp8 decode %.3f ms, want weight bytes / bandwidth = %.3f ms (within 20%%) and well under bf16's %.3f ms", fp8*1e3, want*1e3, got*1e3)
	}
}

func TestLlamaPrefillIsComputeBound(t *testing.T) {
	total, _ := llamaParams()
	const tokens = 8192
	want := 2 * total * tokens / h200.FLOPSBF16
	got := float64(stepNanos(t, stageConfig(llama(1), 1, "bf16"), 1, 0, tokens)) / 1e9
	if !within(got, want, 0.3) {
		t.Errorf("prefill of %d tokens: %.1f ms, want 2*params*tokens/flops = %.1f ms (within 30%%)", tokens, got*1e3, want*1e3)
	}
	if fp8 := float64(stepNanos(t, stageConfig(llama(1), 1, "fp8"), 1, 0, tokens)) / 1e9; !(fp8 < 0.7*got) {
		t.Errorf("fp8 prefill %.1f ms, want well under bf16's %.1f ms (twice the FLOP/s for the matmuls)", fp8*1e3, got*1e3)
	}
}

func TestTensorParallelReducesStageTime(t *testing.T) {
	for _, tc := range []struct {
		name          string
		batch, pos, n int
		maxRatio      float64 // TP 4 time / TP 1 time
	}{
		{"decode", 1, 100, 1, 0.5},
		{"decode batch 64 at 32k", 64, 32768, 1, 0.5},
		{"prefill", 1, 0, 8192, 0.45}, // two all-reduces of 8192 hidden states per layer
	} {
		one := stepNanos(t, stageConfig(llama(1), 1, "bf16"), tc.batch, tc.pos, tc.n)
		four := stepNanos(t, stageConfig(llama(4), 4, "bf16"), tc.batch, tc.pos, tc.n)
		if r := float64(four) / float64(one); r > tc.maxRatio || r < 0.25 {
			t.Errorf("%s: TP 4 takes %d ns, TP 1 %d ns: ratio %.2f, want in [0.25, %.2f]", tc.name, four, one, r, tc.maxRatio)
		}
	}
}

func TestDecodeGrowsWithContextAndBatch(t *testing.T) {
	cfg := stageConfig(llama(1), 1, "bf16")
	short := stepNanos(t, cfg, 32, 1000, 1)
	long := stepNanos(t, cfg, 32, 64000, 1)
	// 32 sequences * 63000 more tokens * 128 KiB of KV per token over all layers.
	want := 32 * 63000 * 32 * 4096 / h200.MemBandwidth
	if got := float64(long-short) / 1e9; !within(got, want, 0.05) {
		t.Errorf("63k more context for 32 sequences adds %.3f ms, want the KV read %.3f ms", got*1e3, want*1e3)
	}
}

func env(t *testing.T, m *spec.Model, tp int) *sim.Env {
	t.Helper()
	e, err := sim.NewEnv(m, h200, tp, "bf16")
	if err != nil {
		t.Fatal(err)
	}
	return e
}

func TestSlidingWindowStopsGrowing(t *testing.T) {
	m := llama(1)
	e := env(t, &m, 1)
	full := m.Layers[0]
	win := full
	win.Window = 4096
	work := func(l spec.Layer, ctx int) sim.Work {
		var w sim.Work
		gqa.Attention(e, &w, &l, &sim.Batch{Seqs: []sim.Seq{{Context: ctx, New: 1}}, Tokens: 1})
		return w
	}
	if a, b := work(win, 8192), work(win, 65536); a != b {
		t.Errorf("window 4096: work at context 8k %+v differs from 64k %+v", a, b)
	}
	if a, b := work(win, 2048), work(full, 2048); a != b {
		t.Errorf("inside the window: windowed %+v differs from full %+v", a, b)
	}
	a, b := work(full, 8192), work(full, 65536)
	if want := float64(65536-8192) * 4096; !within(b.Bytes-a.Bytes, want, 1e-9) {
		t.Errorf("full attention reads %g more bytes at 64k than at 8k, want %g", b.Bytes-a.Bytes, want)
	}
}

// nemotronNano is NVIDIA-Nemotron-3-Nano-30B-A3B: 52 blocks (23 Mamba2, 23
// MoE, 6 attention), each its own layer; bf16 KV, fp32 SSM and conv state.
func nemotronNano() spec.Model {
	m := spec.Model{Name: "nemotron-3-nano", Arch: "NemotronHForCausalLM", Hidden: 2688, Vocab: 131072,
		Heads: 32, KVHeads: 2, HeadDim: 128, MambaHeads: 64, MambaHeadDim: 64, SSMStateSize: 128, NGroups: 8, ConvKernel: 4,
		Intermediate: 1856, MoEIntermediate: 1856, Experts: 128, ExpertsPerToken: 6, SharedExperts: 1, SharedIntermediate: 3712}
	for i, c := range "MEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEMEM*EMEMEMEME" {
		l := spec.Layer{Index: i}
		switch c {
		case 'M':
			l.Mixer = spec.MixerMamba
			l.Buffers = []spec.Buffer{{Role: spec.RoleConvState, BytesPerSeq: 73728}, {Role: spec.RoleSSMState, BytesPerSeq: 2097152}}
		case 'E':
			l.FFN = spec.FFNMoE
		case '*':
			l.Mixer = spec.MixerGQA
			l.Buffers = []spec.Buffer{{Role: spec.RoleKV, BytesPerToken: 1024}}
		}
		m.Layers = append(m.Layers, l)
	}
	return m
}

func TestHybridRuns(t *testing.T) {
	m := nemotronNano()
	cfg := stageConfig(m, 1, "bf16")
	cfg.Layout.Pools = append(cfg.Layout.Pools, kvcache.Pool{ID: 1, Name: "ssm", Tier: kvcache.TierDevice, Blocks: 256})
	w := device.NewWorker(gqa.Backend)
	if _, err := w.Configure(ctx, cfg); err != nil {
		t.Fatalf("Configure(hybrid) = %v", err)
	}
	items := func(n int) []worker.Item {
		var its []worker.Item
		for i := range n {
			its = append(its, worker.Item{Seq: kvcache.SeqID(i + 1), Pos: 0, Tokens: make([]int32, 10), Sample: true,
				Tables: []kvcache.TableDelta{{Pool: 0, Blocks: []kvcache.BlockID{kvcache.BlockID(i)}}, {Pool: 1, Blocks: []kvcache.BlockID{kvcache.BlockID(i)}}}})
		}
		return its
	}
	res, err := w.Forward(ctx, worker.Batch{Items: items(4)})
	if err != nil || res.Nanos <= 0 || len(res.Outputs) != 4 {
		t.Fatalf("Forward = %+v, %v", res, err)
	}

	// One more sequence reads and writes each Mamba layer's whole state once.
	e := env(t, &m, 1)
	l := &m.Layers[0]
	var one, two sim.Work
	gqa.Mamba(e, &one, l, &sim.Batch{Seqs: []sim.Seq{{Context: 500, New: 1}}, Tokens: 1})
	gqa.Mamba(e, &two, l, &sim.Batch{Seqs: []sim.Seq{{Context: 500, New: 1}, {Context: 90000, New: 1}}, Tokens: 2})
	var tok sim.Work // what one more token costs besides the state: projections and activations
	gqa.Mamba(e, &tok, l, &sim.Batch{Seqs: []sim.Seq{{Context: 500, New: 2}}, Tokens: 2})
	state := float64(73728 + 2097152)
	if got := two.Bytes - tok.Bytes; !within(got, 2*state, 1e-9) {
		t.Errorf("a second sequence adds %g bytes besides its token, want its state read and written: %g", got, 2*state)
	}
}
