// Package serve is kvx's OpenAI-compatible HTTP front end over a live engine
// (engine.StartLive): POST /v1/completions and /v1/chat/completions (JSON,
// or server-sent events with "stream": true), GET /v1/models, GET /health
// and GET /metrics (Prometheus, vLLM's metric names with a kvx: prefix), and
// vLLM's POST /reset_prefix_cache.
//
// Its parts and the failure each prevents:
//   - request.go checks every request before it reaches the engine, so bad
//     input is a 4xx in OpenAI's error shape that names the field, the value
//     and the limit, and never touches the engine (DESIGN.md §6);
//   - serve.go (this file) runs one request against the engine: a client
//     that goes away cancels its request, so its blocks are freed at once,
//     and a request the engine fails ends alone;
//   - metrics.go exposes the engine's gauges and counters and the
//     latency histograms;
//   - request.go renders chat messages with the checkpoint's Jinja chat
//     template (plugins/model/chat, the model description's reader), so a
//     chat prompt is the one the model was trained on, and a template that
//     refuses the messages is a 400 that says why; chat bounds every render
//     (stack depth, steps, time, output, range, source shape, no
//     self-containing values), so a hostile template fails its own request
//     with a 400 naming the limit instead of killing the server (a Go stack
//     overflow is fatal) or holding a core;
//   - session.go is kvx serve's session: Open makes every check a run makes
//     (setup.Prepare) and those of serving (tokenizer, EOS, chat template,
//     fault injection, the KV events publisher) before anything starts, so
//     a bad configuration never starts an engine; Serve drains the requests
//     in flight on a stop signal before it stops the engine.
//
// /health tells the truth throughout: 503 "restarting" while the engine
// replaces a plugin that died, "draining" after Drain, "unavailable" once
// the engine ended (its process then exits: never 503 forever).
//
// Sampling is per request (temperature, top_p, top_k, min_p, seed, the
// penalties: worker.Sampling's rules, greedy at temperature 0); a request
// ends at max_tokens (finish_reason "length") or at a stop condition
// ("stop"): the model's EOS ids unless ignore_eos, stop_token_ids, stop
// strings (never streamed, not even in part), all after min_tokens.
// fields.go says which fields each endpoint takes. Chat prompts use the
// checkpoint's chat template (template.go: Jinja through gonja, as transformers renders it)
// when it has one, else a plain template (see ChatPrompt).
package serve

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/kvx-dev/kvx/core/engine"
	"github.com/kvx-dev/kvx/core/workload"
	"github.com/kvx-dev/kvx/plugins/v1/worker"

	"github.com/kvx-dev/kvx/plugins/model/chat"
)

// Defaults for Options left at zero.
const (
	DefaultMaxBodyBytes = 8 << 20
	DefaultMaxWaiting   = 256
	DefaultMaxTokens    = 16 // OpenAI's default for completions
)

// Tokenizer turns text into token ids and back (kvx's tokenizer seam).
type Tokenizer interface {
	Encode(text string) []int32
	Decode(ids []int32) string
}

// PlainEncoder is an optional Tokenizer interface: EncodePlain encodes text
// without the special tokens Encode adds (a BOS). A chat template's prompt
// is encoded with it, since the template writes its own bos_token (as
// vLLM encodes a rendered chat with add_special_tokens false).
type PlainEncoder interface {
	EncodePlain(text string) []int32
}

// Options configure a Server.
type Options struct {
	Model        string    // the id /v1/models lists and requests must name
	Vocab        int       // token ids are in [0, Vocab)
	MaxSeqLen    int       // max_seq_len: prompt + max_tokens at most this
	Tokenizer    Tokenizer // nil: text prompts are refused with NoTokenizer
	NoTokenizer  string    // why there is no tokenizer
	Placeholder  bool      // device sim: tokens are placeholders, text is "<id>" per token
	SimClock     bool      // latencies come from the engine's simulated clock, not the wall
	MaxBodyBytes int64     // larger request bodies get 413
	MaxWaiting   int       // more requests without a first token get 429
	// ChatTemplate renders chat messages into the prompt; nil: ChatPrompt.
	ChatTemplate *chat.Template
	// EOS are the model's end-of-sequence ids (setup.EOS): a request ends
	// at one unless it sets ignore_eos.
	EOS []int32
}

