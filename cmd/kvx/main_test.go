package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"maps"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/kvx-dev/kvx/core/config"
	"github.com/kvx-dev/kvx/core/report"
	"github.com/kvx-dev/kvx/core/report/pagecheck"
	"github.com/kvx-dev/kvx/core/testbin"
	"github.com/kvx-dev/kvx/plugins/v1/pluginrpc"

	"github.com/kvx-dev/kvx/cmd/kvx/internal/servetest"
)

// binDir holds kvx and every plugin binary, built once for the package.
var binDir string

// TestMain builds the binaries (testbin.Build), runs the tests, and fails
// when a plugin process of binDir outlives them all for 5 s: each test's
// own checks see only its own kvx processes' plugins (kvxCommand), this one
// every plugin of the package's binaries, whichever test left it.
//
// The tests that run kvx mostly wait on it (its plugins, their deadlines,
// a drain), so they run side by side (t.Parallel), six at once unless
// -test.parallel says otherwise, whatever the number of cores. Those whose
// check needs kvx to act within a narrow window run one after the other,
// before them: a kill between two stages' start, a reset while a stream
// runs, a 100 ms drain, one restart at a deadline of 1 or 2 s.
func TestMain(m *testing.M) {
	flag.Parse()
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == "test.parallel" })
	if !set {
		flag.Set("test.parallel", "6")
	}
	d, err := testbin.Build()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binDir = d
	code := m.Run()
	deadline := time.Now().Add(5 * time.Second)
	left, err := servetest.Plugins(binDir, nil)
	for err == nil && len(left) > 0 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
		left, err = servetest.Plugins(binDir, nil)
	}
	if len(left) > 0 {
		fmt.Fprintf(os.Stderr, "FAIL: plugin processes left after the tests: %v\n", left)
		code = 1
	}
	os.RemoveAll(d)
	os.Exit(code)
}

// started holds, for each running test, the kvx commands it made with
// kvxCommand.
var started struct {
	sync.Mutex
	cmds map[testing.TB][]*exec.Cmd
}

// kvxCommand returns the command that runs the built kvx with args for t.
// It starts in a session of its own, which the plugin processes it starts
// keep, also once orphaned (servetest.Plugins): pluginPIDs(t) lists those
// of t's own kvx processes only, so that tests that run kvx side by side
// (t.Parallel) do not see each other's plugins.
func kvxCommand(t testing.TB, args ...string) *exec.Cmd {
	cmd := exec.Command(filepath.Join(binDir, "kvx"), args...)
	servetest.NewSession(cmd)
	started.Lock()
	defer started.Unlock()
	if started.cmds == nil {
		started.cmds = map[testing.TB][]*exec.Cmd{}
	}
	if started.cmds[t] == nil {
		t.Cleanup(func() {
			started.Lock()
			defer started.Unlock()
			delete(started.cmds, t)
		})
	}
	started.cmds[t] = append(started.cmds[t], cmd)
	return cmd
}

// pluginPIDs lists the live plugin processes that t's kvx processes
// (kvxCommand) started, left running included.
func pluginPIDs(t testing.TB) []int {
	t.Helper()
	started.Lock()
	var sessions []int
	for _, cmd := range started.cmds[t] {
		if cmd.Process != nil {
			sessions = append(sessions, cmd.Process.Pid)
		}
	}
	started.Unlock()
	if len(sessions) == 0 {
		return nil
	}
	pids, err := servetest.Plugins(binDir, sessions)
	if err != nil {
		t.Skip("no /proc")
	}
	return pids
}

// kvx runs the built kvx binary and returns stdout, stderr and the exit code.
func kvx(t *testing.T, args ...string) (string, string, int) {
	t.Helper()
	cmd := kvxCommand(t, args...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code := 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("kvx %v: %v", args, err)
	}
	return out.String(), errb.String(), code
}

func readReports(t *testing.T, path string) []report.Report {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	validateReport(t, path, data)
	d, err := report.ReadJSON(bytes.NewReader(data))
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return d.Variants
}

