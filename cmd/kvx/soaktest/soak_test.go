package soaktest

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// The soak under faults (issue 24, item 3): kvx serve with its plugins as
// processes, driven by soakClients clients for -soak (about a minute in
// make test; make soak runs it for SOAK_TIME, 10 minutes by default) with
// mixed requests, while the worker and the cache manager plugin are killed
// (kill -9) or stopped (kill -STOP, then -CONT) at random points.
var soakMemProfile = flag.String("memprofile", "", "kvx serve writes a heap profile of what it still holds after the soak to this file (kvx --memprofile)")

var soakTime = flag.Duration("soak", 40*time.Second, "how long TestServeSoak drives kvx serve under faults (make soak: SOAK_TIME)")

const soakClients = 4

// soakPrefixes are the shared prompt prefixes the completions draw from, so
// the prefix cache has something to reuse; chats share their system message.
var soakPrefixes = [][]int{
	seqFrom(1000, 96), seqFrom(5000, 64), seqFrom(9000, 160),
}

func seqFrom(start, n int) []int {
	s := make([]int, n)
	for i := range s {
		s[i] = start + i
	}
	return s
}

// soakRequest is one request of the soak: its body, whether it streams,
// whether the client goes away after the first event, and the tokens it
// must bring when it completes.
type soakRequest struct {
	path, body string
	stream     bool
	cut        bool
	maxTokens  int
}

func newSoakRequest(r *rand.Rand, i int) soakRequest {
	q := soakRequest{stream: r.IntN(2) == 0, maxTokens: 4 + r.IntN(40)}
	q.cut = q.stream && r.IntN(4) == 0
	opts := fmt.Sprintf(`"max_tokens":%d,"stream":%v`, q.maxTokens, q.stream)
	if q.stream {
		opts += `,"stream_options":{"include_usage":true}`
	}
	if r.IntN(3) == 0 {
		opts += fmt.Sprintf(`,"cache_salt":"tenant-%d"`, r.IntN(2))
	}
	if r.IntN(5) == 0 {
		opts += fmt.Sprintf(`,"retention_priority":%d,"retention_duration_s":%d`, 1+r.IntN(100), 1+r.IntN(30))
	}
	if r.IntN(3) == 0 {
		q.path = "/v1/chat/completions"
		q.body = fmt.Sprintf(`{"messages":[{"role":"system","content":"You are the soak test's assistant; answer briefly."},`+
			`{"role":"user","content":"request %d"}],%s}`, i, opts)
		return q
	}
	ids := slices.Clone(soakPrefixes[r.IntN(len(soakPrefixes))])
	for range 1 + r.IntN(48) {
		ids = append(ids, r.IntN(128000))
	}
	b, _ := json.Marshal(ids)
	q.path, q.body = "/v1/completions", fmt.Sprintf(`{"prompt":%s,%s}`, b, opts)
	return q
}

// soakResult is what the clients saw.
type soakResult struct {
	sent, completed, cut, refused int
	failures                      []string
	latencies                     []time.Duration // of completed requests, in the order they ended
	rss                           []int           // kvx serve's resident set, KiB, a sample a second
	heap                          []int           // its Go heap in use (go_memstats_heap_inuse_bytes), KiB, beside each RSS sample
}

// soakCounts are the leak counters of a served process and its plugins.
type soakCounts struct {
	goroutines, fds float64        // kvx serve's, from /metrics
	plugins         map[string]int // binary -> open fds of its process
}

func (c soakCounts) String() string {
	return fmt.Sprintf("%v goroutines, %v fds, plugins (fds) %v", c.goroutines, c.fds, c.plugins)
}

// livePlugins returns binary name -> pid of the plugin processes now
// running (none that is a zombie).
func livePlugins(t *testing.T) map[string]int {
	live := map[string]int{}
	for _, pid := range pluginPIDs(t) {
		if exe, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid)); err == nil {
			live[exe[strings.LastIndexByte(exe, '/')+1:]] = pid
		}
	}
	return live
}

func openFDs(pid int) int {
	es, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		return -1
	}
	return len(es)
}

