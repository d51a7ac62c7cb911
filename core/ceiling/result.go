package ceiling

import "math"

// Result is a run's ceiling. Token figures are whole blocks' tokens over the
// counted admissions.
type Result struct {
	// Requests are the counted admissions.
	Requests int
	// Reachable is the most those admissions could reuse: every full block
	// before each prompt's last token.
	Reachable int64
	// Infinite is what a cache that never evicts reuses: exact.
	Infinite int64
	// At is, for each capacity Result was given (blocks), in that order, a
	// bound on what the best eviction reuses at that capacity: see Result.
	At []int64
	// PinnedPeak is the most distinct blocks the requests held at once.
	PinnedPeak int
	// Blocks are the distinct blocks recorded, Uses the block uses
	// replayed per capacity (counted lookups' and holds' blocks): the cost.
	Blocks, Uses int
}

// Result replays the recorded events for an infinite cache and for a
// cache of each of capacities blocks (a capacity below 0 is taken as 0).
//
// A capacity's figure is the smaller of the infinite cache's and of the
// reuse of Belady's rule (see the package doc) in a looser model: there,
// a block that a counted admission looked up and missed may also be stored
// at that lookup, before the request computes it, when it is worth more
// than the least valuable cached block. In that looser model the rule is
// checked equal to the exhaustive optimum on small random traces
// (ceiling_test.go), and the looser model's optimum bounds the model's
// from above. Without that freedom plain Belady is not optimal: keeping a
// block whose next lookup is near but which a request holds again right
// after can be worth less than keeping one with two lookups further away
// (TestBeladyIsNotOptimal).
//
// It costs O(B log B) for B block uses (blocks of counted admissions'
// reach, of holds and of drops) per capacity, and does not change r.
func (r *Recorder) Result(capacities ...int) Result {
	u := r.uses()
	res := Result{At: make([]int64, len(capacities)), Blocks: len(r.depth), Uses: len(u.list)}
	for _, e := range r.ev {
		if e.kind == evLookup && e.counted {
			res.Requests++
			res.Reachable += int64(r.seq[e.seq].reach) * int64(r.tpb)
		}
	}
	var h evictHeap
	var gain int64
	gain, res.PinnedPeak = r.replay(u, math.MaxInt, false, &h)
	res.Infinite = gain * int64(r.tpb)
	for i, c := range capacities {
		if c >= len(r.depth) {
			// Every block fits: the looser model reuses at least the
			// infinite cache's, and the figure is the smaller.
			res.At[i] = res.Infinite
			continue
		}
		gain, _ = r.replay(u, max(0, c), true, &h)
		res.At[i] = min(gain*int64(r.tpb), res.Infinite)
	}
	return res
}

// uses lists, per block, the events that use it in order: counted
// lookups that reach it and holds that pin it, each as event index << 1
// | 1 for a hold.
type uses struct {
	start []int32 // per block, into list; start[len(depth)] is len(list)
	list  []int32
}

func (r *Recorder) uses() uses {
	n := len(r.depth)
	u := uses{start: make([]int32, n+1)}
	each := func(f func(b int32, use int32)) {
		for i, e := range r.ev {
			s := &r.seq[e.seq]
			switch {
			case e.kind == evLookup && e.counted:
				for _, b := range s.chain[:s.reach] {
					f(b, int32(i)<<1)
				}
			case e.kind == evHold:
				for _, b := range s.chain[e.from:e.to] {
					f(b, int32(i)<<1|1)
				}
			}
		}
	}
	each(func(b, _ int32) { u.start[b+1]++ })
	for b := range n {
		u.start[b+1] += u.start[b]
	}
	u.list = make([]int32, u.start[n])
	fill := make([]int32, n)
	copy(fill, u.start[:n])
	each(func(b, use int32) { u.list[fill[b]] = use; fill[b]++ })
	return u
}

const never = math.MaxInt32

