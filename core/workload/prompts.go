package workload

import (
	"fmt"
	"slices"
)

// Prompt is one request with explicit prompt tokens (kvx generate): what a
// user typed, tokenized, rather than tokens synthesized from hash ids.
type Prompt struct {
	// Tokens are the prompt's token ids, each in [0, vocab), at least one.
	Tokens []int32
	// MaxTokens is the number of tokens to generate (at least 1).
	MaxTokens int
	// TopLogprobs asks for the TopLogprobs most likely tokens of every
	// generated position (0: none).
	TopLogprobs int
	// CacheSalt isolates the prompt's prefix cache (vLLM's cache_salt); ""
	// for the shared cache.
	CacheSalt string
	// RetentionPriority (1..100, 0 = unset) and RetentionDuration (ns, 0 =
	// while cached) are the retention of the blocks it stores (Request's).
	RetentionPriority int
	RetentionDuration int64
	// Decoding is its sampling and stop conditions (Request's).
	Decoding Decoding
}

// FromPrompts returns the workload of ps in order: request i is ps[i] with
// ID i, every Arrival 0 (an open loop whose requests have all arrived), so
// the engine admits them in slice order as capacity allows. Each Prompt is
// copied (cap == len, as every Request's).
//
// Errors: an empty prompt, a token outside [0, vocab) (vocab 0 =
// DefaultVocab), MaxTokens < 1 or TopLogprobs < 0 is an *OptionError whose
// Field names the prompt ("prompts[3].tokens[7]") with the value and the
// limit; callers that want each bad prompt to fail alone check them first
// (kvx generate does, naming its input lines).
func FromPrompts(ps []Prompt, vocab int) (Workload, error) {
	v, err := resolveVocab(vocab)
	if err != nil {
		return Workload{}, err
	}
	reqs := make([]Request, len(ps))
	for i, p := range ps {
		if err := CheckPrompt(p, v); err != nil {
			oe := err.(*OptionError)
			oe.Field = fmt.Sprintf("prompts[%d].%s", i, oe.Field)
			return Workload{}, oe
		}
		reqs[i] = Request{ID: uint64(i), Prompt: slices.Clip(slices.Clone(p.Tokens)), OutputLen: p.MaxTokens, TopLogprobs: p.TopLogprobs, CacheSalt: p.CacheSalt,
			RetentionPriority: p.RetentionPriority, RetentionDuration: p.RetentionDuration, Decoding: p.Decoding}
	}
	return Workload{Requests: reqs}, nil
}

// CheckPrompt checks one prompt against a vocabulary of vocab ids. The error
// is an *OptionError whose Field is "tokens", "tokens[i]", "max_tokens",
// "top_logprobs", "retention_priority" or "retention_duration_s".
func CheckPrompt(p Prompt, vocab int) error {
	switch {
	case len(p.Tokens) == 0:
		return optErr("tokens", "[]", "a prompt needs at least 1 token")
	case p.MaxTokens < 1:
		return optErr("max_tokens", p.MaxTokens, "must be >= 1")
	case p.TopLogprobs < 0:
		return optErr("top_logprobs", p.TopLogprobs, "must be >= 0")
	case p.RetentionPriority != 0 && (p.RetentionPriority < MinRetentionPriority || p.RetentionPriority > MaxRetentionPriority):
		return optErr("retention_priority", p.RetentionPriority, "must be in [%d, %d]", MinRetentionPriority, MaxRetentionPriority)
	case p.RetentionDuration < 0:
		return optErr("retention_duration_s", float64(p.RetentionDuration)/1e9, "must be > 0")
	}
	for j, t := range p.Tokens {
		if t < 0 || int(t) >= vocab {
			return optErr(fmt.Sprintf("tokens[%d]", j), t, "outside the vocabulary [0, %d)", vocab)
		}
	}
	return nil
}