// Server serves one live engine. It is an http.Handler.
type Server struct {
	opt   Options
	eng   *engine.Live
	mux   *http.ServeMux
	reg   *prometheus.Registry
	met   *metrics
	seq   atomic.Uint64
	start time.Time

	mu       sync.Mutex
	active   int           // POST requests being handled
	draining bool          // Drain was called: new requests get 503
	idle     chan struct{} // closed when draining and active is 0
}

// New returns a server over eng.
func New(eng *engine.Live, opt Options) *Server {
	if opt.MaxBodyBytes <= 0 {
		opt.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if opt.MaxWaiting <= 0 {
		opt.MaxWaiting = DefaultMaxWaiting
	}
	s := &Server{opt: opt, eng: eng, mux: http.NewServeMux(), reg: prometheus.NewRegistry(), start: time.Now()}
	s.met = newMetrics(s.reg, opt.Model, eng)
	// The Go runtime's and the process's standard series (go_goroutines,
	// process_open_fds, process_resident_memory_bytes): what a soak
	// watches for leaks.
	s.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	s.mux.HandleFunc("/v1/completions", s.post(s.completions))
	s.mux.HandleFunc("/v1/chat/completions", s.post(s.chat))
	s.mux.HandleFunc("/v1/models", s.get(s.models))
	s.mux.HandleFunc("/health", s.get(s.health))
	s.mux.HandleFunc("/reset_prefix_cache", s.post(s.resetPrefixCache))
	s.mux.Handle("/metrics", promhttp.HandlerFor(s.reg, promhttp.HandlerOpts{}))
	s.mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeErr(w, &apiError{status: http.StatusNotFound, typ: "not_found_error", msg: fmt.Sprintf("no endpoint %s %s", r.Method, r.URL.Path)})
	})
	return s
}

func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) { s.mux.ServeHTTP(w, r) }

// enter counts a request in, unless the server drains; leave counts it out.
func (s *Server) enter() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.draining {
		return false
	}
	s.active++
	return true
}

func (s *Server) leave() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.active--
	if s.draining && s.active == 0 {
		close(s.idle)
	}
}

// Drain stops taking requests (new ones get 503, /health answers 503
// "draining") and waits until the requests being served have finished, or
// ctx ends: it returns how many were still running then.
func (s *Server) Drain(ctx context.Context) int {
	s.mu.Lock()
	if !s.draining {
		s.draining = true
		s.idle = make(chan struct{})
		if s.active == 0 {
			close(s.idle)
		}
	}
	idle := s.idle
	s.mu.Unlock()
	select {
	case <-idle:
	case <-ctx.Done():
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.active
}

func (s *Server) post(h func(http.ResponseWriter, *http.Request, []byte)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if !s.enter() {
			w.Header().Set("Connection", "close")
			writeErr(w, &apiError{status: http.StatusServiceUnavailable, typ: "server_error", code: "shutting_down", retry: 1,
				msg: "the server is shutting down: it finishes the requests it has and takes no new ones"})
			return
		}
		defer s.leave()
		if r.Method != http.MethodPost {
			w.Header().Set("Allow", http.MethodPost)
			writeErr(w, &apiError{status: http.StatusMethodNotAllowed, msg: fmt.Sprintf("%s %s: use POST", r.Method, r.URL.Path)})
			return
		}
		body, aerr := s.readBody(w, r)
		if aerr != nil {
			writeErr(w, aerr)
			return
		}
		h(w, r, body)
	}
}

func (s *Server) get(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", http.MethodGet)
			writeErr(w, &apiError{status: http.StatusMethodNotAllowed, msg: fmt.Sprintf("%s %s: use GET", r.Method, r.URL.Path)})
			return
		}
		h(w, r)
	}
}

