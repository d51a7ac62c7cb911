package workload

import (
	"errors"
	"math"
	"runtime"
	"slices"
	"strings"
	"testing"

	"pgregory.net/rapid"
)

func generate(t testing.TB, opt GenOptions) []Request {
	t.Helper()
	reqs, err := Generate(opt)
	if err != nil {
		t.Fatalf("Generate(%+v): %v", opt, err)
	}
	return reqs
}

// Lengths stay in bounds, each group's prompts share exactly the prefix,
// tails are unique, and the same options give the same requests.
func TestGenerateProperties(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		pmin := rapid.IntRange(1, 60).Draw(t, "prompt_min")
		opt := GenOptions{
			Requests:     rapid.IntRange(1, 40).Draw(t, "requests"),
			Rate:         rapid.SampledFrom([]float64{0, 0.5, 100}).Draw(t, "rate"),
			PromptMin:    pmin,
			PromptMax:    rapid.IntRange(pmin, 80).Draw(t, "prompt_max"),
			OutputMin:    rapid.IntRange(1, 5).Draw(t, "output_min"),
			SharedPrefix: rapid.IntRange(0, pmin).Draw(t, "shared_prefix"),
			SharedGroups: rapid.IntRange(0, 4).Draw(t, "shared_groups"),
			Vocab:        rapid.SampledFrom([]int{0, 2, 100}).Draw(t, "vocab"),
			Seed:         rapid.Uint64().Draw(t, "seed"),
		}
		opt.OutputMax = opt.OutputMin + rapid.IntRange(0, 5).Draw(t, "output_span")
		reqs, err := Generate(opt)
		if err != nil {
			t.Fatal(err)
		}
		again, _ := Generate(opt)
		vocab := cmpOr(opt.Vocab, DefaultVocab)
		groups := max(opt.SharedGroups, 1)
		var last int64
		for i, r := range reqs {
			if r.ID != uint64(i) || len(r.Prompt) < opt.PromptMin || len(r.Prompt) > opt.PromptMax || cap(r.Prompt) != len(r.Prompt) ||
				r.OutputLen < opt.OutputMin || r.OutputLen > opt.OutputMax || r.Arrival < last || (opt.Rate == 0 && r.Arrival != 0) {
				t.Fatalf("request %d = ID %d, prompt %d (cap %d), output %d, arrival %d (previous %d): out of bounds",
					i, r.ID, len(r.Prompt), cap(r.Prompt), r.OutputLen, r.Arrival, last)
			}
			last = r.Arrival
			for j, tok := range r.Prompt {
				if tok < 0 || int(tok) >= vocab {
					t.Fatalf("request %d token %d = %d, want in [0, %d)", i, j, tok, vocab)
				}
			}
			a := again[i]
			if a.Arrival != r.Arrival || a.OutputLen != r.OutputLen || a.Group != r.Group || !slices.Equal(a.Prompt, r.Prompt) {
				t.Fatalf("request %d differs between two runs with the same options", i)
			}
			if opt.SharedPrefix == 0 {
				if r.Group != "" {
					t.Fatalf("request %d has group %q without a shared prefix", i, r.Group)
				}
				continue
			}
			if i >= groups {
				if prev := reqs[i-groups]; !slices.Equal(r.Prompt[:opt.SharedPrefix], prev.Prompt[:opt.SharedPrefix]) || r.Group != prev.Group {
					t.Fatalf("requests %d and %d are in one group but their prefixes differ", i-groups, i)
				}
			}
		}
	})
}

func cmpOr(v, def int) int {
	if v == 0 {
		return def
	}
	return v
}