func countsOf(t *testing.T, s *served) soakCounts {
	t.Helper()
	f := metricsOf(t, s.Base)
	c := soakCounts{goroutines: value(t, f, "go_goroutines"), fds: value(t, f, "process_open_fds"), plugins: map[string]int{}}
	for bin, pid := range livePlugins(t) {
		c.plugins[bin] = openFDs(pid)
	}
	return c
}

// TestServeSoak: under mixed load (completions and chats, streamed or not,
// streams the client cuts, with and without cache_salt and retention
// priorities, shared prefixes) and random plugin kills and stops, every
// request the server accepts either completes with all its tokens or is
// one the client cut; when the load ends the server holds nothing (no
// request running or waiting, KV usage 0) and its goroutines, its open
// files and its plugins (one manager and one worker, and their open files)
// are what they were before the load; after SIGTERM it exits 0 and leaves
// no plugin process.
func TestServeSoak(t *testing.T) {
	if n := len(pluginPIDs(t)); n > 0 {
		t.Fatalf("%d plugin processes before the test", n)
	}
	args := []string{"--set", "plugin_restarts.max=1000000", "--set", "plugin_restarts.backoff=20ms",
		"--set", "plugin_restarts.max_backoff=200ms", "--set", "plugin_timeouts.forward=1s", "--set", "plugin_timeouts.call=1s"}
	if *soakMemProfile != "" {
		args = append(args, "--memprofile", *soakMemProfile)
	}
	s := startServed(t, args...)
	tr := &http.Transport{MaxIdleConnsPerHost: soakClients}
	client := &http.Client{Transport: tr}
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d (-soak %v)", seed, *soakTime)

	// A warm-up of every kind of request, so that what is made once (a
	// plugin's data plane, the server's connections) is there before the
	// counts are taken.
	warm := soakRun(t, client, s.Base, s.Cmd.Process.Pid, seed, 2*time.Second, nil)
	if len(warm.failures) > 0 {
		t.Fatalf("warm-up, no faults: %v", warm.failures)
	}
	start := settledCounts(t, s, tr, nil)
	if len(start.plugins) != 2 {
		t.Fatalf("plugins at the start: %v, want a manager and a worker", start.plugins)
	}

	var faults []string
	res := soakRun(t, client, s.Base, s.Cmd.Process.Pid, seed+1, *soakTime, &faults)
	for _, f := range res.failures {
		t.Error(f)
	}
	if len(res.failures) > 0 {
		t.Logf("kvx serve's stderr so far:\n%s", s.Stderr)
	}

	f := metricsOf(t, s.Base)
	for end := time.Now().Add(10 * time.Second); time.Now().Before(end); f = metricsOf(t, s.Base) {
		if value(t, f, "kvx:num_requests_running") == 0 && value(t, f, "kvx:num_requests_waiting") == 0 &&
			value(t, f, "kvx:kv_cache_usage_perc") == 0 {
			break
		}
		time.Sleep(50 * time.Millisecond) // the usage gauge is refreshed at most every 100 ms
	}
	for _, g := range []string{"kvx:num_requests_running", "kvx:num_requests_waiting", "kvx:kv_cache_usage_perc"} {
		if v := value(t, f, g); v != 0 {
			t.Errorf("%s = %v when idle after the soak, want 0", g, v)
		}
	}
	restarts := value(t, f, "kvx:plugin_restarts_total")
	end := settledCounts(t, s, tr, &start)
	if end.goroutines != start.goroutines || end.fds != start.fds || !maps.Equal(end.plugins, start.plugins) {
		t.Errorf("leak: before the soak %v; after it, idle, %v", start, end)
	}
	n := len(res.latencies)
	half := res.latencies[n/2:]
	t.Logf("soak %v, %d clients: %d requests sent, %d completed, %d cut by the client, %d refused; %d faults (%d plugin restarts): %s",
		*soakTime, soakClients, res.sent, res.completed, res.cut, res.refused, len(faults), int(restarts), summarize(faults))
	t.Logf("latency p50 %v p99 %v over the first half, p50 %v p99 %v over the last; idle counts %v before, %v after",
		percentile(res.latencies[:n/2], 0.5).Round(time.Millisecond), percentile(res.latencies[:n/2], 0.99).Round(time.Millisecond),
		percentile(half, 0.5).Round(time.Millisecond), percentile(half, 0.99).Round(time.Millisecond), start, end)
	// The long soak (make soak) also holds kvx serve's memory and its
	// latency steady: no growth from the third quarter to the last, and
	// p99 over the last half within 1.5 times the first half's.
	q := len(res.rss) / 4
	rss3, rss4 := mean(res.rss[2*q:3*q]), mean(res.rss[3*q:])
	p99a, p99b := percentile(res.latencies[:n/2], 0.99), percentile(half, 0.99)
	t.Logf("kvx serve's RSS: %.1f MiB at the start, %.1f MiB mean over the third quarter, %.1f MiB over the last",
		float64(res.rss[0])/1024, rss3/1024, rss4/1024)
	t.Logf("its Go heap in use: %.1f MiB at the start, %.1f MiB mean over the third quarter, %.1f MiB over the last",
		float64(res.heap[0])/1024, mean(res.heap[2*q:3*q])/1024, mean(res.heap[3*q:])/1024)
	if *soakTime >= 5*time.Minute {
		if rss4 > 1.05*rss3 {
			t.Errorf("kvx serve's RSS grew %.1f%% from the third quarter of the soak to the last, want at most 5%%", 100*(rss4/rss3-1))
		}
		if float64(p99b) > 1.5*float64(p99a) {
			t.Errorf("p99 latency %v over the last half, %v over the first: want at most 1.5 times", p99b, p99a)
		}
	}
	if res.completed == 0 || len(faults) == 0 {
		t.Errorf("%d requests completed, %d faults injected: the soak tested nothing", res.completed, len(faults))
	}
	if code := s.Stop(t); code != 0 {
		t.Errorf("exit %d after SIGTERM, want 0\n%s", code, s.Stderr)
	}
	noPluginLeft(t)
}

