// Package generate is kvx generate's work: a prompts file (JSONL, one
// prompt a line) read and checked line by line against the model, so that
// a bad line fails alone; the lines that parsed run in one engine run of
// the prepared configuration; and each line's completion is collected from
// the report, in input order.
package generate

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"strings"

	"github.com/hashicorp/go-hclog"

	"github.com/kvx-dev/kvx/core/config"
	"github.com/kvx-dev/kvx/core/registry"
	"github.com/kvx-dev/kvx/core/report"
	"github.com/kvx-dev/kvx/core/serve"
	"github.com/kvx-dev/kvx/core/setup"
	"github.com/kvx-dev/kvx/core/workload"
	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
)

// MaxTopLogprobs bounds --top-logprobs (vLLM's default max_logprobs).
const MaxTopLogprobs = 20

// Completion is one prompt line's result, as --json writes it.
type Completion struct {
	Line        int                     `json:"line"`
	OutputIDs   []int32                 `json:"output_ids"`
	Text        *string                 `json:"text,omitempty"`
	TopLogprobs [][]report.TokenLogprob `json:"top_logprobs,omitempty"`
	// Logprobs are the generated tokens' own log-probabilities (with
	// --top-logprobs; a sampled token need not lead its top list).
	Logprobs []float64 `json:"logprobs,omitempty"`
	// FinishReason is "stop" (an EOS or stop id, a stop string) or
	// "length" (max_tokens).
	FinishReason string           `json:"finish_reason,omitempty"`
	Error        string           `json:"error,omitempty"`
	prompt       int              // prompt tokens
	req          *workload.Prompt // nil when the line failed before it ran
}

// PromptTokens is the number of tokens of the line's prompt (0 when the
// line did not parse).
func (c *Completion) PromptTokens() int { return c.prompt }

// Prompt is the line's request, nil when the line did not parse.
func (c *Completion) Prompt() *workload.Prompt { return c.req }

// Session is one kvx generate: the prepared configuration, the model's
// tokenizer, and the prompts file's lines. Open checks everything that
// needs no running plugin; Run runs the lines that parsed.
type Session struct {
	// Lines are the prompts file's non-blank lines in order: a line that
	// did not parse has its Error set and does not run; Run fills the
	// others.
	Lines []*Completion
	p     *setup.Prepared
	tok   setup.Tokenizer
}

// Open prepares cfg for kvx generate with reg (setup.Prepare: every check
// a run makes) and reads the prompts file at path, asking topLogprobs
// alternatives per generated token. Its errors are the configuration's or
// the file's, each prefixed "generate: " where it names the file: a device
// that computes no tokens, a tokenizer.json that does not load, a prompts
// file that cannot be read or holds no prompt. A bad line is not an error:
// its Completion says why.
func Open(cfg *config.Config, reg *registry.Registry, path string, topLogprobs int) (*Session, error) {
	if !config.Computing(cfg.Device) {
		return nil, errors.New("generate: device sim computes no tokens (its tokens are placeholders hashed from the seed, the request and the position); " +
			"use a computing device: set device: cpu (--set device=cpu)")
	}
	res, err := setup.Prepare(cfg, "generate", reg)
	if err != nil {
		return nil, err
	}
	tok, noTok, err := setup.TokenizerFor(cfg, res.Model)
	if err != nil {
		return nil, err
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("generate: %w", err)
	}
	defer f.Close()
	eos, err := setup.EOS(cfg, res.Model)
	if err != nil {
		return nil, fmt.Errorf("generate: %w", err)
	}
	lines, err := Read(f, Limits{Vocab: res.Model.Vocab, MaxSeqLen: cfg.MaxSeqLen, Model: res.Model.Name,
		TopLogprobs: topLogprobs, Tok: tok, NoTok: noTok, EOS: eos})
	if err != nil {
		return nil, fmt.Errorf("generate: %s: %w", path, err)
	}
	if len(lines) == 0 {
		return nil, fmt.Errorf("generate: %s holds no prompt", path)
	}
	return &Session{Lines: lines, p: res, tok: tok}, nil
}

// Run runs the lines that parsed, in input order (request i is the i-th of
// them), in one engine run (setup.Prepared.Run), and fills their
// completions. It returns a one-line summary of the run ("" when no line
// parsed, and nothing ran). An error is the engine's, prefixed
// "generate: "; a line that failed is not: its Completion says why.
func (s *Session) Run(ctx context.Context, log hclog.Logger) (string, error) {
	var prompts []workload.Prompt
	var runs []*Completion
	for _, c := range s.Lines {
		if c.req != nil {
			prompts = append(prompts, *c.req)
			runs = append(runs, c)
		}
	}
	if len(prompts) == 0 {
		return "", nil
	}
	cfg := s.p.Config
	wl, err := workload.FromPrompts(prompts, s.p.Model.Vocab)
	if err != nil {
		return "", fmt.Errorf("generate: %w", err) // checked per line already
	}
	wl.RetentionPriority, wl.RetentionDuration = cfg.Workload.Retention()
	s.p.Spec.Workload = wl
	s.p.Spec.KeepOutputs = true
	rep, err := s.p.Run(ctx, log)
	if err != nil {
		return "", fmt.Errorf("generate: %w", err)
	}
	Collect(rep, runs, s.tok)
	summary := fmt.Sprintf("%d prompts ran: %d tokens generated in %d steps, %.2f s", len(runs), rep.Tokens.Generated, rep.Engine.Steps, rep.Engine.WallS)
	if n := rep.Requests.Preemptions; n > 0 {
		summary += fmt.Sprintf("; %d preemptions (%d suspended to the host tier)", n, rep.Requests.Suspensions)
	}
	if rep.Tokens.DraftProposed > 0 {
		summary += fmt.Sprintf("; MTP drafts accepted %d of %d", rep.Tokens.DraftAccepted, rep.Tokens.DraftProposed)
	}
	return summary, nil
}

