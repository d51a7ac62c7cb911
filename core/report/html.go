package report

import (
	_ "embed"
	"fmt"
	"html/template"
	"io"
	"maps"
	"slices"
	"strings"
)

// chartJS is Chart.js's minified UMD build, vendored from the npm registry
// with its licence (js/chartjs/README.md says which version). The page
// inlines it, so it needs no network when it is opened.
//
//go:embed js/chartjs/chart.umd.min.js
var chartJS string

// pageJS draws the page's charts from the report data; it sets
// window.kvxCharts to the number of charts drawn.
//
//go:embed js/report.js
var pageJS string

// inlineChartJS is chartJS without its source map comment (the map is not
// shipped, and the page must not ask for anything).
var inlineChartJS = template.JS(strings.Replace(chartJS, "//# sourceMappingURL=chart.umd.min.js.map", "", 1))

var page = template.Must(template.New("report").Funcs(template.FuncMap{"deref": func(v *float64) string { return num(*v) }}).Parse(`<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data:">
<title>kvx report{{if .Doc.Scenario}}: {{.Doc.Scenario}}{{end}}</title>
<style>
body { font-family: system-ui, sans-serif; margin: 1.5em 2em; color: #222; max-width: 1500px }
h1 { margin-bottom: .2em } h2 { margin-top: 1.6em; border-bottom: 1px solid #ddd }
table { border-collapse: collapse; margin-bottom: 1em; font-size: 14px }
td, th { border: 1px solid #ccc; padding: 3px 10px; text-align: right }
td:first-child, th:first-child { text-align: left; white-space: pre }
dl.meta { display: grid; grid-template-columns: max-content auto; gap: 2px 14px; margin: 0 }
dl.meta dt { font-weight: 600 } dl.meta dd { margin: 0 }
.charts { display: flex; flex-wrap: wrap; gap: 16px }
.chart { position: relative; width: 410px; height: 280px; border: 1px solid #eee; padding: 6px }
.note { color: #666 } .diff td { background: #fff6d6 } .miss td { background: #fde2e2 } code { font-size: 13px }
details summary { cursor: pointer; margin: .5em 0 }
table.cfg td { max-width: 30em; overflow-wrap: anywhere }
</style>
<script>{{.Lib}}</script>
</head><body>
<h1>kvx report</h1>
<dl class="meta">
<dt>scenario</dt><dd>{{or .Doc.Scenario "-"}}</dd>
<dt>generator</dt><dd>{{or .Doc.Generator "-"}}</dd>
<dt>date</dt><dd>{{or .Doc.Created "-"}}</dd>
{{if .Command}}<dt>command</dt><dd><code>{{.Command}}</code></dd>{{end}}
<dt>device</dt><dd>{{.Devices}}</dd>
<dt>variants</dt><dd>{{.Variants}}</dd>
{{if .Varied}}<dt>varied keys</dt><dd>{{.Varied}}</dd>{{end}}
{{if .Workload}}<dt>workload</dt><dd>{{.Workload}}</dd>{{end}}
<dt>time</dt><dd>{{.TimeNote}}</dd>
</dl>
<h2>Side by side</h2>
<table>
<tr><th>variant</th>{{range .Doc.Variants}}<th>{{.Variant}}</th>{{end}}</tr>
{{range .Rows}}<tr><td>{{.Name}}</td>{{range .Cells}}<td>{{.}}</td>{{end}}</tr>
{{end}}</table>
{{range .Doc.Variants}}{{if .Error}}<p class="note">{{.Variant}}: {{.Error}}</p>{{end}}{{end}}
{{with .Doc.SimAgainstMeasured}}<h2>Sim against measured</h2>
{{range .}}<p class="note">{{.Title}}</p>
<table class="sim">
{{range $i, $line := .Cells}}<tr{{if and (gt $i 0) (eq (index $line 5) "not met")}} class="miss"{{end}}>{{range $line}}{{if eq $i 0}}<th>{{.}}</th>{{else}}<td>{{.}}</td>{{end}}{{end}}</tr>
{{end}}</table>
{{end}}{{end}}<h2>Headline figures</h2>
<div class="charts" id="bars"></div>
<h2>Latency distributions ({{.TimeWord}})</h2>
<div class="charts" id="cdfs"></div>
{{with .Doc.Capacity}}<h2>Capacity</h2>
<p class="note">The most {{.LoadKey}} each configuration keeps at p95 TTFT within {{.SLOMs}} ms:{{range .Groups}} {{.Name}}: {{if .Capacity}}{{deref .Capacity}}{{else}}none (the lightest load misses){{end}};{{end}}</p>
<div class="charts" id="capacity"></div>{{end}}
{{if .EngineRuns}}<h2>Over {{.TimeWord}}</h2>
<div class="charts" id="series"></div>{{end}}
<h2>Resolved configuration</h2>
{{if .Config}}<details><summary>{{len .Config}} keys after defaults, files, KVX_* environment and --set{{if .Varied}}; the keys that differ between variants are highlighted{{end}}</summary>
<table class="cfg">
<tr><th>key</th>{{range .Doc.Variants}}<th>{{.Variant}}</th>{{end}}</tr>
{{range .Config}}<tr{{if .Differs}} class="diff"{{end}}><td>{{.Key}}</td>{{range .Cells}}<td>{{.}}</td>{{end}}</tr>
{{end}}</table></details>{{else}}<p class="note">not recorded</p>{{end}}
<script>const kvxReport = {{.Data}}; const kvxTimeWord = {{.TimeWord}}; const kvxCapacity = {{.Doc.Capacity}};</script>
<script>{{.PageJS}}</script>
</body></html>
`))