// summarize counts the faults by kind: "kill kvx-backend-gqa 3, ...".
func summarize(faults []string) string {
	n := map[string]int{}
	for _, f := range faults {
		n[f]++
	}
	var out []string
	for _, k := range slices.Sorted(maps.Keys(n)) {
		out = append(out, fmt.Sprintf("%s %d", k, n[k]))
	}
	return strings.Join(out, ", ")
}

// settledCounts closes the clients' idle connections and returns the
// counts once they stop changing (or equal want, when given) for a while,
// at most 15 s.
func settledCounts(t *testing.T, s *served, tr *http.Transport, want *soakCounts) soakCounts {
	t.Helper()
	tr.CloseIdleConnections()
	c := countsOf(t, s)
	same := 0
	for end := time.Now().Add(15 * time.Second); time.Now().Before(end) && same < 5; {
		time.Sleep(100 * time.Millisecond)
		n := countsOf(t, s)
		switch {
		case want != nil && n.goroutines == want.goroutines && n.fds == want.fds && maps.Equal(n.plugins, want.plugins):
			return n
		case n.goroutines == c.goroutines && n.fds == c.fds && maps.Equal(n.plugins, c.plugins):
			same++
		default:
			same = 0
		}
		c = n
	}
	return c
}

// soakRun drives base with soakClients clients for d. With faults non-nil
// it also kills or stops a plugin at random points and records each fault,
// and samples the resident set of process pid (kvx serve) every second.
func soakRun(t *testing.T, client *http.Client, base string, pid int, seed uint64, d time.Duration, faults *[]string) soakResult {
	t.Helper()
	var res soakResult
	var mu sync.Mutex
	deadline := time.Now().Add(d)
	var wg sync.WaitGroup
	next := 0
	for c := range soakClients {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(seed, uint64(c)))
			for time.Now().Before(deadline) {
				mu.Lock()
				i := next
				next++
				mu.Unlock()
				q := newSoakRequest(r, i)
				time.Sleep(time.Duration(r.IntN(40)) * time.Millisecond) // a client's think time
				t0 := time.Now()
				outcome, problem := soakDo(client, base, q)
				took := time.Since(t0)
				mu.Lock()
				res.sent++
				switch {
				case problem != "":
					res.failures = append(res.failures, fmt.Sprintf("request %d (%s %s): %s", i, q.path, q.body, problem))
				case outcome == "cut":
					res.cut++
				case outcome == "refused":
					res.refused++
				default:
					res.completed++
					res.latencies = append(res.latencies, took)
				}
				mu.Unlock()
			}
		})
	}
	if faults != nil {
		wg.Go(func() { *faults = injectFaults(t, rand.New(rand.NewPCG(seed, 99)), deadline) })
		wg.Go(func() {
			for time.Now().Before(deadline) {
				if kb := rssKB(pid); kb > 0 {
					heap := heapInuseKB(client, base)
					mu.Lock()
					res.rss = append(res.rss, kb)
					res.heap = append(res.heap, heap)
					mu.Unlock()
				}
				time.Sleep(time.Second)
			}
		})
	}
	wg.Wait()
	return res
}

