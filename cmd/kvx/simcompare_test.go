package main

import (
	"bytes"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/kvx-dev/kvx/core/report"
)

// TestCompareSimAgainstMeasured: kvx compare of the tiny hf-llama checkpoint
// on the sim (calibrated by kvx calibrate on the cpu) and on the cpu, for
// two managers, pairs each sim variant with the cpu variant of its manager
// and gives the sim's error per figure, computed from the two variants' own
// figures, in the table, the JSON and the HTML page; a compare without a
// computing device, or without the sim, has none of it.
func TestCompareSimAgainstMeasured(t *testing.T) {
	t.Parallel()
	cal, _, _ := calibrate(t)
	const hfLlama = "../../scenarios/hf-llama.yaml"
	dir := t.TempDir()
	js, page := filepath.Join(dir, "r.json"), filepath.Join(dir, "r.html")
	out, stderr, code := kvx(t, "compare", "-c", hfLlama, "--set", "isolation=inprocess", "--set", "sim_calibration="+cal,
		"--vary", "cache_manager=v1,v2", "--vary", "device=sim,cpu", "--json", js, "--html", page)
	if code != 0 {
		t.Fatalf("compare: exit %d\n%s\n%s", code, out, stderr)
	}
	data, err := os.ReadFile(js)
	if err != nil {
		t.Fatal(err)
	}
	validateReport(t, js, data)
	d, err := report.ReadJSON(bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	byName := map[string]*report.Report{}
	for i := range d.Variants {
		byName[d.Variants[i].Variant] = &d.Variants[i]
	}
	if len(d.SimAgainstMeasured) != 2 {
		t.Fatalf("sim_against_measured has %d pairs, want 2 (v1, v2): %+v", len(d.SimAgainstMeasured), d.SimAgainstMeasured)
	}
	for i, e := range d.SimAgainstMeasured {
		mgr := []string{"v1", "v2"}[i]
		group := "cache_manager=" + mgr
		sim, meas := byName[e.SimVariant], byName[e.MeasuredVariant]
		if e.Group != group || e.SimVariant != group+" device=sim" || e.MeasuredVariant != group+" device=cpu" || e.MeasuredDevice != "cpu" ||
			e.Calibration != cal || sim == nil || meas == nil {
			t.Fatalf("pair %d = %+v, want %s: device=sim (calibration %s) against device=cpu", i, e, group, cal)
		}
		if !sim.Engine.Modelled || meas.Engine.Modelled || sim.Config.Device != "sim" || meas.Config.Device != "cpu" {
			t.Errorf("%s: the sim variant modelled %v on %s, the measured one %v on %s", group, sim.Engine.Modelled, sim.Config.Device, meas.Engine.Modelled, meas.Config.Device)
		}
		// Each figure, recomputed from the variants' own figures.
		want := []struct {
			key      string
			sim, got float64
		}{
			{"ttft_p50_ms", sim.Latency.TTFTP50, meas.Latency.TTFTP50},
			{"ttft_p99_ms", sim.Latency.TTFTP99, meas.Latency.TTFTP99},
			{"tpot_p50_ms", sim.Latency.TPOTP50, meas.Latency.TPOTP50},
			{"tpot_p99_ms", sim.Latency.TPOTP99, meas.Latency.TPOTP99},
			{"output_tokens_per_s", sim.Throughput.OutputTokensPerS, meas.Throughput.OutputTokensPerS},
			{"preemptions", float64(sim.Requests.Preemptions), float64(meas.Requests.Preemptions)},
		}
		if len(e.Figures) != len(want) {
			t.Fatalf("%s: %d figures, want %d", group, len(e.Figures), len(want))
		}
		for j, w := range want {
			f := e.Figures[j]
			if f.Figure != w.key || f.Sim != w.sim || f.Measured != w.got || math.Abs(f.Difference-(w.sim-w.got)) > 1e-9*math.Abs(w.got) {
				t.Errorf("%s: figure %d = %+v, want %s: sim %g, measured %g", group, j, f, w.key, w.sim, w.got)
				continue
			}
			if w.got == 0 {
				if w.sim == 0 && (f.RelativeError == nil || *f.RelativeError != 0 || !f.Met) {
					t.Errorf("%s: %s 0 against 0: %+v, want a relative error of 0, met", group, w.key, f)
				}
				if w.sim != 0 && (f.RelativeError != nil || f.Met) {
					t.Errorf("%s: %s %g against 0: %+v, want no relative error, not met", group, w.key, w.sim, f)
				}
				continue
			}
			rel := (w.sim - w.got) / w.got
			if f.RelativeError == nil || math.Abs(*f.RelativeError-rel) > 1e-9 || f.Met != (math.Abs(rel) <= report.SimGoal) {
				t.Errorf("%s: %s relative error %v, met %v; want %g, met %v", group, w.key, f.RelativeError, f.Met, rel, math.Abs(rel) <= report.SimGoal)
			}
		}
		// The table's heading and a row per figure.
		heading := "sim against measured: " + e.SimVariant + " against " + e.MeasuredVariant + " (device cpu; sim calibration " + cal + ")"
		if !strings.Contains(out, heading) {
			t.Errorf("the table lacks %q:\n%s", heading, out)
		}
	}
	for _, row := range []string{"ttft p50 ms", "ttft p99 ms", "tpot p50 ms", "tpot p99 ms", "output tok/s", "preemptions"} {
		if n := len(regexp.MustCompile(`\n`+row+`\s+\S+\s+\S+\s+\S+\s+\S+\s+(met|not met)\n`).FindAllString(out, -1)); n != 2 {
			t.Errorf("the table has %d rows %q of the sim against measured, want 2:\n%s", n, row, out)
		}
	}
	// The footnotes under the table say which variants' times were
	// simulated and which measured (the names are long: the columns are
	// numbered in the variants' order, v1 and v2 on the sim, then on the
	// cpu).
	for _, note := range []string{"\ntimes of #1, #3 are simulated by a roofline cost model calibrated by " + cal + "\n",
		"\ntimes of #2, #4 are measured on the device\n"} {
		if !strings.Contains(out, note) {
			t.Errorf("the table lacks the footnote %q:\n%s", note, out)
		}
	}
	html, err := os.ReadFile(page)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(html), "<h2>Sim against measured</h2>") || !strings.Contains(string(html), "<th>sim - measured</th>") {
		t.Errorf("the HTML page lacks the sim against measured tables")
	}

	// Without a computing device, or without the sim: no pair anywhere.
	for _, device := range []string{"cpu", "sim"} {
		js := filepath.Join(dir, device+".json")
		out, stderr, code := kvx(t, "compare", "-c", hfLlama, "--set", "isolation=inprocess", "--set", "device="+device,
			"--vary", "cache_manager=v1,v2", "--json", js)
		if code != 0 {
			t.Fatalf("compare on %s: exit %d\n%s\n%s", device, code, out, stderr)
		}
		data, err := os.ReadFile(js)
		if err != nil {
			t.Fatal(err)
		}
		validateReport(t, js, data)
		if strings.Contains(out, "sim against measured") || bytes.Contains(data, []byte("sim_against_measured")) {
			t.Errorf("a compare of v1 and v2 on %s alone has the sim against measured:\n%s", device, out)
		}
		// One clock: the sim's said once for every variant, the measured
		// one not at all.
		if simulated := strings.Contains(out, "\ntimes are simulated by "); simulated != (device == "sim") || strings.Contains(out, "\ntimes of ") {
			t.Errorf("a compare of v1 and v2 on %s alone: the footnote says \"times are simulated\" %v, or names variants:\n%s", device, simulated, out)
		}
	}
}
