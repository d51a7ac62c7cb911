package tok

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"unicode/utf8"
)

// Bounds on one fuzz input, so that the seed corpus runs in well under a
// second as a unit test and no input runs long: a tokenizer.json of at
// most maxFuzzJSON bytes, a text of at most maxFuzzText bytes.
const (
	maxFuzzJSON = 1 << 20
	maxFuzzText = 1 << 12
	// maxAllocPerByte bounds what Parse may allocate per byte of its input
	// (beyond a fixed 1 MiB).
	maxAllocPerByte = 64
)

// bundled are the tokenizer.json files of this package's and device/hf's
// test data: the real kinds (GPT-2, Llama-3, Qwen2, SentencePiece BPE,
// Unigram) and the hand-written ones.
var bundled = func() []string {
	a, _ := filepath.Glob("testdata/*/tokenizer.json")
	b, _ := filepath.Glob("../testdata/tokenizers/*/tokenizer.json")
	return append(a, b...)
}()

var fuzzTexts = []string{
	"hello world", "Hello, World! 1234 it's", "  leading\tand\n\ntrailing  ", "é ü 日本語 😀",
	"<|begin_of_text|>hi<|eot_id|>", "<s> </s> <unk>", "\xff\xfe not utf-8 \xe2\x9c", "",
}

// checkIDs fails t when an id of ids is outside [0, VocabSize) or one the
// tokenizer has no text for, then decodes ids both ways.
func checkIDs(t *testing.T, tk *Tokenizer, text string, ids []int32) {
	for i, id := range ids {
		if id < 0 || int(id) >= tk.VocabSize() {
			t.Fatalf("Encode(%q)[%d] = %d, outside [0, %d)", text, i, id, tk.VocabSize())
		}
		if _, ok := tk.Token(id); !ok {
			t.Fatalf("Encode(%q)[%d] = %d, which Token does not know", text, i, id)
		}
	}
	for _, skip := range []bool{false, true} {
		if s := tk.Decode(ids, skip); !utf8.ValidString(s) {
			t.Fatalf("Decode(Encode(%q), %v) = %q: not UTF-8", text, skip, s)
		}
	}
}

// FuzzParse parses the input as a tokenizer.json and, when it loads,
// encodes and decodes a text with it. Properties: no panic; memory bounded
// by the input (no table sized by an id the file does not back); a refused
// file is an error; every id Encode returns is one the tokenizer has; the
// decoded text is UTF-8.
func FuzzParse(f *testing.F) {
	for _, p := range bundled {
		data, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data, fuzzTexts[0])
	}
	f.Add([]byte(`{"model":{"type":"BPE","vocab":{"a":0,"b":1,"ab":2},"merges":["a b"]}}`), "abab")
	f.Add([]byte(`{"model":{"type":"Unigram","vocab":[["a",-1],["b",-2]],"unk_id":0}}`), "abc")
	f.Add([]byte(`{"model":{"type":"WordPiece","vocab":{}}}`), "x")
	f.Add([]byte(`{"model":{"type":"BPE","vocab":{"a":1073741824}}}`), "a")
	f.Add([]byte(`{"added_tokens":[{"id":5,"content":"<x>"}],"model":{"type":"BPE","vocab":{}}}`), "<x>")
	f.Add([]byte(`{"pre_tokenizer":{"type":"Split","pattern":{"Regex":"(?=a)"},"behavior":"Isolated"},"model":{"type":"BPE","vocab":{}}}`), "a")
	f.Fuzz(func(t *testing.T, data []byte, text string) {
		if len(data) > maxFuzzJSON {
			t.Skip()
		}
		text = text[:min(len(text), maxFuzzText)]
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		tk, err := Parse(data)
		runtime.ReadMemStats(&after)
		if n := after.TotalAlloc - before.TotalAlloc; n > maxAllocPerByte*uint64(len(data))+1<<20 {
			t.Fatalf("Parse of %d bytes allocated %d bytes, more than %d per input byte", len(data), n, maxAllocPerByte)
		}
		if err != nil {
			return
		}
		for _, special := range []bool{false, true} {
			checkIDs(t, tk, text, tk.Encode(text, special))
		}
	})
}

var (
	loadOnce sync.Once
	loaded   []*Tokenizer
)

