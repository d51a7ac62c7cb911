// Package calibrate fits the sim device's cost model to forwards measured on
// a device that computes (kvx calibrate). Its parts:
//
//   - measure.go: the session that drives one stage's cache manager and
//     worker, reserve, forward, commit, as one engine step does, started by
//     the engine's own engine.StartStage (so a manager that cannot serve
//     the stage is refused as kvx run refuses it), and the measurement
//     design sized by the config's limits;
//   - fit.go: the fit on every point but the held-out ones, the errors on
//     those, the plugin crossings' share of a step, and the table.
//
// The sim is the worker wing's, which the engine never imports (DESIGN §7):
// the caller hands it in as a Sim (cmd/builtin.SimCost).
package calibrate

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/kvx-dev/kvx/core/config"
	"github.com/kvx-dev/kvx/core/engine"
	"github.com/kvx-dev/kvx/core/hw"
	"github.com/kvx-dev/kvx/core/registry"
	"github.com/kvx-dev/kvx/core/setup"
	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
	"github.com/kvx-dev/kvx/plugins/v1/spec"
)

// Sim is the sim device's cost model, as calibrate needs it.
type Sim interface {
	// Stage returns the uncalibrated cost model (hw's datasheet roofline;
	// hw.Calibration is ignored) of layers first..last of m, with the
	// embedding and the LM head, on one GPU with weights of dtype weights,
	// each mixer costed by the built-in backend named backend. It returns
	// an error wrapping ErrNoCostModel when backend is not built in.
	Stage(backend string, m spec.Model, hw spec.Hardware, weights string, first, last int) (StageSim, error)
	// Fit fits a calibration to measured forwards: each point's kernels
	// (StageSim.Record) and the seconds it took.
	Fit(points []FitPoint) (spec.SimCalibration, error)
	// Predict is the calibrated seconds of a forward whose kernels are fs.
	Predict(c *spec.SimCalibration, fs []hw.CalibrationFeature) float64
}

// StageSim is one stage's cost model.
type StageSim interface {
	// Record returns the datasheet seconds of a forward of work (one
	// entry per sequence) and its kernels. It does not retain work.
	Record(work []Work) (seconds float64, kernels []hw.CalibrationFeature)
}

// Work is one sequence's part of a forward.
type Work struct {
	Context int  // tokens of context after the forward: history + New
	New     int  // tokens the forward writes
	Sample  bool // it samples a token (logits, and the sampler's pass)
}

// FitPoint is one measured forward for Sim.Fit.
type FitPoint struct {
	Features []hw.CalibrationFeature
	Measured float64 // seconds
}

// ErrNoCostModel is a backend the sim has no cost model for.
var ErrNoCostModel = errors.New("the sim has no cost model for the backend")

// ErrUnmeasurable is (wrapped by) a configuration calibrate refuses to
// measure: a device that does not compute, more than one stage or GPU,
// MTP drafts, a design the layout cannot hold, or a configuration that
// does not resolve. The message names the key and what is allowed.
var ErrUnmeasurable = errors.New("calibrate cannot measure this configuration")

// refusal is an ErrUnmeasurable error whose message is its own.
type refusal struct{ err error }

func (r *refusal) Error() string   { return r.err.Error() }
func (r *refusal) Unwrap() []error { return []error{r.err, ErrUnmeasurable} }

func refuse(err error) error { return &refusal{err} }

// MinPoints is the fewest points a measurement that stopped early is
// still fitted with.
const MinPoints = 12

// Options are a measurement's.
type Options struct {
	Name     string        // the config, for the points and the messages
	Budget   time.Duration // stop climbing to longer contexts once measuring took this long (0: no limit)
	Repeat   int           // forwards per recorded point, the median kept (>= 1)
	Progress io.Writer     // a line per point
	Log      hclog.Logger  // the plugins' log
	Registry *registry.Registry
	Sim      Sim
}

// Measurement is what was measured: the points (predictions not yet
// filled in: Fit does), on which hardware and device, of which models,
// and notes for the file.
type Measurement struct {
	Points           []hw.CalibrationPoint
	Hardware, Device string
	Models           []string
	Notes            []string
}