// comparable strips what legitimately differs between two runs of the same
// configuration: wall time and the variant's own name and isolation, and
// the keys of the resolved config that the variants vary.
func comparable(r report.Report) report.Report {
	r.Variant, r.Config.Isolation = "", ""
	r.Engine.WallS, r.Engine.OverlappedSteps = 0, 0
	r.ResolvedConfig = maps.Clone(r.ResolvedConfig)
	delete(r.ResolvedConfig, "isolation")
	delete(r.ResolvedConfig, "step_overlap")
	return r
}

// TestPluginAndInprocessGiveIdenticalReports: isolation changes nothing but
// wall time, for both managers.
func TestPluginAndInprocessGiveIdenticalReports(t *testing.T) {
	t.Parallel()
	js := filepath.Join(t.TempDir(), "r.json")
	out, stderr, code := kvx(t, "compare", "-c", "testdata/small.yaml", "--vary", "cache_manager=v1,v2", "--vary", "isolation=inprocess,plugin", "--json", js)
	if code != 0 {
		t.Fatalf("exit %d\n%s\n%s", code, out, stderr)
	}
	rs := readReports(t, js)
	if len(rs) != 4 {
		t.Fatalf("%d reports, want 4", len(rs))
	}
	for i := 0; i < 4; i += 2 {
		a, b := comparable(rs[i]), comparable(rs[i+1])
		ja, _ := json.Marshal(a)
		jb, _ := json.Marshal(b)
		if !bytes.Equal(ja, jb) {
			t.Errorf("%s and %s differ:\n%s\n%s", rs[i].Variant, rs[i+1].Variant, ja, jb)
		}
		if a.Requests.Completed != a.Requests.Total || a.Invariants.Violations != 0 || a.Requests.Preemptions == 0 {
			t.Errorf("%s: requests %+v, invariants %+v; want all completed, preemptions, no violation", rs[i].Variant, a.Requests, a.Invariants)
		}
	}
	for _, col := range []string{"cache_manager=v1", "cache_manager=v2", "outputs digest", "prefix reused"} {
		if !strings.Contains(out, col) {
			t.Errorf("table lacks %q:\n%s", col, out)
		}
	}
}

// TestStepOverlapChangesNothing: plugin managers and workers that run side
// by side (the next step scheduled during the forward, in a closed loop)
// give the same report as one after the other.
func TestStepOverlapChangesNothing(t *testing.T) {
	t.Parallel()
	js := filepath.Join(t.TempDir(), "r.json")
	out, stderr, code := kvx(t, "compare", "-c", "testdata/small.yaml", "--set", "workload.concurrency=8", "--set", "workload.rate=0",
		"--vary", "step_overlap=auto,off", "--json", js)
	if code != 0 {
		t.Fatalf("exit %d\n%s\n%s", code, out, stderr)
	}
	rs := readReports(t, js)
	if len(rs) != 2 {
		t.Fatalf("%d reports, want 2", len(rs))
	}
	if rs[0].Engine.OverlappedSteps == 0 || rs[1].Engine.OverlappedSteps != 0 {
		t.Errorf("overlapped steps %d and %d; want some, then none", rs[0].Engine.OverlappedSteps, rs[1].Engine.OverlappedSteps)
	}
	a, b := comparable(rs[0]), comparable(rs[1])
	ja, _ := json.Marshal(a)
	jb, _ := json.Marshal(b)
	if !bytes.Equal(ja, jb) {
		t.Errorf("reports differ:\n%s\n%s", ja, jb)
	}
	if a.Requests.Completed != a.Requests.Total || a.Invariants.Violations != 0 {
		t.Errorf("requests %+v, invariants %+v; want all completed, no violation", a.Requests, a.Invariants)
	}
}

// TestNoOrphanPluginProcesses: after a run, and after a run interrupted with
// SIGINT, no plugin process is left.
func TestNoOrphanPluginProcesses(t *testing.T) {
	t.Parallel()
	if _, _, code := kvx(t, "run", "-c", "testdata/small.yaml", "--set", "workload.requests=10"); code != 0 {
		t.Fatalf("run exit %d", code)
	}
	if pids := pluginPIDs(t); len(pids) > 0 {
		t.Fatalf("plugin processes left after a run: %v", pids)
	}

	cmd := kvxCommand(t, "run", "-c", "testdata/small.yaml", "--set", "workload.requests=100000", "--set", "workload.rate=0")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for len(pluginPIDs(t)) < 2 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	// One process per plugin binary serves both pipeline stages.
	if n := len(pluginPIDs(t)); n != 2 {
		cmd.Process.Kill()
		t.Fatalf("%d plugin processes running, want 2 (a manager and a worker, each serving 2 stages)", n)
	}
	cmd.Process.Signal(os.Interrupt)
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		cmd.Process.Kill()
		t.Fatal("kvx did not stop within 20 s of SIGINT")
	}
	time.Sleep(200 * time.Millisecond)
	if pids := pluginPIDs(t); len(pids) > 0 {
		t.Fatalf("plugin processes left after SIGINT: %v", pids)
	}
}

