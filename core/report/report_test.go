package report

import (
	"bytes"
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"
)

// unlimited is a table width that keeps every variant in one block, for
// the tests that read a row across the variants.
const unlimited = 1 << 30

func sample() []Report {
	a := Report{Variant: "cache_manager=v1"}
	a.Requests = Requests{Total: 10, Completed: 9, Rejected: 1, Preemptions: 3,
		Rejections: []Rejection{{ID: 4, Reason: "prompt 9000 + max_new_tokens 10 exceeds max_seq_len 8192"}}}
	a.Tokens = Tokens{Prompt: 1000, PrefixReused: 250, HitRate: 0.25, Generated: 90}
	a.Latency = Latency{TTFTP50: 12, TTFTP99: 40, TPOTP50: 3.5, TPOTP99: 9}
	a.Throughput.OutputTokensPerS = 1234
	a.Engine = Engine{Steps: 100, WallS: 2, Modelled: true}
	b := a
	b.Variant = "cache_manager=v2"
	b.Engine.WallS = 3
	b.Error = strings.Repeat("x", 80)
	return []Report{a, b}
}

func TestWriteTable(t *testing.T) {
	var buf bytes.Buffer
	if err := WriteTable(&buf, sample()); err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	for _, want := range []string{"cache_manager=v1", "cache_manager=v2", "1,000", "250 (25.0%)", "12 / 40", "1.50x", "(see below)", "uncalibrated"} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
}

func TestWriteTableNamesCalibration(t *testing.T) {
	rs := sample()
	for i := range rs {
		rs[i].Config.Calibration = "embedded:h200.json"
	}
	var buf bytes.Buffer
	if err := writeTable(&buf, rs, unlimited); err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	if !strings.Contains(out, "calibrated by embedded:h200.json") || strings.Contains(out, "uncalibrated") {
		t.Errorf("table of a calibrated sim run does not name its calibration:\n%s", out)
	}
	if !strings.Contains(out, "sim calibration") {
		t.Errorf("table lacks the sim calibration row:\n%s", out)
	}
}

// TestWriteTableSaysWhichTimesAreModelled: a compare of the sim against a
// device that computes says, under the table, which variants' times were
// simulated (by which cost model) and which measured, whichever comes
// first, by Engine.Modelled and not by a device's name; a table of one
// clock says it once, of measured times alone not at all, and a variant
// that never ran is in no line.
func TestWriteTableSaysWhichTimesAreModelled(t *testing.T) {
	footer := func(rs []Report) []string {
		t.Helper()
		var buf bytes.Buffer
		if err := writeTable(&buf, rs, unlimited); err != nil {
			t.Fatal(err)
		}
		var notes []string
		for _, line := range strings.Split(buf.String(), "\n") {
			if strings.HasPrefix(line, "times ") {
				notes = append(notes, line)
			}
		}
		return notes
	}
	named := func(rs []Report, names ...string) []Report {
		for i := range rs {
			rs[i].Variant = names[i]
		}
		return rs
	}
	sim, cpu := simCompare()[0], simCompare()[1] // cal.json, none
	other := sim
	other.Config.Calibration = "other.json"
	uncal := sim
	uncal.Config.Calibration = "none"
	modelled := func(r Report, m bool) Report { r.Engine.Modelled = m; return r }
	failed := sim
	failed.Status, failed.Error, failed.Engine = StatusFailed, "plugin died", Engine{}
	const (
		simCal   = "simulated by a roofline cost model calibrated by cal.json"
		measured = "measured on the device"
	)
	for _, c := range []struct {
		name string
		rs   []Report
		want []string
	}{
		{"sim, then cpu", named([]Report{sim, cpu}, "device=sim", "device=cpu"),
			[]string{"times of device=sim are " + simCal, "times of device=cpu are " + measured}},
		{"cpu, then sim", named([]Report{cpu, sim}, "device=cpu", "device=sim"),
			[]string{"times of device=cpu are " + measured, "times of device=sim are " + simCal}},
		{"numbered columns", simCompare(), // long names: the columns are #1..#4
			[]string{"times of #1, #3 are " + simCal, "times of #2, #4 are " + measured}},
		{"by Engine.Modelled, not the name", named([]Report{modelled(cpu, true), modelled(sim, false)}, "device=cpu", "device=sim"),
			[]string{"times of device=cpu are simulated by an uncalibrated roofline cost model", "times of device=sim are " + measured}},
		{"two calibrations and none", named([]Report{sim, other, uncal}, "a", "b", "c"),
			[]string{"times of a are " + simCal, "times of b are simulated by a roofline cost model calibrated by other.json",
				"times of c are simulated by an uncalibrated roofline cost model"}},
		{"the sim alone", named([]Report{sim, sim}, "v1", "v2"), []string{"times are " + simCal}},
		{"a sim variant that never ran", named([]Report{sim, failed}, "v1", "v2"), []string{"times are " + simCal}},
		{"measured alone", named([]Report{cpu, cpu}, "v1", "v2"), nil},
		{"measured, and a sim variant that never ran", named([]Report{cpu, failed}, "v1", "v2"), nil},
	} {
		if got := footer(c.rs); !slices.Equal(got, c.want) {
			t.Errorf("%s: the footnotes are %q, want %q", c.name, got, c.want)
		}
	}
}

