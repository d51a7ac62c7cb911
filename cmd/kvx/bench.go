package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/kvx-dev/kvx/core/bench"
	"github.com/kvx-dev/kvx/core/report"
	"github.com/kvx-dev/kvx/core/workload"
)

// benchOpts are the flags of kvx bench.
type benchOpts struct {
	urls, names []string
	model       string
	// workload
	trace, format           string
	timeScale               float64
	limit, hashBlockTokens  int
	requests                int
	promptTokens, outTokens string
	sharedPrefix, groups    int
	vocab                   int
	seed                    uint64
	// load
	rate        float64
	arrivals    string
	concurrency int
	// protocol
	warmup       int
	flush, prime bool
	slo          report.SLO
	ignoreEOS    bool
	extraBody    string
	reqTimeout   time.Duration
	duration     time.Duration
	// output
	jsonOut, htmlOut string
	adds             []string
	noProgress       bool
}

func newBenchCmd(g *globals) *cobra.Command {
	o := &benchOpts{}
	cmd := &cobra.Command{
		Use:   "bench --url http://127.0.0.1:8000 [flags]",
		Short: "Load an OpenAI-compatible server (kvx serve, vLLM, SGLang, trtllm-serve) and report what a client measures",
		Long: `Load an OpenAI-compatible server with streamed /v1/completions requests of
token ids and report what the client measures: TTFT, TPOT, ITL and end-to-end
latency (p50/p90/p99), output tok/s, goodput under an SLO (--slo-*), the
cached_tokens of each answer's usage, and the server's prefix hit rate from
its /metrics before and after (kvx's and vLLM's prefix_cache_queries and
prefix_cache_hits, SGLang's cached tokens).

The workload is a trace (--trace, any format kvx run reads: mooncake,
bailian, azure, burstgpt) or generated prompts (--requests, --prompt-tokens,
--output-tokens, --shared-prefix-tokens in --shared-prefix-groups groups).
Requests are sent at the trace's timestamps (a trace without --rate or
--concurrency, scaled by --time-scale), at --rate per second (Poisson, or
--arrivals constant; --concurrency then caps the requests in flight), or as
a closed loop of --concurrency in flight (a trace with --concurrency too, in
its order; 8 by default for generated prompts).

Before the measured phase: --warmup N requests, then --flush (POST
/reset_prefix_cache, which kvx serve and vLLM answer; SGLang's /flush_cache
otherwise), then --prime (each shared prefix once). Each --url is measured in
turn on the same workload, one column each (--name them); --add puts the
variants of an earlier kvx run, compare or bench JSON beside them.

A request that fails (refused connection, 4xx/5xx, a stream cut, a wrong
content type, garbage SSE, its --request-timeout) is counted by kind; it
never stops the bench. Only the given address is contacted: no proxy, no
redirect followed.

Exit status: 0 when the bench ran (whatever the requests' fate), 2 for bad
flags, 130/143/129 when a signal stopped it (the partial report is written).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return runBench(cmd.Context(), o) },
	}
	f := cmd.Flags()
	f.StringArrayVar(&o.urls, "url", nil, "server base URL, http://host:port (repeatable: one variant per server, measured in turn)")
	f.StringArrayVar(&o.names, "name", nil, "the variant's name, one per --url (default: the server's kind and model)")
	f.StringVar(&o.model, "model", "", "model requests name (default: the first of GET /v1/models)")
	f.StringVar(&o.trace, "trace", "", "replay this trace (mooncake, bailian JSONL; azure, burstgpt CSV) instead of generated prompts")
	f.StringVar(&o.format, "format", "", "the trace's format (default: detected from its first line)")
	f.Float64Var(&o.timeScale, "time-scale", 1, "trace replay speed: 2 sends twice as fast")
	f.IntVar(&o.limit, "limit", 0, "read at most this many trace requests (0: all)")
	f.IntVar(&o.hashBlockTokens, "hash-block-tokens", 0, "tokens per trace hash id (0: the format's, 512 for mooncake)")
	f.IntVar(&o.requests, "requests", 64, "generated requests")
	f.StringVar(&o.promptTokens, "prompt-tokens", "256", "generated prompt length, N or MIN-MAX (uniform)")
	f.StringVar(&o.outTokens, "output-tokens", "64", "max_tokens asked, N or MIN-MAX (uniform)")
	f.IntVar(&o.sharedPrefix, "shared-prefix-tokens", 0, "leading prompt tokens the requests of a group share")
	f.IntVar(&o.groups, "shared-prefix-groups", 1, "distinct shared prefixes (request i is in group i mod this)")
	f.IntVar(&o.vocab, "vocab", 0, "prompt token ids are in [0, vocab) (0: the server's vocab_size from /v1/models when it says one, as kvx serve does, else 32000)")
	f.Uint64Var(&o.seed, "seed", 1, "seed of the prompts and of the Poisson arrivals")
	f.Float64Var(&o.rate, "rate", 0, "requests per second (an open loop)")
	f.StringVar(&o.arrivals, "arrivals", "poisson", "with --rate: poisson or constant")
	f.IntVar(&o.concurrency, "concurrency", 0, "requests in flight: a closed loop, or with --rate its cap (default 8 for generated prompts without --rate)")
	f.IntVar(&o.warmup, "warmup", 0, "requests sent before measuring, not measured")
	f.BoolVar(&o.flush, "flush", false, "after the warm-up, ask the server to drop its prefix cache (POST /reset_prefix_cache)")
	f.BoolVar(&o.prime, "prime", false, "before measuring, send each shared prefix once (1 output token)")
	f.Float64Var(&o.slo.TTFTMs, "slo-ttft-ms", 0, "goodput: a good request's TTFT is at most this (0: no bound)")
	f.Float64Var(&o.slo.TPOTMs, "slo-tpot-ms", 0, "goodput: a good request's TPOT is at most this (0: no bound)")
	f.Float64Var(&o.slo.E2EMs, "slo-e2e-ms", 0, "goodput: a good request's end-to-end latency is at most this (0: no bound)")
	f.BoolVar(&o.ignoreEOS, "ignore-eos", true, "ask for exactly max_tokens tokens (ignore_eos)")
	f.StringVar(&o.extraBody, "extra-body", "", `a JSON object merged into every request body, e.g. '{"return_token_ids": true}' for vLLM`)
	f.DurationVar(&o.reqTimeout, "request-timeout", bench.DefaultRequestTimeout, "bound of each request")
	f.DurationVar(&o.duration, "duration", bench.DefaultDuration, "bound of each measured phase: past it the requests in flight fail as timeouts")
	f.StringVar(&o.jsonOut, "json", "", "write the kvx.report/v1 document to this file ('-' for stdout)")
	f.StringVar(&o.htmlOut, "html", "", "write the report as an HTML page with charts to this file")
	f.StringArrayVar(&o.adds, "add", nil, "put the variants of this earlier kvx.report/v1 JSON first (repeatable)")
	f.BoolVar(&o.noProgress, "no-progress", false, "do not show the progress bar")
	return cmd
}

// span parses N or MIN-MAX.
func span(flag, s string) (int, int, error) {
	lo, hi, ok := strings.Cut(strings.TrimSpace(s), "-")
	a, err := strconv.Atoi(strings.TrimSpace(lo))
	b := a
	if err == nil && ok {
		b, err = strconv.Atoi(strings.TrimSpace(hi))
	}
	if err != nil || a < 1 || b < a {
		return 0, 0, fmt.Errorf("--%s %q: want N or MIN-MAX with 1 <= MIN <= MAX", flag, s)
	}
	return a, b, nil
}

func runBench(ctx context.Context, o *benchOpts) error {
	opts, wlOf, err := o.check()
	if err != nil {
		return usageErr(err)
	}
	var prior []report.Report
	for _, path := range o.adds {
		f, err := os.Open(path)
		if err != nil {
			return usageErr(fmt.Errorf("--add %s: %w", path, err))
		}
		d, err := report.ReadJSON(f)
		f.Close()
		if err != nil {
			return usageErr(fmt.Errorf("--add %s: %w", path, err))
		}
		prior = append(prior, d.Variants...)
	}
	table := io.Writer(os.Stdout)
	if o.jsonOut == "-" || o.htmlOut == "-" {
		table = os.Stderr
	}
	reports := prior
	for _, bo := range opts {
		if ctx.Err() != nil {
			break
		}
		m, merr := bench.ServerModel(ctx, nil, bo.URL)
		if bo.Model == "" {
			bo.Model = m.ID
		}
		vocab := o.vocab
		if vocab == 0 {
			vocab = workload.DefaultVocab
			if merr == nil && m.VocabSize > 0 {
				vocab = m.VocabSize
			}
		}
		reqs, err := wlOf(vocab)
		if err != nil {
			return usageErr(err)
		}
		bo.Requests = reqs
		if !o.noProgress && term.IsTerminal(int(os.Stderr.Fd())) {
			bo.Progress = os.Stderr
		}
		fmt.Fprintf(os.Stderr, "kvx bench: %s: %d requests (%s)\n", bo.URL, len(reqs), loadWords(bo))
		rep, err := bench.Run(ctx, bo)
		if err != nil {
			return usageErr(err)
		}
		rep.ResolvedConfig = o.resolved(vocab)
		reports = append(reports, rep)
	}
	if err := report.WriteTable(table, reports); err != nil {
		return err
	}
	for _, r := range reports {
		if r.Bench == nil {
			continue
		}
		for _, n := range r.Bench.Notes {
			fmt.Fprintf(table, "%s: note: %s\n", r.Variant, n)
		}
		for _, f := range append(r.Requests.Rejections[:min(3, len(r.Requests.Rejections))], r.Requests.Failures[:min(3, len(r.Requests.Failures))]...) {
			fmt.Fprintf(table, "%s: request %d: %s\n", r.Variant, f.ID, f.Reason)
		}
	}
	return writeDocument(reports, "kvx bench "+strings.Join(o.urls, " "), o.jsonOut, o.htmlOut, nil)
}

func loadWords(o bench.Options) string {
	switch o.Load {
	case report.LoadRate:
		return fmt.Sprintf("%g per second", o.Rate)
	case report.LoadConcurrency:
		return fmt.Sprintf("%d in flight", o.Concurrency)
	}
	return "at the trace's timestamps"
}

// check checks every flag and returns the options of each --url (their
// Requests left to fill) and how to make the workload for a vocabulary.
// Errors name the flag, the value and what is allowed, all at once.
func (o *benchOpts) check() ([]bench.Options, func(vocab int) ([]workload.Request, error), error) {
	var errs []error
	if len(o.urls) == 0 {
		errs = append(errs, errors.New("--url is required: the server's base URL, e.g. --url http://127.0.0.1:8000"))
	}
	if len(o.names) > 0 && len(o.names) != len(o.urls) {
		errs = append(errs, fmt.Errorf("--name given %d times for %d --url: one per --url, or none", len(o.names), len(o.urls)))
	}
	if o.arrivals != "poisson" && o.arrivals != "constant" {
		errs = append(errs, fmt.Errorf("--arrivals %q: want poisson or constant", o.arrivals))
	}
	if o.vocab < 0 || o.vocab > workload.MaxVocab {
		errs = append(errs, fmt.Errorf("--vocab %d: must be in [2, %d] (0: the server's)", o.vocab, workload.MaxVocab))
	}
	var extra map[string]any
	if o.extraBody != "" {
		if err := json.Unmarshal([]byte(o.extraBody), &extra); err != nil || extra == nil {
			errs = append(errs, fmt.Errorf("--extra-body %q: want a JSON object: %v", o.extraBody, err))
		}
	}
	if o.jsonOut == "-" && o.htmlOut == "-" {
		errs = append(errs, errors.New("--json - and --html - both write to stdout; give one of them a file"))
	}
	for _, out := range []struct{ flag, path string }{{"--json", o.jsonOut}, {"--html", o.htmlOut}} {
		if err := checkWritable(out.path); err != nil {
			errs = append(errs, fmt.Errorf("%s %s: %w", out.flag, out.path, err))
		}
	}
	load, conc := report.LoadConcurrency, o.concurrency
	switch {
	case o.rate != 0:
		load = report.LoadRate
	case o.trace != "" && conc == 0:
		load = report.LoadTimestamps
	case conc == 0:
		conc = 8
	}
	pmin, pmax, err := span("prompt-tokens", o.promptTokens)
	errs = append(errs, err)
	omin, omax, err := span("output-tokens", o.outTokens)
	errs = append(errs, err)
	var wl func(int) ([]workload.Request, error)
	if o.trace != "" {
		if _, err := os.Stat(o.trace); err != nil {
			errs = append(errs, fmt.Errorf("--trace %s: %w", o.trace, err))
		}
		wl = func(vocab int) ([]workload.Request, error) {
			reqs, err := workload.LoadTrace(o.trace, workload.TraceOptions{Format: o.format, MooncakeOptions: workload.MooncakeOptions{
				Limit: o.limit, TimeScale: o.timeScale, Vocab: vocab, Seed: o.seed, BlockTokens: o.hashBlockTokens}})
			if err != nil {
				return nil, fmt.Errorf("--trace %s: %w", o.trace, err)
			}
			return reqs, nil
		}
	} else {
		wl = func(vocab int) ([]workload.Request, error) {
			reqs, err := workload.Generate(workload.GenOptions{Requests: o.requests, PromptMin: pmin, PromptMax: pmax,
				OutputMin: omin, OutputMax: omax, SharedPrefix: o.sharedPrefix, SharedGroups: o.groups, Vocab: vocab, Seed: o.seed})
			var oe *workload.OptionError
			if errors.As(err, &oe) {
				return nil, fmt.Errorf("generated prompts: %s = %v: %s (flags --requests, --prompt-tokens, --output-tokens, --shared-prefix-tokens, --shared-prefix-groups, --vocab)", oe.Field, oe.Value, oe.Limit)
			}
			return reqs, err
		}
	}
	var opts []bench.Options
	for i, u := range o.urls {
		bo := bench.Options{URL: u, Model: o.model, Load: load, Rate: o.rate, Constant: o.arrivals == "constant", Seed: o.seed,
			Concurrency: conc, Warmup: o.warmup, Flush: o.flush, Prime: o.prime, SLO: o.slo, IgnoreEOS: o.ignoreEOS,
			ExtraBody: extra, RequestTimeout: o.reqTimeout, Duration: o.duration}
		if len(o.names) == len(o.urls) {
			bo.Name = o.names[i]
		}
		// Check everything but the workload, which needs the server's
		// vocabulary: a placeholder request stands in for it.
		probe := bo
		probe.Requests = []workload.Request{{Prompt: []int32{0}, OutputLen: 1}}
		if err := probe.Check(); err != nil {
			errs = append(errs, err)
			continue
		}
		bo.URL = probe.URL
		opts = append(opts, bo)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, nil, err
	}
	// The workload's own options, checked once before any server is loaded.
	if _, err := wl(max(o.vocab, workload.DefaultVocab)); err != nil {
		return nil, nil, err
	}
	return opts, wl, nil
}

// resolved records the bench's settings in the report's resolved_config,
// under bench.* keys.
func (o *benchOpts) resolved(vocab int) map[string]any {
	m := map[string]any{
		"bench.vocab": vocab, "bench.seed": o.seed, "bench.rate": o.rate, "bench.arrivals": o.arrivals,
		"bench.concurrency": o.concurrency, "bench.warmup": o.warmup, "bench.flush": o.flush, "bench.prime": o.prime,
		"bench.ignore_eos": o.ignoreEOS, "bench.slo_ttft_ms": o.slo.TTFTMs, "bench.slo_tpot_ms": o.slo.TPOTMs, "bench.slo_e2e_ms": o.slo.E2EMs,
	}
	if o.trace != "" {
		m["bench.trace"], m["bench.format"], m["bench.time_scale"], m["bench.limit"] = o.trace, o.format, o.timeScale, o.limit
	} else {
		m["bench.requests"], m["bench.prompt_tokens"], m["bench.output_tokens"] = o.requests, o.promptTokens, o.outTokens
		m["bench.shared_prefix_tokens"], m["bench.shared_prefix_groups"] = o.sharedPrefix, o.groups
	}
	return m
}
