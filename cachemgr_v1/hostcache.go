package cachemgrv1

import (
	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
	"github.com/zeebo/xxh3"
)

// Host tier for reuse (kv_cache_config.host_cache_size > 0, block reuse on).
//
// Every paged pool has a host pool with the same block size: the host tier
// holds reusable blocks the device tier evicted, as TensorRT-LLM V1 does with
// its secondary pool. The rules:
//
//   - A chain hash is registered in at most one tier of a pool.
//   - Offload: when an allocation evicts a cached device block, its content is
//     copied to a free host block (or to the host tier's least recently used
//     cached block, evicted in turn) and the hash moves there. With no host
//     block available (all pending) the content vanishes, as without a tier.
//   - Promotion: a new sequence whose Reuse covers a block held by the host
//     tier gets a fresh device block, a host→device copy, and the hash moves
//     back to the device block; the host block becomes free.
//   - A device commit of a block whose hash the host tier holds takes the
//     hash back (the host block becomes free), unless that host block is
//     pending; then the device block stays unregistered.
//   - The copies travel in the Grant of the item whose reservation made them,
//     in the order the moves happened (an offload into a host block always
//     follows every earlier copy out of it). Until that reservation is
//     committed or released, the blocks a copy writes are pending: no
//     Lookup or Reserve sees them and nothing evicts them, so no request can
//     read a block whose copy might never run. An Unreserve drops them (the
//     copy is not made): an offloaded hash vanishes and a promoted hash
//     vanishes, which is Unreserve's "cached blocks evicted stay evicted".
//   - Within one Reserve call, a block promoted by an earlier item may be
//     shared by a later one: the later grant carries the same host→device
//     copy, so its content arrives even if the earlier grant is undone, and
//     the host blocks promotions read stay untouched until the call ends.
//
// Without a host tier none of this runs: m.host is nil, no pool has pend,
// and grants carry no copies.

// move is one pending block of a sequence's outstanding reservation.
type move struct {
	pool int  // paged pool index
	host bool // the host pool's block (offload) or the device pool's (promotion)
	b    kvcache.BlockID
}

// fresh is pool pi's promotions of the current Reserve call: src[db] is
// host block + 1 for a device block db promoted in it (0 otherwise); limbo
// holds those host blocks, unregistered, until endCall frees them.
type fresh struct {
	src   []int32
	dbs   []kvcache.BlockID
	limbo []kvcache.BlockID
}

// endCall ends a Reserve call: its promotions' host blocks become free.
func (m *Manager) endCall() {
	for pi := range m.fresh {
		f := &m.fresh[pi]
		for _, db := range f.dbs {
			f.src[db] = 0
		}
		m.host[pi].free = append(m.host[pi].free, f.limbo...)
		f.dbs, f.limbo = f.dbs[:0], f.limbo[:0]
	}
}

// shared returns the device block of pool pi promoted under h earlier in
// this call, and the host block it is copied from.
func (m *Manager) shared(pi int, h xxh3.Uint128) (db, hb kvcache.BlockID, ok bool) {
	if m.fresh == nil {
		return 0, 0, false
	}
	db, ok = m.paged[pi].lookup(h)
	if !ok || m.fresh[pi].src[db] == 0 {
		return 0, 0, false
	}
	return db, kvcache.BlockID(m.fresh[pi].src[db] - 1), true
}

// allocDev allocates one device block of paged pool pi, first offloading
// the cached block it would evict when pi has a host pool.
func (m *Manager) allocDev(pi int) kvcache.BlockID {
	p := m.paged[pi]
	if len(p.free) == 0 && p.hashed != nil {
		m.noteEvicted(pi, p.next[p.n])
		if m.host != nil {
			m.offload(pi, p.next[p.n])
		}
	}
	return p.alloc()
}

// offload copies cached device block b of pool pi, which is about to be
// evicted, to a host block and registers its hash there (pending).
func (m *Manager) offload(pi int, b int32) {
	hp := m.host[pi]
	if hp.available() == 0 {
		return
	}
	hb := hp.alloc() // evicts the host LRU block when none is free
	hp.ref[hb] = 0
	hp.register(hb, m.paged[pi].hash[b])
	hp.pend[hb] = true
	hp.parked++
	m.cur.moved = append(m.cur.moved, move{pool: pi, host: true, b: hb})
	m.copies = append(m.copies, kvcache.Copy{SrcPool: m.paged[pi].id, SrcBlock: kvcache.BlockID(b), DstPool: hp.id, DstBlock: hb})
	m.c.offloaded++
}