func TestWriteJSONFields(t *testing.T) {
	var buf bytes.Buffer
	if err := WriteJSON(&buf, NewDocument("kvx test", sample())); err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Schema   string           `json:"schema"`
		Variants []map[string]any `json:"variants"`
	}
	if err := json.Unmarshal(buf.Bytes(), &doc); err != nil || len(doc.Variants) != 2 || doc.Schema != Schema {
		t.Fatalf("JSON document of 2 variants, schema %q: %v (%d, %q)", Schema, err, len(doc.Variants), doc.Schema)
	}
	got := doc.Variants
	for _, path := range [][]string{
		{"requests", "total"}, {"requests", "completed"}, {"requests", "rejected"}, {"requests", "failed"},
		{"requests", "preemptions"}, {"requests", "rejections"}, {"tokens", "prompt"}, {"tokens", "generated"},
		{"tokens", "prefix_reused"}, {"kv", "peak_usage"}, {"latency", "ttft_p50_ms"}, {"latency", "ttft_p99_ms"},
		{"latency", "tpot_p50_ms"}, {"latency", "tpot_p99_ms"}, {"throughput", "output_tokens_per_s"},
		{"invariants", "checked_steps"}, {"invariants", "violations"}, {"engine", "steps"}, {"engine", "wall_s"},
		{"engine", "plugin_restarts"}, {"outputs", "digest"},
	} {
		m, ok := got[0][path[0]].(map[string]any)
		if !ok {
			t.Errorf("no %s object", path[0])
			continue
		}
		if _, ok := m[path[1]]; !ok {
			t.Errorf("no %s.%s", path[0], path[1])
		}
	}
	if got[0]["status"] != StatusFinished || got[1]["status"] != StatusFailed {
		t.Errorf("status %v and %v, want %s and %s (the second has an error)", got[0]["status"], got[1]["status"], StatusFinished, StatusFailed)
	}
}

// TestJSONOneShape: one report or several, the document is the same
// envelope; empty lists are [] and the document reads back.
func TestJSONOneShape(t *testing.T) {
	var buf bytes.Buffer
	if err := WriteJSON(&buf, NewDocument("kvx test", []Report{{Variant: "run"}})); err != nil {
		t.Fatal(err)
	}
	s := buf.String()
	if !strings.HasPrefix(s, "{") || !strings.Contains(s, `"variants": [`) || !strings.Contains(s, `"rejections": []`) ||
		!strings.Contains(s, `"stages": []`) || strings.Contains(s, "null") {
		t.Errorf("one report: want an envelope with variants, [] for empty lists, no null:\n%s", s)
	}
	d, err := ReadJSON(strings.NewReader(s))
	if err != nil || len(d.Variants) != 1 || d.Variants[0].Variant != "run" {
		t.Errorf("ReadJSON = %+v, %v; want the one variant back", d, err)
	}
	if _, err := ReadJSON(strings.NewReader(`{"schema": "kvx.report/v0", "variants": []}`)); err == nil {
		t.Errorf("ReadJSON of another schema: no error")
	}
	validate(t, "sample", buf.Bytes())
	buf.Reset()
	if err := WriteJSON(&buf, NewDocument("kvx test", sample())); err != nil {
		t.Fatal(err)
	}
	validate(t, "sample", buf.Bytes())
}

