package tok

import (
	"encoding/json"
	"fmt"
	"math"
	"sort"
	"unicode/utf8"
)

// unigram is a Unigram model of tokenizer.json (T5, ALBERT, XLNet and
// SentencePiece unigram exports).
type unigram struct {
	vocab        map[string]int32
	scores       []float64
	unk          int32 // -1: none
	unkScore     float64
	byteFallback bool
	maxLen       int // bytes of the longest piece
	// sorted holds the pieces in byte order and sortedIDs their ids, for
	// tokenize's prefix walk: the pieces that start w[s:] are found by
	// narrowing a range one byte at a time, which stops at the first byte
	// no piece continues with (tokenizers walks a trie), instead of
	// hashing w[s:s+l] for every l up to maxLen (cubic in a word for a
	// vocabulary with one long piece).
	sorted    []string
	sortedIDs []int32
}

// unkPenalty is tokenizers' K_UNK_PENALTY: an unknown character scores the
// lowest piece's score less 10.
const unkPenalty = 10.0

func newUnigram(j modelJSON) (*unigram, error) {
	var vocab [][2]json.RawMessage
	if err := json.Unmarshal(j.Vocab, &vocab); err != nil {
		return nil, fmt.Errorf("model.vocab: want [[\"piece\", score], ..]: %w", err)
	}
	m := &unigram{vocab: make(map[string]int32, len(vocab)), scores: make([]float64, len(vocab)), unk: -1, byteFallback: j.ByteFallback}
	minScore := math.Inf(1)
	pieces := make([]string, len(vocab))
	for i, e := range vocab {
		var piece string
		if err := json.Unmarshal(e[0], &piece); err != nil {
			return nil, fmt.Errorf("model.vocab[%d]: piece: %w", i, err)
		}
		if err := json.Unmarshal(e[1], &m.scores[i]); err != nil {
			return nil, fmt.Errorf("model.vocab[%d] (%q): score: %w", i, piece, err)
		}
		pieces[i] = piece
		m.vocab[piece] = int32(i) // a piece listed twice keeps its last id, as tokenizers' map does
		m.maxLen = max(m.maxLen, len(piece))
		minScore = min(minScore, m.scores[i])
	}
	if j.UnkID != nil {
		if *j.UnkID < 0 || *j.UnkID >= int64(len(vocab)) {
			return nil, fmt.Errorf("model.unk_id %d: outside the vocabulary [0, %d)", *j.UnkID, len(vocab))
		}
		m.unk = int32(*j.UnkID)
		// Encode returns the unk id, so it must name a token: a piece
		// listed again later keeps only its last id (found by FuzzParse).
		if p := pieces[m.unk]; m.vocab[p] != m.unk {
			return nil, fmt.Errorf("model.unk_id %d: its piece %q is listed again at id %d, the id the piece keeps", m.unk, p, m.vocab[p])
		}
	}
	m.unkScore = minScore - unkPenalty
	for p := range m.vocab {
		m.sorted = append(m.sorted, p)
	}
	sort.Strings(m.sorted)
	m.sortedIDs = make([]int32, len(m.sorted))
	for i, p := range m.sorted {
		m.sortedIDs[i] = m.vocab[p]
	}
	return m, nil
}

func (m *unigram) tokens() map[string]int32 { return m.vocab }

// tokenize appends the ids of the best segmentation of w (the highest sum of
// scores, by Viterbi), as tokenizers' Unigram::encode_optimized does: ties
// go to the piece that starts first, a character no piece covers is unk,
// adjacent unks fuse into one, and with byte_fallback an unknown span
// becomes its <0xXX> bytes.
func (m *unigram) tokenize(dst []int32, w string) []int32 {
	if w == "" {
		return dst
	}
	type node struct {
		id    int32
		score float64
		start int // -1: not reached
	}
	best := make([]node, len(w)+1)
	for i := range best {
		best[i].start = -1
	}
	for s := 0; s < len(w); {
		_, mb := utf8.DecodeRuneInString(w[s:])
		base := best[s].score
		single := false
		// [lo, hi) are the pieces that start with w[s:s+l-1]: that prefix
		// itself first, if a piece, then by their byte l-1.
		lo, hi := 0, len(m.sorted)
		for l := 1; l <= m.maxLen && s+l <= len(w); l++ {
			c := w[s+l-1]
			lo += sort.Search(hi-lo, func(i int) bool { p := m.sorted[lo+i]; return len(p) >= l && p[l-1] >= c })
			hi = lo + sort.Search(hi-lo, func(i int) bool { p := m.sorted[lo+i]; return len(p) >= l && p[l-1] > c })
			if lo == hi {
				break // no piece starts with w[s:s+l]
			}
			if len(m.sorted[lo]) != l {
				continue
			}
			id := m.sortedIDs[lo]
			if c := base + m.scores[id]; best[s+l].start < 0 || c > best[s+l].score {
				best[s+l] = node{id: id, score: c, start: s}
			}
			if l == mb {
				single = true
			}
		}
		if !single {
			if c := base + m.unkScore; best[s+mb].start < 0 || c > best[s+mb].score {
				best[s+mb] = node{id: m.unk, score: c, start: s}
			}
		}
		s += mb
	}
	// Back from the end, each piece as its span of w; adjacent unks fuse.
	var spans [][2]int
	var unks []bool
	for end := len(w); end > 0; {
		n := best[end]
		unk := n.id == m.unk
		if unk && len(unks) > 0 && unks[len(unks)-1] {
			spans[len(spans)-1][0] = n.start
		} else {
			spans, unks = append(spans, [2]int{n.start, end}), append(unks, unk)
		}
		end = n.start
	}
	for k := len(spans) - 1; k >= 0; k-- {
		piece := w[spans[k][0]:spans[k][1]]
		if id, ok := m.vocab[piece]; ok {
			dst = append(dst, id)
			continue
		}
		if m.byteFallback {
			if b, ok := m.bytesOf(piece); ok {
				dst = append(dst, b...)
				continue
			}
		}
		// With no unk_id tokenizers fails the encoding; here the span is
		// left out.
		if m.unk >= 0 {
			dst = append(dst, m.unk)
		}
	}
	return dst
}

func (m *unigram) bytesOf(s string) ([]int32, bool) {
	out := make([]int32, len(s))
	for i := 0; i < len(s); i++ {
		id, ok := m.vocab[fmt.Sprintf("<0x%02X>", s[i])]
		if !ok {
			return nil, false
		}
		out[i] = id
	}
	return out, true
}
