package serve

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/kvx-dev/kvx/core/workload"
	"github.com/kvx-dev/kvx/plugins/v1/kvcache"

	"github.com/kvx-dev/kvx/plugins/model/chat"
)

// apiError is a 4xx/5xx answer in OpenAI's error shape:
// {"error": {"message", "type", "param", "code"}}.
type apiError struct {
	status int
	typ    string // default "invalid_request_error"
	msg    string
	param  string // the request field at fault, if any
	code   string
	retry  int // Retry-After seconds (429)
}

func (e *apiError) body() map[string]any {
	typ := e.typ
	if typ == "" {
		typ = "invalid_request_error"
	}
	var param, code any
	if e.param != "" {
		param = e.param
	}
	if e.code != "" {
		code = e.code
	}
	return map[string]any{"message": e.msg, "type": typ, "param": param, "code": code}
}

func writeErr(w http.ResponseWriter, e *apiError) {
	if e.retry > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(e.retry))
	}
	writeJSON(w, e.status, map[string]any{"error": e.body()})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		status, b = http.StatusInternalServerError, []byte(`{"error":{"message":"encoding the answer failed","type":"server_error","param":null,"code":null}}`)
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
}

func readAll(r io.Reader) ([]byte, error) { return io.ReadAll(r) }

func badRequest(param, format string, args ...any) *apiError {
	return &apiError{status: http.StatusBadRequest, param: param, msg: fmt.Sprintf(format, args...)}
}

// common are the fields both endpoints share (fields.go lists every field
// an endpoint takes).
type common struct {
	workload.SamplingFields
	Model               *string         `json:"model"`
	MaxTokens           *int64          `json:"max_tokens"`
	MaxCompletionTokens *int64          `json:"max_completion_tokens"`
	Stream              *bool           `json:"stream"`
	StreamOptions       *streamOptions  `json:"stream_options"`
	N                   *int64          `json:"n"`
	BestOf              *int64          `json:"best_of"`
	Echo                *bool           `json:"echo"`
	Logprobs            json.RawMessage `json:"logprobs"`     // completions: an integer; chat: a boolean
	TopLogprobs         *int64          `json:"top_logprobs"` // chat
	Stop                json.RawMessage `json:"stop"`         // a string or a list of strings
	// CacheSalt (vLLM's cache_salt) isolates the request's prefix cache:
	// only requests with the same salt share cached blocks.
	CacheSalt *string `json:"cache_salt"`
	// RetentionPriority (1..100) and RetentionDurationS (seconds > 0) are
	// the retention of the blocks the request stores in the prefix cache
	// (TensorRT-LLM's KvCacheRetentionConfig scale).
	RetentionPriority  *int64   `json:"retention_priority"`
	RetentionDurationS *float64 `json:"retention_duration_s"`
}

type streamOptions struct {
	IncludeUsage *bool `json:"include_usage"`
}

type completionRequest struct {
	common
	Prompt json.RawMessage `json:"prompt"`
	// PromptLogprobs is vLLM's: the prompt tokens' logprobs and that many
	// most likely tokens at each prompt position.
	PromptLogprobs json.RawMessage `json:"prompt_logprobs"`
}

type chatRequest struct {
	common
	Messages json.RawMessage `json:"messages"`
}

