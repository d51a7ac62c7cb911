package main

import (
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvx-dev/kvx/cmd/kvx/internal/servetest"
	"github.com/kvx-dev/kvx/core/report/pagecheck"
)

// TestBenchAgainstServe runs the kvx bench binary against the kvx serve
// binary on the cpu device (scenarios/cpu-llama.yaml, its plugins as
// processes) with the whole protocol (warm-up, flush, prime, measure) on a
// shared-prefix workload, twice in one bench (two columns), and checks what
// it measured against what the server says: every request counted and
// completed, the tokens streamed equal usage's and the server's generation
// counter, cached_tokens > 0 after priming (at least every request's shared
// prefix), the /metrics hit rate equal to usage's, the same outputs digest
// in both columns; then that POST /reset_prefix_cache really drops the
// cached blocks (a prompt cached before is computed again after).
func TestBenchAgainstServe(t *testing.T) {
	const (
		requests = 16
		outTok   = 12
		prefix   = 64 // 4 blocks of 16 tokens
	)
	srv := servetest.Start(t, kvxCommand(t, "serve", "-c", genScenario, "--port", "0", "--set", "kv_cache_config.max_tokens=4096"))
	dir := t.TempDir()
	js, page := filepath.Join(dir, "bench.json"), filepath.Join(dir, "bench.html")
	out, stderr, code := kvx(t, "bench", "--url", srv.Base, "--url", srv.Base+"/v1", "--name", "first", "--name", "second",
		"--requests", "16", "--prompt-tokens", "100-180", "--output-tokens", "12", "--shared-prefix-tokens", "64", "--shared-prefix-groups", "2",
		"--concurrency", "4", "--warmup", "4", "--flush", "--prime", "--slo-ttft-ms", "60000", "--json", js, "--html", page, "--no-progress")
	if code != 0 {
		t.Fatalf("kvx bench: exit %d\n%s%s\nserver:\n%s", code, out, stderr, srv.Stderr)
	}
	t.Logf("kvx bench:\n%s", out)
	for _, want := range []string{"server hit rate", "itl p50 / p90 / p99 ms", "goodput req/s", "first", "second"} {
		if !strings.Contains(out, want) {
			t.Errorf("the table has no %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "invariant checks") || strings.Contains(out, "kv peak usage") {
		t.Errorf("the table of a bench shows engine rows:\n%s", out)
	}
	rs := readReports(t, js)
	if len(rs) != 2 {
		t.Fatalf("%d variants, want 2", len(rs))
	}
	for _, r := range rs {
		b := r.Bench
		if b == nil {
			t.Fatalf("variant %s has no bench part", r.Variant)
		}
		if r.Requests.Total != requests || r.Requests.Completed != requests || len(b.Errors) != 0 || b.Server != "kvx" {
			t.Errorf("%s: requests %+v, errors %v, server %q: want %d completed from kvx", r.Variant, r.Requests, b.Errors, b.Server, requests)
		}
		if b.Phases.Warmup != 4 || b.Phases.Flush != "ok" || b.Phases.FlushEndpoint != "/reset_prefix_cache" || b.Phases.Prime != 2 {
			t.Errorf("%s: phases %+v, want 4 warm-up requests, a flush by /reset_prefix_cache, 2 primed prefixes", r.Variant, b.Phases)
		}
		m := b.Metrics
		if m == nil {
			t.Fatalf("%s: no server metrics; notes %q", r.Variant, b.Notes)
		}
		if b.StreamedTokens != requests*outTok || b.UsageTokens != requests*outTok || b.TokenMismatches != 0 || m.GenerationTokens != requests*outTok {
			t.Errorf("%s: streamed %d, usage %d (%d mismatches), server generated %d: want %d each", r.Variant,
				b.StreamedTokens, b.UsageTokens, b.TokenMismatches, m.GenerationTokens, requests*outTok)
		}
		if b.CachedTokens < requests*prefix || r.Tokens.PrefixReused != b.CachedTokens {
			t.Errorf("%s: cached_tokens %d, want at least every request's %d-token shared prefix after priming (%d)", r.Variant, b.CachedTokens, prefix, requests*prefix)
		}
		if m.PrefixHits != b.CachedTokens || m.PrefixQueries != r.Tokens.Prompt || m.HitRate != r.Tokens.HitRate {
			t.Errorf("%s: /metrics says %d hits of %d queries (%.4f); usage says %d cached of %d prompt tokens (%.4f): want equal",
				r.Variant, m.PrefixHits, m.PrefixQueries, m.HitRate, b.CachedTokens, r.Tokens.Prompt, r.Tokens.HitRate)
		}
		if b.Latency.TTFT.N != requests || b.Latency.ITL.N == 0 || b.Good != requests || r.Throughput.OutputTokensPerS <= 0 {
			t.Errorf("%s: latency %+v, good %d, %.0f tok/s", r.Variant, b.Latency, b.Good, r.Throughput.OutputTokensPerS)
		}
	}
	if rs[0].Outputs.Digest == "" || rs[0].Outputs.Digest != rs[1].Outputs.Digest {
		t.Errorf("outputs digests %q and %q: want one, equal (greedy tokens of the same prompts)", rs[0].Outputs.Digest, rs[1].Outputs.Digest)
	}
	html, err := os.ReadFile(page)
	if err != nil || !strings.Contains(string(html), "server hit rate") || !strings.Contains(string(html), "wall time at the client") {
		t.Errorf("the HTML page (%v) lacks the bench rows or the clock's name", err)
	}
	p := pagecheck.Open(t, page)[0]
	for _, e := range p.Errors {
		t.Errorf("the bench page's console: %s", e)
	}
	for _, u := range p.Requests {
		t.Errorf("the bench page asked for %s", u)
	}
	if p.Drawn == 0 || p.Drawn != p.Canvases {
		t.Errorf("the bench page: kvxCharts %d, %d canvases; want as many charts drawn as canvases", p.Drawn, p.Canvases)
	}
	for _, c := range p.Charts {
		if !c.Painted || c.Datasets == 0 || strings.Contains(c.Title, "Preemptions") || strings.Contains(c.Title, "so far") {
			t.Errorf("the bench page's chart %q: painted %v, %d datasets; want only charts of what the bench measured, with data", c.Title, c.Painted, c.Datasets)
		}
	}

	// The flush drops the cached blocks: a prompt cached before is computed
	// again after it.
	body := `{"prompt": [` + strings.Repeat("7, ", 47) + `7], "max_tokens": 2}`
	cached := func() int {
		t.Helper()
		code, v, _ := post(t, srv.Base+"/v1/completions", body)
		if code != 200 {
			t.Fatalf("completion: %d %v", code, v)
		}
		return num(v["usage"].(map[string]any)["prompt_tokens_details"].(map[string]any)["cached_tokens"])
	}
	cached()
	if n := cached(); n != 32 {
		t.Fatalf("the prompt again: %d cached tokens, want its 2 full blocks before the last token (32)", n)
	}
	resp, err := http.Post(srv.Base+"/reset_prefix_cache", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	data, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var rv struct {
		Status  string `json:"status"`
		Dropped int    `json:"cached_blocks_dropped"`
	}
	if resp.StatusCode != 200 || json.Unmarshal(data, &rv) != nil || rv.Status != "ok" || rv.Dropped == 0 {
		t.Fatalf("POST /reset_prefix_cache: %d %s, want 200 with the cached blocks dropped", resp.StatusCode, data)
	}
	if n := cached(); n != 0 {
		t.Errorf("the prompt after the reset: %d cached tokens, want 0", n)
	}
	// While a request streams, the reset is refused (409) and changes
	// nothing.
	sresp, err := http.Post(srv.Base+"/v1/completions", "application/json",
		strings.NewReader(`{"prompt": [1, 2, 3], "max_tokens": 250, "ignore_eos": true, "stream": true}`))
	if err != nil {
		t.Fatal(err)
	}
	first := make([]byte, 16)
	if _, err := io.ReadFull(sresp.Body, first); err != nil {
		t.Fatal(err)
	}
	resp, err = http.Post(srv.Base+"/reset_prefix_cache", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	data, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusConflict || !strings.Contains(string(data), "engine_busy") {
		t.Errorf("POST /reset_prefix_cache during a stream: %d %s, want 409 engine_busy", resp.StatusCode, data)
	}
	if rest, err := io.ReadAll(sresp.Body); err != nil || !strings.HasSuffix(strings.TrimSpace(string(rest)), "data: [DONE]") {
		t.Errorf("the stream during the refused reset: %v, ends %q", err, string(rest)[max(0, len(rest)-40):])
	}
	sresp.Body.Close()
	if n := cached(); n != 32 {
		t.Errorf("the prompt after the refused reset: %d cached tokens, want 32 (nothing dropped)", n)
	}
	if code := srv.Stop(t); code != 0 {
		t.Errorf("kvx serve exit %d after SIGTERM\n%s", code, srv.Stderr)
	}
}

// TestBenchFlags: bad flags are one usage error (exit 2) naming each flag,
// its value and the limit, before any request is sent.
func TestBenchFlags(t *testing.T) {
	t.Parallel()
	_, stderr, code := kvx(t, "bench", "--url", "ftp://x", "--rate", "-2", "--arrivals", "bursty", "--prompt-tokens", "9-3", "--extra-body", "[1]")
	if code != 2 {
		t.Fatalf("exit %d, want 2\n%s", code, stderr)
	}
	for _, want := range []string{"--url ftp://x", "--rate -2", `--arrivals "bursty"`, `--prompt-tokens "9-3"`, `--extra-body "[1]"`} {
		if !strings.Contains(stderr, want) {
			t.Errorf("stderr lacks %q:\n%s", want, stderr)
		}
	}
	if _, stderr, code := kvx(t, "bench"); code != 2 || !strings.Contains(stderr, "--url is required") {
		t.Errorf("no --url: exit %d\n%s", code, stderr)
	}
}