// TestKilledPluginIsRestarted: kill -9 of the cache-manager plugin, or of
// the worker plugin, mid-run (each serves both pipeline stages); the engine
// restarts it, recomputes, and every request completes.
func TestKilledPluginIsRestarted(t *testing.T) {
	t.Parallel()
	for _, binary := range []string{"kvx-cachemgr-v2", "kvx-backend-dsa"} {
		t.Run(binary, func(t *testing.T) { killPluginMidRun(t, binary) })
	}
}

func killPluginMidRun(t *testing.T, binary string) {
	js := filepath.Join(t.TempDir(), "r.json")
	// At debug level kvx logs each stage's plugin instances as they become
	// ready; stage 1's worker is the last: the run is under way after it.
	cmd := kvxCommand(t, "run", "-c", "testdata/small.yaml", "--set", "workload.requests=400", "--json", js,
		"--log-level", "debug")
	var stderr syncBuffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	victim := 0
	deadline := time.Now().Add(20 * time.Second)
	for !strings.Contains(stderr.String(), "plugin instance ready: kind=worker") && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	for victim == 0 && time.Now().Before(deadline) {
		time.Sleep(300 * time.Millisecond)
		for _, pid := range pluginPIDs(t) {
			exe, _ := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid))
			if strings.HasSuffix(exe, binary) {
				victim = pid
				break
			}
		}
	}
	if victim == 0 {
		cmd.Process.Kill()
		t.Fatalf("no %s plugin process found", binary)
	}
	if err := syscall.Kill(victim, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("kvx run after kill -9 of a plugin: %v\n%s", err, stderr.String())
	}
	r := readReports(t, js)[0]
	if r.Engine.PluginRestarts < 1 {
		t.Skipf("the run finished before the kill landed (restarts %d)", r.Engine.PluginRestarts)
	}
	if r.Requests.Completed != r.Requests.Total || r.Requests.Failed != 0 || r.Invariants.Violations != 0 {
		t.Errorf("after a restart: requests %+v invariants %+v; want every request completed", r.Requests, r.Invariants)
	}
}

// TestManagerKilledWhileStagesStart: kill -9 of the cache manager right
// after stage 0's instance is ready, while stage 1 asks the same (dying)
// process for its own: the engine must start a fresh process once, not
// spend its restart budget in a millisecond on the dying one (it did: 8
// restarts, exit 1), and every request completes.
func TestManagerKilledWhileStagesStart(t *testing.T) {
	js := filepath.Join(t.TempDir(), "r.json")
	cmd := kvxCommand(t, "run", "-c", "testdata/small.yaml", "--set", "workload.requests=50", "--json", js,
		"--log-level", "debug")
	var stderr syncBuffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for !strings.Contains(stderr.String(), "plugin ready: kind=cachemanager") && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	victim := 0
	for _, pid := range pluginPIDs(t) {
		if exe, _ := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid)); strings.HasSuffix(exe, "kvx-cachemgr-v2") {
			victim = pid
		}
	}
	if victim == 0 {
		cmd.Process.Kill()
		t.Fatalf("no kvx-cachemgr-v2 process after its ready line\n%s", stderr.String())
	}
	if err := syscall.Kill(victim, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("kvx run after kill -9 of the manager during start-up: %v\n%s", err, stderr.String())
	}
	r := readReports(t, js)[0]
	if r.Requests.Completed != r.Requests.Total || r.Engine.PluginRestarts < 1 || r.Engine.PluginRestarts > 2 {
		t.Errorf("requests %+v, %d restarts; want every request completed after one or two restarts", r.Requests, r.Engine.PluginRestarts)
	}
}