// readBody reads the whole body within the size limit and checks it is
// UTF-8 (encoding/json would silently replace bad bytes).
func (s *Server) readBody(w http.ResponseWriter, r *http.Request) ([]byte, *apiError) {
	lim := s.opt.MaxBodyBytes
	if r.ContentLength > lim {
		return nil, &apiError{status: http.StatusRequestEntityTooLarge, code: "request_too_large",
			msg: fmt.Sprintf("request body is %d bytes, more than the limit of %d bytes", r.ContentLength, lim)}
	}
	body, err := readAll(http.MaxBytesReader(w, r.Body, lim))
	var mbe *http.MaxBytesError
	switch {
	case errors.As(err, &mbe):
		return nil, &apiError{status: http.StatusRequestEntityTooLarge, code: "request_too_large",
			msg: fmt.Sprintf("request body is more than the limit of %d bytes", lim)}
	case err != nil:
		return nil, &apiError{status: http.StatusBadRequest, msg: "reading the request body: " + err.Error()}
	}
	if !utf8.Valid(body) {
		off := 0
		for off < len(body) {
			r, n := utf8.DecodeRune(body[off:])
			if r == utf8.RuneError && n <= 1 {
				break
			}
			off += n
		}
		return nil, &apiError{status: http.StatusBadRequest, msg: fmt.Sprintf("request body is not valid UTF-8 (first bad byte at offset %d)", off)}
	}
	return body, nil
}

func (s *Server) models(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, map[string]any{
		"object": "list",
		"data": []map[string]any{{
			"id": s.opt.Model, "object": "model", "created": s.start.Unix(), "owned_by": "kvx",
			"max_model_len": s.opt.MaxSeqLen, "vocab_size": s.opt.Vocab,
		}},
	})
}

// health answers 200 {"status": "ok"} while the engine serves, and 503
// with the status and the reason otherwise: "restarting" while a plugin
// that died is replaced (200 again after), "draining" after a stop signal,
// "unavailable" once the engine ended (the process then exits).
func (s *Server) health(w http.ResponseWriter, _ *http.Request) {
	s.mu.Lock()
	draining := s.draining
	s.mu.Unlock()
	ok, why := s.eng.Health()
	status := "ok"
	switch {
	case !ok && engineEnded(s.eng):
		status = "unavailable"
	case !ok:
		status = "restarting"
	case draining:
		status, why = "draining", "the server is shutting down: it finishes the requests it has and takes no new ones"
	}
	if status == "ok" {
		writeJSON(w, http.StatusOK, map[string]string{"status": status})
		return
	}
	writeJSON(w, http.StatusServiceUnavailable, map[string]string{"status": status, "reason": why})
}

// resetPrefixCache is vLLM's POST /reset_prefix_cache: it drops every
// cached prefix block of every stage's manager (engine.Live.ResetPrefixCache)
// and answers 200 {"status": "ok", "cached_blocks_dropped": N}; while
// requests are in flight it changes nothing and answers 409
// (engine_busy), as vLLM refuses a reset while blocks are in use. The body
// and vLLM's query parameters (device) are ignored.
func (s *Server) resetPrefixCache(w http.ResponseWriter, r *http.Request, _ []byte) {
	ctx, cancel := context.WithTimeout(r.Context(), resetTimeout)
	defer cancel()
	res, err := s.eng.ResetPrefixCache(ctx)
	switch {
	case errors.Is(err, engine.ErrBusy):
		writeErr(w, &apiError{status: http.StatusConflict, code: "engine_busy", retry: 1, msg: "reset_prefix_cache: " + err.Error()})
	case errors.Is(err, engine.ErrStopped):
		writeErr(w, &apiError{status: http.StatusServiceUnavailable, typ: "server_error", code: "engine_stopped", msg: "reset_prefix_cache: " + err.Error()})
	case err != nil:
		writeErr(w, &apiError{status: http.StatusServiceUnavailable, typ: "server_error", msg: "reset_prefix_cache: " + err.Error()})
	default:
		writeJSON(w, http.StatusOK, map[string]any{"status": "ok", "cached_blocks_dropped": res.CachedBlocks})
	}
}

// resetTimeout bounds a reset's wait for the engine's idle point.
const resetTimeout = 30 * time.Second

func engineEnded(eng *engine.Live) bool {
	select {
	case <-eng.Done():
		return true
	default:
		return false
	}
}

// job is one checked request ready for the engine.
type job struct {
	chat         bool
	prompt       []int32
	maxTokens    int
	salt         string // cache_salt; "" for none
	priority     int    // retention_priority; 0 for the workload's default
	priorityDur  int64  // retention_duration_s in ns; 0 while cached
	stream       bool
	usageStream  bool
	id           string
	created      int64
	dec          workload.Decoding // sampling and stop conditions
	stops        []string          // stop strings (dec.StopText matches them)
	logprobs     bool              // logprobs asked for
	topLogprobs  int               // alternatives per position
	echo         bool              // completions: the prompt's text before the completion
	n, bestOf    int               // choices returned, and sequences generated (>= n)
	hideLogprobs bool              // best_of without logprobs asked: they were only for the ranking
	promptText   *string           // the prompt as text, when it was given so
	// Prompt logprobs (echo with logprobs, or vLLM's prompt_logprobs):
	// promptLP asks, promptTopK alternatives per position; vllmPrompt puts
	// prompt_logprobs in each choice.
	promptLP   bool
	promptTopK int
	vllmPrompt bool
}

