package device_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/kvx-dev/kvx/device"
	"github.com/kvx-dev/kvx/device/sim"
	"github.com/kvx-dev/kvx/device/sim/simtest"
	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
	"github.com/kvx-dev/kvx/plugins/v1/spec"
	"github.com/kvx-dev/kvx/plugins/v1/worker"
	"pgregory.net/rapid"
)

var ctx = context.Background()

// h200 is the shared H200-like fixture.
var h200 = simtest.H200

// fake is a backend that runs GQA and Mamba layers at a simple cost: one
// FLOP per new token, one byte per context token.
type fake struct{}

func (fake) Name() string         { return "fake" }
func (fake) Mixers() []spec.Mixer { return []spec.Mixer{spec.MixerGQA, spec.MixerMamba} }
func (fake) Kernel(m spec.Mixer) device.Kernel {
	switch m {
	case spec.MixerGQA:
		return device.KernelGQA
	case spec.MixerMamba:
		return device.KernelMamba2
	}
	return device.KernelNone
}
func (fake) MixerWork(e *sim.Env, l *spec.Layer, b *sim.Batch, w *sim.Work) {
	var c float64
	for _, s := range b.Seqs {
		c += float64(s.Context)
	}
	w.Add(e, sim.Kernel{FLOPs: float64(b.Tokens), Bytes: c})
}

const (
	tpb       = 16
	kvBytes   = 256
	poolFull  = 0
	poolState = 1
	poolHost  = 7 // ids need not be indexes
)

// smallModel has 4 GQA layers and one Mamba layer.
func smallModel() spec.Model {
	m := spec.Model{Name: "small", Arch: "LlamaForCausalLM", Hidden: 256, Vocab: 1000, Heads: 4, KVHeads: 2, HeadDim: 64, Intermediate: 512}
	for i := range 5 {
		l := spec.Layer{Index: i, Mixer: spec.MixerGQA, FFN: spec.FFNDense, Buffers: []spec.Buffer{{Role: spec.RoleKV, BytesPerToken: kvBytes}}}
		if i == 2 {
			l = spec.Layer{Index: i, Mixer: spec.MixerMamba, Buffers: []spec.Buffer{{Role: spec.RoleSSMState, BytesPerSeq: 4096}}}
		}
		m.Layers = append(m.Layers, l)
	}
	return m
}

func config(stage, stages int) worker.Config {
	m := smallModel()
	return worker.Config{
		Stage: stage, Stages: stages, Model: m, First: 0, Last: len(m.Layers),
		Backend: "fake", Device: "sim", Hardware: h200, TensorParallel: 1,
		WeightsDtype: "bf16", KVDtype: "bf16", Seed: 42,
		DraftTokens: 2, DraftAcceptance: 0.6,
		Layout: kvcache.Layout{Pools: []kvcache.Pool{
			{ID: poolFull, Name: "full", Tier: kvcache.TierDevice, TokensPerBlock: tpb, BlockBytes: tpb * kvBytes * 4, Blocks: 4096},
			{ID: poolState, Name: "ssm", Tier: kvcache.TierDevice, BlockBytes: 4096, Blocks: 512},
			{ID: poolHost, Name: "host", Tier: kvcache.TierHost, TokensPerBlock: tpb, BlockBytes: tpb * kvBytes * 4, Blocks: 100},
		}},
	}
}

func configured(t interface{ Fatalf(string, ...any) }, cfg worker.Config) *device.Worker {
	w := device.NewWorker(fake{})
	if _, err := w.Configure(ctx, cfg); err != nil {
		t.Fatalf("Configure: %v", err)
	}
	return w
}

// item is seq's step at pos writing n tokens of which draft are drafts, with
// tables that give a new sequence every block it needs (block ids derived
// from seq so that sequences do not share blocks).
func item(seq kvcache.SeqID, pos, n, draft int, sample bool) worker.Item {
	toks := make([]int32, n)
	for i := range toks {
		toks[i] = int32(pos + i)
	}
	it := worker.Item{Seq: seq, Pos: pos, Tokens: toks, Draft: draft, Sample: sample}
	blocks := make([]kvcache.BlockID, (pos+n+tpb-1)/tpb)
	for i := range blocks {
		blocks[i] = kvcache.BlockID(int(seq)*16 + i)
	}
	it.Tables = []kvcache.TableDelta{
		{Pool: poolFull, From: 0, Blocks: blocks},
		{Pool: poolState, From: 0, Blocks: []kvcache.BlockID{kvcache.BlockID(seq)}},
	}
	return it
}

