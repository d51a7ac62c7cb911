package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvx-dev/kvx/core/report"
	"github.com/kvx-dev/kvx/core/workload"
)

// reqs are n requests of 8 prompt tokens and 4 output tokens, two groups
// sharing their first 4 tokens.
func reqs(n int) []workload.Request {
	out := make([]workload.Request, n)
	for i := range out {
		g := int32(i % 2)
		out[i] = workload.Request{ID: uint64(i), Prompt: []int32{g, g, g, g, int32(i), 1, 2, 3}, OutputLen: 4, Group: fmt.Sprint("g", g)}
	}
	return out
}

// fake is a well-behaved OpenAI-compatible server: it streams max_tokens
// chunks of one token id each, a usage chunk with cached_tokens (4 for
// every prompt it saw before with the same first 4 tokens), [DONE], and
// counts kvx's metrics.
type fake struct {
	queries, hits, gen atomic.Int64
	seen               map[int32]bool
	flushed            atomic.Int64
	mu                 chan struct{}
}

func newFake() *fake { f := &fake{seen: map[int32]bool{}, mu: make(chan struct{}, 1)}; return f }

func (f *fake) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch r.URL.Path {
	case "/v1/models":
		fmt.Fprint(w, `{"object":"list","data":[{"id":"m","vocab_size":100}]}`)
		return
	case "/metrics":
		fmt.Fprintf(w, "# TYPE kvx:prefix_cache_queries_total counter\nkvx:prefix_cache_queries_total{model_name=\"m\"} %d\n"+
			"# TYPE kvx:prefix_cache_hits_total counter\nkvx:prefix_cache_hits_total{model_name=\"m\"} %d\n"+
			"# TYPE kvx:prompt_tokens_total counter\nkvx:prompt_tokens_total{model_name=\"m\"} %d\n"+
			"# TYPE kvx:generation_tokens_total counter\nkvx:generation_tokens_total{model_name=\"m\"} %d\n",
			f.queries.Load(), f.hits.Load(), f.queries.Load(), f.gen.Load())
		return
	case "/reset_prefix_cache":
		f.mu <- struct{}{}
		clear(f.seen)
		<-f.mu
		f.flushed.Add(1)
		fmt.Fprint(w, `{"status":"ok"}`)
		return
	}
	var body struct {
		Prompt    []int32 `json:"prompt"`
		MaxTokens int     `json:"max_tokens"`
		Model     string  `json:"model"`
	}
	if err := json.NewDecoder(r.Body).Decode(&body); err != nil || body.Model != "m" {
		http.Error(w, "bad body", 400)
		return
	}
	f.mu <- struct{}{}
	cached := 0
	if f.seen[body.Prompt[0]] {
		cached = 4
	}
	f.seen[body.Prompt[0]] = true
	<-f.mu
	f.queries.Add(int64(len(body.Prompt)))
	f.hits.Add(int64(cached))
	w.Header().Set("Content-Type", "text/event-stream")
	for i := range body.MaxTokens {
		fmt.Fprintf(w, "data: {\"choices\":[{\"index\":0,\"text\":\"x\",\"token_ids\":[%d]}]}\n\n", i+10)
		w.(http.Flusher).Flush()
	}
	f.gen.Add(int64(body.MaxTokens))
	fmt.Fprintf(w, "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":%d,\"completion_tokens\":%d,\"prompt_tokens_details\":{\"cached_tokens\":%d}}}\n\ndata: [DONE]\n\n",
		len(body.Prompt), body.MaxTokens, cached)
}

func run(t *testing.T, o Options) report.Report {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rep, err := Run(ctx, o)
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	var buf bytes.Buffer
	if err := report.WriteTable(&buf, []report.Report{rep}); err != nil {
		t.Fatal(err)
	}
	if err := report.WriteJSON(io.Discard, report.NewDocument("test", []report.Report{rep})); err != nil {
		t.Fatal(err)
	}
	return rep
}

