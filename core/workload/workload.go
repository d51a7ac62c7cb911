// Package workload produces the requests that the engine replays: traces
// (ReadTrace, LoadTrace: Mooncake and Qwen-Bailian JSONL, the Azure LLM
// inference and BurstGPT CSVs; ReadMooncake for Mooncake alone), seeded synthetic scenarios
// (Generate) and explicit prompts (FromPrompts, for kvx generate). It also
// measures a request list (Analyze), notably its infinite-cache prefix hit
// ratio.
//
// Prompts are synthesized deterministically, so a run is reproducible from
// its inputs: Mooncake blocks from (seed, hash id), generated prompts from
// (seed, group) and (seed, request index). Equal hash ids give equal token
// blocks, so prefix reuse reaches the cache managers through their own token
// hashing, exactly as real traffic would.
//
// Prompts may share backing arrays (a prompt that is a prefix of another is
// a sub-slice of it). Every Prompt has cap == len, so an append by a caller
// copies instead of writing into another request's tokens, but the elements
// themselves are read-only: callers must not modify them in place.
//
// Everything in this package is pure computation over its inputs; functions
// are safe to call from several goroutines at once.
package workload

import (
	"fmt"

	"github.com/kvx-dev/kvx/plugins/v1/worker"
)

// Defaults applied where an option is left at zero.
const (
	// DefaultBlockTokens is the Mooncake hash block size in tokens.
	DefaultBlockTokens = 512
	// DefaultVocab is the token id range [0, DefaultVocab) of synthesized prompts.
	DefaultVocab = 32000
	// MaxVocab is the largest vocabulary whose ids fit in an int32.
	MaxVocab = 1 << 31
	// MaxTotalTokens bounds Requests × PromptMax in Generate (4 GiB of int32):
	// a guard against a typo that would exhaust memory.
	MaxTotalTokens = 1 << 30
)

// Request is one request to replay.
type Request struct {
	// ID is unique within a workload: the request's index (Mooncake: its
	// position among the file's requests; Generate: 0..Requests-1).
	ID uint64
	// Arrival is the arrival time in nanoseconds since the start of the run.
	// Closed-loop workloads leave it 0.
	Arrival int64
	// Prompt holds the prompt token ids, each in [0, Vocab). Read-only and
	// possibly shared with other requests; cap(Prompt) == len(Prompt).
	Prompt []int32
	// OutputLen is the number of tokens to generate (at least 1).
	OutputLen int
	// Group labels requests that share a prefix (Generate with SharedPrefix >
	// 0); empty otherwise.
	Group string
	// TopLogprobs asks for the TopLogprobs most likely tokens of every
	// generated position (FromPrompts); 0, for none, everywhere else.
	TopLogprobs int
	// Rejected, when set, says why the request can never run, found while
	// reading it (a trace line longer than max_seq_len): its Prompt is nil,
	// and the engine reports it rejected without admitting it or counting
	// its tokens.
	Rejected string
	// CacheSalt isolates the request's prefix cache (vLLM's cache_salt):
	// only requests with the same salt share blocks. "" (every generated
	// and trace workload) is the shared cache.
	CacheSalt string
	// RetentionPriority is the retention priority of the blocks the
	// request stores in the prefix cache, MinPriority..MaxPriority
	// (TensorRT-LLM's 1..100 scale); 0 takes the Workload's default.
	// RetentionDuration (ns, 0 = while cached) is how long it lasts.
	RetentionPriority int
	RetentionDuration int64
	// Decoding is how its tokens are chosen and when it stops before
	// OutputLen; the zero value is greedy to OutputLen.
	Decoding Decoding
}

