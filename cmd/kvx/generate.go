package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/kvx-dev/kvx/cmd/builtin"
	"github.com/kvx-dev/kvx/core/config"
	"github.com/kvx-dev/kvx/core/engine"
	"github.com/kvx-dev/kvx/core/report"
	"github.com/kvx-dev/kvx/core/serve"
	"github.com/kvx-dev/kvx/core/setup"
	"github.com/kvx-dev/kvx/core/workload"
	modeltok "github.com/kvx-dev/kvx/plugins/model/tok"
	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
	"github.com/kvx-dev/kvx/plugins/v1/spec"
)

// MaxTopLogprobs bounds --top-logprobs (vLLM's default max_logprobs).
const MaxTopLogprobs = 20

type generateOpts struct {
	prompts     string
	topLogprobs int
	jsonOut     string
}

func newGenerateCmd(g *globals) *cobra.Command {
	o := &generateOpts{}
	cmd := &cobra.Command{
		Use:   "generate",
		Short: "Run prompts through the engine and print each completion",
		Long: `Run the prompts of a JSONL file through the real engine (scheduler, cache
managers, worker plugins as configured), greedy unless a line samples, and
print each completion: its token ids, and its text when the model has a
tokenizer.

Each line of --prompts is one prompt:
  {"prompt_ids": [1, 2, 3], "max_tokens": 16}
  {"prompt": "some text", "max_tokens": 16}   (models with a tokenizer)
with, optionally, the sampling and stop fields of kvx serve: temperature,
top_p, top_k, min_p, seed, presence_penalty, frequency_penalty,
repetition_penalty, stop (strings), stop_token_ids, ignore_eos, min_tokens.
A completion ends at max_tokens ("finish_reason": "length") or earlier at
the model's EOS ids (generation_config.json's or config.json's eos_token_id;
the byte tokenizer's EOS for synthetic models), unless ignore_eos, at a stop
id or at a stop string ("stop"); a stop string is cut from the text, as is
the text of the EOS or stop id that ended it.
A checkpoint directory's tokenizer.json is the tokenizer of model: DIR (its
BOS added as transformers does; no chat template is applied); synthetic
models use the byte tokenizer.
A bad line (not JSON, no prompt, max_tokens < 1, an id outside the
vocabulary, longer than max_seq_len) fails alone; the others still run.

--json writes a list in input order of
  {"output_ids": [..], "text": "..", "top_logprobs": [[[id, logprob], ..], ..],
   "logprobs": [..], "finish_reason": "stop" or "length"}
with one top_logprobs list per generated token (--top-logprobs K of them,
most likely first, ties to the lower id as greedy sampling breaks them),
each generated token's own logprob (with --top-logprobs) and "error" set on
a line that failed. In JSON, each byte of the text that is not
UTF-8 becomes U+FFFD (the printed text quotes it exactly).

Only a computing device (device: cpu or cuda) gives real tokens; device sim is
refused. Exit status: 0 when every prompt ran, 1 when some failed, 2 for bad
configuration or flags.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runGenerate(g, o, cmd)
		},
	}
	cmd.Flags().StringVar(&o.prompts, "prompts", "", "JSONL file of prompts (required)")
	cmd.Flags().IntVar(&o.topLogprobs, "top-logprobs", 0, fmt.Sprintf("the K most likely tokens of every generated position, 0..%d (in --json)", MaxTopLogprobs))
	cmd.Flags().StringVar(&o.jsonOut, "json", "", "write the completions as JSON to this file ('-' for stdout)")
	return cmd
}

// completion is one prompt line's result, as --json writes it.
type completion struct {
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

func runGenerate(g *globals, o *generateOpts, cmd *cobra.Command) error {
	switch {
	case o.prompts == "":
		return usageErr(errors.New("generate: --prompts FILE is required"))
	case o.topLogprobs < 0 || o.topLogprobs > MaxTopLogprobs:
		return usageErr(fmt.Errorf("generate: --top-logprobs %d: must be in [0, %d]", o.topLogprobs, MaxTopLogprobs))
	case len(g.configs) == 0:
		return usageErr(errors.New("generate: --config FILE is required (a model on a computing device, e.g. scenarios/cpu-llama.yaml)"))
	}
	cfg, err := loadConfig(g, nil)
	if err != nil {
		return usageErr(err)
	}
	if !config.Computing(cfg.Device) {
		return usageErr(errors.New("generate: device sim computes no tokens (its tokens are placeholders hashed from the seed, the request and the position); " +
			"use a computing device: set device: cpu (--set device=cpu)"))
	}
	res, err := setup.Prepare(cfg, "generate", builtin.Registry())
	if err != nil {
		return usageErr(err)
	}
	tok, noTok, err := tokenizerFor(cfg, res.Model)
	if err != nil {
		return usageErr(err)
	}
	f, err := os.Open(o.prompts)
	if err != nil {
		return usageErr(fmt.Errorf("generate: %w", err))
	}
	eos, err := setup.EOS(cfg, res.Model)
	if err != nil {
		f.Close()
		return usageErr(fmt.Errorf("generate: %w", err))
	}
	lines, err := readPrompts(f, promptLimits{vocab: res.Model.Vocab, maxSeqLen: cfg.MaxSeqLen, model: res.Model.Name,
		topLogprobs: o.topLogprobs, tok: tok, noTok: noTok, eos: eos})
	f.Close()
	if err != nil {
		return usageErr(fmt.Errorf("generate: %s: %w", o.prompts, err))
	}
	if len(lines) == 0 {
		return usageErr(fmt.Errorf("generate: %s holds no prompt", o.prompts))
	}

	// The lines that parsed run, in input order: request i is runs[i].
	var prompts []workload.Prompt
	var runs []*completion
	var summary string
	for _, c := range lines {
		if c.req != nil {
			prompts = append(prompts, *c.req)
			runs = append(runs, c)
		}
	}
	if len(prompts) > 0 {
		wl, err := workload.FromPrompts(prompts, res.Model.Vocab)
		if err != nil {
			return usageErr(err) // checked per line already
		}
		wl.RetentionPriority, wl.RetentionDuration = cfg.Workload.Retention()
		res.Spec.Workload = wl
		res.Spec.KeepOutputs = true
		log := g.logger()
		res.Spec.Log = log
		oneThreadForSim(cfg.Device)
		l := res.Launcher(log)
		rep, err := engine.Run(cmd.Context(), res.Spec, l)
		l.Close()
		if err != nil {
			return engineErr(fmt.Errorf("generate: %w", err))
		}
		collect(rep, runs, tok)
		summary = fmt.Sprintf("%d prompts ran: %d tokens generated in %d steps, %.2f s", len(runs), rep.Tokens.Generated, rep.Engine.Steps, rep.Engine.WallS)
		if n := rep.Requests.Preemptions; n > 0 {
			summary += fmt.Sprintf("; %d preemptions (%d suspended to the host tier)", n, rep.Requests.Suspensions)
		}
		if rep.Tokens.DraftProposed > 0 {
			summary += fmt.Sprintf("; MTP drafts accepted %d of %d", rep.Tokens.DraftAccepted, rep.Tokens.DraftProposed)
		}
	}

	failed := 0
	out := cmd.OutOrStdout()
	for _, c := range lines {
		if c.Error != "" {
			failed++
			fmt.Fprintf(out, "line %d: failed: %s\n", c.Line, c.Error)
			continue
		}
		fmt.Fprintf(out, "line %d: %d prompt tokens, %d generated\n  ids:  %v\n", c.Line, c.prompt, len(c.OutputIDs), c.OutputIDs)
		if c.Text != nil {
			fmt.Fprintf(out, "  text: %s\n", strconv.Quote(*c.Text))
		}
	}
	if summary != "" {
		fmt.Fprintln(out, summary)
	}
	if o.jsonOut != "" {
		if err := writeCompletions(o.jsonOut, lines); err != nil {
			return err
		}
	}
	if failed > 0 {
		return engineErr(fmt.Errorf("generate: %d of %d prompts failed (see the lines above)", failed, len(lines)))
	}
	return nil
}

// collect fills each run's completion from the report: its tokens, text and
// top logprobs, or why it did not complete.
func collect(rep report.Report, runs []*completion, tok tokenizer) {
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

func writeCompletions(path string, lines []*completion) error {
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
	if path == "-" {
		_, err := os.Stdout.Write(data)
		return err
	}
	return os.WriteFile(path, data, 0o644)
}

// tokenizer turns prompt text into token ids and generated ids into text.
type tokenizer interface {
	Encode(text string) []int32
	Decode(ids []int32) string
}

// byteTokenizer is the byte-level tokenizer of synthetic models
// (device/synth: BOS, then one token per byte).
type byteTokenizer struct{}

func (byteTokenizer) Encode(text string) []int32 { return modeltok.EncodeBytes(text) }
func (byteTokenizer) Decode(ids []int32) string  { return modeltok.DecodeBytes(ids) }

// hfTokenizer is a checkpoint directory's tokenizer.json (plugins/model/tok):
// prompts get the special tokens its post-processor adds (a BOS, as
// transformers' tokenizer(text) does), and completions are decoded
// without special tokens (as vLLM's skip_special_tokens default). No chat
// template is applied: a prompt is encoded as it is.
type hfTokenizer struct{ t *modeltok.Tokenizer }

func (h hfTokenizer) Encode(text string) []int32 { return h.t.Encode(text, true) }
func (h hfTokenizer) Decode(ids []int32) string  { return h.t.Decode(ids, true) }

// EncodePlain encodes without the special tokens (serve.PlainEncoder): a
// chat template writes its own.
func (h hfTokenizer) EncodePlain(text string) []int32 { return h.t.Encode(text, false) }

// tokenIDsHint says where token ids go, for the reason there is no
// tokenizer (kvx generate and kvx serve both show it).
const tokenIDsHint = `kvx generate: "prompt_ids" in the prompts file; kvx serve: "prompt" as a list of integers in /v1/completions`

// tokenizerFor returns the tokenizer of the model cfg runs, or nil and why
// there is none. This is the one seam for tokenizers: a Hugging Face
// checkpoint directory's tokenizer.json, or device/synth's byte tokenizer
// for a synthetic model. A tokenizer.json that does not load is an error
// naming the file and what in it is wrong or unsupported.
func tokenizerFor(cfg *config.Config, m spec.Model) (tokenizer, string, error) {
	if st, err := os.Stat(cfg.Model); err == nil && st.IsDir() {
		path := filepath.Join(cfg.Model, "tokenizer.json")
		if _, err := os.Stat(path); err != nil {
			return nil, fmt.Sprintf("model %s is a checkpoint directory without tokenizer.json: give the prompt as token ids (%s)", cfg.Model, tokenIDsHint), nil
		}
		t, err := modeltok.Load(path)
		if err != nil {
			return nil, "", fmt.Errorf("tokenizer: %w", err)
		}
		return hfTokenizer{t}, "", nil
	}
	if m.Vocab < modeltok.ByteVocab {
		return nil, fmt.Sprintf("model %s: vocab %d is smaller than the byte tokenizer's %d ids: give the prompt as token ids (%s)", m.Name, m.Vocab, modeltok.ByteVocab, tokenIDsHint), nil
	}
	return byteTokenizer{}, "", nil
}

// promptLimits are what a prompt line is checked against.
type promptLimits struct {
	vocab, maxSeqLen int
	model            string
	topLogprobs      int
	tok              tokenizer // nil: text prompts fail with noTok
	noTok            string
	eos              []int32 // the model's end-of-sequence ids (setup.EOS)
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

// readPrompts reads the prompts file: one completion per non-blank line,
// its Error set when the line is bad (it then does not run) and its req set
// otherwise. Only a read error fails the whole file.
func readPrompts(r io.Reader, lim promptLimits) ([]*completion, error) {
	br := bufio.NewReader(r)
	var out []*completion
	for n := 1; ; n++ {
		raw, err := br.ReadBytes('\n')
		if len(bytes.TrimSpace(raw)) > 0 {
			c := &completion{Line: n}
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
func parsePrompt(raw []byte, lim promptLimits) (*workload.Prompt, string) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	var pl promptLine
	if err := dec.Decode(&pl); err != nil {
		return nil, fmt.Sprintf("not a prompt object {\"prompt_ids\": [..] or \"prompt\": \"..\", \"max_tokens\": N}: %v", err)
	}
	if dec.More() {
		return nil, "more than one JSON value on the line: want one prompt object per line"
	}
	p := &workload.Prompt{TopLogprobs: lim.topLogprobs}
	idsField := "prompt_ids"
	switch {
	case pl.PromptIDs != nil && pl.Prompt != nil:
		return nil, "both prompt_ids and prompt are set: give one"
	case pl.PromptIDs != nil:
		ids := *pl.PromptIDs
		p.Tokens = make([]int32, len(ids))
		for i, id := range ids {
			if id < 0 || id >= int64(lim.vocab) {
				return nil, fmt.Sprintf("prompt_ids[%d] = %d: outside the vocabulary [0, %d) of model %s", i, id, lim.vocab, lim.model)
			}
			p.Tokens[i] = int32(id)
		}
	case pl.Prompt != nil:
		if lim.tok == nil {
			return nil, "prompt (text): " + lim.noTok
		}
		p.Tokens = lim.tok.Encode(*pl.Prompt)
		idsField = "prompt (its tokens)"
		for i, id := range p.Tokens {
			if id < 0 || int(id) >= lim.vocab {
				return nil, fmt.Sprintf("prompt: its token %d is id %d, outside the vocabulary [0, %d) of model %s: the tokenizer does not fit the model",
					i, id, lim.vocab, lim.model)
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
	case n >= int64(lim.maxSeqLen):
		return nil, fmt.Sprintf("%s: %d tokens, longer than max_seq_len %d allows (at most %d, leaving room for one generated token)",
			idsField, n, lim.maxSeqLen, lim.maxSeqLen-1)
	case mt < 1:
		return nil, fmt.Sprintf("max_tokens = %d: must be >= 1", mt)
	case mt > int64(lim.maxSeqLen)-n: // not n+mt: that overflows for max_tokens near 2^63
		return nil, fmt.Sprintf("max_tokens = %d: the prompt's %d tokens + max_tokens exceed max_seq_len %d (at most %d for this prompt)",
			mt, n, lim.maxSeqLen, int64(lim.maxSeqLen)-n)
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
	if p.Decoding, err = pl.SamplingFields.Decoding(lim.vocab, p.MaxTokens, lim.eos, rand.Uint64); err != nil {
		return nil, strings.TrimPrefix(err.Error(), "workload: ")
	}
	p.Decoding.Logprobs = lim.topLogprobs > 0
	if len(pl.Stop) > 0 {
		if msg := serve.CheckStops(pl.Stop); msg != "" {
			return nil, msg
		}
		if lim.tok == nil {
			return nil, "stop strings need the model's tokenizer to match the text: " + lim.noTok
		}
		p.Decoding.StopText = serve.StopMatcher(lim.tok, pl.Stop)
	}
	p.Decoding.Stops = pl.Stop
	if p.RetentionPriority, p.RetentionDuration, err = workload.Retention(pl.RetentionPriority, pl.RetentionDurationS); err != nil {
		return nil, strings.TrimPrefix(err.Error(), "workload: ")
	}
	if err := workload.CheckPrompt(*p, lim.vocab); err != nil {
		return nil, strings.TrimPrefix(err.Error(), "workload: ")
	}
	return p, ""
}