func TestPercentile(t *testing.T) {
	for _, tc := range []struct {
		xs   []float64
		p    float64
		want float64
	}{
		{nil, 50, 0}, {[]float64{3, 1, 2}, 50, 2}, {[]float64{5}, 99, 5}, {[]float64{4, 3, 2, 1}, 100, 4}, {[]float64{4, 3, 2, 1}, 1, 1},
	} {
		if got := Percentile(append([]float64(nil), tc.xs...), tc.p); got != tc.want {
			t.Errorf("Percentile(%v, %v) = %v, want %v", tc.xs, tc.p, got, tc.want)
		}
	}
}

// TestWriteTableCacheRows: the table says how much of the reuse came from
// the host tier, and has a row for each miss reason among any variant's top
// three by computed tokens, the largest share first, each variant's share
// in it.
func TestWriteTableCacheRows(t *testing.T) {
	rs := sample()
	rs[0].Tokens.PrefixReusedByTier = TierTokens{Device: 150, Host: 100}
	rs[0].Tokens.MissReasons = map[string]MissCount{
		"evicted": {Requests: 5, Tokens: 610}, "in_flight": {Requests: 2, Tokens: 220}, "partial_block": {Requests: 1, Tokens: 90},
		"never_stored": {Requests: 1, Tokens: 80}, "unknown": {},
	}
	rs[1].Tokens.MissReasons = map[string]MissCount{"unknown": {Requests: 9, Tokens: 9990}, "partial_block": {Tokens: 10}}
	var buf bytes.Buffer
	if err := writeTable(&buf, rs, unlimited); err != nil {
		t.Fatal(err)
	}
	var host string
	var miss []string
	for _, line := range strings.Split(buf.String(), "\n") {
		switch {
		case strings.HasPrefix(line, "    from host tier"):
			host = line
		case strings.HasPrefix(line, "  missed: "):
			miss = append(miss, strings.Join(strings.Fields(line)[1:], " "))
		}
	}
	if f := strings.Fields(host); len(f) != 5 || f[3] != "100" || f[4] != "0" {
		t.Errorf("host tier row = %q, want 100 for v1 and 0 for v2", host)
	}
	// v1's top three are evicted 61%, in_flight 22%, partial 9% (never_stored
	// is fourth); v2's unknown 100%, partial 0.1%.
	want := []string{"unknown 0% 100%", "evicted 61% 0%", "in_flight 22% 0%", "partial 9% <1%"}
	if !slices.Equal(miss, want) {
		t.Errorf("miss rows = %q, want %q", miss, want)
	}

	buf.Reset()
	none := sample()
	for i := range none {
		none[i].Tokens.MissReasons = nil
	}
	if err := writeTable(&buf, none, unlimited); err != nil {
		t.Fatal(err)
	}
	if !regexp.MustCompile(`(?m)^  miss reasons +- +-$`).MatchString(buf.String()) {
		t.Errorf("variants without misses: want one miss reasons row of -, got\n%s", buf.String())
	}
}

// TestWriteTableFits: a table of many variants is printed in blocks of
// columns, each line within tableWidth, every block with the row names, and
// every variant's column once.
func TestWriteTableFits(t *testing.T) {
	var rs []Report
	for i := range 7 {
		r := sample()[i%2]
		r.Variant = fmt.Sprintf("cache_manager=v%d", 1+i%2) + strings.Repeat("x", i)
		rs = append(rs, r)
	}
	var buf bytes.Buffer
	if err := WriteTable(&buf, rs); err != nil {
		t.Fatal(err)
	}
	heads := 0
	var seen []string
	for _, line := range strings.Split(strings.TrimRight(buf.String(), "\n"), "\n") {
		if n := utf8.RuneCountInString(line); n > tableWidth {
			t.Errorf("line of %d runes, want at most %d: %q", n, tableWidth, line)
		}
		if f := strings.Fields(line); len(f) > 0 && f[0] == "variant" {
			heads++
			seen = append(seen, f[1:]...)
		}
	}
	var want []string
	for _, r := range rs {
		want = append(want, r.Variant)
	}
	if heads < 2 || !slices.Equal(seen, want) {
		t.Errorf("%d blocks with the variants %q, want 2 or more blocks with %q once each, in order", heads, seen, want)
	}
}

