package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/kvx-dev/kvx/core/engine"

	"github.com/kvx-dev/kvx/cmd/kvx/internal/servetest"
)

// The bounded load test (issue 14): the real kvx serve binary, its plugins
// as processes, driven by loadClients concurrent clients for loadRequests
// requests (completions and chat, streamed and not); once undisturbed and
// once while the fault hook kills the worker plugin and then the cache
// manager plugin (kill -9 of the process group).
const (
	loadClients  = 8
	loadRequests = 160
	loadPrompt   = 64 // prompt tokens of a completions request
	loadTokens   = 32 // max_tokens of every request
)

// served is a kvx serve process (servetest.Served).
type served = servetest.Served

// startServed starts kvx serve on a loopback port with env added and
// returns once it listens.
func startServed(t *testing.T, env []string, args ...string) *served {
	t.Helper()
	cmd := kvxCommand(t, append([]string{"serve", "-c", serveSim, "--port", "0"}, args...)...)
	cmd.Env = append(os.Environ(), env...)
	return servetest.Start(t, cmd)
}

// loadResult is what the clients saw.
type loadResult struct {
	accepted, completed int
	failures            []string
	latencies           []time.Duration // of the completed requests
	wall                time.Duration
	health              map[string]int // /health statuses polled during the load
}

// loadBody is request i: every fourth a chat, every other one streamed.
func loadBody(i int) (path, body string, stream bool) {
	stream = i%2 == 1
	opts := fmt.Sprintf(`"max_tokens":%d,"stream":%v`, loadTokens, stream)
	if stream {
		opts += `,"stream_options":{"include_usage":true}`
	}
	if i%4 == 3 {
		return "/v1/chat/completions", fmt.Sprintf(`{"messages":[{"role":"user","content":"request %d of the load test"}],%s}`, i, opts), stream
	}
	ids := make([]string, loadPrompt)
	for j := range ids {
		ids[j] = fmt.Sprint((i*7919 + j*104729) % 128000)
	}
	return "/v1/completions", fmt.Sprintf(`{"prompt":[%s],%s}`, strings.Join(ids, ","), opts), stream
}

// completes checks one answer: 200 and all loadTokens tokens, streamed to
// [DONE] with the usage chunk, or as one JSON object. accepted is false for
// a refusal (not 200).
func completes(resp *http.Response, stream bool) (accepted bool, problem string) {
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return resp.StatusCode == 200, "reading: " + err.Error()
	}
	if resp.StatusCode != 200 {
		return false, fmt.Sprintf("status %d: %s", resp.StatusCode, data)
	}
	var usage struct {
		CompletionTokens int `json:"completion_tokens"`
	}
	if !stream {
		var v struct {
			Usage *json.RawMessage `json:"usage"`
		}
		if err := json.Unmarshal(data, &v); err != nil || v.Usage == nil {
			return true, fmt.Sprintf("answer %s: %v", data, err)
		}
		_ = json.Unmarshal(*v.Usage, &usage)
	} else {
		done := false
		for _, line := range strings.Split(string(data), "\n") {
			d, ok := strings.CutPrefix(line, "data: ")
			switch {
			case !ok:
			case d == "[DONE]":
				done = true
			case strings.Contains(d, `"error"`):
				return true, "error event " + d
			case strings.Contains(d, `"usage"`):
				var v struct {
					Usage json.RawMessage `json:"usage"`
				}
				_ = json.Unmarshal([]byte(d), &v)
				_ = json.Unmarshal(v.Usage, &usage)
			}
		}
		if !done {
			return true, "no [DONE]: " + string(data)
		}
	}
	if usage.CompletionTokens != loadTokens {
		return true, fmt.Sprintf("%d completion tokens, want %d", usage.CompletionTokens, loadTokens)
	}
	return true, ""
}