// TestGoodServer: against a server that behaves, every request completes,
// the tokens counted are the tokens sent, the cached tokens are usage's,
// the flush reaches the server, priming sends each group's shared prefix
// once, and the /metrics hit rate is the server's counters over the
// measured phase only.
func TestGoodServer(t *testing.T) {
	f := newFake()
	srv := httptest.NewServer(f)
	defer srv.Close()
	for _, load := range []string{report.LoadConcurrency, report.LoadRate, report.LoadTimestamps} {
		t.Run(load, func(t *testing.T) {
			f.flushed.Store(0)
			rep := run(t, Options{URL: srv.URL + "/v1/", Requests: reqs(10), Load: load, Rate: 500, Concurrency: 3,
				Warmup: 4, Flush: true, Prime: true, SLO: report.SLO{TTFTMs: 10_000}})
			b := rep.Bench
			if rep.Requests.Completed != 10 || rep.Requests.Failed != 0 || len(b.Errors) != 0 {
				t.Fatalf("requests %+v, errors %v, want 10 completed", rep.Requests, b.Errors)
			}
			if b.StreamedTokens != 40 || b.UsageTokens != 40 || b.TokenMismatches != 0 || rep.Tokens.Generated != 40 {
				t.Errorf("streamed %d, usage %d, mismatches %d, generated %d: want 40 tokens each", b.StreamedTokens, b.UsageTokens, b.TokenMismatches, rep.Tokens.Generated)
			}
			if f.flushed.Load() != 1 || b.Phases.Flush != "ok" || b.Phases.Prime != 2 || b.Phases.Warmup != 4 {
				t.Errorf("phases %+v, flushes seen %d: want warm-up 4, one flush, 2 primed prefixes", b.Phases, f.flushed.Load())
			}
			// Primed: every measured request finds its group's 4 tokens.
			if b.CachedTokens != 40 || rep.Tokens.Prompt != 80 || rep.Tokens.HitRate != 0.5 {
				t.Errorf("cached %d of %d prompt tokens (hit rate %v), want 40 of 80", b.CachedTokens, rep.Tokens.Prompt, rep.Tokens.HitRate)
			}
			m := b.Metrics
			if m == nil || m.Names != "kvx" || m.PrefixQueries != 80 || m.PrefixHits != 40 || m.GenerationTokens != 40 || m.HitRate != 0.5 {
				t.Errorf("server metrics %+v, want kvx's counters over the measured phase: 40 hits of 80, 40 generated", m)
			}
			if b.Good != 10 || b.Latency.TTFT.N != 10 || b.Latency.ITL.N != 30 || rep.Outputs.Digest == "" {
				t.Errorf("good %d, ttft n %d, itl n %d, digest %q: want 10, 10, 30 and a digest", b.Good, b.Latency.TTFT.N, b.Latency.ITL.N, rep.Outputs.Digest)
			}
		})
	}
}