// TestBadConfigExitsTwoNamingTheKey: typos, bad values and bad files are
// reported at once with the key, the value and what is allowed.
func TestBadConfigExitsTwoNamingTheKey(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{[]string{"run", "-c", "testdata/small.yaml", "--set", "max_batch_sise=4"}, []string{"max_batch_sise", "max_batch_size"}},
		{[]string{"run", "-c", "testdata/small.yaml", "--set", "kv_cache_config.free_gpu_memory_fraction=1.5"}, []string{"free_gpu_memory_fraction", "1.5"}},
		{[]string{"run", "-c", "testdata/small.yaml", "--set", "cache_manager=v9"}, []string{"cache_manager", "v9", "v2, mamba, v1"}},
		{[]string{"run", "-c", "testdata/small.yaml", "--set", "attention_backend=dsa9"}, []string{"attention_backend", "dsa9", "dsa, mla, gqa or a plugin path"}},
		{[]string{"run", "-c", "testdata/missing.yaml"}, []string{"missing.yaml"}},
		{[]string{"compare", "-c", "testdata/small.yaml", "--vary", "nonsense"}, []string{"--vary", "key=a,b"}},
		{[]string{"run", "-c", "testdata/small.yaml", "--set", "workload.requests=0", "--set", "workload.trace=testdata/nope.jsonl"}, []string{"nope.jsonl"}},
	} {
		out, stderr, code := kvx(t, tc.args...)
		if code == 0 {
			t.Errorf("kvx %v: exit 0, want non-zero", tc.args)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(stderr+out, w) {
				t.Errorf("kvx %v: message lacks %q:\n%s", tc.args, w, stderr)
			}
		}
	}
	if _, stderr, code := kvx(t, "run", "-c", "testdata/small.yaml", "--set", "max_num_tokens=-3"); code != 2 {
		t.Errorf("bad value: exit %d, want 2\n%s", code, stderr)
	}
}

// TestPlanAndPluginsCommands: plan prints every stage's budget and layout;
// plugins lists every binary with what it supports.
func TestPlanAndPluginsCommands(t *testing.T) {
	t.Parallel()
	out, stderr, code := kvx(t, "plan", "-c", "testdata/small.yaml")
	if code != 0 {
		t.Fatalf("plan exit %d: %s", code, stderr)
	}
	for _, w := range []string{"stage 0", "stage 1", "cache budget", "guaranteed tokens per sequence"} {
		if !strings.Contains(out, w) {
			t.Errorf("plan output lacks %q:\n%s", w, out)
		}
	}
	out, stderr, code = kvx(t, "plugins")
	if code != 0 {
		t.Fatalf("plugins exit %d: %s", code, stderr)
	}
	for _, w := range []string{"kvx-cachemgr-v1", "kvx-cachemgr-v2", "kvx-backend-dsa", "kvx-backend-mla", "kvx-backend-gqa", "prefix-reuse", "host-tier", "cache-salt", "kv-events",
		"explain", "retention", "eviction:lru/lfu", "contract", "features", fmt.Sprintf("wire %d", pluginrpc.Protocol),
		fmt.Sprintf("all %d", len(pluginrpc.Current().Features)), "cache_manager: v1", "cache_manager: mamba", "attention_backend: gqa"} {
		if !strings.Contains(out, w) {
			t.Errorf("plugins output lacks %q:\n%s", w, out)
		}
	}
	for line := range strings.SplitSeq(out, "\n") {
		if len(line) > 80 && !strings.HasPrefix(line, "found in ") {
			t.Errorf("plugins output line of %d columns, want at most 80 (a terminal's width):\n%s", len(line), line)
		}
	}
}

// TestBundledScenariosPlan: every bundled scenario loads and plans.
func TestBundledScenariosPlan(t *testing.T) {
	t.Parallel()
	files, err := filepath.Glob("../../scenarios/*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no scenarios: %v", err)
	}
	for _, f := range files {
		out, stderr, code := kvx(t, "plan", "-c", f)
		if code == 2 && gpuOnly(t, f) && strings.Contains(stderr, "device cuda sizes its cache from the GPU's free memory, read through NVML") {
			continue // a cuda scenario: it loaded and resolved; only the GPU machine's NVML can size it
		}
		if code != 0 {
			t.Errorf("plan %s: exit %d\n%s%s", f, code, out, stderr)
		}
	}
}

