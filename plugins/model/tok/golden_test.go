package tok

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// goldenDir holds tokenizers built and run by Hugging Face `tokenizers`:
// python3 scripts/hf_tokenizer_goldens.py device/hf/testdata/tokenizers
const goldenDir = "../testdata/tokenizers"

type golden struct {
	Name    string `json:"name"`
	Version string `json:"tokenizers_version"`
	Vocab   int    `json:"vocab_size"`
	Cases   []struct {
		Text        string  `json:"text"`
		IDs         []int32 `json:"ids"`
		IDsSpecial  []int32 `json:"ids_special"`
		Decoded     string  `json:"decoded"`
		DecodedSkip string  `json:"decoded_skip"`
	} `json:"cases"`
	DecodeCases []struct {
		IDs         []int32 `json:"ids"`
		Decoded     string  `json:"decoded"`
		DecodedSkip string  `json:"decoded_skip"`
	} `json:"decode_cases"`
}

// TestGoldens: every encoding and decoding that `tokenizers` wrote is the
// one this package gives, for each tokenizer of goldenDir.
func TestGoldens(t *testing.T) {
	dirs, _ := filepath.Glob(filepath.Join(goldenDir, "*", "expected.json"))
	if len(dirs) == 0 {
		t.Skipf("no goldens in %s yet: make them where the tokenizers package is installed with "+
			"python3 scripts/hf_tokenizer_goldens.py device/hf/testdata/tokenizers", goldenDir)
	}
	for _, exp := range dirs {
		dir := filepath.Dir(exp)
		t.Run(filepath.Base(dir), func(t *testing.T) {
			data, err := os.ReadFile(exp)
			if err != nil {
				t.Fatal(err)
			}
			var g golden
			if err := json.Unmarshal(data, &g); err != nil {
				t.Fatalf("%s: %v", exp, err)
			}
			tk := load(t, filepath.Join(dir, "tokenizer.json"))
			bad := 0
			if tk.VocabSize() != g.Vocab {
				bad++
				t.Errorf("VocabSize() = %d, tokenizers %s gives %d", tk.VocabSize(), g.Version, g.Vocab)
			}
			for _, c := range g.Cases {
				checks := []struct {
					what      string
					got, want any
					ok        bool
				}{
					{"Encode", tk.Encode(c.Text, false), c.IDs, slices.Equal(tk.Encode(c.Text, false), c.IDs)},
					{"Encode(addSpecial)", tk.Encode(c.Text, true), c.IDsSpecial, slices.Equal(tk.Encode(c.Text, true), c.IDsSpecial)},
					{"Decode", tk.Decode(c.IDs, false), c.Decoded, tk.Decode(c.IDs, false) == c.Decoded},
					{"Decode(skipSpecial)", tk.Decode(c.IDs, true), c.DecodedSkip, tk.Decode(c.IDs, true) == c.DecodedSkip},
				}
				for _, ch := range checks {
					if !ch.ok {
						bad++
						t.Errorf("%s(%q) = %#v, tokenizers %s gives %#v", ch.what, c.Text, ch.got, g.Version, ch.want)
					}
				}
			}
			for _, c := range g.DecodeCases {
				if got := tk.Decode(c.IDs, false); got != c.Decoded {
					bad++
					t.Errorf("Decode(%v) = %q, tokenizers %s gives %q", c.IDs, got, g.Version, c.Decoded)
				}
				if got := tk.Decode(c.IDs, true); got != c.DecodedSkip {
					bad++
					t.Errorf("Decode(%v, skipSpecial) = %q, tokenizers %s gives %q", c.IDs, got, g.Version, c.DecodedSkip)
				}
			}
			t.Logf("%s: %d texts, %d id lists against tokenizers %s: %d differences", g.Name, len(g.Cases), len(g.DecodeCases), g.Version, bad)
		})
	}
}
