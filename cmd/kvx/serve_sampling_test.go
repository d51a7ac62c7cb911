package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"unicode/utf8"

	modeltok "github.com/kvx-dev/kvx/plugins/model/tok"
)

// complete posts a completions body and parses its one choice; it fails the
// test on anything but a 200.
func complete(t *testing.T, base, body string) (answer, map[string]any) {
	t.Helper()
	code, v, _ := post(t, base+"/v1/completions", body)
	if code != 200 {
		t.Fatalf("%s: %d %v", body, code, v)
	}
	return parseAnswer(t, v, false), v["choices"].([]any)[0].(map[string]any)
}

// streamFinish posts a streaming body and returns its text and the
// finish_reason of its last choice chunk.
func streamFinish(t *testing.T, url, body string, chat bool) (string, string) {
	t.Helper()
	text, _, _ := stream(t, url, body, chat)
	_, v, _ := post(t, url, strings.Replace(body, `"stream":true`, `"stream":false`, 1))
	return text, fmt.Sprint(v["choices"].([]any)[0].(map[string]any)["finish_reason"])
}

// tokenIndex is the index of the token whose byte holds text offset off (the
// byte tokenizer: ids below 256 are one byte each, BOS and EOS none).
func tokenIndex(ids []int32, off int) int {
	n := 0
	for i, id := range ids {
		if id < 256 {
			if n == off {
				return i
			}
			n++
		}
	}
	return -1
}

