package generate

import (
	"strings"
	"testing"
)

// A prompts-file line's retention_priority and retention_duration_s reach
// the prompt (the duration in ns); bad values name the field, the value and
// the range.
func TestPromptRetention(t *testing.T) {
	lim := Limits{Vocab: 10, MaxSeqLen: 64, Model: "m"}
	p, msg := parsePrompt([]byte(`{"prompt_ids": [1, 2], "max_tokens": 3, "retention_priority": 90, "retention_duration_s": 2.5}`), lim)
	if msg != "" || p.RetentionPriority != 90 || p.RetentionDuration != 2_500_000_000 {
		t.Fatalf("parsePrompt = %+v, %q; want priority 90 for 2.5e9 ns", p, msg)
	}
	p, msg = parsePrompt([]byte(`{"prompt_ids": [1, 2], "max_tokens": 3, "retention_priority": 1}`), lim)
	if msg != "" || p.RetentionPriority != 1 || p.RetentionDuration != 0 {
		t.Fatalf("parsePrompt = %+v, %q; want priority 1 while cached", p, msg)
	}
	for _, tc := range []struct{ fields, want string }{
		{`"retention_priority": 0`, "retention_priority = 0: must be in [1, 100]"},
		{`"retention_priority": 101`, "retention_priority = 101: must be in [1, 100]"},
		{`"retention_priority": 50, "retention_duration_s": 0`, "retention_duration_s = 0: must be a number of seconds > 0"},
		{`"retention_priority": 50, "retention_duration_s": -1`, "retention_duration_s = -1: must be a number of seconds > 0"},
		{`"retention_duration_s": 5`, "retention_duration_s = 5: needs a retention_priority"},
		{`"retention_priority": "high"`, "retention_priority"},
	} {
		if _, msg := parsePrompt([]byte(`{"prompt_ids": [1], "max_tokens": 1, `+tc.fields+`}`), lim); !strings.Contains(msg, tc.want) {
			t.Errorf("line with %s: message %q, want %q", tc.fields, msg, tc.want)
		}
	}
}
