package bench

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/kvx-dev/kvx/core/report"
)

// MaxMetricsBytes bounds a /metrics answer.
const MaxMetricsBytes = 16 << 20

// names are one engine's metric names; "" where it has none.
type names struct {
	family                 string
	queries, hits          string
	prompt, gen, preempted string
	hitGauge               string
	running, waiting       string
}

// engines are the metric names kvx bench reads, by the prefix that finds
// them: kvx serve's (core/serve/metrics.go), vLLM's V1 names, and SGLang's
// (its cached tokens over its prompt tokens, and its own hit-rate gauge).
var engines = []names{
	{family: "kvx", queries: "kvx:prefix_cache_queries_total", hits: "kvx:prefix_cache_hits_total",
		prompt: "kvx:prompt_tokens_total", gen: "kvx:generation_tokens_total", preempted: "kvx:num_preemptions_total",
		running: "kvx:num_requests_running", waiting: "kvx:num_requests_waiting"},
	{family: "vllm", queries: "vllm:prefix_cache_queries_total", hits: "vllm:prefix_cache_hits_total",
		prompt: "vllm:prompt_tokens_total", gen: "vllm:generation_tokens_total", preempted: "vllm:num_preemptions_total",
		running: "vllm:num_requests_running", waiting: "vllm:num_requests_waiting"},
	{family: "sglang", hits: "sglang:cached_tokens_total", prompt: "sglang:prompt_tokens_total",
		gen: "sglang:generation_tokens_total", hitGauge: "sglang:cache_hit_rate",
		running: "sglang:num_running_reqs", waiting: "sglang:num_queue_reqs"},
}

// snapshot is one scrape of /metrics: each series' sum over its labels.
type snapshot struct {
	names names
	vals  map[string]float64
}

// scrape reads /metrics. A server without it, or with an answer that is not
// Prometheus text with names kvx reads, is an error that says so (a note in
// the report, never a failure of the bench).
func (b *runner) scrape(ctx context.Context) (*snapshot, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, b.base+"/metrics", nil)
	if err != nil {
		return nil, err
	}
	resp, err := b.client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("GET /metrics: %v", cleanErr(err))
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET /metrics: HTTP %d", resp.StatusCode)
	}
	body := io.LimitReader(resp.Body, MaxMetricsBytes+1)
	lr := &countReader{r: body}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(lr)
	if lr.n > MaxMetricsBytes {
		return nil, fmt.Errorf("GET /metrics: more than %d bytes", MaxMetricsBytes)
	}
	if err != nil {
		return nil, fmt.Errorf("GET /metrics (Content-Type %q) is not Prometheus text: %v", resp.Header.Get("Content-Type"), err)
	}
	for _, n := range engines {
		if _, ok := fams[n.prompt]; !ok {
			if _, ok := fams[n.hits]; !ok {
				continue
			}
		}
		s := &snapshot{names: n, vals: map[string]float64{}}
		for _, name := range []string{n.queries, n.hits, n.prompt, n.gen, n.preempted, n.hitGauge, n.running, n.waiting} {
			if f, ok := fams[name]; ok && name != "" {
				s.vals[name] = sum(f)
			}
		}
		return s, nil
	}
	var some []string
	for name := range fams {
		if len(some) < 3 {
			some = append(some, name)
		}
	}
	return nil, fmt.Errorf("GET /metrics has none of kvx's, vLLM's or SGLang's prompt token counters (it has %d families, such as %s)", len(fams), strings.Join(some, ", "))
}

// sum adds a family's series.
func sum(f *dto.MetricFamily) float64 {
	var s float64
	for _, m := range f.GetMetric() {
		switch {
		case m.Counter != nil:
			s += m.Counter.GetValue()
		case m.Gauge != nil:
			s += m.Gauge.GetValue()
		case m.Untyped != nil:
			s += m.Untyped.GetValue()
		}
	}
	return s
}

// counters are the values that settle (counters and the queue gauges), to
// tell a scrape whose figures stopped moving.
func (s *snapshot) counters() string {
	n := s.names
	return fmt.Sprint(s.vals[n.queries], s.vals[n.hits], s.vals[n.prompt], s.vals[n.gen], s.vals[n.running], s.vals[n.waiting])
}

// idle reports whether the server says nothing runs or waits.
func (s *snapshot) idle() bool {
	return s.vals[s.names.running] == 0 && s.vals[s.names.waiting] == 0
}

// delta is what the server counted between before and after.
func delta(before, after *snapshot) *report.ServerMetrics {
	if before == nil || after == nil || before.names.family != after.names.family {
		return nil
	}
	n := after.names
	d := func(name string) int64 {
		if name == "" {
			return 0
		}
		return int64(max(0, after.vals[name]-before.vals[name]) + 0.5)
	}
	m := &report.ServerMetrics{Names: n.family, PrefixQueries: d(n.queries), PrefixHits: d(n.hits),
		PromptTokens: d(n.prompt), GenerationTokens: d(n.gen), Preemptions: d(n.preempted)}
	if n.queries == "" { // SGLang: its cached tokens over its prompt tokens
		m.PrefixQueries = m.PromptTokens
	}
	switch {
	case m.PrefixQueries > 0:
		m.HitRate = min(1, float64(m.PrefixHits)/float64(m.PrefixQueries))
	case n.hitGauge != "":
		m.HitRate = min(1, max(0, after.vals[n.hitGauge]))
	}
	return m
}

type countReader struct {
	r io.Reader
	n int64
}

func (c *countReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}
