package cachemgrv1

import (
	"fmt"
	"slices"

	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
	"github.com/zeebo/xxh3"
)

// maxViolations bounds the self-check report.
const maxViolations = 50

// check is the deep self-check behind Inspect's Violations. It recounts
// references from the tables and verifies, per pool, that every block is in
// exactly one of free, cached and in use, that the hash index agrees with the
// blocks, that the cached set is ordered by retention level and policy, and,
// per sequence, the ledger: 0 <= history <= capacity <= limit, hold <=
// capacity, the reservation fits, and every paged table holds
// ceil(capacity/tpb) positions (-1 only for a sliding window's stale prefix).
//
// Cost: device and state pools are walked whole (O(blocks + table
// entries)); host pools, which can be far larger and change a few blocks a
// step, are verified block by block for the blocks touched since the last
// check only (checkHostPool says why that proves as much); the explain
// bookkeeping costs O(live prompt blocks + salted blocks).
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
		want := kvcache.BlocksFor(s.capacity, m.tpb)
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
		if s.prio < kvcache.MinPriority || s.prio > kvcache.MaxPriority {
			add("seq %d: retention priority %d outside [%d, %d]", id, s.prio, kvcache.MinPriority, kvcache.MaxPriority)
		}
		if len(s.sfree) != 0 && len(s.sfree) != len(s.hashes) {
			add("seq %d: %d salt-free hashes for %d prompt blocks", id, len(s.sfree), len(s.hashes))
		}
	}

	// Pools.
	for pi, p := range m.paged {
		refs, inUse := m.checkRefs(p.n), 0
		for _, s := range m.seqs {
			for _, b := range s.tables[pi] {
				if b >= 0 && int(b) < p.n {
					if refs[b] == 0 {
						inUse++
					}
					refs[b]++
				}
			}
		}
		m.checkPool(p, refs, inUse, add)
	}
	if m.host != nil {
		m.checkHost(add)
	}
	if m.ssm != nil {
		refs, inUse := m.checkRefs(m.ssm.n), 0
		for _, s := range m.seqs {
			if s.slot >= 0 && int(s.slot) < m.ssm.n {
				if refs[s.slot] == 0 {
					inUse++
				}
				refs[s.slot]++
			}
		}
		m.checkPool(m.ssm, refs, inUse, add)
		for b, r := range refs {
			if r > 1 {
				add("pool %d (ssm): slot %d held by %d sequences", m.ssm.id, b, r)
			}
		}
	}
	m.checkExplain(add) // after checkHostPool, whose shadow it reads
	return v
}

// checkHost verifies the host tier (hostcache.go): each host pool by
// checkHostPool; a chain hash is registered in at most one tier of a pool
// (checked for every pair of which one side was registered since the last
// check: the device blocks registered since (reglog) are looked up on the
// host, the host blocks touched since on the device; a pair older than
// that passed the last check. The first check, or one after reglog
// overflowed, looks every device block up);
// and the pending blocks are exactly the moves of outstanding reservations,
// each once, a host move's block unreferenced and a device move's block in
// its sequence's table: every move names a distinct pending block, and
// there are as many moves as pending blocks (O(moves + device blocks)).
func (m *Manager) checkHost(add func(string, ...any)) {
	type key struct {
		pool int
		host bool
		b    kvcache.BlockID
	}
	named := map[key]bool{}
	moves := make([][2]int, len(m.paged)) // [pool][device, host]
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
			k := key{mv.pool, mv.host, mv.b}
			switch {
			case named[k]:
				add("pool %d: block %d is named by two pending moves", p.id, mv.b)
			case !p.pend[mv.b]:
				add("pool %d: block %d is named by a pending move of seq %d but not pending", p.id, mv.b, id)
			}
			named[k] = true
			moves[mv.pool][tier]++
			if !mv.host && !slices.Contains(s.tables[mv.pool], mv.b) {
				add("seq %d: promoted block %d of pool %d is not in its table", id, mv.b, p.id)
			}
			if mv.host && p.ref[mv.b] != 0 {
				add("pool %d: offloaded block %d is referenced %d times", p.id, mv.b, p.ref[mv.b])
			}
		}
	}
	for pi, dp := range m.paged {
		hp := m.host[pi]
		onHost := func(b int) {
			if hb, ok := hp.lookup(dp.hash[b]); ok {
				add("pool %d: host block %d and device block %d of pool %d hold the same hash", hp.id, hb, b, dp.id)
			}
		}
		if hp.shadow == nil || dp.regOver {
			for b := range dp.n {
				if dp.hashed[b] {
					onHost(b)
				}
			}
		} else {
			for _, b := range dp.reglog {
				if dp.hashed[b] {
					onHost(int(b))
				}
			}
			for _, hb := range hp.touched {
				if hp.hashed[hb] {
					if b, ok := dp.lookup(hp.hash[hb]); ok {
						add("pool %d: host block %d and device block %d of pool %d hold the same hash", hp.id, hb, b, dp.id)
					}
				}
			}
		}
		dp.reglog, dp.regOver = dp.reglog[:0], false
		m.checkHostPool(hp, add)
		pending := 0
		for b := range dp.n {
			if dp.pend[b] {
				pending++
			}
		}
		if pending != moves[pi][0] || hp.parked != moves[pi][1] {
			add("pool %d: %d pending device blocks and %d pending host blocks; %d and %d pending moves",
				dp.id, pending, hp.parked, moves[pi][0], moves[pi][1])
		}
	}
}

