package sim

import (
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"gonum.org/v1/gonum/mat"

	"github.com/kvx-dev/kvx/plugins/v1/spec"
)

// calStage is a 10-layer MoE stage (GQA mixers, a windowed group, the
// embedding and the LM head) on h200 with calibration c (nil: none).
func calStage(t *testing.T, c *spec.SimCalibration) *Stage {
	t.Helper()
	hw := h200
	hw.Calibration = c
	e := env(t, moeModel(), hw, 1, "bf16")
	one := spec.Layer{Mixer: spec.MixerGQA, FFN: spec.FFNMoE, Buffers: []spec.Buffer{{Role: spec.RoleKV, BytesPerToken: 64}}}
	var layers []spec.Layer
	for i := range 10 {
		l := one
		if i%3 == 0 {
			l.Window = 128
			l.FFN = spec.FFNDense
		}
		l.Index = i
		layers = append(layers, l)
	}
	s, err := NewStage(StageConfig{Env: e, Layers: layers, Embed: true, Head: true, Mixer: countMixer})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

var testCal = spec.SimCalibration{
	Name: "test", LaunchSeconds: 4e-6, StepSeconds: 3e-4,
	Classes: []spec.KernelClassScale{
		{Class: "gemm", ComputeScale: 40, MemoryScale: 2.5},
		{Class: "moe", ComputeScale: 30, MemoryScale: 3},
		{Class: "mixer.gqa", ComputeScale: 1e6, MemoryScale: 1.7},
		// memory is not listed: scale 1 on both sides
	},
}

func calSteps() []*Step {
	return []*Step{
		{Batch: Batch{Seqs: []Seq{{Context: 100, New: 1}, {Context: 5000, New: 4}}, Tokens: 5}, Logits: 2},
		{Batch: Batch{Seqs: []Seq{{Context: 2048, New: 2048}}, Tokens: 2048}, Logits: 1},
		{Batch: Batch{Seqs: []Seq{{Context: 300, New: 1}}, Tokens: 1}, Logits: 1},
	}
}

// TestPredictMatchesStage: the calibrated sim (Work.Add inside a Stage)
// and Predict over the recorded kernels are one formula.
func TestPredictMatchesStage(t *testing.T) {
	plain, cal := calStage(t, nil), calStage(t, &testCal)
	for i, st := range calSteps() {
		w0, fs := plain.Record(st)
		if again := plain.Forward(st); again != w0 {
			t.Fatalf("step %d: Record = %+v, Forward = %+v: recording changed the work", i, w0, again)
		}
		got := cal.Forward(st).Seconds
		want := Predict(&testCal, fs)
		if math.Abs(got-want) > 1e-12*want {
			t.Errorf("step %d: calibrated stage %g s, Predict %g s", i, got, want)
		}
		if math.Abs(got-w0.Seconds) < 1e-3*w0.Seconds {
			t.Errorf("step %d: calibrated %g s equals the datasheet's %g s: the calibration changed nothing", i, got, w0.Seconds)
		}
		var classes []string
		var layers float64
		for _, f := range fs {
			if !slices.Contains(classes, f.Class) {
				classes = append(classes, f.Class)
			}
			if f.Class == "mixer.gqa" {
				layers += f.Count
			}
		}
		slices.Sort(classes)
		if want := []string{"gemm", "memory", "mixer.gqa", "moe"}; !slices.Equal(classes, want) {
			t.Errorf("step %d: recorded classes %v, want %v", i, classes, want)
		}
		if layers != 10 {
			t.Errorf("step %d: mixer kernels stand for %g layers, want 10", i, layers)
		}
	}
	// An empty calibration is the datasheet roofline without the per-layer
	// launch latency.
	empty := calStage(t, &spec.SimCalibration{Name: "empty"})
	st := calSteps()[0]
	want := plain.Forward(st).Seconds - 10*h200.LaunchLatency
	if got := empty.Forward(st).Seconds; math.Abs(got-want) > 1e-12 {
		t.Errorf("empty calibration: %g s, want %g", got, want)
	}
	if n := cal.env.Calibrated(); n != "test" {
		t.Errorf("Calibrated() = %q, want test", n)
	}
	if n := plain.env.Calibrated(); n != "" {
		t.Errorf("uncalibrated Calibrated() = %q, want empty", n)
	}
}

func TestNewEnvRefusesBadCalibration(t *testing.T) {
	for _, c := range []struct {
		cal  spec.SimCalibration
		want string
	}{
		{spec.SimCalibration{Name: "n", LaunchSeconds: -1}, "launch_seconds -1 must be finite and >= 0"},
		{spec.SimCalibration{Name: "n", StepSeconds: math.NaN()}, "step_seconds NaN"},
		{spec.SimCalibration{Name: "n", Classes: []spec.KernelClassScale{{Class: "gemm", ComputeScale: math.Inf(1)}}}, "classes[0] (gemm): compute_scale +Inf"},
		{spec.SimCalibration{Name: "n", Classes: []spec.KernelClassScale{{Class: "gemm"}, {Class: "gemm"}}}, `class "gemm" is listed twice`},
		{spec.SimCalibration{Name: "n", Classes: []spec.KernelClassScale{{Class: "tensor"}}}, `class "tensor" is not one of gemm, moe, memory or mixer.<mixer>`},
		{spec.SimCalibration{Name: "n", Classes: []spec.KernelClassScale{{Class: "mixer."}}}, `class "mixer." is not one of`},
	} {
		hw := h200
		hw.Calibration = &c.cal
		_, err := NewEnv(moeModel(), hw, 1, "bf16")
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("NewEnv with %+v: error %v, want one containing %q", c.cal, err, c.want)
		}
	}
}

