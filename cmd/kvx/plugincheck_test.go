package main

import (
	"strings"
	"testing"
)

// serve and generate check the plugins before they start, as run does: a
// missing plugin binary is a configuration error (exit 2) naming it.
func TestMissingPluginExit2(t *testing.T) {
	const missing = "/nonexistent/kvx-cachemgr-missing"
	for _, args := range [][]string{
		{"serve", "-c", "../../scenarios/hf-llama.yaml", "--port", "0", "--set", "cache_manager=" + missing},
		{"generate", "-c", "../../scenarios/hf-llama.yaml", "--prompts", "../../device/hf/testdata/llama/prompts.jsonl", "--set", "cache_manager=" + missing},
		{"run", "-c", "../../scenarios/hf-llama.yaml", "--set", "cache_manager=" + missing},
	} {
		out, stderr, code := kvx(t, args...)
		if code != 2 || !strings.Contains(stderr, missing) {
			t.Errorf("kvx %s with a missing plugin: exit %d, want 2 naming %s\n%s%s", args[0], code, missing, out, stderr)
		}
	}
}