// submit hands j's choices to the engine (best_of of them: choice i
// samples with seed+i), or says why not (429, 503); on an error none is
// left running. More than one choice go in one SubmitN, which prefills the
// prompt once and forks its blocks through the cache managers.
func (s *Server) submit(j *job) ([]*engine.Handle, *apiError) {
	if q := s.eng.Queued(); q >= s.opt.MaxWaiting {
		return nil, &apiError{status: http.StatusTooManyRequests, typ: "rate_limit_error", code: "too_many_waiting",
			msg: fmt.Sprintf("%d requests are waiting for their first token, the limit is %d: retry later", q, s.opt.MaxWaiting), retry: 1}
	}
	req := engine.LiveRequest{Prompt: j.prompt, MaxTokens: j.maxTokens, CacheSalt: j.salt,
		RetentionPriority: j.priority, RetentionDuration: j.priorityDur, TopLogprobs: j.topLogprobs, Decoding: j.dec,
		PromptLogprobs: j.promptLP, PromptTopLogprobs: j.promptTopK}
	var hs []*engine.Handle
	var err error
	if j.bestOf == 1 {
		var h *engine.Handle
		if h, err = s.eng.Submit(req); err == nil {
			hs = []*engine.Handle{h}
		}
	} else {
		hs, err = s.eng.SubmitN(req, ChoiceDecodings(j.dec, j.bestOf))
	}
	if err != nil {
		return nil, &apiError{status: http.StatusServiceUnavailable, typ: "server_error", msg: err.Error()}
	}
	return hs, nil
}

// ChoiceDecodings is the Decoding of each of n choices of one request:
// choice i samples with the request's seed + i (wrapping at 2^64), so a
// seeded request with n > 1 gives the same n choices on every manager and
// on every run, and choice 0 is what the request would give with n = 1. A
// greedy request's choices are all greedy (equal).
func ChoiceDecodings(d workload.Decoding, n int) []workload.Decoding {
	out := make([]workload.Decoding, n)
	for i := range out {
		out[i] = d
		if d.Sampling != nil && i > 0 {
			sp := *d.Sampling
			sp.Seed += uint64(i)
			out[i].Sampling = &sp
		}
	}
	return out
}

// choice is one sequence of a request as its events arrive.
type choice struct {
	index  int
	h      *engine.Handle
	tr     *tracker
	out    []int32
	lps    []float64
	tops   [][]worker.TokenLogprob
	text   textStream
	prompt *promptRows // the prompt's rows, when asked (job.promptLP)
	finish string      // "" until it is done
	cached int
}

// take adds ev's tokens and logprobs; a device that returned no logprobs
// for tokens that asked for them is an error.
func (c *choice) take(j *job, ev engine.Event) *apiError {
	c.tr.event(ev, c.h.Arrival)
	if j.promptLP && c.prompt == nil && len(ev.Tokens) > 0 {
		if len(ev.PromptLogprobs) != len(j.prompt)-1 || j.promptTopK > 0 && len(ev.PromptTopLogprobs) != len(ev.PromptLogprobs) {
			return &apiError{status: http.StatusInternalServerError, typ: "server_error",
				msg: fmt.Sprintf("the device returned prompt logprobs for %d of %d prompt tokens after the first", len(ev.PromptLogprobs), len(j.prompt)-1)}
		}
		c.prompt = &promptRows{lps: ev.PromptLogprobs, tops: ev.PromptTopLogprobs}
	}
	c.out = append(c.out, ev.Tokens...)
	if j.logprobs {
		c.lps = append(c.lps, ev.Logprobs...)
		if j.topLogprobs > 0 {
			c.tops = append(c.tops, ev.TopLogprobs...)
		} else {
			c.tops = append(c.tops, make([][]worker.TokenLogprob, len(ev.Tokens))...)
		}
		if len(c.lps) != len(c.out) || len(c.tops) != len(c.out) {
			return &apiError{status: http.StatusInternalServerError, typ: "server_error",
				msg: fmt.Sprintf("the device returned logprobs for %d of %d generated tokens", len(c.lps), len(c.out))}
		}
	}
	if ev.Done {
		c.finish, c.cached = "length", ev.Cached
		if ev.Stopped {
			c.finish = "stop"
		}
	}
	return nil
}

