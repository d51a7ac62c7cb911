package serve

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvx-dev/kvx/core/engine"
)

// metrics are the server's Prometheus metrics. Names and meanings follow
// vLLM's (vllm:num_requests_running -> kvx:num_requests_running, ...), each
// with the model_name label. Gauges and token counters are read from the
// engine's last turn (engine.LiveStats) at scrape time; the latency
// histograms are observed per request. On device sim the latencies are
// simulated seconds from the engine clock (the loop runs steps as fast as
// they complete); on a computing device they are wall seconds as the
// client sees them.
type metrics struct {
	ttft, itl, e2e            prometheus.Observer
	success, stopped, aborted prometheus.Counter
}

// latency buckets (seconds), vLLM's for TTFT and end to end.
var (
	ttftBuckets = []float64{0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20, 40, 80, 160, 640, 2560}
	itlBuckets  = []float64{0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20, 40, 80}
	e2eBuckets  = []float64{0.3, 0.5, 0.8, 1, 1.5, 2, 2.5, 5, 10, 15, 20, 30, 40, 50, 60, 120, 240, 480, 960, 1920, 7680}
)

func newMetrics(reg *prometheus.Registry, model string, eng *engine.Live) *metrics {
	labels := prometheus.Labels{"model_name": model}
	gauge := func(name, help string, f func(engine.LiveStats) float64) {
		reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help, ConstLabels: labels},
			func() float64 { return f(eng.Stats()) }))
	}
	counter := func(name, help string, f func(engine.LiveStats) float64) {
		reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help, ConstLabels: labels},
			func() float64 { return f(eng.Stats()) }))
	}
	gauge("kvx:num_requests_running", "Requests the scheduler is running (admitted, holding KV cache).",
		func(s engine.LiveStats) float64 { return float64(s.Running) })
	gauge("kvx:num_requests_waiting", "Requests waiting to be admitted.",
		func(s engine.LiveStats) float64 { return float64(s.Waiting) })
	gauge("kvx:kv_cache_usage_perc", "KV cache usage: device blocks in use over device blocks, the fullest stage (1 = 100%).",
		func(s engine.LiveStats) float64 { return s.KVUsage })
	counter("kvx:prefix_cache_queries_total", "Prompt tokens queried against the prefix cache.",
		func(s engine.LiveStats) float64 { return float64(s.PromptTokens) })
	counter("kvx:prefix_cache_hits_total", "Prompt tokens the prefix cache supplied.",
		func(s engine.LiveStats) float64 { return float64(s.PrefixHits) })
	counter("kvx:num_preemptions_total", "Preemptions (recomputed or suspended to the host tier).",
		func(s engine.LiveStats) float64 { return float64(s.Preemptions) })
	counter("kvx:prompt_tokens_total", "Prompt tokens of the requests received.",
		func(s engine.LiveStats) float64 { return float64(s.PromptTokens) })
	counter("kvx:generation_tokens_total", "Tokens generated.",
		func(s engine.LiveStats) float64 { return float64(s.GeneratedTokens) })
	counter("kvx:forked_sequences_total", "Sequences of n > 1 requests forked from a prompt prefilled once (blocks shared through the cache manager).",
		func(s engine.LiveStats) float64 { return float64(s.Forked) })
	counter("kvx:plugin_restarts_total", "Cache manager or worker plugins restarted after they died.",
		func(s engine.LiveStats) float64 { return float64(s.PluginRestarts) })
	m := &metrics{}
	hist := func(name, help string, b []float64) prometheus.Observer {
		h := prometheus.NewHistogram(prometheus.HistogramOpts{Name: name, Help: help, Buckets: b, ConstLabels: labels})
		reg.MustRegister(h)
		return h
	}
	m.ttft = hist("kvx:time_to_first_token_seconds", "Time to the first token (simulated seconds on device sim).", ttftBuckets)
	m.itl = hist("kvx:inter_token_latency_seconds", "Time between two generated tokens (simulated seconds on device sim).", itlBuckets)
	m.e2e = hist("kvx:e2e_request_latency_seconds", "Arrival to the last token (simulated seconds on device sim).", e2eBuckets)
	done := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvx:request_success_total", Help: "Requests ended, by how.", ConstLabels: labels},
		[]string{"finished_reason"})
	reg.MustRegister(done)
	m.success = done.WithLabelValues("length")
	m.stopped = done.WithLabelValues("stop")
	m.aborted = done.WithLabelValues("abort")
	return m
}

// tracker observes one request's latencies.
type tracker struct {
	m     *metrics
	sim   bool
	t0    time.Time
	first bool
	prev  float64 // seconds since arrival of the last event
}

func (m *metrics) track(sim bool, t0 time.Time) *tracker {
	return &tracker{m: m, sim: sim, t0: t0, first: true}
}

// event observes ev: TTFT at the first tokens, one inter-token gap per
// token after that (a step that emits several tokens spreads its time),
// and the end to end latency at the end.
func (t *tracker) event(ev engine.Event, arrival int64) {
	at := time.Since(t.t0).Seconds()
	if t.sim {
		at = float64(ev.At-arrival) / 1e9
	}
	if n := len(ev.Tokens); n > 0 {
		if t.first {
			t.m.ttft.Observe(at)
			t.first = false
			t.prev = at
			n--
		}
		if n > 0 {
			gap := (at - t.prev) / float64(n)
			for range n {
				t.m.itl.Observe(gap)
			}
		}
		t.prev = at
	}
	if ev.Done {
		t.m.e2e.Observe(at)
	}
}
