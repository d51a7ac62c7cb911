package serve

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"

	"github.com/kvx-dev/kvx/core/workload"
	"github.com/kvx-dev/kvx/plugins/v1/worker"
)

// The fields of a request body. An implemented field is checked (its type,
// its range) and honoured; a tolerated field is one that OpenAI's clients
// and the frameworks over them send at a value that asks for nothing
// (TolerantFields): it is accepted at that value only. Any other field is a
// 400 naming it, so that a client never believes kvx honoured what it
// ignored.

// sharedFields are the fields both endpoints implement.
var sharedFields = []string{
	"model", "max_tokens", "max_completion_tokens", "stream", "stream_options", "n", "best_of", "logprobs",
	"cache_salt", "retention_priority", "retention_duration_s",
	"temperature", "top_p", "top_k", "min_p", "seed", "presence_penalty", "frequency_penalty", "repetition_penalty",
	"stop", "stop_token_ids", "ignore_eos", "min_tokens",
}

var (
	completionFields = append(slices.Clone(sharedFields), "prompt", "echo", "prompt_logprobs")
	chatFields       = append(slices.Clone(sharedFields), "messages", "top_logprobs", "echo")
)

// TolerantFields are the fields kvx serve accepts without implementing
// them, each only at the values that ask for nothing: what OpenAI's clients
// and SDK wrappers (LangChain, LiteLLM) send by default. Another value is a
// 400 naming the field.
var TolerantFields = map[string]string{
	"user":                "any string (an end-user id for abuse tracking; not used)",
	"logit_bias":          "null or {}",
	"suffix":              "null",
	"tools":               "null or []",
	"tool_choice":         `null, "none" or "auto"`,
	"parallel_tool_calls": "null or a boolean (no tools are called)",
	"functions":           "null or []",
	"function_call":       `null, "none" or "auto"`,
	"response_format":     `null or {"type": "text"}`,
	"service_tier":        `null, "auto" or "default"`,
	"store":               "null or false",
	"metadata":            "null or {}",
	"modalities":          `null or ["text"]`,
	"prediction":          "null",
	"audio":               "null",
	"reasoning_effort":    "null",
	"web_search_options":  "null",
}

// tolerated says whether raw is a value of tolerant field name that asks
// for nothing.
func tolerated(name string, raw json.RawMessage) bool {
	v := string(bytes.Join(bytes.Fields(raw), nil)) // without JSON white space
	if v == "null" {
		return true
	}
	switch name {
	case "user":
		var s string
		return json.Unmarshal(raw, &s) == nil
	case "logit_bias", "metadata":
		return v == "{}"
	case "tools", "functions":
		return v == "[]"
	case "tool_choice", "function_call":
		return v == `"none"` || v == `"auto"`
	case "parallel_tool_calls":
		return v == "true" || v == "false"
	case "response_format":
		return v == `{"type":"text"}`
	case "service_tier":
		return v == `"auto"` || v == `"default"`
	case "store":
		return v == "false"
	case "modalities":
		return v == `["text"]`
	}
	return false
}

// checkFields refuses a body with a field the endpoint neither implements
// (fields) nor tolerates at the value given.
func checkFields(body []byte, fields []string) *apiError {
	var m map[string]json.RawMessage
	if json.Unmarshal(body, &m) != nil {
		return nil // decode reported it
	}
	for _, k := range slices.Sorted(func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}) {
		if slices.Contains(fields, k) {
			continue
		}
		if allowed, ok := TolerantFields[k]; ok {
			if tolerated(k, m[k]) {
				continue
			}
			return badRequest(k, "%s = %s: kvx serve does not implement %s; it accepts only %s", k, describe(m[k]), k, allowed)
		}
		return badRequest(k, "%s is not a field kvx serve implements for this endpoint; its fields: %s", k, strings.Join(fields, ", "))
	}
	return nil
}

// MaxLogprobs bounds logprobs (completions) and top_logprobs (chat): vLLM's
// default max_logprobs.
const MaxLogprobs = 20

// MaxChoices bounds n and best_of: the sequences one request generates.
const MaxChoices = 16

// MaxStops bounds the stop strings of a request, and MaxStopBytes each one.
const (
	MaxStops     = 16
	MaxStopBytes = 256
)