func TestInfo(t *testing.T) {
	info, err := device.NewWorker(fake{}).Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.Name != "fake" || info.Device != "sim" || !slices.Equal(info.Mixers, fake{}.Mixers()) ||
		!slices.Contains(info.Protocols, worker.ProtocolVersion) || info.Version == "" {
		t.Errorf("Info = %+v", info)
	}
}

func TestConfigureErrors(t *testing.T) {
	mod := func(f func(c *worker.Config)) worker.Config {
		c := config(0, 1)
		f(&c)
		return c
	}
	for _, tc := range []struct {
		name string
		cfg  worker.Config
		kind kvcache.Kind
		want []string
	}{
		{"cpu device", mod(func(c *worker.Config) { c.Device = "cpu" }), kvcache.KindUnsupported, []string{"device cpu is not built into this worker (it has sim)"}},
		{"cuda device", mod(func(c *worker.Config) { c.Device = "cuda" }), kvcache.KindUnsupported, []string{"device cuda is not built into this worker (it has sim)"}},
		{"unknown device", mod(func(c *worker.Config) { c.Device = "tpu" }), kvcache.KindInvalidConfig, []string{`"tpu"`, "sim"}},
		{"other backend", mod(func(c *worker.Config) { c.Backend = "dsa" }), kvcache.KindInvalidConfig, []string{`"dsa"`, `"fake"`}},
		{"mixer", mod(func(c *worker.Config) { c.Model.Layers[3].Mixer = spec.MixerDSA }), kvcache.KindUnsupported, []string{"layer 3", `"dsa"`, `"fake"`}},
		{"stage", mod(func(c *worker.Config) { c.Stage = 1 }), kvcache.KindInvalidConfig, []string{"stage 1 of 1"}},
		{"layers", mod(func(c *worker.Config) { c.Last = 9 }), kvcache.KindInvalidConfig, []string{"[0, 9)", "5 layers"}},
		{"empty stage", mod(func(c *worker.Config) { c.First, c.Last = 2, 2 }), kvcache.KindInvalidConfig, []string{"[2, 2)"}},
		{"acceptance", mod(func(c *worker.Config) { c.DraftAcceptance = 1.5 }), kvcache.KindInvalidConfig, []string{"draft acceptance 1.5"}},
		{"acceptance NaN", mod(func(c *worker.Config) { c.DraftAcceptance = math.NaN() }), kvcache.KindInvalidConfig, []string{"draft acceptance NaN"}},
		{"drafts", mod(func(c *worker.Config) { c.DraftTokens = -1 }), kvcache.KindInvalidConfig, []string{"draft tokens -1"}},
		{"vocab", mod(func(c *worker.Config) { c.Model.Vocab = 0 }), kvcache.KindInvalidConfig, []string{"vocab 0"}},
		{"kv dtype", mod(func(c *worker.Config) { c.KVDtype = "int4" }), kvcache.KindInvalidConfig, []string{`"int4"`}},
		{"weights dtype", mod(func(c *worker.Config) { c.WeightsDtype = "int4" }), kvcache.KindInvalidConfig, []string{`"int4"`}},
		{"tp", mod(func(c *worker.Config) { c.TensorParallel = -2 }), kvcache.KindInvalidConfig, []string{"tensor_parallel -2"}},
		{"bandwidth", mod(func(c *worker.Config) { c.Hardware.MemBandwidth = 0 }), kvcache.KindInvalidConfig, []string{"mem_bandwidth"}},
		{"pcie with host pool", mod(func(c *worker.Config) { c.Hardware.PCIeBW = 0 }), kvcache.KindInvalidConfig, []string{"pcie_bandwidth", "host"}},
		{"pool id twice", mod(func(c *worker.Config) { c.Layout.Pools[1].ID = poolFull }), kvcache.KindInvalidConfig, []string{"id 0 is used twice"}},
		{"pool id", mod(func(c *worker.Config) { c.Layout.Pools[1].ID = -3 }), kvcache.KindInvalidConfig, []string{"id -3"}},
		{"model", mod(func(c *worker.Config) { c.Model.Hidden = 0 }), kvcache.KindInvalidConfig, []string{"hidden size 0"}},
	} {
		w := device.NewWorker(fake{})
		_, err := w.Configure(ctx, tc.cfg)
		if err == nil || kvcache.KindOf(err) != tc.kind {
			t.Errorf("%s: Configure = %v (kind %v), want kind %v", tc.name, err, kvcache.KindOf(err), tc.kind)
			continue
		}
		for _, s := range tc.want {
			if !strings.Contains(err.Error(), s) {
				t.Errorf("%s: Configure error %q does not name %s", tc.name, err, s)
			}
		}
		if _, err := w.Forward(ctx, worker.Batch{}); err == nil {
			t.Errorf("%s: Forward after a failed Configure succeeded", tc.name)
		}
	}
}

