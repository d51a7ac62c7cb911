package bench

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

	"github.com/kvx-dev/kvx/core/report"
	"github.com/kvx-dev/kvx/core/workload"
)

// Job is what kvx bench is asked, as its flags give it: the servers, the
// workload (a trace or generated prompts), the load, the protocol and
// where the report goes. Check checks it; Run measures each server in turn
// on the same workload.
type Job struct {
	URLs, Names []string
	Model       string
	// workload
	Trace, Format           string
	TimeScale               float64
	Limit, HashBlockTokens  int
	Requests                int
	PromptTokens, OutTokens string // N or MIN-MAX
	SharedPrefix, Groups    int
	Vocab                   int // 0: the server's
	Seed                    uint64
	// load
	Rate        float64
	Arrivals    string // poisson or constant
	Concurrency int
	// protocol
	Warmup       int
	Flush, Prime bool
	SLO          report.SLO
	IgnoreEOS    bool
	ExtraBody    string // a JSON object
	ReqTimeout   time.Duration
	Duration     time.Duration
	// output
	JSONOut, HTMLOut string

	opts []Options                                   // per URL, Requests left to fill (Check)
	wl   func(vocab int) ([]workload.Request, error) // the workload for a vocabulary (Check)
}

// Run measures each server of a checked Job in turn (Check first), on the
// workload made for the server's vocabulary (Vocab, else the vocab_size its
// /v1/models says, else workload.DefaultVocab), and returns one report per
// server, in order, with the job's settings as its resolved config; it
// stops early, with the reports so far, when ctx ends. It says on notices
// what it sends where, and draws progress bars on progress when not nil.
// Its errors are the job's: a workload the server's vocabulary refuses, or
// options Run refuses.
func (j *Job) Run(ctx context.Context, progress, notices io.Writer) ([]report.Report, error) {
	if j.wl == nil {
		return nil, errors.New("bench: Job.Run before a Check that passed")
	}
	var reports []report.Report
	for _, bo := range j.opts {
		if ctx.Err() != nil {
			break
		}
		m, merr := ServerModel(ctx, nil, bo.URL)
		if bo.Model == "" {
			bo.Model = m.ID
		}
		vocab := j.Vocab
		if vocab == 0 {
			vocab = workload.DefaultVocab
			if merr == nil && m.VocabSize > 0 {
				vocab = m.VocabSize
			}
		}
		reqs, err := j.wl(vocab)
		if err != nil {
			return reports, err
		}
		bo.Requests = reqs
		bo.Progress = progress
		fmt.Fprintf(notices, "kvx bench: %s: %d requests (%s)\n", bo.URL, len(reqs), bo.loadWords())
		rep, err := Run(ctx, bo)
		if err != nil {
			return reports, err
		}
		rep.ResolvedConfig = j.resolved(vocab)
		reports = append(reports, rep)
	}
	return reports, nil
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

func (o Options) loadWords() string {
	switch o.Load {
	case report.LoadRate:
		return fmt.Sprintf("%g per second", o.Rate)
	case report.LoadConcurrency:
		return fmt.Sprintf("%d in flight", o.Concurrency)
	}
	return "at the trace's timestamps"
}

// Check checks every setting and keeps, for Run, the options of each URL
// and how to make the workload for a vocabulary. Errors name the flag, the
// value and what is allowed, all at once.
func (o *Job) Check() error {
	var errs []error
	if len(o.URLs) == 0 {
		errs = append(errs, errors.New("--url is required: the server's base URL, e.g. --url http://127.0.0.1:8000"))
	}
	if len(o.Names) > 0 && len(o.Names) != len(o.URLs) {
		errs = append(errs, fmt.Errorf("--name given %d times for %d --url: one per --url, or none", len(o.Names), len(o.URLs)))
	}
	if o.Arrivals != "poisson" && o.Arrivals != "constant" {
		errs = append(errs, fmt.Errorf("--arrivals %q: want poisson or constant", o.Arrivals))
	}
	if o.Vocab < 0 || o.Vocab > workload.MaxVocab {
		errs = append(errs, fmt.Errorf("--vocab %d: must be in [2, %d] (0: the server's)", o.Vocab, workload.MaxVocab))
	}
	var extra map[string]any
	if o.ExtraBody != "" {
		if err := json.Unmarshal([]byte(o.ExtraBody), &extra); err != nil || extra == nil {
			errs = append(errs, fmt.Errorf("--extra-body %q: want a JSON object: %v", o.ExtraBody, err))
		}
	}
	errs = append(errs, report.CheckOutputs(o.JSONOut, o.HTMLOut)...)
	load, conc := report.LoadConcurrency, o.Concurrency
	switch {
	case o.Rate != 0:
		load = report.LoadRate
	case o.Trace != "" && conc == 0:
		load = report.LoadTimestamps
	case conc == 0:
		conc = 8
	}
	pmin, pmax, err := span("prompt-tokens", o.PromptTokens)
	errs = append(errs, err)
	omin, omax, err := span("output-tokens", o.OutTokens)
	errs = append(errs, err)
	var wl func(int) ([]workload.Request, error)
	if o.Trace != "" {
		if _, err := os.Stat(o.Trace); err != nil {
			errs = append(errs, fmt.Errorf("--trace %s: %w", o.Trace, err))
		}
		wl = func(vocab int) ([]workload.Request, error) {
			reqs, err := workload.LoadTrace(o.Trace, workload.TraceOptions{Format: o.Format, MooncakeOptions: workload.MooncakeOptions{
				Limit: o.Limit, TimeScale: o.TimeScale, Vocab: vocab, Seed: o.Seed, BlockTokens: o.HashBlockTokens}})
			if err != nil {
				return nil, fmt.Errorf("--trace %s: %w", o.Trace, err)
			}
			return reqs, nil
		}
	} else {
		wl = func(vocab int) ([]workload.Request, error) {
			reqs, err := workload.Generate(workload.GenOptions{Requests: o.Requests, PromptMin: pmin, PromptMax: pmax,
				OutputMin: omin, OutputMax: omax, SharedPrefix: o.SharedPrefix, SharedGroups: o.Groups, Vocab: vocab, Seed: o.Seed})
			var oe *workload.OptionError
			if errors.As(err, &oe) {
				return nil, fmt.Errorf("generated prompts: %s = %v: %s (flags --requests, --prompt-tokens, --output-tokens, --shared-prefix-tokens, --shared-prefix-groups, --vocab)", oe.Field, oe.Value, oe.Limit)
			}
			return reqs, err
		}
	}
	var opts []Options
	for i, u := range o.URLs {
		bo := Options{URL: u, Model: o.Model, Load: load, Rate: o.Rate, Constant: o.Arrivals == "constant", Seed: o.Seed,
			Concurrency: conc, Warmup: o.Warmup, Flush: o.Flush, Prime: o.Prime, SLO: o.SLO, IgnoreEOS: o.IgnoreEOS,
			ExtraBody: extra, RequestTimeout: o.ReqTimeout, Duration: o.Duration}
		if len(o.Names) == len(o.URLs) {
			bo.Name = o.Names[i]
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
		return err
	}
	// The workload's own options, checked once before any server is loaded.
	if _, err := wl(max(o.Vocab, workload.DefaultVocab)); err != nil {
		return err
	}
	o.opts, o.wl = opts, wl
	return nil
}

// resolved records the bench's settings in the report's resolved_config,
// under bench.* keys.
func (o *Job) resolved(vocab int) map[string]any {
	m := map[string]any{
		"bench.vocab": vocab, "bench.seed": o.Seed, "bench.rate": o.Rate, "bench.arrivals": o.Arrivals,
		"bench.concurrency": o.Concurrency, "bench.warmup": o.Warmup, "bench.flush": o.Flush, "bench.prime": o.Prime,
		"bench.ignore_eos": o.IgnoreEOS, "bench.slo_ttft_ms": o.SLO.TTFTMs, "bench.slo_tpot_ms": o.SLO.TPOTMs, "bench.slo_e2e_ms": o.SLO.E2EMs,
	}
	if o.Trace != "" {
		m["bench.trace"], m["bench.format"], m["bench.time_scale"], m["bench.limit"] = o.Trace, o.Format, o.TimeScale, o.Limit
	} else {
		m["bench.requests"], m["bench.prompt_tokens"], m["bench.output_tokens"] = o.Requests, o.PromptTokens, o.OutTokens
		m["bench.shared_prefix_tokens"], m["bench.shared_prefix_groups"] = o.SharedPrefix, o.Groups
	}
	return m
}
