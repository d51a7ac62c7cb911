package main

import (
	"errors"
	"fmt"
	"io"
	"strconv"

	"github.com/spf13/cobra"

	"github.com/kvx-dev/kvx/cmd/builtin"
	gen "github.com/kvx-dev/kvx/core/generate"
	"github.com/kvx-dev/kvx/core/report"
)

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
	cmd.Flags().IntVar(&o.topLogprobs, "top-logprobs", 0, fmt.Sprintf("the K most likely tokens of every generated position, 0..%d (in --json)", gen.MaxTopLogprobs))
	cmd.Flags().StringVar(&o.jsonOut, "json", "", "write the completions as JSON to this file ('-' for stdout)")
	return cmd
}

func runGenerate(g *globals, o *generateOpts, cmd *cobra.Command) error {
	switch {
	case o.prompts == "":
		return usageErr(errors.New("generate: --prompts FILE is required"))
	case o.topLogprobs < 0 || o.topLogprobs > gen.MaxTopLogprobs:
		return usageErr(fmt.Errorf("generate: --top-logprobs %d: must be in [0, %d]", o.topLogprobs, gen.MaxTopLogprobs))
	case len(g.configs) == 0:
		return usageErr(errors.New("generate: --config FILE is required (a model on a computing device, e.g. scenarios/cpu-llama.yaml)"))
	}
	cfg, err := loadConfig(g, nil)
	if err != nil {
		return usageErr(err)
	}
	s, err := gen.Open(cfg, builtin.Registry(), o.prompts, o.topLogprobs)
	if err != nil {
		return usageErr(err)
	}
	summary, err := s.Run(cmd.Context(), g.logger())
	if err != nil {
		return engineErr(err)
	}
	failed := 0
	out := cmd.OutOrStdout()
	for _, c := range s.Lines {
		if c.Error != "" {
			failed++
			fmt.Fprintf(out, "line %d: failed: %s\n", c.Line, c.Error)
			continue
		}
		fmt.Fprintf(out, "line %d: %d prompt tokens, %d generated\n  ids:  %v\n", c.Line, c.PromptTokens(), len(c.OutputIDs), c.OutputIDs)
		if c.Text != nil {
			fmt.Fprintf(out, "  text: %s\n", strconv.Quote(*c.Text))
		}
	}
	if summary != "" {
		fmt.Fprintln(out, summary)
	}
	if o.jsonOut != "" {
		if err := report.WriteFile(o.jsonOut, func(w io.Writer) error { return gen.WriteJSON(w, s.Lines) }); err != nil {
			return err
		}
	}
	if failed > 0 {
		return engineErr(fmt.Errorf("generate: %d of %d prompts failed (see the lines above)", failed, len(s.Lines)))
	}
	return nil
}
