package cachemgrv1

import (
	"slices"

	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
	"github.com/zeebo/xxh3"
)

// Unreserve puts back the cache content its reservation took.
//
// A reservation's allocations may evict cached blocks (device blocks whose
// hash then vanishes or moves to the host tier) and its promotions take
// blocks off the host tier. When the reservation is undone, the forward it
// was for never ran and none of its grant's copies were made, so every such
// block still holds the content it had: the evicted device block (nothing
// wrote it), and the host block a promotion would have read. Unreserve
// registers each again under its hash, as cached content, when
//
//   - the block is free (no sequence holds it, no hash is registered on it),
//   - it was not allocated again since (its allocation generation is the
//     one recorded: an allocation may have let a copy or a forward write it),
//   - and no block of the pool's tiers holds the hash now (a chain hash is
//     registered at most once).
//
// Without it, an engine whose pipeline stages disagree on a grant (one
// stage grants, another denies, the first unreserves) would wipe the first
// stage's cache a little more at every retry of a request that does not
// fit yet: on the Mooncake demo with a host tier, 150,400 prompt tokens of
// 300 requests missed on one stage for blocks the other stage still held.
//
// KV events: the BlockRemoved of the block's tier (the device's eviction, or
// the host's for a promotion's source) is still in the unread event list
// (Unreserve comes in the same step as its Reserve); putting a block back
// takes its hash out of that event again. If it is no longer there (the
// events were read in between), the block is not put back, so the events
// never disagree with the cache.

// undone is one block a reservation took from the cache.
type undone struct {
	pool int  // paged pool index
	host bool // a host block (a promotion's source) rather than a device block
	b    int32
	gen  uint32 // the block's allocation generation the content needs
	h    xxh3.Uint128
	o    origin // its retention (and salt-free hash) when it was taken
}

// tier is the tier of u's block.
func (u *undone) tier() kvcache.Tier {
	if u.host {
		return kvcache.TierHost
	}
	return kvcache.TierDevice
}

// noteEvicted records, for the reservation being applied, that the cached
// device block b of paged pool pi is about to be evicted and allocated to it.
func (m *Manager) noteEvicted(pi int, b int32) {
	p := m.paged[pi]
	m.cur.evicted = append(m.cur.evicted, undone{pool: pi, b: b, gen: p.gen[b] + 1, h: p.hash[b], o: p.origin(kvcache.BlockID(b))})
}

// notePromoted records that host block hb of paged pool pi, holding h, left
// the host tier for the reservation being applied.
func (m *Manager) notePromoted(pi int, hb kvcache.BlockID, h xxh3.Uint128) {
	hp := m.host[pi]
	m.cur.evicted = append(m.cur.evicted, undone{pool: pi, host: true, b: int32(hb), gen: hp.gen[hb], h: h, o: hp.origin(hb)})
}

// putBack registers again the blocks s's undone reservation took (see
// above), the most recently taken first. Call it after the reservation's
// tables were released.
func (m *Manager) putBack(s *sequence) {
	for k := len(s.evicted) - 1; k >= 0; k-- {
		u := s.evicted[k]
		p := m.paged[u.pool]
		if u.host {
			p = m.host[u.pool]
		}
		if p.ref[u.b] != 0 || p.hashed[u.b] || p.gen[u.b] != u.gen || m.registered(u.pool, u.h) {
			continue
		}
		i := len(p.free) - 1 // the release just pushed it: search from the top
		for i >= 0 && p.free[i] != kvcache.BlockID(u.b) {
			i--
		}
		if i < 0 || (u.pool == 0 && m.ev.on && !m.ev.unremove(u.h, u.tier())) {
			continue
		}
		// Take it off the free stack as alloc would, register it with the
		// retention it had, and let release cache it.
		p.free = slices.Delete(p.free, i, i+1)
		p.freeLow = min(p.freeLow, i)
		p.move(u.b, inNone)
		b := kvcache.BlockID(u.b)
		p.ref[b] = 1
		p.register(b, u.h)
		p.keep(u.b, u.o.prio, u.o.exp, u.o.hits)
		if u.o.salted {
			p.setSalt(u.b, u.o.sfree)
		}
		p.release(b)
	}
	s.evicted = s.evicted[:0]
}

// registered reports whether some tier of paged pool pi holds hash h.
func (m *Manager) registered(pi int, h xxh3.Uint128) bool {
	if _, ok := m.paged[pi].lookup(h); ok {
		return true
	}
	if m.host != nil {
		_, ok := m.host[pi].lookup(h)
		return ok
	}
	return false
}