func TestGenerateGroupsAndTails(t *testing.T) {
	reqs := generate(t, GenOptions{Requests: 9, PromptMin: 300, PromptMax: 400, OutputMin: 1, OutputMax: 1, SharedPrefix: 256, SharedGroups: 3, Seed: 5})
	for i, r := range reqs {
		if want := []string{"prefix-0", "prefix-1", "prefix-2"}[i%3]; r.Group != want {
			t.Errorf("request %d group = %q, want %q", i, r.Group, want)
		}
		for j := range i {
			o := reqs[j]
			same := slices.Equal(r.Prompt[:256], o.Prompt[:256])
			if same != (i%3 == j%3) {
				t.Errorf("requests %d and %d: prefixes equal = %v, want %v", j, i, same, i%3 == j%3)
			}
			if slices.Equal(r.Prompt[256:300], o.Prompt[256:300]) {
				t.Errorf("requests %d and %d share tokens after the shared prefix", j, i)
			}
		}
	}
	// A prompt that is all prefix aliases the group's array.
	all := generate(t, GenOptions{Requests: 4, PromptMin: 64, PromptMax: 64, OutputMin: 1, OutputMax: 1, SharedPrefix: 64, SharedGroups: 2})
	if &all[0].Prompt[0] != &all[2].Prompt[0] || &all[0].Prompt[0] == &all[1].Prompt[0] {
		t.Error("whole-prefix prompts: want requests 0 and 2 to share one array and 1 another")
	}
	if other := generate(t, GenOptions{Requests: 9, PromptMin: 300, PromptMax: 400, OutputMin: 1, OutputMax: 1, SharedPrefix: 256, SharedGroups: 3, Seed: 6}); slices.Equal(other[0].Prompt, reqs[0].Prompt) {
		t.Error("seeds 5 and 6 give the same prompt")
	}
}

// Open-loop arrivals are Poisson: exponential gaps with mean 1/Rate.
func TestGeneratePoisson(t *testing.T) {
	const n, rate = 20000, 50.0
	reqs := generate(t, GenOptions{Requests: n, Rate: rate, PromptMin: 1, PromptMax: 1, OutputMin: 1, OutputMax: 1, Seed: 11})
	if reqs[0].Arrival != 0 {
		t.Errorf("first arrival = %d, want 0", reqs[0].Arrival)
	}
	var sum, sq float64
	over := 0
	for i := 1; i < n; i++ {
		g := float64(reqs[i].Arrival-reqs[i-1].Arrival) / 1e9
		sum += g
		sq += g * g
		if g > 1/rate {
			over++
		}
	}
	mean := sum / (n - 1)
	sd := math.Sqrt(sq/(n-1) - mean*mean)
	// Exponential: mean = sd = 1/rate, P(gap > mean) = 1/e.
	if math.Abs(mean*rate-1) > 0.03 || math.Abs(sd*rate-1) > 0.05 || math.Abs(float64(over)/(n-1)-1/math.E) > 0.02 {
		t.Errorf("gaps: mean %.4g s, sd %.4g s, %.3f above the mean; want %.4g, %.4g, %.3f", mean, sd, float64(over)/(n-1), 1/rate, 1/rate, 1/math.E)
	}
}

// Prompt and output lengths cover their ranges about uniformly.
func TestGenerateUniformLengths(t *testing.T) {
	const n = 8000
	reqs := generate(t, GenOptions{Requests: n, PromptMin: 10, PromptMax: 13, OutputMin: 100, OutputMax: 103, Seed: 2})
	var p, o [4]int
	for _, r := range reqs {
		p[len(r.Prompt)-10]++
		o[r.OutputLen-100]++
	}
	for k := range 4 {
		if p[k] < n/4*9/10 || p[k] > n/4*11/10 || o[k] < n/4*9/10 || o[k] > n/4*11/10 {
			t.Errorf("length counts: prompts %v, outputs %v; want about %d each", p, o, n/4)
			break
		}
	}
}

func TestGenerateWorkloadClosedLoop(t *testing.T) {
	w, err := GenerateWorkload(GenOptions{Requests: 5, Concurrency: 2, PromptMin: 4, PromptMax: 8, OutputMin: 1, OutputMax: 2})
	if err != nil {
		t.Fatal(err)
	}
	if w.Concurrency != 2 || len(w.Requests) != 5 {
		t.Fatalf("GenerateWorkload = %d requests, concurrency %d; want 5, 2", len(w.Requests), w.Concurrency)
	}
	for i, r := range w.Requests {
		if r.Arrival != 0 {
			t.Errorf("closed loop: request %d arrival %d, want 0", i, r.Arrival)
		}
	}
	if _, err := GenerateWorkload(GenOptions{}); err == nil {
		t.Error("GenerateWorkload(zero options) succeeded, want an error")
	}
}

