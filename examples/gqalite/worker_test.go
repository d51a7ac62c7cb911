package main

import (
	"context"
	"strings"
	"testing"

	"github.com/kvx-dev/kvx/plugins/conformance"
	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
	"github.com/kvx-dev/kvx/plugins/v1/spec"
	"github.com/kvx-dev/kvx/plugins/v1/worker"
)

// config is one stage running the suite's small GQA model, with a layout
// of one full-attention pool.
func config(t *testing.T) worker.Config {
	t.Helper()
	m, err := conformance.SmallModel(spec.MixerGQA)
	if err != nil {
		t.Fatal(err)
	}
	return worker.Config{
		Stage: 0, Stages: 1, Model: m, First: 0, Last: len(m.Layers), Device: "sim", TensorParallel: 1, WeightsDtype: "bf16",
		Hardware: spec.Hardware{Name: "test", MemBandwidth: 4e12, FLOPSBF16: 1e15},
		Layout:   kvcache.Layout{Pools: []kvcache.Pool{{ID: 0, Name: "full", Tier: kvcache.TierDevice, TokensPerBlock: 16, Blocks: 64, BlockBytes: 1 << 16}}},
		Seed:     7, DraftTokens: 1, DraftAcceptance: 0.5,
	}
}

// TestOutputsAreTheContractsPlaceholders: the sampled tokens and drafts are
// worker.Placeholder's, position by position, which is what makes this
// backend's outputs digest kvx's gqa backend's.
func TestOutputsAreTheContractsPlaceholders(t *testing.T) {
	ctx := context.Background()
	cfg := config(t)
	w := New()
	if _, err := w.Configure(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	it := worker.Item{Seq: 3, Pos: 0, Tokens: make([]int32, 20), Sample: true,
		Tables: []kvcache.TableDelta{{Pool: 0, From: 0, Blocks: []kvcache.BlockID{5, 9}}}}
	res, err := w.Forward(ctx, worker.Batch{Step: 1, Items: []worker.Item{it}})
	if err != nil {
		t.Fatal(err)
	}
	ph := worker.NewPlaceholder(cfg.Seed, cfg.Model.Vocab, cfg.DraftAcceptance)
	out := res.Outputs[0]
	if len(out.Tokens) != 1 || out.Tokens[0] != ph.Token(3, 20) || len(out.Drafts) != 1 || out.Drafts[0] != ph.Token(3, 21) {
		t.Errorf("Forward = %+v; want token %d at 20 and draft %d at 21", out, ph.Token(3, 20), ph.Token(3, 21))
	}
	if !res.Modelled || res.Nanos <= 0 {
		t.Errorf("Forward: Nanos %d, Modelled %v; want modelled time", res.Nanos, res.Modelled)
	}
}

// TestRefusesWhatItDoesNotRun: a Mamba layer or another device is refused
// at Configure as unsupported, naming the layer or the device.
func TestRefusesWhatItDoesNotRun(t *testing.T) {
	ctx := context.Background()
	cfg := config(t)
	cfg.Model.Layers[2].Mixer = spec.MixerMamba
	if _, err := New().Configure(ctx, cfg); kvcache.KindOf(err) != kvcache.KindUnsupported || !strings.Contains(err.Error(), `layer 2`) {
		t.Errorf("Configure with a mamba layer: %v; want KindUnsupported naming layer 2", err)
	}
	cfg = config(t)
	cfg.Device = "cpu"
	if _, err := New().Configure(ctx, cfg); kvcache.KindOf(err) != kvcache.KindUnsupported || !strings.Contains(err.Error(), `"cpu"`) {
		t.Errorf("Configure on cpu: %v; want KindUnsupported naming the device", err)
	}
}

// TestCost: a longer context costs more; a sliding window caps what a
// token sees.
func TestCost(t *testing.T) {
	cfg := config(t)
	at := func(pos int) int64 {
		return stepNanos(&cfg, cfg.Model.Layers, []worker.Item{{Seq: 1, Pos: pos, Tokens: []int32{1}, Sample: true}})
	}
	if a, b := at(100), at(100000); a >= b {
		t.Errorf("decode at 100 costs %d ns, at 100000 %d ns; want more for the longer context", a, b)
	}
	if p, v := attention(10, 4, 0); p != 11+12+13+14 || v != 10 {
		t.Errorf("attention(10, 4, full) = %v pairs, %v cached; want 50, 10", p, v)
	}
	if p, v := attention(10, 4, 8); p != 32 || v != 4 {
		t.Errorf("attention(10, 4, window 8) = %v pairs, %v cached; want 32, 4", p, v)
	}
}
