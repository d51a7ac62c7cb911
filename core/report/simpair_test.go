package report

import (
	"bytes"
	"encoding/json"
	"math"
	"regexp"
	"strings"
	"testing"
)

// simCompare is a compare of --vary device=sim,cpu --vary
// cache_manager=v1,v2: the sim's figures off the cpu's by known amounts.
func simCompare() []Report {
	base := sample()[0]
	var rs []Report
	for _, mgr := range []string{"v1", "v2"} {
		for _, dev := range []string{"sim", "cpu"} {
			r := base
			r.Variant = "device=" + dev + " cache_manager=" + mgr
			r.Config.Device, r.Config.Calibration = dev, "cal.json"
			r.Engine.Modelled = dev == "sim"
			if dev == "cpu" {
				r.Config.Calibration = "none"
				r.Latency = Latency{TTFTP50: 10, TTFTP99: 50, TPOTP50: 3.5, TPOTP99: 10}
				r.Throughput.OutputTokensPerS = 1000
				r.Requests.Preemptions = 0
			}
			rs = append(rs, r)
		}
	}
	return rs
}

// TestNewSimPairs: each sim variant is paired with the measured variant
// of the same other --vary values, and each figure is the sim's against
// the measured one's; 0 against 0 meets the goal, a figure against a
// measured 0 has no relative error and does not; a failed or bench variant
// and a compare without both kinds of device give no pair.
func TestNewSimPairs(t *testing.T) {
	rs := simCompare()
	es := NewSimPairs(rs)
	if len(es) != 2 {
		t.Fatalf("NewSimPairs = %d pairs, want 2: %+v", len(es), es)
	}
	for i, e := range es {
		sim, meas := &rs[2*i], &rs[2*i+1]
		group := "cache_manager=" + []string{"v1", "v2"}[i]
		if e.Group != group || e.SimVariant != sim.Variant || e.MeasuredVariant != meas.Variant || e.MeasuredDevice != "cpu" ||
			e.Calibration != "cal.json" || e.Goal != SimGoal || len(e.Figures) != len(simFigures) {
			t.Errorf("pair %d = %+v, want %s: %s against %s on cpu, calibration cal.json", i, e, group, sim.Variant, meas.Variant)
		}
		for j, f := range e.Figures {
			s, m := simFigures[j].val(sim), simFigures[j].val(meas)
			if f.Figure != simFigures[j].key || f.Sim != s || f.Measured != m || f.Difference != s-m {
				t.Errorf("pair %d, figure %d = %+v, want %s %g against %g", i, j, f, simFigures[j].key, s, m)
			}
		}
	}
	rel := func(f FigureGap) float64 {
		if f.RelativeError == nil {
			return math.NaN()
		}
		return *f.RelativeError
	}
	for j, want := range []struct {
		rel float64 // NaN: none
		met bool
	}{
		{0.2, false},        // ttft p50 12 against 10
		{-0.2, false},       // ttft p99 40 against 50
		{0, true},           // tpot p50 3.5 against 3.5
		{-0.1, true},        // tpot p99 9 against 10: at the goal
		{0.234, false},      // 1234 tok/s against 1000
		{math.NaN(), false}, // 3 preemptions against 0
	} {
		f := es[0].Figures[j]
		if got := rel(f); f.Met != want.met || (math.IsNaN(want.rel) != math.IsNaN(got)) || math.Abs(got-want.rel) > 1e-12 {
			t.Errorf("%s: relative error %v, met %v; want %v, %v", f.Figure, got, f.Met, want.rel, want.met)
		}
	}
	// 0 preemptions against 0 is no error.
	rs[0].Requests.Preemptions = 0
	if f := NewSimPairs(rs)[0].Figures[5]; f.RelativeError == nil || *f.RelativeError != 0 || !f.Met || f.Difference != 0 {
		t.Errorf("0 preemptions against 0: %+v, want a relative error of 0, met", f)
	}

	// Pairs are made by the other values, not by the variants' places: the
	// measured variants first and device between two other keys.
	shuffled := []Report{rs[3], rs[1], rs[2], rs[0]}
	for i := range shuffled {
		dev, mgr, _ := strings.Cut(strings.TrimPrefix(shuffled[i].Variant, "device="), " cache_manager=")
		shuffled[i].Variant = "cache_manager=" + mgr + " device=" + dev + " block_size=16"
	}
	es = NewSimPairs(shuffled)
	if len(es) != 2 || es[0].SimVariant != "cache_manager=v2 device=sim block_size=16" || es[0].MeasuredVariant != "cache_manager=v2 device=cpu block_size=16" ||
		es[0].Group != "cache_manager=v2 block_size=16" || es[1].SimVariant != "cache_manager=v1 device=sim block_size=16" ||
		es[1].MeasuredVariant != "cache_manager=v1 device=cpu block_size=16" {
		t.Errorf("measured variants first, device in the middle: %+v, want v2's pair, then v1's", es)
	}

	// device the only key varied: one pair, group all.
	two := []Report{rs[0], rs[1]}
	two[0].Variant, two[1].Variant = "device=sim", "device=cpu"
	if es := NewSimPairs(two); len(es) != 1 || es[0].Group != "all" {
		t.Errorf("device=sim,cpu: %+v, want one pair of group all", es)
	}
	failed := simCompare()
	failed[1].Error, failed[1].Status = "plugin died", StatusFailed
	failed[2].Bench = &Bench{}
	if es := NewSimPairs(failed); len(es) != 0 {
		t.Errorf("with the v1 cpu variant failed and the v2 sim one a bench: %+v, want no pair", es)
	}
	for name, rs := range map[string][]Report{
		"sim only":      {simCompare()[0], simCompare()[2]},
		"measured only": {simCompare()[1], simCompare()[3]},
		"other values":  {simCompare()[0], simCompare()[3]},
	} {
		if es := NewSimPairs(rs); es != nil {
			t.Errorf("%s: %+v, want nil", name, es)
		}
	}
}