func TestGenerateOptionErrors(t *testing.T) {
	ok := GenOptions{Requests: 4, PromptMin: 10, PromptMax: 20, OutputMin: 1, OutputMax: 2}
	tests := []struct {
		name  string
		edit  func(*GenOptions)
		field string
		limit string
	}{
		{"no requests", func(o *GenOptions) { o.Requests = 0 }, "requests", ">= 1"},
		{"negative concurrency", func(o *GenOptions) { o.Concurrency = -1 }, "concurrency", ">= 0"},
		{"negative rate", func(o *GenOptions) { o.Rate = -1 }, "rate", ">= 0"},
		{"NaN rate", func(o *GenOptions) { o.Rate = math.NaN() }, "rate", "finite"},
		{"infinite rate", func(o *GenOptions) { o.Rate = math.Inf(1) }, "rate", "finite"},
		{"rate with concurrency", func(o *GenOptions) { o.Rate, o.Concurrency = 5, 2 }, "rate", "concurrency (2)"},
		{"rate too low", func(o *GenOptions) { o.Rate = 1e-12 }, "rate", "too low"},
		{"prompt_min 0", func(o *GenOptions) { o.PromptMin = 0 }, "prompt_min", ">= 1"},
		{"prompt_min > prompt_max", func(o *GenOptions) { o.PromptMin = 30 }, "prompt_max", ">= prompt_min (30)"},
		{"too many tokens", func(o *GenOptions) { o.Requests, o.PromptMax = 1<<20, 1<<11 }, "prompt_max", "exceeds 1073741824"},
		{"output_min 0", func(o *GenOptions) { o.OutputMin = 0 }, "output_min", ">= 1"},
		{"output_min > output_max", func(o *GenOptions) { o.OutputMin = 3 }, "output_max", ">= output_min (3)"},
		{"negative shared_prefix", func(o *GenOptions) { o.SharedPrefix = -1 }, "shared_prefix", ">= 0"},
		{"shared_prefix > prompt_min", func(o *GenOptions) { o.SharedPrefix = 11 }, "shared_prefix", "<= prompt_min (10)"},
		{"negative shared_groups", func(o *GenOptions) { o.SharedGroups = -2 }, "shared_groups", ">= 0"},
		{"vocab 1", func(o *GenOptions) { o.Vocab = 1 }, "vocab", "[2, 2147483648]"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			opt := ok
			tc.edit(&opt)
			reqs, err := Generate(opt)
			var oe *OptionError
			if !errors.As(err, &oe) || reqs != nil {
				t.Fatalf("Generate(%+v) = %d requests, %v; want an *OptionError", opt, len(reqs), err)
			}
			if oe.Field != tc.field || !strings.Contains(oe.Limit, tc.limit) || !strings.HasPrefix(err.Error(), "workload: "+tc.field+" = ") {
				t.Errorf("error %q (field %q, limit %q); want field %q, limit containing %q", err, oe.Field, oe.Limit, tc.field, tc.limit)
			}
		})
	}
	if _, err := Generate(ok); err != nil {
		t.Fatalf("Generate(valid options) = %v", err)
	}
}

// Seed A's shape generates with the documented size and no memory beyond
// the prompts themselves.
func TestLongContext(t *testing.T) {
	if testing.Short() {
		t.Skip("allocates 161 MB")
	}
	opt := LongContext(1)
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	w, err := GenerateWorkload(opt)
	runtime.ReadMemStats(&after)
	if err != nil {
		t.Fatal(err)
	}
	var tokens int64
	for i, r := range w.Requests {
		if len(r.Prompt) < 146_000 || len(r.Prompt) > 169_000 || r.OutputLen != 16384 || r.Arrival != 0 {
			t.Fatalf("request %d: prompt %d, output %d, arrival %d; want 146k-169k, 16384, 0", i, len(r.Prompt), r.OutputLen, r.Arrival)
		}
		tokens += int64(len(r.Prompt))
	}
	if len(w.Requests) != 256 || w.Concurrency != 16 {
		t.Fatalf("LongContext: %d requests, concurrency %d; want 256, 16", len(w.Requests), w.Concurrency)
	}
	prompts := uint64(tokens) * 4
	if alloc := after.TotalAlloc - before.TotalAlloc; alloc > prompts+prompts/20 {
		t.Errorf("generating %d prompt bytes allocated %d bytes, want within 5%%", prompts, alloc)
	}
	t.Logf("%d requests, %d prompt tokens (%.0f MB)", len(w.Requests), tokens, float64(prompts)/1e6)
}
