package main

import (
	"strings"
	"testing"
)

// Every command that opens an engine does so through setup.Prepare, so each
// checks the plugins before it starts, as run does: a missing plugin
// binary, or one that does not match its plugin_sha256 pin, is a
// configuration error (exit 2) that names it, in every command.
func TestMissingPluginExit2(t *testing.T) {
	t.Parallel()
	const missing = "/nonexistent/kvx-cachemgr-missing"
	const hfLlama, calib = "../../scenarios/hf-llama.yaml", "../../scenarios/calib-cpu.yaml"
	commands := [][]string{
		{"run", "-c", hfLlama},
		{"compare", "-c", hfLlama, "--vary", "kv_cache_config.tokens_per_block=16,32"},
		{"plan", "-c", hfLlama},
		{"generate", "-c", hfLlama, "--prompts", "../../device/hf/testdata/llama/prompts.jsonl"},
		{"serve", "-c", hfLlama, "--port", "0"},
		{"calibrate", "-c", calib, "--out", t.TempDir() + "/cal.json"},
	}
	for _, bad := range []struct{ set, want string }{
		{"cache_manager=" + missing, missing},
		{"plugin_sha256.cache_manager=" + strings.Repeat("ab", 32), "does not match its pinned SHA-256"},
	} {
		for _, args := range commands {
			args := append(args, "--set", bad.set)
			out, stderr, code := kvx(t, args...)
			if code != 2 || !strings.Contains(stderr, bad.want) {
				t.Errorf("kvx %s --set %s: exit %d, want 2 naming %q\n%s%s", args[0], bad.set, code, bad.want, out, stderr)
			}
		}
	}
}
