package tok

import (
	"encoding/json"
	"math/rand"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

func load(t *testing.T, path string) *Tokenizer {
	t.Helper()
	tk, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	return tk
}

// The ids of testdata/bytebpe/tokenizer.json (a Llama-3 pre-tokenizer over a
// hand-written vocabulary; its merges mix the two forms "a b" and ["a","b"]).
const (
	bH, bE, bL, bO, bSpace, bW, bR, bD, bNL = 0, 1, 2, 3, 4, 5, 6, 7, 8
	b1, b2, b3, b4, bQuote, bS              = 9, 10, 11, 12, 13, 14
	bC3, bA9                                = 15, 16 // the bytes of é
	bHe, bHello                             = 17, 20
	bSpW, bSpWorld                          = 21, 25
	bOr                                     = 22
	b123, bQuoteS, bSpSp                    = 27, 28, 29
	bBOT, bEOT                              = 30, 31
	bRD                                     = 32 // in the vocabulary, no merge makes it
)

// TestByteLevelBPEByHand: each expected list is derived by hand from the
// vocabulary and merges, by the rules of tokenizers.
func TestByteLevelBPEByHand(t *testing.T) {
	tk := load(t, "testdata/bytebpe/tokenizer.json")
	cases := []struct {
		text string
		want []int32
	}{
		{"hello world", []int32{bHello, bSpWorld}}, // "hello" " world"
		// Not in the vocabulary: merged by rank, Ġ w (4) ... Ġworl d (8).
		{"hello worlds", []int32{bHello, bSpWorld, bS}},
		{"helloo", []int32{bHello, bO}},
		{"1234", []int32{b123, b4}}, // \p{N}{1,3}
		{"hello's", []int32{bHello, bQuoteS}},
		{"hello'S", []int32{bHello, bQuote}}, // (?i:'s) splits it; S is not in the vocabulary
		// "   " before a word: \s+(?!\S) takes two spaces, the third leads " world".
		{"hello   world", []int32{bHello, bSpSp, bSpWorld}},
		{"hello  ", []int32{bHello, bSpSp}},                            // at the end the whole run
		{"hello\n\nworld", []int32{bHello, bNL, bNL, bW, bOr, bL, bD}}, // \s*[\r\n]+; w o r l d has only o r
		{"rd", []int32{bRD}},                                           // ignore_merges: a word in the vocabulary is one token
		{"é", []int32{bC3, bA9}},                                       // bytes C3 A9 as Ã ©
		{"hez", []int32{bHe}},                                          // z is not in the vocabulary and there is no unk: dropped
		{"<|begin_of_text|>hello<|eot_id|>", []int32{bBOT, bHello, bEOT}},
		// Not the added token: "<|" "begin" "_of" "_text" "|", of which only
		// e, o, e are in the vocabulary.
		{"<|begin_of_text|", []int32{bE, bO, bE}},
		{"", nil},
	}
	for _, c := range cases {
		got := tk.Encode(c.text, false)
		if len(got) == 0 && len(c.want) == 0 {
			continue
		}
		if !reflect.DeepEqual(got, c.want) {
			t.Errorf("Encode(%q) = %v, want %v", c.text, got, c.want)
		}
	}
	if got, want := tk.Encode("hello", true), []int32{bBOT, bHello}; !reflect.DeepEqual(got, want) {
		t.Errorf("Encode(hello, addSpecial) = %v, want %v", got, want)
	}
	decodes := []struct {
		ids  []int32
		skip bool
		want string
	}{
		{[]int32{bHello, bSpSp, bSpWorld}, false, "hello   world"},
		{[]int32{bBOT, bHello, bEOT}, false, "<|begin_of_text|>hello<|eot_id|>"},
		{[]int32{bBOT, bHello, bEOT}, true, "hello"},
		{[]int32{bC3, bA9}, false, "é"},
		{[]int32{bC3}, false, "\uFFFD"},               // cut inside é
		{[]int32{bHello, 999, bNL}, false, "hello\n"}, // an id it does not have is left out
	}
	for _, d := range decodes {
		if got := tk.Decode(d.ids, d.skip); got != d.want {
			t.Errorf("Decode(%v, skip %v) = %q, want %q", d.ids, d.skip, got, d.want)
		}
	}
	if n := tk.VocabSize(); n != 33 {
		t.Errorf("VocabSize() = %d, want 33", n)
	}
}

// TestSentencePieceBPEByHand: Metaspace (prepend_scheme first), byte_fallback,
// fuse_unk and the Replace/ByteFallback/Fuse/Strip decoder, by hand.
func TestSentencePieceBPEByHand(t *testing.T) {
	tk := load(t, "testdata/spbpe/tokenizer.json")
	const unk, bos, e6, x97, a5, sp, h, i, spH, spHi = 0, 1, 3, 4, 5, 6, 7, 8, 9, 10
	cases := []struct {
		text string
		want []int32
	}{
		// ▁hi▁hi: ▁ h merges at 0 and 3 (rank 0, leftmost first), then ▁h i.
		{"hi hi", []int32{spHi, spHi}},
		{"hi", []int32{spHi}},
		{"ih", []int32{sp, i, h}},
		{"日", []int32{sp, e6, x97, a5}}, // E6 97 A5 through byte_fallback
		{"xy", []int32{sp, unk}},        // two unknown characters, fused
		// A byte-fallback character does not flush a pending unk (as in
		// tokenizers' merge_word), so the fused unk comes last.
		{"x日y", []int32{sp, e6, x97, a5, unk}},
		// After an added token the text is not "first": no ▁ prepended.
		{"<s>hi", []int32{bos, h, i}},
	}
	for _, c := range cases {
		if got := tk.Encode(c.text, false); !reflect.DeepEqual(got, c.want) {
			t.Errorf("Encode(%q) = %v, want %v", c.text, got, c.want)
		}
	}
	if got, want := tk.Encode("hi", true), []int32{bos, spHi}; !reflect.DeepEqual(got, want) {
		t.Errorf("Encode(hi, addSpecial) = %v, want %v", got, want)
	}
	decodes := []struct {
		ids  []int32
		want string
	}{
		{[]int32{spHi, spHi}, "hi hi"}, // " hi hi", the Strip drops one leading space
		{[]int32{sp, e6, x97, a5}, "日"},
		{[]int32{e6, x97}, "\uFFFD\uFFFD"}, // ByteFallback: one U+FFFD per byte of a bad run
		{[]int32{bos, spHi}, "<s> hi"},     // Strip cuts the first token's space only
		{[]int32{h, unk, i}, "h<unk>i"},
	}
	for _, d := range decodes {
		if got := tk.Decode(d.ids, false); got != d.want {
			t.Errorf("Decode(%v) = %q, want %q", d.ids, got, d.want)
		}
	}
	if got := tk.Decode([]int32{bos, spHi}, true); got != "hi" {
		t.Errorf("Decode(<s> ▁hi, skip special) = %q, want %q", got, "hi")
	}
}

// TestSplitPatterns: the Llama-3 and GPT-2 patterns, translated for Go (no
// lookahead, Unicode \s), split as their Oniguruma originals do.
func TestSplitPatterns(t *testing.T) {
	llama3 := `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
	cases := []struct {
		pattern, text string
		want          []string
	}{
		{llama3, "Hello world", []string{"Hello", " world"}},
		{llama3, "a  b", []string{"a", " ", " b"}},
		{llama3, "a   b", []string{"a", "  ", " b"}},
		{llama3, "a \t b", []string{"a", " \t", " b"}},
		{llama3, "a   ", []string{"a", "   "}},
		{llama3, "a \n\n b", []string{"a", " \n\n", " b"}},
		{llama3, "I'm can't THEY'LL", []string{"I", "'m", " can", "'t", " THEY", "'LL"}},
		{llama3, "1234567", []string{"123", "456", "7"}},
		{llama3, "$3.14!!\n", []string{"$", "3", ".", "14", "!!\n"}},
		{llama3, "(x)", []string{"(x", ")"}},
		{llama3, "日本 語", []string{"日本", " 語"}},
		// U+00A0 and U+3000 are spaces to Oniguruma's \s, not to Go's.
		{llama3, "a\u00a0\u00a0b", []string{"a", "\u00a0", "\u00a0b"}},
		{llama3, "a\u3000b", []string{"a", "\u3000b"}},
		{llama3, "x\v\vy", []string{"x", "\v", "\vy"}},
		{gpt2Pattern, "Hello  world's 123", []string{"Hello", " ", " world", "'s", " 123"}},
		{gpt2Pattern, "a\n\nb", []string{"a", "\n", "\n", "b"}},
	}
	for _, c := range cases {
		re, err := compileSplit(c.pattern)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, sp := range re.find(c.text) {
			got = append(got, c.text[sp.start:sp.end])
		}
		if !reflect.DeepEqual(got, c.want) {
			t.Errorf("split(%q) = %q, want %q", c.text, got, c.want)
		}
	}
	if _, err := compileSplit(`a(?=b)|\s+`); err == nil || !strings.Contains(err.Error(), "(?=") {
		t.Errorf("compileSplit(lookahead) error = %v, want one naming (?=", err)
	}
}

func TestSplitBehaviors(t *testing.T) {
	// "a-b--c" split at "-": matches at 1, 3, 4.
	spans := []span{{0, 1, false}, {1, 2, true}, {2, 3, false}, {3, 4, true}, {4, 5, true}, {5, 6, false}}
	s := "a-b--c"
	cases := []struct {
		b    behavior
		want []string
	}{
		{removed, []string{"a", "b", "c"}},
		{isolated, []string{"a", "-", "b", "-", "-", "c"}},
		{contiguous, []string{"a", "-", "b", "--", "c"}},
		{mergedWithPrevious, []string{"a-", "b-", "-", "c"}},
		{mergedWithNext, []string{"a", "-b", "-", "-c"}},
	}
	for _, c := range cases {
		var got []string
		for _, r := range splitBy(spans, c.b) {
			got = append(got, s[r[0]:r[1]])
		}
		if !reflect.DeepEqual(got, c.want) {
			t.Errorf("splitBy(%v) = %q, want %q", c.b, got, c.want)
		}
	}
}

func TestLossy(t *testing.T) {
	cases := []struct {
		in   []byte
		want string
	}{
		{[]byte("héllo"), "héllo"},
		{[]byte{0xE2, 0x82}, "\uFFFD"},       // a cut 3-byte character: one
		{[]byte{0xF0, 0x9F, 0x98}, "\uFFFD"}, // a cut emoji: one
		{[]byte{0xFF, 'a'}, "\uFFFDa"},
		{[]byte{0xE2, 0x28, 0xA1}, "\uFFFD(\uFFFD"},      // bad second byte: the lead alone
		{[]byte{0xED, 0xA0, 0x80}, "\uFFFD\uFFFD\uFFFD"}, // a surrogate: each byte
		{[]byte{0xC3, 0xA9, 0xC3}, "é\uFFFD"},
	}
	for _, c := range cases {
		if got := lossy(c.in); got != c.want {
			t.Errorf("lossy(% x) = %q, want %q", c.in, got, c.want)
		}
	}
}

// TestLoadErrors: a file of a kind this package does not read fails at
// load, naming the field and the kind.
func TestLoadErrors(t *testing.T) {
	base, err := os.ReadFile("testdata/bytebpe/tokenizer.json")
	if err != nil {
		t.Fatal(err)
	}
	edit := func(f func(m map[string]any)) []byte {
		var m map[string]any
		if err := json.Unmarshal(base, &m); err != nil {
			t.Fatal(err)
		}
		f(m)
		b, _ := json.Marshal(m)
		return b
	}
	cases := []struct {
		name string
		data []byte
		want string
	}{
		{"not json", []byte("{"), "not a tokenizer.json"},
		{"wordpiece", edit(func(m map[string]any) { m["model"].(map[string]any)["type"] = "WordPiece" }), `model.type "WordPiece": not supported`},
		{"wordpiece pre", edit(func(m map[string]any) { m["pre_tokenizer"] = map[string]any{"type": "BertPreTokenizer"} }), `pre_tokenizer: type "BertPreTokenizer": not supported`},
		{"bad merge", edit(func(m map[string]any) { m["model"].(map[string]any)["merges"] = []any{"h q"} }), `model.merges[0] = ["h" "q"]`},
		{"lookahead", edit(func(m map[string]any) {
			m["pre_tokenizer"] = map[string]any{"type": "Split", "pattern": map[string]any{"Regex": `a(?!b)`}, "behavior": "Isolated", "invert": false}
		}), "(?!"},
		{"roberta", edit(func(m map[string]any) { m["post_processor"] = map[string]any{"type": "RobertaProcessing"} }), `post_processor: type "RobertaProcessing"`},
		{"decoder", edit(func(m map[string]any) { m["decoder"] = map[string]any{"type": "WordPiece"} }), `decoder: type "WordPiece"`},
	}
	for _, c := range cases {
		_, err := Parse(c.data)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: Parse error = %v, want one containing %q", c.name, err, c.want)
		}
	}
	p := filepath.Join(t.TempDir(), "tokenizer.json")
	os.WriteFile(p, cases[1].data, 0o644)
	if _, err := Load(p); err == nil || !strings.Contains(err.Error(), p) {
		t.Errorf("Load error = %v, want one naming %s", err, p)
	}
}

// TestRealPatternsCompile: the Split patterns of released tokenizer.json
// files translate for Go, and their pieces cover the text exactly.
func TestRealPatternsCompile(t *testing.T) {
	patterns := map[string]string{
		"gpt2":    gpt2Pattern,
		"qwen2":   `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`,
		"o200k":   `[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+`,
		"dsv3":    "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+",
		"dsv3cjk": "[一-龥\u3040-ゟ゠-ヿ]+",
	}
	text := "Hello, World's 1234567 日本語カタカナ  x\n\n\ty [a]-b \u00a0 😀!"
	for name, p := range patterns {
		re, err := compileSplit(p)
		if err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		var b strings.Builder
		for _, sp := range re.find(text) {
			b.WriteString(text[sp.start:sp.end])
		}
		if b.String() != text {
			t.Errorf("%s: pieces join to %q, want %q", name, b.String(), text)
		}
	}
}

// TestUnigramByHand: Viterbi over the scores of testdata/unigram, by hand.
func TestUnigramByHand(t *testing.T) {
	tk := load(t, "testdata/unigram/tokenizer.json")
	const unk, sp, a, b, spAB, x63 = 0, 1, 2, 3, 5, 6
	cases := []struct {
		text string
		want []int32
	}{
		{"ab", []int32{spAB}},          // ▁ab -4.5 beats ▁ + ab (-6) and ▁ + a + b (-8)
		{"ba", []int32{sp, b, a}},      // no piece ba
		{"a b", []int32{sp, a, sp, b}}, // Metaspace splits before each ▁
		{"c", []int32{sp, x63}},        // c is no piece: byte_fallback <0x63>
		{"dd", []int32{sp, unk}},       // two unknown characters fuse; no <0x64>
	}
	for _, c := range cases {
		if got := tk.Encode(c.text, false); !reflect.DeepEqual(got, c.want) {
			t.Errorf("Encode(%q) = %v, want %v", c.text, got, c.want)
		}
	}
	if got := tk.Decode([]int32{sp, a, sp, b}, false); got != "a b" {
		t.Errorf("Decode(▁ a ▁ b) = %q, want %q", got, "a b")
	}
}

// TestLegacySentencePieceByHand: the legacy Llama-2 form (Prepend("▁") +
// Replace(" ", "▁") normalizers, no pre-tokenizer) prepends ▁ to every
// piece between added tokens, unlike Metaspace's prepend_scheme first.
func TestLegacySentencePieceByHand(t *testing.T) {
	data, err := os.ReadFile("testdata/spbpe/tokenizer.json")
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(data, &m); err != nil {
		t.Fatal(err)
	}
	m["pre_tokenizer"] = nil
	m["normalizer"] = map[string]any{"type": "Sequence", "normalizers": []any{
		map[string]any{"type": "Prepend", "prepend": "▁"},
		map[string]any{"type": "Replace", "pattern": map[string]any{"String": " "}, "content": "▁"},
	}}
	data, _ = json.Marshal(m)
	tk, err := Parse(data)
	if err != nil {
		t.Fatal(err)
	}
	const bos, eos, spHi = 1, 2, 10
	for _, c := range []struct {
		text string
		want []int32
	}{
		{"hi hi", []int32{spHi, spHi}}, // one word ▁hi▁hi, merged as with Metaspace
		{"<s>hi</s>hi", []int32{bos, spHi, eos, spHi}},
	} {
		if got := tk.Encode(c.text, false); !reflect.DeepEqual(got, c.want) {
			t.Errorf("Encode(%q) = %v, want %v", c.text, got, c.want)
		}
	}
}

// TestByteLevelRoundTrip: with every byte in the vocabulary a byte-level
// tokenizer loses nothing: Decode(Encode(s)) == s for random text of
// letters, digits, marks, spaces of every kind, emoji, invalid-free UTF-8
// and the added tokens themselves (seeded; the seed is printed on failure).
func TestByteLevelRoundTrip(t *testing.T) {
	vocab := map[string]any{}
	for b := 0; b < 256; b++ {
		vocab[string(byteChar[b])] = b
	}
	vocab["ĠĠ"], vocab["he"], vocab["hel"] = 256, 257, 258
	for _, pre := range []any{
		map[string]any{"type": "Sequence", "pretokenizers": []any{
			map[string]any{"type": "Split", "pattern": map[string]any{"Regex": `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`}, "behavior": "Isolated", "invert": false},
			map[string]any{"type": "ByteLevel", "add_prefix_space": false, "use_regex": false},
		}},
		map[string]any{"type": "ByteLevel", "add_prefix_space": false},
	} {
		data, _ := json.Marshal(map[string]any{
			"added_tokens":  []any{map[string]any{"id": 300, "content": "<|eot|>", "special": true}},
			"pre_tokenizer": pre,
			"decoder":       map[string]any{"type": "ByteLevel"},
			"model":         map[string]any{"type": "BPE", "vocab": vocab, "merges": []any{"Ġ Ġ", "h e", "he l"}},
		})
		tk, err := Parse(data)
		if err != nil {
			t.Fatal(err)
		}
		alphabet := []rune("ab hel'sS Z09١٢\t\n\r\v\u00a0\u2003\u3000日本é\u0301😀👍🏽-.,!?_<|>")
		seed := int64(13)
		rng := rand.New(rand.NewSource(seed))
		for n := 0; n < 2000; n++ {
			var b strings.Builder
			for k := rng.Intn(24); k > 0; k-- {
				if rng.Intn(10) == 0 {
					b.WriteString("<|eot|>")
					continue
				}
				b.WriteRune(alphabet[rng.Intn(len(alphabet))])
			}
			s := b.String()
			if got := tk.Decode(tk.Encode(s, false), false); got != s {
				t.Fatalf("seed %d, case %d: Decode(Encode(%q)) = %q", seed, n, s, got)
			}
		}
	}
}