// gpuOnly reports whether scenario f runs on device cuda.
func gpuOnly(t *testing.T, f string) bool {
	t.Helper()
	b, err := os.ReadFile(f)
	if err != nil {
		t.Fatal(err)
	}
	return strings.Contains("\n"+string(b), "\ndevice: cuda\n")
}

// TestDefaultDtypesRun: kv_cache_config.dtype left at auto reaches the
// worker as a dtype it runs (a short run of the seed-A scenario's shape).
func TestDefaultDtypesRun(t *testing.T) {
	t.Parallel()
	out, stderr, code := kvx(t, "run", "-c", "../../scenarios/seed-a.yaml", "--set", "isolation=inprocess",
		"--set", "workload.requests=3", "--set", "workload.prompt_tokens=20000", "--set", "workload.output_tokens=50")
	if code != 0 {
		t.Fatalf("exit %d\n%s\n%s", code, out, stderr)
	}
}

// TestConformanceCommand: the suite runs against plugin binaries from the
// CLI, one process per check, and refuses what is not a plugin.
func TestConformanceCommand(t *testing.T) {
	t.Parallel()
	for _, bin := range []string{"kvx-cachemgr-v2", "kvx-backend-gqa"} {
		out, stderr, code := kvx(t, "conformance", filepath.Join(binDir, bin))
		if code != 0 || !strings.Contains(out, " 0 failed") || !strings.Contains(out, fmt.Sprintf("protocol %d, features %v", pluginrpc.Protocol, pluginrpc.Current().Features)) {
			t.Errorf("conformance %s: exit %d\n%s%s", bin, code, out, stderr)
		}
	}
	if _, _, code := kvx(t, "conformance", filepath.Join(binDir, "kvx")); code != 2 {
		t.Errorf("conformance of kvx itself (not a plugin): exit %d, want 2", code)
	}
	if pids := pluginPIDs(t); len(pids) > 0 {
		t.Errorf("plugin processes left after conformance: %v", pids)
	}
}

// TestHTMLReport: --html writes a self-contained page with the metadata,
// the table and the resolved config, whose charts all render in headless
// Chromium without a console error or a request for anything.
func TestHTMLReport(t *testing.T) {
	t.Parallel()
	page := filepath.Join(t.TempDir(), "r.html")
	if _, stderr, code := kvx(t, "compare", "-c", "testdata/small.yaml", "--set", "isolation=inprocess", "--set", "workload.requests=10", "--html", page); code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	data, err := os.ReadFile(page)
	if err != nil {
		t.Fatal(err)
	}
	s := string(data)
	for _, want := range []string{"cache_manager=v2", "testdata/small.yaml", "sim (h200 cost model)", "<dt>generator</dt><dd>kvx ", "<dt>date</dt><dd>20",
		"kv_cache_config.max_tokens", "24000", "compare -c testdata/small.yaml"} {
		if !strings.Contains(s, want) {
			t.Errorf("HTML report lacks %q (%d bytes)", want, len(data))
		}
	}
	p := pagecheck.Open(t, page)[0]
	for _, e := range p.Errors {
		t.Errorf("console: %s", e)
	}
	for _, u := range p.Requests {
		t.Errorf("the page asked for %s", u)
	}
	if p.Drawn == 0 || p.Drawn != p.Canvases || p.Drawn != len(p.Charts) {
		t.Errorf("kvxCharts %d, %d canvases, %d charts; want as many charts drawn as canvases", p.Drawn, p.Canvases, len(p.Charts))
	}
	for _, c := range p.Charts {
		if c.Width <= 0 || c.Height <= 0 || !c.Painted || c.Datasets == 0 || c.LegendOverlaps {
			t.Errorf("chart %q: %gx%g, painted %v, %d datasets with data, legend over the plot %v", c.Title, c.Width, c.Height, c.Painted, c.Datasets, c.LegendOverlaps)
		}
		if strings.Contains(c.Title, "engine time") {
			t.Errorf("chart %q on the sim device says engine time, not simulated time", c.Title)
		}
	}
}