// Decoding is how a request's tokens are chosen and when it ends before
// its output length (OpenAI's and vLLM's sampling and stop fields).
type Decoding struct {
	// Sampling picks its tokens (worker.Sampling without Prompt and
	// Context, which the engine fills in); nil is greedy.
	Sampling *worker.Sampling
	// Logprobs asks for the log-probability of every generated token (on
	// devices that compute them).
	Logprobs bool
	// StopIDs end the request when it generates one of them, that token
	// kept (the model's EOS ids unless ignore_eos, and stop_token_ids);
	// MinTokens: none ends it, nor can be sampled, before that many tokens
	// were generated.
	StopIDs   []int32
	MinTokens int
	// StopText, when set, is asked after every step that generated tokens
	// with every token generated so far, of which the first from were
	// asked about before: stop true ends the request after its first keep
	// tokens, keep in (from, len(generated)] (stop strings, which only a
	// caller with the tokenizer can match). It is called on the engine's
	// loop goroutine and must not block.
	StopText func(generated []int32, from int) (keep int, stop bool)
	// Stops are the stop strings StopText matches, for a caller that cuts
	// the completion's text before the one that occurs (the engine reads
	// only StopText).
	Stops []string
}

// Retention priorities (TensorRT-LLM's KvCacheRetentionConfig scale, as
// kvcache.MinPriority and MaxPriority).
const (
	MinRetentionPriority = 1
	MaxRetentionPriority = 100
)

// Retention reads a retention priority and its duration in seconds as a
// request gives them (nil: not given) into RetentionPriority and
// RetentionDuration (ns). The error is an *OptionError whose Field is
// "retention_priority" or "retention_duration_s", with the value and the
// range: a priority outside [1, 100], a duration not > 0 or above
// MaxRetentionSeconds, or a duration without a priority.
func Retention(priority *int64, durationS *float64) (int, int64, error) {
	var p int
	var d int64
	if priority != nil {
		if *priority < MinRetentionPriority || *priority > MaxRetentionPriority {
			return 0, 0, optErr("retention_priority", *priority, "must be in [%d, %d]", MinRetentionPriority, MaxRetentionPriority)
		}
		p = int(*priority)
	}
	if durationS != nil {
		s := *durationS
		if !(s > 0) || s > MaxRetentionSeconds {
			return 0, 0, optErr("retention_duration_s", s, "must be a number of seconds > 0 and <= %d", MaxRetentionSeconds)
		}
		if priority == nil {
			return 0, 0, optErr("retention_duration_s", s, "needs a retention_priority: it is how long that priority lasts")
		}
		d = max(1, int64(s*1e9))
	}
	return p, d, nil
}

// MaxRetentionSeconds bounds a retention duration (a year): its nanoseconds
// fit an int64 many times over.
const MaxRetentionSeconds = 365 * 24 * 3600

// Workload is a request list plus how the engine admits it.
type Workload struct {
	Requests []Request
	// Concurrency > 0 makes a closed loop: the engine keeps this many
	// requests in flight and admits the next (in slice order, Arrival
	// ignored) when one finishes. 0 is an open loop driven by Arrival.
	Concurrency int
	// RetentionPriority and RetentionDuration (ns) are the retention of
	// every request whose own RetentionPriority is 0 (workload.
	// retention_priority, retention_duration_s); 0 leaves the manager's
	// default.
	RetentionPriority int
	RetentionDuration int64
}

// Retention returns r's retention priority and duration (ns): its own, else
// the workload's default.
func (w Workload) Retention(r Request) (priority int, duration int64) {
	if r.RetentionPriority != 0 {
		return r.RetentionPriority, r.RetentionDuration
	}
	return w.RetentionPriority, w.RetentionDuration
}

// OptionError reports an option outside its allowed range. Field is the
// option's configuration key (snake_case), Value what was given and Limit
// what is allowed.
type OptionError struct {
	Field string
	Value any
	Limit string
}

func (e *OptionError) Error() string {
	return fmt.Sprintf("workload: %s = %v: %s", e.Field, e.Value, e.Limit)
}

func optErr(field string, value any, format string, args ...any) error {
	return &OptionError{Field: field, Value: value, Limit: fmt.Sprintf(format, args...)}
}

// resolveVocab applies the default and checks the range of a vocabulary size.
func resolveVocab(v int) (int, error) {
	switch {
	case v == 0:
		return DefaultVocab, nil
	case v < 2 || v > MaxVocab:
		return 0, optErr("vocab", v, "must be in [2, %d] (0 = %d)", MaxVocab, DefaultVocab)
	}
	return v, nil
}