// choiceEvent is one event of choice i, or the error reading it.
type choiceEvent struct {
	i   int
	ev  engine.Event
	err error
}

// run drives one request: it reads its choices' events and writes the
// answer, as one JSON object or as server-sent events (chunks of all
// choices interleaved as their tokens come, each naming its index).
func (s *Server) run(w http.ResponseWriter, r *http.Request, j *job) {
	hs, aerr := s.submit(j)
	if aerr != nil {
		writeErr(w, aerr)
		return
	}
	ctx, stop := context.WithCancel(r.Context())
	defer stop()
	t0 := time.Now()
	cs := make([]*choice, len(hs))
	evc := make(chan choiceEvent)
	for i, h := range hs {
		cs[i] = &choice{index: i, h: h, tr: s.met.track(s.opt.SimClock, t0),
			text: textStream{tok: s.opt.Tokenizer, placeholder: s.opt.Placeholder, stops: j.stops, stopIDs: j.dec.StopIDs}}
		go func() {
			for {
				ev, err := h.Next(ctx)
				select {
				case evc <- choiceEvent{i, ev, err}:
				case <-ctx.Done():
					return
				}
				if err != nil || ev.Done || ev.Err != nil {
					return
				}
			}
		}()
	}
	cancelAll := func() {
		for _, h := range hs {
			h.Cancel()
		}
	}
	var sse *sseWriter
	if j.stream {
		sse = newSSE(w)
		if j.chat {
			for i := range cs {
				sse.send(s.chunk(j, i, map[string]any{"role": "assistant", "content": ""}, nil, nil))
			}
		}
	}
	fail := func(aerr *apiError) {
		cancelAll()
		s.met.aborted.Inc()
		if sse != nil {
			sse.send(map[string]any{"error": aerr.body()})
			sse.done()
		} else {
			writeErr(w, aerr)
		}
	}
	for left := len(cs); left > 0; {
		var ce choiceEvent
		select {
		case ce = <-evc:
		case <-ctx.Done():
		}
		if ce.err != nil || ctx.Err() != nil { // the client went away: free its blocks now
			cancelAll()
			s.met.aborted.Inc()
			return
		}
		c, ev := cs[ce.i], ce.ev
		if ev.Err != nil {
			fail(engineErr(ev.Err))
			return
		}
		from := len(c.out)
		if aerr := c.take(j, ev); aerr != nil {
			fail(aerr)
			return
		}
		if sse != nil && len(ev.Tokens) > 0 {
			if j.echo && from == 0 {
				c.text.prefix = s.promptOf(j)
			}
			delta := c.text.next(c.out, ev.Done, ev.Stopped)
			ch := s.streamChunk(j, c.index, delta, "", c.out[from:])
			if j.logprobs {
				setLogprobs(ch, s.logprobsOf(j, c.out, c.lps, c.tops, from, c.text.offset(c.out[:from]), c.prompt))
			}
			if j.vllmPrompt && from == 0 {
				setChoiceField(ch, "prompt_logprobs", s.promptLogprobsOf(j, c.prompt))
			}
			if !sse.send(ch) {
				cancelAll()
				s.met.aborted.Inc()
				return
			}
		}
		if ev.Done {
			left--
			if sse != nil {
				sse.send(s.streamChunk(j, c.index, "", c.finish, nil))
			}
		}
	}
	// One count per request, by its first choice's finish_reason (vLLM's
	// finished_reason label).
	if cs[0].finish == "stop" {
		s.met.stopped.Inc()
	} else {
		s.met.success.Inc()
	}
	completion := 0
	for _, c := range cs {
		completion += len(c.out)
	}
	// OpenAI's usage: the prompt once, every generated token of every
	// sequence (best_of's too).
	usage := map[string]any{
		"prompt_tokens": len(j.prompt), "completion_tokens": completion, "total_tokens": len(j.prompt) + completion,
		"prompt_tokens_details": map[string]int{"cached_tokens": cs[0].cached},
	}
	if sse != nil {
		if j.usageStream {
			c := s.chunk(j, 0, nil, nil, usage)
			c["choices"] = []any{}
			sse.send(c)
		}
		sse.done()
		return
	}
	if j.bestOf > j.n {
		// best_of: the n with the highest log-probability (the sum of their
		// tokens'), the earlier among equals.
		sum := func(c *choice) float64 {
			var t float64
			for _, v := range c.lps {
				t += v
			}
			return t
		}
		slices.SortStableFunc(cs, func(a, b *choice) int { return cmp.Compare(sum(b), sum(a)) })
		cs = cs[:j.n]
	}
	choices := make([]any, len(cs))
	for i, c := range cs {
		body := c.text.final(c.out, c.finish == "stop")
		var lp any
		if j.logprobs && !j.hideLogprobs {
			lp = s.logprobsOf(j, c.out, c.lps, c.tops, 0, 0, c.prompt)
		}
		if j.echo {
			body = s.promptOf(j) + body
		}
		choices[i] = s.choiceOf(j, i, c.out, body, c.finish, lp)
		if j.vllmPrompt {
			choices[i].(map[string]any)["prompt_logprobs"] = s.promptLogprobsOf(j, c.prompt)
		}
	}
	writeJSON(w, http.StatusOK, map[string]any{"id": j.id, "object": s.object(j, false), "created": j.created, "model": s.opt.Model,
		"choices": choices, "usage": usage})
}

