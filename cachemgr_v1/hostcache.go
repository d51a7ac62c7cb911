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
//     vanishes, which is Unreserve's "cached blocks evicted stay evicted"
//     (the ghost record notes an offloaded hash as evicted from the device
//     by the rule that chose it, a promoted one as evicted from the host by
//     the policy).
//   - Retention travels with the content: an offloaded block keeps its
//     priority, expiry and hits on the host; a promoted or reclaimed one
//     takes them back (a promotion is one more hit), raised to the priority
//     of the sequence that reuses or stores it. The host pool evicts by the
//     same rule as the device (lowest priority, then the policy).
//   - KV events (events.go) report the first pool's host blocks once they
//     settle: stored when an offload is committed or released, removed when
//     a settled host block loses its hash (host eviction, promotion, a
//     device commit taking it back). A pending block is never reported.
//   - Within one Reserve call, a block promoted by an earlier item may be
//     shared by a later one: the later grant carries the same host→device
//     copy, so its content arrives even if the earlier grant is undone, and
//     the host blocks promotions read stay untouched until the call ends.
//
// Without a host tier none of this runs: m.host is nil, no pool has pend,
// and grants carry no copies.

// move is one pending block of a sequence's outstanding reservation.
type move struct {
	pool int   // paged pool index
	host bool  // the host pool's block (offload) or the device pool's (promotion)
	by   uint8 // offload: the rule that evicted the device block
	b    kvcache.BlockID
}

// origin is the retention of a host block whose hash moves to the device.
type origin struct {
	had    bool
	prio   uint8
	exp    int64
	hits   int32
	salted bool
	sfree  xxh3.Uint128
}

func (p *pool) origin(b kvcache.BlockID) origin {
	o := origin{had: true, prio: p.prio[b], exp: p.exp[b], hits: p.hits[b]}
	if p.salted != nil && p.salted[b] {
		o.salted, o.sfree = true, p.sfree[b]
	}
	return o
}

// adopt gives device block db, just registered, the retention of o (a
// host block's), raised to the current sequence's.
func (m *Manager) adopt(p *pool, db kvcache.BlockID, o origin) {
	p.keep(int32(db), o.prio, o.exp, o.hits)
	p.raise(int32(db), m.cur.prio, m.cur.exp)
	if o.salted {
		p.setSalt(int32(db), o.sfree)
	}
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
		for _, hb := range f.limbo {
			m.host[pi].pushFree(hb)
		}
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

// allocDev allocates one device block of paged pool pi. When that evicts
// a cached block, its content moves to pi's host pool, or vanishes (noted
// in the pool's ghost record) without a host tier or room there.
func (m *Manager) allocDev(pi int) kvcache.BlockID {
	p := m.paged[pi]
	if len(p.free) == 0 && m.reuse {
		v := p.victim()
		by := p.decided(v, m.rule)
		m.noteEvicted(pi, v)
		if m.host == nil || !m.offload(pi, v, by) {
			m.ghosts[pi].add(p.hash[v], kvcache.TierDevice, by, m.now)
		}
	}
	return p.alloc()
}

// offload copies cached device block b of pool pi, which is about to be
// evicted (by rule by), to a host block and registers its hash there
// (pending), with its retention and hits. It reports false when the host
// pool has no block to give (all pending).
func (m *Manager) offload(pi int, b int32, by uint8) bool {
	hp, dp := m.host[pi], m.paged[pi]
	if hp.available() == 0 {
		return false
	}
	if len(hp.free) == 0 {
		v := hp.victim()
		m.ghosts[pi].add(hp.hash[v], kvcache.TierHost, hp.decided(v, m.rule), m.now)
	}
	hb := hp.alloc() // evicts the host's first victim when none is free
	hp.ref[hb] = 0
	hp.register(hb, dp.hash[b])
	hp.setPend(hb, true)
	hp.parked++
	hp.keep(int32(hb), dp.prio[b], dp.exp[b], dp.hits[b])
	if dp.salted != nil && dp.salted[b] {
		hp.setSalt(int32(hb), dp.sfree[b])
	}
	m.cur.moved = append(m.cur.moved, move{pool: pi, host: true, by: by, b: hb})
	m.copies = append(m.copies, kvcache.Copy{SrcPool: m.paged[pi].id, SrcBlock: kvcache.BlockID(b), DstPool: hp.id, DstBlock: hb})
	m.c.offloaded++
	return true
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
	for j, h := range hashes {
		if b, ok := p.live(h); ok {
			p.acquire(b)
			p.raise(int32(b), m.cur.prio, m.cur.exp)
			t = append(t, b)
			continue
		}
		m.fromHost[j] = true
		if db, hb, ok := m.shared(pi, h); ok {
			p.acquire(db)
			p.raise(int32(db), m.cur.prio, m.cur.exp)
			t = append(t, db)
			m.copies = append(m.copies, kvcache.Copy{SrcPool: m.host[pi].id, SrcBlock: hb, DstPool: p.id, DstBlock: db})
			continue
		}
		hb, _ := m.host[pi].live(h)
		m.host[pi].uncache(int32(hb)) // pinned: out of the host's cached set
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
		o := hp.origin(hb)
		o.hits++ // this reuse
		if pi == 0 && m.ev.on {
			m.ev.removed(h, kvcache.TierHost)
		}
		hp.forget(hb)
		f := &m.fresh[pi]
		f.limbo = append(f.limbo, hb) // freed when the call ends
		f.src[db] = int32(hb) + 1
		f.dbs = append(f.dbs, db)
		p.register(db, h)
		m.adopt(p, db, o)
		p.setPend(db, true)
		m.cur.moved = append(m.cur.moved, move{pool: pi, b: db})
		t[start+j] = db
		m.c.promoted++
	}
	return t
}

// claim prepares the device registration of hash h in pool pi at commit:
// it reports whether the device may register it, taking the hash from the
// host pool when the host holds it (not pending); then o is the host
// block's retention.
func (m *Manager) claim(pi int, h xxh3.Uint128) (ok bool, o origin) {
	if m.host == nil {
		return true, o
	}
	hp := m.host[pi]
	hb, ok := hp.lookup(h)
	if !ok {
		return true, o
	}
	if hp.pend[hb] {
		return false, o
	}
	o = hp.origin(hb)
	m.c.reclaimed++
	if pi == 0 && m.ev.on {
		m.ev.removed(h, kvcache.TierHost)
	}
	hp.uncache(int32(hb))
	hp.forget(hb)
	hp.pushFree(hb)
	return true, o
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
		p.setPend(mv.b, false)
		switch {
		case keep && mv.host:
			p.parked--
			p.cache(int32(mv.b))
			if mv.pool == 0 && m.ev.on {
				m.ev.storedHost(p.hash[mv.b], m.tpb)
			}
		case mv.host: // the device block it came from is gone too
			p.parked--
			m.ghosts[mv.pool].add(p.hash[mv.b], kvcache.TierDevice, mv.by, m.now)
			p.forget(mv.b)
			p.pushFree(mv.b)
		case !keep: // the host block it came from is free
			if mv.pool == 0 && m.ev.on {
				m.ev.removed(p.hash[mv.b], kvcache.TierDevice)
			}
			m.ghosts[mv.pool].add(p.hash[mv.b], kvcache.TierHost, m.rule, m.now)
			p.forget(mv.b)
		}
	}
	s.moved = s.moved[:0]
}
