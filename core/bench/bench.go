// Package bench is a load generator for any OpenAI-compatible server (kvx
// serve, vLLM, SGLang, trtllm-serve): it replays a workload (a trace kvx
// reads, or generated prompts with a shared-prefix structure) as streamed
// /v1/completions requests of token ids, at the workload's timestamps, at a
// fixed rate or at a fixed concurrency, and measures at the client what a
// user sees: TTFT, TPOT, ITL and end-to-end latency, output tokens per
// second, goodput under an SLO, the cached tokens each answer's usage
// reports, and the server's own prefix hit rate from /metrics before and
// after. The result is a kvx.report/v1 variant (report.Report with its
// Bench part), so kvx's managers and another engine sit side by side in one
// table and one page.
//
// Its parts and the failure each prevents:
//   - stream.go reads one answer and bounds everything the server sends
//     (a line, the stream, the events for the tokens asked), so a bad
//     server (refused connection, 5xx, a stream cut mid-way, a wrong content
//     type, garbage SSE) is a counted failure of that request, never a
//     crash or a hang of the bench;
//   - metrics.go reads kvx's, vLLM's and SGLang's counters, so the server's
//     hit rate is measured over the measured phase only;
//   - bench.go (this file) runs the protocol, warm-up → flush → prime →
//     measure: the warm-up's prompts would count as reuse in the measured
//     phase, so the server's prefix cache is flushed after it
//     (POST /reset_prefix_cache, vLLM's and kvx serve's; /flush_cache,
//     SGLang's), and each shared prefix is then sent once, so the measured
//     phase sees the steady state of a warm cache rather than its cold
//     start.
//
// It only sends to the address it is given: no proxy from the environment,
// no redirect followed. Every loop is bounded: the workload's requests are
// sent once each, every request has a deadline, and the measured phase has
// one too.
package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/schollz/progressbar/v3"
	"github.com/zeebo/xxh3"

	"github.com/kvx-dev/kvx/core/report"
	"github.com/kvx-dev/kvx/core/workload"
)

// Defaults for Options left at zero.
const (
	DefaultRequestTimeout = 10 * time.Minute
	DefaultDuration       = time.Hour
	// MaxRequests bounds the measured requests of one run.
	MaxRequests = 1_000_000
	// MaxConcurrency bounds the requests in flight.
	MaxConcurrency = 10_000
	// maxReasons is how many failure reasons a report keeps.
	maxReasons = 100
)

// Options configure a Run. Errors of Check name the option as kvx bench's
// flag spells it, the value and the limit.
type Options struct {
	// URL is the server: http(s)://host[:port], optionally ending in /v1.
	URL string
	// Name is the variant's name; "" names it by the server and model.
	Name string
	// Model is the model requests name; "" asks GET /v1/models for the
	// first one (and sends none when that fails).
	Model string
	// Requests are sent in order; each prompt is token ids, its OutputLen
	// the max_tokens asked.
	Requests []workload.Request
	// Load is report.LoadTimestamps (Request.Arrival), report.LoadRate
	// (Rate per second, Poisson unless Constant) or report.LoadConcurrency
	// (a closed loop of Concurrency requests). With an open loop,
	// Concurrency > 0 caps the requests in flight.
	Load        string
	Rate        float64
	Constant    bool
	Seed        uint64 // of the Poisson arrivals
	Concurrency int
	// Warmup requests (the workload's first, cycled) are sent before the
	// flush and not measured.
	Warmup int
	// Flush asks the server to drop its prefix cache after the warm-up;
	// Prime sends each shared prefix once after it (the longest prefix
	// common to the requests of a workload.Request.Group).
	Flush, Prime bool
	SLO          report.SLO
	// IgnoreEOS asks for exactly max_tokens tokens (vLLM's, SGLang's and
	// kvx's ignore_eos).
	IgnoreEOS bool
	// ExtraBody is merged into every request body (it wins).
	ExtraBody map[string]any
	// RequestTimeout bounds each request; Duration the measured phase
	// (past it the requests in flight fail as timeouts and the rest are
	// not sent).
	RequestTimeout, Duration time.Duration
	// Progress, when set, shows a progress bar of the measured requests.
	Progress io.Writer
	// Client sends the requests; nil builds one that uses no proxy and
	// follows no redirect. A Client given must not follow redirects either.
	Client *http.Client
}