// promptOf is the prompt's text, for echo: as the request gave it, or its
// token ids decoded.
func (s *Server) promptOf(j *job) string {
	if j.promptText != nil {
		return *j.promptText
	}
	t := textStream{tok: s.opt.Tokenizer, placeholder: s.opt.Placeholder}
	return t.all(j.prompt)
}

// setChoiceField puts v as key into a stream chunk's choice.
func setChoiceField(c map[string]any, key string, v any) {
	if chs, ok := c["choices"].([]any); ok && len(chs) == 1 {
		if ch, ok := chs[0].(map[string]any); ok {
			ch[key] = v
		}
	}
}

// setLogprobs puts lp into a stream chunk's choice.
func setLogprobs(c map[string]any, lp any) {
	if chs, ok := c["choices"].([]any); ok && len(chs) == 1 {
		if ch, ok := chs[0].(map[string]any); ok {
			ch["logprobs"] = lp
		}
	}
}

func (s *Server) object(j *job, stream bool) string {
	switch {
	case j.chat && stream:
		return "chat.completion.chunk"
	case j.chat:
		return "chat.completion"
	}
	return "text_completion"
}

func (s *Server) chunk(j *job, index int, delta map[string]any, finish *string, usage map[string]any) map[string]any {
	c := map[string]any{"id": j.id, "object": s.object(j, true), "created": j.created, "model": s.opt.Model}
	if delta != nil || finish != nil {
		c["choices"] = []any{map[string]any{"index": index, "delta": delta, "finish_reason": finish}}
	}
	if usage != nil {
		c["usage"] = usage
	}
	return c
}

// streamChunk is one streamed chunk of choice index: its text, its finish
// reason ("" until the last), and the token ids it carries (as the
// non-streamed choice's token_ids; absent when none), so a client counts
// the tokens it received even where their text is held back (a stop
// string's prefix, a byte that is not UTF-8 alone).
func (s *Server) streamChunk(j *job, index int, text, finish string, ids []int32) map[string]any {
	var fr *string
	if finish != "" {
		fr = &finish
	}
	var c map[string]any
	if j.chat {
		d := map[string]any{}
		if text != "" || fr == nil {
			d["content"] = text
		}
		c = s.chunk(j, index, d, fr, nil)
	} else {
		c = map[string]any{"id": j.id, "object": "text_completion", "created": j.created, "model": s.opt.Model,
			"choices": []any{map[string]any{"index": index, "text": text, "logprobs": nil, "finish_reason": fr}}}
	}
	if len(ids) > 0 {
		c["choices"].([]any)[0].(map[string]any)["token_ids"] = slices.Clone(ids)
	}
	return c
}

// choiceOf is choice index of a non-streamed answer.
func (s *Server) choiceOf(j *job, index int, ids []int32, text, finish string, logprobs any) map[string]any {
	choice := map[string]any{"index": index, "finish_reason": finish, "logprobs": logprobs, "token_ids": ids}
	if j.chat {
		choice["message"] = map[string]any{"role": "assistant", "content": text}
	} else {
		choice["text"] = text
	}
	return choice
}