// Collect fills each run's completion from the report: its tokens, text and
// top logprobs, or why it did not complete.
func Collect(rep report.Report, runs []*Completion, tok setup.Tokenizer) {
	why := map[uint64]string{}
	for _, rj := range rep.Requests.Rejections {
		why[rj.ID] = "rejected: " + rj.Reason
	}
	for _, f := range rep.Requests.Failures {
		why[f.ID] = "failed: " + f.Reason
	}
	for _, ro := range rep.Outputs.Requests {
		if ro.ID >= uint64(len(runs)) {
			continue
		}
		c := runs[ro.ID]
		if w, ok := why[ro.ID]; ok {
			c.Error = w
			continue
		}
		stopped := ro.FinishReason == "stop"
		if len(ro.Tokens) != c.req.MaxTokens && !stopped {
			c.Error = fmt.Sprintf("generated %d of max_tokens %d tokens", len(ro.Tokens), c.req.MaxTokens)
			continue
		}
		c.OutputIDs, c.FinishReason = ro.Tokens, ro.FinishReason
		if tok != nil {
			text := serve.FinalText(tok, ro.Tokens, c.req.Decoding.Stops, c.req.Decoding.StopIDs, stopped)
			c.Text = &text
		}
		c.Logprobs = ro.Logprobs
		c.TopLogprobs = ro.TopLogprobs
		if c.req.TopLogprobs > 0 && len(c.TopLogprobs) != len(c.OutputIDs) {
			c.Error = fmt.Sprintf("the device returned top logprobs for %d of %d generated tokens", len(c.TopLogprobs), len(c.OutputIDs))
		}
	}
	for _, c := range runs {
		if c.Error == "" && c.OutputIDs == nil {
			c.Error = "the engine returned no output"
		}
	}
}

// WriteJSON writes lines as --json does: a JSON list in input order, one
// completion a line, output_ids a list also on a line that failed.
func WriteJSON(w io.Writer, lines []*Completion) error {
	for _, c := range lines {
		if c.OutputIDs == nil {
			c.OutputIDs = []int32{} // a list in JSON, also on a failed line
		}
	}
	// One completion per line: a list a person can read and diff.
	data := []byte("[\n")
	for i, c := range lines {
		b, err := json.Marshal(c)
		if err != nil {
			return err
		}
		data = append(data, b...)
		if i < len(lines)-1 {
			data = append(data, ',')
		}
		data = append(data, '\n')
	}
	data = append(data, "]\n"...)
	_, err := w.Write(data)
	return err
}

// Limits are what a prompt line is checked against.
type Limits struct {
	Vocab, MaxSeqLen int
	Model            string
	TopLogprobs      int
	Tok              setup.Tokenizer // nil: text prompts fail with NoTok
	NoTok            string
	EOS              []int32 // the model's end-of-sequence ids (setup.EOS)
}

// promptLine is one line of the prompts file.
type promptLine struct {
	// The sampling and stop fields of the OpenAI and vLLM APIs:
	// temperature, top_p, top_k, min_p, seed, the penalties,
	// stop_token_ids, ignore_eos, min_tokens (workload.SamplingFields),
	// and stop strings.
	workload.SamplingFields
	Stop      []string `json:"stop"`
	PromptIDs *[]int64 `json:"prompt_ids"`
	Prompt    *string  `json:"prompt"`
	MaxTokens *int64   `json:"max_tokens"`
	CacheSalt *string  `json:"cache_salt"`
	// retention_priority 1..100 and retention_duration_s > 0: the
	// retention of the blocks the prompt stores (workload.Retention).
	RetentionPriority  *int64   `json:"retention_priority"`
	RetentionDurationS *float64 `json:"retention_duration_s"`
}