func TestConfigureAcceptsStageWithoutOtherLayers(t *testing.T) {
	// The stage runs only the GQA layers 3 and 4; a mixer elsewhere in the
	// model does not matter.
	c := config(1, 2)
	c.Model.Layers[0].Mixer = spec.MixerDSA
	c.First, c.Last = 3, 5
	w := device.NewWorker(fake{})
	if _, err := w.Configure(ctx, c); err != nil {
		t.Fatalf("Configure = %v, want nil", err)
	}
}

func TestCallsBeforeConfigure(t *testing.T) {
	w := device.NewWorker(fake{})
	if _, err := w.Forward(ctx, worker.Batch{}); !errors.Is(err, kvcache.ErrInvalidConfig) {
		t.Errorf("Forward before Configure = %v, want ErrInvalidConfig", err)
	}
	if err := w.CopyBlocks(ctx, nil); !errors.Is(err, kvcache.ErrInvalidConfig) {
		t.Errorf("CopyBlocks before Configure = %v, want ErrInvalidConfig", err)
	}
	if err := w.Health(ctx); err != nil {
		t.Errorf("Health = %v", err)
	}
}

func TestBadItems(t *testing.T) {
	const seq = 5
	for _, tc := range []struct {
		name string
		item func() worker.Item
		want string
	}{
		{"pos", func() worker.Item { it := item(seq, 0, 4, 0, true); it.Pos = -1; return it }, "pos -1"},
		{"empty tokens", func() worker.Item { it := item(seq, 0, 4, 0, true); it.Tokens = nil; return it }, "tokens is empty"},
		{"draft too many", func() worker.Item { return item(seq, 0, 3, 3, true) }, "draft 3 must be in [0, 2]"},
		{"draft negative", func() worker.Item { return item(seq, 0, 3, -1, true) }, "draft -1"},
		{"snapshot pool", func() worker.Item {
			it := item(seq, 0, 4, 0, true)
			it.Snapshots = []kvcache.SnapshotSlot{{Pos: 2, Pool: 3}}
			return it
		}, "snapshots[0]: pool 3 does not exist"},
		{"snapshot block", func() worker.Item {
			it := item(seq, 0, 4, 0, true)
			it.Snapshots = []kvcache.SnapshotSlot{{Pos: 2, Pool: 0, Block: 1 << 20}}
			return it
		}, "snapshots[0]: block 1048576 is outside"},
		{"snapshot pos", func() worker.Item {
			it := item(seq, 0, 4, 1, true)
			it.Snapshots = []kvcache.SnapshotSlot{{Pos: 4, Pool: 0}}
			return it
		}, "snapshots[0]: pos 4 must be in (0, 3]"},
		{"snapshot order", func() worker.Item {
			it := item(seq, 0, 4, 0, true)
			it.Snapshots = []kvcache.SnapshotSlot{{Pos: 3, Pool: 0}, {Pos: 2, Pool: 0}}
			return it
		}, "snapshots[1]: pos 2 after pos 3"},
		{"pool", func() worker.Item {
			it := item(seq, 0, 4, 0, true)
			it.Tables[1].Pool = 3
			return it
		}, "pool 3 does not exist"},
		{"from", func() worker.Item {
			it := item(seq, 0, 4, 0, true)
			it.Tables[0].From = 2
			return it
		}, "from 2 must be in [0, 0]"},
		{"block", func() worker.Item {
			it := item(seq, 0, 4, 0, true)
			it.Tables[0].Blocks[0] = 4096
			return it
		}, "block 4096 is outside pool 0"},
		{"coverage", func() worker.Item {
			it := item(seq, 0, 40, 0, true)
			it.Tables[0].Blocks = it.Tables[0].Blocks[:2]
			return it
		}, "needs 40"},
	} {
		w := configured(t, config(0, 1))
		ok := item(9, 0, 4, 0, true)
		_, err := w.Forward(ctx, worker.Batch{Items: []worker.Item{ok, tc.item()}})
		var e *kvcache.Error
		if !errors.As(err, &e) || e.Kind != kvcache.KindInvalidArg || !slices.Equal(e.Seqs, []kvcache.SeqID{seq}) {
			t.Errorf("%s: Forward = %v, want an item error about seq %d", tc.name, err, seq)
			continue
		}
		if !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), fmt.Sprint("seq ", seq)) {
			t.Errorf("%s: error %q does not name the seq and %q", tc.name, err, tc.want)
		}
		if n := w.Tables().Len(); n != 0 {
			t.Errorf("%s: a failed Forward left %d sequences with tables, want none applied", tc.name, n)
		}
	}
}