// TestWriteExplain: an eviction is said with its tier, rule and time, and
// the computed tokens are split between the reason and the partial block.
func TestWriteExplain(t *testing.T) {
	at := 12.414
	rec := RequestRecord{ID: 17, Status: RequestFinished, PromptTokens: 1300, ReusedTokens: 768, RecomputedTokens: 40, Preemptions: 1, Suspensions: 2,
		Cache: &CacheUse{ReusedDevice: 512, ReusedHost: 256, Computed: 532, Reason: "evicted", ReasonTokens: 512, PartialBlockTokens: 20,
			EvictedTier: "device", EvictedBy: "lru", EvictedAtS: &at}}
	var buf bytes.Buffer
	if err := WriteExplain(&buf, "v1", rec); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"request 17 (v1): finished", "prompt tokens  1,300", "512 from the device tier, 256 from the host tier",
		"computed       532: 512 evicted from the device tier by lru at 12.41 s, 20 past the last full block",
		"miss reason    evicted from the device tier by lru at 12.41 s", "preemptions    1 (recomputed 40 tokens), 2 suspended",
	} {
		if !strings.Contains(buf.String(), want) {
			t.Errorf("explanation lacks %q:\n%s", want, buf.String())
		}
	}
	buf.Reset()
	rec.Cache, rec.Status = nil, RequestRejected
	if err := WriteExplain(&buf, "v1", rec); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(buf.String(), "rejected") || !strings.Contains(buf.String(), "never admitted") {
		t.Errorf("explanation of a rejected request:\n%s", buf.String())
	}
}

// TestWriteTableNeverRan: a variant that stopped before its first step
// shows "-" for its figures (not a column of zeros and a digest of no
// outputs) and its error; the wall-time ratio is against the first variant
// that ran.
func TestWriteTableNeverRan(t *testing.T) {
	ok := sample()[0]
	ok.Engine.WallS = 2
	ok.Tokens.MissReasons = map[string]MissCount{"evicted": {Requests: 1, Tokens: 10}}
	dead := Report{Variant: "cache_manager=./kvx-broken", Status: StatusFailed, Error: "plugin did not start"}
	dead.Engine.WallS = 0.5
	dead.Outputs.Digest = "ffffffffffffffff"
	ok2 := ok
	ok2.Variant, ok2.Engine.WallS = "cache_manager=v2", 4
	var buf bytes.Buffer
	if err := writeTable(&buf, []Report{dead, ok, ok2}, unlimited); err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		switch {
		case strings.HasPrefix(line, "requests total"), strings.HasPrefix(line, "outputs digest"), strings.HasPrefix(line, "  missed: evicted"):
			if len(f) < 3 || f[2] != "-" {
				t.Errorf("row %q: the never-ran variant shows %q, want -", line, f)
			}
		case strings.HasPrefix(line, "wall time vs first"):
			if !strings.Contains(line, "-") || !strings.Contains(line, "1.00x") || !strings.Contains(line, "2.00x") {
				t.Errorf("ratio row %q: want - for the never-ran variant, 1.00x and 2.00x for the others", line)
			}
		}
	}
	if !strings.Contains(out, "  missed: evicted") || !strings.Contains(out, "plugin did not start") || strings.Contains(out, "ffffffffffffffff") {
		t.Errorf("table:\n%s", out)
	}
}

// TestWriteTableLongNames: variants named by several --vary keys get
// numbered columns and a legend, so the table stays as narrow as its
// figures.
func TestWriteTableLongNames(t *testing.T) {
	rs := sample()
	rs[0].Variant = "cache_manager=v1 kv_cache_config.enable_block_reuse=true"
	rs[1].Variant = "cache_manager=v2 kv_cache_config.enable_block_reuse=false"
	var buf bytes.Buffer
	if err := writeTable(&buf, rs, unlimited); err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	if !strings.HasPrefix(out, "#1  "+rs[0].Variant+"\n#2  "+rs[1].Variant+"\n") {
		t.Errorf("no legend first:\n%s", out)
	}
	for _, line := range strings.Split(out, "\n") {
		if strings.HasPrefix(line, "variant") && (!strings.Contains(line, "#") || strings.Contains(line, "enable_block_reuse")) {
			t.Errorf("header %q: want the numbers #1, #2, not the names", line)
		}
	}
}
