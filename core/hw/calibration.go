package hw

import (
	"bytes"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"math"
	"os"
	"slices"
	"strings"

	"github.com/kvx-dev/kvx/plugins/v1/spec"
)

// CalibrationSchema is the schema of calibration files; a change that
// breaks readers gives a new value.
const CalibrationSchema = "kvx.calibration/v1"

// Calibration is a calibration file (kvx calibrate): the fitted parameters
// of the sim cost model for one hardware, what they were measured on, how
// well they fit, and the raw points, so a fit can be redone or checked.
type Calibration struct {
	Schema    string   `json:"schema"`
	Hardware  string   `json:"hardware"`  // a preset name: the roofline the features were computed on
	Device    string   `json:"device"`    // the device that measured: cuda, cpu
	Models    []string `json:"models"`    // the configs' models
	Created   string   `json:"created"`   // RFC 3339, UTC
	Generator string   `json:"generator"` // kvx version
	// Params are what the sim uses (spec.SimCalibration; Name is set when
	// the file is loaded, not stored).
	Params spec.SimCalibration `json:"params"`
	// Fit is the error on the points the fit used; HeldOut on the points
	// it did not see; Datasheet is the uncalibrated roofline's error on the
	// held-out points, for comparison. Errors are |sim-measured|/measured.
	Fit     ErrorStats `json:"fit"`
	HeldOut ErrorStats `json:"held_out"`
	// HeldOutByKind is HeldOut split by the points' Kind (PointKinds): the
	// error on the held-out points of that kind only. A kind without a
	// held-out point has no entry; nil in a file written before kvx kept
	// it.
	HeldOutByKind map[string]ErrorStats `json:"held_out_by_kind,omitempty"`
	Datasheet     ErrorStats            `json:"datasheet"`
	// Crossing is the plugin crossings' share of an engine step over all
	// points: 1 - (worker forward time) / (host step time).
	Crossing CrossingStats `json:"crossing"`
	// Notes say what limited the measurement (a time budget that skipped
	// context rungs, a run stopped early); [] when nothing did.
	Notes  []string           `json:"notes"`
	Points []CalibrationPoint `json:"points"`
}

// ErrorStats summarises relative errors.
type ErrorStats struct {
	Points int     `json:"points"`
	Median float64 `json:"median"`
	P90    float64 `json:"p90"`
	Max    float64 `json:"max"`
}

// CrossingStats summarises the share of an engine step spent outside the
// worker's forward (the plugin crossings and the manager's calls).
type CrossingStats struct {
	Median float64 `json:"median"`
	P90    float64 `json:"p90"`
	// Total is 1 - sum(forward) / sum(step) over every point.
	Total float64 `json:"total"`
}

// Kinds of a CalibrationPoint: a forward of prefill chunks only, of
// decode tokens only, or of both.
const (
	KindPrefill = "prefill"
	KindDecode  = "decode"
	KindMixed   = "mixed"
)

// PointKinds are the kinds of a CalibrationPoint, in the order tables
// print them.
var PointKinds = []string{KindPrefill, KindDecode, KindMixed}

// CalibrationPoint is one measured forward.
type CalibrationPoint struct {
	Config  string `json:"config"` // the config file it came from
	Kind    string `json:"kind"`   // a PointKinds value
	Seqs    int    `json:"seqs"`
	Tokens  int    `json:"tokens"`
	Context int    `json:"context"` // the longest sequence's context after the step
	// MeasuredS is the forward's time as the worker reports it (the device
	// time); HostForwardS the forward call as the host sees it; StepS the
	// whole engine step on the host (reserve, forward, commit).
	MeasuredS    float64              `json:"measured_s"`
	HostForwardS float64              `json:"host_forward_s"`
	StepS        float64              `json:"step_s"`
	PredictedS   float64              `json:"predicted_s"` // the fitted sim
	DatasheetS   float64              `json:"datasheet_s"` // the uncalibrated sim
	HeldOut      bool                 `json:"held_out"`
	Features     []CalibrationFeature `json:"features"`
}

// CalibrationFeature is one kernel of a point as the sim records it
// (sim.Feature, the same JSON).
type CalibrationFeature struct {
	Class          string  `json:"class"`
	ComputeSeconds float64 `json:"compute_s"`
	MemorySeconds  float64 `json:"memory_s"`
	Count          float64 `json:"count"`
}

//go:embed calibrations
var embedded embed.FS

// DefaultCalibration returns the calibration that ships with kvx for the
// hardware preset called name (calibrations/<name>.json), or nil when none
// does. Its Params.Name is "embedded:<name>.json".
func DefaultCalibration(name string) (*Calibration, error) {
	return defaultIn(embedded, name)
}

