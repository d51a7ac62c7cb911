package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/kvx-dev/kvx/core/bench"
	"github.com/kvx-dev/kvx/core/report"
)

// benchOpts are the flags of kvx bench: the job, and what only the CLI
// uses.
type benchOpts struct {
	bench.Job
	adds       []string
	noProgress bool
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
	f.StringArrayVar(&o.URLs, "url", nil, "server base URL, http://host:port (repeatable: one variant per server, measured in turn)")
	f.StringArrayVar(&o.Names, "name", nil, "the variant's name, one per --url (default: the server's kind and model)")
	f.StringVar(&o.Model, "model", "", "model requests name (default: the first of GET /v1/models)")
	f.StringVar(&o.Trace, "trace", "", "replay this trace (mooncake, bailian JSONL; azure, burstgpt CSV) instead of generated prompts")
	f.StringVar(&o.Format, "format", "", "the trace's format (default: detected from its first line)")
	f.Float64Var(&o.TimeScale, "time-scale", 1, "trace replay speed: 2 sends twice as fast")
	f.IntVar(&o.Limit, "limit", 0, "read at most this many trace requests (0: all)")
	f.IntVar(&o.HashBlockTokens, "hash-block-tokens", 0, "tokens per trace hash id (0: the format's, 512 for mooncake)")
	f.IntVar(&o.Requests, "requests", 64, "generated requests")
	f.StringVar(&o.PromptTokens, "prompt-tokens", "256", "generated prompt length, N or MIN-MAX (uniform)")
	f.StringVar(&o.OutTokens, "output-tokens", "64", "max_tokens asked, N or MIN-MAX (uniform)")
	f.IntVar(&o.SharedPrefix, "shared-prefix-tokens", 0, "leading prompt tokens the requests of a group share")
	f.IntVar(&o.Groups, "shared-prefix-groups", 1, "distinct shared prefixes (request i is in group i mod this)")
	f.IntVar(&o.Vocab, "vocab", 0, "prompt token ids are in [0, vocab) (0: the server's vocab_size from /v1/models when it says one, as kvx serve does, else 32000)")
	f.Uint64Var(&o.Seed, "seed", 1, "seed of the prompts and of the Poisson arrivals")
	f.Float64Var(&o.Rate, "rate", 0, "requests per second (an open loop)")
	f.StringVar(&o.Arrivals, "arrivals", "poisson", "with --rate: poisson or constant")
	f.IntVar(&o.Concurrency, "concurrency", 0, "requests in flight: a closed loop, or with --rate its cap (default 8 for generated prompts without --rate)")
	f.IntVar(&o.Warmup, "warmup", 0, "requests sent before measuring, not measured")
	f.BoolVar(&o.Flush, "flush", false, "after the warm-up, ask the server to drop its prefix cache (POST /reset_prefix_cache)")
	f.BoolVar(&o.Prime, "prime", false, "before measuring, send each shared prefix once (1 output token)")
	f.Float64Var(&o.SLO.TTFTMs, "slo-ttft-ms", 0, "goodput: a good request's TTFT is at most this (0: no bound)")
	f.Float64Var(&o.SLO.TPOTMs, "slo-tpot-ms", 0, "goodput: a good request's TPOT is at most this (0: no bound)")
	f.Float64Var(&o.SLO.E2EMs, "slo-e2e-ms", 0, "goodput: a good request's end-to-end latency is at most this (0: no bound)")
	f.BoolVar(&o.IgnoreEOS, "ignore-eos", true, "ask for exactly max_tokens tokens (ignore_eos)")
	f.StringVar(&o.ExtraBody, "extra-body", "", `a JSON object merged into every request body, e.g. '{"return_token_ids": true}' for vLLM`)
	f.DurationVar(&o.ReqTimeout, "request-timeout", bench.DefaultRequestTimeout, "bound of each request")
	f.DurationVar(&o.Duration, "duration", bench.DefaultDuration, "bound of each measured phase: past it the requests in flight fail as timeouts")
	f.StringVar(&o.JSONOut, "json", "", "write the kvx.report/v1 document to this file ('-' for stdout)")
	f.StringVar(&o.HTMLOut, "html", "", "write the report as an HTML page with charts to this file")
	f.StringArrayVar(&o.adds, "add", nil, "put the variants of this earlier kvx.report/v1 JSON first (repeatable)")
	f.BoolVar(&o.noProgress, "no-progress", false, "do not show the progress bar")
	return cmd
}

func runBench(ctx context.Context, o *benchOpts) error {
	if err := o.Check(); err != nil {
		return usageErr(err)
	}
	var reports []report.Report // --add's first
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
		reports = append(reports, d.Variants...)
	}
	table := io.Writer(os.Stdout)
	if o.JSONOut == "-" || o.HTMLOut == "-" {
		table = os.Stderr
	}
	var progress io.Writer
	if !o.noProgress && term.IsTerminal(int(os.Stderr.Fd())) {
		progress = os.Stderr
	}
	measured, err := o.Run(ctx, progress, os.Stderr)
	if err != nil {
		return usageErr(err)
	}
	reports = append(reports, measured...)
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
	return writeDocument(reports, "kvx bench "+strings.Join(o.URLs, " "), o.JSONOut, o.HTMLOut, nil, nil)
}