// WriteHTML writes d as a self-contained page that needs no network:
// metadata (scenario, generator, date, device, variants), the side-by-side
// table, the sim's error against the measured runs (a table for each of
// Document.SimAgainstMeasured, the figures that miss the goal marked), bar
// charts of the headline figures with their values, latency CDFs per
// variant, the series over engine time, and the resolved configuration.
// Chart.js is inlined; the page's script sets window.kvxCharts to the
// number of charts it drew.
func WriteHTML(w io.Writer, d Document) error {
	type row struct {
		Name  string
		Cells []string
	}
	type cfgRow struct {
		Key     string
		Cells   []string
		Differs bool
	}
	rs := d.Variants
	word := timeWord(rs)
	data := struct {
		Doc                      Document
		Lib, PageJS              template.JS
		Rows                     []row
		Config                   []cfgRow
		Command, Devices, Varied string
		Variants                 string
		Workload, TimeNote       string
		TimeWord                 string
		Data                     []pageVariant
		EngineRuns               bool // some variant is not a kvx bench's: the page has the series over engine time
	}{EngineRuns: slices.ContainsFunc(rs, func(r Report) bool { return r.Bench == nil }), Doc: d, Lib: inlineChartJS, PageJS: template.JS(pageJS), TimeWord: word, Data: pageData(rs)}
	data.Command = strings.Join(d.Command, " ")
	var names []string
	for _, v := range data.Data {
		names = append(names, v.Name+" ("+v.Status+")")
	}
	data.Variants = strings.Join(names, ", ")
	for _, rw := range shownRows(rs) {
		r := row{Name: rw.name}
		for i := range rs {
			r.Cells = append(r.Cells, rw.cell(&rs[i]))
		}
		data.Rows = append(data.Rows, r)
	}
	keys := map[string]bool{}
	for _, r := range rs {
		for k := range r.ResolvedConfig {
			keys[k] = true
		}
	}
	var varied []string
	for _, k := range slices.Sorted(maps.Keys(keys)) {
		cr := cfgRow{Key: k}
		for i, r := range rs {
			v, ok := r.ResolvedConfig[k]
			cell := "-"
			if ok && v != nil {
				cell = fmt.Sprint(v)
			}
			cr.Cells = append(cr.Cells, cell)
			if i > 0 && cell != cr.Cells[0] {
				cr.Differs = true
			}
		}
		if cr.Differs {
			varied = append(varied, k)
		}
		data.Config = append(data.Config, cr)
	}
	data.Varied = strings.Join(varied, ", ")
	var devices []string
	for _, r := range rs {
		dev := r.Config.Device
		if r.Config.Hardware != "" && r.Config.Device == "sim" {
			dev += " (" + r.Config.Hardware + " cost model)"
		}
		if dev != "" && !slices.Contains(devices, dev) {
			devices = append(devices, dev)
		}
	}
	data.Devices = strings.Join(devices, ", ")
	if len(rs) > 0 && rs[0].Workload != nil {
		wl := rs[0].Workload
		loop := "open loop"
		if wl.Concurrency > 0 {
			loop = fmt.Sprintf("closed loop, %d in flight", wl.Concurrency)
		}
		data.Workload = fmt.Sprintf("%s requests (%s), %s prompt tokens (at most %s per request), %s output tokens asked (at most %s)",
			itoa(wl.Requests), loop, i64(wl.PromptTokens), itoa(wl.PromptTokensMax), i64(wl.OutputTokens), itoa(wl.OutputTokensMax))
	}
	data.TimeNote = timeNote(rs)
	return page.Execute(w, data)
}

