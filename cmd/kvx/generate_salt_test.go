package main

import (
	"strings"
	"testing"
)

// TestPromptCacheSalt: a prompts line may carry cache_salt (a non-empty
// string of at most 256 bytes) into the request.
func TestPromptCacheSalt(t *testing.T) {
	lim := promptLimits{vocab: 1000, maxSeqLen: 100, model: "m"}
	p, msg := parsePrompt([]byte(`{"prompt_ids": [1, 2], "max_tokens": 3, "cache_salt": "tenant"}`), lim)
	if msg != "" || p.CacheSalt != "tenant" {
		t.Fatalf("parsePrompt = %+v, %q; want CacheSalt tenant", p, msg)
	}
	for _, tc := range []struct{ salt, want string }{
		{`""`, "cache_salt is empty"},
		{`7`, "cache_salt"},
		{`"` + strings.Repeat("x", 257) + `"`, "cache_salt is 257 bytes: the limit is 256"},
	} {
		if _, msg := parsePrompt([]byte(`{"prompt_ids": [1], "max_tokens": 1, "cache_salt": `+tc.salt+`}`), lim); !strings.Contains(msg, tc.want) {
			t.Errorf("cache_salt %s: %q, want it to say %q", tc.salt, msg, tc.want)
		}
	}
}
