package tok

import (
	"container/heap"
	"encoding/json"
	"fmt"
	"unicode/utf8"
)

// bpe is a BPE model of tokenizer.json.
type bpe struct {
	vocab        map[string]int32
	merges       map[[2]int32]merge
	unk          int32 // -1: none
	fuseUnk      bool
	byteFallback bool
	ignoreMerges bool
	bytes        [256]int32 // <0xXX> tokens for byte_fallback, -1 where absent
}

// merge is the rank of a pair of tokens and the token they merge into.
type merge struct{ rank, id int32 }

func (m *bpe) tokens() map[string]int32 { return m.vocab }

// tokenize appends the ids of one pre-tokenized word to dst, as
// tokenizers' BPE::tokenize does (no dropout, no cache).
func (m *bpe) tokenize(dst []int32, w string) []int32 {
	if w == "" {
		return dst
	}
	if m.ignoreMerges {
		if id, ok := m.vocab[w]; ok {
			return append(dst, id)
		}
	}
	// One symbol per character; an unknown one becomes its <0xXX> bytes
	// (byte_fallback) or the unk token, consecutive unks fused (fuse_unk).
	var syms []int32
	unk := false
	for i := 0; i < len(w); {
		_, n := utf8.DecodeRuneInString(w[i:])
		ch := w[i : i+n]
		i += n
		if id, ok := m.vocab[ch]; ok {
			if unk {
				syms, unk = append(syms, m.unk), false
			}
			syms = append(syms, id)
			continue
		}
		if m.byteFallback && m.hasBytes(ch) {
			// As tokenizers does, a pending unk is not flushed here.
			for j := 0; j < len(ch); j++ {
				syms = append(syms, m.bytes[ch[j]])
			}
			continue
		}
		if m.unk >= 0 {
			if unk && !m.fuseUnk {
				syms = append(syms, m.unk)
			}
			unk = true
		}
	}
	if unk {
		syms = append(syms, m.unk)
	}
	return append(dst, m.mergeAll(syms)...)
}

func (m *bpe) hasBytes(ch string) bool {
	for j := 0; j < len(ch); j++ {
		if m.bytes[ch[j]] < 0 {
			return false
		}
	}
	return true
}

// mergeAll merges adjacent symbols, the pair of lowest rank first and the
// leftmost among equal ranks, until no pair has a merge: tokenizers'
// Word::merge_all with a heap of candidate pairs.
func (m *bpe) mergeAll(syms []int32) []int32 {
	n := len(syms)
	if n < 2 {
		return syms
	}
	prev := make([]int, n)
	next := make([]int, n)
	alive := make([]bool, n)
	for i := range syms {
		prev[i], next[i], alive[i] = i-1, i+1, true
	}
	next[n-1] = -1
	q := &pairHeap{}
	push := func(i int) {
		if i < 0 || next[i] < 0 {
			return
		}
		if mg, ok := m.merges[[2]int32{syms[i], syms[next[i]]}]; ok {
			heap.Push(q, cand{rank: mg.rank, pos: i, id: mg.id})
		}
	}
	for i := 0; i < n-1; i++ {
		push(i)
	}
	for q.Len() > 0 {
		c := heap.Pop(q).(cand)
		i := c.pos
		if !alive[i] || next[i] < 0 {
			continue
		}
		j := next[i]
		// Stale: one side merged since this pair was pushed.
		if mg, ok := m.merges[[2]int32{syms[i], syms[j]}]; !ok || mg.id != c.id || mg.rank != c.rank {
			continue
		}
		syms[i] = c.id
		alive[j] = false
		next[i] = next[j]
		if next[j] >= 0 {
			prev[next[j]] = i
		}
		push(prev[i])
		push(i)
	}
	out := syms[:0]
	for i := 0; i >= 0; i = next[i] {
		out = append(out, syms[i])
	}
	return out
}

type cand struct {
	rank int32
	pos  int
	id   int32
}

type pairHeap []cand

func (h pairHeap) Len() int { return len(h) }
func (h pairHeap) Less(a, b int) bool {
	if h[a].rank != h[b].rank {
		return h[a].rank < h[b].rank
	}
	return h[a].pos < h[b].pos
}
func (h pairHeap) Swap(a, b int) { h[a], h[b] = h[b], h[a] }
func (h *pairHeap) Push(x any)   { *h = append(*h, x.(cand)) }
func (h *pairHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// newBPE builds the model from tokenizer.json's model object.
func newBPE(j modelJSON) (*bpe, error) {
	var vocab map[string]int64
	if err := json.Unmarshal(j.Vocab, &vocab); err != nil {
		return nil, fmt.Errorf("model.vocab: want {\"token\": id, ..}: %w", err)
	}
	m := &bpe{vocab: make(map[string]int32, len(vocab)), merges: make(map[[2]int32]merge, len(j.Merges)), unk: -1,
		fuseUnk: j.FuseUnk, byteFallback: j.ByteFallback, ignoreMerges: j.IgnoreMerges}
	switch {
	case j.Dropout != nil && *j.Dropout != 0:
		return nil, fmt.Errorf("model.dropout %v: only null (no dropout) is supported", *j.Dropout)
	case j.ContinuingSubwordPrefix != nil && *j.ContinuingSubwordPrefix != "":
		return nil, fmt.Errorf("model.continuing_subword_prefix %q: only null is supported", *j.ContinuingSubwordPrefix)
	case j.EndOfWordSuffix != nil && *j.EndOfWordSuffix != "":
		return nil, fmt.Errorf("model.end_of_word_suffix %q: only null is supported", *j.EndOfWordSuffix)
	}
	for s, id := range vocab {
		if id < 0 || id > 1<<30 {
			return nil, fmt.Errorf("model.vocab[%q] = %d: want an id in [0, 2^30]", s, id)
		}
		m.vocab[s] = int32(id)
	}
	if j.UnkToken != nil {
		id, ok := m.vocab[*j.UnkToken]
		if !ok {
			return nil, fmt.Errorf("model.unk_token %q: not in model.vocab", *j.UnkToken)
		}
		m.unk = id
	}
	for b := range m.bytes {
		m.bytes[b] = -1
		if id, ok := m.vocab[fmt.Sprintf("<0x%02X>", b)]; ok {
			m.bytes[b] = id
		}
	}
	for r, pair := range j.Merges {
		a, ok1 := m.vocab[pair[0]]
		b, ok2 := m.vocab[pair[1]]
		c, ok3 := m.vocab[pair[0]+pair[1]]
		if !ok1 || !ok2 || !ok3 {
			return nil, fmt.Errorf("model.merges[%d] = %q: %q, %q and %q must all be in model.vocab", r, pair, pair[0], pair[1], pair[0]+pair[1])
		}
		// A pair listed twice keeps its last rank, as tokenizers' map does.
		m.merges[[2]int32{a, b}] = merge{rank: int32(r), id: c}
	}
	return m, nil
}
