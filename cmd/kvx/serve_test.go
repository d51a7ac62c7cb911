package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/kvx-dev/kvx/core/serve"
)

const serveSim = "testdata/serve-sim.yaml"

// startServe serves config (with sets) in-process on a loopback port and
// returns its base URL; the server stops when the test ends.
func startServe(t *testing.T, config string, o serveOpts, sets ...string) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	g := &globals{configs: []string{config}, sets: append([]string{"isolation=inprocess"}, sets...), logLevel: "error"}
	ready := make(chan string, 1)
	done := make(chan error, 1)
	go func() { done <- runServe(ctx, g, &o, ln, func(a string) { ready <- a }) }()
	var addr string
	select {
	case addr = <-ready:
	case err := <-done:
		t.Fatalf("serve %s: %v", config, err)
	}
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("serve %s: %v", config, err)
		}
	})
	return "http://" + addr
}

// post sends body and returns the status, the decoded JSON answer and the
// response.
func post(t *testing.T, url, body string) (int, map[string]any, *http.Response) {
	t.Helper()
	resp, err := http.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatalf("POST %s: %v", url, err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	var v map[string]any
	if err := json.Unmarshal(data, &v); err != nil {
		t.Fatalf("POST %s %s: answer is not JSON: %v\n%s", url, body, err, data)
	}
	return resp.StatusCode, v, resp
}

// answer is one completion as the server gave it.
type answer struct {
	ids    []int32
	text   string
	usage  map[string]any
	finish string
}

func parseAnswer(t *testing.T, v map[string]any, chat bool) answer {
	t.Helper()
	choices, _ := v["choices"].([]any)
	if len(choices) != 1 {
		t.Fatalf("answer has %d choices, want 1: %v", len(choices), v)
	}
	c := choices[0].(map[string]any)
	a := answer{usage: v["usage"].(map[string]any), finish: fmt.Sprint(c["finish_reason"])}
	for _, id := range c["token_ids"].([]any) {
		a.ids = append(a.ids, int32(id.(float64)))
	}
	if chat {
		a.text = c["message"].(map[string]any)["content"].(string)
	} else {
		a.text = c["text"].(string)
	}
	return a
}

// stream posts a streaming request and returns the concatenated text, the
// usage chunk (nil when none) and the number of data events.
func stream(t *testing.T, url, body string, chat bool) (string, map[string]any, int) {
	t.Helper()
	resp, err := http.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		data, _ := io.ReadAll(resp.Body)
		t.Fatalf("stream %s: %d %s: %s", body, resp.StatusCode, resp.Header.Get("Content-Type"), data)
	}
	var text strings.Builder
	var usage map[string]any
	events, sawDone := 0, false
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if line == "" {
			continue
		}
		data, ok := strings.CutPrefix(line, "data: ")
		if !ok {
			t.Fatalf("stream: line %q is not a data event", line)
		}
		if data == "[DONE]" {
			sawDone = true
			continue
		}
		events++
		var v map[string]any
		if err := json.Unmarshal([]byte(data), &v); err != nil {
			t.Fatalf("stream: event %q: %v", data, err)
		}
		if e, ok := v["error"]; ok {
			t.Fatalf("stream: error event %v", e)
		}
		if u, ok := v["usage"].(map[string]any); ok {
			usage = u
		}
		for _, c := range v["choices"].([]any) {
			c := c.(map[string]any)
			if chat {
				if s, ok := c["delta"].(map[string]any)["content"].(string); ok {
					text.WriteString(s)
				}
			} else {
				text.WriteString(c["text"].(string))
			}
		}
	}
	if !sawDone {
		t.Fatalf("stream %s: no [DONE]", body)
	}
	return text.String(), usage, events
}

func metricsOf(t *testing.T, base string) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("/metrics: %v", err)
	}
	return fams
}

// value is the sum over a family's series of its gauge, counter or
// histogram count.
func value(t *testing.T, fams map[string]*dto.MetricFamily, name string) float64 {
	t.Helper()
	f := fams[name]
	if f == nil {
		t.Fatalf("/metrics has no %s", name)
	}
	sum := 0.0
	for _, m := range f.Metric {
		switch {
		case m.Gauge != nil:
			sum += m.Gauge.GetValue()
		case m.Counter != nil:
			sum += m.Counter.GetValue()
		case m.Histogram != nil:
			sum += float64(m.Histogram.GetSampleCount())
		}
	}
	return sum
}

func num(v any) int { f, _ := v.(float64); return int(f) }