// Measure runs the measurement design (measure.go) on stage 0 of cfg,
// opened through setup.Prepare and started by engine.StartStage. A
// configuration it cannot measure is refused before anything starts with
// an error wrapping ErrUnmeasurable; a plugin or a forward that fails is
// any other error. When measuring stops early (the budget spent twice
// over, or ctx ended) after MinPoints points, what was measured comes back
// with a note and no error.
func Measure(ctx context.Context, cfg *config.Config, o Options) (Measurement, error) {
	name := o.Name
	switch {
	case !config.Computing(cfg.Device):
		return Measurement{}, refuse(fmt.Errorf("calibrate: %s: device %q measures nothing (its times are the sim's own); use device cpu or cuda", name, cfg.Device))
	case cfg.PipelineParallelSize != 1:
		return Measurement{}, refuse(fmt.Errorf("calibrate: %s: pipeline_parallel_size %d: calibrate measures one stage; set 1", name, cfg.PipelineParallelSize))
	case cfg.TensorParallelSize != 1:
		return Measurement{}, refuse(fmt.Errorf("calibrate: %s: tensor_parallel_size %d: calibrate measures one GPU; set 1", name, cfg.TensorParallelSize))
	case cfg.Speculative.Enabled():
		return Measurement{}, refuse(fmt.Errorf("calibrate: %s: speculative_config: calibrate measures forwards without MTP drafts; leave it unset", name))
	}
	p, err := setup.Prepare(cfg, "calibrate", o.Registry)
	if err != nil {
		return Measurement{}, refuse(err)
	}
	wc := p.Spec.Workers[0]
	stage, err := o.Sim.Stage(cfg.AttentionBackend, p.Model, cfg.HardwareSpec(), cfg.WeightsDtype, wc.First, wc.Last)
	switch {
	case errors.Is(err, ErrNoCostModel):
		return Measurement{}, refuse(fmt.Errorf("calibrate: attention_backend %q is not a built-in backend; the sim has no cost model for it", cfg.AttentionBackend))
	case err != nil:
		return Measurement{}, refuse(err)
	}

	l := p.Launcher(o.Log)
	defer l.Close()
	st, err := engine.StartStage(ctx, p.Spec, l, 0)
	if err != nil {
		return Measurement{}, fmt.Errorf("calibrate: %s: %w", name, err)
	}
	s := &session{cfg: cfg, name: name, m: st.Manager, w: st.Worker, stage: stage, vocab: p.Model.Vocab,
		hist: map[kvcache.SeqID]int{}, last: map[kvcache.SeqID]int32{}, log: o.Progress, budget: o.Budget, repeat: o.Repeat}
	fmt.Fprintf(o.Progress, "calibrate: %s: %s on device %s (hardware %s), max_batch_size %d, max_seq_len %d, max_num_tokens %d\n",
		name, p.Model.Name, cfg.Device, cfg.Hardware, cfg.MaxBatchSize, cfg.MaxSeqLen, cfg.MaxNumTokens)
	skipped, err := s.calibDesign(ctx, st.Layout)
	m := Measurement{Hardware: cfg.Hardware, Device: cfg.Device, Models: []string{p.Model.Name}, Notes: []string{}}
	switch {
	case errors.Is(err, ErrUnmeasurable):
		return Measurement{}, err
	case err != nil && (errors.Is(err, errBudget) || ctx.Err() != nil) && len(s.points) >= MinPoints:
		// Stopped early: what was measured is still worth a fit.
		m.Notes = append(m.Notes, fmt.Sprintf("%s: measuring stopped after %d points: %v", name, len(s.points), err))
		fmt.Fprintf(o.Progress, "calibrate: %s: measuring stopped after %d points (%v); fitting them\n", name, len(s.points), err)
	case err != nil:
		return Measurement{}, fmt.Errorf("calibrate: %s: %w", name, err)
	case skipped > 0:
		m.Notes = append(m.Notes, fmt.Sprintf("%s: the time budget (--budget %s) skipped %d context rungs", name, o.Budget, skipped))
	}
	m.Points = s.points
	return m, nil
}

// Add adds the points and models of an earlier calibration (kvx calibrate
// --refit). It refuses one measured on other hardware or another device
// than m's points (the first one added sets them when m has none).
func (m *Measurement) Add(c hw.Calibration) error {
	if m.Hardware == "" {
		m.Hardware, m.Device = c.Hardware, c.Device
	}
	if !strings.EqualFold(c.Hardware, m.Hardware) || c.Device != m.Device {
		return fmt.Errorf("measured on hardware %q, device %q; the other points are hardware %q, device %q",
			c.Hardware, c.Device, m.Hardware, m.Device)
	}
	m.Points = append(m.Points, c.Points...)
	for _, name := range c.Models {
		if !slices.Contains(m.Models, name) {
			m.Models = append(m.Models, name)
		}
	}
	return nil
}