func TestDuplicateSeqs(t *testing.T) {
	w := configured(t, config(0, 1))
	a := item(3, 0, 4, 0, false)
	if _, err := w.Forward(ctx, worker.Batch{Items: []worker.Item{a, item(3, 0, 4, 0, false)}}); kvcache.KindOf(err) != kvcache.KindInvalidArg || !strings.Contains(fmt.Sprint(err), "more than once") {
		t.Errorf("new seq twice: Forward = %v, want an item error", err)
	}
	if _, err := w.Forward(ctx, worker.Batch{Items: []worker.Item{a}}); err != nil {
		t.Fatal(err)
	}
	b := worker.Item{Seq: 3, Pos: 4, Tokens: []int32{1}}
	if _, err := w.Forward(ctx, worker.Batch{Items: []worker.Item{b, b}}); kvcache.KindOf(err) != kvcache.KindInvalidArg || !strings.Contains(fmt.Sprint(err), "more than once") {
		t.Errorf("known seq twice: Forward = %v, want an item error", err)
	}
	if _, err := w.Forward(ctx, worker.Batch{Items: []worker.Item{b}}); err != nil {
		t.Errorf("seq once after a failed batch: Forward = %v", err)
	}
}

// TestTablesFollowDeltas drives random deltas and releases and checks the
// worker's tables against a plain model of "table = table[:From] ++ Blocks".
func TestTablesFollowDeltas(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		c := config(0, 1)
		c.Layout.Pools = c.Layout.Pools[:1] // the full pool only: every item must cover its tokens
		w := configured(t, c)
		model := map[kvcache.SeqID][]kvcache.BlockID{}
		pos := map[kvcache.SeqID]int{}
		for range rapid.IntRange(1, 30).Draw(t, "steps") {
			var b worker.Batch
			for _, s := range rapid.SliceOfNDistinct(rapid.Uint64Range(1, 6), 0, 4, rapid.ID).Draw(t, "seqs") {
				seq := kvcache.SeqID(s)
				if rapid.Bool().Draw(t, "release") {
					b.Released = append(b.Released, seq)
					delete(model, seq)
					delete(pos, seq)
					continue
				}
				n := rapid.IntRange(1, 40).Draw(t, "tokens")
				cur := model[seq]
				need := (pos[seq] + n + tpb - 1) / tpb
				from := rapid.IntRange(0, len(cur)).Draw(t, "from")
				blocks := rapid.SliceOfN(rapid.Int32Range(0, 4095), max(0, need-from), need-from+3).Draw(t, "blocks")
				d := kvcache.TableDelta{Pool: poolFull, From: from, Blocks: make([]kvcache.BlockID, len(blocks))}
				for i, x := range blocks {
					d.Blocks[i] = kvcache.BlockID(x)
				}
				b.Items = append(b.Items, worker.Item{Seq: seq, Pos: pos[seq], Tokens: make([]int32, n), Tables: []kvcache.TableDelta{d}})
				model[seq] = append(slices.Clone(cur[:from]), d.Blocks...)
				pos[seq] += n
			}
			if _, err := w.Forward(ctx, b); err != nil {
				t.Fatalf("Forward: %v", err)
			}
			// The caller owns its slices: scribbling on them changes nothing.
			for _, it := range b.Items {
				for i := range it.Tables[0].Blocks {
					it.Tables[0].Blocks[i] = -1
				}
			}
			if w.Tables().Len() != len(model) {
				t.Fatalf("worker holds %d sequences, want %d", w.Tables().Len(), len(model))
			}
			for seq, want := range model {
				if got := w.Tables().Table(seq, 0); !slices.Equal(got, want) {
					t.Fatalf("table of seq %d = %v, want %v", seq, got, want)
				}
			}
		}
	})
}

