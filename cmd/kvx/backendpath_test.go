package main

import (
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestAttentionBackendByPath: attention_backend takes a plugin binary's path
// as cache_manager does, pinned by plugin_sha256.attention_backend; the
// built-in gqa backend named by its path gives the outputs it gives by
// name, and a path that is not an executable file, or a name that is not
// registered, stops the run before it starts (exit 2) naming the key, the
// value and what is allowed.
func TestAttentionBackendByPath(t *testing.T) {
	t.Parallel()
	gqa := filepath.Join(binDir, "kvx-backend-gqa")
	body, err := os.ReadFile(gqa)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(body)
	dir := t.TempDir()
	js := filepath.Join(dir, "r.json")
	args := []string{"compare", "-c", "testdata/serve-sim.yaml", "--set", "workload.requests=24", "--set", "workload.prompt_tokens=300",
		"--set", "workload.output_tokens=12", "--set", "plugin_sha256.attention_backend=" + hex.EncodeToString(sum[:]),
		"--vary", "attention_backend=gqa," + gqa, "--no-progress", "--json", js}
	if out, stderr, code := kvx(t, args...); code != 0 {
		t.Fatalf("compare by name and by path: exit %d\n%s%s", code, out, stderr)
	}
	rs := readReports(t, js)
	if len(rs) != 2 || rs[0].Outputs.Digest == "" || rs[0].Outputs.Digest != rs[1].Outputs.Digest || rs[1].Requests.Completed != 24 {
		t.Fatalf("by name and by path: %d reports, digests %q and %q; want one digest, 24 requests each", len(rs), rs[0].Outputs.Digest, rs[len(rs)-1].Outputs.Digest)
	}
	plain := filepath.Join(dir, "kvx-backend-plain")
	if err := os.WriteFile(plain, body[:64], 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ value, want string }{
		{filepath.Join(dir, "missing"), `attention_backend: "` + filepath.Join(dir, "missing") + `" is not an executable plugin binary`},
		{plain, `attention_backend: "` + plain + `" is not an executable plugin binary`},
		{"gqa2", `attention_backend: "gqa2" (--set) is not one of dsa, mla, gqa or a plugin path`},
	} {
		_, stderr, code := kvx(t, "plan", "-c", "testdata/serve-sim.yaml", "--set", "attention_backend="+c.value)
		if code != 2 || !strings.Contains(stderr, c.want) {
			t.Errorf("attention_backend %s: exit %d, want 2 and %q\n%s", c.value, code, c.want, stderr)
		}
	}
}
