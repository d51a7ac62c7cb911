package cachemgrv1

import (
	"fmt"
	"slices"
)

// maxViolations bounds the self-check report.
const maxViolations = 50

// check is the deep self-check behind Inspect's Violations. It recounts
// references from the tables and verifies, per pool, that every block is in
// exactly one of free, cached and in use, that the hash index agrees with the
// blocks, and, per sequence, the ledger: 0 <= history <= capacity <= limit,
// hold <= capacity, the reservation fits, and every paged table holds
// ceil(capacity/tpb) positions (-1 only for a sliding window's stale prefix).
func (m *Manager) check() []string {
	var v []string
	add := func(format string, args ...any) {
		if len(v) < maxViolations {
			v = append(v, fmt.Sprintf(format, args...))
		}
	}

	// Ledger.
	for id, s := range m.seqs {
		if s.id != id {
			add("seq %d: stored under id %d", s.id, id)
		}
		if s.history < 0 || s.history > s.capacity {
			add("seq %d: history %d outside [0, capacity %d]", id, s.history, s.capacity)
		}
		if s.capacity > m.limit {
			add("seq %d: capacity %d > max_seq_len + max draft tokens %d", id, s.capacity, m.limit)
		}
		if s.hold > s.capacity {
			add("seq %d: hold %d > capacity %d", id, s.hold, s.capacity)
		}
		if s.reserved && s.history+s.resTokens+s.resDraft > s.capacity {
			add("seq %d: reservation %d+%d after history %d exceeds capacity %d", id, s.resTokens, s.resDraft, s.history, s.capacity)
		}
		if !s.reserved && (s.resTokens != 0 || s.resDraft != 0 || s.isNew) {
			add("seq %d: reservation fields set without a reservation", id)
		}
		want := ceilDiv(s.capacity, m.tpb)
		for pi, p := range m.paged {
			t := s.tables[pi]
			if len(t) != want {
				add("seq %d: pool %d holds %d positions, want ceil(capacity %d / %d) = %d", id, p.id, len(t), s.capacity, m.tpb, want)
			}
			st := int(s.stale[pi])
			if p.window == 0 && st != 0 {
				add("seq %d: pool %d (full attention) has %d released positions", id, p.id, st)
			}
			if p.window > 0 && st > 0 && st > (s.history-p.window)/m.tpb {
				add("seq %d: pool %d released %d positions, only %d left window %d at history %d",
					id, p.id, st, (s.history-p.window)/m.tpb, p.window, s.history)
			}
			for j, b := range t {
				switch {
				case j < st && b != noBlock:
					add("seq %d: pool %d position %d is stale but holds block %d", id, p.id, j, b)
				case j >= st && (b < 0 || int(b) >= p.n):
					add("seq %d: pool %d position %d holds block %d outside [0, %d)", id, p.id, j, b, p.n)
				}
			}
			if int(s.keep[pi]) > len(t) || s.keep[pi] > s.told[pi] {
				add("seq %d: pool %d delta bookkeeping keep %d told %d len %d", id, p.id, s.keep[pi], s.told[pi], len(t))
			}
		}
		if m.ssm != nil && (s.slot < 0 || int(s.slot) >= m.ssm.n) {
			add("seq %d: state slot %d outside [0, %d)", id, s.slot, m.ssm.n)
		}
		if s.registered > len(s.hashes) || s.registered > s.history/m.tpb {
			add("seq %d: %d prompt blocks registered, %d hashed, history %d", id, s.registered, len(s.hashes), s.history)
		}
	}

	// Pools.
	for pi, p := range m.paged {
		refs := make([]int32, p.n)
		for _, s := range m.seqs {
			for _, b := range s.tables[pi] {
				if b >= 0 && int(b) < p.n {
					refs[b]++
				}
			}
		}
		m.checkPool(p, refs, add)
	}
	if m.host != nil {
		m.checkHost(add)
	}
	if m.ssm != nil {
		refs := make([]int32, m.ssm.n)
		for _, s := range m.seqs {
			if s.slot >= 0 && int(s.slot) < m.ssm.n {
				refs[s.slot]++
			}
		}
		m.checkPool(m.ssm, refs, add)
		for b, r := range refs {
			if r > 1 {
				add("pool %d (ssm): slot %d held by %d sequences", m.ssm.id, b, r)
			}
		}
	}
	return v
}