// TestWriteSimPairs: a table per pair under its heading, the relative
// error signed, the goal per figure, and the count that meets it.
func TestWriteSimPairs(t *testing.T) {
	var buf bytes.Buffer
	if err := WriteSimPairs(&buf, NewSimPairs(simCompare())[:1]); err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	for _, row := range []string{
		`sim against measured: device=sim cache_manager=v1 against device=cpu cache_manager=v1 \(device cpu; sim calibration cal.json\); goal: within 10% of the measured figure\n`,
		`figure\s+sim\s+measured\s+sim - measured\s+error\s+goal\n`,
		`ttft p50 ms\s+12\s+10\s+\+2\s+\+20\.0%\s+not met\n`,
		`ttft p99 ms\s+40\s+50\s+-10\s+-20\.0%\s+not met\n`,
		`tpot p50 ms\s+3\.5\s+3\.5\s+0\s+0\.0%\s+met\n`,
		`tpot p99 ms\s+9\s+10\s+-1\s+-10\.0%\s+met\n`,
		`output tok/s\s+1234\s+1000\s+\+234\s+\+23\.4%\s+not met\n`,
		`preemptions\s+3\s+0\s+\+3\s+-\s+not met\n`,
		`2 of 6 figures within 10%\n`,
	} {
		if !regexp.MustCompile(row).MatchString(out) {
			t.Errorf("the table lacks %q:\n%s", row, out)
		}
	}
}

// TestSimPairsInDocument: the JSON of a document with its pairs matches
// the schema, which refuses a figure it does not know and one without its
// relative error; the HTML page has the pairs' tables with the figures
// that miss the goal marked, and a page without pairs has no such section.
func TestSimPairsInDocument(t *testing.T) {
	d := richSample(false)
	d.Variants = simCompare()
	d.SimAgainstMeasured = NewSimPairs(d.Variants)
	var buf bytes.Buffer
	if err := WriteJSON(&buf, d); err != nil {
		t.Fatal(err)
	}
	validate(t, "a document with sim_against_measured", buf.Bytes())
	back, err := ReadJSON(bytes.NewReader(buf.Bytes()))
	if err != nil || len(back.SimAgainstMeasured) != 2 || back.SimAgainstMeasured[0].Figures[5].RelativeError != nil {
		t.Errorf("read back: %+v, %v; want the 2 pairs, preemptions' relative error null", back.SimAgainstMeasured, err)
	}
	for name, breakIt := range map[string]func(f map[string]any){
		"an unknown figure":      func(f map[string]any) { f["figure"] = "e2e_p50_ms" },
		"no relative error":      func(f map[string]any) { delete(f, "relative_error") },
		"a negative measurement": func(f map[string]any) { f["measured"] = -1 },
	} {
		var doc map[string]any
		if err := json.Unmarshal(buf.Bytes(), &doc); err != nil {
			t.Fatal(err)
		}
		breakIt(doc["sim_against_measured"].([]any)[0].(map[string]any)["figures"].([]any)[0].(map[string]any))
		bad, _ := json.Marshal(doc)
		if schemaErr(t, bad) == nil {
			t.Errorf("schema accepts %s", name)
		}
	}

	buf.Reset()
	if err := WriteHTML(&buf, d); err != nil {
		t.Fatal(err)
	}
	page := buf.String()
	for _, want := range []string{
		"<h2>Sim against measured</h2>",
		"device=sim cache_manager=v2 against device=cpu cache_manager=v2 (device cpu; sim calibration cal.json)",
		"<th>sim - measured</th>",
		`<tr class="miss"><td>ttft p50 ms</td><td>12</td><td>10</td><td>&#43;2</td><td>&#43;20.0%</td><td>not met</td></tr>`, // html/template writes + as &#43;
		`<tr><td>tpot p99 ms</td><td>9</td><td>10</td><td>-1</td><td>-10.0%</td><td>met</td></tr>`,
	} {
		if !strings.Contains(page, want) {
			t.Errorf("the page lacks %q", want)
		}
	}
	buf.Reset()
	if err := WriteHTML(&buf, richSample(false)); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(buf.String(), "Sim against measured") {
		t.Errorf("a page without sim and measured pairs has the section")
	}
}
