package report

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvx-dev/kvx/core/report/pagecheck"
)

// richSample is sample() with what a real run adds: the resolved config,
// the workload, latency distributions and series.
func richSample(modelled bool) Document {
	rs := sample()
	for i := range rs {
		r := &rs[i]
		r.Engine.Modelled, r.Engine.Uncalibrated = modelled, modelled
		r.Config.Device, r.Config.Hardware = "sim", "h200"
		if !modelled {
			r.Config.Device = "cpu"
		}
		r.ResolvedConfig = map[string]any{"cache_manager": []string{"v1", "v2"}[i], "max_batch_size": 64, "workload.trace": nil}
		r.Workload = &Workload{Requests: 10, PromptTokens: 1000, PromptTokensMax: 200, OutputTokens: 100, OutputTokensMax: 10}
		ttft, tpot, e2e := []float64{}, []float64{}, []float64{}
		for k := range 9 {
			ttft = append(ttft, float64(10+k*(i+1)))
			tpot = append(tpot, 2+float64(k)/3)
			e2e = append(e2e, float64(100+k*k))
		}
		r.Latency.Quantiles = NewQuantiles(ttft, tpot, e2e)
		r.Tokens.PrefixReusedByTier = TierTokens{Device: 150, Host: 100}
		r.Tokens.MissReasons = map[string]MissCount{"evicted": {Requests: 4, Tokens: 400 - 100*int64(i)}, "partial_block": {Requests: 2, Tokens: 100}, "in_flight": {}}
		r.Tokens.Ceiling = &Ceiling{Infinite: 320, InfiniteHitRate: 0.32, Requests: 10, Reachable: 900, PinnedPeakBlocks: 12,
			Device: &CeilingAt{CapacityBlocks: 40, Reused: 280, HitRate: 0.28}}
		if i == 0 {
			r.Tokens.Ceiling.DeviceHost = &CeilingAt{CapacityBlocks: 400, Reused: 310, HitRate: 0.31}
		}
		var sp Sampler
		for k := range 2000 {
			sp.Add(Sample{At: int64(k) * 3e6, KVUsage: float64(k%100) / 100, Running: k % 7, Waiting: k % 5,
				Preemptions: k / 100, Reused: int64(k), Admitted: int64(4 * k)})
		}
		r.Series = sp.Series()
	}
	d := NewDocument("kvx test", rs)
	d.Created, d.Scenario, d.Command = "2026-12-01T12:00:00Z", "scenarios/demo.yaml", []string{"kvx", "compare"}
	return d
}

func TestWriteHTMLMetadata(t *testing.T) {
	var buf bytes.Buffer
	if err := WriteHTML(&buf, richSample(true)); err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	for _, want := range []string{
		"<table>", "cache_manager=v2", "scenarios/demo.yaml", "kvx test", "2026-12-01T12:00:00Z", "sim (h200 cost model)",
		"cache_manager=v1 (finished), cache_manager=v2 (failed)", "varied keys</dt><dd>cache_manager", "max_batch_size",
		"uncalibrated", `kvxTimeWord = "simulated time"`, "Chart.js v4", "10 requests (open loop)",
		`"host_rate":0.1,`, `"ceiling_rate":0.31,`, `"infinite_rate":0.32`, "ceiling: best, device", "280 (28.0%)", `"misses":{"evicted":0.8,"partial_block":0.2}`, `"misses":{"evicted":0.75,"partial_block":0.25}`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("HTML lacks %q", want)
		}
	}
	if strings.Contains(out, "sourceMappingURL") || strings.Contains(out, "http://") || strings.Contains(out, "src=") {
		t.Errorf("the page refers to something outside itself")
	}
	buf.Reset()
	if err := WriteHTML(&buf, richSample(false)); err != nil {
		t.Fatal(err)
	}
	if out := buf.String(); !strings.Contains(out, `kvxTimeWord = "engine time"`) || strings.Contains(out, "simulated") {
		t.Errorf("a report measured on a real device speaks of simulated time")
	}
}

// chartsOnPage is what the page draws: 9 bar charts, 3 CDFs, 4 series.
const chartsOnPage = 16

// TestHTMLInChromium opens the page in headless Chromium: no console
// error, no request beyond the file, every chart drawn with data, values
// on every bar chart, no percentage axis past 100%, no legend over a plot,
// and the clock named as it ran.
func TestHTMLInChromium(t *testing.T) {
	dir := t.TempDir()
	var paths []string
	// A variant that failed before it had figures draws nothing and breaks
	// nothing.
	failed := richSample(true)
	b := &failed.Variants[1]
	b.Series, b.Latency.Quantiles, b.ResolvedConfig, b.Workload = nil, nil, nil, nil
	// A compare with --capacity adds its chart.
	withCapacity := richSample(false)
	c, err := NewCapacity(capacitySweep(), "workload.concurrency", 100)
	if err != nil {
		t.Fatal(err)
	}
	withCapacity.Capacity = c
	// A compare of the sim against a computing device adds its tables and
	// no chart.
	withSims := richSample(false)
	withSims.SimAgainstMeasured = NewSimPairs(simCompare())
	for i, d := range []Document{richSample(true), richSample(false), failed, withCapacity, withSims} {
		path := filepath.Join(dir, fmt.Sprintf("r%d.html", i))
		var buf bytes.Buffer
		if err := WriteHTML(&buf, d); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
		paths = append(paths, path)
	}
	bad := filepath.Join(dir, "bad.html")
	if err := os.WriteFile(bad, []byte(badPage), 0o644); err != nil {
		t.Fatal(err)
	}
	pages := pagecheck.Open(t, append(paths, bad)...)
	CheckPage(t, pages[0], chartsOnPage, true)
	CheckPage(t, pages[1], chartsOnPage, false)
	CheckPage(t, pages[2], chartsOnPage, true)
	CheckPage(t, pages[3], chartsOnPage+1, false)
	CheckPage(t, pages[4], chartsOnPage, false)
	checkBadPage(t, pages[5])
}