// checkLogprobs reads logprobs (completions: an integer in [0, MaxLogprobs],
// the most likely tokens per position; chat: a boolean, with top_logprobs
// in [0, MaxLogprobs]) into j.
func (s *Server) checkLogprobs(c *common, j *job) *apiError {
	raw := bytes.TrimSpace(c.Logprobs)
	null := len(raw) == 0 || string(raw) == "null"
	if j.chat {
		switch {
		case null || string(raw) == "false":
		case string(raw) == "true":
			j.logprobs = true
		default:
			return badRequest("logprobs", "logprobs = %s: want a boolean (chat completions; top_logprobs says how many alternatives)", describe(raw))
		}
		if c.TopLogprobs != nil {
			k := *c.TopLogprobs
			switch {
			case k < 0 || k > MaxLogprobs:
				return badRequest("top_logprobs", "top_logprobs = %d: must be in [0, %d]", k, MaxLogprobs)
			case k > 0 && !j.logprobs:
				return badRequest("top_logprobs", "top_logprobs = %d needs logprobs: true", k)
			}
			j.topLogprobs = int(k)
		}
	} else if !null {
		var k int64
		if err := json.Unmarshal(raw, &k); err != nil || k < 0 || k > MaxLogprobs {
			return badRequest("logprobs", "logprobs = %s: want an integer in [0, %d] (the most likely tokens per position)", describe(raw), MaxLogprobs)
		}
		j.logprobs, j.topLogprobs = true, int(k)
	}
	if j.logprobs && s.opt.Placeholder {
		return badRequest("logprobs", "logprobs: device sim's tokens are placeholders with no distribution; serve a computing device (device: cpu) for logprobs")
	}
	if j.logprobs && j.echo {
		// OpenAI's echo with logprobs: the prompt's tokens lead the
		// logprobs, the first one's null.
		j.promptLP, j.promptTopK = true, j.topLogprobs
	}
	return nil
}

// checkPromptLogprobs reads vLLM's prompt_logprobs: null, or an integer in
// [0, MaxLogprobs], the most likely tokens per prompt position besides the
// prompt's own (vLLM's -1, the whole vocabulary, is refused).
func (s *Server) checkPromptLogprobs(raw json.RawMessage, j *job) *apiError {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return nil
	}
	var k int64
	if err := json.Unmarshal(raw, &k); err != nil || k < 0 || k > MaxLogprobs {
		return badRequest("prompt_logprobs", "prompt_logprobs = %s: want an integer in [0, %d] (the most likely tokens per prompt position)", describe(raw), MaxLogprobs)
	}
	if s.opt.Placeholder {
		return badRequest("prompt_logprobs", "prompt_logprobs: device sim's tokens are placeholders with no distribution; serve a computing device (device: cpu) for logprobs")
	}
	if j.promptLP && int(k) != j.promptTopK {
		return badRequest("prompt_logprobs", "prompt_logprobs = %d with echo and logprobs = %d: the prompt's rows are computed once, send one count (or drop prompt_logprobs)", k, j.promptTopK)
	}
	j.vllmPrompt, j.promptLP, j.promptTopK = true, true, int(k)
	return nil
}

// promptLogprobsOf is vLLM's prompt_logprobs of a choice: per prompt
// token, null for the first, else {id: {"logprob", "rank",
// "decoded_token"}} over the token itself and the promptTopK most likely
// there. A rank is the token's place among the most likely (1 for the
// most likely); for a prompt token outside them it is unknown here and
// null (vLLM computes it over the vocabulary).
func (s *Server) promptLogprobsOf(j *job, p *promptRows) []any {
	t := textStream{tok: s.opt.Tokenizer, placeholder: s.opt.Placeholder}
	out := make([]any, len(j.prompt))
	if p == nil {
		return out
	}
	for i := 1; i < len(j.prompt); i++ {
		m := map[string]any{}
		id := j.prompt[i]
		var top []worker.TokenLogprob
		if i-1 < len(p.tops) {
			top = p.tops[i-1]
		}
		var rank any
		for r, c := range top {
			if c.ID == id {
				rank = r + 1
			}
			m[strconv.Itoa(int(c.ID))] = map[string]any{"logprob": c.Logprob, "rank": r + 1, "decoded_token": t.all([]int32{c.ID})}
		}
		m[strconv.Itoa(int(id))] = map[string]any{"logprob": p.lps[i-1], "rank": rank, "decoded_token": t.all([]int32{id})}
		out[i] = m
	}
	return out
}