// timeWord names the clock of the page's times: "simulated time" when every
// variant ran on the sim device, "engine time" otherwise.
func timeWord(rs []Report) string {
	if len(rs) == 0 {
		return "engine time"
	}
	if !slices.ContainsFunc(rs, func(r Report) bool { return r.Bench == nil }) {
		return "wall time at the client"
	}
	for _, r := range rs {
		if !r.Engine.Modelled {
			return "engine time"
		}
	}
	return "simulated time"
}

// timeNote says where the page's times come from: kvx bench's clock at
// the client, or the table's footnotes (timesNotes, the variants by name),
// so that the page and the table say the same of every variant.
func timeNote(rs []Report) string {
	benched := slices.ContainsFunc(rs, func(r Report) bool { return r.Bench != nil })
	if benched && !slices.ContainsFunc(rs, func(r Report) bool { return r.Bench == nil }) {
		return "measured by kvx bench at the client: wall-clock times from sending a request to its streamed tokens"
	}
	names := make([]string, len(rs))
	for i, r := range rs {
		names[i] = r.Variant
	}
	if notes := timesNotes(rs, names); len(notes) > 0 {
		return timeWord(rs) + ": " + strings.Join(notes, "; ")
	}
	if benched {
		return "engine time measured on the device for the engine runs; wall-clock times at the client for the kvx bench runs"
	}
	return "engine time, measured on the device"
}

// pageVariant is what the page's script reads of one variant.
type pageVariant struct {
	Name      string  `json:"name"`
	Status    string  `json:"status"`
	OutputTPS float64 `json:"output_tokens_per_s"`
	Latency   Latency `json:"latency"`
	HitRate   float64 `json:"hit_rate"`
	HostRate  float64 `json:"host_rate"` // prompt tokens reused from the host tier / prompt tokens
	// CeilingRate and InfiniteRate are the reuse ceiling at the run's
	// capacity (Ceiling.Best) and of an infinite cache, over the prompt
	// tokens; null when the run has none.
	CeilingRate  *float64 `json:"ceiling_rate"`
	InfiniteRate *float64 `json:"infinite_rate"`
	// Misses are each miss reason's share of the computed prompt tokens
	// (Tokens.MissReasons), in [0, 1].
	Misses     map[string]float64 `json:"misses"`
	PeakUsage  float64            `json:"peak_usage"`
	Preempt    int                `json:"preemptions"`
	Suspended  int                `json:"suspensions"`
	Recomputed int64              `json:"recomputed"`
	WallS      float64            `json:"wall_s"`
	Series     *Series            `json:"series"`
	Bench      bool               `json:"bench"` // measured by kvx bench: no engine figures
}

func pageData(rs []Report) []pageVariant {
	out := make([]pageVariant, len(rs))
	for i, r := range rs {
		st := r.Status
		if st == "" {
			st = StatusFinished
			if r.Error != "" {
				st = StatusFailed
			}
		}
		misses := map[string]float64{}
		for _, m := range r.Tokens.TopMisses() {
			misses[m.Reason] = m.Share
		}
		host := 0.0
		if r.Tokens.Prompt > 0 {
			host = float64(r.Tokens.PrefixReusedByTier.Host) / float64(r.Tokens.Prompt)
		}
		var ceil, inf *float64
		if c := r.Tokens.Ceiling; c != nil {
			inf = &c.InfiniteHitRate
			if b := c.Best(); b != nil {
				ceil = &b.HitRate
			}
		}
		out[i] = pageVariant{
			Name: r.Variant, Status: st, OutputTPS: r.Throughput.OutputTokensPerS, Latency: r.Latency, HitRate: r.Tokens.HitRate,
			HostRate: host, CeilingRate: ceil, InfiniteRate: inf, Misses: misses,
			PeakUsage: r.KV.PeakUsage, Preempt: r.Requests.Preemptions, Suspended: r.Requests.Suspensions,
			Recomputed: r.Tokens.Recomputed, WallS: r.Engine.WallS, Series: r.Series, Bench: r.Bench != nil,
		}
	}
	return out
}