// synthPoints draws n forwards of random kernels of the classes and their
// exact calibrated time under c, times (1 + noise*u), u uniform in [-1, 1].
func synthPoints(r *rand.Rand, c *spec.SimCalibration, n int, noise float64) []FitPoint {
	classes := []string{"gemm", "moe", "mixer.dsa"}
	var pts []FitPoint
	for range n {
		var fs []Feature
		tokens := math.Exp(r.Float64() * math.Log(8192)) // 1 .. 8192 tokens
		for _, cl := range classes {
			for k := range 3 {
				params := 1e6 * float64(1+k) * (1 + r.Float64())
				fs = append(fs, Feature{
					Class:          cl,
					ComputeSeconds: 2 * params * tokens / 989e12,
					MemorySeconds:  (2*params + 4e3*tokens) / 4.8e12,
					Count:          float64(1 + r.IntN(4)),
				})
			}
		}
		// The embedding gather: memory only, one per forward.
		fs = append(fs, Feature{Class: "memory", MemorySeconds: tokens * 8192 / 4.8e12, Count: 1})
		m := Predict(c, fs) * (1 + noise*(2*r.Float64()-1))
		pts = append(pts, FitPoint{Features: fs, Measured: m})
	}
	return pts
}

// TestFitRecoversKnownParameters: points made by a known calibration give
// it back (exactly without noise; held-out error within the noise with 2%).
// The memory class comes back equal to gemm, as the fit ties them.
func TestFitRecoversKnownParameters(t *testing.T) {
	known := spec.SimCalibration{
		LaunchSeconds: 5e-6, StepSeconds: 2e-4,
		Classes: []spec.KernelClassScale{
			{Class: "gemm", ComputeScale: 47, MemoryScale: 2.5},
			{Class: "memory", ComputeScale: 47, MemoryScale: 2.5}, // the fit ties it to gemm
			{Class: "mixer.dsa", ComputeScale: 20, MemoryScale: 4},
			{Class: "moe", ComputeScale: 60, MemoryScale: 3},
		},
	}
	r := rand.New(rand.NewPCG(1, 2))
	res, err := Fit(synthPoints(r, &known, 60, 0))
	if err != nil {
		t.Fatal(err)
	}
	got := res.Calibration
	near := func(name string, g, w float64) {
		if math.Abs(g-w) > 1e-6*w {
			t.Errorf("%s = %g, want %g (fit %+v)", name, g, w, got)
		}
	}
	near("launch_seconds", got.LaunchSeconds, known.LaunchSeconds)
	near("step_seconds", got.StepSeconds, known.StepSeconds)
	if len(got.Classes) != len(known.Classes) {
		t.Fatalf("classes %+v, want %+v", got.Classes, known.Classes)
	}
	for i, k := range known.Classes {
		if got.Classes[i].Class != k.Class {
			t.Fatalf("class %d = %q, want %q", i, got.Classes[i].Class, k.Class)
		}
		near(k.Class+".compute_scale", got.Classes[i].ComputeScale, k.ComputeScale)
		near(k.Class+".memory_scale", got.Classes[i].MemoryScale, k.MemoryScale)
	}
	if len(res.Unbound) != 0 {
		t.Errorf("Unbound = %v, want none: every side binds some kernel", res.Unbound)
	}

	noisy, err := Fit(synthPoints(r, &known, 60, 0.02))
	if err != nil {
		t.Fatal(err)
	}
	held := RelErrors(&noisy.Calibration, synthPoints(r, &known, 40, 0))
	slices.Sort(held)
	if p90 := held[len(held)*9/10]; p90 > 0.03 {
		t.Errorf("with 2%% noise: held-out p90 error %.3f, want <= 0.03 (fit %+v)", p90, noisy.Calibration)
	}
}

func TestFitErrors(t *testing.T) {
	if _, err := Fit(nil); err == nil || !strings.Contains(err.Error(), "no points") {
		t.Errorf("Fit(nil) error %v, want no points", err)
	}
	pts := []FitPoint{{Features: []Feature{{Class: "gemm", ComputeSeconds: 1, Count: 1}}, Measured: 0}}
	if _, err := Fit(pts); err == nil || !strings.Contains(err.Error(), "point 0: measured 0 s must be finite and > 0") {
		t.Errorf("Fit of a 0 s point: error %v", err)
	}
	pts[0].Measured = 1
	if _, err := Fit(pts); err == nil || !strings.Contains(err.Error(), "1 points for 4 unknowns") {
		t.Errorf("Fit of 1 point: error %v", err)
	}
}

func TestNNLS(t *testing.T) {
	// min |a x - b|, x >= 0: the unconstrained solution (1, -1) has a
	// negative part; the constrained one is x = (b.a0/|a0|^2, 0).
	a := matOf([][]float64{{1, 0}, {1, 1}, {0, 1}})
	x, used := nnls(a, []float64{1, 0, -1})
	if !used[0] || !used[1] || math.Abs(x[0]-0.5) > 1e-12 || x[1] != 0 {
		t.Errorf("nnls = %v %v, want [0.5 0] [true true]", x, used)
	}
	// A zero column is unused and stays 0.
	a = matOf([][]float64{{2, 0}, {4, 0}})
	x, used = nnls(a, []float64{1, 2})
	if used[1] || x[1] != 0 || math.Abs(x[0]-0.5) > 1e-12 {
		t.Errorf("nnls = %v %v, want [0.5 0] [true false]", x, used)
	}
}

func matOf(rows [][]float64) *mat.Dense {
	m := mat.NewDense(len(rows), len(rows[0]), nil)
	for i, r := range rows {
		m.SetRow(i, r)
	}
	return m
}
