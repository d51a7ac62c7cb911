package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// idsJSON is ids as a JSON list.
func idsJSON(ids []int32) string {
	s := make([]string, len(ids))
	for i, id := range ids {
		s[i] = strconv.Itoa(int(id))
	}
	return "[" + strings.Join(s, ",") + "]"
}

// floats reads a JSON list of numbers and nulls (NaN for null).
func floats(t *testing.T, v any) []any {
	t.Helper()
	l, ok := v.([]any)
	if !ok {
		t.Fatalf("%v is not a list", v)
	}
	return l
}

// TestServePromptLogprobs: completions echo with logprobs returns the
// prompt's tokens first in OpenAI's shape (the first token's logprob and
// top_logprobs null, text_offset from the prompt's start), and vLLM's
// prompt_logprobs gives the same values per prompt token; each value is
// the one the dense recompute gives: prompt Q = P + the greedy tokens kvx
// serve generated after P one at a time (decode), so Q's rows past P must
// equal those tokens' completion logprobs bit for bit. Q is longer than
// max_num_tokens (chunked prefill, rows taken once each) and its prefix P
// is in the prefix cache (which the request must not reuse). Streamed, the
// logprobs are the same; bad prompt_logprobs are a 400 naming the field.
func TestServePromptLogprobs(t *testing.T) {
	base := startServe(t, genScenario, serveOpts{})
	p := []int32{107, 118, 120, 32, 103, 101, 110, 101, 114, 97, 116, 101, 115, 32, 112, 114, 111, 109, 112, 116, 115, 32, 116, 111, 111}
	const gen = 60
	first, ch := complete(t, base, fmt.Sprintf(`{"prompt":%s,"max_tokens":%d,"ignore_eos":true,"logprobs":0}`, idsJSON(p), gen))
	if len(first.ids) != gen {
		t.Fatalf("P: %d tokens, want %d", len(first.ids), gen)
	}
	want := floats(t, ch["logprobs"].(map[string]any)["token_logprobs"])
	q := append(append([]int32{}, p...), first.ids[:gen-1]...)
	body := fmt.Sprintf(`{"prompt":%s,"max_tokens":1,"ignore_eos":true,"echo":true,"logprobs":2}`, idsJSON(q))
	code, v, _ := post(t, base+"/v1/completions", body)
	if code != 200 {
		t.Fatalf("echo+logprobs: %d %v", code, v)
	}
	c := v["choices"].([]any)[0].(map[string]any)
	lp := c["logprobs"].(map[string]any)
	toks, lps, tops, offs := floats(t, lp["tokens"]), floats(t, lp["token_logprobs"]), floats(t, lp["top_logprobs"]), floats(t, lp["text_offset"])
	if n := len(q) + 1; len(toks) != n || len(lps) != n || len(tops) != n || len(offs) != n {
		t.Fatalf("echo+logprobs: %d tokens, %d logprobs, %d top lists, %d offsets; want %d each (prompt then completion)", len(toks), len(lps), len(tops), len(offs), n)
	}
	if lps[0] != nil || tops[0] != nil || offs[0].(float64) != 0 {
		t.Errorf("prompt's first token: logprob %v, top %v, offset %v; want null, null, 0", lps[0], tops[0], offs[0])
	}
	for i := 1; i < len(q); i++ {
		x, ok := lps[i].(float64)
		if !ok || x > 0 {
			t.Fatalf("prompt token %d: logprob %v, want a number <= 0", i, lps[i])
		}
		if m := tops[i].(map[string]any); len(m) < 1 || len(m) > 3 {
			t.Errorf("prompt token %d: top_logprobs %v, want 2 alternatives and the token", i, m)
		}
		if offs[i].(float64) < offs[i-1].(float64) {
			t.Errorf("text_offset %v decreases at %d", offs, i)
		}
	}
	for k := 0; k < gen-1; k++ {
		if got := lps[len(p)+k]; got != want[k] {
			t.Errorf("prompt token %d (generated token %d of P): logprob %v, want decode's %v", len(p)+k, k, got, want[k])
		}
	}
	if u := v["usage"].(map[string]any)["prompt_tokens_details"].(map[string]any); u["cached_tokens"].(float64) != 0 {
		t.Errorf("usage %v: a prompt-logprobs request reused cached tokens", u)
	}

	// vLLM's prompt_logprobs: the same values, keyed by token id.
	_, ch = complete(t, base, fmt.Sprintf(`{"prompt":%s,"max_tokens":1,"ignore_eos":true,"prompt_logprobs":1}`, idsJSON(q)))
	plp := floats(t, ch["prompt_logprobs"])
	if len(plp) != len(q) || plp[0] != nil {
		t.Fatalf("prompt_logprobs: %d entries (first %v), want %d, the first null", len(plp), plp[0], len(q))
	}
	for i := 1; i < len(q); i++ {
		e, ok := plp[i].(map[string]any)[strconv.Itoa(int(q[i]))].(map[string]any)
		if !ok || e["logprob"] != lps[i] {
			t.Errorf("prompt_logprobs[%d] = %v, want token %d's logprob %v", i, plp[i], q[i], lps[i])
		}
	}

	// Streamed: the first chunk carries the prompt's part.
	resp, err := http.Post(base+"/v1/completions", "application/json", strings.NewReader(strings.Replace(body, `"echo"`, `"stream":true,"echo"`, 1)))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var streamed []any
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok || data == "[DONE]" {
			continue
		}
		var ev map[string]any
		if err := json.Unmarshal([]byte(data), &ev); err != nil {
			t.Fatal(err)
		}
		for _, c := range ev["choices"].([]any) {
			if l, ok := c.(map[string]any)["logprobs"].(map[string]any); ok {
				streamed = append(streamed, l["token_logprobs"].([]any)...)
			}
		}
	}
	if fmt.Sprint(streamed) != fmt.Sprint(lps) {
		t.Errorf("streamed token_logprobs %v, want %v", streamed, lps)
	}

	// Chunks of 7 tokens on the other manager, three such requests at once
	// in a cache that holds two: the same rows, each position once.
	other := startServe(t, genScenario, serveOpts{}, "max_num_tokens=7", "kv_cache_config.tokens_per_block=4", "cache_manager=v1", "kv_cache_config.max_tokens=192", "max_seq_len=128")
	var wg sync.WaitGroup
	for range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			code, v, _ := post(t, other+"/v1/completions", body)
			if code != 200 {
				t.Errorf("chunks of 7: %d %v", code, v)
				return
			}
			got := v["choices"].([]any)[0].(map[string]any)["logprobs"].(map[string]any)["token_logprobs"]
			if fmt.Sprint(got) != fmt.Sprint(lps) {
				t.Errorf("chunks of 7, v1: token_logprobs %v, want %v", got, lps)
			}
		}()
	}
	wg.Wait()

	for _, bad := range []string{`21`, `-1`, `"2"`, `1.5`} {
		code, v, _ := post(t, base+"/v1/completions", `{"prompt":"kvx","max_tokens":1,"prompt_logprobs":`+bad+`}`)
		e, _ := v["error"].(map[string]any)
		msg := fmt.Sprint(e["message"])
		if code != 400 || e["param"] != "prompt_logprobs" || !strings.Contains(msg, "prompt_logprobs = "+bad) || !strings.Contains(msg, "[0, 20]") {
			t.Errorf("prompt_logprobs %s: %d %v, want a 400 naming the field, the value and [0, 20]", bad, code, v)
		}
	}
}
