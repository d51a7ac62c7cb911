package report

import (
	"bytes"
	"strings"
	"testing"
)

// benchSample is a kvx bench variant.
func benchSample() Report {
	return Report{
		Variant: "vllm", Status: StatusFinished, Config: Setup{Model: "m"},
		Requests: Requests{Total: 10, Completed: 8, Failed: 2},
		Tokens:   Tokens{Prompt: 1000, Generated: 80, PrefixReused: 400, HitRate: 0.4},
		Bench: &Bench{URL: "http://h:8000", Server: "vllm", Load: LoadRate, RatePerS: 4, Arrivals: "poisson",
			Phases: BenchPhases{Warmup: 2, Flush: "ok", Prime: 1}, Errors: map[string]int{"http_5xx": 2}, Notes: []string{},
			Latency:      BenchLatency{TTFT: NewDist([]float64{10, 20, 30}), ITL: NewDist([]float64{1, 2})},
			Metrics:      &ServerMetrics{Names: "vllm", PrefixQueries: 1000, PrefixHits: 400, HitRate: 0.4},
			CachedTokens: 400, StreamedTokens: 80, UsageTokens: 80},
	}
}

// TestBenchRows: a bench variant beside engine variants shows "-" in the
// engine's rows and they in its rows; a document of bench variants alone
// has none of the engine's rows; both match the schema.
func TestBenchRows(t *testing.T) {
	mixed := append(sample(), benchSample())
	var buf bytes.Buffer
	if err := writeTable(&buf, mixed, unlimited); err != nil {
		t.Fatal(err)
	}
	table := buf.String()
	for _, want := range []string{"server hit rate", "40.0% (vllm: 400 of 1,000)", "http_5xx 2", "invariant checks", "20.0 / 30.0 / 30.0"} {
		if !strings.Contains(table, want) {
			t.Errorf("the mixed table lacks %q:\n%s", want, table)
		}
	}
	for _, line := range strings.Split(table, "\n") {
		if strings.HasPrefix(line, "invariant checks") && !strings.HasSuffix(strings.TrimSpace(line), "-") {
			t.Errorf("the bench column of an engine row is not -: %q", line)
		}
	}
	buf.Reset()
	if err := writeTable(&buf, []Report{benchSample()}, unlimited); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(buf.String(), "invariant checks") || strings.Contains(buf.String(), "cache manager") {
		t.Errorf("a bench-only table shows engine rows:\n%s", buf.String())
	}
	for _, d := range []Document{NewDocument("test", mixed), NewDocument("test", []Report{benchSample()})} {
		buf.Reset()
		if err := WriteJSON(&buf, d); err != nil {
			t.Fatal(err)
		}
		validate(t, "a bench document", buf.Bytes())
		buf.Reset()
		if err := WriteHTML(&buf, d); err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(buf.String(), "server hit rate") {
			t.Errorf("the page lacks the bench rows")
		}
	}
}
