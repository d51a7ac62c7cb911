package mamba

import (
	"fmt"

	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
)

// slots is the ssm pool: one block is one sequence state. Every slot is in
// exactly one state:
//
//	free    refs == 0, no owner: on the free stack
//	cached  refs == 0, owned by an installed snapshot (evictable unless pinned)
//	in use  refs == 1: a sequence's live state, or a snapshot slot its
//	        outstanding step writes
//
// Not safe for concurrent use.
type slots struct {
	id    int
	free  []kvcache.BlockID // stack; the top is handed out next
	refs  []int32
	owner []*snapshot
}

func newSlots(id, n int) *slots {
	s := &slots{id: id, free: make([]kvcache.BlockID, n), refs: make([]int32, n), owner: make([]*snapshot, n)}
	for i := range s.free {
		s.free[i] = kvcache.BlockID(n - 1 - i)
	}
	return s
}

// take pops a free slot with one reference; the caller checked there is one.
func (s *slots) take() kvcache.BlockID {
	b := s.free[len(s.free)-1]
	s.free = s.free[:len(s.free)-1]
	s.refs[b] = 1
	return b
}

// unref drops the reference to an in-use slot; it becomes free.
func (s *slots) unref(b kvcache.BlockID) {
	s.refs[b]--
	if s.refs[b] == 0 && s.owner[b] == nil {
		s.free = append(s.free, b)
	}
}

// install turns an in-use slot (written by a step) into sn's cached slot.
func (s *slots) install(b kvcache.BlockID, sn *snapshot) {
	s.refs[b]--
	s.owner[b] = sn
}

// evict frees a cached slot.
func (s *slots) evict(b kvcache.BlockID) {
	s.owner[b] = nil
	s.free = append(s.free, b)
}

func (s *slots) stats() kvcache.PoolStats {
	st := kvcache.PoolStats{Pool: s.id, Total: len(s.refs), Free: len(s.free)}
	for b, r := range s.refs {
		switch {
		case r > 0:
			st.InUse++
		case s.owner[b] != nil:
			st.Cached++
		}
	}
	return st
}

// check recomputes the pool's states against refs (the references
// recomputed from the sequences) and says what is wrong, naming the pool
// name: every slot is free exactly once on the stack, in use with the
// recomputed references, or owned (owned says the owner is installed there).
func (s *slots) check(name string, refs []int32, owned func(o *snapshot, b kvcache.BlockID) bool) []string {
	var v []string
	bad := func(format string, args ...any) { v = append(v, fmt.Sprintf(name+": "+format, args...)) }
	onFree := make([]bool, len(s.refs))
	for _, b := range s.free {
		if b < 0 || int(b) >= len(onFree) || onFree[b] {
			bad("slot %d on the free stack twice or out of range", b)
			continue
		}
		onFree[b] = true
	}
	for b := range s.refs {
		if s.refs[b] != refs[b] {
			bad("slot %d: refcount %d, recomputed %d", b, s.refs[b], refs[b])
		}
		o := s.owner[b]
		if o != nil && (s.refs[b] != 0 || !owned(o, kvcache.BlockID(b))) {
			bad("slot %d owned by a snapshot that is not installed there (refs %d)", b, s.refs[b])
		}
		if f := s.refs[b] == 0 && o == nil; f != onFree[b] {
			bad("slot %d: unreferenced and unowned %v, on the free stack %v", b, f, onFree[b])
		}
	}
	if st := s.stats(); st.Free+st.Cached+st.InUse != st.Total {
		bad("stats %+v", st)
	}
	return v
}
