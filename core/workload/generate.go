package workload

import (
	"fmt"
	"math"
)

// GenOptions describes a synthetic scenario. Zero values take the defaults
// noted; Requests, PromptMin, PromptMax, OutputMin and OutputMax must be set.
type GenOptions struct {
	Requests int
	// Concurrency > 0 makes a closed loop (the engine keeps this many
	// requests in flight; every Arrival is 0). 0 = open loop.
	Concurrency int
	// Rate is the open-loop Poisson arrival rate in requests per second;
	// 0 puts every request at t = 0. Must be 0 when Concurrency > 0.
	Rate float64
	// Prompt and output lengths are uniform in [Min, Max], inclusive.
	PromptMin, PromptMax int
	OutputMin, OutputMax int
	// SharedPrefix is the number of leading prompt tokens that every request
	// of a group shares; at most PromptMin. Request i is in group
	// i % SharedGroups. The rest of each prompt is unique to the request.
	SharedPrefix int
	// SharedGroups is the number of distinct shared prefixes; 0 = 1.
	// Ignored when SharedPrefix is 0.
	SharedGroups int
	Vocab        int // token id range [0, Vocab); 0 = DefaultVocab
	Seed         uint64
}

// LongContext returns the shape of seed A's traffic (DESIGN.md, seeds/000):
// 256 requests with 146k–169k-token prompts and 16384 output tokens, 16 in
// flight, no shared prefix (block reuse was off). Generating it holds about
// 40M prompt tokens, 161 MB of int32.
func LongContext(seed uint64) GenOptions {
	return GenOptions{
		Requests:    256,
		Concurrency: 16,
		PromptMin:   146_000,
		PromptMax:   169_000,
		OutputMin:   16384,
		OutputMax:   16384,
		Seed:        seed,
	}
}

func (o GenOptions) resolve() (GenOptions, error) {
	if o.Requests < 1 {
		return o, optErr("requests", o.Requests, "must be >= 1")
	}
	if o.Concurrency < 0 {
		return o, optErr("concurrency", o.Concurrency, "must be >= 0 (0 = open loop)")
	}
	if !(o.Rate >= 0) || math.IsInf(o.Rate, 0) {
		return o, optErr("rate", o.Rate, "must be a finite number >= 0 (0 = all requests at t = 0)")
	}
	if o.Rate > 0 && o.Concurrency > 0 {
		return o, optErr("rate", o.Rate, "must be 0 when concurrency (%d) is set: a closed loop has no arrival rate", o.Concurrency)
	}
	if o.PromptMin < 1 {
		return o, optErr("prompt_min", o.PromptMin, "must be >= 1")
	}
	if o.PromptMax < o.PromptMin {
		return o, optErr("prompt_max", o.PromptMax, "must be >= prompt_min (%d)", o.PromptMin)
	}
	if total := int64(o.Requests) * int64(o.PromptMax); total > MaxTotalTokens {
		return o, optErr("prompt_max", o.PromptMax, "requests (%d) × prompt_max = %d tokens exceeds %d", o.Requests, total, MaxTotalTokens)
	}
	if o.OutputMin < 1 {
		return o, optErr("output_min", o.OutputMin, "must be >= 1")
	}
	if o.OutputMax < o.OutputMin {
		return o, optErr("output_max", o.OutputMax, "must be >= output_min (%d)", o.OutputMin)
	}
	if o.SharedPrefix < 0 {
		return o, optErr("shared_prefix", o.SharedPrefix, "must be >= 0")
	}
	if o.SharedPrefix > o.PromptMin {
		return o, optErr("shared_prefix", o.SharedPrefix, "must be <= prompt_min (%d)", o.PromptMin)
	}
	switch {
	case o.SharedGroups < 0:
		return o, optErr("shared_groups", o.SharedGroups, "must be >= 0 (0 = 1)")
	case o.SharedGroups == 0:
		o.SharedGroups = 1
	}
	v, err := resolveVocab(o.Vocab)
	o.Vocab = v
	return o, err
}

// Generate builds the scenario's requests, deterministically from opt.Seed:
// the same options give identical requests. Request i has ID i; its prompt
// is its group's SharedPrefix tokens (synthesized from (Seed, group))
// followed by tokens unique to it (from (Seed, i)). Open-loop arrivals are a
// Poisson process of opt.Rate starting with request 0 at t = 0; with Rate 0
// or Concurrency > 0 every Arrival is 0.
//
// Memory: each prompt has its own array (prompts of one group diverge after
// the prefix, so they cannot share one), except that a prompt no longer
// than the shared prefix is a sub-slice of the group's prefix array. The
// shared-prefix tokens are synthesized once per group and copied.
//
// Errors: an invalid option is an *OptionError naming the option, the value
// and the limit.
func Generate(opt GenOptions) ([]Request, error) {
	opt, err := opt.resolve()
	if err != nil {
		return nil, err
	}
	vocab := uint64(opt.Vocab)
	groups := 0
	if opt.SharedPrefix > 0 {
		groups = min(opt.SharedGroups, opt.Requests)
	}
	prefixes := make([][]int32, groups)
	names := make([]string, groups)
	for g := range prefixes {
		prefixes[g] = make([]int32, opt.SharedPrefix)
		fillTokens(prefixes[g], streamKey(opt.Seed, domainPrefix, uint64(g)), vocab)
		names[g] = fmt.Sprintf("prefix-%d", g)
	}

	// Shapes first, sequentially, so they do not depend on scheduling.
	shape := rng{s: streamKey(opt.Seed, domainShape, 0)}
	reqs := make([]Request, opt.Requests)
	lens := make([]int, opt.Requests)
	var t float64 // seconds
	for i := range reqs {
		r := &reqs[i]
		r.ID = uint64(i)
		lens[i] = shape.intn(opt.PromptMin, opt.PromptMax)
		r.OutputLen = shape.intn(opt.OutputMin, opt.OutputMax)
		if opt.Concurrency == 0 && opt.Rate > 0 {
			if i > 0 {
				t += -math.Log1p(-shape.float()) / opt.Rate
			}
			ns := math.Round(t * 1e9)
			if ns >= math.MaxInt64 {
				return nil, optErr("rate", opt.Rate, "too low: request %d would arrive %.3g s after the start, beyond int64 nanoseconds", i, t)
			}
			r.Arrival = int64(ns)
		}
		if groups > 0 {
			r.Group = names[i%groups]
		}
	}
	parallel(len(reqs), func(i int) {
		r := &reqs[i]
		n := lens[i]
		if groups == 0 {
			r.Prompt = make([]int32, n)
			fillTokens(r.Prompt, streamKey(opt.Seed, domainUnique, uint64(i)), vocab)
			return
		}
		pre := prefixes[i%groups]
		if n <= len(pre) {
			r.Prompt = pre[:n:n]
			return
		}
		r.Prompt = make([]int32, n)
		copy(r.Prompt, pre)
		fillTokens(r.Prompt[len(pre):], streamKey(opt.Seed, domainUnique, uint64(i)), vocab)
	})
	return reqs, nil
}

// GenerateWorkload is Generate plus the admission mode: the requests and
// opt.Concurrency, ready for the engine.
func GenerateWorkload(opt GenOptions) (Workload, error) {
	reqs, err := Generate(opt)
	if err != nil {
		return Workload{}, err
	}
	return Workload{Requests: reqs, Concurrency: opt.Concurrency}, nil
}