// promptRows are a choice's prompt rows (engine.Event.PromptLogprobs):
// entry i is about prompt token i+1.
type promptRows struct {
	lps  []float64
	tops [][]worker.TokenLogprob
}

// checkStop reads stop: null, a string, or a list of at most MaxStops
// non-empty strings of at most MaxStopBytes bytes each.
func (s *Server) checkStop(raw json.RawMessage, j *job) *apiError {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return nil
	}
	var list []string
	var one string
	if err := json.Unmarshal(raw, &one); err == nil {
		list = []string{one}
	} else if err := json.Unmarshal(raw, &list); err != nil {
		return badRequest("stop", "stop = %s: want a string or a list of strings", describe(raw))
	}
	if msg := CheckStops(list); msg != "" {
		return badRequest("stop", "%s", msg)
	}
	if len(list) > 0 && s.opt.Tokenizer == nil && !s.opt.Placeholder {
		return badRequest("stop", "stop strings need the model's tokenizer to match the text, and %s", s.opt.NoTokenizer)
	}
	j.stops = list
	return nil
}

// checkSampling reads the sampling and stop-id fields into j.dec; stop
// strings (checkStop) become its StopText.
func (s *Server) checkSampling(c *common, j *job) *apiError {
	d, err := c.SamplingFields.Decoding(s.opt.Vocab, j.maxTokens, s.opt.EOS, rand.Uint64)
	if err != nil {
		var oe *workload.OptionError
		if errors.As(err, &oe) {
			return badRequest(oe.Field, "%s", strings.TrimPrefix(err.Error(), "workload: "))
		}
		return badRequest("", "%v", err)
	}
	if j.bestOf > j.n && !j.logprobs {
		// best_of ranks by the sequences' log-probabilities: asked for,
		// and left out of the answer.
		j.logprobs, j.hideLogprobs = true, true
	}
	d.Logprobs = j.logprobs
	if len(j.stops) > 0 {
		t := textStream{tok: s.opt.Tokenizer, placeholder: s.opt.Placeholder}
		d.StopText = stopMatcher(t.all, j.stops)
	}
	j.dec = d
	return nil
}

// StopMatcher is a workload.Decoding.StopText for stop strings: it ends a
// request after the first token whose text (tok's decoding of every token
// up to it) holds one of stops.
func StopMatcher(tok Tokenizer, stops []string) func(gen []int32, from int) (int, bool) {
	return stopMatcher(tok.Decode, stops)
}

func stopMatcher(text func([]int32) string, stops []string) func(gen []int32, from int) (int, bool) {
	return func(gen []int32, from int) (int, bool) {
		for k := from + 1; k <= len(gen); k++ {
			if stopIndex(text(gen[:k]), stops) >= 0 {
				return k, true
			}
		}
		return 0, false
	}
}

// FinalText is the text of a completion whose tokens are ids: tok's
// decoding, cut before the first of stops when one occurs, else, when a
// stop condition ended it (stopped) at one of stopIDs, without that last
// token's text (OpenAI's: a stop sequence is not in the text).
func FinalText(tok Tokenizer, ids []int32, stops []string, stopIDs []int32, stopped bool) string {
	t := textStream{tok: tok, stops: stops, stopIDs: stopIDs}
	return t.final(ids, stopped)
}

// CheckStops checks stop strings as a request body's stop is checked: at
// most MaxStops, each non-empty and at most MaxStopBytes bytes; the message
// names the one at fault.
func CheckStops(stops []string) string {
	if len(stops) > MaxStops {
		return fmt.Sprintf("stop has %d strings: the limit is %d", len(stops), MaxStops)
	}
	for i, st := range stops {
		switch {
		case st == "":
			return fmt.Sprintf("stop[%d] is empty: a stop string has at least 1 byte", i)
		case len(st) > MaxStopBytes:
			return fmt.Sprintf("stop[%d] is %d bytes: the limit is %d", i, len(st), MaxStopBytes)
		}
	}
	return ""
}