func defaultIn(fsys fs.FS, name string) (*Calibration, error) {
	file := strings.ToLower(strings.TrimSpace(name)) + ".json"
	b, err := fs.ReadFile(fsys, "calibrations/"+file)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	c, err := ParseCalibration(b, "embedded:"+file)
	if err != nil {
		return nil, err
	}
	if !strings.EqualFold(c.Hardware, name) {
		return nil, fmt.Errorf("embedded:%s: hardware %q, want %q", file, c.Hardware, name)
	}
	return c, nil
}

// LoadCalibration reads and checks the calibration file at path
// (ParseCalibration); Params.Name is path.
func LoadCalibration(path string) (*Calibration, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return ParseCalibration(b, path)
}

// ParseCalibration decodes a calibration file and checks it: the schema, a
// known hardware preset, parameters the sim accepts (every figure finite
// and >= 0, every class known and listed once) and, when the file has
// held_out_by_kind, stats of known kinds that agree with its points
// (checkByKind). name becomes Params.Name. Errors name the field, the value
// and what is allowed.
func ParseCalibration(b []byte, name string) (*Calibration, error) {
	var c Calibration
	dec := json.NewDecoder(bytes.NewReader(b))
	if err := dec.Decode(&c); err != nil {
		return nil, fmt.Errorf("not a calibration file: %v", err)
	}
	if c.Schema != CalibrationSchema {
		return nil, fmt.Errorf("schema %q is not %q (a calibration written by kvx calibrate)", c.Schema, CalibrationSchema)
	}
	if _, err := Lookup(c.Hardware); err != nil {
		return nil, fmt.Errorf("hardware: %v", err)
	}
	c.Params.Name = name
	if err := CheckParams(&c.Params); err != nil {
		return nil, err
	}
	if err := checkByKind(&c); err != nil {
		return nil, fmt.Errorf("calibration %q: %w", name, err)
	}
	return &c, nil
}

// CheckParams checks calibration parameters as the sim does when it uses
// them (sim.CheckCalibration; the two are pinned to each other by
// cmd/kvx's TestCalibrationChecksAgree), so a bad file is refused when the
// config is loaded rather than when a worker starts.
func CheckParams(p *spec.SimCalibration) error {
	bad := func(v float64) bool { return !(v >= 0) || math.IsInf(v, 0) }
	if bad(p.LaunchSeconds) {
		return fmt.Errorf("calibration %q: launch_seconds %g must be finite and >= 0", p.Name, p.LaunchSeconds)
	}
	if bad(p.StepSeconds) {
		return fmt.Errorf("calibration %q: step_seconds %g must be finite and >= 0", p.Name, p.StepSeconds)
	}
	seen := map[string]bool{}
	for i, k := range p.Classes {
		if bad(k.ComputeScale) || bad(k.MemoryScale) {
			return fmt.Errorf("calibration %q: classes[%d] (%s): compute_scale %g and memory_scale %g must be finite and >= 0",
				p.Name, i, k.Class, k.ComputeScale, k.MemoryScale)
		}
		if seen[k.Class] {
			return fmt.Errorf("calibration %q: classes[%d]: class %q is listed twice", p.Name, i, k.Class)
		}
		seen[k.Class] = true
		switch {
		case k.Class == "gemm" || k.Class == "moe" || k.Class == "memory":
		case strings.HasPrefix(k.Class, "mixer.") && len(k.Class) > len("mixer."):
		default:
			return fmt.Errorf("calibration %q: classes[%d]: class %q is not one of gemm, moe, memory or mixer.<mixer>", p.Name, i, k.Class)
		}
	}
	return nil
}

// checkByKind checks c.HeldOutByKind: every key a PointKinds value, every
// entry of at least one point with 0 <= median <= p90 <= max, and, when
// the file has its points, an entry for just the kinds with held-out
// points, each of their count. A file without the field passes.
func checkByKind(c *Calibration) error {
	if c.HeldOutByKind == nil {
		return nil
	}
	for _, kind := range slices.Sorted(maps.Keys(c.HeldOutByKind)) {
		s := c.HeldOutByKind[kind]
		if !slices.Contains(PointKinds, kind) {
			return fmt.Errorf("held_out_by_kind: kind %q is not one of %s", kind, strings.Join(PointKinds, ", "))
		}
		if s.Points < 1 || !(0 <= s.Median && s.Median <= s.P90 && s.P90 <= s.Max) || math.IsInf(s.Max, 0) {
			return fmt.Errorf("held_out_by_kind.%s: points %d, median %g, p90 %g, max %g: want points >= 1 and 0 <= median <= p90 <= max, finite",
				kind, s.Points, s.Median, s.P90, s.Max)
		}
	}
	if len(c.Points) == 0 {
		return nil
	}
	for _, kind := range PointKinds {
		held := 0
		for _, p := range c.Points {
			if p.HeldOut && p.Kind == kind {
				held++
			}
		}
		if got := c.HeldOutByKind[kind].Points; got != held {
			return fmt.Errorf("held_out_by_kind.%s: %d points, but the file has %d held-out %s points", kind, got, held, kind)
		}
	}
	return nil
}