// heapInuseKB is go_memstats_heap_inuse_bytes of kvx serve at base, in
// KiB (0 when /metrics did not answer): the Go heap's spans in use, which
// tell a heap that grows from a resident set the runtime keeps.
func heapInuseKB(client *http.Client, base string) int {
	m, err := scrape(client, base)
	if err != nil {
		return 0
	}
	return int(m["go_memstats_heap_inuse_bytes"] / 1024)
}

// rssKB is the resident set of process pid in KiB (0 when unknown).
func rssKB(pid int) int {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for line := range strings.SplitSeq(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			var kb int
			fmt.Sscanf(strings.TrimSpace(v), "%d", &kb)
			return kb
		}
	}
	return 0
}

// mean of xs (0 for none).
func mean(xs []int) float64 {
	if len(xs) == 0 {
		return 0
	}
	sum := 0
	for _, x := range xs {
		sum += x
	}
	return float64(sum) / float64(len(xs))
}

// soakDo sends q and says how it ended: "done" (all its tokens), "cut"
// (the client went away after the first event) or "refused" (a 429 or 503
// with an OpenAI error body: a documented refusal), or a problem.
func soakDo(client *http.Client, base string, q soakRequest) (outcome, problem string) {
	resp, err := client.Post(base+q.path, "application/json", strings.NewReader(q.body))
	if err != nil {
		return "", "transport: " + err.Error()
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode == http.StatusServiceUnavailable {
		data, _ := io.ReadAll(resp.Body)
		if !strings.Contains(string(data), `"error":{`) {
			return "", fmt.Sprintf("status %d without an error object: %s", resp.StatusCode, data)
		}
		return "refused", ""
	}
	if q.cut {
		line, err := bufio.NewReader(resp.Body).ReadString('\n')
		if resp.StatusCode != 200 || err != nil || !strings.HasPrefix(line, "data: ") {
			return "", fmt.Sprintf("status %d, first line %q, %v", resp.StatusCode, line, err)
		}
		return "cut", ""
	}
	if problem := completes(resp, q.stream, q.maxTokens); problem != "" {
		return "", problem
	}
	return "done", ""
}

// injectFaults kills (kill -9) or stops (kill -STOP for 0.1 to 2.5 s,
// against deadlines of 1 s, then kill -CONT) the worker or the manager
// plugin every 0.5 to 3 s until deadline; it returns what it did, one
// "kill BINARY" or "stop BINARY" a fault.
func injectFaults(t *testing.T, r *rand.Rand, deadline time.Time) []string {
	var did []string
	for {
		time.Sleep(time.Duration(500+r.IntN(2500)) * time.Millisecond)
		if time.Now().After(deadline) {
			return did
		}
		live := livePlugins(t)
		bins := slices.Sorted(maps.Keys(live))
		if len(bins) == 0 {
			continue // both being replaced
		}
		bin := bins[r.IntN(len(bins))]
		pid := live[bin]
		if r.IntN(2) == 0 {
			if syscall.Kill(pid, syscall.SIGKILL) == nil {
				did = append(did, "kill "+bin)
			}
			continue
		}
		if syscall.Kill(pid, syscall.SIGSTOP) == nil {
			did = append(did, "stop "+bin)
			time.Sleep(time.Duration(100+r.IntN(2400)) * time.Millisecond)
			_ = syscall.Kill(pid, syscall.SIGCONT) // gone already when the watchdog killed it
		}
	}
}
