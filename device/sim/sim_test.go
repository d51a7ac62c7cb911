package sim

import (
	"math"
	"strings"
	"testing"

	"github.com/kvx-dev/kvx/device/sim/simtest"
	"github.com/kvx-dev/kvx/plugins/v1/spec"
	"pgregory.net/rapid"
)

// h200 is the shared H200-like fixture.
var h200 = simtest.H200

// moeModel is a small DeepSeek-like MoE with gated experts.
func moeModel() *spec.Model {
	return &spec.Model{
		Name: "moe", Arch: "DeepseekV3ForCausalLM", Hidden: 1024, Vocab: 32000, Heads: 8,
		Intermediate: 4096, MoEIntermediate: 512, Experts: 64, ExpertsPerToken: 4, SharedExperts: 1,
		Layers: []spec.Layer{{Index: 0, FFN: spec.FFNMoE}},
	}
}

func env(t *testing.T, m *spec.Model, hw spec.Hardware, tp int, weights string) *Env {
	t.Helper()
	e, err := NewEnv(m, hw, tp, weights)
	if err != nil {
		t.Fatalf("NewEnv: %v", err)
	}
	return e
}

func TestPairsMatchesBruteForce(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		n := rapid.IntRange(0, 300).Draw(t, "new")
		c := n + rapid.IntRange(0, 300).Draw(t, "history")
		h := rapid.IntRange(0, 700).Draw(t, "horizon")
		s := Seq{Context: c, New: n}
		var want float64
		for j := range n {
			see := c - n + j + 1
			if h > 0 {
				see = min(see, h)
			}
			want += float64(see)
		}
		if got := Pairs(s, h); got != want {
			t.Fatalf("Pairs(%+v, %d) = %v, want %v", s, h, got, want)
		}
		wantVis := float64(c)
		if h > 0 {
			wantVis = float64(min(c, h))
		}
		if got := Visible(s, h); got != wantVis {
			t.Fatalf("Visible(%+v, %d) = %v, want %v", s, h, got, wantVis)
		}
	})
}

func TestWeightsDtype(t *testing.T) {
	for _, tc := range []struct {
		name  string
		bytes float64
		prec  Precision
		err   bool
	}{
		{"", 2, BF16, false},
		{"bf16", 2, BF16, false},
		{"fp8", 1, FP8, false},
		{"fp4", 0.5625, FP4, false},
		{"w4afp8", 0.515625, FP8, false},
		{"int8", 0, 0, true},
	} {
		d, err := WeightsDtype(tc.name)
		if tc.err {
			if err == nil || !strings.Contains(err.Error(), tc.name) {
				t.Errorf("WeightsDtype(%q) error = %v, want one naming the value", tc.name, err)
			}
			continue
		}
		if err != nil || d.Bytes != tc.bytes || d.Prec != tc.prec {
			t.Errorf("WeightsDtype(%q) = %+v, %v, want %v bytes at %v", tc.name, d, err, tc.bytes, tc.prec)
		}
	}
}

func TestNewEnvErrors(t *testing.T) {
	m := moeModel()
	noBW := h200
	noBW.MemBandwidth = 0
	noFlops := h200
	noFlops.FLOPSBF16 = 0
	noLink := h200
	noLink.NVLinkBW = 0
	for _, tc := range []struct {
		name string
		hw   spec.Hardware
		tp   int
		want string
	}{
		{"no bandwidth", noBW, 1, "mem_bandwidth"},
		{"no flops", noFlops, 1, "flops_bf16"},
		{"tp without nvlink", noLink, 2, "nvlink_bandwidth"},
		{"negative tp", h200, -1, "tensor_parallel -1"},
		{"negative copy latency", withCopyLatency(-1e-6), 1, "copy_latency -1e-06 s must be finite and >= 0"},
		{"NaN copy latency", withCopyLatency(math.NaN()), 1, "copy_latency NaN"},
		{"infinite copy latency", withCopyLatency(math.Inf(1)), 1, "copy_latency +Inf"},
	} {
		if _, err := NewEnv(m, tc.hw, tc.tp, "bf16"); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: NewEnv error = %v, want one naming %q", tc.name, err, tc.want)
		}
	}
	if _, err := NewEnv(m, noLink, 1, "bf16"); err != nil {
		t.Errorf("NewEnv(tp 1, no nvlink) = %v, want nil: one rank needs no link", err)
	}
}