// decode parses body into v; errors name the field and the types.
func decode(body []byte, v any) *apiError {
	if len(bytes.TrimSpace(body)) == 0 {
		return badRequest("", "the request body is empty: want a JSON object")
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	err := dec.Decode(v)
	var te *json.UnmarshalTypeError
	var se *json.SyntaxError
	switch {
	case errors.As(err, &te):
		field := strings.TrimPrefix(strings.TrimPrefix(te.Field, "common."), "SamplingFields.")
		if field == "" {
			return badRequest("", "the request body is JSON %s: want an object", te.Value)
		}
		return badRequest(field, "%s: got JSON %s, want %s", field, te.Value, jsonType(te.Type.String()))
	case errors.As(err, &se):
		return badRequest("", "the request body is not valid JSON: %v (at byte %d)", se, se.Offset)
	case err != nil:
		return badRequest("", "the request body is not valid JSON: %v", err)
	}
	if dec.More() {
		return badRequest("", "the request body holds more than one JSON value")
	}
	return nil
}

func jsonType(goType string) string {
	switch {
	case strings.HasPrefix(goType, "int"), strings.HasPrefix(goType, "*int"):
		return "an integer"
	case strings.Contains(goType, "bool"):
		return "a boolean"
	case strings.Contains(goType, "string"):
		return "a string"
	case strings.Contains(goType, "serve."):
		return "an object"
	case strings.Contains(goType, "float"):
		return "a number"
	case strings.HasPrefix(goType, "[]int"):
		return "a list of integers"
	}
	return goType
}

// check validates what both endpoints share and fills j.
func (s *Server) check(c *common, j *job, defaultMax int64) *apiError {
	if c.Model != nil && *c.Model != s.opt.Model {
		return &apiError{status: http.StatusNotFound, typ: "not_found_error", param: "model", code: "model_not_found",
			msg: fmt.Sprintf("model %q does not exist: this server serves %q (GET /v1/models)", *c.Model, s.opt.Model)}
	}
	j.n, j.bestOf = 1, 1
	if c.N != nil {
		if *c.N < 1 || *c.N > MaxChoices {
			return badRequest("n", "n = %d: must be in [1, %d]", *c.N, MaxChoices)
		}
		j.n, j.bestOf = int(*c.N), int(*c.N)
	}
	if c.BestOf != nil {
		switch b := *c.BestOf; {
		case b < int64(j.n) || b > MaxChoices:
			return badRequest("best_of", "best_of = %d: must be in [n = %d, %d]", b, j.n, MaxChoices)
		case j.chat && b != int64(j.n):
			return badRequest("best_of", "best_of = %d: chat completions take no best_of (only n)", b)
		case b > int64(j.n) && c.Stream != nil && *c.Stream:
			return badRequest("best_of", "best_of = %d with stream: the best %d are known only at the end (OpenAI refuses it too)", b, j.n)
		case b > int64(j.n) && s.opt.Placeholder:
			return badRequest("best_of", "best_of = %d: ranking needs logprobs, and device sim's tokens are placeholders with no distribution", b)
		}
		j.bestOf = int(*c.BestOf)
	}
	if e := s.checkLogprobs(c, j); e != nil {
		return e
	}
	if e := s.checkStop(c.Stop, j); e != nil {
		return e
	}
	if c.CacheSalt != nil {
		salt := *c.CacheSalt
		switch {
		case salt == "":
			return badRequest("cache_salt", "cache_salt is empty: send a non-empty string, or leave it out to share the unsalted cache")
		case len(salt) > kvcache.MaxCacheSaltBytes:
			return badRequest("cache_salt", "cache_salt is %d bytes: the limit is %d", len(salt), kvcache.MaxCacheSaltBytes)
		}
		if err := s.eng.CacheSaltErr(); err != nil {
			return badRequest("cache_salt", "cache_salt cannot be honoured: %v", err)
		}
		j.salt = salt
	}
	var err error
	if j.priority, j.priorityDur, err = workload.Retention(c.RetentionPriority, c.RetentionDurationS); err != nil {
		var oe *workload.OptionError
		errors.As(err, &oe)
		return badRequest(oe.Field, "%s", strings.TrimPrefix(err.Error(), "workload: "))
	}
	j.stream = c.Stream != nil && *c.Stream
	if c.StreamOptions != nil {
		if !j.stream {
			return badRequest("stream_options", "stream_options is only allowed with stream: true")
		}
		j.usageStream = c.StreamOptions.IncludeUsage != nil && *c.StreamOptions.IncludeUsage
	}
	n := int64(len(j.prompt))
	lim := int64(s.opt.MaxSeqLen)
	if n == 0 {
		return badRequest("prompt", "the prompt is empty: a prompt needs at least 1 token")
	}
	if n >= lim {
		return &apiError{status: http.StatusBadRequest, param: "prompt", code: "context_length_exceeded",
			msg: fmt.Sprintf("the prompt is %d tokens, longer than max_seq_len %d allows (at most %d, leaving room for one generated token)", n, lim, lim-1)}
	}
	if seq := int64(s.eng.MaxSeqTokens()); seq > 0 && n >= seq {
		return &apiError{status: http.StatusBadRequest, param: "prompt", code: "context_length_exceeded",
			msg: fmt.Sprintf("the prompt is %d tokens, and the KV cache can hold at most %d tokens of one sequence (prompt + generated)", n, seq)}
	}
	field, mt := "max_tokens", c.MaxTokens
	if mt == nil && c.MaxCompletionTokens != nil {
		field, mt = "max_completion_tokens", c.MaxCompletionTokens
	}
	var m int64
	if mt == nil {
		m = min(defaultMax, lim-n)
	} else {
		m = *mt
	}
	// m > lim-n, not n+m > lim: m is the client's, and n+m can overflow
	// (the messages add them as uint64, which cannot: both are >= 0 here).
	switch {
	case m < 1:
		return badRequest(field, "%s = %d: must be >= 1", field, m)
	case m > lim-n:
		return &apiError{status: http.StatusBadRequest, param: field, code: "context_length_exceeded",
			msg: fmt.Sprintf("%s = %d: the prompt's %d tokens + %s = %d exceed max_seq_len %d (at most %d for this prompt)", field, m, n, field, uint64(n)+uint64(m), lim, lim-n)}
	}
	if seq := int64(s.eng.MaxSeqTokens()); seq > 0 && m > seq-n {
		return &apiError{status: http.StatusBadRequest, param: field, code: "context_length_exceeded",
			msg: fmt.Sprintf("%s = %d: the prompt's %d tokens + %s = %d exceed the %d tokens of one sequence the KV cache can hold (at most %d for this prompt)", field, m, n, field, uint64(n)+uint64(m), seq, seq-n)}
	}
	j.maxTokens = int(m)
	if e := s.checkSampling(c, j); e != nil {
		return e
	}
	j.created = time.Now().Unix()
	return nil
}

func (s *Server) completions(w http.ResponseWriter, r *http.Request, body []byte) {
	j, e := s.completionJob(body)
	if e != nil {
		writeErr(w, e)
		return
	}
	s.run(w, r, j)
}

// completionJob decodes and checks a /v1/completions body: the job, or the
// 4xx that says what is wrong with it. It does not touch the engine beyond
// reading its limits.
func (s *Server) completionJob(body []byte) (*job, *apiError) {
	var req completionRequest
	if e := decode(body, &req); e != nil {
		return nil, e
	}
	if e := checkFields(body, completionFields); e != nil {
		return nil, e
	}
	j := &job{id: fmt.Sprintf("cmpl-%d", s.seq.Add(1))}
	if e := s.prompt(req.Prompt, j); e != nil {
		return nil, e
	}
	j.echo = req.Echo != nil && *req.Echo
	if e := s.check(&req.common, j, DefaultMaxTokens); e != nil {
		return nil, e
	}
	if e := s.checkPromptLogprobs(req.PromptLogprobs, j); e != nil {
		return nil, e
	}
	return j, nil
}

func (s *Server) chat(w http.ResponseWriter, r *http.Request, body []byte) {
	j, e := s.chatJob(body)
	if e != nil {
		writeErr(w, e)
		return
	}
	s.run(w, r, j)
}

// chatJob decodes and checks a /v1/chat/completions body, as completionJob
// does a completions body.
func (s *Server) chatJob(body []byte) (*job, *apiError) {
	var req chatRequest
	if e := decode(body, &req); e != nil {
		return nil, e
	}
	if e := checkFields(body, chatFields); e != nil {
		return nil, e
	}
	if req.Echo != nil && *req.Echo {
		return nil, badRequest("echo", "echo = true: chat completions do not echo the prompt in kvx serve (echo is a /v1/completions field here)")
	}
	j := &job{chat: true, id: fmt.Sprintf("chatcmpl-%d", s.seq.Add(1))}
	text, e := s.chatText(req.Messages)
	if e != nil {
		return nil, e
	}
	if e := s.encode(text, "messages", j); e != nil {
		return nil, e
	}
	if e := s.check(&req.common, j, int64(s.opt.MaxSeqLen)); e != nil {
		return nil, e
	}
	return j, nil
}

// prompt reads a completions prompt: a string, a list of one string, a
// list of token ids, or a list of one list of token ids.
func (s *Server) prompt(raw json.RawMessage, j *job) *apiError {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return badRequest("prompt", "prompt is missing: want a string or a list of token ids")
	}
	// The first bytes say which form it is, so the prompt is decoded once.
	var ids []float64
	switch first, second := raw[0], peek(raw[1:]); {
	case first == '"':
		var text string
		if err := json.Unmarshal(raw, &text); err != nil {
			return badRequest("prompt", "prompt: %v", err)
		}
		j.promptText = &text
		return s.encode(text, "prompt", j)
	case first == '[' && second == '"':
		var texts []string
		if err := json.Unmarshal(raw, &texts); err != nil {
			return badRequest("prompt", "prompt: want a list of one string: %v", err)
		}
		if len(texts) != 1 {
			return badRequest("prompt", "prompt is a list of %d strings: kvx serves one prompt per request", len(texts))
		}
		j.promptText = &texts[0]
		return s.encode(texts[0], "prompt", j)
	case first == '[' && second == '[':
		var lists [][]float64
		if err := json.Unmarshal(raw, &lists); err != nil {
			return badRequest("prompt", "prompt: want a list of one list of token ids: %v", err)
		}
		if len(lists) != 1 {
			return badRequest("prompt", "prompt is a list of %d token lists: kvx serves one prompt per request", len(lists))
		}
		ids = lists[0]
	case first == '[':
		if err := json.Unmarshal(raw, &ids); err != nil {
			return badRequest("prompt", "prompt: want a list of token ids (integers): %v", err)
		}
	default:
		return badRequest("prompt", "prompt: want a string, a list of one string, or a list of token ids, got %s", describe(raw))
	}
	j.prompt = make([]int32, len(ids))
	for i, f := range ids {
		if f != float64(int64(f)) {
			return badRequest("prompt", "prompt[%d] = %v: a token id is an integer", i, f)
		}
		if f < 0 || f >= float64(s.opt.Vocab) {
			return badRequest("prompt", "prompt[%d] = %v: outside the vocabulary [0, %d) of model %s", i, f, s.opt.Vocab, s.opt.Model)
		}
		j.prompt[i] = int32(f)
	}
	return nil
}

