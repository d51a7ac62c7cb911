package mamba

import (
	"fmt"

	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
)

// slots is a state pool (ssm or host-ssm): one block is one sequence state.
// Every slot is in exactly one state:
//
//	free     no reference, owner or hold: on the free stack
//	cached   owned by an installed snapshot (evictable unless pinned)
//	in use   one reference: a sequence's live state (in host-ssm a
//	         suspended one's), or a snapshot slot its outstanding step writes
//	pending  host-ssm only: held by the offload an outstanding reservation
//	         copies there, and owned by that snapshot, or by none when it
//	         was dropped since; the hold goes when the reservation settles
//
// References are what sequences' tables name (Inspect's RefCounts); a hold
// is not one, so a pending slot counts as Cached, as cachemgr_v2's host
// blocks of pending moves do. Not safe for concurrent use.
type slots struct {
	id    int
	free  []kvcache.BlockID // stack; the top is handed out next
	refs  []int32
	holds []int32 // pending offloads writing the slot: 0 or 1
	owner []*snapshot
	// inUse counts the referenced slots, so that stats, asked at every
	// step's Inspect, need not visit every slot (recount does).
	inUse int
}

func newSlots(id, n int) *slots {
	s := &slots{id: id, free: make([]kvcache.BlockID, n), refs: make([]int32, n), holds: make([]int32, n), owner: make([]*snapshot, n)}
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
	s.inUse++
	return b
}

// takeFor pops a free slot as sn's pending slot: owned by sn and held by the
// offload that writes it, until unhold settles it; the caller checked there
// is one.
func (s *slots) takeFor(sn *snapshot) kvcache.BlockID {
	b := s.free[len(s.free)-1]
	s.free = s.free[:len(s.free)-1]
	s.holds[b] = 1
	s.owner[b] = sn
	return b
}

// unref drops the reference to an in-use slot; it becomes free.
func (s *slots) unref(b kvcache.BlockID) {
	s.deref(b)
	s.freeIfIdle(b)
}

// unhold drops the hold of a settled offload: the slot is cached when its
// snapshot is still there, else free.
func (s *slots) unhold(b kvcache.BlockID) {
	s.holds[b]--
	s.freeIfIdle(b)
}

// install turns an in-use slot (written by a step) into sn's cached slot.
func (s *slots) install(b kvcache.BlockID, sn *snapshot) {
	s.deref(b)
	s.owner[b] = sn
}

// deref drops a reference to b, no longer in use once it has none.
func (s *slots) deref(b kvcache.BlockID) {
	s.refs[b]--
	if s.refs[b] == 0 {
		s.inUse--
	}
}

// evict takes b from its snapshot: a cached slot becomes free; a pending one
// stays held until its offload settles.
func (s *slots) evict(b kvcache.BlockID) {
	s.owner[b] = nil
	s.freeIfIdle(b)
}

// freeIfIdle puts b on the free stack once nothing references, holds or
// owns it.
func (s *slots) freeIfIdle(b kvcache.BlockID) {
	if s.refs[b] == 0 && s.holds[b] == 0 && s.owner[b] == nil {
		s.free = append(s.free, b)
	}
}

// stats counts referenced slots as InUse, owned or held ones (cached and
// pending) as Cached: the slots neither free nor in use, which check
// proves are those recount finds.
func (s *slots) stats() kvcache.PoolStats {
	total, free := len(s.refs), len(s.free)
	return kvcache.PoolStats{Pool: s.id, Total: total, Free: free, InUse: s.inUse, Cached: total - free - s.inUse}
}

// recount is stats from every slot's state.
func (s *slots) recount() kvcache.PoolStats {
	st := kvcache.PoolStats{Pool: s.id, Total: len(s.refs), Free: len(s.free)}
	for b, r := range s.refs {
		switch {
		case r > 0:
			st.InUse++
		case s.owner[b] != nil || s.holds[b] > 0:
			st.Cached++
		}
	}
	return st
}

// check recomputes the pool's states against refs and holds (recomputed
// from the sequences' slots and pending offloads) and says what is wrong,
// naming the pool name: every slot is free exactly once on the stack, in
// use with the recomputed references, pending with the recomputed hold, or
// owned (owned says the owner is installed there) and not referenced.
func (s *slots) check(name string, refs, holds []int32, owned func(o *snapshot, b kvcache.BlockID) bool) []string {
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
		if s.holds[b] != holds[b] {
			bad("slot %d: held by %d pending offloads, recomputed %d", b, s.holds[b], holds[b])
		}
		if s.refs[b] > 0 && s.holds[b] > 0 {
			bad("slot %d: referenced %d times and held by %d pending offloads", b, s.refs[b], s.holds[b])
		}
		o := s.owner[b]
		if o != nil && (s.refs[b] != 0 || !owned(o, kvcache.BlockID(b))) {
			bad("slot %d owned by a snapshot that is not installed there (refs %d, holds %d)", b, s.refs[b], s.holds[b])
		}
		if f := s.refs[b] == 0 && s.holds[b] == 0 && o == nil; f != onFree[b] {
			bad("slot %d: unreferenced, unheld and unowned %v, on the free stack %v", b, f, onFree[b])
		}
	}
	if st, want := s.stats(), s.recount(); st != want || st.Free+st.Cached+st.InUse != st.Total {
		bad("stats %+v, recounted %+v", st, want)
	}
	return v
}