// FuzzEncode encodes arbitrary text (cut to maxFuzzText bytes) with one of
// the bundled tokenizers, the input's first byte choosing which, with and
// without the special tokens. Properties: no panic; time bounded by the
// text (no input runs long); every id is one the tokenizer has; the
// decoded text is UTF-8.
func FuzzEncode(f *testing.F) {
	for i := range bundled {
		for _, s := range fuzzTexts {
			f.Add(uint8(i), s, i%2 == 0)
		}
	}
	f.Fuzz(func(t *testing.T, which uint8, text string, special bool) {
		loadOnce.Do(func() {
			for _, p := range bundled {
				tk, err := Load(p)
				if err != nil {
					t.Fatal(err)
				}
				loaded = append(loaded, tk)
			}
		})
		if len(loaded) == 0 {
			t.Fatal("no bundled tokenizer loaded")
		}
		text = text[:min(len(text), maxFuzzText)]
		tk := loaded[int(which)%len(loaded)]
		checkIDs(t, tk, text, tk.Encode(text, special))
	})
}

// TestParseRefusesSparseVocab: found by FuzzParse's allocation check: one
// vocabulary entry with id 2^30 sized the id table at 2^30 strings (16 GiB)
// from 49 bytes of JSON.
func TestParseRefusesSparseVocab(t *testing.T) {
	_, err := Parse([]byte(`{"model":{"type":"BPE","vocab":{"a":1073741824}}}`))
	if want := "model.vocab: id 1073741824 with 1 entries and 0 added tokens: the limit is 65538"; err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("Parse(sparse vocab) = %v, want an error containing %q", err, want)
	}
}

// BenchmarkUnigramLongPiece encodes 16 KiB of text that no piece covers
// beyond a byte with a vocabulary holding one piece of 20000 bytes. Found
// writing FuzzEncode (its 4 KiB texts hide it): tokenize hashed w[s:s+l] for
// every l up to the longest piece, so this took 12 s (cubic in the word);
// the prefix walk stops at the first byte no piece continues with (3 ms).
func BenchmarkUnigramLongPiece(b *testing.B) {
	js := fmt.Sprintf(`{"model":{"type":"Unigram","unk_id":0,"vocab":[["<unk>",0],["a",-1],[%q,-2]]}}`, strings.Repeat("a", 20000)+"b")
	tk, err := Parse([]byte(js))
	if err != nil {
		b.Fatal(err)
	}
	text := strings.Repeat("ab", 8<<10)
	for b.Loop() {
		tk.Encode(text, false)
	}
}

// TestParseRefusesAmbiguousVocab: found by FuzzParse: a vocab whose two
// tokens share an id, an empty token, a Unigram unk_id whose piece is listed
// again, or a post-processor id no token has made Encode return an id that
// Token (and so Decode) does not know; each is refused, naming it.
func TestParseRefusesAmbiguousVocab(t *testing.T) {
	for _, tc := range []struct{ vocab, want string }{
		{`{"a": 0, "b": 0}`, `model.vocab: tokens "a" and "b" both have id 0`},
		{`{"a": 0, "": 1}`, `model.vocab: id 1 is the empty token`},
	} {
		js := `{"model": {"type": "BPE", "vocab": ` + tc.vocab + `, "merges": []}}`
		if _, err := Parse([]byte(js)); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("vocab %s: %v, want an error containing %q", tc.vocab, err, tc.want)
		}
	}
	// A Unigram unk_id whose piece is listed again later, so that the piece
	// keeps the later id and unk's id names no token (found the same way).
	js := `{"model": {"type": "Unigram", "vocab": [["a", -1], ["b", -2], ["a", -3]], "unk_id": 0}}`
	if _, err := Parse([]byte(js)); err == nil || !strings.Contains(err.Error(), `model.unk_id 0: its piece "a" is listed again at id 2`) {
		t.Errorf("an unk_id whose piece is listed again: %v", err)
	}
	// A post-processor's BOS that no token has (found the same way).
	js = `{"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}, "post_processor": {"type": "TemplateProcessing",
		"single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
		"special_tokens": {"<s>": {"id": "<s>", "ids": [30], "tokens": ["<s>"]}}}}`
	if _, err := Parse([]byte(js)); err == nil || !strings.Contains(err.Error(), "special token id 30 is neither in model.vocab nor an added token") {
		t.Errorf("a post-processor id no token has: %v", err)
	}
}