// replay runs the events at capacity blocks under Belady's rule and returns
// the blocks the counted lookups reused and the most distinct blocks pinned
// at once. With store, a looked-up block that missed may be stored at its
// lookup (the looser model of Result).
//
// h is scratch space, emptied first; with every block within capacity
// nothing is ever evicted, and the heap is not kept.
func (r *Recorder) replay(u uses, capacity int, store bool, h *evictHeap) (gain int64, pinnedPeak int) {
	n := len(r.depth)
	*h = (*h)[:0]
	evicts := capacity < n
	in := make([]bool, n)
	pins := make([]int32, n)
	pos := make([]int32, n)
	copy(pos, u.start[:n])
	ver := make([]uint32, n)
	size, pinned := 0, 0
	next := func(b int32) int32 {
		p := pos[b]
		if p == u.start[b+1] || u.list[p]&1 == 1 {
			return never // not reached again, or held (and so back) first
		}
		return u.list[p] >> 1
	}
	valid := func(x entry) bool { return x.ver == ver[x.block] && in[x.block] && pins[x.block] == 0 }
	push := func(b int32) {
		if !evicts {
			return
		}
		ver[b]++
		h.push(entry{next: next(b), depth: r.depth[b], block: b, ver: ver[b]})
	}
	for _, e := range r.ev {
		s := &r.seq[e.seq]
		switch e.kind {
		case evLookup:
			if !e.counted {
				continue
			}
			hit := true
			for _, b := range s.chain[:s.reach] {
				hit = hit && in[b]
				if hit {
					gain++
				}
				pos[b]++
				switch {
				case in[b] && pins[b] == 0:
					push(b)
				case !in[b] && store && next(b) != never:
					// Stored at its lookup if it is worth more than the
					// least valuable block cached (the model's freedom,
					// see Result).
					if size >= capacity {
						top, ok := h.peek(valid)
						if !ok || !top.before(entry{next: next(b), depth: r.depth[b], block: b}) {
							continue
						}
						h.pop(valid)
						in[top.block] = false
						size--
					}
					in[b] = true
					size++
					push(b)
				}
			}
		case evHold:
			for _, b := range s.chain[e.from:e.to] {
				pos[b]++
				if pins[b] == 0 {
					pinned++
				}
				pins[b]++
				if !in[b] {
					in[b] = true
					size++
				}
			}
			pinnedPeak = max(pinnedPeak, pinned)
		case evDrop:
			for _, b := range s.chain[:e.to] {
				pins[b]--
				if pins[b] == 0 {
					pinned--
					push(b)
				}
			}
		}
		for size > capacity { // after a hold, or a drop that ends a run over
			top, ok := h.pop(valid)
			b := top.block
			if !ok {
				break // everything cached is pinned: the cache runs over
			}
			in[b] = false
			size--
		}
	}
	return gain, pinnedPeak
}

// entry is an eviction candidate; stale entries (an older ver, a block
// evicted or pinned since) are skipped when popped.
type entry struct {
	next, depth, block int32
	ver                uint32
}

// before orders the heap: the farthest next use first, then the deepest
// block, then the highest id (for determinism).
func (a entry) before(b entry) bool {
	if a.next != b.next {
		return a.next > b.next
	}
	if a.depth != b.depth {
		return a.depth > b.depth
	}
	return a.block > b.block
}

// evictHeap is a binary heap of entries by before.
type evictHeap []entry

func (h *evictHeap) push(e entry) {
	*h = append(*h, e)
	s := *h
	i := len(s) - 1
	for i > 0 {
		p := (i - 1) / 2
		if !s[i].before(s[p]) {
			break
		}
		s[i], s[p] = s[p], s[i]
		i = p
	}
}

// peek drops invalid entries from the top and returns the first valid one;
// false when the heap runs out.
func (h *evictHeap) peek(valid func(entry) bool) (entry, bool) {
	for len(*h) > 0 {
		if top := (*h)[0]; valid(top) {
			return top, true
		}
		h.remove()
	}
	return entry{}, false
}

// pop removes and returns the first valid entry; false when the heap runs
// out.
func (h *evictHeap) pop(valid func(entry) bool) (entry, bool) {
	top, ok := h.peek(valid)
	if ok {
		h.remove()
	}
	return top, ok
}

// remove drops the top entry.
func (h *evictHeap) remove() {
	{
		s := *h
		last := len(s) - 1
		s[0] = s[last]
		s = s[:last]
		i := 0
		for {
			l, m := 2*i+1, i
			if l < len(s) && s[l].before(s[m]) {
				m = l
			}
			if l+1 < len(s) && s[l+1].before(s[m]) {
				m = l + 1
			}
			if m == i {
				break
			}
			s[i], s[m] = s[m], s[i]
			i = m
		}
		*h = s
	}
}
