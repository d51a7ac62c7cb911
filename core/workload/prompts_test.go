package workload

import (
	"errors"
	"slices"
	"testing"
)

// FromPrompts keeps the prompts' order, copies their tokens (cap == len)
// and names the bad prompt, its field, the value and the limit.
func TestFromPrompts(t *testing.T) {
	toks := []int32{1, 2, 3, 0}
	wl, err := FromPrompts([]Prompt{{Tokens: toks[:3], MaxTokens: 4, TopLogprobs: 2}, {Tokens: []int32{9}, MaxTokens: 1}}, 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(wl.Requests) != 2 || wl.Concurrency != 0 {
		t.Fatalf("workload %+v", wl)
	}
	r := wl.Requests[0]
	if r.ID != 0 || wl.Requests[1].ID != 1 || !slices.Equal(r.Prompt, toks[:3]) || cap(r.Prompt) != 3 || r.OutputLen != 4 || r.TopLogprobs != 2 || r.Arrival != 0 {
		t.Errorf("request 0 = %+v", r)
	}
	toks[0] = 7
	if r.Prompt[0] != 1 {
		t.Errorf("the request shares the caller's tokens")
	}
	for _, tc := range []struct {
		p     Prompt
		field string
	}{
		{Prompt{MaxTokens: 1}, "prompts[1].tokens"},
		{Prompt{Tokens: []int32{1}}, "prompts[1].max_tokens"},
		{Prompt{Tokens: []int32{1, 10}, MaxTokens: 1}, "prompts[1].tokens[1]"},
		{Prompt{Tokens: []int32{-1}, MaxTokens: 1}, "prompts[1].tokens[0]"},
		{Prompt{Tokens: []int32{1}, MaxTokens: 1, TopLogprobs: -1}, "prompts[1].top_logprobs"},
	} {
		_, err := FromPrompts([]Prompt{{Tokens: []int32{1}, MaxTokens: 1}, tc.p}, 10)
		var oe *OptionError
		if !errors.As(err, &oe) || oe.Field != tc.field {
			t.Errorf("FromPrompts(%+v) = %v, want an OptionError on %s", tc.p, err, tc.field)
		}
	}
}