// drive runs the load against base and polls /health meanwhile.
func drive(t *testing.T, base string) loadResult {
	t.Helper()
	res := loadResult{health: map[string]int{}}
	var mu sync.Mutex
	next := 0
	stopPoll := make(chan struct{})
	polled := make(chan struct{})
	go func() {
		defer close(polled)
		for {
			select {
			case <-stopPoll:
				return
			case <-time.After(5 * time.Millisecond):
			}
			resp, err := http.Get(base + "/health")
			if err != nil {
				continue
			}
			var v struct{ Status string }
			_ = json.NewDecoder(resp.Body).Decode(&v)
			resp.Body.Close()
			mu.Lock()
			res.health[fmt.Sprintf("%d %s", resp.StatusCode, v.Status)]++
			mu.Unlock()
		}
	}()
	t0 := time.Now()
	var wg sync.WaitGroup
	for range loadClients {
		wg.Go(func() {
			for {
				mu.Lock()
				i := next
				next++
				mu.Unlock()
				if i >= loadRequests {
					return
				}
				path, body, stream := loadBody(i)
				s := time.Now()
				resp, err := http.Post(base+path, "application/json", strings.NewReader(body))
				if err != nil {
					mu.Lock()
					res.failures = append(res.failures, fmt.Sprintf("request %d: %v", i, err))
					mu.Unlock()
					continue
				}
				ok, problem := completes(resp, stream)
				resp.Body.Close()
				took := time.Since(s)
				mu.Lock()
				if ok {
					res.accepted++
				}
				if problem != "" {
					res.failures = append(res.failures, fmt.Sprintf("request %d: %s", i, problem))
				} else {
					res.completed++
					res.latencies = append(res.latencies, took)
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	res.wall = time.Since(t0)
	close(stopPoll)
	<-polled
	return res
}

func percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Sorted(slices.Values(ds))
	return s[min(len(s)-1, int(p*float64(len(s))))]
}

// afterLoad checks, once the load is answered, that the server holds
// nothing (no request running or waiting, no device block in use) and
// counts restarts restarts.
func afterLoad(t *testing.T, base string, restarts float64) {
	t.Helper()
	var f = metricsOf(t, base)
	for end := time.Now().Add(5 * time.Second); time.Now().Before(end); f = metricsOf(t, base) {
		if value(t, f, "kvx:num_requests_running") == 0 && value(t, f, "kvx:kv_cache_usage_perc") == 0 {
			break
		}
		time.Sleep(20 * time.Millisecond) // the usage gauge is refreshed at most every 100 ms
	}
	for _, g := range []string{"kvx:num_requests_running", "kvx:num_requests_waiting", "kvx:kv_cache_usage_perc"} {
		if v := value(t, f, g); v != 0 {
			t.Errorf("%s = %v after the load, want 0 (no block leaked)", g, v)
		}
	}
	if v := value(t, f, "kvx:plugin_restarts_total"); v != restarts {
		t.Errorf("kvx:plugin_restarts_total = %v, want %v", v, restarts)
	}
	if v := value(t, f, "kvx:request_success_total"); v != loadRequests {
		t.Errorf("kvx:request_success_total = %v, want %d", v, loadRequests)
	}
	resp, err := http.Get(base + "/health")
	if err != nil || resp.StatusCode != 200 {
		t.Errorf("/health after the load: %v %v, want 200", resp, err)
	}
	if resp != nil {
		resp.Body.Close()
	}
}

// TestServeLoadWithKills: every accepted request completes, with and
// without two plugin kills during the load; nothing is held after it, the
// restarts are counted, /health never says the engine ended, and no plugin
// process is left after SIGTERM (exit 0). It logs the figures of issue 14's
// closing note.
func TestServeLoadWithKills(t *testing.T) {
	t.Parallel()
	if n := len(pluginPIDs(t)); n > 0 {
		t.Fatalf("%d plugin processes before the test", n)
	}
	var results [2]loadResult
	for k, faults := range []string{"", "kill:worker:100,kill:manager:350"} {
		var env []string
		if faults != "" {
			env = []string{engine.FaultEnv + "=" + faults}
		}
		s := startServed(t, env, "--set", "plugin_restarts.backoff=50ms")
		before := pluginPIDs(t)
		r := drive(t, s.Base)
		results[k] = r
		for _, f := range r.failures {
			t.Errorf("faults %q: %s", faults, f)
		}
		if r.accepted != loadRequests || r.completed != r.accepted {
			t.Errorf("faults %q: %d requests, %d accepted, %d completed; want every one", faults, loadRequests, r.accepted, r.completed)
		}
		for st, n := range r.health {
			if st != "200 ok" && st != "503 restarting" {
				t.Errorf("faults %q: /health answered %q %d times during the load", faults, st, n)
			}
		}
		want := 0.0
		if faults != "" {
			want = 2
			if !strings.Contains(s.Stderr.String(), "FAULT INJECTION IS ON") {
				t.Errorf("the fault hook was on without its warning:\n%s", s.Stderr)
			}
			if after := pluginPIDs(t); len(after) != 2 || slices.Equal(after, before) {
				t.Errorf("plugin pids %v before, %v after two kills: want 2 new processes", before, after)
			}
		} else if strings.Contains(s.Stderr.String(), "FAULT INJECTION") {
			t.Errorf("fault injection is on without %s:\n%s", engine.FaultEnv, s.Stderr)
		}
		afterLoad(t, s.Base, want)
		if code := s.Stop(t); code != 0 {
			t.Errorf("faults %q: exit %d after SIGTERM, want 0\n%s", faults, code, s.Stderr)
		}
		noPluginLeft(t)
	}
	clean, killed := results[0], results[1]
	t.Logf("load: %d clients, %d requests (%d prompt tokens or a chat, %d generated each; half streamed), sim device, plugin isolation",
		loadClients, loadRequests, loadPrompt, loadTokens)
	t.Logf("two kills: %d accepted, %d completed (fraction %.3f); /health during the load %v",
		killed.accepted, killed.completed, float64(killed.completed)/float64(max(1, killed.accepted)), killed.health)
	t.Logf("latency without kills: p50 %v p99 %v (wall %v); with two kills: p50 %v p99 %v (wall %v)",
		percentile(clean.latencies, 0.5).Round(time.Microsecond), percentile(clean.latencies, 0.99).Round(time.Microsecond), clean.wall.Round(time.Millisecond),
		percentile(killed.latencies, 0.5).Round(time.Microsecond), percentile(killed.latencies, 0.99).Round(time.Microsecond), killed.wall.Round(time.Millisecond))
}

// TestServeUnrecoverableExitsNonZero: a plugin killed more often than the
// restart budget allows: the requests in flight end with an error in
// OpenAI's shape (or an SSE error event), and the process exits 1 instead
// of answering 503 forever; no plugin process is left.
func TestServeUnrecoverableExitsNonZero(t *testing.T) {
	t.Parallel()
	s := startServed(t, []string{engine.FaultEnv + "=kill:worker:20,kill:worker:40"}, "--set", "plugin_restarts.max=1",
		"--set", "plugin_restarts.backoff=1ms")
	var wg sync.WaitGroup
	answers := make([]string, 4)
	for i := range answers {
		wg.Go(func() {
			stream := i%2 == 1
			resp, err := http.Post(s.Base+"/v1/completions", "application/json",
				strings.NewReader(fmt.Sprintf(`{"prompt":[1,2,3,%d],"max_tokens":3000,"stream":%v}`, i, stream)))
			if err != nil {
				answers[i] = "transport: " + err.Error()
				return
			}
			data, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			answers[i] = fmt.Sprintf("%d %s", resp.StatusCode, data)
		})
	}
	wg.Wait()
	for i, a := range answers {
		want := `503 {"error":{"code":"engine_stopped"`
		if i%2 == 1 {
			want = `200 ` // the stream had begun: an error event, then [DONE]
		}
		if !strings.HasPrefix(a, want) || !strings.Contains(a, "budget (plugin_restarts.max 1) is spent") {
			t.Errorf("request %d: %.300s\nwant %s... naming the spent budget", i, a, want)
		}
		if i%2 == 1 && (!strings.Contains(a, `data: {"error":`) || !strings.HasSuffix(strings.TrimSpace(a), "data: [DONE]")) {
			t.Errorf("request %d: %.300s\nwant an SSE error event and [DONE]", i, a)
		}
	}
	done := make(chan error, 1)
	go func() { done <- s.Cmd.Wait() }()
	select {
	case err := <-done:
		ee, ok := err.(*exec.ExitError)
		if !ok || ee.ExitCode() != 1 {
			t.Errorf("kvx serve with its restart budget spent: %v, want exit 1\n%s", err, s.Stderr)
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("kvx serve still runs 30 s after its restart budget was spent\n%s", s.Stderr)
	}
	noPluginLeft(t)
}

// TestServeDrainsOnSIGTERM: after SIGTERM the server takes no new request
// (503, and /health says draining) and finishes the streams in flight, then
// exits 0; with a drain timeout shorter than they need, they end with an
// error event instead, and it still exits 0. No plugin process is left.
func TestServeDrainsOnSIGTERM(t *testing.T) {
	for _, c := range []struct {
		timeout string
		finish  bool
	}{{"20s", true}, {"100ms", false}} {
		t.Run("drain-timeout="+c.timeout, func(t *testing.T) {
			s := startServed(t, nil, "--drain-timeout", c.timeout)
			type streamed struct {
				body []byte
				err  error
			}
			results := make([]chan streamed, 2)
			for i := range results {
				results[i] = make(chan streamed, 1)
				resp, err := http.Post(s.Base+"/v1/completions", "application/json",
					strings.NewReader(fmt.Sprintf(`{"prompt":[5,6,7,%d],"max_tokens":4000,"stream":true,"stream_options":{"include_usage":true}}`, i)))
				if err != nil {
					t.Fatal(err)
				}
				br := bufio.NewReader(resp.Body)
				first, err := br.ReadString('\n') // it runs
				if err != nil || !strings.HasPrefix(first, "data: ") {
					t.Fatalf("stream %d: first line %q, %v", i, first, err)
				}
				go func() {
					rest, err := io.ReadAll(br)
					resp.Body.Close()
					results[i] <- streamed{rest, err}
				}()
			}
			if err := s.Cmd.Process.Signal(syscall.SIGTERM); err != nil {
				t.Fatal(err)
			}
			for end := time.Now().Add(10 * time.Second); ; time.Sleep(2 * time.Millisecond) {
				resp, err := http.Get(s.Base + "/health")
				if err != nil {
					t.Fatalf("/health after SIGTERM: %v", err)
				}
				data, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode == 503 && strings.Contains(string(data), `"status":"draining"`) {
					break
				}
				if time.Now().After(end) {
					t.Fatalf("/health 10 s after SIGTERM: %d %s, want 503 draining", resp.StatusCode, data)
				}
			}
			if c.finish {
				resp, err := http.Post(s.Base+"/v1/completions", "application/json", strings.NewReader(`{"prompt":[1],"max_tokens":2}`))
				if err != nil {
					t.Fatalf("a new request while draining: %v", err)
				}
				data, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 503 || !strings.Contains(string(data), `"code":"shutting_down"`) || resp.Header.Get("Retry-After") == "" {
					t.Errorf("a new request while draining: %d %s, want 503 shutting_down with Retry-After", resp.StatusCode, data)
				}
			}
			for i, ch := range results {
				r := <-ch
				body := string(r.body)
				finished := strings.Contains(body, `"completion_tokens":4000`) && !strings.Contains(body, `"error"`)
				if r.err != nil || !strings.HasSuffix(strings.TrimSpace(body), "data: [DONE]") || finished != c.finish {
					t.Errorf("stream %d: %v, ends %.200q; want finished %v, ending with [DONE]", i, r.err, body[max(0, len(body)-200):], c.finish)
				}
				if !c.finish && !strings.Contains(body, `"code":"engine_stopped"`) {
					t.Errorf("stream %d cut by the drain timeout: no engine_stopped error event: %.200q", i, body[max(0, len(body)-200):])
				}
			}
			code := s.Wait(t)
			if code != 0 || !strings.Contains(s.Stderr.String(), "draining") {
				t.Errorf("exit %d after SIGTERM, want 0\n%s", code, s.Stderr)
			}
			if !c.finish && !strings.Contains(s.Stderr.String(), "2 requests still in flight are cut off") {
				t.Errorf("the drain timeout is not reported:\n%s", s.Stderr)
			}
			noPluginLeft(t)
		})
	}
}

// TestServeIdleKillIsFoundAndRestarted: a plugin killed (kill -9 by pid)
// while the server has nothing to do is found by the idle probe, not at the
// next request: the restart is counted with no request sent, /health is
// 200 again, the next request completes, and after SIGTERM no plugin is
// left. It logs how long the replacement took.
func TestServeIdleKillIsFoundAndRestarted(t *testing.T) {
	t.Parallel()
	s := startServed(t, nil)
	victim := pluginOf(t, "kvx-backend-gqa") // serve-sim.yaml: Llama, attention_backend gqa
	if err := syscall.Kill(victim, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	var took time.Duration
	for end := killed.Add(20 * time.Second); took == 0; time.Sleep(10 * time.Millisecond) {
		if value(t, metricsOf(t, s.Base), "kvx:plugin_restarts_total") == 1 {
			took = time.Since(killed)
		} else if time.Now().After(end) {
			t.Fatalf("20 s after kill -9 of the idle worker: no restart counted\n%s", s.Stderr)
		}
	}
	for end := time.Now().Add(20 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		resp, err := http.Get(s.Base + "/health")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode == 200 {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("/health %d 20 s after the restart", resp.StatusCode)
		}
	}
	t.Logf("kill -9 of the idle worker plugin: restart counted %v after the kill (probe every 500 ms)", took.Round(time.Millisecond))
	code, v, _ := post(t, s.Base+"/v1/completions", `{"prompt":[1,2,3],"max_tokens":5}`)
	if code != 200 || len(parseAnswer(t, v, false).ids) != 5 {
		t.Errorf("after the restart: %d %v", code, v)
	}
	if code := s.Stop(t); code != 0 {
		t.Errorf("exit %d after SIGTERM\n%s", code, s.Stderr)
	}
	noPluginLeft(t)
}

// TestServeDisconnectWithPlugins: clients that go away mid-stream, with the
// plugins as processes: their requests are cancelled and every block is
// freed (no request running, KV usage 0), well before they would have
// finished.
func TestServeDisconnectWithPlugins(t *testing.T) {
	t.Parallel()
	s := startServed(t, nil)
	const n, maxTok = 4, 3000
	for i := range n {
		resp, err := http.Post(s.Base+"/v1/completions", "application/json",
			strings.NewReader(fmt.Sprintf(`{"prompt":[9,8,7,%d],"max_tokens":%d,"stream":true}`, i, maxTok)))
		if err != nil {
			t.Fatal(err)
		}
		if line, err := bufio.NewReader(resp.Body).ReadString('\n'); err != nil || !strings.HasPrefix(line, "data: ") {
			t.Fatalf("stream %d: %q %v", i, line, err)
		}
		resp.Body.Close() // the client goes away
	}
	var f = metricsOf(t, s.Base)
	for end := time.Now().Add(10 * time.Second); ; f = metricsOf(t, s.Base) {
		if value(t, f, "kvx:num_requests_running") == 0 && value(t, f, "kvx:kv_cache_usage_perc") == 0 &&
			value(t, f, "kvx:request_success_total") == n {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("10 s after %d clients went away: running %v, KV usage %v, ended %v", n,
				value(t, f, "kvx:num_requests_running"), value(t, f, "kvx:kv_cache_usage_perc"), value(t, f, "kvx:request_success_total"))
		}
		time.Sleep(20 * time.Millisecond)
	}
	if gen := value(t, f, "kvx:generation_tokens_total"); gen >= n*maxTok {
		t.Errorf("%v tokens generated for %d requests cancelled early: they ran to the end", gen, n)
	}
	if m := f["kvx:request_success_total"]; m != nil {
		for _, mt := range m.Metric {
			for _, l := range mt.Label {
				if l.GetName() == "finished_reason" && l.GetValue() != "abort" && mt.Counter.GetValue() > 0 {
					t.Errorf("request_success_total{finished_reason=%q} = %v, want only aborts", l.GetValue(), mt.Counter.GetValue())
				}
			}
		}
	}
	if code := s.Stop(t); code != 0 {
		t.Errorf("exit %d after SIGTERM\n%s", code, s.Stderr)
	}
	noPluginLeft(t)
}

// TestServeStoppedPluginIsReplaced: the worker stopped (kill -STOP) while
// it serves streams: the forward misses its 1 s deadline, the watchdog kills
// it, the engine restarts it and recomputes, and the streams complete.
func TestServeStoppedPluginIsReplaced(t *testing.T) {
	s := startServed(t, nil, "--set", "plugin_timeouts.forward=1s", "--set", "plugin_timeouts.call=1s")
	victim := pluginOf(t, "kvx-backend-gqa")
	const n, maxTok = 3, 1500
	results := make(chan string, n)
	for i := range n {
		resp, err := http.Post(s.Base+"/v1/completions", "application/json",
			strings.NewReader(fmt.Sprintf(`{"prompt":[4,4,%d],"max_tokens":%d,"stream":true,"stream_options":{"include_usage":true}}`, i, maxTok)))
		if err != nil {
			t.Fatal(err)
		}
		go func() {
			data, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			results <- string(data)
		}()
	}
	if err := syscall.Kill(victim, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	stopped := time.Now()
	for i := range n {
		body := <-results
		if !strings.Contains(body, fmt.Sprintf(`"completion_tokens":%d`, maxTok)) || strings.Contains(body, `"error"`) ||
			!strings.HasSuffix(strings.TrimSpace(body), "data: [DONE]") {
			t.Errorf("stream %d with the worker stopped: ends %.300q, want all %d tokens", i, body[max(0, len(body)-300):], maxTok)
		}
	}
	took := time.Since(stopped)
	if processAlive(victim) {
		_ = syscall.Kill(victim, syscall.SIGKILL)
		t.Fatalf("the stopped worker (pid %d) was never killed", victim)
	}
	f := metricsOf(t, s.Base)
	if r := value(t, f, "kvx:plugin_restarts_total"); r != 1 || !strings.Contains(s.Stderr.String(), "did not answer within its deadline") {
		t.Errorf("restarts %v; want the stopped worker killed at its deadline and replaced\n%s", r, s.Stderr)
	}
	t.Logf("worker stopped with kill -STOP mid-stream (deadlines 1 s): %d streams of %d tokens complete %v after the stop", n, maxTok, took.Round(time.Millisecond))
	if code := s.Stop(t); code != 0 {
		t.Errorf("exit %d after SIGTERM\n%s", code, s.Stderr)
	}
	noPluginLeft(t)
}
