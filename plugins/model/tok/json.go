package tok

import (
	"encoding/json"
	"fmt"
	"strings"
)

// fileJSON is the part of tokenizer.json this package reads.
type fileJSON struct {
	AddedTokens   []addedJSON     `json:"added_tokens"`
	Normalizer    json.RawMessage `json:"normalizer"`
	PreTokenizer  json.RawMessage `json:"pre_tokenizer"`
	PostProcessor json.RawMessage `json:"post_processor"`
	Decoder       json.RawMessage `json:"decoder"`
	Model         modelJSON       `json:"model"`
}

type addedJSON struct {
	ID         int64  `json:"id"`
	Content    string `json:"content"`
	SingleWord bool   `json:"single_word"`
	Lstrip     bool   `json:"lstrip"`
	Rstrip     bool   `json:"rstrip"`
	Normalized bool   `json:"normalized"`
	Special    bool   `json:"special"`
}

type modelJSON struct {
	Type                    string          `json:"type"`
	Vocab                   json.RawMessage `json:"vocab"`  // BPE: {"token": id}; Unigram: [["piece", score], ..]
	UnkID                   *int64          `json:"unk_id"` // Unigram
	Merges                  mergesJSON      `json:"merges"`
	UnkToken                *string         `json:"unk_token"`
	Dropout                 *float64        `json:"dropout"`
	ContinuingSubwordPrefix *string         `json:"continuing_subword_prefix"`
	EndOfWordSuffix         *string         `json:"end_of_word_suffix"`
	FuseUnk                 bool            `json:"fuse_unk"`
	ByteFallback            bool            `json:"byte_fallback"`
	IgnoreMerges            bool            `json:"ignore_merges"`
}

// mergesJSON reads both forms tokenizers writes: "a b" (before 0.20) and
// ["a", "b"].
type mergesJSON [][2]string

func (m *mergesJSON) UnmarshalJSON(data []byte) error {
	var raw []json.RawMessage
	if err := json.Unmarshal(data, &raw); err != nil {
		return err
	}
	out := make([][2]string, len(raw))
	for i, r := range raw {
		if len(r) > 0 && r[0] == '"' {
			var s string
			if err := json.Unmarshal(r, &s); err != nil {
				return fmt.Errorf("merges[%d]: %w", i, err)
			}
			a, b, ok := strings.Cut(s, " ")
			if !ok || strings.Contains(b, " ") {
				return fmt.Errorf("merges[%d] = %q: want two tokens separated by one space", i, s)
			}
			out[i] = [2]string{a, b}
			continue
		}
		var p []string
		if err := json.Unmarshal(r, &p); err != nil || len(p) != 2 {
			return fmt.Errorf("merges[%d] = %s: want \"a b\" or [\"a\", \"b\"]", i, r)
		}
		out[i] = [2]string{p[0], p[1]}
	}
	*m = out
	return nil
}

// compJSON is any normalizer, pre-tokenizer, post-processor or decoder:
// the union of the fields of the types this package reads.
type compJSON struct {
	Type string `json:"type"`

	// Sequence
	Normalizers   []compJSON `json:"normalizers"`
	PreTokenizers []compJSON `json:"pretokenizers"`
	Processors    []compJSON `json:"processors"`
	Decoders      []compJSON `json:"decoders"`

	// ByteLevel
	AddPrefixSpace *bool `json:"add_prefix_space"`
	UseRegex       *bool `json:"use_regex"`

	// Split, Replace
	Pattern  *patternJSON `json:"pattern"`
	Behavior string       `json:"behavior"`
	Invert   bool         `json:"invert"`
	Content  *string      `json:"content"` // Replace; Strip (decoder)

	// Metaspace
	Replacement   string `json:"replacement"`
	PrependScheme string `json:"prepend_scheme"`
	Split         *bool  `json:"split"`

	// Digits
	IndividualDigits bool `json:"individual_digits"`

	// Prepend
	Prepend string `json:"prepend"`

	// Strip (decoder)
	Start int `json:"start"`
	Stop  int `json:"stop"`

	// TemplateProcessing
	Single        []map[string]templateItem `json:"single"`
	SpecialTokens map[string]struct {
		IDs []int64 `json:"ids"`
	} `json:"special_tokens"`
}

type patternJSON struct {
	String *string `json:"String"`
	Regex  *string `json:"Regex"`
}

type templateItem struct {
	ID string `json:"id"`
}

// component decodes an optional component; nil when absent or null.
func component(raw json.RawMessage) (*compJSON, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	var c compJSON
	if err := json.Unmarshal(raw, &c); err != nil {
		return nil, err
	}
	return &c, nil
}
