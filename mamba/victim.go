package mamba

import cachemgrv2 "github.com/kvx-dev/kvx/cachemgr_v2"

// victim is the snapshot to evict for a new one of level: the coldest
// (lowest node priority, then least recently used lineage, then lowest
// level) snapshot on no live path; else the unpinned snapshot on a live
// path of the lowest node priority, then level, if its level is below
// level; else nil.
//
// The picks come from the victim queue (victims), brought up to date at
// the first eviction of each planSnaps (sync) and popped in O(log n)
// after that: inside one planSnaps nothing but its own evictions changes
// the candidates or their keys, and the orders are total, so each pick is
// the one a scan of every snapshot makes (TestVictimQueueMatchesScan).
func (l *life) victim(level int) *snapshot {
	q := &l.victims
	if !q.synced {
		q.sync(l.tree, l.snapList)
		q.synced = true
	}
	return q.pop(level)
}

// victimQueue is victim's candidates, kept from one planSnaps to the next:
// the installed snapshots that no reuse pins, those on no live path in a
// heap by coldLess, the others in one by hotLess, each entry with the keys
// it was placed by (snapshot.heap and hi say where a snapshot is). A
// rebuild at each planSnaps, one a prefill chunk, copied and heapified
// every snapshot although few change between two chunks: on seed-b.yaml,
// where long prompts keep the snapshot pool full, that was half of
// Reserve. The core changes its nodes' pins and priorities without telling
// the hooks, and releases and reuses change ticks, so between two
// planSnaps an entry may be stale: sync refreshes them all, and dropSnap
// takes out the snapshot it drops. Make one with newVictimQueue.
type victimQueue struct {
	synced    bool // since the current planSnaps began
	cold, hot keyHeap
}

func newVictimQueue() victimQueue {
	return victimQueue{cold: keyHeap{less: coldLess}, hot: keyHeap{less: hotLess}}
}

// victimKey is a snapshot's place in the victim orders, copied so that
// the heaps compare without following pointers.
type victimKey struct {
	prio  int // of the snapshot's node
	level int
	tick  uint64
	id    uint64
	sn    *snapshot
}

// keyOf is sn's victim key now.
func keyOf(sn *snapshot) victimKey {
	return victimKey{prio: sn.node.Priority(), level: sn.level, tick: sn.tick, id: sn.id, sn: sn}
}

// sync brings the queue up to date with list (every installed snapshot):
// a snapshot that a reuse pinned since leaves it, one whose node gained
// its first pin or lost its last moves to the other heap, one whose
// node's priority or whose tick changed is re-placed, and one installed
// or unpinned since enters it. An unchanged entry costs a comparison. The
// nodes' pins and priorities come from the tree's index of them
// (Tree.PinnedPriority), not from the nodes: one cache miss per snapshot
// less, over a pass that runs at every prefill chunk of a long prompt.
func (q *victimQueue) sync(t *cachemgrv2.Tree, list []*snapshot) {
	for _, sn := range list {
		pinned, prio := t.PinnedPriority(sn.ref)
		var want *keyHeap
		if sn.pins == 0 {
			want = &q.hot
			if !pinned {
				want = &q.cold
			}
		}
		if sn.heap != want {
			if sn.heap != nil {
				sn.heap.remove(int(sn.hi))
			}
			if want != nil {
				want.push(keyOf(sn))
			}
			continue
		}
		if want == nil {
			continue
		}
		k := &want.h[sn.hi]
		if k.prio != prio || k.tick != sn.tick {
			k.prio, k.tick = prio, sn.tick
			want.fix(int(sn.hi))
		}
	}
}

// pop takes victim's pick for a new snapshot of level out of the queue:
// the cold minimum, else the hot minimum if its level is below level; nil
// when there is neither.
func (q *victimQueue) pop(level int) *snapshot {
	switch {
	case len(q.cold.h) > 0:
		return q.cold.remove(0)
	case len(q.hot.h) > 0 && q.hot.h[0].level < level:
		return q.hot.remove(0)
	}
	return nil
}

// keyHeap is a binary min-heap of victim keys under less; each entry's
// snapshot records the heap and its index there (snapshot.heap, hi).
type keyHeap struct {
	h    []victimKey
	less func(a, b *victimKey) bool
}

func (h *keyHeap) push(k victimKey) {
	k.sn.heap, k.sn.hi = h, int32(len(h.h))
	h.h = append(h.h, k)
	h.up(len(h.h) - 1)
}

// remove takes the entry at i out and returns its snapshot, now in no
// heap.
func (h *keyHeap) remove(i int) *snapshot {
	sn := h.h[i].sn
	last := len(h.h) - 1
	h.h[i] = h.h[last]
	h.h[i].sn.hi = int32(i)
	h.h[last] = victimKey{} // drop the snapshot
	h.h = h.h[:last]
	if i < last {
		h.fix(i)
	}
	sn.heap = nil
	return sn
}

// fix restores the order after the keys at i changed.
func (h *keyHeap) fix(i int) {
	if !h.down(i) {
		h.up(i)
	}
}

func (h *keyHeap) up(i int) {
	for i > 0 {
		p := (i - 1) / 2
		if !h.less(&h.h[i], &h.h[p]) {
			return
		}
		h.swap(i, p)
		i = p
	}
}

// down sifts the entry at i down and reports whether it moved.
func (h *keyHeap) down(i int) bool {
	at := i
	for {
		m, l, r := at, 2*at+1, 2*at+2
		if l < len(h.h) && h.less(&h.h[l], &h.h[m]) {
			m = l
		}
		if r < len(h.h) && h.less(&h.h[r], &h.h[m]) {
			m = r
		}
		if m == at {
			return at > i
		}
		h.swap(at, m)
		at = m
	}
}

func (h *keyHeap) swap(i, j int) {
	h.h[i], h.h[j] = h.h[j], h.h[i]
	h.h[i].sn.hi, h.h[j].sn.hi = int32(i), int32(j)
}

// coldLess orders snapshots on no live path, the least valuable first:
// node priority, then least recently used lineage, then level.
func coldLess(a, b *victimKey) bool {
	if a.prio != b.prio {
		return a.prio < b.prio
	}
	if a.tick != b.tick {
		return a.tick < b.tick
	}
	if a.level != b.level {
		return a.level < b.level
	}
	return a.id < b.id
}

// hotLess orders snapshots on a live path, the least valuable first: node
// priority, then level, then least recently used lineage.
func hotLess(a, b *victimKey) bool {
	if a.prio != b.prio {
		return a.prio < b.prio
	}
	if a.level != b.level {
		return a.level < b.level
	}
	if a.tick != b.tick {
		return a.tick < b.tick
	}
	return a.id < b.id
}

// colder is coldLess over two snapshots' keys now.
func colder(a, b *snapshot) bool {
	ka, kb := keyOf(a), keyOf(b)
	return coldLess(&ka, &kb)
}