// engineErr maps a request's engine error to an HTTP answer.
func engineErr(err error) *apiError {
	var re *engine.RequestError
	switch {
	case errors.As(err, &re) && re.Rejected:
		return &apiError{status: http.StatusBadRequest, code: "context_length_exceeded", param: "prompt", msg: "the engine rejected the request: " + re.Reason}
	case errors.As(err, &re):
		return &apiError{status: http.StatusBadRequest, msg: "the request failed: " + re.Reason}
	case errors.Is(err, engine.ErrStopped):
		msg := "the engine stopped before the request finished"
		if err != engine.ErrStopped {
			msg += " (" + err.Error() + ")"
		}
		return &apiError{status: http.StatusServiceUnavailable, typ: "server_error", code: "engine_stopped", msg: msg}
	}
	return &apiError{status: http.StatusInternalServerError, typ: "server_error", msg: err.Error()}
}

// textStream turns the tokens so far into text deltas that never split a
// UTF-8 character: a delta ends at the last complete character, and the
// final one carries whatever is left.
type textStream struct {
	tok         Tokenizer
	placeholder bool
	sent        int      // bytes of the text already sent
	stops       []string // stop strings: no part of one is ever sent
	stopIDs     []int32  // stop ids: the text of the one that ended a request is not sent
	prefix      string   // text sent before the completion's (echo), once
}

// final is the completion's whole text: all of ids, cut before the first
// stop string when one occurs, else without the text of a stop id that
// ended the request (stopped).
func (t *textStream) final(ids []int32, stopped bool) string {
	s := t.all(ids)
	if !stopped {
		return s
	}
	if i := stopIndex(s, t.stops); i >= 0 {
		return s[:i]
	}
	if n := len(ids); n > 0 && slices.Contains(t.stopIDs, ids[n-1]) {
		return t.all(ids[:n-1])
	}
	return s
}

// offset is the length in bytes of the text of ids (text_offset).
func (t *textStream) offset(ids []int32) int {
	if len(ids) == 0 {
		return 0
	}
	return len(t.all(ids))
}

func (t *textStream) all(ids []int32) string {
	switch {
	case t.placeholder:
		b := make([]byte, 0, 8*len(ids))
		for _, id := range ids {
			b = append(b, " <"...)
			b = strconv.AppendInt(b, int64(id), 10)
			b = append(b, '>')
		}
		return string(b)
	case t.tok != nil:
		return t.tok.Decode(ids)
	}
	return ""
}

func (t *textStream) next(ids []int32, last, stopped bool) string {
	pre := t.prefix
	t.prefix = ""
	s := t.all(ids)
	if last {
		s = t.final(ids, stopped)
	} else {
		s = s[:len(s)-heldBack(s, t.stops)]
	}
	end := len(s)
	if !last {
		for end > t.sent {
			r, n := utf8.DecodeLastRuneInString(s[t.sent:end])
			if r != utf8.RuneError || n > 1 {
				break
			}
			// An incomplete character at the end waits for its next byte;
			// give up after 3 bytes (it is not UTF-8, send it as it is).
			if len(s)-end >= utf8.UTFMax-1 {
				end = len(s)
				break
			}
			end--
		}
	}
	if t.sent > len(s) { // cannot happen: a stop string's start is held back
		return pre
	}
	if end < t.sent {
		end = t.sent
	}
	d := s[t.sent:end]
	t.sent = end
	return pre + d
}

// sseWriter writes server-sent events.
type sseWriter struct {
	w  http.ResponseWriter
	rc *http.ResponseController
	ok bool
}

func newSSE(w http.ResponseWriter) *sseWriter {
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	return &sseWriter{w: w, rc: http.NewResponseController(w), ok: true}
}

// send writes one data event; false once the client is gone.
func (s *sseWriter) send(v any) bool {
	if !s.ok {
		return false
	}
	b, err := json.Marshal(v)
	if err == nil {
		_, err = fmt.Fprintf(s.w, "data: %s\n\n", b)
	}
	if err == nil {
		err = s.rc.Flush()
	}
	s.ok = err == nil
	return s.ok
}

func (s *sseWriter) done() {
	if s.ok {
		_, _ = fmt.Fprint(s.w, "data: [DONE]\n\n")
		_ = s.rc.Flush()
	}
}
