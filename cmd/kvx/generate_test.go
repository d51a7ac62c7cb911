package main

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/kvx-dev/kvx/cmd/builtin"
	"github.com/kvx-dev/kvx/core/config"
	gen "github.com/kvx-dev/kvx/core/generate"
	"github.com/kvx-dev/kvx/core/report"
	"github.com/kvx-dev/kvx/core/setup"
	"github.com/kvx-dev/kvx/device/cpu"
	"github.com/kvx-dev/kvx/device/synth"
	modeltok "github.com/kvx-dev/kvx/plugins/model/tok"
)

// completion is one line of kvx generate --json.
type completion = gen.Completion

const (
	genScenario = "../../scenarios/cpu-llama.yaml"
	genPrompts  = "testdata/prompts.jsonl"
	genTopK     = 5
)

// generate runs kvx generate and returns its completions (--json), stdout,
// stderr and exit status.
func generate(t *testing.T, prompts string, args ...string) ([]completion, string, string, int) {
	t.Helper()
	js := filepath.Join(t.TempDir(), "out.json")
	all := append([]string{"generate", "-c", genScenario, "--prompts", prompts, "--json", js}, args...)
	out, stderr, code := kvx(t, all...)
	var cs []completion
	if data, err := os.ReadFile(js); err == nil {
		if err := json.Unmarshal(data, &cs); err != nil {
			t.Fatalf("kvx %v: --json: %v\n%s", all, err, data)
		}
	}
	return cs, out, stderr, code
}

// TestGenerateSameEverywhere: the completions, top logprobs included, are
// the same for both managers, in-process and as plugins, with chunks of 7
// tokens and under cache pressure (preempted requests recomputed or
// suspended); and they are the dense no-cache reference's greedy tokens,
// each position's top logprobs sorted and led by the token generated there,
// the last position's equal to those of the reference's logits.
func TestGenerateSameEverywhere(t *testing.T) {
	t.Parallel()
	k := "--top-logprobs=5"
	variants := [][]string{
		{"--set", "cache_manager=v1", "--set", "isolation=inprocess"},
		{"--set", "cache_manager=v2", "--set", "isolation=inprocess"},
		{"--set", "cache_manager=v1"}, // plugins, the default isolation
		{"--set", "cache_manager=v2"},
		{"--set", "cache_manager=v2", "--set", "isolation=inprocess", "--set", "max_num_tokens=7", "--set", "max_batch_size=2", "--set", "kv_cache_config.tokens_per_block=4"},
		// A cache of about one request: v1 pauses and recomputes, v2 also
		// suspends to the host tier.
		{"--set", "cache_manager=v1", "--set", "isolation=inprocess", "--set", "max_seq_len=128", "--set", "kv_cache_config.max_tokens=144", "--set", "max_num_tokens=32"},
		{"--set", "cache_manager=v2", "--set", "isolation=inprocess", "--set", "max_seq_len=128", "--set", "kv_cache_config.max_tokens=144", "--set", "max_num_tokens=32"},
	}
	var want []completion
	for i, v := range variants {
		cs, out, stderr, code := generate(t, genPrompts, append(v, k)...)
		if code != 0 {
			t.Fatalf("%v: exit %d\n%s%s", v, code, out, stderr)
		}
		if slices.Contains(v, "kv_cache_config.max_tokens=144") && !strings.Contains(out, "preemptions") {
			t.Errorf("%v: no preemption under cache pressure:\n%s", v, out)
		}
		if i == 0 {
			want = cs
			if !strings.Contains(out, "line 1:") || !strings.Contains(out, "text:") {
				t.Errorf("%v: stdout lacks the completions:\n%s", v, out)
			}
			continue
		}
		if !reflect.DeepEqual(cs, want) {
			t.Errorf("%v: completions differ from %v:\n%v\nwant\n%v", v, variants[0], cs, want)
		}
	}
	checkAgainstReference(t, want)
}

