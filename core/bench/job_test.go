package bench

import (
	"context"
	"strings"
	"testing"
)

// TestJobCheck: every bad setting is named at once, with its flag; Run
// refuses a job that has not passed Check.
func TestJobCheck(t *testing.T) {
	j := &Job{Names: []string{"a"}, Arrivals: "burst", Vocab: -1, ExtraBody: "[1]", JSONOut: "-", HTMLOut: "-",
		PromptTokens: "9-3", OutTokens: "8", Requests: 4, Groups: 1, Seed: 1}
	err := j.Check()
	for _, w := range []string{"--url is required", "--name given 1 times for 0 --url", `--arrivals "burst"`, "--vocab -1", `--extra-body "[1]"`,
		"--json - and --html - both write to stdout", `--prompt-tokens "9-3"`} {
		if err == nil || !strings.Contains(err.Error(), w) {
			t.Errorf("Check = %v, want it to say %q", err, w)
		}
	}
	if _, err := (&Job{}).Run(context.Background(), nil, nil); err == nil {
		t.Error("Run before Check: no error")
	}
}
