package generate

import (
	"strings"
	"testing"
)

// TestPromptCacheSalt: a prompts line may carry cache_salt (a non-empty
// string of at most 256 bytes) into the request.
func TestPromptCacheSalt(t *testing.T) {
	lim := Limits{Vocab: 1000, MaxSeqLen: 100, Model: "m"}
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

// TestPromptMaxTokensOverflow: max_tokens near 2^63 is refused against
// max_seq_len (prompt + max_tokens once overflowed past the check).
func TestPromptMaxTokensOverflow(t *testing.T) {
	lim := Limits{Vocab: 1000, MaxSeqLen: 100, Model: "m"}
	for _, mt := range []string{"9223372036854775807", "9223372036854775806", "99"} {
		if p, msg := parsePrompt([]byte(`{"prompt_ids": [1, 2], "max_tokens": `+mt+`}`), lim); !strings.Contains(msg, "exceed max_seq_len 100 (at most 98 for this prompt)") {
			t.Errorf("max_tokens %s: %+v, %q; want it refused against max_seq_len", mt, p, msg)
		}
	}
	if _, msg := parsePrompt([]byte(`{"prompt_ids": [1, 2], "max_tokens": 98}`), lim); msg != "" {
		t.Errorf("max_tokens 98 of 100: %q, want accepted", msg)
	}
}