func (m *Manager) checkPool(p *pool, refs []int32, add func(string, ...any)) {
	const (
		unseen = iota
		onFree
		onLRU
	)
	where := make([]uint8, p.n)
	for b, r := range refs {
		if p.ref[b] != r {
			add("pool %d: block %d has refcount %d, tables reference it %d times", p.id, b, p.ref[b], r)
		}
	}
	for _, b := range p.free {
		switch {
		case b < 0 || int(b) >= p.n:
			add("pool %d: free list holds block %d outside [0, %d)", p.id, b, p.n)
			continue
		case where[b] != unseen:
			add("pool %d: block %d is on the free list twice", p.id, b)
		case refs[b] != 0:
			add("pool %d: block %d is free but referenced %d times", p.id, b, refs[b])
		case p.hashed != nil && p.hashed[b]:
			add("pool %d: block %d is free but registered", p.id, b)
		}
		where[b] = onFree
	}
	parked := 0
	for b := range p.pend {
		if !p.pend[b] {
			continue
		}
		switch {
		case !p.hashed[b]:
			add("pool %d: block %d is pending but not registered", p.id, b)
		case where[b] != unseen:
			add("pool %d: block %d is pending but on the free list", p.id, b)
		}
		if refs[b] == 0 {
			parked++
		}
	}
	if parked != p.parked {
		add("pool %d: %d pending unreferenced blocks, %d counted", p.id, parked, p.parked)
	}
	lru := 0
	if p.hashed != nil {
		for b, steps := p.next[p.n], 0; b != int32(p.n); b, steps = p.next[b], steps+1 {
			if steps > p.n || b < 0 || int(b) > p.n {
				add("pool %d: LRU list is corrupt at block %d", p.id, b)
				break
			}
			lru++
			switch {
			case where[b] != unseen:
				add("pool %d: block %d is both cached and free (or cached twice)", p.id, b)
			case refs[b] != 0:
				add("pool %d: block %d is cached but referenced %d times", p.id, b, refs[b])
			case !p.hashed[b]:
				add("pool %d: block %d is cached but not registered", p.id, b)
			case p.pend != nil && p.pend[b]:
				add("pool %d: block %d is cached but pending", p.id, b)
			}
			where[b] = onLRU
		}
		hashed, entries := 0, 0
		for b := range p.n {
			if p.hashed[b] {
				hashed++
				if got, ok := p.lookup(p.hash[b]); !ok || int(got) != b {
					add("pool %d: block %d is registered but the index maps its hash to %d (%v)", p.id, b, got, ok)
				}
			}
		}
		for _, v := range p.index {
			if v != 0 {
				entries++
				if v < 1 || int(v) > p.n || !p.hashed[v-1] {
					add("pool %d: index entry %d is not a registered block", p.id, v-1)
				}
			}
		}
		if hashed != entries || hashed != p.nreg {
			add("pool %d: %d registered blocks, %d index entries, %d counted", p.id, hashed, entries, p.nreg)
		}
	}
	if lru != p.cached {
		add("pool %d: %d blocks on the LRU list, %d counted cached", p.id, lru, p.cached)
	}
	inUse := 0
	for b := range p.n {
		if refs[b] > 0 {
			inUse++
		} else if where[b] == unseen && (p.pend == nil || !p.pend[b]) {
			add("pool %d: block %d is unreferenced but neither free nor cached (leaked)", p.id, b)
		}
	}
	if st := p.stats(); st.Free+st.Cached+inUse != st.Total || st.InUse != inUse || st.Cached != lru+parked {
		add("pool %d: free %d + cached %d + in use %d (counted %d) != total %d", p.id, st.Free, st.Cached, st.InUse, inUse, st.Total)
	}
}

// checkHost verifies the host tier (hostcache.go): host blocks are never
// referenced, a chain hash is registered in at most one tier of a pool, and
// the pending blocks are exactly the moves of outstanding reservations, each
// once, a host move's block unreferenced and a device move's block in its
// sequence's table.
func (m *Manager) checkHost(add func(string, ...any)) {
	pending := make([][2][]int32, len(m.paged)) // [pool][device, host][block] = moves naming it
	for pi := range m.paged {
		pending[pi] = [2][]int32{make([]int32, m.paged[pi].n), make([]int32, m.host[pi].n)}
	}
	for id, s := range m.seqs {
		if len(s.moved) > 0 && !s.reserved {
			add("seq %d: %d pending moves without a reservation", id, len(s.moved))
		}
		for _, mv := range s.moved {
			tier, p := 0, m.paged[mv.pool]
			if mv.host {
				tier, p = 1, m.host[mv.pool]
			}
			if mv.b < 0 || int(mv.b) >= p.n {
				add("seq %d: pending move names block %d outside pool %d of %d", id, mv.b, p.id, p.n)
				continue
			}
			pending[mv.pool][tier][mv.b]++
			if !mv.host && !slices.Contains(s.tables[mv.pool], mv.b) {
				add("seq %d: promoted block %d of pool %d is not in its table", id, mv.b, p.id)
			}
		}
	}
	for pi, dp := range m.paged {
		hp := m.host[pi]
		m.checkPool(hp, make([]int32, hp.n), add)
		for tier, p := range []*pool{dp, hp} {
			for b := range p.n {
				if want := p.pend[b]; (pending[pi][tier][b] == 1) != want || pending[pi][tier][b] > 1 {
					add("pool %d: block %d pending %v, named by %d pending moves", p.id, b, want, pending[pi][tier][b])
				}
			}
		}
		// Device blocks are the fewer: look each one's hash up on the host.
		for b := range dp.n {
			if dp.hashed[b] {
				if hb, ok := hp.lookup(dp.hash[b]); ok {
					add("pool %d: host block %d and device block %d of pool %d hold the same hash", hp.id, hb, b, dp.id)
				}
			}
		}
	}
}
