package report

import (
	"fmt"
	"io"
	"math"
	"strings"
	"text/tabwriter"
)

// SimGoal is how close a sim figure should be to the same figure measured
// on a device that computes, as a share of the measured one (issue 27: a
// simulator that states its error).
const SimGoal = 0.10

// SimPair is a sim run and a measured run of the same configuration, and
// the sim's error: in a compare that varies device over the sim and a device
// that computes (--vary device=sim,cpu), a variant whose times the sim
// modelled (Engine.Modelled) and one whose times were measured, whose other
// --vary values are the same. Each figure of the pair is the sim's against
// the measured one's.
type SimPair struct {
	// Group is the pair's other --vary values ("cache_manager=v1"), "all"
	// when device is the only key varied.
	Group           string `json:"group"`
	SimVariant      string `json:"sim_variant"`
	MeasuredVariant string `json:"measured_variant"`
	// MeasuredDevice is the measured variant's device (cpu, cuda);
	// Calibration the sim variant's sim calibration (Setup.Calibration).
	MeasuredDevice string      `json:"measured_device"`
	Calibration    string      `json:"sim_calibration"`
	Goal           float64     `json:"goal"` // SimGoal
	Figures        []FigureGap `json:"figures"`
}

// FigureGap is one figure of a SimPair.
type FigureGap struct {
	// Figure is the variant's key it compares: ttft_p50_ms, ttft_p99_ms,
	// tpot_p50_ms, tpot_p99_ms (latency), output_tokens_per_s (throughput),
	// preemptions (requests).
	Figure   string  `json:"figure"`
	Sim      float64 `json:"sim"`
	Measured float64 `json:"measured"`
	// Difference is Sim - Measured; RelativeError is Difference /
	// Measured, 0 when both are 0, and nil when only Measured is (no share
	// of nothing: Difference says how far off the sim is).
	Difference    float64  `json:"difference"`
	RelativeError *float64 `json:"relative_error"`
	// Met is |RelativeError| <= the goal (not when it is nil).
	Met bool `json:"met"`
}

// simFigures are the figures a SimPair compares, in order: the key, the
// table's name, and the value of a report.
var simFigures = []struct {
	key, name string
	val       func(r *Report) float64
}{
	{"ttft_p50_ms", "ttft p50 ms", func(r *Report) float64 { return r.Latency.TTFTP50 }},
	{"ttft_p99_ms", "ttft p99 ms", func(r *Report) float64 { return r.Latency.TTFTP99 }},
	{"tpot_p50_ms", "tpot p50 ms", func(r *Report) float64 { return r.Latency.TPOTP50 }},
	{"tpot_p99_ms", "tpot p99 ms", func(r *Report) float64 { return r.Latency.TPOTP99 }},
	{"output_tokens_per_s", "output tok/s", func(r *Report) float64 { return r.Throughput.OutputTokensPerS }},
	{"preemptions", "preemptions", func(r *Report) float64 { return float64(r.Requests.Preemptions) }},
}

// deviceKey is the --vary key whose values put a variant on the sim or on
// a device that computes.
const deviceKey = "device"

// NewSimPairs pairs rs (a compare's variants, named by their --vary
// values "key=value ...") as SimPair describes: every engine variant that
// finished with its times modelled against every one that finished with
// them measured and the same --vary values but device's, in rs's order
// (the sim variant's, then the measured one's). It returns nil when no
// pair is found: no variant ran on the sim, or none on a device that
// computes, or one of them failed. rs is not modified.
func NewSimPairs(rs []Report) []SimPair {
	ran := func(r *Report) bool {
		return r.Bench == nil && r.Error == "" && (r.Status == "" || r.Status == StatusFinished) && r.Engine.Steps > 0
	}
	var out []SimPair
	for i := range rs {
		s := &rs[i]
		if !ran(s) || !s.Engine.Modelled {
			continue
		}
		group, _, _ := variantGroup(s.Variant, deviceKey)
		for j := range rs {
			m := &rs[j]
			if mg, _, _ := variantGroup(m.Variant, deviceKey); !ran(m) || m.Engine.Modelled || mg != group {
				continue
			}
			e := SimPair{Group: group, SimVariant: s.Variant, MeasuredVariant: m.Variant, MeasuredDevice: m.Config.Device,
				Calibration: s.Config.Calibration, Goal: SimGoal}
			for _, f := range simFigures {
				e.Figures = append(e.Figures, newFigureGap(f.key, f.val(s), f.val(m), SimGoal))
			}
			out = append(out, e)
		}
	}
	return out
}

// newFigureGap is figure key of a SimPair: sim against measured, met
// within goal.
func newFigureGap(key string, sim, measured, goal float64) FigureGap {
	f := FigureGap{Figure: key, Sim: sim, Measured: measured, Difference: sim - measured}
	switch {
	case measured != 0:
		rel := (sim - measured) / measured
		f.RelativeError = &rel
	case sim == 0:
		rel := 0.0
		f.RelativeError = &rel
	}
	f.Met = f.RelativeError != nil && math.Abs(*f.RelativeError) <= goal
	return f
}

// Title says what e compares, for a table's heading.
func (e SimPair) Title() string {
	return fmt.Sprintf("%s against %s (device %s; sim calibration %s); goal: within %s of the measured figure",
		e.SimVariant, e.MeasuredVariant, e.MeasuredDevice, e.Calibration, percent(e.Goal))
}

// Cells are e's table: a header line, then a line per figure: its name,
// the sim's and the measured value, the difference, the relative error
// and whether the goal is met.
func (e SimPair) Cells() [][]string {
	out := [][]string{{"figure", "sim", "measured", "sim - measured", "error", "goal"}}
	for i, f := range e.Figures {
		name := f.Figure
		if i < len(simFigures) && simFigures[i].key == f.Figure {
			name = simFigures[i].name
		}
		rel, met := "-", "not met"
		if f.RelativeError != nil {
			rel = signedPercent(*f.RelativeError)
		}
		if f.Met {
			met = "met"
		}
		out = append(out, []string{name, figureNum(f.Sim), figureNum(f.Measured), signed(figureNum(f.Difference)), rel, met})
	}
	return out
}

// WriteSimPairs prints es, a table each after a heading ("sim against
// measured: ..."), and how many figures meet the goal.
func WriteSimPairs(w io.Writer, es []SimPair) error {
	for _, e := range es {
		if _, err := fmt.Fprintf(w, "\nsim against measured: %s\n", e.Title()); err != nil {
			return err
		}
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		for _, line := range e.Cells() {
			fmt.Fprintln(tw, strings.Join(line, "\t"))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
		met := 0
		for _, f := range e.Figures {
			if f.Met {
				met++
			}
		}
		if _, err := fmt.Fprintf(w, "%d of %d figures within %s\n", met, len(e.Figures), percent(e.Goal)); err != nil {
			return err
		}
	}
	return nil
}

// figureNum prints a figure to 4 significant digits, whole numbers from
// 1,000 up.
func figureNum(v float64) string {
	if math.Abs(v) >= 1000 {
		return fmt.Sprintf("%.0f", v)
	}
	return fmt.Sprintf("%.4g", v)
}

// signed puts a + before a number that has no sign and is not 0.
func signed(s string) string {
	if strings.HasPrefix(s, "-") || s == "0" {
		return s
	}
	return "+" + s
}

func percent(f float64) string { return fmt.Sprintf("%.0f%%", 100*f) }

func signedPercent(f float64) string {
	if f == 0 {
		return "0.0%"
	}
	return fmt.Sprintf("%+.1f%%", 100*f)
}