// hostile serves the bad answers, one path per case, through /v1/completions
// chosen by the first prompt token.
var hostile = []struct {
	name, kind string
	serve      func(w http.ResponseWriter, r *http.Request)
}{
	{"500", "http_5xx", func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, `{"error":{"message":"boom"}}`, 500)
	}},
	{"429", "http_4xx", func(w http.ResponseWriter, r *http.Request) { http.Error(w, "slow down", 429) }},
	{"json instead of SSE", "content_type", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"choices":[{"text":"x"}]}`)
	}},
	{"cut mid-way", "cut", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "data: {\"choices\":[{\"text\":\"x\"}]}\n\n")
		w.(http.Flusher).Flush()
		conn, _, _ := w.(http.Hijacker).Hijack()
		conn.Close()
	}},
	{"ends without DONE", "cut", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "data: {\"choices\":[{\"text\":\"x\"}]}\n\n")
	}},
	{"garbage lines", "bad_sse", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "\x00\xffnot an event\n\n")
	}},
	{"garbage JSON", "bad_sse", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "data: {\"choices\":[{\"text\":\n\n")
	}},
	{"a line of 2 MiB", "bad_sse", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "data: "+strings.Repeat("a", 2<<20))
	}},
	{"endless events", "bad_sse", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		for range 10_000 {
			if _, err := fmt.Fprint(w, "data: {\"choices\":[{\"text\":\"\"}]}\n\n"); err != nil {
				return
			}
		}
	}},
	{"error event", "stream_error", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "data: {\"error\":{\"message\":\"engine stopped\"}}\n\ndata: [DONE]\n\n")
	}},
	{"hangs", "timeout", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.(http.Flusher).Flush()
		<-r.Context().Done()
	}},
	{"DONE at once", "cut", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "data: [DONE]\n\n")
	}},
}

// TestHostileServers: each bad answer fails its own request with its kind
// and a reason, the others complete, and the bench goes on; a redirect is
// not followed (the bench only sends to its --url); /metrics that is not
// Prometheus text and a flush the server lacks are notes.
func TestHostileServers(t *testing.T) {
	var elsewhere atomic.Int64
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { elsewhere.Add(1) }))
	defer other.Close()
	good := newFake()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/metrics":
			w.Header().Set("Content-Type", "application/json")
			fmt.Fprint(w, `[{"iter": 1, "kvCacheStats": {}}]`) // trtllm-serve's shape
			return
		case "/v1/models":
			good.ServeHTTP(w, r)
			return
		case "/v1/completions":
		default:
			http.NotFound(w, r)
			return
		}
		data, _ := io.ReadAll(r.Body)
		var body struct{ Prompt []int32 }
		_ = json.Unmarshal(data, &body)
		switch i := int(body.Prompt[0]); {
		case i < len(hostile):
			hostile[i].serve(w, r)
		case i == len(hostile):
			http.Redirect(w, r, other.URL+"/v1/completions", http.StatusTemporaryRedirect)
		default:
			r.Body = io.NopCloser(bytes.NewReader(data))
			good.ServeHTTP(w, r)
		}
	}))
	defer srv.Close()
	var rs []workload.Request
	for i := range len(hostile) + 3 {
		rs = append(rs, workload.Request{ID: uint64(i), Prompt: []int32{int32(i), 5, 6}, OutputLen: 3})
	}
	rep := run(t, Options{URL: srv.URL, Requests: rs, Load: report.LoadConcurrency, Concurrency: 4, Flush: true,
		RequestTimeout: 2 * time.Second})
	want := map[string]int{"http_other": 1}
	for _, h := range hostile {
		want[h.kind]++
	}
	b := rep.Bench
	for k, n := range want {
		if b.Errors[k] != n {
			t.Errorf("errors[%s] = %d, want %d (all: %v)", k, b.Errors[k], n, b.Errors)
		}
	}
	if rep.Requests.Completed != 2 || rep.Requests.Total != len(rs) || rep.Requests.Rejected != 1 || rep.Requests.Failed != len(rs)-3 {
		t.Errorf("requests %+v, want 2 completed, 1 rejected (429), the rest failed", rep.Requests)
	}
	for _, f := range append(rep.Requests.Failures, rep.Requests.Rejections...) {
		if i := int(f.ID); i < len(hostile) && !strings.HasPrefix(f.Reason, hostile[i].kind+": ") {
			t.Errorf("request %d (%s): reason %q, want its kind %s", i, hostile[i].name, f.Reason, hostile[i].kind)
		}
		t.Logf("request %d: %s", f.ID, f.Reason)
	}
	if elsewhere.Load() != 0 {
		t.Errorf("the redirect was followed: %d requests reached another server", elsewhere.Load())
	}
	if b.Metrics != nil || !strings.HasPrefix(b.Phases.Flush, "failed") || len(b.Notes) != 2 {
		t.Errorf("metrics %+v, flush %q, notes %q: want no metrics, a failed flush and a note of each", b.Metrics, b.Phases.Flush, b.Notes)
	}
}

// TestRefusedAndDeadline: a server that refuses connections fails every
// request as connect, with notes for /v1/models and /metrics; a measured
// phase past its --duration fails what is left as timeouts, and returns.
func TestRefusedAndDeadline(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	rep := run(t, Options{URL: "http://" + addr, Requests: reqs(5), Load: report.LoadRate, Rate: 1000, Warmup: 2, Flush: true, Prime: true})
	if rep.Bench.Errors["connect"] != 5 || rep.Requests.Failed != 5 || len(rep.Bench.Notes) < 3 {
		t.Errorf("errors %v, requests %+v, notes %q: want 5 connect failures and notes", rep.Bench.Errors, rep.Requests, rep.Bench.Notes)
	}
	hang := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/completions" {
			_, _ = io.ReadAll(r.Body) // then the server sees the client go
			<-r.Context().Done()
		}
	}))
	defer hang.Close()
	start := time.Now()
	rep = run(t, Options{URL: hang.URL, Model: "m", Requests: reqs(50), Load: report.LoadTimestamps, Concurrency: 2, Duration: 300 * time.Millisecond})
	if rep.Bench.Errors["timeout"] != 50 || time.Since(start) > 10*time.Second {
		t.Errorf("errors %v after %v, want 50 timeouts soon after the 300 ms duration", rep.Bench.Errors, time.Since(start))
	}
}

// TestCheck: bad options are errors that name the flag, the value and the
// limit, all at once.
func TestCheck(t *testing.T) {
	o := Options{URL: "ftp://x", Requests: reqs(1), Load: report.LoadRate, Rate: -1, Concurrency: -2,
		SLO: report.SLO{TTFTMs: -1}, ExtraBody: map[string]any{"stream": false}, RequestTimeout: -time.Second}
	err := o.Check()
	if err == nil {
		t.Fatal("Check accepts bad options")
	}
	for _, want := range []string{"--url ftp://x: want http://", "--rate -1: must be", "--concurrency -2: must be in [0, 10000]",
		"--slo-ttft-ms -1", `--extra-body stream: sets "stream"`, "--request-timeout -1s: must be > 0"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("Check() = %v\nwant it to say %q", err, want)
		}
	}
	for in, want := range map[string]string{"http://h:1/v1": "http://h:1", "http://h:1/": "http://h:1", "https://h/v1/": "https://h"} {
		if got, err := BaseURL(in); got != want || err != nil {
			t.Errorf("BaseURL(%q) = %q, %v, want %q", in, got, err, want)
		}
	}
}

// TestSharedPrefixes: one request per group of two or more, its prompt the
// longest prefix the group shares.
func TestSharedPrefixes(t *testing.T) {
	got := sharedPrefixes(append(reqs(4), workload.Request{Prompt: []int32{9}, OutputLen: 1, Group: "alone"}))
	if len(got) != 2 || fmt.Sprint(got[0].Prompt, got[1].Prompt) != "[0 0 0 0] [1 1 1 1]" || got[0].OutputLen != 1 {
		t.Errorf("sharedPrefixes = %+v", got)
	}
}