// Read reads a prompts file: one completion per non-blank line,
// its Error set when the line is bad (it then does not run) and its req set
// otherwise. Only a read error fails the whole file.
func Read(r io.Reader, lim Limits) ([]*Completion, error) {
	br := bufio.NewReader(r)
	var out []*Completion
	for n := 1; ; n++ {
		raw, err := br.ReadBytes('\n')
		if len(bytes.TrimSpace(raw)) > 0 {
			c := &Completion{Line: n}
			if p, msg := parsePrompt(raw, lim); msg != "" {
				c.Error = msg
			} else {
				c.req, c.prompt = p, len(p.Tokens)
			}
			out = append(out, c)
		}
		if err == io.EOF {
			return out, nil
		}
		if err != nil {
			return nil, err
		}
	}
}

// parsePrompt checks one line; the message names the field, the value and
// the limit.
func parsePrompt(raw []byte, lim Limits) (*workload.Prompt, string) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	var pl promptLine
	if err := dec.Decode(&pl); err != nil {
		return nil, fmt.Sprintf("not a prompt object {\"prompt_ids\": [..] or \"prompt\": \"..\", \"max_tokens\": N}: %v", err)
	}
	if dec.More() {
		return nil, "more than one JSON value on the line: want one prompt object per line"
	}
	p := &workload.Prompt{TopLogprobs: lim.TopLogprobs}
	idsField := "prompt_ids"
	switch {
	case pl.PromptIDs != nil && pl.Prompt != nil:
		return nil, "both prompt_ids and prompt are set: give one"
	case pl.PromptIDs != nil:
		ids := *pl.PromptIDs
		p.Tokens = make([]int32, len(ids))
		for i, id := range ids {
			if id < 0 || id >= int64(lim.Vocab) {
				return nil, fmt.Sprintf("prompt_ids[%d] = %d: outside the vocabulary [0, %d) of model %s", i, id, lim.Vocab, lim.Model)
			}
			p.Tokens[i] = int32(id)
		}
	case pl.Prompt != nil:
		if lim.Tok == nil {
			return nil, "prompt (text): " + lim.NoTok
		}
		p.Tokens = lim.Tok.Encode(*pl.Prompt)
		idsField = "prompt (its tokens)"
		for i, id := range p.Tokens {
			if id < 0 || int(id) >= lim.Vocab {
				return nil, fmt.Sprintf("prompt: its token %d is id %d, outside the vocabulary [0, %d) of model %s: the tokenizer does not fit the model",
					i, id, lim.Vocab, lim.Model)
			}
		}
	default:
		return nil, "no prompt: want prompt_ids (token ids) or prompt (text)"
	}
	if pl.MaxTokens == nil {
		return nil, "max_tokens is missing: want the number of tokens to generate, >= 1"
	}
	mt := *pl.MaxTokens
	n := int64(len(p.Tokens))
	switch {
	case n == 0:
		return nil, idsField + " is empty: a prompt needs at least 1 token"
	case n >= int64(lim.MaxSeqLen):
		return nil, fmt.Sprintf("%s: %d tokens, longer than max_seq_len %d allows (at most %d, leaving room for one generated token)",
			idsField, n, lim.MaxSeqLen, lim.MaxSeqLen-1)
	case mt < 1:
		return nil, fmt.Sprintf("max_tokens = %d: must be >= 1", mt)
	case mt > int64(lim.MaxSeqLen)-n: // not n+mt: that overflows for max_tokens near 2^63
		return nil, fmt.Sprintf("max_tokens = %d: the prompt's %d tokens + max_tokens exceed max_seq_len %d (at most %d for this prompt)",
			mt, n, lim.MaxSeqLen, int64(lim.MaxSeqLen)-n)
	}
	p.MaxTokens = int(mt)
	if pl.CacheSalt != nil {
		switch s := *pl.CacheSalt; {
		case s == "":
			return nil, "cache_salt is empty: give a non-empty string, or leave it out for the shared cache"
		case len(s) > kvcache.MaxCacheSaltBytes:
			return nil, fmt.Sprintf("cache_salt is %d bytes: the limit is %d", len(s), kvcache.MaxCacheSaltBytes)
		}
		p.CacheSalt = *pl.CacheSalt
	}
	var err error
	if p.Decoding, err = pl.SamplingFields.Decoding(lim.Vocab, p.MaxTokens, lim.EOS, rand.Uint64); err != nil {
		return nil, strings.TrimPrefix(err.Error(), "workload: ")
	}
	p.Decoding.Logprobs = lim.TopLogprobs > 0
	if len(pl.Stop) > 0 {
		if msg := serve.CheckStops(pl.Stop); msg != "" {
			return nil, msg
		}
		if lim.Tok == nil {
			return nil, "stop strings need the model's tokenizer to match the text: " + lim.NoTok
		}
		p.Decoding.StopText = serve.StopMatcher(lim.Tok, pl.Stop)
	}
	p.Decoding.Stops = pl.Stop
	if p.RetentionPriority, p.RetentionDuration, err = workload.Retention(pl.RetentionPriority, pl.RetentionDurationS); err != nil {
		return nil, strings.TrimPrefix(err.Error(), "workload: ")
	}
	if err := workload.CheckPrompt(*p, lim.Vocab); err != nil {
		return nil, strings.TrimPrefix(err.Error(), "workload: ")
	}
	return p, ""
}