// CheckPage checks what Chromium saw of a report page with want charts.
func CheckPage(t *testing.T, p pagecheck.Page, want int, modelled bool) {
	t.Helper()
	for _, e := range p.Errors {
		t.Errorf("console: %s", e)
	}
	for _, u := range p.Requests {
		t.Errorf("the page asked for %s", u)
	}
	if p.Drawn != want || p.Canvases != want || len(p.Charts) != want {
		t.Errorf("kvxCharts %d, %d canvases, %d Chart.js charts; want %d of each", p.Drawn, p.Canvases, len(p.Charts), want)
	}
	word, other := "engine time", "simulated time"
	if modelled {
		word, other = other, word
	}
	for _, c := range p.Charts {
		if c.Width <= 0 || c.Height <= 0 || !c.Painted || c.Datasets == 0 {
			t.Errorf("chart %q: %gx%g, painted %v, %d datasets with data; want a non-empty drawing", c.Title, c.Width, c.Height, c.Painted, c.Datasets)
		}
		if c.LegendOverlaps {
			t.Errorf("chart %q: the legend overlaps the plot", c.Title)
		}
		if c.Type == "bar" && !c.BarValues {
			t.Errorf("bar chart %q: no values on the bars", c.Title)
		}
		percent := c.YTitle == "%" || strings.Contains(c.Title, "KV") || strings.Contains(c.Title, "hit rate") || strings.Contains(c.Title, "CDF")
		if percent && (c.YMax <= 0 || c.YMax > 100) {
			t.Errorf("chart %q: y axis %q up to %g; a percentage axis stops at 100%%", c.Title, c.YTitle, c.YMax)
		}
		if strings.Contains(c.Title, other) {
			t.Errorf("chart %q says %q; the run's times are %s", c.Title, other, word)
		}
	}
	timed := 0
	for _, c := range p.Charts {
		if strings.Contains(c.Title, word) {
			timed++
		}
	}
	if timed < 7 { // throughput, TTFT, TPOT and the four series
		t.Errorf("%d chart titles name the clock (%s), want at least 7", timed, word)
	}
}

// badPage has a console error, a request for something outside the page
// and an uncaught exception: the browser check must see all three (it has
// teeth). TestHTMLInChromium opens it in the same browser as the reports.
const badPage = `<!doctype html><html><body><script>console.error("kvx-bad-1");</script>
<img src="http://127.0.0.1:9/x.png"><script>throw new Error("kvx-bad-2")</script></body></html>`

func checkBadPage(t *testing.T, p pagecheck.Page) {
	t.Helper()
	all := strings.Join(p.Errors, "\n")
	if !strings.Contains(all, "kvx-bad-1") || !strings.Contains(all, "kvx-bad-2") {
		t.Errorf("errors seen: %q; want the console error and the exception", p.Errors)
	}
	if len(p.Requests) == 0 || !strings.Contains(p.Requests[0], "127.0.0.1:9") {
		t.Errorf("requests seen: %q; want the image's", p.Requests)
	}
	if p.Drawn != 0 || len(p.Charts) != 0 {
		t.Errorf("charts %d / %d on a page without any", p.Drawn, len(p.Charts))
	}
}

// TestTimeNoteNamesCalibration: the page's note on its times says what the
// table's footnotes say: each variant by name with the calibration of its
// own cost model, wherever it is among the variants, or that it was
// measured.
func TestTimeNoteNamesCalibration(t *testing.T) {
	sim, cpu := simCompare()[0], simCompare()[1]
	other := sim
	other.Variant, other.Config.Calibration = "device=sim cache_manager=v2", "other.json"
	const (
		simNote   = "times of device=sim cache_manager=v1 are simulated by a roofline cost model calibrated by cal.json"
		cpuNote   = "times of device=cpu cache_manager=v1 are measured on the device"
		otherNote = "times of device=sim cache_manager=v2 are simulated by a roofline cost model calibrated by other.json"
	)
	for _, c := range []struct {
		rs   []Report
		want string
	}{
		{[]Report{sim, cpu}, "engine time: " + simNote + "; " + cpuNote},
		{[]Report{cpu, sim}, "engine time: " + cpuNote + "; " + simNote},
		{[]Report{cpu, sim, other}, "engine time: " + cpuNote + "; " + simNote + "; " + otherNote},
		{[]Report{sim, other}, "simulated time: " + simNote + "; " + otherNote},
		{[]Report{sim}, "simulated time: times are simulated by a roofline cost model calibrated by cal.json"},
		{[]Report{cpu}, "engine time, measured on the device"},
	} {
		if got := timeNote(c.rs); got != c.want {
			t.Errorf("timeNote(%d variants) = %q, want %q", len(c.rs), got, c.want)
		}
	}
}
