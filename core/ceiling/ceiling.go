// Package ceiling computes how much prefix reuse a run could have had: the
// reuse of an infinite cache and of the offline optimal eviction at a given
// capacity, on the requests and in the order the run saw them.
//
// It is pure computation: a Recorder takes the run's events (a request's
// counted admission, the prompt blocks a request holds, the moment it stops
// holding them) and Result replays them. No clock, no I/O, no goroutines.
//
// # The model
//
// A cache holds full prompt blocks, each named by its content and the
// content of every block before it (a chain, as a block-reuse manager
// hashes), under the request's cache salt. A request that holds blocks
// (its prompt's first k full blocks, k growing as its prefill commits)
// pins them: they are in the cache and cannot be evicted. A block enters
// the cache only when a request holds it (it was computed or reused). At a
// request's counted admission (the one whose reuse a manager's
// prefix_reused counts), its reuse is the longest run of leading prompt
// blocks in the cache, at most the blocks before its last token. The
// cache holds at most Capacity blocks; when the blocks pinned at once
// exceed it (it cannot happen for events a real manager produced at that
// capacity, see below), nothing pinned is evicted and the cache grows past
// it.
//
// # The rule
//
// When a pinned block must enter a full cache, the cache evicts the
// unpinned block whose next use is farthest: a block's next use is the next
// counted admission that can reach it, or never when a request will hold
// it before that admission (it comes back for free then), or when nothing
// reaches it again. Ties go to the deepest block, so a block is never
// evicted before its descendants, and what the cache holds stays usable
// as a prefix. This is Belady's rule made prefix- and pin-aware.
// ceiling_test.go checks it against an exhaustive search over every
// eviction choice on small random traces (and the optimum's monotony in
// the capacity, and against LRU, on larger ones); no counterexample was
// found there, which is evidence that it is the optimum of this model,
// not a proof.
//
// # Why it bounds a manager
//
// What a real manager does, read as a set of block contents, is one of
// the model's schedules at the same capacity when the events are the ones
// it saw: a block it reuses is committed and in its device (or device and
// host) pools, which hold at most their block count of distinct blocks on
// every pipeline stage; the blocks the model pins are ones the manager
// holds at that moment (committed prompt blocks of a resident sequence);
// and it can reuse only what some request computed. The model is looser
// where it may be: it charges no capacity for blocks being computed, for
// partial blocks, generated tokens or suspended sequences, it keeps its
// cache across a plugin restart, and it lets two requests of one step
// share a block the first one committed. So its optimum is at least any
// manager's reuse at that capacity, and the infinite cache's at least
// that.
package ceiling

import (
	"unsafe"

	"github.com/zeebo/xxh3"
)

// Recorder collects the events of one run. Its methods take a sequence id
// (a request) and must be called in the order the run made the calls they
// stand for. The zero value is not usable: call NewRecorder; a nil
// *Recorder records nothing (its methods do nothing). A Recorder is not
// safe for concurrent use.
type Recorder struct {
	tpb    int
	blocks map[uint64]int32 // blockKey(parent, content) → block
	depth  []int32          // per block: its index in a chain, from 1
	salts  map[string]int32
	seqs   map[uint64]int32 // seq id → index into seq
	seq    []seqState
	ev     []event
}

// blockKey names a block by its tokens and the block before it (parent,
// or -1 - salt index for a first block): a 64-bit hash of both, so that
// the map takes a word (two blocks share one with probability 2^-64, as
// two contents did in the (parent, content hash) pair this replaced).
func blockKey(parent int32, b []int32) uint64 {
	return xxh3.HashSeed(unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(b))), len(b)*4), uint64(int64(parent)))
}

type seqState struct {
	chain  []int32 // the prompt's full blocks
	reach  int32   // the blocks before the last prompt token: what a lookup may reuse
	held   int32   // blocks of chain held now
	lookup int32   // index into ev of its latest admission, -1 for none
}

type eventKind uint8

