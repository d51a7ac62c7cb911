package serve

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/kvx-dev/kvx/core/engine"
)

// fuzzServer is a Server whose checks run without an engine loop: its
// engine is the zero Live (no cache salt refusal, no KV limit), which the
// checks only read.
func fuzzServer() *Server {
	return New(&engine.Live{}, Options{Model: "m", Vocab: 300, MaxSeqLen: 64, Tokenizer: byteTok{}, MaxBodyBytes: 4 << 10})
}

// checkJob runs body through readBody and decode (the job function of
// path) and fails t unless the result is a job within the limits or an
// error of status 4xx whose body encodes.
func checkJob(t *testing.T, s *Server, path string, body []byte) {
	rec := httptest.NewRecorder()
	b, e := s.readBody(rec, httptest.NewRequest(http.MethodPost, path, bytes.NewReader(body)))
	var j *job
	if e == nil {
		if path == "/v1/chat/completions" {
			j, e = s.chatJob(b)
		} else {
			j, e = s.completionJob(b)
		}
	}
	if e != nil {
		if e.status < 400 || e.status >= 500 {
			t.Fatalf("%s %q: error status %d (%s), want 4xx", path, body, e.status, e.msg)
		}
		if _, err := json.Marshal(e.body()); err != nil {
			t.Fatalf("%s %q: error body does not encode: %v", path, body, err)
		}
		return
	}
	n, lim := len(j.prompt), s.opt.MaxSeqLen
	switch {
	case n < 1 || n >= lim:
		t.Fatalf("%s %q: accepted a prompt of %d tokens (max_seq_len %d)", path, body, n, lim)
	case j.maxTokens < 1 || j.maxTokens > lim-n:
		t.Fatalf("%s %q: accepted max_tokens %d for a %d-token prompt (max_seq_len %d)", path, body, j.maxTokens, n, lim)
	case j.usageStream && !j.stream:
		t.Fatalf("%s %q: usage streamed without stream", path, body)
	}
	for i, id := range j.prompt {
		if id < 0 || int(id) >= s.opt.Vocab {
			t.Fatalf("%s %q: accepted prompt[%d] = %d, outside [0, %d)", path, body, i, id, s.opt.Vocab)
		}
	}
}

// FuzzCompletionsRequest reads the input as a POST /v1/completions body:
// readBody, then decoding and checking (completionJob). Properties: no
// panic; bad input is a 4xx whose error body encodes; an accepted request
// has a prompt of 1 to max_seq_len-1 tokens in the vocabulary, max_tokens
// >= 1 with prompt + max_tokens <= max_seq_len, and stream_options only
// with stream.
func FuzzCompletionsRequest(f *testing.F) {
	for _, b := range []string{
		`{"prompt": "hello", "max_tokens": 4}`,
		`{"model": "m", "prompt": [1, 2, 3], "stream": true, "stream_options": {"include_usage": true}}`,
		`{"prompt": [[5, 6]], "max_completion_tokens": 2, "n": 1, "echo": false, "logprobs": null}`,
		`{"prompt": ["one"], "cache_salt": "t", "retention_priority": 50, "retention_duration_s": 1.5}`,
		`{"prompt": "x", "stream_options": {"include_usage": true}}`,
		`{"prompt": [1.5]}`, `{"prompt": [300]}`, `{"prompt": "", "max_tokens": 0}`,
		`{"prompt": "hi", "max_tokens": 9223372036854775807}`,
		`{"prompt": "hi", "max_tokens": 1e3}`, `{"prompt": {}}`, `[]`, `{} {}`, `{"prompt": "\ud800"}`, "\xff",
	} {
		f.Add([]byte(b))
	}
	s := fuzzServer()
	f.Fuzz(func(t *testing.T, body []byte) { checkJob(t, s, "/v1/completions", body) })
}

// FuzzChatRequest reads the input as a POST /v1/chat/completions body:
// readBody, then decoding and checking (chatJob, the plain chat prompt).
// Properties: FuzzCompletionsRequest's.
func FuzzChatRequest(f *testing.F) {
	for _, b := range []string{
		`{"messages": [{"role": "user", "content": "hello"}], "max_tokens": 4}`,
		`{"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": [{"type": "text", "text": "hi"}]}], "stream": true}`,
		`{"messages": [{"role": "user", "content": "x"}], "stream": false, "stream_options": {}}`,
		`{"messages": [{"role": "robot", "content": "x"}]}`,
		`{"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}`,
		`{"messages": []}`, `{"messages": null}`, `{"messages": "hi"}`,
		`{"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": -1}`,
		`{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 9223372036854775807}`,
	} {
		f.Add([]byte(b))
	}
	s := fuzzServer()
	f.Fuzz(func(t *testing.T, body []byte) { checkJob(t, s, "/v1/chat/completions", body) })
}

// TestMaxTokensOverflow: found by FuzzCompletionsRequest's seeds: max_tokens
// near 2^63 overflowed prompt + max_tokens past the max_seq_len check, and
// the request was accepted with that many tokens to generate.
func TestMaxTokensOverflow(t *testing.T) {
	s := fuzzServer()
	_, e := s.completionJob([]byte(`{"prompt": "hi", "max_tokens": 9223372036854775807}`))
	want := "max_tokens = 9223372036854775807: the prompt's 3 tokens + max_tokens = 9223372036854775810 exceed max_seq_len 64 (at most 61 for this prompt)"
	if e == nil || e.status != http.StatusBadRequest || e.msg != want {
		t.Errorf("completionJob(max_tokens 2^63-1) = %+v, want a 400 %q", e, want)
	}
}
