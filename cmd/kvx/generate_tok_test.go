package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	modeltok "github.com/kvx-dev/kvx/plugins/model/tok"
)

const (
	ckptDir      = "../../device/hf/testdata/llama"                          // config.json + model.safetensors, vocab 256
	ckptTokenize = "../../plugins/model/tok/testdata/bytebpe/tokenizer.json" // ids < 33
)

// checkpointWithTokenizer copies the golden Llama checkpoint to a temporary
// directory with tokenizer (the content of a tokenizer.json; none when nil)
// and returns a config file that runs it on the cpu device.
func checkpointWithTokenizer(t *testing.T, tokenizer []byte) string {
	t.Helper()
	dir := t.TempDir()
	for _, f := range []string{"config.json", "model.safetensors"} {
		data, err := os.ReadFile(filepath.Join(ckptDir, f))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, f), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if tokenizer != nil {
		if err := os.WriteFile(filepath.Join(dir, "tokenizer.json"), tokenizer, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cfg := filepath.Join(dir, "kvx.yaml")
	yaml := "model: " + dir + "\nattention_backend: gqa\ndevice: cpu\ncache_manager: v2\nisolation: inprocess\n" +
		"max_batch_size: 4\nmax_num_tokens: 64\nmax_seq_len: 128\nkv_cache_config:\n  tokens_per_block: 16\n  dtype: auto\n"
	if err := os.WriteFile(cfg, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	return cfg
}

func writeLines(t *testing.T, lines ...string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "p.jsonl")
	if err := os.WriteFile(p, []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestGenerateCheckpointTokenizer: a checkpoint directory's tokenizer.json
// encodes text prompts (its BOS first) to the ids a prompt_ids line gives
// by hand, and decodes the completions without special tokens.
func TestGenerateCheckpointTokenizer(t *testing.T) {
	t.Parallel()
	data, err := os.ReadFile(ckptTokenize)
	if err != nil {
		t.Fatal(err)
	}
	cfg := checkpointWithTokenizer(t, data)
	prompts := writeLines(t,
		`{"prompt": "hello world", "max_tokens": 6}`,
		`{"prompt_ids": [30, 20, 25], "max_tokens": 6}`, // <|begin_of_text|> hello Ġworld
		`{"prompt": "hello   worlds", "max_tokens": 3}`,
	)
	js := filepath.Join(t.TempDir(), "out.json")
	out, stderr, code := kvx(t, "generate", "-c", cfg, "--prompts", prompts, "--json", js)
	if code != 0 {
		t.Fatalf("exit %d\n%s%s", code, out, stderr)
	}
	var cs []completion
	b, err := os.ReadFile(js)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &cs); err != nil {
		t.Fatal(err)
	}
	if len(cs) != 3 {
		t.Fatalf("%d completions, want 3", len(cs))
	}
	if !slices.Equal(cs[0].OutputIDs, cs[1].OutputIDs) || len(cs[0].OutputIDs) != 6 {
		t.Errorf("text prompt gave %v, its ids by hand %v: want the same 6 tokens", cs[0].OutputIDs, cs[1].OutputIDs)
	}
	if !strings.Contains(out, "line 1: 3 prompt tokens") || !strings.Contains(out, "line 3: 5 prompt tokens") {
		t.Errorf("prompt token counts: want 3 (BOS hello Ġworld) and 5 (BOS hello ĠĠ Ġworld s):\n%s", out)
	}
	tk, err := modeltok.Load(ckptTokenize)
	if err != nil {
		t.Fatal(err)
	}
	for i, c := range cs {
		want := tk.Decode(c.OutputIDs, true)
		if c.Text == nil || *c.Text != want {
			t.Errorf("line %d: text %v, want %q", i+1, c.Text, want)
		}
	}
}

// TestGenerateCheckpointTokenizerErrors: a tokenizer.json that does not
// load stops generate (exit 2) naming the file and the problem; one whose
// ids do not fit the model fails the text line alone; without one, text
// prompts fail and prompt_ids lines run.
func TestGenerateCheckpointTokenizerErrors(t *testing.T) {
	t.Parallel()
	good, err := os.ReadFile(ckptTokenize)
	if err != nil {
		t.Fatal(err)
	}
	edit := func(f func(m map[string]any)) []byte {
		var m map[string]any
		if err := json.Unmarshal(good, &m); err != nil {
			t.Fatal(err)
		}
		f(m)
		b, _ := json.Marshal(m)
		return b
	}
	prompts := writeLines(t, `{"prompt": "hello <big>", "max_tokens": 2}` /* BOS hello Ġ <big> */, `{"prompt_ids": [1, 2], "max_tokens": 2}`)
	for _, tc := range []struct {
		name      string
		tokenizer []byte
		code      int
		want      []string // in stdout and stderr
	}{
		{"not json", []byte(`{"model": `), 2, []string{"tokenizer.json: not a tokenizer.json"}},
		{"wordpiece", edit(func(m map[string]any) { m["model"].(map[string]any)["type"] = "WordPiece" }), 2,
			[]string{"tokenizer.json", `model.type "WordPiece": not supported`}},
		{"id past the vocab", edit(func(m map[string]any) {
			m["added_tokens"] = append(m["added_tokens"].([]any), map[string]any{"id": 300, "content": "<big>", "special": true})
		}), 1, []string{"line 1: failed: prompt: its token 3 is id 300, outside the vocabulary [0, 256)", "line 2: 2 prompt tokens"}},
		{"none", nil, 1, []string{"line 1: failed: prompt (text):", "without tokenizer.json: give the prompt as token ids (kvx generate: \"prompt_ids\"", "line 2: 2 prompt tokens"}},
	} {
		cfg := checkpointWithTokenizer(t, tc.tokenizer)
		out, stderr, code := kvx(t, "generate", "-c", cfg, "--prompts", prompts)
		if code != tc.code {
			t.Errorf("%s: exit %d, want %d\n%s%s", tc.name, code, tc.code, out, stderr)
		}
		for _, w := range tc.want {
			if !strings.Contains(out+stderr, w) {
				t.Errorf("%s: output lacks %q:\n%s%s", tc.name, w, out, stderr)
			}
		}
	}
}