func optErr(field string, value any, format string, args ...any) error {
	return fmt.Errorf("bench: --%s %v: %s", field, value, fmt.Sprintf(format, args...))
}

// Check applies the defaults and checks every option; the errors name the
// flag, the value and the limit.
func (o *Options) Check() error {
	var errs []error
	base, err := baseURL(o.URL)
	if err != nil {
		errs = append(errs, err)
	}
	o.URL = base
	switch n := len(o.Requests); {
	case n == 0:
		errs = append(errs, errors.New("bench: the workload has no requests"))
	case n > MaxRequests:
		errs = append(errs, optErr("requests", n, "at most %d", MaxRequests))
	}
	for i, r := range o.Requests {
		if r.Rejected == "" && (len(r.Prompt) == 0 || r.OutputLen < 1) {
			errs = append(errs, fmt.Errorf("bench: request %d has %d prompt tokens and %d output tokens: want at least 1 of each", i, len(r.Prompt), r.OutputLen))
			break
		}
	}
	if o.Concurrency < 0 || o.Concurrency > MaxConcurrency {
		errs = append(errs, optErr("concurrency", o.Concurrency, "must be in [0, %d] (0: no cap on an open loop)", MaxConcurrency))
	}
	switch o.Load {
	case report.LoadRate:
		if !(o.Rate > 0) || math.IsInf(o.Rate, 0) {
			errs = append(errs, optErr("rate", o.Rate, "must be a finite number of requests per second > 0"))
		}
	case report.LoadConcurrency:
		if o.Concurrency < 1 {
			errs = append(errs, optErr("concurrency", o.Concurrency, "must be >= 1 for a closed loop"))
		}
	case report.LoadTimestamps:
	default:
		errs = append(errs, fmt.Errorf("bench: load %q: want %s, %s or %s", o.Load, report.LoadTimestamps, report.LoadRate, report.LoadConcurrency))
	}
	if o.Warmup < 0 || o.Warmup > MaxRequests {
		errs = append(errs, optErr("warmup", o.Warmup, "must be in [0, %d]", MaxRequests))
	}
	for _, s := range []struct {
		name string
		v    float64
	}{{"slo-ttft-ms", o.SLO.TTFTMs}, {"slo-tpot-ms", o.SLO.TPOTMs}, {"slo-e2e-ms", o.SLO.E2EMs}} {
		if !(s.v >= 0) || math.IsInf(s.v, 0) {
			errs = append(errs, optErr(s.name, s.v, "must be a finite number of ms >= 0 (0: no bound)"))
		}
	}
	switch {
	case o.RequestTimeout == 0:
		o.RequestTimeout = DefaultRequestTimeout
	case o.RequestTimeout < 0:
		errs = append(errs, optErr("request-timeout", o.RequestTimeout, "must be > 0"))
	}
	switch {
	case o.Duration == 0:
		o.Duration = DefaultDuration
	case o.Duration < 0:
		errs = append(errs, optErr("duration", o.Duration, "must be > 0"))
	}
	for _, k := range []string{"prompt", "stream"} {
		if _, ok := o.ExtraBody[k]; ok {
			errs = append(errs, optErr("extra-body", k, "sets %q, which kvx bench sends itself", k))
		}
	}
	return errors.Join(errs...)
}

// baseURL checks u and returns it without a trailing / or /v1.
func baseURL(u string) (string, error) {
	p, err := url.Parse(strings.TrimSpace(u))
	if err != nil {
		return "", optErr("url", u, "%v", err)
	}
	if p.Scheme != "http" && p.Scheme != "https" {
		return "", optErr("url", u, "want http://host:port or https://host:port")
	}
	if p.Host == "" {
		return "", optErr("url", u, "names no host")
	}
	if p.RawQuery != "" || p.Fragment != "" || p.User != nil {
		return "", optErr("url", u, "want no query, fragment or user: http://host:port[/v1]")
	}
	path := strings.TrimSuffix(strings.TrimSuffix(p.Path, "/"), "/v1")
	p.Path, p.RawPath = strings.TrimSuffix(path, "/"), ""
	return p.String(), nil
}