func withCopyLatency(l float64) spec.Hardware {
	h := h200
	h.CopyLatency = l
	return h
}

func TestPeakFallback(t *testing.T) {
	m := moeModel()
	e := env(t, m, h200, 1, "fp4")
	if got := e.Peak(FP4); got != h200.FLOPSFP8 {
		t.Errorf("Peak(fp4) on hardware without fp4 = %g, want the fp8 peak %g", got, h200.FLOPSFP8)
	}
	old := h200
	old.FLOPSFP8 = 0
	e = env(t, m, old, 1, "fp8")
	if got := e.Peak(FP8); got != old.FLOPSBF16 {
		t.Errorf("Peak(fp8) on hardware without fp8 = %g, want the bf16 peak %g", got, old.FLOPSBF16)
	}
	b200 := h200
	b200.FLOPSFP4 = 9000e12
	e = env(t, m, b200, 1, "fp4")
	if got := e.Peak(FP4); got != b200.FLOPSFP4 {
		t.Errorf("Peak(fp4) = %g, want %g", got, b200.FLOPSFP4)
	}
}

func TestMoEReadsOnlyTouchedExperts(t *testing.T) {
	m := moeModel()
	e := env(t, m, h200, 1, "bf16")
	l := &m.Layers[0]
	expertBytes := 3.0 * float64(m.Hidden*m.MoEIntermediate) * 2
	prev := -1.0
	for _, tokens := range []int{1, 2, 8, 64, 4096} {
		var w Work
		FFN(e, &w, l, tokens)
		// Everything but the routed experts: router, shared expert, activations.
		var rest Work
		linear(e, &rest, float64(m.Hidden), float64(m.Experts), float64(tokens), false, e.Weights)
		linear(e, &rest, float64(m.Hidden), 2*float64(m.MoEIntermediate), float64(tokens), true, e.Weights)
		linear(e, &rest, float64(m.MoEIntermediate), float64(m.Hidden), float64(tokens), true, e.Weights)
		act := float64(tokens*m.ExpertsPerToken) * 2 * float64(m.Hidden) * actBytes
		experts := (w.Bytes - rest.Bytes - act) / expertBytes
		cap := float64(min(m.Experts, tokens*m.ExpertsPerToken))
		if experts > cap+1e-6 || experts <= prev {
			t.Errorf("%d tokens touch %.2f experts; want more than %.2f (fewer tokens) and at most min(E, tokens*k) = %v", tokens, experts, prev, cap)
		}
		prev = experts
		wantFLOPs := 2 * 3 * float64(m.Hidden*m.MoEIntermediate) * float64(tokens*m.ExpertsPerToken)
		if got := w.FLOPs - rest.FLOPs; math.Abs(got-wantFLOPs) > 1e-6*wantFLOPs {
			t.Errorf("%d tokens: routed FLOPs %g, want active experts only: %g", tokens, got, wantFLOPs)
		}
	}
	if prev < float64(m.Experts)-0.01 {
		t.Errorf("4096 tokens touch %.2f experts, want all %d", prev, m.Experts)
	}
}

func TestNonGatedMLPForNemotronH(t *testing.T) {
	m := moeModel()
	m.Layers[0].FFN = spec.FFNDense
	gated := env(t, m, h200, 1, "bf16")
	n := *m
	n.Arch = "NemotronHForCausalLM"
	plain := env(t, &n, h200, 1, "bf16")
	var a, b Work
	FFN(gated, &a, &m.Layers[0], 16)
	FFN(plain, &b, &m.Layers[0], 16)
	if got := a.FLOPs / b.FLOPs; math.Abs(got-1.5) > 1e-9 {
		t.Errorf("gated/non-gated MLP FLOPs = %v, want 1.5 (three matrices against two)", got)
	}
}

func TestAllReduce(t *testing.T) {
	m := moeModel()
	var w Work
	AllReduce(env(t, m, h200, 1, "bf16"), &w, 100)
	if w != (Work{}) {
		t.Errorf("AllReduce with TP 1 = %+v, want nothing", w)
	}
	AllReduce(env(t, m, h200, 4, "bf16"), &w, 100)
	want := 2 * 3.0 / 4 * 100 * float64(m.Hidden) * 2
	if w.LinkBytes != want || math.Abs(w.Seconds-want/h200.NVLinkBW) > 1e-15 {
		t.Errorf("AllReduce TP 4 = %+v, want %g link bytes in %g s", w, want, want/h200.NVLinkBW)
	}
}