func outputsBySeq(t *testing.T, res worker.Result) map[kvcache.SeqID]worker.Output {
	t.Helper()
	m := map[kvcache.SeqID]worker.Output{}
	for _, o := range res.Outputs {
		m[o.Seq] = o
	}
	return m
}

func TestSamplingIsDeterministicAndBatchIndependent(t *testing.T) {
	var items []worker.Item
	for s := range 40 {
		n, d := 1+s%3, s%3
		items = append(items, item(kvcache.SeqID(s+1), 100*s, n, d, s%5 != 0))
	}
	run := func(items []worker.Item) worker.Result {
		w := configured(t, config(0, 1))
		res, err := w.Forward(ctx, worker.Batch{Items: items})
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	a, b := run(items), run(items)
	if !slices.EqualFunc(a.Outputs, b.Outputs, func(x, y worker.Output) bool {
		return x.Seq == y.Seq && slices.Equal(x.Tokens, y.Tokens) && slices.Equal(x.Drafts, y.Drafts)
	}) || a.Nanos != b.Nanos {
		t.Fatalf("the same Forward twice differs:\n%+v\n%+v", a, b)
	}
	if len(a.Outputs) != 32 {
		t.Fatalf("%d outputs, want one per sampling item (32)", len(a.Outputs))
	}
	// Alone or in reverse order, each sequence gets the same output.
	rev := slices.Clone(items)
	slices.Reverse(rev)
	byRev := outputsBySeq(t, run(rev))
	for _, o := range a.Outputs {
		alone := run([]worker.Item{items[o.Seq-1]}).Outputs
		for _, other := range []worker.Output{byRev[o.Seq], alone[0]} {
			if !slices.Equal(o.Tokens, other.Tokens) || !slices.Equal(o.Drafts, other.Drafts) {
				t.Errorf("seq %d: output %+v depends on the batch: %+v", o.Seq, o, other)
			}
		}
	}
}

func TestOutputsAreConsistent(t *testing.T) {
	c := config(0, 1)
	c.DraftAcceptance = 0.5
	w := configured(t, c)
	var items []worker.Item
	for s := range 200 {
		items = append(items, item(kvcache.SeqID(s+1), 10, 4, 3, true))
	}
	res, err := w.Forward(ctx, worker.Batch{Items: items})
	if err != nil {
		t.Fatal(err)
	}
	if res.Hidden != nil || !res.Modelled || res.Nanos <= 0 {
		t.Errorf("last stage result: hidden %d bytes, modelled %v, nanos %d; want no hidden, modelled, > 0", len(res.Hidden), res.Modelled, res.Nanos)
	}
	for i, o := range res.Outputs {
		it := items[i]
		a := len(o.Tokens) - 1
		if o.Seq != it.Seq || a < 0 || a > it.Draft || len(o.Drafts) != c.DraftTokens {
			t.Fatalf("output %+v for item %+v: want seq, 1..draft+1 tokens and %d drafts", o, it, c.DraftTokens)
		}
		if !slices.Equal(o.Tokens[:a], it.Tokens[1:1+a]) {
			t.Errorf("seq %d: accepted %v, want the item's own drafts %v", o.Seq, o.Tokens[:a], it.Tokens[1:1+a])
		}
		for _, tok := range append(slices.Clone(o.Tokens), o.Drafts...) {
			if tok < 0 || int(tok) >= c.Model.Vocab {
				t.Errorf("seq %d: token %d outside the vocabulary of %d", o.Seq, tok, c.Model.Vocab)
			}
		}
	}
	// Drafts propose exactly the tokens later sampled at those positions.
	w = configured(t, c)
	first, err := w.Forward(ctx, worker.Batch{Items: []worker.Item{item(1, 0, 8, 0, true)}})
	if err != nil {
		t.Fatal(err)
	}
	o := first.Outputs[0]
	next, err := w.Forward(ctx, worker.Batch{Items: []worker.Item{{Seq: 1, Pos: 8, Tokens: o.Tokens, Sample: true}}})
	if err != nil {
		t.Fatal(err)
	}
	if got := next.Outputs[0].Tokens[0]; got != o.Drafts[0] {
		t.Errorf("token sampled at position 9 = %d, want the draft proposed for it, %d", got, o.Drafts[0])
	}
}

func TestAcceptanceFrequency(t *testing.T) {
	for _, p := range []float64{0, 0.3, 0.8, 1} {
		c := config(0, 1)
		c.DraftAcceptance = p
		c.Layout.Pools = nil // no tables needed
		w := configured(t, c)
		const draws = 10000
		var items []worker.Item
		for i := range draws {
			items = append(items, worker.Item{Seq: kvcache.SeqID(i % 97), Pos: 1000 + i/97, Tokens: []int32{1, 2}, Draft: 1, Sample: true})
		}
		accepted := 0
		for chunk := range slices.Chunk(items, 97) {
			res, err := w.Forward(ctx, worker.Batch{Items: chunk})
			if err != nil {
				t.Fatal(err)
			}
			for _, o := range res.Outputs {
				accepted += len(o.Tokens) - 1
			}
		}
		if got := float64(accepted) / draws; math.Abs(got-p) > 0.03 {
			t.Errorf("acceptance %v: accepted %.4f of %d drafts, want within 0.03", p, got, draws)
		}
	}
}

func TestHiddenCarriesTheBatch(t *testing.T) {
	items := []worker.Item{item(1, 0, 5, 0, true), item(2, 32, 1, 0, true), item(3, 7, 3, 2, true)}
	first := configured(t, config(0, 2))
	res, err := first.Forward(ctx, worker.Batch{Items: items})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Hidden) != device.HiddenBytesPerItem*len(items) || res.Outputs != nil {
		t.Fatalf("stage 0: %d hidden bytes and %d outputs, want %d and none", len(res.Hidden), len(res.Outputs), device.HiddenBytesPerItem*len(items))
	}
	if _, err := first.Forward(ctx, worker.Batch{Items: items, Hidden: res.Hidden}); kvcache.KindOf(err) != kvcache.KindInvalidArg {
		t.Errorf("stage 0 given hidden state: Forward = %v, want KindInvalidArg", err)
	}
	swapped := slices.Clone(items)
	swapped[0], swapped[2] = swapped[2], swapped[0]
	for _, tc := range []struct {
		name   string
		items  []worker.Item
		hidden []byte
		want   string
	}{
		{"reordered", swapped, res.Hidden, "item 0 (seq 3"},
		{"short", items, res.Hidden[:8], "hidden state is 8 bytes, want 24"},
		{"missing", items, nil, "hidden state is 0 bytes"},
	} {
		second := configured(t, config(1, 2))
		_, err := second.Forward(ctx, worker.Batch{Items: tc.items, Hidden: tc.hidden})
		var e *kvcache.Error
		if !errors.As(err, &e) || e.Kind != kvcache.KindInvalidArg || e.Seqs != nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: stage 1 Forward = %v, want a batch error naming %q", tc.name, err, tc.want)
		}
	}
	second := configured(t, config(1, 2))
	out, err := second.Forward(ctx, worker.Batch{Items: items, Hidden: res.Hidden})
	if err != nil || len(out.Outputs) != 3 {
		t.Errorf("stage 1 Forward = %d outputs, %v; want 3, nil", len(out.Outputs), err)
	}
}