const (
	evLookup eventKind = iota
	evHold
	evDrop
)

type event struct {
	kind     eventKind
	counted  bool  // evLookup: a manager's reuse counted this admission
	seq      int32 // index into Recorder.seq
	from, to int32 // evHold: chain[from:to] newly held; evDrop: chain[:to] released
}

// NewRecorder returns a recorder for blocks of tokensPerBlock tokens (at
// least 1).
func NewRecorder(tokensPerBlock int) *Recorder {
	return &Recorder{tpb: max(1, tokensPerBlock), blocks: map[uint64]int32{}, salts: map[string]int32{}, seqs: map[uint64]int32{}}
}

// TokensPerBlock is the recorder's block size.
func (r *Recorder) TokensPerBlock() int { return r.tpb }

// Admit records an admission of seq with prompt under salt (a first
// admission, or one after a preemption) that takes its first reused
// tokens from the cache: a lookup, then the hold of the reused blocks. The
// lookup counts in Result only if Count(seq) follows before seq's next
// Admit. The first Admit of seq fixes its prompt; prompt is read, not
// kept.
func (r *Recorder) Admit(seq uint64, salt string, prompt []int32, reused int) {
	if r == nil {
		return
	}
	i := r.state(seq, salt, prompt)
	s := &r.seq[i]
	s.lookup = int32(len(r.ev))
	r.ev = append(r.ev, event{kind: evLookup, seq: i})
	r.Hold(seq, reused)
}

// Count marks seq's latest admission as the one whose reuse a manager's
// figures count; without an admission it does nothing.
func (r *Recorder) Count(seq uint64) {
	if r == nil {
		return
	}
	i, ok := r.seqs[seq]
	if !ok || r.seq[i].lookup < 0 {
		return
	}
	r.ev[r.seq[i].lookup].counted = true
}

// Hold records that seq now holds the KV of its prompt's first tokens
// tokens (committed): the full blocks among them are pinned. A hold of
// fewer blocks than seq holds already, or of a sequence never admitted,
// does nothing.
func (r *Recorder) Hold(seq uint64, tokens int) {
	if r == nil {
		return
	}
	i, ok := r.seqs[seq]
	if !ok {
		return
	}
	s := &r.seq[i]
	k := int32(min(tokens/r.tpb, len(s.chain)))
	if k <= s.held {
		return
	}
	r.ev = append(r.ev, event{kind: evHold, seq: i, from: s.held, to: k})
	s.held = k
}

// Drop records that seq holds no block any more (released, preempted,
// suspended to the host tier, or lost with a plugin).
func (r *Recorder) Drop(seq uint64) {
	if r == nil {
		return
	}
	i, ok := r.seqs[seq]
	if !ok || r.seq[i].held == 0 {
		return
	}
	r.ev = append(r.ev, event{kind: evDrop, seq: i, to: r.seq[i].held})
	r.seq[i].held = 0
}

// state returns seq's index, hashing its prompt into blocks the first time.
func (r *Recorder) state(seq uint64, salt string, prompt []int32) int32 {
	if i, ok := r.seqs[seq]; ok {
		return i
	}
	si, ok := r.salts[salt]
	if !ok {
		si = int32(len(r.salts))
		r.salts[salt] = si
	}
	n := len(prompt) / r.tpb
	chain := make([]int32, n)
	parent := -1 - si
	for k := range n {
		b := prompt[k*r.tpb : (k+1)*r.tpb]
		key := blockKey(parent, b)
		id, ok := r.blocks[key]
		if !ok {
			id = int32(len(r.depth))
			r.blocks[key] = id
			r.depth = append(r.depth, int32(k+1))
		}
		chain[k] = id
		parent = id
	}
	reach := 0
	if len(prompt) > 0 {
		reach = (len(prompt) - 1) / r.tpb
	}
	i := int32(len(r.seq))
	r.seqs[seq] = i
	r.seq = append(r.seq, seqState{chain: chain, reach: int32(reach), lookup: -1})
	return i
}