// TestServeSamplingStopLogprobs runs the sampling, stop and logprobs fields
// end to end over HTTP on the cpu device: a seeded request gives the same
// tokens alone, beside other requests and through kvx generate, and not
// the greedy ones; a stop string ends it where the text first holds it,
// cut from the text, streamed or not (a stream never sends a part of it);
// stop_token_ids end it at the id, whose text is dropped; min_tokens keeps
// the id from being generated before; logprobs are kvx generate's values.
func TestServeSamplingStopLogprobs(t *testing.T) {
	base := startServe(t, genScenario, serveOpts{})
	const prompt = `"prompt":"kvx generates","max_tokens":48,"ignore_eos":true`
	greedy, _ := complete(t, base, `{`+prompt+`}`)
	if len(greedy.ids) != 48 || greedy.finish != "length" {
		t.Fatalf("greedy: %d tokens, finish %s; want 48, length", len(greedy.ids), greedy.finish)
	}

	// Seeded sampling.
	sampled := `{` + prompt + `,"temperature":1.2,"top_p":0.95,"top_k":50,"min_p":0.01,"seed":7,"presence_penalty":0.2,"repetition_penalty":1.1}`
	s1, _ := complete(t, base, sampled)
	var wg sync.WaitGroup
	var s2 answer
	wg.Add(2)
	go func() { defer wg.Done(); s2, _ = complete(t, base, sampled) }()
	go func() {
		defer wg.Done()
		complete(t, base, `{"prompt":"a neighbour in the batch","max_tokens":40,"temperature":1,"seed":3,"ignore_eos":true}`)
	}()
	wg.Wait()
	if !slices.Equal(s1.ids, s2.ids) || len(s1.ids) != 48 {
		t.Errorf("seed 7 twice (the second beside another request): %v and %v, want the same 48 tokens", s1.ids, s2.ids)
	}
	if slices.Equal(s1.ids, greedy.ids) {
		t.Errorf("temperature 1.2 gave the greedy tokens %v", s1.ids)
	}
	if other, _ := complete(t, base, strings.Replace(sampled, `"seed":7`, `"seed":8`, 1)); slices.Equal(other.ids, s1.ids) {
		t.Errorf("seeds 7 and 8 gave the same tokens %v", s1.ids)
	}
	line := `{"prompt":"kvx generates","max_tokens":48,"ignore_eos":true,"temperature":1.2,"top_p":0.95,"top_k":50,"min_p":0.01,"seed":7,"presence_penalty":0.2,"repetition_penalty":1.1}`
	gen, out, stderr, code := generate(t, writeLines(t, line, `{"prompt":"kvx generates","max_tokens":48,"ignore_eos":true}`), "--set", "isolation=inprocess", "--top-logprobs=3")
	if code != 0 || len(gen) != 2 {
		t.Fatalf("generate: exit %d\n%s%s", code, out, stderr)
	}
	if !slices.Equal(gen[0].OutputIDs, s1.ids) || *gen[0].Text != s1.text {
		t.Errorf("generate with seed 7: %v %q, serve gave %v %q", gen[0].OutputIDs, *gen[0].Text, s1.ids, s1.text)
	}

	// n: choice i samples with seed 7+i, each as a request of its own
	// would; usage counts the prompt once and every choice's tokens.
	code, v, _ := post(t, base+"/v1/completions", strings.TrimSuffix(sampled, "}")+`,"n":3}`)
	if code != 200 {
		t.Fatalf("n 3: %d %v", code, v)
	}
	chs := v["choices"].([]any)
	total := 0
	for i, c := range chs {
		c := c.(map[string]any)
		want, _ := complete(t, base, strings.Replace(sampled, `"seed":7`, fmt.Sprintf(`"seed":%d`, 7+i), 1))
		var ids []int32
		for _, id := range c["token_ids"].([]any) {
			ids = append(ids, int32(id.(float64)))
		}
		if num(c["index"]) != i || !slices.Equal(ids, want.ids) || c["text"] != want.text {
			t.Errorf("n 3: choice %d (index %v) %v, want seed %d's %v", i, c["index"], ids, 7+i, want.ids)
		}
		total += len(ids)
	}
	if u := v["usage"].(map[string]any); len(chs) != 3 || num(u["completion_tokens"]) != total || num(u["prompt_tokens"]) != num(s1.usage["prompt_tokens"]) {
		t.Errorf("n 3: %d choices, usage %v; want 3, %d completion tokens, the prompt once", len(chs), u, total)
	}
	// best_of 3, n 1: the one of the three with the highest log-probability.
	best, bestLP := -1, math.Inf(-1)
	for i := range 3 {
		_, ch := complete(t, base, strings.TrimSuffix(strings.Replace(sampled, `"seed":7`, fmt.Sprintf(`"seed":%d`, 7+i), 1), "}")+`,"logprobs":0}`)
		var sum float64
		for _, x := range ch["logprobs"].(map[string]any)["token_logprobs"].([]any) {
			sum += x.(float64)
		}
		if sum > bestLP {
			best, bestLP = i, sum
		}
	}
	bo, ch := complete(t, base, strings.TrimSuffix(sampled, "}")+`,"best_of":3}`)
	if want, _ := complete(t, base, strings.Replace(sampled, `"seed":7`, fmt.Sprintf(`"seed":%d`, 7+best), 1)); !slices.Equal(bo.ids, want.ids) || ch["logprobs"] != nil {
		t.Errorf("best_of 3: %v (logprobs %v), want seed %d's %v (log-probability %v) without logprobs", bo.ids, ch["logprobs"], 7+best, want.ids, bestLP)
	}
	// Streamed chat with n 2: each index's deltas add up to its choice.
	nchat := `{"messages":[{"role":"user","content":"hi"}],"max_tokens":20,"ignore_eos":true,"temperature":1,"seed":5,"n":2`
	code, v, _ = post(t, base+"/v1/chat/completions", nchat+`}`)
	if code != 200 || len(v["choices"].([]any)) != 2 {
		t.Fatalf("chat n 2: %d %v", code, v)
	}
	texts := streamByIndex(t, base+"/v1/chat/completions", nchat+`,"stream":true}`)
	for i, c := range v["choices"].([]any) {
		if want := c.(map[string]any)["message"].(map[string]any)["content"]; texts[i] != want {
			t.Errorf("chat n 2 streamed: index %d %q, want %q", i, texts[i], want)
		}
	}
	if texts[0] == texts[1] {
		t.Errorf("chat n 2: both choices %q: seeds 5 and 6 should differ", texts[0])
	}

	// A stop string of two printable bytes of the greedy text.
	at := printablePair(greedy.text, 8)
	if at < 0 {
		t.Fatalf("greedy text %q has no two printable bytes to stop at", greedy.text)
	}
	stop := greedy.text[at : at+2]
	first := strings.Index(greedy.text, stop)
	wantIDs := greedy.ids[:tokenIndex(greedy.ids, first+1)+1]
	body := fmt.Sprintf(`{%s,"stop":[%q,"never appears \u00e9\u00e9"]}`, prompt, stop)
	a, _ := complete(t, base, body)
	if a.text != greedy.text[:first] || !slices.Equal(a.ids, wantIDs) || a.finish != "stop" || num(a.usage["completion_tokens"]) != len(wantIDs) {
		t.Errorf("stop %q: %q %v (%s, usage %v), want %q %v (stop)", stop, a.text, a.ids, a.finish, a.usage, greedy.text[:first], wantIDs)
	}
	st, fin := streamFinish(t, base+"/v1/completions", strings.TrimSuffix(body, "}")+`,"stream":true}`, false)
	if st != greedy.text[:first] || fin != "stop" {
		t.Errorf("stop %q streamed: %q (%s), want %q (stop)", stop, st, fin, greedy.text[:first])
	}
	chat := `{"messages":[{"role":"user","content":"hi"}],"max_tokens":40,"ignore_eos":true`
	ca := chatAnswer(t, base, chat+`}`)
	if i := printablePair(ca.text, 1); i >= 0 {
		cs := ca.text[i : i+2]
		cut := ca.text[:strings.Index(ca.text, cs)]
		got := chatAnswer(t, base, fmt.Sprintf(`%s,"stop":%q}`, chat, cs))
		st, fin := streamFinish(t, base+"/v1/chat/completions", fmt.Sprintf(`%s,"stop":%q,"stream":true}`, chat, cs), true)
		if got.text != cut || got.finish != "stop" || st != cut || fin != "stop" {
			t.Errorf("chat stop %q: %q (%s), streamed %q (%s); want %q (stop)", cs, got.text, got.finish, st, fin, cut)
		}
	}

	// A stopped request's blocks are free at once, and its prompt's full
	// blocks cached: the prompt sent again comes from the cache.
	long := `"prompt":[256,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23,24,25,26,27,28,29,30,31,32,33,34,35,36,37,38,39],"max_tokens":60,"ignore_eos":true,"temperature":1,"seed":3`
	lg, _ := complete(t, base, `{`+long+`,"cache_salt":"first"}`)
	at = -1 // a token that first occurs late: the request stops mid-way
	for i := 15; i < len(lg.ids) && at < 0; i++ {
		if slices.Index(lg.ids, lg.ids[i]) == i {
			at = i
		}
	}
	if at < 0 {
		t.Fatalf("no token of %v first occurs at 15 or later", lg.ids)
	}
	// A salt of its own: the cache holds nothing of it before.
	a, _ = complete(t, base, fmt.Sprintf(`{%s,"stop_token_ids":[%d],"cache_salt":"stopped"}`, long, lg.ids[at]))
	if a.finish != "stop" || !slices.Equal(a.ids, lg.ids[:at+1]) || num(a.usage["prompt_tokens_details"].(map[string]any)["cached_tokens"]) != 0 {
		t.Fatalf("stop at %d: %v (%s, usage %v), want %v with nothing cached", lg.ids[at], a.ids, a.finish, a.usage, lg.ids[:at+1])
	}
	f := metricsOf(t, base)
	if run, usage := value(t, f, "kvx:num_requests_running"), value(t, f, "kvx:kv_cache_usage_perc"); run != 0 || usage != 0 {
		t.Errorf("after the stopped request: running %v, kv usage %v; want 0 and 0", run, usage)
	}
	again, _ := complete(t, base, `{`+strings.Replace(long, `"max_tokens":60`, `"max_tokens":1`, 1)+`,"cache_salt":"stopped"}`)
	if cached := num(again.usage["prompt_tokens_details"].(map[string]any)["cached_tokens"]); cached != 32 {
		t.Errorf("the stopped request's prompt again: cached %d, want 32 (its 2 full blocks)", cached)
	}

	// The stopped requests count under finished_reason "stop".
	reasons := map[string]float64{}
	for _, m := range metricsOf(t, base)["kvx:request_success_total"].GetMetric() {
		for _, l := range m.GetLabel() {
			if l.GetName() == "finished_reason" {
				reasons[l.GetValue()] = m.GetCounter().GetValue()
			}
		}
	}
	if reasons["stop"] < 3 || reasons["length"] < 5 {
		t.Errorf("request_success_total by finished_reason = %v, want the stopped ones under stop", reasons)
	}

	// stop_token_ids, and min_tokens before them.
	sid := greedy.ids[6]
	k := slices.Index(greedy.ids, sid)
	a, _ = complete(t, base, fmt.Sprintf(`{%s,"stop_token_ids":[%d]}`, prompt, sid))
	if !slices.Equal(a.ids, greedy.ids[:k+1]) || a.text != modeltok.DecodeBytes(greedy.ids[:k]) || a.finish != "stop" {
		t.Errorf("stop_token_ids [%d]: %v %q (%s), want %v %q (stop)", sid, a.ids, a.text, a.finish, greedy.ids[:k+1], modeltok.DecodeBytes(greedy.ids[:k]))
	}
	st, fin = streamFinish(t, base+"/v1/completions", fmt.Sprintf(`{%s,"stop_token_ids":[%d],"stream":true}`, prompt, sid), false)
	if st != modeltok.DecodeBytes(greedy.ids[:k]) || fin != "stop" {
		t.Errorf("stop_token_ids [%d] streamed: %q (%s), want %q (stop)", sid, st, fin, modeltok.DecodeBytes(greedy.ids[:k]))
	}
	a, _ = complete(t, base, fmt.Sprintf(`{%s,"stop_token_ids":[%d],"min_tokens":%d}`, prompt, sid, k+2))
	if slices.Contains(a.ids[:min(k+2, len(a.ids))], sid) || len(a.ids) < k+2 || !slices.Equal(a.ids[:k], greedy.ids[:k]) {
		t.Errorf("stop_token_ids [%d] with min_tokens %d: %v; want none of it among the first %d, the first %d greedy", sid, k+2, a.ids, k+2, k)
	}

	// Logprobs: kvx generate's values (its second line is the greedy prompt).
	_, ch = complete(t, base, `{`+prompt+`,"logprobs":3}`)
	lp := ch["logprobs"].(map[string]any)
	toks, tlp, top, off := lp["tokens"].([]any), lp["token_logprobs"].([]any), lp["top_logprobs"].([]any), lp["text_offset"].([]any)
	g := gen[1]
	if len(tlp) != len(g.OutputIDs) || len(toks) != len(tlp) || len(top) != len(tlp) || len(off) != len(tlp) {
		t.Fatalf("logprobs: %d tokens, %d token_logprobs, %d top, %d offsets; want %d each", len(toks), len(tlp), len(top), len(off), len(g.OutputIDs))
	}
	n := 0
	for i := range tlp {
		want := g.TopLogprobs[i]
		// JSON writes a byte that is not UTF-8 as U+FFFD.
		if tlp[i].(float64) != want[0].Logprob || toks[i].(string) != jsonText(g.OutputIDs[i:i+1]) || int(off[i].(float64)) != n {
			t.Errorf("token %d: %q %v at %v; generate says %q %v at %d", i, toks[i], tlp[i], off[i], modeltok.DecodeBytes(g.OutputIDs[i:i+1]), want[0].Logprob, n)
		}
		n += len(modeltok.DecodeBytes(g.OutputIDs[i : i+1]))
		alts := top[i].(map[string]any)
		for _, c := range want {
			if txt := jsonText([]int32{c.ID}); utf8.ValidString(modeltok.DecodeBytes([]int32{c.ID})) && txt != "" && alts[txt] != c.Logprob {
				t.Errorf("token %d: top %q = %v, generate says %v", i, txt, alts[txt], c.Logprob)
			}
		}
		if len(alts) < 1 || len(alts) > 4 {
			t.Errorf("token %d: %d top logprobs, want 3 (and the chosen token)", i, len(alts))
		}
	}
	// A sampled request's logprobs are its tokens' own, as generate gives them.
	_, ch = complete(t, base, strings.TrimSuffix(sampled, "}")+`,"logprobs":0}`)
	sl := ch["logprobs"].(map[string]any)["token_logprobs"].([]any)
	for i := range sl {
		if i >= len(gen[0].Logprobs) || sl[i].(float64) != gen[0].Logprobs[i] || sl[i].(float64) > 0 {
			t.Fatalf("sampled token %d: logprob %v, generate says %v", i, sl[i], gen[0].Logprobs)
		}
	}
	// Chat: content entries with bytes, top_logprobs lists.
	code, v, _ = post(t, base+"/v1/chat/completions", chat+`,"logprobs":true,"top_logprobs":2}`)
	if code != 200 {
		t.Fatalf("chat logprobs: %d %v", code, v)
	}
	content := v["choices"].([]any)[0].(map[string]any)["logprobs"].(map[string]any)["content"].([]any)
	if len(content) != 40 {
		t.Fatalf("chat logprobs: %d entries, want 40", len(content))
	}
	for i, e := range content {
		e := e.(map[string]any)
		tok, lpv, alts := e["token"].(string), e["logprob"].(float64), e["top_logprobs"].([]any)
		bs, _ := json.Marshal(e["bytes"])
		var b []byte
		for _, x := range e["bytes"].([]any) {
			b = append(b, byte(x.(float64)))
		}
		if string(b) != tok && !strings.ContainsRune(tok, '\uFFFD') || lpv > 0 || len(alts) != 2 || alts[0].(map[string]any)["logprob"].(float64) < lpv-1e-12 {
			t.Errorf("chat entry %d: %q %v bytes %s, top %v", i, tok, lpv, bs, alts)
		}
		if math.IsNaN(lpv) {
			t.Errorf("chat entry %d: NaN logprob", i)
		}
	}
}