// countMixer charges one FLOP per new token and one byte per context token.
func countMixer(e *Env, l *spec.Layer, b *Batch, w *Work) {
	var ctx float64
	for _, s := range b.Seqs {
		ctx += float64(s.Context)
	}
	w.Add(e, Kernel{FLOPs: float64(b.Tokens), Bytes: ctx})
}

func TestStageGroupsIdenticalLayers(t *testing.T) {
	m := moeModel()
	e := env(t, m, h200, 1, "bf16")
	one := spec.Layer{Mixer: spec.MixerGQA, FFN: spec.FFNMoE, Buffers: []spec.Buffer{{Role: spec.RoleKV, BytesPerToken: 64}}}
	win := one
	win.Window = 128
	var layers []spec.Layer
	for i := range 10 {
		l := one
		if i%3 == 0 {
			l = win
		}
		l.Index = i
		layers = append(layers, l)
	}
	st := &Step{Batch: Batch{Seqs: []Seq{{Context: 100, New: 1}, {Context: 5000, New: 4}}, Tokens: 5}}
	whole, err := NewStage(StageConfig{Env: e, Layers: layers, Mixer: countMixer})
	if err != nil {
		t.Fatal(err)
	}
	got := whole.Forward(st)
	var want Work
	for i := range layers {
		s, err := NewStage(StageConfig{Env: e, Layers: layers[i : i+1], Mixer: countMixer})
		if err != nil {
			t.Fatal(err)
		}
		want.AddScaled(s.Forward(st), 1)
	}
	if math.Abs(got.Seconds-want.Seconds) > 1e-12 || math.Abs(got.FLOPs-want.FLOPs) > 1e-3 || math.Abs(got.Bytes-want.Bytes) > 1e-3 {
		t.Errorf("grouped stage = %+v, want the sum of its layers %+v", got, want)
	}
	if len(whole.mixers) != 2 || len(whole.ffns) != 1 {
		t.Errorf("stage has %d mixer groups and %d FFN groups, want 2 (full, window) and 1", len(whole.mixers), len(whole.ffns))
	}
}

func TestStageMTPOnlyWithDrafts(t *testing.T) {
	m := moeModel()
	e := env(t, m, h200, 1, "bf16")
	layers := []spec.Layer{
		{Index: 0, Mixer: spec.MixerGQA, FFN: spec.FFNDense},
		{Index: 1, Mixer: spec.MixerGQA, FFN: spec.FFNDense, MTP: true},
	}
	st := &Step{
		Batch:   Batch{Seqs: []Seq{{Context: 1000, New: 2}}, Tokens: 2},
		Logits:  2,
		Sampled: Batch{Seqs: []Seq{{Context: 1001, New: 1}}, Tokens: 1},
	}
	var secs []float64
	for _, d := range []int{0, 1, 3} {
		s, err := NewStage(StageConfig{Env: e, Layers: layers, Head: true, DraftTokens: d, Mixer: countMixer})
		if err != nil {
			t.Fatal(err)
		}
		secs = append(secs, s.Forward(st).Seconds)
	}
	noMTP, err := NewStage(StageConfig{Env: e, Layers: layers[:1], Head: true, Mixer: countMixer})
	if err != nil {
		t.Fatal(err)
	}
	if base := noMTP.Forward(st).Seconds; secs[0] != base {
		t.Errorf("draft tokens 0: %g s, want the same as without the MTP layer (%g s)", secs[0], base)
	}
	if !(secs[0] < secs[1] && secs[1] < secs[2]) {
		t.Errorf("stage time for draft tokens 0, 1, 3 = %v, want strictly increasing", secs)
	}
}