// stopIndex is where the first of stops to occur in text starts, -1 if none
// does.
func stopIndex(text string, stops []string) int {
	at := -1
	for _, st := range stops {
		if i := strings.Index(text, st); i >= 0 && (at < 0 || i < at) {
			at = i
		}
	}
	return at
}

// heldBack is the length of the longest end of text that begins a stop
// string without completing it: text a stream must hold back, since the next
// tokens may complete the stop string, which is never sent.
func heldBack(text string, stops []string) int {
	n := 0
	for _, st := range stops {
		for k := min(len(st)-1, len(text)); k > n; k-- {
			if strings.HasSuffix(text, st[:k]) {
				n = k
				break
			}
		}
	}
	return n
}

// logprobsOf is the logprobs object of generated tokens ids[from:] in
// OpenAI's shape: for completions {"tokens", "token_logprobs",
// "top_logprobs" (per position the top_logprobs most likely tokens and the
// chosen one, text to logprob), "text_offset"} with offsets counted from
// offset (the text before ids[from]; after the prompt's with echo); for
// chat {"content": [{"token", "logprob", "bytes", "top_logprobs": [...]}]}.
// lps[i] and tops[i] are token i's logprob and most likely tokens; a token's
// text is its id decoded alone.
//
// With echo, prompt (the choice's prompt rows) leads the completions shape
// when from is 0.
func (s *Server) logprobsOf(j *job, ids []int32, lps []float64, tops [][]worker.TokenLogprob, from, offset int, prompt *promptRows) map[string]any {
	t := textStream{tok: s.opt.Tokenizer, placeholder: s.opt.Placeholder}
	tokText := func(id int32) string { return t.all([]int32{id}) }
	if j.chat {
		entry := func(id int32, lp float64) map[string]any {
			txt := tokText(id)
			b := make([]int, len(txt))
			for i := range len(txt) {
				b[i] = int(txt[i])
			}
			return map[string]any{"token": txt, "logprob": lp, "bytes": b}
		}
		content := make([]any, 0, len(ids)-from)
		for i := from; i < len(ids); i++ {
			e := entry(ids[i], lps[i])
			alt := make([]any, 0, j.topLogprobs)
			for _, c := range tops[i] {
				alt = append(alt, entry(c.ID, c.Logprob))
			}
			e["top_logprobs"] = alt
			content = append(content, e)
		}
		return map[string]any{"content": content}
	}
	var toks []string
	var lpv []any // float64, or nil for the prompt's first token
	var top []any // map[string]float64, or nil there
	var offs []int
	entry := func(id int32, lp float64, alts []worker.TokenLogprob, at int) int {
		txt := tokText(id)
		m := map[string]float64{}
		for _, c := range alts {
			if _, dup := m[tokText(c.ID)]; !dup {
				m[tokText(c.ID)] = c.Logprob
			}
		}
		m[txt] = lp // vLLM's: the chosen token is always among them
		toks, lpv, top, offs = append(toks, txt), append(lpv, lp), append(top, m), append(offs, at)
		return at + len(txt)
	}
	if j.echo {
		if prompt != nil && from == 0 {
			// OpenAI's echo with logprobs: the prompt's tokens first, the
			// first with no logprob, offsets from the prompt's start.
			at := 0
			for i, id := range j.prompt {
				if i == 0 {
					toks, lpv, top, offs = append(toks, tokText(id)), append(lpv, nil), append(top, nil), append(offs, 0)
					at += len(toks[0])
					continue
				}
				var alts []worker.TokenLogprob
				if i-1 < len(prompt.tops) {
					alts = prompt.tops[i-1]
				}
				at = entry(id, prompt.lps[i-1], alts, at)
			}
		}
		offset += len(s.promptOf(j))
	}
	for i := from; i < len(ids); i++ {
		offset = entry(ids[i], lps[i], tops[i], offset)
	}
	return map[string]any{"tokens": toks, "token_logprobs": lpv, "top_logprobs": top, "text_offset": offs}
}