// TestServeCPUGivesGenerateTokens: on the cpu device the server's
// completions, streamed or not, from text or token ids, and under 8
// concurrent clients, are exactly kvx generate's greedy tokens and text for
// the same prompts; usage counts them; a repeated prompt is served from the
// prefix cache; /v1/models, /health and /metrics tell the truth.
func TestServeCPUGivesGenerateTokens(t *testing.T) {
	want, out, stderr, code := generate(t, genPrompts, "--set", "isolation=inprocess")
	if code != 0 {
		t.Fatalf("generate: exit %d\n%s%s", code, out, stderr)
	}
	lines, err := os.ReadFile(genPrompts)
	if err != nil {
		t.Fatal(err)
	}
	// The completions bodies: the prompt lines, renamed to the API's fields.
	var bodies []string
	for _, l := range strings.Split(strings.TrimSpace(string(lines)), "\n") {
		var pl map[string]any
		if err := json.Unmarshal([]byte(l), &pl); err != nil {
			t.Fatal(err)
		}
		if ids, ok := pl["prompt_ids"]; ok {
			pl["prompt"] = ids
			delete(pl, "prompt_ids")
		}
		pl["model"] = "llama-3.1-8b"
		b, _ := json.Marshal(pl)
		bodies = append(bodies, string(b))
	}
	if len(bodies) != len(want) {
		t.Fatalf("%d prompt lines, %d completions", len(bodies), len(want))
	}
	base := startServe(t, genScenario, serveOpts{})

	check := func(i int, a answer) {
		t.Helper()
		if !slices.Equal(a.ids, want[i].OutputIDs) {
			t.Errorf("prompt %d: token_ids = %v, want generate's %v", i, a.ids, want[i].OutputIDs)
		}
		if a.text != *want[i].Text {
			t.Errorf("prompt %d: text = %q, want generate's %q", i, a.text, *want[i].Text)
		}
		if a.finish != "length" {
			t.Errorf("prompt %d: finish_reason = %s, want length", i, a.finish)
		}
		if num(a.usage["completion_tokens"]) != len(want[i].OutputIDs) || num(a.usage["prompt_tokens"]) == 0 {
			t.Errorf("prompt %d: usage = %v, want %d completion tokens", i, a.usage, len(want[i].OutputIDs))
		}
	}
	for i, b := range bodies {
		code, v, _ := post(t, base+"/v1/completions", b)
		if code != 200 {
			t.Fatalf("prompt %d: %d %v", i, code, v)
		}
		check(i, parseAnswer(t, v, false))
	}

	// Streamed: the same text, and the usage chunk when asked for.
	sb := strings.TrimSuffix(bodies[0], "}") + `,"stream":true,"stream_options":{"include_usage":true}}`
	text, usage, events := stream(t, base+"/v1/completions", sb, false)
	if text != *want[0].Text || usage == nil || num(usage["completion_tokens"]) != len(want[0].OutputIDs) {
		t.Errorf("streamed: text %q usage %v, want %q and %d completion tokens", text, usage, *want[0].Text, len(want[0].OutputIDs))
	}
	if events < len(want[0].OutputIDs) {
		t.Errorf("streamed %d events for %d tokens: not one per step", events, len(want[0].OutputIDs))
	}

	// A repeated prompt: its full blocks come from the prefix cache.
	_, v, _ := post(t, base+"/v1/completions", bodies[2])
	a := parseAnswer(t, v, false)
	check(2, a)
	cached := num(a.usage["prompt_tokens_details"].(map[string]any)["cached_tokens"])
	if p := num(a.usage["prompt_tokens"]); cached < 16 || cached >= p {
		t.Errorf("repeated prompt: cached_tokens = %d of %d prompt tokens, want at least one block (16)", cached, p)
	}

	// Chat: the plain template's prompt through the completions endpoint
	// gives the same tokens; streamed chat gives the same text.
	chatBody := `{"model":"llama-3.1-8b","max_tokens":6,"messages":[{"role":"system","content":"be brief"},{"role":"user","content":[{"type":"text","text":"hello"}]}]}`
	code, cv, _ := post(t, base+"/v1/chat/completions", chatBody)
	if code != 200 || cv["object"] != "chat.completion" {
		t.Fatalf("chat: %d %v", code, cv)
	}
	chat := parseAnswer(t, cv, true)
	tmpl, _ := json.Marshal(serve.ChatPrompt([]string{"system", "user"}, []string{"be brief", "hello"}))
	_, pv, _ := post(t, base+"/v1/completions", fmt.Sprintf(`{"prompt":%s,"max_tokens":6}`, tmpl))
	if plain := parseAnswer(t, pv, false); !slices.Equal(plain.ids, chat.ids) || len(chat.ids) != 6 {
		t.Errorf("chat token_ids %v, the template's prompt gives %v", chat.ids, plain.ids)
	}
	st, _, _ := stream(t, base+"/v1/chat/completions", strings.TrimSuffix(chatBody, "}")+`,"stream":true}`, true)
	if st != chat.text {
		t.Errorf("streamed chat text %q, want %q", st, chat.text)
	}

	// 8 clients × 4 requests at once: each gets generate's tokens.
	var wg sync.WaitGroup
	errs := make(chan string, 32)
	for c := range 8 {
		wg.Go(func() {
			for k := range 4 {
				i := (c + k) % len(bodies)
				resp, err := http.Post(base+"/v1/completions", "application/json", strings.NewReader(bodies[i]))
				if err != nil {
					errs <- err.Error()
					return
				}
				var v struct {
					Choices []struct {
						TokenIDs []int32 `json:"token_ids"`
					} `json:"choices"`
				}
				err = json.NewDecoder(resp.Body).Decode(&v)
				resp.Body.Close()
				if err != nil || resp.StatusCode != 200 || len(v.Choices) != 1 || !slices.Equal(v.Choices[0].TokenIDs, want[i].OutputIDs) {
					errs <- fmt.Sprintf("client %d request %d (prompt %d): status %d err %v answer %v, want %v", c, k, i, resp.StatusCode, err, v, want[i].OutputIDs)
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Error(e)
	}

	// /v1/models, /health, /metrics.
	resp, err := http.Get(base + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	var models struct {
		Data []struct{ ID string } `json:"data"`
	}
	_ = json.NewDecoder(resp.Body).Decode(&models)
	resp.Body.Close()
	if len(models.Data) != 1 || models.Data[0].ID != "llama-3.1-8b" {
		t.Errorf("/v1/models = %+v, want llama-3.1-8b", models)
	}
	if resp, err := http.Get(base + "/health"); err != nil || resp.StatusCode != 200 {
		t.Errorf("/health: %v %v", resp, err)
	}
	requests := len(bodies) + 1 + 1 + 3 + 32 // + stream, repeat, 3 chat-ish, 32 concurrent
	fams := metricsOf(t, base)
	if n := value(t, fams, "kvx:e2e_request_latency_seconds"); int(n) != requests {
		t.Errorf("kvx:e2e_request_latency_seconds counts %v requests, want %d", n, requests)
	}
	if n := value(t, fams, "kvx:time_to_first_token_seconds"); int(n) != requests {
		t.Errorf("kvx:time_to_first_token_seconds counts %v, want %d", n, requests)
	}
	if value(t, fams, "kvx:generation_tokens_total") < float64(requests) || value(t, fams, "kvx:prefix_cache_hits_total") < float64(cached) {
		t.Errorf("token counters too low: %v generated, %v prefix hits", value(t, fams, "kvx:generation_tokens_total"), value(t, fams, "kvx:prefix_cache_hits_total"))
	}
	if value(t, fams, "kvx:prompt_tokens_total") < value(t, fams, "kvx:prefix_cache_hits_total") {
		t.Error("more prefix cache hits than prompt tokens")
	}
	// The last response can reach its client before the engine has released
	// the request and refreshed the gauges (the usage gauge at most every
	// 100 ms): they must come to 0 soon after, not at once.
	gauges := []string{"kvx:num_requests_running", "kvx:num_requests_waiting", "kvx:kv_cache_usage_perc"}
	for end := time.Now().Add(5 * time.Second); time.Now().Before(end); fams = metricsOf(t, base) {
		if !slices.ContainsFunc(gauges, func(g string) bool { return value(t, fams, g) != 0 }) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	for _, g := range gauges {
		if v := value(t, fams, g); v != 0 {
			t.Errorf("%s = %v 5 s after every request finished, want 0", g, v)
		}
	}
	value(t, fams, "kvx:num_preemptions_total")
	value(t, fams, "kvx:plugin_restarts_total")
}

// TestServeBadInput: each bad request is a clear 4xx in OpenAI's error
// shape naming the field, and the engine serves the next request as before.
func TestServeBadInput(t *testing.T) {
	base := startServe(t, genScenario, serveOpts{maxBody: 1 << 16})
	huge := `{"prompt":"` + strings.Repeat("x", 1<<16) + `"}`
	long := `{"prompt":"` + strings.Repeat("x", 400) + `"}`
	oov := `{"prompt":[1,2,258]}`
	cases := []struct {
		name, path, body string
		status           int
		param, contains  string
	}{
		{"malformed JSON", "/v1/completions", `{"prompt": "a",`, 400, "", "not valid JSON"},
		{"not an object", "/v1/completions", `[1,2]`, 400, "", "want an object"},
		{"empty body", "/v1/completions", ``, 400, "", "empty"},
		{"wrong type max_tokens", "/v1/completions", `{"prompt":"a","max_tokens":"ten"}`, 400, "max_tokens", "want an integer"},
		{"wrong type stream", "/v1/completions", `{"prompt":"a","stream":"yes"}`, 400, "stream", "want a boolean"},
		{"wrong type prompt", "/v1/completions", `{"prompt":{"a":1}}`, 400, "prompt", "want a string"},
		{"missing prompt", "/v1/completions", `{"max_tokens":3}`, 400, "prompt", "missing"},
		{"missing messages", "/v1/chat/completions", `{"max_tokens":3}`, 400, "messages", "missing"},
		{"missing role", "/v1/chat/completions", `{"messages":[{"content":"hi"}]}`, 400, "messages[0].role", "missing"},
		{"bad role", "/v1/chat/completions", `{"messages":[{"role":"robot","content":"hi"}]}`, 400, "messages[0].role", "robot"},
		{"unknown model", "/v1/completions", `{"model":"gpt-5","prompt":"a"}`, 404, "model", "gpt-5"},
		{"prompt longer than max_seq_len", "/v1/completions", long, 400, "prompt", "401 tokens, longer than max_seq_len 320"},
		{"max_tokens zero", "/v1/completions", `{"prompt":"a","max_tokens":0}`, 400, "max_tokens", "must be >= 1"},
		{"max_tokens negative", "/v1/completions", `{"prompt":"a","max_tokens":-5}`, 400, "max_tokens", "must be >= 1"},
		{"max_tokens huge", "/v1/completions", `{"prompt":"a","max_tokens":100000}`, 400, "max_tokens", "exceed max_seq_len 320 (at most 318"},
		{"max_tokens beyond int64", "/v1/completions", `{"prompt":"a","max_tokens":1e30}`, 400, "max_tokens", "want an integer"},
		{"empty prompt", "/v1/completions", `{"prompt":""}`, 400, "prompt", "empty"},
		{"empty token list", "/v1/completions", `{"prompt":[]}`, 400, "prompt", "empty"},
		{"empty chat content", "/v1/chat/completions", `{"messages":[]}`, 400, "messages", "empty"},
		{"invalid UTF-8", "/v1/completions", "{\"prompt\":\"a\xff\xfeb\"}", 400, "", "not valid UTF-8 (first bad byte at offset 12)"},
		{"token id out of vocab", "/v1/completions", oov, 400, "prompt", "prompt[2] = 258: outside the vocabulary [0, 258)"},
		{"negative token id", "/v1/completions", `{"prompt":[-1]}`, 400, "prompt", "outside the vocabulary"},
		{"fractional token id", "/v1/completions", `{"prompt":[1.5]}`, 400, "prompt", "integer"},
		{"two prompts", "/v1/completions", `{"prompt":["a","b"]}`, 400, "prompt", "one prompt per request"},
		{"n too large", "/v1/completions", `{"prompt":"a","n":17}`, 400, "n", "n = 17: must be in [1, 16]"},
		{"n zero", "/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}],"n":0}`, 400, "n", "n = 0: must be in [1, 16]"},
		{"best_of below n", "/v1/completions", `{"prompt":"a","n":3,"best_of":2}`, 400, "best_of", "best_of = 2: must be in [n = 3, 16]"},
		{"best_of streamed", "/v1/completions", `{"prompt":"a","best_of":2,"stream":true}`, 400, "best_of", "best_of = 2 with stream"},
		{"best_of in chat", "/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}],"best_of":2}`, 400, "best_of", "chat completions take no best_of"},
		{"temperature type", "/v1/completions", `{"prompt":"a","temperature":"hot"}`, 400, "temperature", "temperature: got JSON string, want a number"},
		{"temperature range", "/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}],"temperature":2.5}`, 400, "temperature", "temperature = 2.5: must be in [0, 2]"},
		{"top_p zero", "/v1/completions", `{"prompt":"a","top_p":0}`, 400, "top_p", "top_p = 0: must be in (0, 1]"},
		{"top_k type", "/v1/completions", `{"prompt":"a","top_k":2.5}`, 400, "top_k", "want an integer"},
		{"top_k range", "/v1/completions", `{"prompt":"a","top_k":-3}`, 400, "top_k", "top_k = -3: must be -1 or 0"},
		{"min_p range", "/v1/completions", `{"prompt":"a","min_p":1.5}`, 400, "min_p", "min_p = 1.5: must be in [0, 1]"},
		{"seed type", "/v1/completions", `{"prompt":"a","seed":"x"}`, 400, "seed", "want an integer"},
		{"presence range", "/v1/completions", `{"prompt":"a","presence_penalty":-2.5}`, 400, "presence_penalty", "must be in [-2, 2]"},
		{"frequency range", "/v1/completions", `{"prompt":"a","frequency_penalty":9}`, 400, "frequency_penalty", "frequency_penalty = 9: must be in [-2, 2]"},
		{"repetition range", "/v1/completions", `{"prompt":"a","repetition_penalty":0}`, 400, "repetition_penalty", "must be in (0, 2]"},
		{"min_tokens above max_tokens", "/v1/completions", `{"prompt":"a","max_tokens":4,"min_tokens":5}`, 400, "min_tokens", "min_tokens = 5: must be in [0, 4] (max_tokens)"},
		{"stop_token_ids out of vocab", "/v1/completions", `{"prompt":"a","stop_token_ids":[1,999]}`, 400, "stop_token_ids", "stop_token_ids[1] is outside the vocabulary [0, 258)"},
		{"stop_token_ids type", "/v1/completions", `{"prompt":"a","stop_token_ids":"x"}`, 400, "stop_token_ids", "want a list of integers"},
		{"ignore_eos type", "/v1/completions", `{"prompt":"a","ignore_eos":1}`, 400, "ignore_eos", "want a boolean"},
		{"stop type", "/v1/completions", `{"prompt":"a","stop":5}`, 400, "stop", "stop = 5: want a string or a list of strings"},
		{"stop empty", "/v1/completions", `{"prompt":"a","stop":["x",""]}`, 400, "stop", "stop[1] is empty"},
		{"stop too many", "/v1/completions", `{"prompt":"a","stop":["1","2","3","4","5","6","7","8","9","10","11","12","13","14","15","16","17"]}`, 400, "stop", "17 strings: the limit is 16"},
		{"completions logprobs type", "/v1/completions", `{"prompt":"a","logprobs":true}`, 400, "logprobs", "logprobs = true: want an integer in [0, 20]"},
		{"completions logprobs range", "/v1/completions", `{"prompt":"a","logprobs":21}`, 400, "logprobs", "want an integer in [0, 20]"},
		{"chat logprobs type", "/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}],"logprobs":3}`, 400, "logprobs", "logprobs = 3: want a boolean"},
		{"top_logprobs without logprobs", "/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}],"top_logprobs":2}`, 400, "top_logprobs", "needs logprobs: true"},
		{"top_logprobs range", "/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}],"logprobs":true,"top_logprobs":21}`, 400, "top_logprobs", "top_logprobs = 21: must be in [0, 20]"},
		{"top_logprobs on completions", "/v1/completions", `{"prompt":"a","top_logprobs":2}`, 400, "top_logprobs", "not a field kvx serve implements for this endpoint"},
		{"prompt_logprobs range", "/v1/completions", `{"prompt":"a","prompt_logprobs":21}`, 400, "prompt_logprobs", "prompt_logprobs = 21: want an integer in [0, 20]"},
		{"prompt_logprobs against echo's", "/v1/completions", `{"prompt":"a","echo":true,"logprobs":1,"prompt_logprobs":2}`, 400, "prompt_logprobs", "send one count"},
		{"prompt_logprobs in chat", "/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}],"prompt_logprobs":1}`, 400, "prompt_logprobs", "not a field kvx serve implements"},
		{"chat echo", "/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}],"echo":true}`, 400, "echo", "chat completions do not echo"},
		{"unknown field", "/v1/completions", `{"prompt":"a","temprature":0.5}`, 400, "temprature", "temprature is not a field kvx serve implements"},
		{"tolerant field, non-default", "/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}],"logit_bias":{"5":10}}`, 400, "logit_bias", "kvx serve does not implement logit_bias; it accepts only null or {}"},
		{"tools", "/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}],"tools":[{"type":"function"}]}`, 400, "tools", "does not implement tools"},
		{"max_completion_tokens range", "/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}],"max_completion_tokens":0}`, 400, "max_completion_tokens", "max_completion_tokens = 0: must be >= 1"},
		{"retention priority too high", "/v1/completions", `{"prompt":"a","retention_priority":101}`, 400, "retention_priority", "retention_priority = 101: must be in [1, 100]"},
		{"retention priority zero", "/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}],"retention_priority":0}`, 400, "retention_priority", "retention_priority = 0: must be in [1, 100]"},
		{"retention duration negative", "/v1/completions", `{"prompt":"a","retention_priority":50,"retention_duration_s":-2}`, 400, "retention_duration_s", "retention_duration_s = -2: must be a number of seconds > 0"},
		{"retention duration alone", "/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}],"retention_duration_s":9}`, 400, "retention_duration_s", "needs a retention_priority"},
		{"retention priority type", "/v1/completions", `{"prompt":"a","retention_priority":"high"}`, 400, "retention_priority", "want an integer"},
		{"oversized body", "/v1/completions", huge, 413, "", "limit of 65536 bytes"},
		{"wrong method", "/v1/models", "", 405, "", "use GET"},
		{"unknown path", "/v2/nothing", "{}", 404, "", "no endpoint"},
	}
	for _, c := range cases {
		resp, err := http.Post(base+c.path, "application/json", strings.NewReader(c.body))
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		data, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		var v struct {
			Error *struct {
				Message *string `json:"message"`
				Type    *string `json:"type"`
				Param   any     `json:"param"`
				Code    any     `json:"code"`
			} `json:"error"`
		}
		if err := json.Unmarshal(data, &v); err != nil || v.Error == nil || v.Error.Message == nil || v.Error.Type == nil {
			t.Errorf("%s: answer %s is not OpenAI's error shape", c.name, data)
			continue
		}
		if !bytes.Contains(data, []byte(`"code":`)) || !bytes.Contains(data, []byte(`"param":`)) {
			t.Errorf("%s: answer %s lacks code or param", c.name, data)
		}
		if resp.StatusCode != c.status || !strings.Contains(*v.Error.Message, c.contains) || fmt.Sprint(v.Error.Param) != fmt.Sprint(orNil(c.param)) {
			t.Errorf("%s: %d %s, want %d, param %q, message containing %q", c.name, resp.StatusCode, data, c.status, c.param, c.contains)
		}
	}
	// The engine is unaffected.
	code, v, _ := post(t, base+"/v1/completions", `{"prompt":"still here","max_tokens":4}`)
	if code != 200 || num(v["usage"].(map[string]any)["completion_tokens"]) != 4 {
		t.Errorf("after the bad requests: %d %v", code, v)
	}
	// The fields OpenAI clients send at their no-op values are accepted.
	code, v, _ = post(t, base+"/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}],"max_completion_tokens":3,"user":"u1",
		"logit_bias":{},"tools":[],"tool_choice":"none","parallel_tool_calls":true,"response_format":{"type":"text"},"store":false,
		"service_tier":"auto","metadata":{},"n":1,"best_of":1,"logprobs":false,"temperature":0,"top_p":1,"presence_penalty":0,"frequency_penalty":0}`)
	if code != 200 || num(v["usage"].(map[string]any)["completion_tokens"]) != 3 {
		t.Errorf("with the default fields of OpenAI clients: %d %v", code, v)
	}
	// A valid retention is accepted (a hint to a manager that ignores it).
	code, v, _ = post(t, base+"/v1/completions", `{"prompt":"keep me","max_tokens":2,"retention_priority":90,"retention_duration_s":30}`)
	if code != 200 || num(v["usage"].(map[string]any)["completion_tokens"]) != 2 {
		t.Errorf("with retention_priority 90 for 30 s: %d %v", code, v)
	}
}

func orNil(s string) any {
	if s == "" {
		return nil
	}
	return s
}

// TestServeTooManyWaiting: beyond --max-waiting requests without a first
// token, a request gets 429 with Retry-After; the others complete.
func TestServeTooManyWaiting(t *testing.T) {
	base := startServe(t, genScenario, serveOpts{maxWaiting: 1})
	body := `{"prompt":"` + strings.Repeat("y", 250) + `","max_tokens":8}`
	var wg sync.WaitGroup
	var mu sync.Mutex
	codes := map[int]int{}
	retry := ""
	for range 12 {
		wg.Go(func() {
			resp, err := http.Post(base+"/v1/completions", "application/json", strings.NewReader(body))
			if err != nil {
				t.Error(err)
				return
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			mu.Lock()
			codes[resp.StatusCode]++
			if resp.StatusCode == 429 {
				retry = resp.Header.Get("Retry-After")
			}
			mu.Unlock()
		})
	}
	wg.Wait()
	if codes[429] == 0 || codes[200] == 0 || codes[429]+codes[200] != 12 || retry == "" {
		t.Errorf("statuses %v, Retry-After %q: want some 200, some 429 with Retry-After, nothing else", codes, retry)
	}
}

// TestServeDisconnectFreesBlocks: a client that goes away mid-stream has its
// request cancelled: it stops running and its blocks are freed, and the
// server serves the next request.
func TestServeDisconnectFreesBlocks(t *testing.T) {
	// Long enough to be cancelled mid-way: 4000 tokens.
	base := startServe(t, genScenario, serveOpts{}, "kv_cache_config.enable_block_reuse=false",
		"max_seq_len=4096", "kv_cache_config.max_tokens=8192")
	req, _ := http.NewRequest("POST", base+"/v1/completions", strings.NewReader(`{"prompt":"go away soon","max_tokens":4000,"stream":true,"ignore_eos":true}`))
	ctx, cancel := context.WithCancel(context.Background())
	resp, err := http.DefaultClient.Do(req.WithContext(ctx))
	if err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(resp.Body)
	for range 3 { // a few events: it is running
		if _, err := br.ReadString('\n'); err != nil {
			t.Fatal(err)
		}
	}
	for start := time.Now(); ; time.Sleep(10 * time.Millisecond) {
		f := metricsOf(t, base)
		run, usage := value(t, f, "kvx:num_requests_running"), value(t, f, "kvx:kv_cache_usage_perc")
		if run == 1 && usage > 0 {
			break
		}
		if time.Since(start) > 2*time.Second {
			t.Fatalf("while streaming: running %v, kv usage %v; want 1 and > 0", run, usage)
		}
	}
	cancel()
	resp.Body.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		f := metricsOf(t, base)
		run, usage := value(t, f, "kvx:num_requests_running"), value(t, f, "kvx:kv_cache_usage_perc")
		if run == 0 && usage == 0 {
			if gen := value(t, f, "kvx:generation_tokens_total"); gen >= 3990 {
				t.Errorf("the cancelled request generated %v tokens: it was not cancelled", gen)
			}
			if value(t, f, "kvx:request_success_total") != 1 {
				t.Errorf("request_success_total = %v, want the one abort", value(t, f, "kvx:request_success_total"))
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("10 s after the client went away: running %v, kv usage %v", run, usage)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if code, v, _ := post(t, base+"/v1/completions", `{"prompt":"next","max_tokens":3}`); code != 200 {
		t.Errorf("after the disconnect: %d %v", code, v)
	}
}

// TestServeSim: on device sim the tokens are placeholders of the requested
// length and the latency metrics are simulated seconds, counted per request.
func TestServeSim(t *testing.T) {
	base := startServe(t, serveSim, serveOpts{}, "served_model_name=sim-llama")
	code, v, _ := post(t, base+"/v1/completions", `{"model":"sim-llama","prompt":"hello","max_tokens":7}`)
	if code != 200 {
		t.Fatalf("%d %v", code, v)
	}
	a := parseAnswer(t, v, false)
	if len(a.ids) != 7 || strings.Count(a.text, "<") != 7 || num(a.usage["prompt_tokens"]) != 6 {
		t.Errorf("sim answer %+v: want 7 placeholder tokens for a 6-token prompt", a)
	}
	text, usage, _ := stream(t, base+"/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}],"max_tokens":5,"stream":true,"stream_options":{"include_usage":true}}`, true)
	if strings.Count(text, "<") != 5 || num(usage["completion_tokens"]) != 5 {
		t.Errorf("sim chat stream: text %q usage %v", text, usage)
	}
	code, _, _ = post(t, base+"/v1/completions", `{"model":"llama-3.1-8b","prompt":"hello"}`)
	if code != 404 {
		t.Errorf("the config's model name with served_model_name set: %d, want 404", code)
	}
	f := metricsOf(t, base)
	if n := value(t, f, "kvx:e2e_request_latency_seconds"); n != 2 {
		t.Errorf("e2e latency counts %v requests, want 2", n)
	}
	sum := f["kvx:e2e_request_latency_seconds"].Metric[0].Histogram.GetSampleSum()
	if sum <= 0 || sum > 1 {
		t.Errorf("simulated e2e latency sum %v s for 12 tokens of an 8B model on an H200: want (0, 1]", sum)
	}
}

// TestServeBinary: the real binary serves on loopback with its plugins as
// processes and stops cleanly on SIGINT, leaving no plugin process behind.
func TestServeBinary(t *testing.T) {
	t.Parallel()
	cmd := kvxCommand(t, "serve", "-c", genScenario, "--port", "0")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	sc := bufio.NewScanner(stderr)
	base := ""
	for sc.Scan() {
		if u, ok := strings.CutPrefix(sc.Text(), "kvx serve: listening on "); ok {
			base = u
			break
		}
	}
	if !strings.HasPrefix(base, "http://127.0.0.1:") {
		t.Fatalf("no loopback listening line (got %q)", base)
	}
	go io.Copy(io.Discard, stderr)
	code, v, _ := post(t, base+"/v1/completions", `{"prompt":[256,1,2,3],"max_tokens":5}`)
	if code != 200 || len(parseAnswer(t, v, false).ids) != 5 {
		t.Errorf("plugins: %d %v", code, v)
	}
	if n := len(pluginPIDs(t)); n != 2 {
		t.Errorf("%d plugin processes while serving, want 2 (a manager and a worker)", n)
	}
	if err := cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err != nil {
		t.Errorf("kvx serve after SIGINT: %v, want exit 0", err)
	}
	time.Sleep(200 * time.Millisecond)
	if pids := pluginPIDs(t); len(pids) > 0 {
		t.Errorf("plugin processes left after kvx serve stopped: %v", pids)
	}
}

// TestServeOpenAIClient: the official openai npm client (installed by
// .ci/run into testdata/openai) lists the model, completes, streams and
// chats against kvx serve on cpu, and gets kvx generate's text; a bad
// request reaches it as a 400 with the server's message. Skipped where
// node or the client is not installed.
func TestServeOpenAIClient(t *testing.T) {
	node, err := exec.LookPath("node")
	if err != nil {
		t.Skip("node is not installed")
	}
	if _, err := os.Stat("testdata/openai/node_modules/openai"); err != nil {
		t.Skip("the openai client is not installed: npm install --prefix cmd/kvx/testdata/openai (.ci/run does)")
	}
	prompts := filepath.Join(t.TempDir(), "p.jsonl")
	if err := os.WriteFile(prompts, []byte(`{"prompt": "kvx generates", "max_tokens": 12}`+"\n"+
		fmt.Sprintf(`{"prompt": %q, "max_tokens": 6}`, serve.ChatPrompt([]string{"user"}, []string{"hello"}))+"\n"+
		`{"prompt": "kvx generates", "max_tokens": 12, "temperature": 1.1, "top_p": 0.9, "seed": 11}`+"\n"+
		`{"prompt": "kvx generates", "max_tokens": 12, "temperature": 1.1, "top_p": 0.9, "seed": 12}`+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	want, out, stderr, code := generate(t, prompts, "--set", "isolation=inprocess", "--top-logprobs=2")
	if code != 0 {
		t.Fatalf("generate: exit %d\n%s%s", code, out, stderr)
	}
	base := startServe(t, genScenario, serveOpts{})
	cmd := exec.Command(node, "client.mjs")
	cmd.Dir = "testdata/openai"
	cmd.Env = append(os.Environ(), "KVX_BASE_URL="+base)
	var errb bytes.Buffer
	cmd.Stderr = &errb
	data, err := cmd.Output()
	if err != nil {
		t.Fatalf("node client.mjs: %v\n%s", err, errb.String())
	}
	t.Logf("openai client: %s", data)
	type usage struct {
		PromptTokens     int `json:"prompt_tokens"`
		CompletionTokens int `json:"completion_tokens"`
	}
	type text struct {
		Text  string `json:"text"`
		Usage *usage `json:"usage"`
	}
	var got struct {
		Models                           []string
		Completion, Stream, Chat, ChatSt text
		BadRequest                       struct {
			Status  int
			Message string
		}
	}
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(data, &raw); err != nil {
		t.Fatalf("client output %s: %v", data, err)
	}
	for k, dst := range map[string]any{"models": &got.Models, "completion": &got.Completion, "stream": &got.Stream,
		"chat": &got.Chat, "chatStream": &got.ChatSt, "badRequest": &got.BadRequest} {
		if err := json.Unmarshal(raw[k], dst); err != nil {
			t.Fatalf("client output %s: %s: %v", data, k, err)
		}
	}
	if !slices.Equal(got.Models, []string{"llama-3.1-8b"}) {
		t.Errorf("models.list = %v", got.Models)
	}
	for name, c := range map[string]text{"completion": got.Completion, "stream": got.Stream} {
		if c.Text != *want[0].Text || c.Usage == nil || c.Usage.CompletionTokens != 12 || c.Usage.PromptTokens != 14 {
			t.Errorf("%s: %+v (usage %+v), want generate's %q, 14 + 12 tokens", name, c, c.Usage, *want[0].Text)
		}
	}
	if got.Chat.Text != *want[1].Text || got.ChatSt.Text != *want[1].Text || got.Chat.Usage == nil || got.Chat.Usage.CompletionTokens != 6 {
		t.Errorf("chat %+v, streamed %+v, want generate's %q for the template's prompt", got.Chat, got.ChatSt, *want[1].Text)
	}
	if got.BadRequest.Status != 400 || !strings.Contains(got.BadRequest.Message, "max_tokens = 0") {
		t.Errorf("max_tokens 0 through the client: %+v, want 400 naming max_tokens", got.BadRequest)
	}
	checkOpenAISampling(t, raw, want)
}

// checkOpenAISampling checks what client.mjs got for seeded sampling, stop
// and logprobs against kvx generate's completions want (the greedy
// prompt, the chat prompt, the seeded prompt; top logprobs 2).
func checkOpenAISampling(t *testing.T, raw map[string]json.RawMessage, want []completion) {
	t.Helper()
	var sampled struct{ Text, Again, Finish string }
	var stop *struct{ Stop, Text, Finish, StreamText, StreamFinish string }
	var lp struct {
		Tokens        []string             `json:"tokens"`
		TokenLogprobs []float64            `json:"token_logprobs"`
		TopLogprobs   []map[string]float64 `json:"top_logprobs"`
		TextOffset    []int                `json:"text_offset"`
	}
	var chat struct {
		Content []struct {
			Token       string  `json:"token"`
			Logprob     float64 `json:"logprob"`
			Bytes       []int   `json:"bytes"`
			TopLogprobs []struct {
				Token   string  `json:"token"`
				Logprob float64 `json:"logprob"`
			} `json:"top_logprobs"`
		} `json:"content"`
	}
	var n struct {
		Texts   []string
		Indexes []int
		Usage   struct {
			PromptTokens     int `json:"prompt_tokens"`
			CompletionTokens int `json:"completion_tokens"`
		}
		Chat []string
	}
	type usage struct {
		PromptTokens     int `json:"prompt_tokens"`
		CompletionTokens int `json:"completion_tokens"`
	}
	var n4 struct {
		Texts, Stream      []string
		Usage, StreamUsage *usage
	}
	for k, dst := range map[string]any{"sampled": &sampled, "stop": &stop, "logprobs": &lp, "chatLogprobs": &chat, "n": &n, "n4": &n4} {
		if err := json.Unmarshal(raw[k], dst); err != nil {
			t.Fatalf("client output: %s: %v (%s)", k, err, raw[k])
		}
	}
	// generate's text is raw bytes; JSON carries them as UTF-8.
	valid := func(s string) string { return strings.ToValidUTF8(s, "\uFFFD") }
	if sampled.Text != sampled.Again || sampled.Text != valid(*want[2].Text) || sampled.Text == valid(*want[0].Text) {
		t.Errorf("seed 11 through the client: %q then %q, want generate's %q twice, not the greedy %q", sampled.Text, sampled.Again, *want[2].Text, *want[0].Text)
	}
	if !slices.Equal(n.Texts, []string{valid(*want[2].Text), valid(*want[3].Text)}) || !slices.Equal(n.Indexes, []int{0, 1}) ||
		n.Usage.PromptTokens != 14 || n.Usage.CompletionTokens != 24 || len(n.Chat) != 2 || n.Chat[0] == n.Chat[1] {
		t.Errorf("n 2 through the client: %+v; want seeds 11 and 12 of generate (%q, %q), indexes 0 1, 14 + 24 tokens, two chat choices",
			n, *want[2].Text, *want[3].Text)
	}
	if len(n4.Texts) != 4 || !slices.Equal(n4.Texts[:2], n.Texts) || !slices.Equal(n4.Stream, n4.Texts) || n4.Usage == nil || n4.StreamUsage == nil ||
		*n4.Usage != (usage{14, 48}) || *n4.StreamUsage != *n4.Usage {
		t.Errorf("n 4 through the client: %+v (usage %+v, streamed %+v); want seeds 11..14 (the first two n 2's %q), the same streamed by index, 14 + 48 tokens",
			n4, n4.Usage, n4.StreamUsage, n.Texts)
	}
	if stop == nil {
		t.Errorf("the greedy text %q has no two letters or digits for a stop string", *want[0].Text)
	} else {
		cut := valid(*want[0].Text)
		cut = cut[:strings.Index(cut, stop.Stop)]
		if stop.Text != cut || stop.Finish != "stop" || stop.StreamText != cut || stop.StreamFinish != "stop" {
			t.Errorf("stop %q through the client: %q (%s), streamed %q (%s); want %q (stop)", stop.Stop, stop.Text, stop.Finish, stop.StreamText, stop.StreamFinish, cut)
		}
	}
	if len(lp.TokenLogprobs) != len(want[0].OutputIDs) || len(lp.Tokens) != len(lp.TokenLogprobs) || len(lp.TopLogprobs) != len(lp.TokenLogprobs) || len(lp.TextOffset) != len(lp.TokenLogprobs) {
		t.Fatalf("completions logprobs through the client: %+v, want one entry per token of %v", lp, want[0].OutputIDs)
	}
	for i, v := range lp.TokenLogprobs {
		if v != want[0].TopLogprobs[i][0].Logprob || len(lp.TopLogprobs[i]) == 0 {
			t.Errorf("token %d: logprob %v (top %v), generate's %v", i, v, lp.TopLogprobs[i], want[0].TopLogprobs[i])
		}
	}
	if len(chat.Content) != len(want[1].OutputIDs) {
		t.Fatalf("chat logprobs through the client: %d entries, want %d", len(chat.Content), len(want[1].OutputIDs))
	}
	for i, e := range chat.Content {
		if e.Logprob != e.TopLogprobs[0].Logprob || len(e.TopLogprobs) != 2 || len(e.Bytes) == 0 && e.Token != "" {
			t.Errorf("chat token %d: %+v, want its logprob first of 2 alternatives, with bytes", i, e)
		}
	}
}