func TestCopiesAreCharged(t *testing.T) {
	c := config(0, 1)
	c.Layout.Pools = c.Layout.Pools[:1:1]
	c.Layout.Pools = append(c.Layout.Pools, kvcache.Pool{ID: poolHost, Name: "host", Tier: kvcache.TierHost, TokensPerBlock: tpb, BlockBytes: 1 << 20, Blocks: 10})
	c.Layout.Pools[0].BlockBytes = 1 << 20
	// Each worker runs seq 1: a 4-token prefill with its first block, then
	// 1-token decodes inside that block.
	pos := map[*device.Worker]int{}
	step := func(w *device.Worker, copies []kvcache.Copy) int64 {
		it := worker.Item{Seq: 1, Pos: pos[w], Tokens: []int32{1}, Sample: true}
		if pos[w] == 0 {
			it = item(1, 0, 4, 0, true)
			it.Tables = it.Tables[:1]
		}
		res, err := w.Forward(ctx, worker.Batch{Items: []worker.Item{it}, Copies: copies})
		if err != nil {
			t.Fatal(err)
		}
		pos[w] += len(it.Tokens)
		return res.Nanos
	}
	w := configured(t, c)
	base := step(w, nil)
	toHost := []kvcache.Copy{{SrcPool: poolFull, SrcBlock: 0, DstPool: poolHost, DstBlock: 0}, {SrcPool: poolHost, SrcBlock: 1, DstPool: poolFull, DstBlock: 9}}
	onDevice := []kvcache.Copy{{SrcPool: poolFull, SrcBlock: 0, DstPool: poolFull, DstBlock: 1}}
	if err := w.CopyBlocks(ctx, toHost); err != nil {
		t.Fatal(err)
	}
	withQueued := step(w, onDevice)
	w2 := configured(t, c)
	step(w2, nil)
	without := step(w2, nil)
	// Three transfers (the two PCIe copies are not one run), each paying
	// the copy latency.
	want := 2*float64(1<<20)/h200.PCIeBW + 2*float64(1<<20)/h200.MemBandwidth + 3*h200.CopyLatency
	if got := float64(withQueued-without) / 1e9; math.Abs(got-want) > 2e-9 {
		t.Errorf("2 PCIe copies and 1 device copy of 1 MiB add %g s, want %g s", got, want)
	}
	if base <= 0 {
		t.Errorf("first step = %d ns, want > 0", base)
	}
	for _, bad := range []kvcache.Copy{
		{SrcPool: 4, DstPool: poolFull},
		{SrcPool: poolFull, DstPool: poolHost, DstBlock: 10},
		{SrcPool: poolFull, SrcBlock: -1, DstPool: poolHost},
	} {
		if err := w.CopyBlocks(ctx, []kvcache.Copy{bad}); kvcache.KindOf(err) != kvcache.KindInvalidArg || !strings.Contains(err.Error(), "copies[0]") {
			t.Errorf("CopyBlocks(%+v) = %v, want KindInvalidArg naming copies[0]", bad, err)
		}
		if _, err := w.Forward(ctx, worker.Batch{Items: []worker.Item{{Seq: 1, Pos: pos[w], Tokens: []int32{1}}}, Copies: []kvcache.Copy{bad}}); kvcache.KindOf(err) != kvcache.KindInvalidArg {
			t.Errorf("Forward with copy %+v = %v, want KindInvalidArg", bad, err)
		}
	}
}