// TestReportRecordsAndSeries: with --requests the JSON report has one
// record per request, consistent with the totals; every variant has the
// resolved config (every known key), the workload, latency quantiles and a
// bounded series over engine time that ends at the run's totals.
func TestReportRecordsAndSeries(t *testing.T) {
	t.Parallel()
	js := filepath.Join(t.TempDir(), "r.json")
	if _, stderr, code := kvx(t, "run", "-c", "testdata/small.yaml", "--set", "isolation=inprocess", "--set", "workload.requests=40", "--requests", "--json", js); code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	raw, err := os.ReadFile(js)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(raw), `"failures": []`) || !strings.Contains(string(raw), `"rejections": []`) {
		t.Errorf("empty rejections and failures are not written as []")
	}
	rs := readReports(t, js)
	if len(rs) != 1 {
		t.Fatalf("%d variants, want 1", len(rs))
	}
	r := rs[0]
	for _, k := range config.KnownKeys() {
		if _, ok := r.ResolvedConfig[k]; !ok {
			t.Errorf("resolved_config lacks %s", k)
		}
	}
	if got := r.ResolvedConfig["kv_cache_config.max_tokens"]; got != float64(24000) {
		t.Errorf("resolved_config kv_cache_config.max_tokens = %v, want the file's 24000", got)
	}
	if got := r.ResolvedConfig["workload.requests"]; got != float64(40) {
		t.Errorf("resolved_config workload.requests = %v, want --set's 40", got)
	}
	if r.Workload == nil || r.Workload.Requests != 40 || r.Workload.PromptTokens != r.Tokens.Prompt {
		t.Errorf("workload %+v; want 40 requests and %d prompt tokens", r.Workload, r.Tokens.Prompt)
	}
	if len(r.Requests.Records) != r.Requests.Total {
		t.Fatalf("%d records for %d requests", len(r.Requests.Records), r.Requests.Total)
	}
	var prompt, generated, reused int64
	preempt, suspend := 0, 0
	var ttft []float64
	for _, rec := range r.Requests.Records {
		if rec.Status != report.RequestFinished || rec.TTFTMs == nil || rec.E2EMs == nil || rec.FirstTokenMs == nil {
			t.Fatalf("record %+v: want a finished request with its times", rec)
		}
		if *rec.FirstTokenMs < rec.ArrivalMs || *rec.FinishMs < *rec.FirstTokenMs || math.Abs(*rec.TTFTMs-(*rec.FirstTokenMs-rec.ArrivalMs)) > 1e-6 {
			t.Errorf("record %d: arrival %v, first token %v, finish %v, ttft %v", rec.ID, rec.ArrivalMs, *rec.FirstTokenMs, *rec.FinishMs, *rec.TTFTMs)
		}
		prompt += int64(rec.PromptTokens)
		generated += int64(rec.Generated)
		reused += int64(rec.ReusedTokens)
		preempt += rec.Preemptions + rec.Suspensions
		suspend += rec.Suspensions
		ttft = append(ttft, *rec.TTFTMs)
	}
	var missTokens int64
	for _, c := range r.Tokens.MissReasons {
		missTokens += c.Tokens
	}
	if tiers := r.Tokens.PrefixReusedByTier; tiers.Device+tiers.Host != r.Tokens.PrefixReused || reused+missTokens != prompt {
		t.Errorf("prefix_reused %d by tier %+v, miss reasons' tokens %d: want the tiers to sum to it, and it and the misses to the %d prompt tokens",
			r.Tokens.PrefixReused, tiers, missTokens, prompt)
	}
	if prompt != r.Tokens.Prompt || generated != r.Tokens.Generated || reused != r.Tokens.PrefixReused || preempt != r.Requests.Preemptions || suspend != r.Requests.Suspensions {
		t.Errorf("records sum to prompt %d, generated %d, reused %d, preemptions %d (suspended %d); report says %d, %d, %d, %d (%d)",
			prompt, generated, reused, preempt, suspend, r.Tokens.Prompt, r.Tokens.Generated, r.Tokens.PrefixReused, r.Requests.Preemptions, r.Requests.Suspensions)
	}
	if r.Requests.Preemptions == 0 || reused == 0 {
		t.Errorf("preemptions %d, reused %d: the small config should exercise both", r.Requests.Preemptions, reused)
	}
	if got := report.Percentile(ttft, 99); math.Abs(got-r.Latency.TTFTP99) > 1e-6 {
		t.Errorf("records' TTFT p99 %v, report %v", got, r.Latency.TTFTP99)
	}
	q := r.Latency.Quantiles
	if q == nil || q.TTFTMs[len(q.TTFTMs)-1] != slices.Max(ttft) {
		t.Errorf("latency quantiles %+v; want the distribution ending at the largest TTFT %v", q, slices.Max(ttft))
	}
	s := r.Series
	if s == nil || len(s.TS) == 0 || len(s.TS) > report.MaxPoints || len(s.KVUsage) != len(s.TS) {
		t.Fatalf("series %+v; want 1..%d points with KV usage", s, report.MaxPoints)
	}
	n := len(s.TS)
	if s.TS[n-1] != r.Throughput.EngineS || s.Preemptions[n-1] != r.Requests.Preemptions || math.Abs(s.HitRate[n-1]-r.Tokens.HitRate) > 1e-12 {
		t.Errorf("series ends at %v s, %d preemptions, hit rate %v; the report: %v s, %d, %v", s.TS[n-1], s.Preemptions[n-1], s.HitRate[n-1], r.Throughput.EngineS, r.Requests.Preemptions, r.Tokens.HitRate)
	}
	// Two pipeline stages: two micro-batches of at most max_batch_size 16.
	if slices.Max(s.KVUsage) != r.KV.PeakUsage || slices.Max(s.Running) == 0 || slices.Max(s.Running) > 2*16 {
		t.Errorf("series peaks: KV %v (report %v), running %d (2 stages, max_batch_size 16)", slices.Max(s.KVUsage), r.KV.PeakUsage, slices.Max(s.Running))
	}
}