// TestGenerateDraftsChangeNothing: with MTP drafts (one accepted, so a
// step yields two tokens: random weights rarely agree with their own MTP
// head, seed 6 does once) the completions and their top logprobs are those
// without drafts.
func TestGenerateDraftsChangeNothing(t *testing.T) {
	t.Parallel()
	mla := []string{"--set", "model=deepseek-v3", "--set", "attention_backend=mla", "--set", "isolation=inprocess",
		"--set", "synthetic.layers=3", "--set", "synthetic.hidden=48", "--set", "synthetic.heads=4", "--set", "synthetic.experts=4",
		"--set", "synthetic.experts_per_token=2", "--set", "synthetic.kv_heads=0", "--set", "synthetic.head_dim=0", "--set", "synthetic.intermediate=0",
		"--set", "seed=6", "--top-logprobs=3"}
	plain, out, stderr, code := generate(t, genPrompts, mla...)
	if code != 0 {
		t.Fatalf("without drafts: exit %d\n%s%s", code, out, stderr)
	}
	mtp, out, stderr, code := generate(t, genPrompts, append(mla, "--set", "speculative_config.decoding_type=MTP", "--set", "speculative_config.max_draft_len=1")...)
	if code != 0 {
		t.Fatalf("with drafts: exit %d\n%s%s", code, out, stderr)
	}
	if !strings.Contains(out, "MTP drafts accepted") || strings.Contains(out, "MTP drafts accepted 0 ") {
		t.Errorf("no MTP draft was accepted, so no step yielded several tokens:\n%s", out)
	}
	if !reflect.DeepEqual(mtp, plain) {
		t.Errorf("with drafts:\n%v\nwithout:\n%v", mtp, plain)
	}
}