// recorder is a device that records what the runtime hands it.
type recorder struct {
	tables [][]kvcache.BlockID
	batch  int
}

func (r *recorder) Modelled() bool { return false }
func (r *recorder) Forward(_ context.Context, b *worker.Batch, t *device.Tables) (device.Pass, error) {
	r.batch = len(b.Items)
	r.tables = r.tables[:0]
	var outs []worker.Output
	for _, it := range b.Items {
		r.tables = append(r.tables, slices.Clone(t.Table(it.Seq, 0)))
		if it.Sample {
			// A computing device's own samples: the runtime must pass them on
			// instead of drawing placeholders.
			outs = append(outs, worker.Output{Seq: it.Seq, Tokens: []int32{7}, Logits: []float32{0.5}})
		}
	}
	return device.Pass{Nanos: 1234, Outputs: outs}, nil
}
func (r *recorder) CopyBlocks(context.Context, []kvcache.Copy) error { return nil }

func TestDeviceSeesAppliedTables(t *testing.T) {
	rec := &recorder{}
	w := device.NewWorker(fake{}, device.WithDevice("rec", func(s device.Stage) (device.Device, error) {
		if len(s.Layers) != 5 || len(s.Pools) != 3 || s.Backend.Name() != "fake" {
			return nil, fmt.Errorf("stage %+v", s)
		}
		return rec, nil
	}))
	c := config(0, 1)
	c.Device = "rec"
	if _, err := w.Configure(ctx, c); err != nil {
		t.Fatal(err)
	}
	it := item(1, 0, 20, 0, true)
	res, err := w.Forward(ctx, worker.Batch{Items: []worker.Item{it}})
	if err != nil {
		t.Fatal(err)
	}
	if res.Nanos != 1234 || res.Modelled || !slices.Equal(rec.tables[0], it.Tables[0].Blocks) {
		t.Errorf("device saw tables %v and returned %+v; want %v, 1234 ns, measured", rec.tables, res, it.Tables[0].Blocks)
	}
	if len(res.Outputs) != 1 || !slices.Equal(res.Outputs[0].Tokens, []int32{7}) || len(res.Outputs[0].Logits) != 1 {
		t.Errorf("outputs %+v, want the device's own sample [7] with its logits", res.Outputs)
	}
	// Released before the step: a released sequence may start again from 0.
	it2 := item(1, 0, 4, 0, true)
	if _, err := w.Forward(ctx, worker.Batch{Items: []worker.Item{it2}, Released: []kvcache.SeqID{1}}); err != nil {
		t.Fatalf("Forward after Released: %v", err)
	}
	if !slices.Equal(rec.tables[0], it2.Tables[0].Blocks) {
		t.Errorf("device saw %v, want the new table %v", rec.tables[0], it2.Tables[0].Blocks)
	}
}

