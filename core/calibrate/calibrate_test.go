package calibrate_test

import (
	"context"
	"errors"
	"io"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/kvx-dev/kvx/cmd/builtin"
	"github.com/kvx-dev/kvx/core/calibrate"
	"github.com/kvx-dev/kvx/core/config"
	"github.com/kvx-dev/kvx/core/hw"
	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
)

const calibCPU = "../../scenarios/calib-cpu.yaml"

func load(t *testing.T, sets ...string) *config.Config {
	t.Helper()
	cfg, _, err := config.Load(builtin.Registry(), []string{calibCPU}, nil, append([]string{"isolation=inprocess"}, sets...))
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

func options() calibrate.Options {
	return calibrate.Options{Name: "calib-cpu", Budget: time.Minute, Repeat: 1, Progress: io.Discard,
		Registry: builtin.Registry(), Sim: builtin.SimCost()}
}

// TestMeasureAndFit: the design on the small cpu scenario, in-process, gives
// its points; Fit holds every 4th out and fills in predictions that are the
// sim's for each point's kernels.
func TestMeasureAndFit(t *testing.T) {
	m, err := calibrate.Measure(context.Background(), load(t), options())
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Points) < calibrate.MinPoints || m.Hardware != "h200" || m.Device != "cpu" || len(m.Models) != 1 {
		t.Fatalf("Measure = %d points, hardware %q, device %q, models %v", len(m.Points), m.Hardware, m.Device, m.Models)
	}
	c, err := calibrate.Fit(m, 4, builtin.SimCost())
	if err != nil {
		t.Fatal(err)
	}
	if c.HeldOut.Points != len(m.Points)/4 || c.Fit.Points != len(m.Points)-c.HeldOut.Points || c.Notes == nil {
		t.Errorf("Fit: %d fitted, %d held out of %d, notes %v; want every 4th held out and a list of notes", c.Fit.Points, c.HeldOut.Points, len(m.Points), c.Notes)
	}
	heldByKind := map[string]int{}
	for i, p := range c.Points {
		if got := builtin.SimCost().Predict(&c.Params, p.Features); math.Abs(got-p.PredictedS) > 1e-12*p.PredictedS || p.HeldOut != (i%4 == 3) {
			t.Errorf("point %d: predicted %g (the sim says %g), held out %v", i, p.PredictedS, got, p.HeldOut)
		}
		if p.HeldOut {
			heldByKind[p.Kind]++
		}
	}
	for _, kind := range hw.PointKinds {
		if got := c.HeldOutByKind[kind].Points; got != heldByKind[kind] {
			t.Errorf("HeldOutByKind[%s] has %d points, want its %d held-out points", kind, got, heldByKind[kind])
		}
	}
}

// TestMeasureRefuses: what calibrate cannot measure is refused before
// anything starts, as ErrUnmeasurable naming the key.
func TestMeasureRefuses(t *testing.T) {
	for _, c := range []struct {
		sets []string
		want string
	}{
		{[]string{"max_seq_len=20"}, "max_seq_len 20 is too short to measure"},
		{[]string{"pipeline_parallel_size=2"}, "pipeline_parallel_size 2: calibrate measures one stage"},
		{[]string{"kv_cache_config.max_tokens=1024"}, "the layout holds 1024"},
	} {
		_, err := calibrate.Measure(context.Background(), load(t, c.sets...), options())
		if !errors.Is(err, calibrate.ErrUnmeasurable) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Measure with %v = %v, want ErrUnmeasurable and %q", c.sets, err, c.want)
		}
	}
}

// noMixers is a manager whose Info says it manages no mixer.
type noMixers struct{ kvcache.Manager }

func (m noMixers) Info(ctx context.Context) (kvcache.Info, error) {
	info, err := m.Manager.Info(ctx)
	info.Capabilities.Mixers = nil
	return info, err
}

// TestMeasureChecksTheManager: the stage starts as the engine starts it, so
// a manager whose Info cannot serve the model's layers is refused before
// Configure, as kvx run refuses it.
func TestMeasureChecksTheManager(t *testing.T) {
	o := options()
	for i, m := range o.Registry.Managers {
		if m.Name == "v2" {
			next := m.New
			o.Registry.Managers[i].New = func() kvcache.Manager { return noMixers{next()} }
		}
	}
	_, err := calibrate.Measure(context.Background(), load(t), o)
	if err == nil || errors.Is(err, calibrate.ErrUnmeasurable) || !strings.Contains(err.Error(), "cannot serve layer") {
		t.Errorf("Measure with a manager of no mixers = %v, want the engine's capability refusal", err)
	}
}

// TestAddRefusesOtherHardware: a refit's points join only points of the
// same hardware and device.
func TestAddRefusesOtherHardware(t *testing.T) {
	m := calibrate.Measurement{}
	if err := m.Add(hw.Calibration{Hardware: "H200", Device: "cuda", Models: []string{"a"}, Points: make([]hw.CalibrationPoint, 2)}); err != nil {
		t.Fatal(err)
	}
	if err := m.Add(hw.Calibration{Hardware: "h200", Device: "cuda", Models: []string{"a", "b"}, Points: make([]hw.CalibrationPoint, 3)}); err != nil {
		t.Fatal(err)
	}
	if len(m.Points) != 5 || strings.Join(m.Models, ",") != "a,b" {
		t.Errorf("after two Adds: %d points, models %v; want 5, [a b]", len(m.Points), m.Models)
	}
	if err := m.Add(hw.Calibration{Hardware: "b200", Device: "cuda"}); err == nil || !strings.Contains(err.Error(), `the other points are hardware "H200"`) {
		t.Errorf("Add of another hardware = %v", err)
	}
}
