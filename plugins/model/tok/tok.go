package tok

import (
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"slices"
	"sort"
	"strings"
	"unicode"
	"unicode/utf8"

	"golang.org/x/text/unicode/norm"
)

// Tokenizer is a loaded tokenizer.json.
type Tokenizer struct {
	model     model
	idToken   []string // model vocab by id ("" where absent)
	added     []addedToken
	addedByID map[int32]*addedToken
	special   map[string]bool // the contents of the special added tokens
	raw, nrm  matcher         // added tokens matched before / after normalizing
	normalize func(string) string
	pre       []preTok
	bos, eos  []int32 // TemplateProcessing's single: ids before and after $A
	decoders  []decoder
	size      int
}

// Load reads a tokenizer.json; the error names the file, the field and
// the value it cannot read.
func Load(path string) (*Tokenizer, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	t, err := Parse(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return t, nil
}

// Parse reads the content of a tokenizer.json.
func Parse(data []byte) (*Tokenizer, error) {
	var f fileJSON
	if err := json.Unmarshal(data, &f); err != nil {
		return nil, fmt.Errorf("not a tokenizer.json: %w", err)
	}
	var m model
	var err error
	switch f.Model.Type {
	case "BPE":
		m, err = newBPE(f.Model)
	case "Unigram":
		m, err = newUnigram(f.Model)
	default:
		return nil, fmt.Errorf("model.type %q: not supported (supported: BPE, byte-level or SentencePiece-style, and Unigram)", f.Model.Type)
	}
	if err != nil {
		return nil, err
	}
	t := &Tokenizer{model: m, addedByID: map[int32]*addedToken{}, special: map[string]bool{}}
	for _, id := range m.tokens() {
		t.size = max(t.size, int(id)+1)
	}
	// The id table has a string per id up to the largest: ids far sparser
	// than the file's entries would size it by a number, not by the bytes.
	if n := len(m.tokens()); t.size > maxVocabID(n, len(f.AddedTokens)) {
		return nil, fmt.Errorf("model.vocab: id %d with %d entries and %d added tokens: the limit is %d (2 per entry or added token, + %d)", t.size-1, n, len(f.AddedTokens), maxVocabID(n, len(f.AddedTokens)), vocabSlack)
	}
	t.idToken = make([]string, t.size)
	for s, id := range m.tokens() {
		// Encode returns these ids and Decode reads them back: each must
		// name one token, and a token must have text.
		if s == "" {
			return nil, fmt.Errorf("model.vocab: id %d is the empty token: every token needs text", id)
		}
		if o := t.idToken[id]; o != "" {
			a, b := min(o, s), max(o, s)
			return nil, fmt.Errorf("model.vocab: tokens %q and %q both have id %d: each id names one token", a, b, id)
		}
		t.idToken[id] = s
	}
	if t.normalize, err = newNormalizer(f.Normalizer); err != nil {
		return nil, err
	}
	if t.pre, err = newPreTokenizer(f.PreTokenizer); err != nil {
		return nil, err
	}
	if t.decoders, err = newDecoder(f.Decoder); err != nil {
		return nil, err
	}
	t.added = make([]addedToken, len(f.AddedTokens))
	for i, a := range f.AddedTokens {
		if a.ID < 0 || a.ID > 1<<30 || a.Content == "" {
			return nil, fmt.Errorf("added_tokens[%d] = {id %d, content %q}: want an id in [0, 2^30] and content", i, a.ID, a.Content)
		}
		t.added[i] = addedToken{content: a.Content, id: int32(a.ID), special: a.Special, lstrip: a.Lstrip, rstrip: a.Rstrip,
			singleWord: a.SingleWord, normalized: a.Normalized}
		t.size = max(t.size, int(a.ID)+1)
	}
	for i := range t.added {
		a := &t.added[i]
		t.addedByID[a.id] = a
		if a.special {
			t.special[a.content] = true
		}
		if a.normalized {
			t.nrm.add(t.normalize(a.content), a)
		} else {
			t.raw.add(a.content, a)
		}
	}
	if t.bos, t.eos, err = newPostProcessor(f.PostProcessor); err != nil {
		return nil, err
	}
	// Encode adds these ids: each must be a token of the vocabulary or an
	// added token, as every id Encode returns is.
	for _, id := range slices.Concat(t.bos, t.eos) {
		if _, ok := t.Token(id); !ok {
			return nil, fmt.Errorf("post_processor: special token id %d is neither in model.vocab nor an added token", id)
		}
	}
	return t, nil
}

// vocabSlack is how far above two per entry a vocabulary's ids may reach.
const vocabSlack = 1 << 16

// maxVocabID bounds one more than the largest model.vocab id of a file with
// entries vocabulary entries and added added tokens.
func maxVocabID(entries, added int) int { return 2*(entries+added) + vocabSlack }

// VocabSize is one more than the largest id of the vocabulary and the
// added tokens.
func (t *Tokenizer) VocabSize() int { return t.size }

// Token is the text of token id (an added token's content, or the model
// vocabulary's entry in its byte-level or ▁ form); false for an id the
// tokenizer does not have.
func (t *Tokenizer) Token(id int32) (string, bool) {
	if a, ok := t.addedByID[id]; ok {
		return a.content, true
	}
	if id >= 0 && int(id) < len(t.idToken) && t.idToken[id] != "" {
		return t.idToken[id], true
	}
	return "", false
}

// Encode returns the token ids of text, as tokenizers' encode(text,
// add_special_tokens=addSpecial) does: with addSpecial, the post-processor's
// tokens (a BOS) around them. The returned slice is the caller's.
func (t *Tokenizer) Encode(text string, addSpecial bool) []int32 {
	var ids []int32
	if addSpecial {
		ids = append(ids, t.bos...)
	}
	for _, seg := range t.raw.split(text) {
		if seg.tok != nil {
			ids = append(ids, seg.tok.id)
			continue
		}
		n := t.normalize(text[seg.start:seg.end])
		for _, sub := range t.nrm.split(n) {
			if sub.tok != nil {
				ids = append(ids, sub.tok.id)
				continue
			}
			pieces := []piece{{s: n[sub.start:sub.end], first: seg.start == 0 && sub.start == 0}}
			for _, p := range t.pre {
				pieces = p(pieces)
			}
			for _, pc := range pieces {
				ids = t.model.tokenize(ids, pc.s)
			}
		}
	}
	if addSpecial {
		ids = append(ids, t.eos...)
	}
	return ids
}

// Decode returns the text of ids, as tokenizers' decode(ids,
// skip_special_tokens=skipSpecial) does: ids the tokenizer does not have
// are left out, bytes that are not UTF-8 become U+FFFD.
func (t *Tokenizer) Decode(ids []int32, skipSpecial bool) string {
	toks := make([]string, 0, len(ids))
	for _, id := range ids {
		// As tokenizers does, a token is special by its text, whichever
		// vocabulary it came from.
		if s, ok := t.Token(id); ok && !(skipSpecial && t.special[s]) {
			toks = append(toks, s)
		}
	}
	if t.decoders == nil {
		return strings.Join(toks, " ")
	}
	for _, d := range t.decoders {
		toks = d(toks)
	}
	return strings.Join(toks, "")
}

// model is the tokenizer.json model: BPE or Unigram.
type model interface {
	// tokens is the vocabulary, token to id; not to be modified.
	tokens() map[string]int32
	// tokenize appends the ids of one pre-tokenized word to dst.
	tokenize(dst []int32, word string) []int32
}

// --- added tokens ---

type addedToken struct {
	content                                         string
	id                                              int32
	special, lstrip, rstrip, singleWord, normalized bool
}

// matcher finds added tokens leftmost-longest, as tokenizers' Aho-Corasick
// (MatchKind::LeftmostLongest) does.
type matcher struct {
	byFirst map[byte][]pattern // longest first
}

type pattern struct {
	s   string
	tok *addedToken
}

func (m *matcher) add(s string, a *addedToken) {
	if s == "" {
		return
	}
	if m.byFirst == nil {
		m.byFirst = map[byte][]pattern{}
	}
	l := append(m.byFirst[s[0]], pattern{s, a})
	sort.SliceStable(l, func(i, j int) bool { return len(l[i].s) > len(l[j].s) })
	m.byFirst[s[0]] = l
}

// segment is a piece of a string: an added token (tok set) or text.
type segment struct {
	start, end int
	tok        *addedToken
}

// split cuts s at the added tokens it holds: tokenizers'
// AddedVocabulary::find_matches with single_word, lstrip and rstrip.
func (m *matcher) split(s string) []segment {
	var out []segment
	last := 0 // end of the previous added token
	for i := 0; i < len(s); {
		p, ok := m.longestAt(s, i)
		if !ok {
			i++
			continue
		}
		start, stop := i, i+len(p.s)
		i = stop
		a := p.tok
		if a.singleWord {
			before := start == 0 || !isWordChar(lastRune(s[:start]))
			after := stop == len(s) || !isWordChar(firstRune(s[stop:]))
			if !before || !after {
				continue
			}
		}
		if a.lstrip {
			start = max(len(strings.TrimRightFunc(s[:start], unicode.IsSpace)), last)
		}
		if a.rstrip {
			stop = len(s) - len(strings.TrimLeftFunc(s[stop:], unicode.IsSpace))
		}
		if start > last {
			out = append(out, segment{last, start, nil})
		}
		out = append(out, segment{start, stop, a})
		last = stop
		i = max(i, stop)
	}
	if last < len(s) {
		out = append(out, segment{last, len(s), nil})
	}
	return out
}

func (m *matcher) longestAt(s string, i int) (pattern, bool) {
	for _, p := range m.byFirst[s[i]] {
		if strings.HasPrefix(s[i:], p.s) {
			return p, true
		}
	}
	return pattern{}, false
}

func isWordChar(r rune) bool {
	return unicode.IsLetter(r) || unicode.IsMark(r) || unicode.Is(unicode.Nd, r) || unicode.Is(unicode.Pc, r)
}

func lastRune(s string) rune  { r, _ := utf8.DecodeLastRuneInString(s); return r }
func firstRune(s string) rune { r, _ := utf8.DecodeRuneInString(s); return r }

// --- normalizers ---

func newNormalizer(raw json.RawMessage) (func(string) string, error) {
	c, err := component(raw)
	if err != nil {
		return nil, fmt.Errorf("normalizer: %w", err)
	}
	if c == nil {
		return func(s string) string { return s }, nil
	}
	f, err := normalizer(*c)
	if err != nil {
		return nil, fmt.Errorf("normalizer: %w", err)
	}
	return f, nil
}

func normalizer(c compJSON) (func(string) string, error) {
	switch c.Type {
	case "Sequence":
		var fs []func(string) string
		for i, n := range c.Normalizers {
			f, err := normalizer(n)
			if err != nil {
				return nil, fmt.Errorf("normalizers[%d]: %w", i, err)
			}
			fs = append(fs, f)
		}
		return func(s string) string {
			for _, f := range fs {
				s = f(s)
			}
			return s
		}, nil
	case "NFC":
		return norm.NFC.String, nil
	case "NFD":
		return norm.NFD.String, nil
	case "NFKC":
		return norm.NFKC.String, nil
	case "NFKD":
		return norm.NFKD.String, nil
	case "Lowercase":
		return strings.ToLower, nil
	case "Prepend":
		p := c.Prepend
		return func(s string) string {
			if s == "" {
				return s
			}
			return p + s
		}, nil
	case "Replace":
		return replacer(c)
	}
	return nil, fmt.Errorf("type %q: not supported (supported: Sequence, NFC, NFD, NFKC, NFKD, Lowercase, Prepend, Replace)", c.Type)
}

// replacer is the Replace normalizer and decoder.
func replacer(c compJSON) (func(string) string, error) {
	if c.Pattern == nil || c.Content == nil {
		return nil, fmt.Errorf("Replace: want pattern and content")
	}
	content := *c.Content
	switch {
	case c.Pattern.String != nil:
		old := *c.Pattern.String
		return func(s string) string { return strings.ReplaceAll(s, old, content) }, nil
	case c.Pattern.Regex != nil:
		p, err := translate(*c.Pattern.Regex)
		if err == nil {
			var re *regexp.Regexp
			if re, err = regexp.Compile(p); err == nil {
				return func(s string) string { return re.ReplaceAllLiteralString(s, content) }, nil
			}
		}
		return nil, fmt.Errorf("Replace pattern %q: %w", *c.Pattern.Regex, err)
	}
	return nil, fmt.Errorf("Replace: pattern has neither String nor Regex")
}

// --- pre-tokenizers ---

// piece is a pre-token; first when it begins the encoded text (Metaspace's
// prepend_scheme "first" looks at that).
type piece struct {
	s     string
	first bool
}

type preTok func([]piece) []piece

func newPreTokenizer(raw json.RawMessage) ([]preTok, error) {
	c, err := component(raw)
	if err != nil || c == nil {
		if err != nil {
			err = fmt.Errorf("pre_tokenizer: %w", err)
		}
		return nil, err
	}
	ps, err := preTokenizer(*c)
	if err != nil {
		return nil, fmt.Errorf("pre_tokenizer: %w", err)
	}
	return ps, nil
}

// gpt2Pattern is ByteLevel's own split (use_regex).
const gpt2Pattern = `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`

func preTokenizer(c compJSON) ([]preTok, error) {
	switch c.Type {
	case "Sequence":
		var out []preTok
		for i, p := range c.PreTokenizers {
			ps, err := preTokenizer(p)
			if err != nil {
				return nil, fmt.Errorf("pretokenizers[%d]: %w", i, err)
			}
			out = append(out, ps...)
		}
		return out, nil
	case "ByteLevel":
		var out []preTok
		if c.AddPrefixSpace != nil && *c.AddPrefixSpace {
			out = append(out, eachPiece(func(p piece) []piece {
				if p.s != "" && !strings.HasPrefix(p.s, " ") { // prepend leaves "" as it is
					p.s = " " + p.s
				}
				return []piece{p}
			}))
		}
		if c.UseRegex == nil || *c.UseRegex {
			re, err := compileSplit(gpt2Pattern)
			if err != nil {
				return nil, err
			}
			out = append(out, splitter(re, isolated, false))
		}
		return append(out, eachPiece(func(p piece) []piece {
			p.s = byteLevel(p.s)
			return []piece{p}
		})), nil
	case "Split":
		if c.Pattern == nil {
			return nil, fmt.Errorf("Split: no pattern")
		}
		b, err := parseBehavior(c.Behavior)
		if err != nil {
			return nil, fmt.Errorf("Split: %w", err)
		}
		var re *splitRegex
		switch {
		case c.Pattern.Regex != nil:
			re, err = compileSplit(*c.Pattern.Regex)
		case c.Pattern.String != nil:
			re = &splitRegex{re: regexp.MustCompile(regexp.QuoteMeta(*c.Pattern.String)), ws: -1}
		default:
			err = fmt.Errorf("pattern has neither String nor Regex")
		}
		if err != nil {
			return nil, fmt.Errorf("Split: %w", err)
		}
		return []preTok{splitter(re, b, c.Invert)}, nil
	case "Metaspace":
		return metaspace(c)
	case "Digits":
		re := regexp.MustCompile(`\p{Nd}+`)
		if c.IndividualDigits {
			re = regexp.MustCompile(`\p{Nd}`)
		}
		return []preTok{splitter(&splitRegex{re: re, ws: -1}, isolated, false)}, nil
	}
	return nil, fmt.Errorf("type %q: not supported (supported: Sequence, ByteLevel, Split, Metaspace, Digits)", c.Type)
}

func eachPiece(f func(piece) []piece) preTok {
	return func(in []piece) []piece {
		var out []piece
		for _, p := range in {
			for _, q := range f(p) {
				if q.s != "" {
					out = append(out, q)
				}
			}
		}
		return out
	}
}

func splitter(re *splitRegex, b behavior, invert bool) preTok {
	return eachPiece(func(p piece) []piece {
		spans := re.find(p.s)
		if invert {
			for i := range spans {
				spans[i].match = !spans[i].match
			}
		}
		var out []piece
		for _, r := range splitBy(spans, b) {
			out = append(out, piece{s: p.s[r[0]:r[1]], first: p.first && r[0] == 0})
		}
		return out
	})
}

func metaspace(c compJSON) ([]preTok, error) {
	rep, scheme, err := metaspaceOpts(c)
	if err != nil {
		return nil, err
	}
	split := c.Split == nil || *c.Split
	return []preTok{eachPiece(func(p piece) []piece {
		p.s = strings.ReplaceAll(p.s, " ", rep)
		if p.s != "" && !strings.HasPrefix(p.s, rep) && (scheme == "always" || scheme == "first" && p.first) {
			p.s = rep + p.s
		}
		if !split {
			return []piece{p}
		}
		var out []piece
		for _, r := range splitBy(literalSpans(p.s, rep), mergedWithNext) {
			out = append(out, piece{s: p.s[r[0]:r[1]], first: p.first && r[0] == 0})
		}
		return out
	})}, nil
}

// metaspaceOpts reads Metaspace's replacement and prepend scheme (or the
// add_prefix_space of files before prepend_scheme).
func metaspaceOpts(c compJSON) (string, string, error) {
	rep := c.Replacement
	if utf8.RuneCountInString(rep) != 1 {
		return "", "", fmt.Errorf("Metaspace replacement %q: want one character", rep)
	}
	scheme := strings.ToLower(c.PrependScheme)
	switch {
	case scheme == "" && c.AddPrefixSpace != nil && !*c.AddPrefixSpace:
		scheme = "never"
	case scheme == "":
		scheme = "always"
	case scheme != "always" && scheme != "first" && scheme != "never":
		return "", "", fmt.Errorf("Metaspace prepend_scheme %q: want always, first or never", c.PrependScheme)
	}
	return rep, scheme, nil
}

func literalSpans(s, sep string) []span {
	var out []span
	prev := 0
	for i := 0; i < len(s); {
		j := strings.Index(s[i:], sep)
		if j < 0 {
			break
		}
		if i+j > prev {
			out = append(out, span{prev, i + j, false})
		}
		out = append(out, span{i + j, i + j + len(sep), true})
		i = i + j + len(sep)
		prev = i
	}
	if prev < len(s) {
		out = append(out, span{prev, len(s), false})
	}
	return out
}

// --- post-processors ---

// newPostProcessor reads the ids a single sequence gets before and after
// its tokens with add_special_tokens (TemplateProcessing's single).
func newPostProcessor(raw json.RawMessage) (bos, eos []int32, err error) {
	c, err := component(raw)
	if err != nil || c == nil {
		if err != nil {
			err = fmt.Errorf("post_processor: %w", err)
		}
		return nil, nil, err
	}
	bos, eos, err = postProcessor(*c)
	if err != nil {
		return nil, nil, fmt.Errorf("post_processor: %w", err)
	}
	return bos, eos, nil
}

func postProcessor(c compJSON) (bos, eos []int32, err error) {
	switch c.Type {
	case "ByteLevel": // offsets only
		return nil, nil, nil
	case "Sequence":
		for i, p := range c.Processors {
			b, e, err := postProcessor(p)
			if err != nil {
				return nil, nil, fmt.Errorf("processors[%d]: %w", i, err)
			}
			bos, eos = append(bos, b...), append(e, eos...)
		}
		return bos, eos, nil
	case "TemplateProcessing":
		seen := false
		for i, item := range c.Single {
			if seq, ok := item["Sequence"]; ok {
				if seen || seq.ID != "A" {
					return nil, nil, fmt.Errorf("single[%d]: Sequence %q: want one Sequence A", i, seq.ID)
				}
				seen = true
				continue
			}
			sp, ok := item["SpecialToken"]
			if !ok {
				return nil, nil, fmt.Errorf("single[%d]: want SpecialToken or Sequence", i)
			}
			st, ok := c.SpecialTokens[sp.ID]
			if !ok {
				return nil, nil, fmt.Errorf("single[%d]: SpecialToken %q is not in special_tokens", i, sp.ID)
			}
			for _, id := range st.IDs {
				if seen {
					eos = append(eos, int32(id))
				} else {
					bos = append(bos, int32(id))
				}
			}
		}
		if !seen {
			return nil, nil, fmt.Errorf("single: no Sequence A")
		}
		return bos, eos, nil
	}
	return nil, nil, fmt.Errorf("type %q: not supported (supported: TemplateProcessing, ByteLevel, Sequence)", c.Type)
}