// TestCPUScenariosSameOutputs: on the bundled cpu scenarios (real kernels on
// real KV, as plugins) the outputs digest is the same whatever the manager
// and with block reuse on or off, and each variant does what it is named for.
func TestCPUScenariosSameOutputs(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		scenario string
		vary     []string
		reusers  int // variants that must reuse a prefix
	}{
		{"cpu-llama.yaml", []string{"--vary", "cache_manager=v1,v2", "--vary", "kv_cache_config.enable_block_reuse=true,false"}, 2},
		{"cpu-hybrid.yaml", []string{"--vary", "cache_manager=v1,mamba"}, 1},
		{"cpu-dsa.yaml", []string{"--vary", "cache_manager=v1,v2"}, 2},
	} {
		js := filepath.Join(t.TempDir(), "r.json")
		args := append([]string{"compare", "-c", "../../scenarios/" + tc.scenario, "--json", js}, tc.vary...)
		out, stderr, code := kvx(t, args...)
		if code != 0 {
			t.Fatalf("%s: exit %d\n%s\n%s", tc.scenario, code, out, stderr)
		}
		rs := readReports(t, js)
		reused := 0
		for _, r := range rs {
			if r.Requests.Completed != r.Requests.Total || r.Requests.Failed != 0 || r.Invariants.Violations != 0 {
				t.Errorf("%s %s: requests %+v, violations %d", tc.scenario, r.Variant, r.Requests, r.Invariants.Violations)
			}
			if r.Outputs.Digest != rs[0].Outputs.Digest {
				t.Errorf("%s: %s digest %s, %s digest %s", tc.scenario, r.Variant, r.Outputs.Digest, rs[0].Variant, rs[0].Outputs.Digest)
			}
			if r.Config.Device != "cpu" || r.Engine.Modelled {
				t.Errorf("%s %s: device %q, modelled %v: want measured cpu", tc.scenario, r.Variant, r.Config.Device, r.Engine.Modelled)
			}
			if r.Tokens.PrefixReused > 0 {
				reused++
			}
		}
		if reused != tc.reusers {
			t.Errorf("%s: %d variants reused a prefix, want %d", tc.scenario, reused, tc.reusers)
		}
	}
}

// syncBuffer is a bytes.Buffer that a child's output and the test may use
// at once (servetest.SyncBuffer).
type syncBuffer = servetest.SyncBuffer
