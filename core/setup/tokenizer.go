package setup

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/kvx-dev/kvx/core/config"
	modeltok "github.com/kvx-dev/kvx/plugins/model/tok"
	"github.com/kvx-dev/kvx/plugins/v1/spec"
)

// Tokenizer turns prompt text into token ids and generated ids into text
// (serve.Tokenizer's methods).
type Tokenizer interface {
	Encode(text string) []int32
	Decode(ids []int32) string
}

// byteTokenizer is the byte-level tokenizer of synthetic models
// (device/synth: BOS, then one token per byte).
type byteTokenizer struct{}

func (byteTokenizer) Encode(text string) []int32 { return modeltok.EncodeBytes(text) }
func (byteTokenizer) Decode(ids []int32) string  { return modeltok.DecodeBytes(ids) }

// ByteTokenizer is the byte-level tokenizer of synthetic models.
var ByteTokenizer Tokenizer = byteTokenizer{}

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

// TokenizerFor returns the tokenizer of the model cfg runs (m, as
// resolved), or nil and why there is none. This is the one seam for
// tokenizers: a Hugging Face checkpoint directory's tokenizer.json, or
// device/synth's byte tokenizer for a synthetic model. A tokenizer.json
// that does not load is an error naming the file and what in it is wrong
// or unsupported.
func TokenizerFor(cfg *config.Config, m spec.Model) (Tokenizer, string, error) {
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