// checkRefs returns n zeroed counters from the check's scratch, valid until
// the next call.
func (m *Manager) checkRefs(n int) []int32 {
	if cap(m.chkRefs) < n {
		m.chkRefs = make([]int32, n)
	}
	refs := m.chkRefs[:n]
	clear(refs)
	return refs
}

// checkPool verifies a pool block by block (device and state pools):
// refcounts equal the tables' references; the free stack holds distinct
// unreferenced unregistered blocks; each level's list (LRU, stamps
// increasing) or heap (LFU, heap-ordered, hpos its inverse) holds exactly
// the unreferenced registered non-pending blocks of that level; where
// agrees; the hash index maps every registered hash to its block and
// nothing else; retention fields are in range, no priority is overdue and
// every expiry has a live entry in the expiry heap. refs holds each
// block's references from the tables, inUse how many blocks have some.
//
// No block is leaked (unreferenced, yet neither free, cached nor pending)
// when nothing else was found and the free and cached blocks, the
// referenced ones and the unreferenced pending ones, three disjoint sets
// then, add up to the pool: only otherwise is every block looked at to name
// the leaked ones, so a check of a pool of millions of mostly free blocks
// (a cpu stage's default memory) reads each per-block array once less.
func (m *Manager) checkPool(p *pool, refs []int32, inUse int, add func(string, ...any)) {
	bad, report := 0, add
	add = func(format string, args ...any) {
		bad++
		report(format, args...)
	}
	marked := 0 // blocks whose where is set: free or cached
	if cap(m.chkWhere) < p.n {
		m.chkWhere = make([]uint8, p.n)
	}
	where := m.chkWhere[:p.n]
	clear(where)
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
		case where[b] != inNone:
			add("pool %d: block %d is on the free list twice", p.id, b)
		case refs[b] != 0:
			add("pool %d: block %d is free but referenced %d times", p.id, b, refs[b])
		case p.hashed != nil && p.hashed[b]:
			add("pool %d: block %d is free but registered", p.id, b)
		}
		if where[b] == inNone {
			marked++
		}
		where[b] = inFree
	}
	parked := 0
	for b := range p.pend {
		if !p.pend[b] {
			continue
		}
		switch {
		case !p.hashed[b]:
			add("pool %d: block %d is pending but not registered", p.id, b)
		case where[b] != inNone:
			add("pool %d: block %d is pending but on the free list", p.id, b)
		}
		if refs[b] == 0 {
			parked++
		}
	}
	if parked != p.parked {
		add("pool %d: %d pending unreferenced blocks, %d counted", p.id, parked, p.parked)
	}
	cached := 0
	if p.hashed != nil {
		visit := func(b int32, l int) bool {
			if b < 0 || int(b) >= p.n {
				add("pool %d: level %d holds block %d outside [0, %d)", p.id, l, b, p.n)
				return false
			}
			cached++
			switch {
			case where[b] != inNone:
				add("pool %d: block %d is both cached and free (or cached twice)", p.id, b)
			case refs[b] != 0:
				add("pool %d: block %d is cached but referenced %d times", p.id, b, refs[b])
			case !p.hashed[b]:
				add("pool %d: block %d is cached but not registered", p.id, b)
			case p.pend != nil && p.pend[b]:
				add("pool %d: block %d is cached but pending", p.id, b)
			case int(p.prio[b]) != l:
				add("pool %d: block %d of priority %d is cached at level %d", p.id, b, p.prio[b], l)
			}
			if where[b] == inNone {
				marked++
			}
			where[b] = inCache
			return true
		}
		for l := range levels {
			h := p.heaps[l]
			n := len(h)
			if !p.lfu && n > 0 && l != int(defaultLevel) {
				add("pool %d: LRU level %d has %d late arrivals; only the default level has them", p.id, l, n)
			}
			for i, b := range h {
				if !visit(b, l) {
					break
				}
				if int(p.hpos[b]) != i {
					add("pool %d: block %d at heap %d index %d records index %d", p.id, b, l, i, p.hpos[b])
				}
				if i > 0 && p.before(b, h[(i-1)/2]) {
					add("pool %d: heap %d out of order at index %d", p.id, l, i)
				}
			}
			s := int32(p.n + l)
			if p.lfu && (p.next[s] != s || p.prev[s] != s) {
				add("pool %d: LFU pool has a list at level %d", p.id, l)
			}
			last := uint64(0)
			for b, steps := p.next[s], 0; !p.lfu && b != s; b, steps = p.next[b], steps+1 {
				if steps > p.n || !visit(b, l) {
					add("pool %d: LRU list %d is corrupt at block %d", p.id, l, b)
					break
				}
				if p.prev[p.next[b]] != b || p.stamp[b] <= last || p.hpos[b] != -1 {
					add("pool %d: LRU list %d is out of order or half-linked at block %d (heap index %d)", p.id, l, b, p.hpos[b])
				}
				last = p.stamp[b]
				n++
			}
			if on := p.nonEmpty[l>>6]>>(l&63)&1 == 1; on != (n > 0) {
				add("pool %d: level %d holds %d blocks, non-empty bit %v", p.id, l, n, on)
			}
		}
		hashed, entries, expiring := 0, 0, 0
		for b := range p.n {
			if !p.hashed[b] {
				if p.exp[b] != 0 || (p.salted != nil && p.salted[b]) {
					add("pool %d: unregistered block %d keeps expiry %d or a salt", p.id, b, p.exp[b])
				}
				continue
			}
			hashed++
			if got, ok := p.lookup(p.hash[b]); !ok || int(got) != b {
				add("pool %d: block %d is registered but the index maps its hash to %d (%v)", p.id, b, got, ok)
			}
			m.checkRetention(p, int32(b), add)
			if p.exp[b] != 0 {
				expiring++
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
		if expiring != p.nexp {
			add("pool %d: %d registered blocks with an expiry, %d counted", p.id, expiring, p.nexp)
		}
		checkExpiries(p, add)
	}
	if cached != p.cached {
		add("pool %d: %d blocks in the cached set, %d counted cached", p.id, cached, p.cached)
	}
	if bad > 0 || marked+inUse+parked != p.n {
		for b := range p.n {
			if where[b] == inNone && refs[b] == 0 && (p.pend == nil || !p.pend[b]) {
				add("pool %d: block %d is unreferenced but neither free nor cached (leaked)", p.id, b)
			}
		}
	}
	if st := p.stats(); st.Free+st.Cached+inUse != st.Total || st.InUse != inUse || st.Cached != cached+parked {
		add("pool %d: free %d + cached %d + in use %d (counted %d) != total %d", p.id, st.Free, st.Cached, st.InUse, inUse, st.Total)
	}
}

// checkRetention verifies registered block b's retention: a level in
// range and no expiry at or before the pool's last refresh (refresh would
// have applied it).
func (m *Manager) checkRetention(p *pool, b int32, add func(string, ...any)) {
	if p.prio[b] < kvcache.MinPriority || p.prio[b] > kvcache.MaxPriority {
		add("pool %d: block %d has priority %d outside [%d, %d]", p.id, b, p.prio[b], kvcache.MinPriority, kvcache.MaxPriority)
	}
	if e := p.exp[b]; e != 0 && e <= p.at {
		add("pool %d: block %d keeps priority %d past its expiry %d (refreshed at %d)", p.id, b, p.prio[b], e, p.at)
	}
	if p.hits[b] < 0 {
		add("pool %d: block %d has %d hits", p.id, b, p.hits[b])
	}
}

// checkExpiries verifies the expiry heap: heap-ordered, no live entry at or
// before the last refresh, and one live entry for each of the nexp blocks
// with an expiry (so refresh meets every one). Cost O(entries), which is
// bounded by 2 × blocks + 64 and is 0 when no request sets a duration.
func checkExpiries(p *pool, add func(string, ...any)) {
	if len(p.exq) == 0 {
		if p.nexp != 0 {
			add("pool %d: %d blocks have an expiry, the expiry heap is empty", p.id, p.nexp)
		}
		return
	}
	seen := make(map[int32]bool, p.nexp)
	for i, e := range p.exq {
		if i > 0 && p.exq[(i-1)/2].at > e.at {
			add("pool %d: expiry heap out of order at index %d", p.id, i)
		}
		if e.b < 0 || int(e.b) >= p.n {
			add("pool %d: expiry entry names block %d outside [0, %d)", p.id, e.b, p.n)
			continue
		}
		if p.hashed[e.b] && p.exp[e.b] == e.at {
			if e.at <= p.at {
				add("pool %d: block %d expired at %d, not applied by the refresh at %d", p.id, e.b, e.at, p.at)
			}
			seen[e.b] = true
		}
	}
	if len(seen) != p.nexp {
		add("pool %d: %d blocks have an expiry, %d have a live entry in the expiry heap", p.id, p.nexp, len(seen))
	}
}

// Host pools: the shadow is the checker's own record of each block's class
// as last verified, with the counts per class.
const (
	shFree uint8 = iota
	shCached
	shParked
	shOther // cannot pass a check; kept so the counts stay honest
	shClasses
)

type shadow struct {
	class  []uint8
	count  [shClasses]int
	reg    int // registered blocks
	exp    int // registered blocks with an expiry
	regd   []bool
	expd   []bool
	salted map[xxh3.Uint128]int32
	sfree  []xxh3.Uint128 // the salt-free hash counted for a block, valid when sd[b]
	sd     []bool
	seen   []bool // scratch: free stack entries seen in this check
}

// checkHostPool verifies host pool hp, whose blocks are never referenced,
// in time proportional to the blocks touched since the last check (all of
// them the first time) plus the levels and the free stack's new top.
//
// Why that proves as much as a full walk: every write to a block's state
// goes through pool methods that touch the block, and every write to a
// link, heap slot or index slot touches every block whose link, position
// or entry it changes. An untouched block is therefore exactly as it was
// when it last passed these rules, and so are its neighbours' links to it.
// The rules, per verified block b:
//
//   - ref[b] == 0 and b's class follows from its state: pending (registered,
//     where none), cached (registered, where inCache) or free (unregistered,
//     where inFree);
//   - a registered b is what the index finds under its hash, an
//     unregistered one is not (no stale entry), retention as checkRetention;
//   - a cached b is in its level's structure: LRU, its links are mutual and
//     lead to blocks of the same level with a smaller (prev) and larger
//     (next) stamp, or to the level's sentinel, so following next from any
//     cached block strictly increases the stamp and must end at the
//     sentinel: every cached block is on its level's one list; LFU,
//     heaps[l][hpos[b]] == b and it is ordered against its parent and
//     children.
//
// Then, globally: the shadow counts per class equal the pool's counters
// (len(free), cached, parked, nreg, nexp), which with the above rules out
// a block on two lists, a free stack entry for a block that is no longer
// free, or a lost block; every sentinel links back and its level's bit is
// right; the free stack entries above the lowest point it reached since
// the last check are distinct free blocks (those below were verified then
// and the stack has not changed there since).
func (m *Manager) checkHostPool(hp *pool, add func(string, ...any)) {
	sh := hp.shadow
	if sh == nil {
		// The first check verifies every block, from a shadow of n free
		// unregistered blocks.
		sh = &shadow{class: make([]uint8, hp.n), seen: make([]bool, hp.n), regd: make([]bool, hp.n), expd: make([]bool, hp.n)}
		hp.shadow = sh
		sh.count[shFree] = hp.n
		hp.touched = hp.touched[:0]
		for b := range hp.n {
			hp.dirty[b] = true
			hp.touched = append(hp.touched, int32(b))
		}
		hp.freeLow = 0
	}
	if hp.salted != nil && sh.salted == nil {
		sh.salted = map[xxh3.Uint128]int32{}
		sh.sfree = make([]xxh3.Uint128, hp.n)
		sh.sd = make([]bool, hp.n)
	}
	for _, b := range hp.touched {
		hp.dirty[b] = false
		c := m.checkHostBlock(hp, b, add)
		if o := sh.class[b]; o != c {
			sh.count[o]--
			sh.count[c]++
			sh.class[b] = c
		}
	}
	// Registered, expiring and salted counts are recounted from the
	// touched blocks' previous and present state, kept in the shadow.
	for _, b := range hp.touched {
		sh.recount(hp, b)
	}
	hp.touched = hp.touched[:0]
	if sh.count[shFree] != len(hp.free) || sh.count[shCached] != hp.cached || sh.count[shParked] != hp.parked || sh.count[shOther] != 0 {
		add("pool %d: %d free, %d cached, %d pending blocks verified (%d in no state); counted %d free, %d cached, %d pending",
			hp.id, sh.count[shFree], sh.count[shCached], sh.count[shParked], sh.count[shOther], len(hp.free), hp.cached, hp.parked)
	}
	if sh.reg != hp.nreg || sh.exp != hp.nexp {
		add("pool %d: %d registered blocks (%d with an expiry) verified, %d (%d) counted", hp.id, sh.reg, sh.exp, hp.nreg, hp.nexp)
	}
	// Sentinels and level bits.
	total := 0
	for l := range levels {
		n := len(hp.heaps[l])
		if !hp.lfu {
			s := int32(hp.n + l)
			nx, pv := hp.next[s], hp.prev[s]
			if hp.prev[nx] != s || hp.next[pv] != s || (nx == s) != (pv == s) {
				add("pool %d: level %d sentinel is half-linked", hp.id, l)
			}
			for _, b := range [2]int32{nx, pv} {
				if b != s && (b < 0 || int(b) >= hp.n || hp.where[b] != inCache || int(hp.prio[b]) != l) {
					add("pool %d: level %d sentinel links to block %d, not a cached block of its level", hp.id, l, b)
				}
			}
			if nx != s {
				n++
			}
		}
		total += n
		if on := hp.nonEmpty[l>>6]>>(l&63)&1 == 1; on != (n > 0) {
			add("pool %d: level %d holds blocks: %v, non-empty bit %v", hp.id, l, n > 0, on)
		}
	}
	if hp.lfu && total != hp.cached {
		add("pool %d: LFU heaps hold %d blocks, %d counted cached", hp.id, total, hp.cached)
	}
	// The free stack's changed top.
	top := hp.free[min(hp.freeLow, len(hp.free)):]
	for _, b := range top {
		switch {
		case b < 0 || int(b) >= hp.n:
			add("pool %d: free list holds block %d outside [0, %d)", hp.id, b, hp.n)
			continue
		case sh.seen[b]:
			add("pool %d: block %d is on the free list twice", hp.id, b)
		case hp.where[b] != inFree:
			add("pool %d: block %d is on the free list but marked %d", hp.id, b, hp.where[b])
		}
		sh.seen[b] = true
	}
	for _, b := range top {
		if b >= 0 && int(b) < hp.n {
			sh.seen[b] = false
		}
	}
	hp.freeLow = len(hp.free)
	checkExpiries(hp, add)
}

// checkHostBlock applies the per-block rules of checkHostPool to b and
// returns its class.
func (m *Manager) checkHostBlock(hp *pool, b int32, add func(string, ...any)) uint8 {
	if hp.ref[b] != 0 {
		add("pool %d: host block %d has refcount %d", hp.id, b, hp.ref[b])
	}
	c := shOther
	switch w := hp.where[b]; {
	case hp.pend[b]:
		if hp.hashed[b] && w == inNone {
			c = shParked
		} else {
			add("pool %d: block %d is pending but registered %v, marked %d", hp.id, b, hp.hashed[b], w)
		}
	case hp.hashed[b]:
		if w == inCache {
			c = shCached
		} else {
			add("pool %d: block %d is registered, unreferenced and not pending, but marked %d (not cached)", hp.id, b, w)
		}
	default:
		if w == inFree {
			c = shFree
		} else {
			add("pool %d: block %d is unreferenced and unregistered but marked %d (not free: leaked)", hp.id, b, w)
		}
	}
	if hp.hashed[b] {
		if got, ok := hp.lookup(hp.hash[b]); !ok || got != kvcache.BlockID(b) {
			add("pool %d: block %d is registered but the index maps its hash to %d (%v)", hp.id, b, got, ok)
		}
		m.checkRetention(hp, b, add)
	} else {
		if got, ok := hp.lookup(hp.hash[b]); ok && got == kvcache.BlockID(b) {
			add("pool %d: index entry for unregistered block %d", hp.id, b)
		}
		if hp.exp[b] != 0 || (hp.salted != nil && hp.salted[b]) {
			add("pool %d: unregistered block %d keeps expiry %d or a salt", hp.id, b, hp.exp[b])
		}
	}
	if c != shCached {
		return c
	}
	l := int(hp.prio[b])
	if hp.inHeap(b) {
		h, i := hp.heaps[l], int(hp.hpos[b])
		switch {
		case !hp.lfu && l != int(defaultLevel):
			add("pool %d: block %d of level %d is a late arrival; only the default level has them", hp.id, b, l)
		case i < 0 || i >= len(h) || h[i] != b:
			add("pool %d: cached block %d is not at its index %d of heap %d", hp.id, b, i, l)
		case i > 0 && hp.before(b, h[(i-1)/2]):
			add("pool %d: LFU heap %d out of order above block %d", hp.id, l, b)
		case 2*i+1 < len(h) && hp.before(h[2*i+1], b) || 2*i+2 < len(h) && hp.before(h[2*i+2], b):
			add("pool %d: LFU heap %d out of order below block %d", hp.id, l, b)
		}
		return c
	}
	s := int32(hp.n + l)
	nx, pv := hp.next[b], hp.prev[b]
	ok := nx >= 0 && int(nx) < len(hp.prev) && pv >= 0 && int(pv) < len(hp.next) && hp.prev[nx] == b && hp.next[pv] == b
	ok = ok && (nx == s || int(nx) < hp.n && hp.where[nx] == inCache && int(hp.prio[nx]) == l && hp.stamp[nx] > hp.stamp[b])
	ok = ok && (pv == s || int(pv) < hp.n && hp.where[pv] == inCache && int(hp.prio[pv]) == l && hp.stamp[pv] < hp.stamp[b])
	if !ok {
		add("pool %d: cached block %d (level %d) is not linked in order into its level's list (prev %d, next %d)", hp.id, b, l, pv, nx)
	}
	return c
}

// recount moves b's registered, expiring and salted contributions in the
// shadow from what was counted for it to what it is now.
func (sh *shadow) recount(hp *pool, b int32) {
	if r := hp.hashed[b]; r != sh.regd[b] {
		sh.reg += delta(r)
		sh.regd[b] = r
	}
	if e := hp.hashed[b] && hp.exp[b] != 0; e != sh.expd[b] {
		sh.exp += delta(e)
		sh.expd[b] = e
	}
	if sh.salted == nil {
		return
	}
	if sh.sd[b] {
		u := sh.sfree[b]
		if sh.salted[u]--; sh.salted[u] <= 0 {
			delete(sh.salted, u)
		}
		sh.sd[b] = false
	}
	if hp.salted[b] {
		sh.salted[hp.sfree[b]]++
		sh.sd[b], sh.sfree[b] = true, hp.sfree[b]
	}
}

func delta(on bool) int {
	if on {
		return 1
	}
	return -1
}

// checkExplain verifies the bookkeeping behind Explain: the salt-free
// counts are exactly the salted blocks of the first paged pool and its
// host pool (the host's from the shadow checkHostPool keeps), and each
// ghost record is within its bound.
func (m *Manager) checkExplain(add func(string, ...any)) {
	if !m.reuse {
		return
	}
	for pi, g := range m.ghosts {
		if g.live > len(g.ring) || len(g.ring) > g.cap || g.head >= g.cap || 2*g.live > len(g.index) {
			add("explain: pool %d ghost record holds %d hashes in %d slots of %d (head %d, index %d)",
				m.paged[pi].id, g.live, len(g.ring), g.cap, g.head, len(g.index))
		}
	}
	dp := m.paged[0]
	if dp.salted == nil {
		return
	}
	salt := map[xxh3.Uint128]int32{}
	for b := range dp.n {
		if dp.salted[b] {
			salt[dp.sfree[b]]++
		}
	}
	if m.host != nil {
		for u, n := range m.host[0].shadow.salted {
			salt[u] += n
		}
	}
	if len(salt) != len(dp.salt) {
		add("explain: %d salt-free hashes of salted blocks, %d counted", len(salt), len(dp.salt))
	}
	for u, n := range salt {
		if dp.salt[u] != n {
			add("explain: salt-free hash %x has %d salted blocks, %d counted", u.Lo, n, dp.salt[u])
		}
	}
}
