package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/kvx-dev/kvx/core/report"
)

// TestJSONToStdoutIsOnlyJSON: --json - writes one kvx.report/v1 document to
// stdout, for run and compare alike, and the table goes to stderr.
func TestJSONToStdoutIsOnlyJSON(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{"run", "-c", "testdata/small.yaml", "--set", "isolation=inprocess", "--set", "workload.requests=5", "--json", "-"},
		{"compare", "-c", "testdata/small.yaml", "--set", "isolation=inprocess", "--set", "workload.requests=5", "--json", "-"},
	} {
		out, stderr, code := kvx(t, args...)
		if code != 0 {
			t.Fatalf("kvx %v: exit %d\n%s", args, code, stderr)
		}
		validateReport(t, args[0]+" --json -", []byte(out))
		d, err := report.ReadJSON(strings.NewReader(out))
		if err != nil {
			t.Fatalf("kvx %v: stdout is not a report: %v\n%s", args, err, out)
		}
		if want := map[string]int{"run": 1, "compare": 2}[args[0]]; len(d.Variants) != want {
			t.Errorf("kvx %s: %d variants, want %d", args[0], len(d.Variants), want)
		}
		if !strings.Contains(stderr, "outputs digest") {
			t.Errorf("kvx %v: the table is not on stderr:\n%s", args, stderr)
		}
	}
}

// TestCompareChecksEveryVariantFirst: a variant with a bad value is found
// before any variant runs: exit 2, nothing on stdout, no report written.
func TestCompareChecksEveryVariantFirst(t *testing.T) {
	t.Parallel()
	js := filepath.Join(t.TempDir(), "r.json")
	out, stderr, code := kvx(t, "compare", "-c", "testdata/small.yaml", "--vary", "max_batch_size=16,0", "--json", js)
	if code != 2 || out != "" || !strings.Contains(stderr, "max_batch_size=0") || !strings.Contains(stderr, "max_batch_size") {
		t.Errorf("exit %d, stdout %q, stderr %q; want exit 2 naming variant max_batch_size=0 before any run", code, out, stderr)
	}
	if _, err := os.Stat(js); err == nil {
		t.Errorf("a report was written though nothing should have run")
	}
}

// TestFailedVariantKeepsTheOthers: a variant whose plugin is of the wrong
// kind (a worker given as cache manager) fails at its handshake; the other
// variants' results stay in the table and the JSON, the failed one is
// marked with its error, and the exit status says bad configuration.
func TestFailedVariantKeepsTheOthers(t *testing.T) {
	t.Parallel()
	js := filepath.Join(t.TempDir(), "r.json")
	wrong := filepath.Join(binDir, "kvx-backend-gqa")
	out, stderr, code := kvx(t, "compare", "-c", "testdata/small.yaml", "--set", "workload.requests=5",
		"--vary", "cache_manager=v1,"+wrong+",v2", "--json", js)
	if code != 2 {
		t.Fatalf("exit %d, want 2 (a plugin of the wrong kind)\n%s\n%s", code, out, stderr)
	}
	if !strings.Contains(stderr, "does not serve a cache manager") {
		t.Errorf("stderr lacks the reason:\n%s", stderr)
	}
	rs := readReports(t, js)
	if len(rs) != 3 {
		t.Fatalf("%d variants in the JSON, want 3", len(rs))
	}
	for i, r := range rs {
		failed := i == 1
		if failed != (r.Status == report.StatusFailed) || failed != (r.Error != "") {
			t.Errorf("variant %s: status %q, error %q", r.Variant, r.Status, r.Error)
		}
		if !failed && (r.Requests.Completed != 5 || r.Outputs.Digest == "") {
			t.Errorf("variant %s: requests %+v, digest %q; want its full result", r.Variant, r.Requests, r.Outputs.Digest)
		}
	}
	for _, col := range []string{"cache_manager=v1", "cache_manager=v2", "cache_manager=" + wrong} {
		if !strings.Contains(out, col) {
			t.Errorf("table lacks %q:\n%s", col, out)
		}
	}
}