// checkAgainstReference recomputes every prompt of genPrompts with the dense
// no-cache reference of genScenario's model.
func checkAgainstReference(t *testing.T, cs []completion) {
	t.Helper()
	cfg, _, err := config.Load(builtin.Registry(), []string{genScenario}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	res, err := setup.Resolve(cfg, "reference", false)
	if err != nil {
		t.Fatal(err)
	}
	ref, err := cpu.NewReference(res.Model, cfg.Seed, builtin.Backend(cfg.AttentionBackend).Kernel)
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(genPrompts)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	lines, err := gen.Read(f, gen.Limits{Vocab: res.Model.Vocab, MaxSeqLen: cfg.MaxSeqLen, Tok: setup.ByteTokenizer})
	if err != nil {
		t.Fatal(err)
	}
	if len(cs) != len(lines) || len(cs) == 0 {
		t.Fatalf("%d completions for %d prompt lines", len(cs), len(lines))
	}
	for i, c := range cs {
		p := lines[i].Prompt()
		if p == nil || c.Error != "" {
			t.Fatalf("line %d: %s%s", c.Line, lines[i].Error, c.Error)
		}
		toks, logits, err := ref.Generate(context.Background(), p.Tokens, p.MaxTokens)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(c.OutputIDs, toks) {
			t.Errorf("line %d: output_ids %v, reference %v", c.Line, c.OutputIDs, toks)
		}
		// JSON text holds U+FFFD for each byte that is not UTF-8.
		var text string
		b, _ := json.Marshal(modeltok.DecodeBytes(toks))
		json.Unmarshal(b, &text)
		if c.Text == nil || *c.Text != text {
			t.Errorf("line %d: text %v, want %q", c.Line, c.Text, text)
		}
		if len(c.TopLogprobs) != len(c.OutputIDs) {
			t.Fatalf("line %d: %d top logprob lists for %d tokens", c.Line, len(c.TopLogprobs), len(c.OutputIDs))
		}
		for j, l := range c.TopLogprobs {
			if len(l) != genTopK || l[0].ID != c.OutputIDs[j] {
				t.Errorf("line %d token %d (%d): top logprobs %v: want %d led by the token", c.Line, j, c.OutputIDs[j], l, genTopK)
			}
			for k := 1; k < len(l); k++ {
				if l[k].Logprob > l[k-1].Logprob || l[k].Logprob == l[k-1].Logprob && l[k].ID < l[k-1].ID || l[k].Logprob > 0 {
					t.Errorf("line %d token %d: top logprobs %v not sorted", c.Line, j, l)
				}
			}
		}
		last := c.TopLogprobs[len(c.TopLogprobs)-1]
		var want []report.TokenLogprob
		for _, e := range synth.TopLogprobs(logits, genTopK) {
			want = append(want, report.TokenLogprob{ID: e.ID, Logprob: e.Logprob})
		}
		if !reflect.DeepEqual(last, want) {
			t.Errorf("line %d: last top logprobs %v, reference logits give %v", c.Line, last, want)
		}
	}
}

// TestGenerateBadLinesFailAlone: each bad line fails with its line number,
// the field, the value and the limit; the good lines still run; exit 1.
func TestGenerateBadLinesFailAlone(t *testing.T) {
	t.Parallel()
	lines := []struct {
		line string
		want []string // in the failure message; nil for a good line
	}{
		{`{"prompt_ids": [256, 1, 2], "max_tokens": 4}`, nil},
		{`not json`, []string{"line 2:", "not a prompt object"}},
		{`{"max_tokens": 4}`, []string{"line 3:", "no prompt", "prompt_ids"}},
		{`{"prompt_ids": [1, 999999], "max_tokens": 4}`, []string{"line 4:", "prompt_ids[1] = 999999", "vocabulary [0, "}},
		{`{"prompt": "x", "max_tokens": 0}`, []string{"line 5:", "max_tokens = 0", ">= 1"}},
		{`{"prompt": "hello", "max_tokens": 400}`, []string{"line 6:", "max_tokens = 400", "max_seq_len 320", "at most 314"}},
		{`{"prompt_ids": [` + strings.Repeat("1, ", 330) + `1], "max_tokens": 1}`, []string{"line 7:", "331 tokens", "max_seq_len 320", "at most 319"}},
		{`{"prompt": "ok", "max_tokens": 3}`, nil},
		{`{"prompt": "x", "max_tokens": 2, "temperature": 3}`, []string{"line 9:", "temperature = 3: must be in [0, 2]"}},
		{`{"prompt_ids": [], "max_tokens": 2}`, []string{"line 10:", "prompt_ids is empty"}},
	}
	var text []string
	for _, l := range lines {
		text = append(text, l.line)
	}
	path := filepath.Join(t.TempDir(), "p.jsonl")
	if err := os.WriteFile(path, []byte(strings.Join(text, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cs, out, stderr, code := generate(t, path, "--set", "isolation=inprocess")
	if code != 1 {
		t.Fatalf("exit %d, want 1\n%s%s", code, out, stderr)
	}
	if !strings.Contains(stderr, "8 of 10 prompts failed") {
		t.Errorf("stderr does not say how many failed:\n%s", stderr)
	}
	if len(cs) != len(lines) {
		t.Fatalf("%d completions, want %d", len(cs), len(lines))
	}
	for i, l := range lines {
		c := cs[i]
		if l.want == nil {
			if c.Error != "" || len(c.OutputIDs) == 0 {
				t.Errorf("line %d: error %q, %d tokens: want a completion", i+1, c.Error, len(c.OutputIDs))
			}
			continue
		}
		msg := "line " + strconv.Itoa(c.Line) + ": " + c.Error
		if printed := "line " + strconv.Itoa(c.Line) + ": failed: " + c.Error; !strings.Contains(out, printed) {
			t.Errorf("stdout lacks %q:\n%s", printed, out)
		}
		for _, w := range l.want {
			if !strings.Contains(msg, w) {
				t.Errorf("line %d: failure %q lacks %q", i+1, msg, w)
			}
		}
	}
}

// TestGenerateRefusals: the sim device, --top-logprobs out of bounds, and
// missing flags or files are usage errors (exit 2) that say why.
func TestGenerateRefusals(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{[]string{"generate", "-c", "testdata/small.yaml", "--prompts", genPrompts}, []string{"device sim", "placeholders", "device: cpu"}},
		{[]string{"generate", "-c", genScenario, "--prompts", genPrompts, "--top-logprobs", "21"}, []string{"--top-logprobs 21", "[0, 20]"}},
		{[]string{"generate", "-c", genScenario, "--prompts", genPrompts, "--top-logprobs", "-1"}, []string{"--top-logprobs -1", "[0, 20]"}},
		{[]string{"generate", "-c", genScenario}, []string{"--prompts"}},
		{[]string{"generate", "--prompts", genPrompts}, []string{"--config"}},
		{[]string{"generate", "-c", genScenario, "--prompts", "testdata/nope.jsonl"}, []string{"nope.jsonl"}},
	} {
		out, stderr, code := kvx(t, tc.args...)
		if code != 2 {
			t.Errorf("kvx %v: exit %d, want 2\n%s%s", tc.args, code, out, stderr)
		}
		for _, w := range tc.want {
			if !strings.Contains(stderr, w) {
				t.Errorf("kvx %v: message lacks %q:\n%s", tc.args, w, stderr)
			}
		}
	}
}
