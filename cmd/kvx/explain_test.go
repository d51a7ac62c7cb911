package main

import (
	"fmt"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestRunExplain: kvx run --explain prints, per request asked for, its
// prompt tokens, the reused ones by tier, the computed ones and why, and its
// preemptions, the same figures as its record; the JSON report carries the
// records only with --requests.
func TestRunExplain(t *testing.T) {
	t.Parallel()
	js := filepath.Join(t.TempDir(), "r.json")
	args := []string{"run", "-c", "testdata/small.yaml", "--set", "isolation=inprocess", "--set", "workload.requests=12", "--no-progress"}
	out, stderr, code := kvx(t, append(args, "--explain", "3", "--explain", "5,7", "--json", js)...)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	if rs := readReports(t, js); len(rs[0].Requests.Records) != 0 {
		t.Errorf("--explain without --requests wrote %d records into the JSON report", len(rs[0].Requests.Records))
	}
	for _, id := range []int{3, 5, 7} {
		if !strings.Contains(out, fmt.Sprintf("request %d (v2): finished", id)) {
			t.Errorf("no explanation of request %d:\n%s", id, out)
		}
	}
	_, stderr, code = kvx(t, append(args, "--explain", "5", "--requests", "--json", js)...)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	rec := readReports(t, js)[0].Requests.Records[5]
	c := rec.Cache
	if c == nil {
		t.Fatalf("record 5 has no cache use: %+v", rec)
	}
	block := out[strings.Index(out, "request 5 (v2)"):]
	for _, re := range []string{
		fmt.Sprintf(`prompt tokens +%s\n`, commas(rec.PromptTokens)),
		fmt.Sprintf(`reused +%s from the device tier, %s from the host tier\n`, commas(c.ReusedDevice), commas(c.ReusedHost)),
		fmt.Sprintf(`computed +%s`, commas(c.Computed)),
		`miss reason +` + regexp.QuoteMeta(c.Why()) + `\n`,
		fmt.Sprintf(`preemptions +%d \(recomputed %s tokens\), %d suspended`, rec.Preemptions, commas(rec.RecomputedTokens), rec.Suspensions),
	} {
		if !regexp.MustCompile(re).MatchString(block) {
			t.Errorf("explanation of request 5 does not match %q:\n%s", re, block)
		}
	}
	if rec.ReusedTokens+c.Computed != rec.PromptTokens {
		t.Errorf("record 5: reused %d + computed %d != prompt %d", rec.ReusedTokens, c.Computed, rec.PromptTokens)
	}

	for _, tc := range []struct{ arg, want string }{
		{"x", `--explain "x": not a request id (a number): the workload's 12 requests have ids 0..11`},
		{"3,12", `--explain 12: no such request: the workload's 12 requests have ids 0..11`},
		{"-1", `--explain "-1": not a request id`},
	} {
		_, stderr, code := kvx(t, append(args, "--explain", tc.arg)...)
		if code != 2 || !strings.Contains(stderr, tc.want) {
			t.Errorf("--explain %s: exit %d, stderr %q; want 2 and %q", tc.arg, code, stderr, tc.want)
		}
	}
}

// commas formats n as the report does (1,234).
func commas(n int) string {
	s := fmt.Sprint(n)
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}

// TestEvictionPolicy: lfu runs on the built-in managers, which list it
// (the refusal of a policy a manager does not list is engine's
// TestEvictionPolicyRefused, on a manager that lists none), and a value
// outside lru and lfu is refused before any run.
func TestEvictionPolicy(t *testing.T) {
	t.Parallel()
	for _, cm := range []string{"v1", "v2"} {
		out, _, code := kvx(t, "run", "-c", "testdata/small.yaml", "--set", "cache_manager="+cm, "--set", "workload.requests=4",
			"--set", "kv_cache_config.eviction_policy=lfu", "--no-progress", "--json", "-")
		if code != 0 || !strings.Contains(out, `"kv_cache_config.eviction_policy": "lfu"`) {
			t.Errorf("eviction_policy lfu on %s: exit %d; want 0 and lfu in the resolved config", cm, code)
		}
	}
	_, stderr, code := kvx(t, "run", "-c", "testdata/small.yaml", "--set", "kv_cache_config.eviction_policy=arc", "--no-progress")
	if code != 2 || !strings.Contains(stderr, `kv_cache_config.eviction_policy: "arc" (--set) is not one of lru, lfu`) {
		t.Errorf("eviction_policy arc: exit %d, stderr %q", code, stderr)
	}
}