// peek returns the first byte of b that is not JSON white space, or 0.
func peek(b []byte) byte {
	b = bytes.TrimLeft(b, " \t\r\n")
	if len(b) == 0 {
		return 0
	}
	return b[0]
}

func describe(raw json.RawMessage) string {
	if len(raw) > 40 {
		return string(raw[:40]) + "..."
	}
	return string(raw)
}

// encode tokenizes text into j.prompt.
func (s *Server) encode(text, field string, j *job) *apiError {
	if text == "" {
		return badRequest(field, "%s is empty: a prompt needs at least 1 token", field)
	}
	if s.opt.Tokenizer == nil {
		return badRequest(field, "%s is text, and %s", field, s.opt.NoTokenizer)
	}
	if pe, ok := s.opt.Tokenizer.(PlainEncoder); ok && field == "messages" && s.opt.ChatTemplate != nil {
		j.prompt = pe.EncodePlain(text) // the template wrote the special tokens
		return nil
	}
	j.prompt = s.opt.Tokenizer.Encode(text)
	return nil
}

// chatMessage is one message of a chat request.
type chatMessage struct {
	Role    *string         `json:"role"`
	Content json.RawMessage `json:"content"`
}

// ChatPrompt is the plain chat template kvx uses: one line per message,
// "role: content", then "assistant:" for the answer. For example
//
//	system: You are terse.
//	user: Hello
//	assistant:
//
// It is used when the checkpoint has no chat_template (Options.ChatTemplate).
func ChatPrompt(roles, contents []string) string {
	var b strings.Builder
	for i := range roles {
		b.WriteString(roles[i])
		b.WriteString(": ")
		b.WriteString(contents[i])
		b.WriteByte('\n')
	}
	b.WriteString("assistant:")
	return b.String()
}