// closer is a recorder that counts its Close calls.
type closer struct {
	recorder
	closed int
}

func (c *closer) Close() error {
	c.closed++
	return nil
}

// TestReconfigureClosesDevice: a device that holds memory (io.Closer, as
// cuda's) is closed before the next Configure opens another.
func TestReconfigureClosesDevice(t *testing.T) {
	var opened []*closer
	w := device.NewWorker(fake{}, device.WithDevice("rec", func(device.Stage) (device.Device, error) {
		c := &closer{}
		opened = append(opened, c)
		return c, nil
	}))
	c := config(0, 1)
	c.Device = "rec"
	for range 2 {
		if _, err := w.Configure(ctx, c); err != nil {
			t.Fatal(err)
		}
	}
	if len(opened) != 2 || opened[0].closed != 1 || opened[1].closed != 0 {
		t.Errorf("after two Configures: %d devices opened, closed %d and %d times; want 2, the first closed once", len(opened),
			opened[0].closed, opened[len(opened)-1].closed)
	}
}

func TestContextCanceled(t *testing.T) {
	w := configured(t, config(0, 1))
	c, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := w.Forward(c, worker.Batch{}); !errors.Is(err, context.Canceled) {
		t.Errorf("Forward on a canceled context = %v", err)
	}
}

func TestSetupNotes(t *testing.T) {
	c := config(0, 1)
	c.Hardware.Uncalibrated = true
	c.Model.Layers[4].MTP = true
	c.DraftTokens = 0
	setup, err := device.NewWorker(fake{}).Configure(ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	all := strings.Join(setup.Notes, "\n")
	for _, want := range []string{"modelled", "uncalibrated", "MTP layers [4] are not run"} {
		if !strings.Contains(all, want) {
			t.Errorf("Setup notes %q do not say %q", all, want)
		}
	}
	if setup.DeviceBytes != 0 {
		t.Errorf("sim allocated %d bytes, want 0", setup.DeviceBytes)
	}
}