// TestPluginAndOutputPathsCheckedFirst: a missing or non-executable plugin
// and an unwritable output are configuration errors found before anything
// runs: exit 2, one message, no table of zeros.
func TestPluginAndOutputPathsCheckedFirst(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	noexec := filepath.Join(dir, "kvx-cachemgr-noexec")
	if err := os.WriteFile(noexec, []byte("#!/bin/sh\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	small := []string{"run", "-c", "testdata/small.yaml", "--set", "workload.requests=3"}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--set", "cache_manager=" + filepath.Join(dir, "nope")}, "no such file"},
		{[]string{"--set", "cache_manager=" + noexec}, "not executable"},
		{[]string{"--set", "attention_backend=gqa", "--set", "plugin_dirs=[" + dir + "]", "--json", filepath.Join(dir, "no", "dir", "r.json")}, "--json"},
		{[]string{"--html", dir}, "is a directory"},
		{[]string{"--json", "-", "--html", "-"}, "both write to stdout"},
	} {
		out, stderr, code := kvx(t, append(small, tc.args...)...)
		if code != 2 || out != "" || !strings.Contains(stderr, tc.want) {
			t.Errorf("kvx %v: exit %d, stdout %q, stderr %q; want exit 2, no table, a message with %q", tc.args, code, out, stderr, tc.want)
		}
	}
	// A wrong-kind plugin alone: one clear message, no table of zeros.
	out, stderr, code := kvx(t, append(small, "--set", "cache_manager="+filepath.Join(binDir, "kvx-backend-dsa"))...)
	if code != 2 || strings.Contains(out, "requests total") || !strings.Contains(stderr, "does not serve a cache manager") {
		t.Errorf("wrong-kind plugin: exit %d, stdout %q, stderr %q; want exit 2, no table, one reason", code, out, stderr)
	}
}

// TestVersion: kvx --version names the version, the plugin contract and
// the build.
func TestVersion(t *testing.T) {
	t.Parallel()
	out, stderr, code := kvx(t, "--version")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	for _, w := range []string{"kvx ", "plugin contract: cache manager v1, worker v1", "transport protocol", runtime.Version()} {
		if !strings.Contains(out, w) {
			t.Errorf("--version lacks %q:\n%s", w, out)
		}
	}
}