// streamByIndex posts a streaming body (chat or completions) and returns
// each choice index's concatenated content (or text).
func streamByIndex(t *testing.T, url, body string) map[int]string {
	t.Helper()
	resp, err := http.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	out := map[int]string{}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok || data == "[DONE]" {
			continue
		}
		var v struct {
			Choices []struct {
				Index int    `json:"index"`
				Text  string `json:"text"`
				Delta struct {
					Content string `json:"content"`
				} `json:"delta"`
			} `json:"choices"`
		}
		if err := json.Unmarshal([]byte(data), &v); err != nil {
			t.Fatalf("stream event %q: %v", data, err)
		}
		for _, c := range v.Choices {
			out[c.Index] += c.Delta.Content + c.Text
		}
	}
	return out
}

// jsonText is the byte tokenizer's text of ids as a JSON string carries it.
func jsonText(ids []int32) string { return strings.ToValidUTF8(modeltok.DecodeBytes(ids), "\uFFFD") }

// printablePair is the offset of the first two letters or digits of text
// from offset from on (-1 when none): a stop string JSON and %q write alike.
func printablePair(text string, from int) int {
	ok := func(c byte) bool { return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' }
	for i := from; i+1 < len(text); i++ {
		if ok(text[i]) && ok(text[i+1]) {
			return i
		}
	}
	return -1
}

// chatAnswer posts a chat body and parses its one choice.
func chatAnswer(t *testing.T, base, body string) answer {
	t.Helper()
	code, v, _ := post(t, base+"/v1/chat/completions", body)
	if code != 200 {
		t.Fatalf("%s: %d %v", body, code, v)
	}
	return parseAnswer(t, v, true)
}

// TestServeEOS: a checkpoint whose generation_config.json names an EOS id
// ends a request at it (finish_reason stop, its text not in the answer),
// streamed or not, in kvx generate too; ignore_eos runs to max_tokens.
func TestServeEOS(t *testing.T) {
	src := filepath.Join("..", "..", "device", "hf", "testdata", "llama")
	dir := t.TempDir()
	for _, f := range []string{"config.json", "model.safetensors"} {
		abs, err := filepath.Abs(filepath.Join(src, f))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(abs, filepath.Join(dir, f)); err != nil {
			t.Fatal(err)
		}
	}
	const hf = "../../scenarios/hf-llama.yaml"
	const prompt = `"prompt":[1,5,9,13,17,21],"max_tokens":16`
	base := startServe(t, hf, serveOpts{}, "model="+dir)
	plain, _ := complete(t, base, `{`+prompt+`}`)
	if len(plain.ids) != 16 || plain.finish != "length" {
		t.Fatalf("no EOS: %v (%s), want 16 tokens (length)", plain.ids, plain.finish)
	}
	eos := plain.ids[3]
	k := slices.Index(plain.ids, eos)
	if err := os.WriteFile(filepath.Join(dir, "generation_config.json"), []byte(fmt.Sprintf(`{"eos_token_id": [%d, 0]}`, eos)), 0o644); err != nil {
		t.Fatal(err)
	}
	base = startServe(t, hf, serveOpts{}, "model="+dir)
	a, _ := complete(t, base, `{`+prompt+`}`)
	if !slices.Equal(a.ids, plain.ids[:k+1]) || a.finish != "stop" || num(a.usage["completion_tokens"]) != k+1 {
		t.Errorf("EOS %d: %v (%s, usage %v), want %v (stop)", eos, a.ids, a.finish, a.usage, plain.ids[:k+1])
	}
	_, _, events := stream(t, base+"/v1/completions", `{`+prompt+`,"stream":true}`, false)
	_, fin := streamFinish(t, base+"/v1/completions", `{`+prompt+`,"stream":true}`, false)
	if fin != "stop" || events == 0 {
		t.Errorf("EOS streamed: finish %s after %d events, want stop", fin, events)
	}
	if a, _ := complete(t, base, `{`+prompt+`,"ignore_eos":true}`); !slices.Equal(a.ids, plain.ids) || a.finish != "length" {
		t.Errorf("ignore_eos: %v (%s), want %v (length)", a.ids, a.finish, plain.ids)
	}
	js := filepath.Join(t.TempDir(), "out.json")
	out, stderr, code := kvx(t, "generate", "-c", hf, "--set", "model="+dir, "--set", "isolation=inprocess", "--json", js, "--prompts",
		writeLines(t, `{"prompt_ids":[1,5,9,13,17,21],"max_tokens":16}`, `{"prompt_ids":[1,5,9,13,17,21],"max_tokens":16,"ignore_eos":true}`))
	var cs []completion
	if data, err := os.ReadFile(js); err == nil {
		_ = json.Unmarshal(data, &cs)
	}
	if code != 0 || len(cs) != 2 {
		t.Fatalf("generate: exit %d\n%s%s", code, out, stderr)
	}
	if !slices.Equal(cs[0].OutputIDs, plain.ids[:k+1]) || cs[0].FinishReason != "stop" || !slices.Equal(cs[1].OutputIDs, plain.ids) || cs[1].FinishReason != "length" {
		t.Errorf("generate: %v (%s) and %v (%s); want %v (stop) and %v (length)", cs[0].OutputIDs, cs[0].FinishReason, cs[1].OutputIDs, cs[1].FinishReason, plain.ids[:k+1], plain.ids)
	}
}

// choicesOf parses every choice of a completions answer: token ids, text.
func choicesOf(t *testing.T, v map[string]any) []answer {
	t.Helper()
	var out []answer
	for _, c := range v["choices"].([]any) {
		c := c.(map[string]any)
		a := answer{text: c["text"].(string), finish: fmt.Sprint(c["finish_reason"])}
		for _, id := range c["token_ids"].([]any) {
			a.ids = append(a.ids, int32(id.(float64)))
		}
		out = append(out, a)
	}
	return out
}

// TestServeN4 runs n = 4 over HTTP on the cpu device, where every manager
// forks the prompt's sequence (kvx:forked_sequences_total counts the
// sequences): greedy, the four choices are the n = 1 answer; seeded, choice
// i is the request with seed + i alone, streamed (chunks by index) or not;
// usage counts the prompt once and every choice's tokens.
func TestServeN4(t *testing.T) {
	for _, v := range []struct{ name, mgr, iso string }{
		{"v1", "v1", "isolation=inprocess"}, {"v2", "v2", "isolation=inprocess"}, {"v2/plugin", "v2", "isolation=plugin"},
	} {
		t.Run(v.name, func(t *testing.T) {
			base := startServe(t, genScenario, serveOpts{}, "cache_manager="+v.mgr, v.iso, "plugin_dirs=["+binDir+"]")
			const prompt = `"prompt":"n choices share one prefill of this prompt","max_tokens":16,"ignore_eos":true`
			one, _ := complete(t, base, `{`+prompt+`}`)
			code, v, _ := post(t, base+"/v1/completions", `{`+prompt+`,"n":4}`)
			if code != 200 {
				t.Fatalf("greedy n 4: %d %v", code, v)
			}
			chs := choicesOf(t, v)
			if len(chs) != 4 {
				t.Fatalf("greedy n 4: %d choices", len(chs))
			}
			for i, c := range chs {
				if !slices.Equal(c.ids, one.ids) || c.text != one.text {
					t.Errorf("greedy n 4: choice %d %v, want the n 1 answer %v", i, c.ids, one.ids)
				}
			}
			u := v["usage"].(map[string]any)
			if num(u["prompt_tokens"]) != num(one.usage["prompt_tokens"]) || num(u["completion_tokens"]) != 4*16 ||
				num(u["total_tokens"]) != num(one.usage["prompt_tokens"])+4*16 {
				t.Errorf("greedy n 4: usage %v, want the prompt once (%v) and 64 completion tokens", u, one.usage["prompt_tokens"])
			}

			sampled := `{` + prompt + `,"temperature":1.1,"top_p":0.9,"seed":41`
			code, v, _ = post(t, base+"/v1/completions", sampled+`,"n":4}`)
			if code != 200 {
				t.Fatalf("seeded n 4: %d %v", code, v)
			}
			chs = choicesOf(t, v)
			distinct := map[string]bool{}
			for i, c := range chs {
				want, _ := complete(t, base, strings.Replace(sampled, `"seed":41`, fmt.Sprintf(`"seed":%d`, 41+i), 1)+`}`)
				if !slices.Equal(c.ids, want.ids) {
					t.Errorf("seeded n 4: choice %d %v, want seed %d alone %v", i, c.ids, 41+i, want.ids)
				}
				distinct[c.text] = true
			}
			if len(distinct) < 2 {
				t.Errorf("seeded n 4: the choices are all %q", chs[0].text)
			}
			texts := streamByIndex(t, base+"/v1/completions", sampled+`,"n":4,"stream":true}`)
			for i, c := range chs {
				if texts[i] != c.text {
					t.Errorf("seeded n 4 streamed: index %d %q, want %q", i, texts[i], c.text)
				}
			}
			if f := value(t, metricsOf(t, base), "kvx:forked_sequences_total"); f < 12 {
				t.Errorf("kvx:forked_sequences_total %v after three n 4 requests, want >= 12", f)
			}
		})
	}
}