func TestNewStageNeedsMixer(t *testing.T) {
	m := moeModel()
	e := env(t, m, h200, 1, "bf16")
	_, err := NewStage(StageConfig{Env: e, Layers: []spec.Layer{{Index: 7, Mixer: spec.MixerMamba}}})
	if err == nil || !strings.Contains(err.Error(), "layer 7") {
		t.Errorf("NewStage without a MixerFunc = %v, want an error naming layer 7", err)
	}
	if _, err := NewStage(StageConfig{Env: e, Layers: []spec.Layer{{Index: 0, FFN: spec.FFNMoE}}}); err != nil {
		t.Errorf("NewStage of FFN-only layers without a MixerFunc = %v, want nil", err)
	}
}

// TestCopySeconds: one transfer costs the copy latency plus its bytes over
// PCIe (host side) or a device-memory read and write (device to device).
func TestCopySeconds(t *testing.T) {
	e := env(t, moeModel(), h200, 1, "bf16")
	if got, want := e.CopySeconds(1e6, false), h200.CopyLatency+1e6/h200.PCIeBW; got != want {
		t.Errorf("host transfer of 1 MB = %g s, want %g", got, want)
	}
	if got, want := e.CopySeconds(1e6, true), h200.CopyLatency+2e6/h200.MemBandwidth; got != want {
		t.Errorf("device transfer of 1 MB = %g s, want %g", got, want)
	}
	free := h200
	free.CopyLatency = 0
	e0 := env(t, moeModel(), free, 1, "bf16")
	if got, want := e0.CopySeconds(1e6, false), 1e6/h200.PCIeBW; got != want {
		t.Errorf("copy_latency 0: host transfer of 1 MB = %g s, want the bytes alone, %g", got, want)
	}
}

// TestSmallCopiesCollapse: per byte, one 64 KiB transfer is slower than one
// of 4 MiB by (L*B/64Ki + 1) / (L*B/4Mi + 1) for latency L and bandwidth B,
// which on an H200 puts 64 KiB far below the link and 4 MiB close to it.
func TestSmallCopiesCollapse(t *testing.T) {
	e := env(t, moeModel(), h200, 1, "bf16")
	const small, big = 64 << 10, 4 << 20
	perByte := func(b float64) float64 { return e.CopySeconds(b, false) / b }
	lb := h200.CopyLatency * h200.PCIeBW // bytes the link could move during one latency
	want := (lb/small + 1) / (lb/big + 1)
	if got := perByte(small) / perByte(big); math.Abs(got-want) > 1e-9*want {
		t.Errorf("per-byte time of 64 KiB / 4 MiB = %g, want %g", got, want)
	}
	if eff := small / e.CopySeconds(small, false) / h200.PCIeBW; eff > 0.25 {
		t.Errorf("one 64 KiB transfer moves at %.0f%% of the link, want under 25%%", 100*eff)
	}
	if eff := big / e.CopySeconds(big, false) / h200.PCIeBW; eff < 0.9 {
		t.Errorf("one 4 MiB transfer moves at %.0f%% of the link, want over 90%%", 100*eff)
	}
}

// TestCopySecondsProperties: the time of n transfers of b bytes in all
// grows with b and with n (splitting a transfer costs one latency more),
// in both directions.
func TestCopySecondsProperties(t *testing.T) {
	e := env(t, moeModel(), h200, 1, "bf16")
	split := func(b float64, n int, d2d bool) float64 {
		var s float64
		for range n {
			s += e.CopySeconds(b/float64(n), d2d)
		}
		return s
	}
	rapid.Check(t, func(t *rapid.T) {
		b := float64(rapid.Int64Range(1, 1<<32).Draw(t, "bytes"))
		more := b + float64(rapid.Int64Range(1, 1<<32).Draw(t, "more"))
		n := rapid.IntRange(1, 4096).Draw(t, "transfers")
		d2d := rapid.Bool().Draw(t, "device2device")
		if lo, hi := split(b, n, d2d), split(more, n, d2d); !(hi > lo) {
			t.Fatalf("%d transfers: %g bytes take %g s, %g bytes %g s: want more bytes slower", n, b, lo, more, hi)
		}
		lo, hi := split(b, n, d2d), split(b, n+1, d2d)
		if !(hi > lo) || math.Abs(hi-lo-h200.CopyLatency) > 1e-9*hi {
			t.Fatalf("%g bytes in %d transfers take %g s, in %d %g s: want one copy latency (%g s) more", b, n, lo, n+1, hi, h200.CopyLatency)
		}
	})
}