// TestHugeTraceLinesRejectedCheaply: trace lines of 2·10⁹ tokens are
// rejected against max_seq_len before any token is made; the others run,
// and the rejected ones count in no token total.
func TestHugeTraceLinesRejectedCheaply(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	trace := filepath.Join(dir, "t.jsonl")
	var b strings.Builder
	for i := range 5 {
		in := 1000
		if i%2 == 0 {
			in = 2_000_000_000
		}
		fmt.Fprintf(&b, `{"timestamp": %d, "input_length": %d, "output_length": 20, "hash_ids": [%d]}`+"\n", i*10, in, i)
	}
	if err := os.WriteFile(trace, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	small, err := os.ReadFile("testdata/small.yaml")
	if err != nil {
		t.Fatal(err)
	}
	base, _, _ := strings.Cut(string(small), "workload:")
	cfg := filepath.Join(dir, "c.yaml")
	if err := os.WriteFile(cfg, []byte(base+"workload:\n  trace: t.jsonl\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	js := filepath.Join(dir, "r.json")
	out, stderr, code := kvx(t, "run", "-c", cfg, "--set", "isolation=inprocess", "--json", js)
	if code != 0 {
		t.Fatalf("exit %d\n%s\n%s", code, out, stderr)
	}
	r := readReports(t, js)[0]
	if r.Requests.Total != 5 || r.Requests.Rejected != 3 || r.Requests.Completed != 2 || r.Tokens.Prompt != 2000 {
		t.Errorf("requests %+v, prompt tokens %d; want 3 rejected, 2 completed, 2000 prompt tokens", r.Requests, r.Tokens.Prompt)
	}
	for _, rj := range r.Requests.Rejections {
		if !strings.Contains(rj.Reason, "max_seq_len 8192") {
			t.Errorf("rejection %+v does not name max_seq_len", rj)
		}
	}
	if raw, _ := os.ReadFile(js); !json.Valid(raw) {
		t.Errorf("report is not JSON")
	}
}

// TestPlanPluginErrorsAreConfigErrors: plan with a missing plugin or one of
// the wrong kind exits 2, as run does.
func TestPlanPluginErrorsAreConfigErrors(t *testing.T) {
	t.Parallel()
	for _, cm := range []string{filepath.Join(t.TempDir(), "nope"), filepath.Join(binDir, "kvx-backend-dsa")} {
		if _, stderr, code := kvx(t, "plan", "-c", "testdata/small.yaml", "--set", "cache_manager="+cm); code != 2 {
			t.Errorf("plan with cache_manager %s: exit %d, want 2\n%s", cm, code, stderr)
		}
	}
}

// TestMaxTokensHintNamesMaxTokens: a max_tokens below one request is
// refused before any manager runs, saying to raise max_tokens.
func TestMaxTokensHintNamesMaxTokens(t *testing.T) {
	t.Parallel()
	for _, cmd := range []string{"plan", "run"} {
		out, stderr, code := kvx(t, cmd, "-c", "testdata/small.yaml", "--set", "kv_cache_config.max_tokens=4000")
		if code != 2 || strings.Contains(out, "requests total") || !strings.Contains(stderr, "raise kv_cache_config.max_tokens") ||
			strings.Contains(stderr, "raise the KV budget (free_gpu_memory_fraction)") {
			t.Errorf("%s with max_tokens 4000: exit %d\n%s%s", cmd, code, out, stderr)
		}
	}
}

// TestCompareCapacity: compare --capacity sweeps the load per manager and
// reports each one's capacity in the table and the JSON; under a generous
// SLO every load is kept, under a tiny one none is.
func TestCompareCapacity(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		slo  string
		want float64 // -1: none
	}{{"1e9", 16}, {"0.001", -1}} {
		js := filepath.Join(t.TempDir(), "r.json")
		out, stderr, code := kvx(t, "compare", "-c", "testdata/small.yaml", "--set", "workload.requests=12", "--set", "workload.rate=0", "--set", "isolation=inprocess",
			"--vary", "cache_manager=v1,v2", "--vary", "workload.concurrency=1,4,16",
			"--capacity", "workload.concurrency", "--slo-ttft-p95-ms", c.slo, "--json", js)
		if code != 0 {
			t.Fatalf("slo %s: exit %d\n%s\n%s", c.slo, code, out, stderr)
		}
		if !strings.Contains(out, "capacity: the most workload.concurrency kept at p95 TTFT <= ") {
			t.Errorf("slo %s: the table lacks the capacity section:\n%s", c.slo, out)
		}
		data, err := os.ReadFile(js)
		if err != nil {
			t.Fatal(err)
		}
		validateReport(t, js, data)
		d, err := report.ReadJSON(strings.NewReader(string(data)))
		if err != nil {
			t.Fatal(err)
		}
		if d.Capacity == nil || len(d.Capacity.Groups) != 2 {
			t.Fatalf("slo %s: capacity %+v, want 2 groups (v1, v2)", c.slo, d.Capacity)
		}
		for _, g := range d.Capacity.Groups {
			if len(g.Points) != 3 {
				t.Errorf("%s: %d points, want 3", g.Name, len(g.Points))
			}
			for _, p := range g.Points {
				if p.TTFTP95Ms == nil || !(*p.TTFTP95Ms > 0) {
					t.Errorf("%s at %v: p95 TTFT %v, want a measured one", g.Name, p.Load, p.TTFTP95Ms)
				}
			}
			switch {
			case c.want < 0 && g.Capacity != nil:
				t.Errorf("slo %s, %s: capacity %v, want none", c.slo, g.Name, *g.Capacity)
			case c.want >= 0 && (g.Capacity == nil || *g.Capacity != c.want):
				t.Errorf("slo %s, %s: capacity %v, want %v", c.slo, g.Name, g.Capacity, c.want)
			}
		}
	}
	for _, bad := range []struct {
		args []string
		want string
	}{
		{[]string{"--capacity", "workload.concurrency", "--vary", "workload.concurrency=1,2"}, "give the SLO as --slo-ttft-p95-ms"},
		{[]string{"--capacity", "workload.concurrency", "--slo-ttft-p95-ms", "100"}, "no --vary sweeps it"},
		{[]string{"--slo-ttft-p95-ms", "100", "--vary", "workload.concurrency=1,2"}, "give --capacity KEY too"},
		{[]string{"--capacity", "workload.concurrency", "--slo-ttft-p95-ms", "-5", "--vary", "workload.concurrency=1,2"}, "a positive number; got -5"},
	} {
		out, stderr, code := kvx(t, append([]string{"compare", "-c", "testdata/small.yaml"}, bad.args...)...)
		if code != 2 || out != "" || !strings.Contains(stderr, bad.want) {
			t.Errorf("compare %v: exit %d, stdout %q, stderr %q; want exit 2 and %q", bad.args, code, out, stderr, bad.want)
		}
	}
}