// holds reports whether pool pi can serve hash h now, in either tier.
func (m *Manager) holds(pi int, h xxh3.Uint128) bool {
	if _, ok := m.paged[pi].live(h); ok {
		return true
	}
	if _, _, ok := m.shared(pi, h); ok {
		return true
	}
	if m.host != nil {
		_, ok := m.host[pi].live(h)
		return ok
	}
	return false
}

// onHost counts the hashes pool pi serves from its host pool only: each
// needs a fresh device block.
func (m *Manager) onHost(pi int, hashes []xxh3.Uint128) int {
	if m.host == nil {
		return 0
	}
	n := 0
	for _, h := range hashes {
		if _, ok := m.paged[pi].live(h); ok {
			continue
		}
		if _, _, ok := m.shared(pi, h); !ok {
			n++
		}
	}
	return n
}

// attach builds the first len(hashes) positions of a new sequence's table in
// pool pi: blocks the device holds are shared, blocks the host holds are
// promoted. Reserve has checked that every hash is held and that the device
// has room for the promotions. Every reused block is pinned before the first
// allocation, so no allocation evicts a block of the same prefix.
func (m *Manager) attach(pi int, t []kvcache.BlockID, hashes []xxh3.Uint128) []kvcache.BlockID {
	p := m.paged[pi]
	start := len(t)
	promote := false
	for _, h := range hashes {
		if b, ok := p.live(h); ok {
			p.acquire(b)
			t = append(t, b)
			continue
		}
		if db, hb, ok := m.shared(pi, h); ok {
			p.acquire(db)
			t = append(t, db)
			m.copies = append(m.copies, kvcache.Copy{SrcPool: m.host[pi].id, SrcBlock: hb, DstPool: p.id, DstBlock: db})
			continue
		}
		hb, _ := m.host[pi].live(h)
		hp := m.host[pi]
		hp.unlink(int32(hb)) // pinned: off the host LRU list
		hp.cached--
		t = append(t, noBlock)
		promote = true
	}
	if !promote {
		return t
	}
	hp := m.host[pi]
	for j, h := range hashes {
		if t[start+j] != noBlock {
			continue
		}
		hb, _ := hp.lookup(h)
		db := m.allocDev(pi)
		m.copies = append(m.copies, kvcache.Copy{SrcPool: hp.id, SrcBlock: hb, DstPool: p.id, DstBlock: db})
		m.notePromoted(pi, hb, h)
		hp.forget(hb)
		f := &m.fresh[pi]
		f.limbo = append(f.limbo, hb) // freed when the call ends
		f.src[db] = int32(hb) + 1
		f.dbs = append(f.dbs, db)
		p.register(db, h)
		p.pend[db] = true
		m.cur.moved = append(m.cur.moved, move{pool: pi, b: db})
		t[start+j] = db
		m.c.promoted++
	}
	return t
}

// claim prepares the device registration of hash h in pool pi at commit:
// it reports whether the device may register it, taking the hash from the
// host pool when the host holds it (not pending).
func (m *Manager) claim(pi int, h xxh3.Uint128) bool {
	if m.host == nil {
		return true
	}
	hp := m.host[pi]
	hb, ok := hp.lookup(h)
	if !ok {
		return true
	}
	if hp.pend[hb] {
		return false
	}
	hp.unlink(int32(hb))
	hp.cached--
	hp.forget(hb)
	hp.free = append(hp.free, hb)
	return true
}

// settle ends the pending state of s's moves: keep (Commit, Release: the
// grant's copies were handed to the worker) makes them ordinary cache
// content; otherwise (Unreserve: the copies never run) their hashes are
// dropped and the blocks freed (a promoted device block is freed by the
// caller's release of the table).
func (m *Manager) settle(s *sequence, keep bool) {
	for _, mv := range s.moved {
		p := m.paged[mv.pool]
		if mv.host {
			p = m.host[mv.pool]
		}
		p.pend[mv.b] = false
		switch {
		case keep && mv.host:
			p.parked--
			p.pushMRU(int32(mv.b))
			p.cached++
		case mv.host:
			p.parked--
			p.forget(mv.b)
			p.free = append(p.free, mv.b)
		case !keep:
			if mv.pool == 0 && m.ev.on {
				m.ev.removed(p.hash[mv.b])
			}
			p.forget(mv.b)
		}
	}
	s.moved = s.moved[:0]
}