// chatText applies the chat template (Options.ChatTemplate, else
// ChatPrompt) to the request's messages. A content is a string or a list of
// {"type": "text", "text": ...} parts. A template that fails to render
// them is a 400 that says why.
func (s *Server) chatText(raw json.RawMessage) (string, *apiError) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return "", badRequest("messages", "messages is missing: want a list of {\"role\", \"content\"}")
	}
	var msgs []chatMessage
	if err := json.Unmarshal(raw, &msgs); err != nil {
		return "", badRequest("messages", "messages: want a list of {\"role\": string, \"content\": string}: %v", err)
	}
	if len(msgs) == 0 {
		return "", badRequest("messages", "messages is empty: want at least one message")
	}
	roles := make([]string, len(msgs))
	contents := make([]string, len(msgs))
	for i, m := range msgs {
		p := fmt.Sprintf("messages[%d]", i)
		if m.Role == nil {
			return "", badRequest(p+".role", "%s.role is missing", p)
		}
		switch *m.Role {
		case "system", "user", "assistant", "developer", "tool":
		default:
			return "", badRequest(p+".role", "%s.role = %q: want system, developer, user, assistant or tool", p, *m.Role)
		}
		roles[i] = *m.Role
		var str string
		if err := json.Unmarshal(m.Content, &str); err == nil {
			contents[i] = str
			continue
		}
		var parts []struct {
			Type *string `json:"type"`
			Text *string `json:"text"`
		}
		if err := json.Unmarshal(m.Content, &parts); err != nil {
			return "", badRequest(p+".content", "%s.content: want a string or a list of text parts, got %s", p, describe(m.Content))
		}
		var b strings.Builder
		for k, part := range parts {
			if part.Type == nil || *part.Type != "text" || part.Text == nil {
				return "", badRequest(fmt.Sprintf("%s.content[%d]", p, k), "%s.content[%d]: only {\"type\": \"text\", \"text\": ...} parts are supported", p, k)
			}
			b.WriteString(*part.Text)
		}
		contents[i] = b.String()
	}
	ct := s.opt.ChatTemplate
	if ct == nil {
		return ChatPrompt(roles, contents), nil
	}
	tm := make([]chat.Message, len(roles))
	for i := range roles {
		tm[i] = chat.Message{Role: roles[i], Content: contents[i]}
	}
	text, err := ct.Render(tm)
	if err != nil {
		return "", &apiError{status: http.StatusBadRequest, param: "messages", code: "chat_template_error", msg: err.Error()}
	}
	return text, nil
}