// runner is one Run's state.
type runner struct {
	o      Options
	base   string
	client *http.Client
	model  string
	notes  []string
}

// NewClient is the HTTP client Run uses by default: no proxy (it only
// sends to the address it is given), no redirect followed, connections
// bounded in time to set up.
func NewClient(concurrency int) *http.Client {
	tr := &http.Transport{
		Proxy:                 nil,
		DialContext:           (&net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		TLSHandshakeTimeout:   10 * time.Second,
		MaxIdleConns:          max(100, concurrency),
		MaxIdleConnsPerHost:   max(100, concurrency),
		IdleConnTimeout:       90 * time.Second,
		ResponseHeaderTimeout: 0, // a prefill may take long: the request's deadline bounds it
		ForceAttemptHTTP2:     false,
	}
	return &http.Client{Transport: tr, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
}

// Run runs the protocol (warm-up, flush, prime, measure) against o.URL and
// returns the report of the measured phase. Failed requests are counted in
// it, never returned as errors; the error is for options that do not
// check, and the report's Status says whether ctx stopped the run early.
func Run(ctx context.Context, o Options) (report.Report, error) {
	if err := o.Check(); err != nil {
		return report.Report{}, err
	}
	b := &runner{o: o, base: o.URL, client: o.Client, model: o.Model}
	if b.client == nil {
		b.client = NewClient(o.Concurrency)
	}
	if b.model == "" {
		b.model = b.firstModel(ctx)
	}
	var phases report.BenchPhases
	phases.Flush = "off"
	// Warm-up: the workload's first requests, cycled, a closed loop.
	if o.Warmup > 0 {
		reqs := make([]workload.Request, 0, o.Warmup)
		for i := range o.Warmup {
			reqs = append(reqs, o.Requests[i%len(o.Requests)])
		}
		b.noteFailures("warm-up", b.closedLoop(ctx, reqs, max(1, o.Concurrency), nil))
		phases.Warmup = len(reqs)
	}
	if o.Flush {
		phases.Flush, phases.FlushEndpoint = b.flush(ctx)
	}
	if o.Prime {
		prefixes := sharedPrefixes(o.Requests)
		b.noteFailures("prime", b.closedLoop(ctx, prefixes, max(1, o.Concurrency), nil))
		phases.Prime = len(prefixes)
	}
	before, err := b.settled(ctx)
	if err != nil {
		b.notes = append(b.notes, err.Error())
	}
	mctx, cancel := context.WithTimeout(ctx, o.Duration)
	res, dur := b.measure(mctx)
	cancel()
	after, _ := b.settled(ctx)
	rep := b.report(res, dur, phases, delta(before, after))
	if ctx.Err() != nil {
		rep.Status, rep.Error = report.StatusInterrupted, "interrupted: "+context.Cause(ctx).Error()
	}
	return rep, nil
}

// noteFailures notes how many of a phase's requests failed, and the first
// reason.
func (b *runner) noteFailures(phase string, res []*result) {
	n, first := 0, ""
	for _, r := range res {
		if !r.ok {
			if n == 0 {
				first = r.kind + ": " + r.reason
			}
			n++
		}
	}
	if n > 0 {
		b.notes = append(b.notes, fmt.Sprintf("%s: %d of %d requests failed (the first: %s)", phase, n, len(res), first))
	}
}

// firstModel asks GET /v1/models for the first model id; "" (send none)
// when the server does not answer one.
func (b *runner) firstModel(ctx context.Context) string {
	m, err := ServerModel(ctx, b.client, b.base)
	if err != nil {
		b.notes = append(b.notes, err.Error()+": requests name no model")
	}
	return m.ID
}

// Model is what GET /v1/models says of a server's first model.
type Model struct {
	ID string
	// MaxModelLen is its max_model_len (vLLM's and kvx's); VocabSize its
	// vocab_size (kvx's): 0 when not said.
	MaxModelLen, VocabSize int
}

// ServerModel asks GET /v1/models of the server at url (a checked base
// URL, Options.Check's) for its first model, with client (nil: NewClient).
func ServerModel(ctx context.Context, client *http.Client, url string) (Model, error) {
	if client == nil {
		client = NewClient(0)
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url+"/v1/models", nil)
	if err != nil {
		return Model{}, fmt.Errorf("GET /v1/models: %v", err)
	}
	resp, err := client.Do(req)
	if err != nil {
		return Model{}, fmt.Errorf("GET /v1/models: %v", cleanErr(err))
	}
	defer resp.Body.Close()
	var v struct {
		Data []struct {
			ID          string `json:"id"`
			MaxModelLen int    `json:"max_model_len"`
			VocabSize   int    `json:"vocab_size"`
		} `json:"data"`
	}
	if resp.StatusCode != http.StatusOK {
		return Model{}, fmt.Errorf("GET /v1/models: HTTP %d %s", resp.StatusCode, errorMessage(resp.Body))
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&v); err != nil || len(v.Data) == 0 || v.Data[0].ID == "" {
		return Model{}, fmt.Errorf("GET /v1/models: no model id in the answer")
	}
	d := v.Data[0]
	return Model{ID: d.ID, MaxModelLen: max(0, d.MaxModelLen), VocabSize: max(0, d.VocabSize)}, nil
}

// BaseURL checks a server URL as Options.Check does and returns it
// without a trailing / or /v1.
func BaseURL(u string) (string, error) { return baseURL(u) }

// flush asks the server to drop its prefix cache: vLLM's and kvx's
// POST /reset_prefix_cache, else SGLang's POST /flush_cache. A busy server
// (409, 503) is asked again for up to 10 s. It returns "ok" and the path,
// or why not.
func (b *runner) flush(ctx context.Context) (string, string) {
	var why []string
	for _, path := range []string{"/reset_prefix_cache", "/flush_cache"} {
		for try := 0; ; try++ {
			status, msg, err := b.post(ctx, path)
			switch {
			case err != nil:
				return fmt.Sprintf("failed: POST %s: %v", path, err), ""
			case status == http.StatusOK:
				return "ok", path
			case (status == http.StatusConflict || status == http.StatusServiceUnavailable) && try < 50 && ctx.Err() == nil:
				time.Sleep(200 * time.Millisecond)
				continue
			}
			why = append(why, fmt.Sprintf("POST %s: HTTP %d %s", path, status, msg))
			break
		}
	}
	b.notes = append(b.notes, "the prefix cache was not flushed: "+strings.Join(why, "; "))
	return "failed: " + strings.Join(why, "; "), ""
}

func (b *runner) post(ctx context.Context, path string) (int, string, error) {
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, b.base+path, nil)
	resp, err := b.client.Do(req)
	if err != nil {
		return 0, "", cleanErr(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusOK {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, maxErrorBody))
		return resp.StatusCode, "", nil
	}
	return resp.StatusCode, errorMessage(resp.Body), nil
}

// settled scrapes /metrics until two scrapes in a row agree and the server
// says nothing runs (at most 5 s): a server may publish its counters a
// moment after the last answer.
func (b *runner) settled(ctx context.Context) (*snapshot, error) {
	var last *snapshot
	for end := time.Now().Add(5 * time.Second); ; {
		s, err := b.scrape(ctx)
		if err != nil {
			return nil, err
		}
		if last != nil && s.counters() == last.counters() && s.idle() {
			return s, nil
		}
		if time.Now().After(end) || ctx.Err() != nil {
			return s, nil
		}
		last = s
		time.Sleep(50 * time.Millisecond)
	}
}

// body is the request body of r.
func (b *runner) body(r workload.Request, maxTokens int) []byte {
	v := map[string]any{
		"prompt": r.Prompt, "max_tokens": maxTokens, "stream": true,
		"stream_options": map[string]any{"include_usage": true}, "temperature": 0,
	}
	if b.model != "" {
		v["model"] = b.model
	}
	if b.o.IgnoreEOS {
		v["ignore_eos"] = true
	}
	for k, x := range b.o.ExtraBody {
		v[k] = x
	}
	data, err := json.Marshal(v)
	if err != nil { // ExtraBody came from JSON: it marshals
		panic(err)
	}
	return data
}

// one sends r within the request timeout.
func (b *runner) one(ctx context.Context, r workload.Request) *result {
	ctx, cancel := context.WithTimeout(ctx, b.o.RequestTimeout)
	defer cancel()
	return b.stream(ctx, b.body(r, r.OutputLen), r.OutputLen)
}

// closedLoop sends reqs with n in flight and returns their results.
func (b *runner) closedLoop(ctx context.Context, reqs []workload.Request, n int, done func(*result)) []*result {
	out := make([]*result, len(reqs))
	var next atomic.Int64
	var wg sync.WaitGroup
	for range min(n, len(reqs)) {
		wg.Go(func() {
			for {
				i := int(next.Add(1) - 1)
				if i >= len(reqs) {
					return
				}
				out[i] = b.sendOrSkip(ctx, reqs[i])
				if done != nil {
					done(out[i])
				}
			}
		})
	}
	wg.Wait()
	return out
}

// sendOrSkip sends r, unless ctx ended (then r fails as a timeout unsent).
func (b *runner) sendOrSkip(ctx context.Context, r workload.Request) *result {
	if ctx.Err() != nil {
		res := &result{sent: time.Now()}
		return res.fail("timeout", "not sent: %v", context.Cause(ctx))
	}
	return b.one(ctx, r)
}

// arrivals are the send times of the open loops, from the start.
func (b *runner) arrivals() []time.Duration {
	reqs := b.o.Requests
	at := make([]time.Duration, len(reqs))
	switch b.o.Load {
	case report.LoadTimestamps:
		t0 := reqs[0].Arrival
		for i, r := range reqs {
			t0 = min(t0, r.Arrival)
			at[i] = time.Duration(r.Arrival)
		}
		for i := range at {
			at[i] -= time.Duration(t0)
		}
	case report.LoadRate:
		rng := newRand(b.o.Seed)
		var t float64
		for i := range at {
			if i > 0 {
				if b.o.Constant {
					t += 1 / b.o.Rate
				} else {
					t += -math.Log1p(-rng.float()) / b.o.Rate
				}
			}
			at[i] = time.Duration(min(t*1e9, math.MaxInt64/2))
		}
	}
	return at
}

// measure sends the workload and returns every request's result, in
// order, and the phase's duration.
func (b *runner) measure(ctx context.Context) ([]*result, time.Duration) {
	reqs := b.o.Requests
	var ok, failed, inflight atomic.Int64
	bar := b.bar(len(reqs))
	tick := func(r *result) {
		if r.ok {
			ok.Add(1)
		} else {
			failed.Add(1)
		}
		if bar != nil {
			bar.Describe(fmt.Sprintf("bench ok %d failed %d in flight %d", ok.Load(), failed.Load(), inflight.Load()))
			_ = bar.Add(1)
		}
	}
	start := time.Now()
	var out []*result
	if b.o.Load == report.LoadConcurrency {
		out = b.closedLoop(ctx, reqs, b.o.Concurrency, func(r *result) { tick(r) })
	} else {
		out = make([]*result, len(reqs))
		at := b.arrivals()
		var sem chan struct{}
		if b.o.Concurrency > 0 {
			sem = make(chan struct{}, b.o.Concurrency)
		}
		var wg sync.WaitGroup
		for i, r := range reqs {
			if d := time.Until(start.Add(at[i])); d > 0 {
				t := time.NewTimer(d)
				select {
				case <-t.C:
				case <-ctx.Done():
					t.Stop()
				}
			}
			if sem != nil {
				select {
				case sem <- struct{}{}:
				case <-ctx.Done():
				}
			}
			inflight.Add(1)
			wg.Go(func() {
				defer inflight.Add(-1)
				out[i] = b.sendOrSkip(ctx, r)
				if sem != nil {
					select {
					case <-sem:
					default:
					}
				}
				tick(out[i])
			})
		}
		wg.Wait()
	}
	dur := time.Since(start)
	if bar != nil {
		_ = bar.Finish()
	}
	return out, dur
}

// bar is the measured phase's progress bar, in the style of kvx run's.
func (b *runner) bar(n int) *progressbar.ProgressBar {
	if b.o.Progress == nil {
		return nil
	}
	return progressbar.NewOptions(n,
		progressbar.OptionSetWriter(b.o.Progress),
		progressbar.OptionSetDescription("bench"),
		progressbar.OptionShowCount(),
		progressbar.OptionSetWidth(24),
		progressbar.OptionThrottle(200*time.Millisecond),
		progressbar.OptionClearOnFinish(),
	)
}

// sharedPrefixes are, per group of o's requests (workload.Request.Group)
// with two or more requests, the longest prefix they all share, as a
// request of one output token.
func sharedPrefixes(reqs []workload.Request) []workload.Request {
	lcp := map[string][]int32{}
	count := map[string]int{}
	var order []string
	for _, r := range reqs {
		if r.Group == "" || r.Rejected != "" {
			continue
		}
		p, seen := lcp[r.Group]
		if !seen {
			order = append(order, r.Group)
			lcp[r.Group] = r.Prompt
			count[r.Group] = 1
			continue
		}
		n := 0
		for n < len(p) && n < len(r.Prompt) && p[n] == r.Prompt[n] {
			n++
		}
		lcp[r.Group] = p[:n]
		count[r.Group]++
	}
	var out []workload.Request
	for _, g := range order {
		if p := lcp[g]; count[g] > 1 && len(p) > 0 {
			out = append(out, workload.Request{ID: uint64(len(out)), Prompt: p, OutputLen: 1, Group: g})
		}
	}
	return out
}

// report turns the measured results into the variant.
func (b *runner) report(res []*result, dur time.Duration, phases report.BenchPhases, m *report.ServerMetrics) report.Report {
	o := b.o
	bn := &report.Bench{
		URL: o.URL, Load: o.Load, Concurrency: o.Concurrency, DurationS: dur.Seconds(), Phases: phases, SLO: o.SLO,
		Errors: map[string]int{}, Metrics: m, Notes: slices.Clone(b.notes),
	}
	if o.Load == report.LoadRate {
		bn.RatePerS, bn.Arrivals = o.Rate, "poisson"
		if o.Constant {
			bn.Arrivals = "constant"
		}
	}
	if m != nil {
		bn.Server = m.Names
	}
	if bn.Notes == nil {
		bn.Notes = []string{}
	}
	rep := report.Report{Variant: o.Name, Bench: bn, Status: report.StatusFinished}
	rep.Config.Model = b.model
	if rep.Variant == "" {
		rep.Variant = strings.TrimSpace(bn.Server + " " + b.model)
		if rep.Variant == "" {
			rep.Variant = o.URL
		}
	}
	var ttft, tpot, e2e, itl []float64
	digest := xxh3.New()
	allIDs := true
	var buf [4]byte
	wl := &report.Workload{Requests: len(o.Requests)}
	if o.Load == report.LoadConcurrency {
		wl.Concurrency = o.Concurrency
	}
	for i, r := range res {
		q := o.Requests[i]
		wl.PromptTokens += int64(len(q.Prompt))
		wl.PromptTokensMax = max(wl.PromptTokensMax, len(q.Prompt))
		wl.OutputTokens += int64(q.OutputLen)
		wl.OutputTokensMax = max(wl.OutputTokensMax, q.OutputLen)
		wl.LastArrivalS = max(wl.LastArrivalS, float64(q.Arrival)/1e9)
		rep.Requests.Total++
		if !r.ok {
			bn.Errors[r.kind]++
			rj := report.Rejection{ID: q.ID, Reason: r.kind + ": " + r.reason}
			if r.kind == "http_4xx" {
				rep.Requests.Rejected++
				if len(rep.Requests.Rejections) < maxReasons {
					rep.Requests.Rejections = append(rep.Requests.Rejections, rj)
				}
			} else {
				rep.Requests.Failed++
				if len(rep.Requests.Failures) < maxReasons {
					rep.Requests.Failures = append(rep.Requests.Failures, rj)
				}
			}
			allIDs = false
			continue
		}
		rep.Requests.Completed++
		gen := r.streamed
		prompt := len(q.Prompt)
		bn.StreamedTokens += int64(r.streamed)
		if r.usage != nil {
			bn.UsageRequests++
			bn.UsageTokens += int64(r.usage.CompletionTokens)
			if r.usage.CompletionTokens != r.streamed {
				bn.TokenMismatches++
			}
			gen = r.usage.CompletionTokens
			if r.usage.PromptTokens > 0 {
				prompt = r.usage.PromptTokens
			}
			bn.CachedTokens += int64(r.usage.cached())
		}
		rep.Tokens.Prompt += int64(prompt)
		rep.Tokens.Generated += int64(gen)
		ms := func(d time.Duration) float64 { return float64(d) / 1e6 }
		t1, te := ms(r.ttft), ms(r.e2e)
		ttft, e2e = append(ttft, t1), append(e2e, te)
		itl = append(itl, r.itl...)
		tp := -1.0
		if gen > 1 {
			tp = (te - t1) / float64(gen-1)
			tpot = append(tpot, tp)
		}
		good := (o.SLO.TTFTMs == 0 || t1 <= o.SLO.TTFTMs) && (o.SLO.E2EMs == 0 || te <= o.SLO.E2EMs) &&
			(o.SLO.TPOTMs == 0 || tp <= o.SLO.TPOTMs)
		if good {
			bn.Good++
		}
		if !r.idsAll || len(r.ids) != gen {
			allIDs = false
		}
		for _, t := range r.ids {
			buf[0], buf[1], buf[2], buf[3] = byte(t), byte(t>>8), byte(t>>16), byte(t>>24)
			digest.Write(buf[:])
		}
		buf = [4]byte{0xff, 0xff, 0xff, 0xff}
		digest.Write(buf[:])
	}
	rep.Tokens.PrefixReused = bn.CachedTokens
	rep.Tokens.PrefixReusedByTier.Device = bn.CachedTokens // the answer does not say which tier
	if rep.Tokens.Prompt > 0 {
		rep.Tokens.HitRate = min(1, float64(rep.Tokens.PrefixReused)/float64(rep.Tokens.Prompt))
	}
	if allIDs && rep.Requests.Completed > 0 {
		rep.Outputs.Digest = fmt.Sprintf("%016x", digest.Sum64())
	}
	bn.Latency = report.BenchLatency{TTFT: report.NewDist(slices.Clone(ttft)), TPOT: report.NewDist(slices.Clone(tpot)),
		ITL: report.NewDist(itl), E2E: report.NewDist(slices.Clone(e2e))}
	rep.Latency = report.Latency{
		TTFTP50: bn.Latency.TTFT.P50, TTFTP99: bn.Latency.TTFT.P99, TPOTP50: bn.Latency.TPOT.P50, TPOTP99: bn.Latency.TPOT.P99,
		E2EP50: bn.Latency.E2E.P50, E2EP99: bn.Latency.E2E.P99, Quantiles: report.NewQuantiles(ttft, tpot, e2e),
	}
	if s := dur.Seconds(); s > 0 {
		rep.Throughput = report.Throughput{OutputTokensPerS: float64(rep.Tokens.Generated) / s, RequestsPerS: float64(rep.Requests.Completed) / s,
			EngineS: s, SimulatedS: s}
		bn.GoodputPerS = float64(bn.Good) / s
	}
	rep.Engine.WallS = dur.Seconds()
	rep.Workload = wl
	return rep
}
