package cachemgrv1

import (
	"math/bits"

	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
	"github.com/zeebo/xxh3"
)

// noBlock marks a table position whose block was released because it left
// the attention window (sliding-window pools only).
const noBlock kvcache.BlockID = -1

// levels is the number of retention levels: priorities 1..MaxPriority, with
// index 0 unused.
const levels = kvcache.MaxPriority + 1

const defaultLevel = uint8(kvcache.DefaultPriority)

// Where a block is (pool.where): on the free stack, in the cached set, or
// neither (in use, or pending with ref 0).
const (
	inNone uint8 = iota
	inFree
	inCache
)

// pool is one fixed block pool. Every block is in exactly one of three
// states:
//
//   - free:   ref == 0, not registered, on the free stack;
//   - cached: ref == 0, registered under a hash, in the cached set (evictable);
//   - in use: ref > 0 (registered or not).
//
// The state pool ("ssm") uses the same type with tpb == 0 and never
// registers hashes.
//
// The cached set is ordered for eviction by retention level first (a
// registered block's prio, 1..100; the lowest level goes first), then by the
// policy, on stamp (the order of entry into the cached set) and hits: under
// LRU each level is an intrusive list (least recently cached first), under
// LFU each level is a binary heap on (hits, stamp), fewest reuse hits first
// and the least recently cached among equals. A bitmap says which levels
// are non-empty, so finding the victim is O(1) and inserting or removing a
// block is O(1) (LRU) or O(log n) (LFU). A priority with an expiry waits in
// a min-heap on the expiry time (exq, lazy deletion: an entry is live while
// the block is registered with that exp); refresh, called as the manager's
// clock advances, drops every expired block to DefaultPriority at its old
// place in the policy order (expire), so no cached block ever sits at a
// level its priority no longer has, and an expired block is exactly as
// evictable as if it had never had a priority.
//
// With a host tier (hostcache.go) a registered block may also be pending:
// its content arrives by a copy of a reservation not yet committed, so no
// other request may read it and nothing may evict it. A pending device block
// is in use (its sequence references it); a pending host block has ref 0 and
// is in neither the free stack nor the cached set (counted in parked).
//
// Every write to a block's state goes through the methods below; a pool
// with a dirty set (host pools, see check.go) records there every block
// whose state they changed, so the self-check re-verifies only those.
type pool struct {
	id     int
	window int // attention window; 0 = full attention
	tpb    int // tokens per block; 0 for the state pool
	n      int // total blocks

	ref    []int32
	where  []uint8 // tracked pools: inFree, inCache or inNone
	hashed []bool
	hash   []xxh3.Uint128

	// Retention of a registered block's content (reuse pools).
	prio  []uint8  // retention level 1..100
	exp   []int64  // when prio falls back to DefaultPriority; 0 = never
	hits  []int32  // reuse hits since the content was stored (LFU)
	stamp []uint64 // order of entry into the cached set
	tick  uint64   // last stamp handed out
	lfu   bool

	// LRU: one intrusive list per level, sentinel of level l at index n+l:
	// next[n+l] is the level's least recently used block, prev[n+l] its most
	// recent. LFU: one heap per level, hpos[b] is b's index in its heap.
	prev, next []int32
	heaps      [levels][]int32
	hpos       []int32
	nonEmpty   [2]uint64 // bit l: level l has cached blocks
	cached     int

	exq  []expiry // min-heap on at
	at   int64    // the clock of the last refresh: no live entry has at <= it
	nexp int      // registered blocks with exp > 0

	free    []kvcache.BlockID // stack; the top is allocated first
	freeLow int               // lowest len(free) since the last self-check
	// index maps a chain hash to its registered block: open addressing with
	// linear probing on hash.Lo (the hashes are uniformly random), slots
	// hold block+1 (0 = empty), at most half full, deletion by backward
	// shift so no tombstones build up under churn.
	index []int32
	mask  uint64
	nreg  int // registered blocks (entries in index)

	// pend marks pending blocks; nil without a host tier.
	pend   []bool
	parked int // pending blocks with ref 0 (host pools)

	// Salt-free chain hashes (explain.go), kept for the first paged pool and
	// its host pool once a salted sequence was seen: sfree[b] is set when
	// salted[b]; salt counts the registered salted blocks per salt-free hash.
	salted []bool
	sfree  []xxh3.Uint128
	salt   map[xxh3.Uint128]int32

	// gen[b] counts the allocations of block b (reuse on): content a
	// block held before its last allocation may have been overwritten.
	gen []uint32

	evictions int64
	expired   int64 // priorities that ran out
	// evicted, when set (KV events on: the first paged pool and its host
	// pool), is told the hash of each cached block alloc evicts.
	evicted func(h xxh3.Uint128)

	// dirty (host pools): dirty[b] is set and b is in touched when b's
	// state changed since the last self-check.
	dirty   []bool
	touched []int32
	shadow  *shadow // the self-check's record of the verified state

	// reglog (device pools with a host tier, see checkHost) lists the blocks
	// registered since the last self-check, up to n; regOver says it
	// overflowed.
	reglog  []int32
	logRegs bool
	regOver bool
}

type expiry struct {
	at int64
	b  int32
}

func newPool(id, window, tpb, n int, reuse bool) *pool {
	p := &pool{
		id:     id,
		window: window,
		tpb:    tpb,
		n:      n,
		ref:    make([]int32, n),
		free:   make([]kvcache.BlockID, n),
	}
	// Lowest ids on top of the stack, so a fresh pool hands out 0, 1, 2...
	for i := range p.free {
		p.free[i] = kvcache.BlockID(n - 1 - i)
	}
	if reuse {
		p.gen = make([]uint32, n)
		p.hashed = make([]bool, n)
		p.hash = make([]xxh3.Uint128, n)
		p.prio = make([]uint8, n)
		for i := range p.prio {
			p.prio[i] = defaultLevel
		}
		p.exp = make([]int64, n)
		p.hits = make([]int32, n)
		p.stamp = make([]uint64, n)
		p.hpos = make([]int32, n)
		for i := range p.hpos {
			p.hpos[i] = -1 // LRU: in its level's list
		}
		p.prev = make([]int32, n+levels)
		p.next = make([]int32, n+levels)
		for l := n; l < n+levels; l++ {
			p.prev[l], p.next[l] = int32(l), int32(l)
		}
		size := 2
		for size < 2*n {
			size *= 2
		}
		p.index = make([]int32, size)
		p.mask = uint64(size - 1)
	}
	return p
}

// useLFU switches the cached set's order to LFU (an empty pool only).
func (p *pool) useLFU() { p.lfu = true }

// track gives the pool a dirty set and where marks (check.go), with
// every block free.
func (p *pool) track() {
	p.dirty = make([]bool, p.n)
	p.where = make([]uint8, p.n)
	for _, b := range p.free {
		p.where[b] = inFree
	}
}

// touch notes that b's state changed (tracked pools).
func (p *pool) touch(b int32) {
	if p.dirty != nil && int(b) < p.n && !p.dirty[b] { // sentinels are checked every time
		p.dirty[b] = true
		p.touched = append(p.touched, b)
	}
}

// move records where b is now and touches it (tracked pools).
func (p *pool) move(b int32, w uint8) {
	if p.dirty != nil {
		p.where[b] = w
		p.touch(b)
	}
}

// isCached reports whether registered block b is in the cached set:
// unreferenced and not pending (attach pins a host block out of the set
// only while it promotes it, and nothing asks then).
func (p *pool) isCached(b int32) bool {
	return p.ref[b] == 0 && (p.pend == nil || !p.pend[b])
}

// available is how many blocks alloc can hand out now.
func (p *pool) available() int { return len(p.free) + p.cached }

func (p *pool) pushFree(b kvcache.BlockID) {
	p.move(int32(b), inFree)
	p.free = append(p.free, b)
}

// alloc hands out one block with ref 1: a free one if any, else the
// cached block victim names, whose hash is dropped. The caller has checked
// available() > 0.
func (p *pool) alloc() kvcache.BlockID {
	if k := len(p.free); k > 0 {
		b := p.free[k-1]
		p.free = p.free[:k-1]
		p.freeLow = min(p.freeLow, k-1)
		p.move(int32(b), inNone)
		p.ref[b] = 1
		if p.gen != nil {
			p.gen[b]++
		}
		return b
	}
	b := p.victim()
	p.uncache(b)
	if p.evicted != nil {
		p.evicted(p.hash[b])
	}
	p.unindex(b)
	p.evictions++
	p.ref[b] = 1
	p.gen[b]++
	return kvcache.BlockID(b)
}

// acquire takes one more reference to a registered block (prefix reuse,
// one hit); a cached block leaves the cached set.
func (p *pool) acquire(b kvcache.BlockID) {
	if p.ref[b] == 0 {
		p.uncache(int32(b))
	}
	p.ref[b]++
	p.hits[b]++
	p.touch(int32(b))
}

// release drops one reference; at zero a registered block becomes cached
// (most recently used of its level) and any other block becomes free.
// Only device and state pools have references (host blocks never do), so
// release never marks a tracked pool.
func (p *pool) release(b kvcache.BlockID) {
	p.ref[b]--
	if p.ref[b] != 0 {
		return
	}
	if p.hashed == nil || !p.hashed[b] {
		p.free = append(p.free, b)
		return
	}
	p.cache(int32(b))
}

// register records that block b holds the full block whose chain hash is
// h, and reports whether b is newly registered, with retention level
// DefaultPriority, no expiry and no hits (callers set them with keep).
// When another block already holds h it keeps it and b stays unregistered
// (no duplicates).
func (p *pool) register(b kvcache.BlockID, h xxh3.Uint128) bool {
	if p.hashed[b] {
		return false
	}
	i := h.Lo & p.mask
	for ; p.index[i] != 0; i = (i + 1) & p.mask {
		if p.hash[p.index[i]-1] == h {
			return false
		}
	}
	p.index[i] = int32(b) + 1
	p.hash[b] = h
	p.hashed[b] = true // retention as unindex (or newPool) left it: default
	p.nreg++
	p.touch(int32(b))
	if p.logRegs {
		if len(p.reglog) < p.n {
			p.reglog = append(p.reglog, int32(b))
		} else {
			p.regOver = true
		}
	}
	return true
}

// live returns the block registered under h unless it is pending.
func (p *pool) live(h xxh3.Uint128) (kvcache.BlockID, bool) {
	b, ok := p.lookup(h)
	if ok && p.pend != nil && p.pend[b] {
		return 0, false
	}
	return b, ok
}

// forget unregisters registered block b (its hash leaves the index).
func (p *pool) forget(b kvcache.BlockID) { p.unindex(int32(b)) }

// lookup returns the block registered under h.
func (p *pool) lookup(h xxh3.Uint128) (kvcache.BlockID, bool) {
	for i := h.Lo & p.mask; p.index[i] != 0; i = (i + 1) & p.mask {
		if b := p.index[i] - 1; p.hash[b] == h {
			return kvcache.BlockID(b), true
		}
	}
	return 0, false
}

// unindex unregisters block b: its hash leaves the index (Knuth's
// algorithm R: later entries of the probe run move back into the hole) and
// its retention is reset.
func (p *pool) unindex(b int32) {
	i := p.hash[b].Lo & p.mask
	for p.index[i] != b+1 {
		i = (i + 1) & p.mask
	}
	for j := i; ; {
		j = (j + 1) & p.mask
		v := p.index[j]
		if v == 0 {
			break
		}
		k := p.hash[v-1].Lo & p.mask // home slot of the entry at j
		// It may fill the hole at i unless its home lies cyclically in (i, j].
		if i <= j && i < k && k <= j || i > j && (i < k || k <= j) {
			continue
		}
		p.index[i] = v
		p.touch(v - 1)
		i = j
	}
	p.index[i] = 0
	p.nreg--
	p.hashed[b] = false
	if p.exp[b] != 0 {
		p.nexp--
	}
	p.prio[b], p.exp[b], p.hits[b] = defaultLevel, 0, 0
	if p.salted != nil && p.salted[b] {
		p.unsalt(b)
	}
	p.touch(b)
}

// keep sets the retention of registered block b: level prio until exp (0 =
// for as long as it is cached), hits reuse hits. A cached block moves to
// its new level as the most recent entry. An expiry at or before the last
// refresh means DefaultPriority now.
func (p *pool) keep(b int32, prio uint8, exp int64, hits int32) {
	if exp != 0 && exp <= p.at {
		prio, exp = defaultLevel, 0
	}
	c := p.isCached(b)
	if c {
		p.uncache(b)
	}
	if (p.exp[b] != 0) != (exp != 0) {
		if exp != 0 {
			p.nexp++
		} else {
			p.nexp--
		}
	}
	if exp != 0 && exp != p.exp[b] {
		p.pushExpiry(expiry{exp, b})
	}
	p.prio[b], p.exp[b], p.hits[b] = prio, exp, hits
	p.touch(b)
	if c {
		p.cache(b)
	}
}

// raise gives registered block b retention level prio until exp when that
// is higher than what it has (effective at the last refresh), or the later
// expiry when it is the same level.
func (p *pool) raise(b int32, prio uint8, exp int64) {
	if exp != 0 && exp <= p.at {
		prio, exp = defaultLevel, 0
	}
	switch cur := p.prio[b]; {
	case prio > cur:
		p.keep(b, prio, exp, p.hits[b])
	case prio == cur && p.exp[b] != 0 && (exp == 0 || exp > p.exp[b]):
		p.keep(b, prio, exp, p.hits[b])
	}
}

// refresh advances the pool's clock to now: every registered block whose
// priority expired by then falls back to DefaultPriority.
func (p *pool) refresh(now int64) {
	for len(p.exq) > 0 && p.exq[0].at <= now {
		e := p.popExpiry()
		if b := e.b; p.hashed[b] && p.exp[b] == e.at {
			p.expire(b)
		}
	}
	if now > p.at {
		p.at = now
	}
	if len(p.exq) > 2*p.n+64 { // drop dead entries
		live := p.exq[:0]
		for _, e := range p.exq {
			if p.hashed[e.b] && p.exp[e.b] == e.at {
				live = append(live, e)
			}
		}
		p.exq = live
		for i := len(live)/2 - 1; i >= 0; i-- {
			p.expDown(i)
		}
	}
}

// expire ends registered block b's priority: it falls back to
// DefaultPriority, keeping its place in the policy order (its stamp, and
// hits): the block is as recently and as often used as before, only less
// protected. Under LRU a cached block whose level changes this way goes to
// the default level's heap of late arrivals (ordered by stamp, like the
// level's list, and merged with it by victim); under LFU to the default
// level's heap, which is ordered by (hits, stamp) anyway.
func (p *pool) expire(b int32) {
	c := p.isCached(b)
	if c {
		p.uncache(b)
	}
	p.nexp--
	p.expired++
	p.prio[b], p.exp[b] = defaultLevel, 0
	p.touch(b)
	if c {
		p.cached++
		p.move(b, inCache)
		p.heapPush(defaultLevel, b)
	}
}

func (p *pool) pushExpiry(e expiry) {
	p.exq = append(p.exq, e)
	for i := len(p.exq) - 1; i > 0; {
		j := (i - 1) / 2
		if p.exq[j].at <= p.exq[i].at {
			break
		}
		p.exq[i], p.exq[j] = p.exq[j], p.exq[i]
		i = j
	}
}

func (p *pool) popExpiry() expiry {
	e := p.exq[0]
	k := len(p.exq) - 1
	p.exq[0] = p.exq[k]
	p.exq = p.exq[:k]
	p.expDown(0)
	return e
}

func (p *pool) expDown(i int) {
	for {
		c := 2*i + 1
		if c >= len(p.exq) {
			return
		}
		if c+1 < len(p.exq) && p.exq[c+1].at < p.exq[c].at {
			c++
		}
		if p.exq[i].at <= p.exq[c].at {
			return
		}
		p.exq[i], p.exq[c] = p.exq[c], p.exq[i]
		i = c
	}
}

// cache puts unreferenced registered block b into the cached set, the most
// recent entry of its level.
func (p *pool) cache(b int32) {
	l := p.prio[b]
	p.tick++
	p.stamp[b] = p.tick
	p.cached++
	if p.lfu {
		p.move(b, inCache)
		p.heapPush(l, b)
		return
	}
	p.nonEmpty[l>>6] |= 1 << (l & 63)
	s := int32(p.n) + int32(l)
	last := p.prev[s]
	p.next[last] = b
	p.prev[b] = last
	p.next[b] = s
	p.prev[s] = b
	if p.dirty != nil {
		p.move(b, inCache)
		p.touch(last)
	}
}

// heapPush adds cached block b to level l's heap (LFU; LRU: the default
// level's late arrivals).
func (p *pool) heapPush(l uint8, b int32) {
	p.nonEmpty[l>>6] |= 1 << (l & 63)
	h := append(p.heaps[l], b)
	p.heaps[l] = h
	p.hpos[b] = int32(len(h) - 1)
	p.touch(b)
	p.up(l, len(h)-1)
}

// inHeap reports whether cached block b is in its level's heap (else in
// its level's list).
func (p *pool) inHeap(b int32) bool { return p.lfu || p.hpos[b] >= 0 }

// uncache takes cached block b out of the cached set.
func (p *pool) uncache(b int32) {
	l := p.prio[b]
	p.move(b, inNone)
	p.cached--
	if p.inHeap(b) {
		h := p.heaps[l]
		i, k := int(p.hpos[b]), len(h)-1
		if i != k {
			h[i] = h[k]
			p.hpos[h[i]] = int32(i)
			p.touch(h[i])
		}
		h = h[:k]
		p.heaps[l] = h
		if i < k {
			p.down(l, i)
			p.up(l, i)
		}
		if !p.lfu {
			p.hpos[b] = -1
		}
	} else {
		pr, nx := p.prev[b], p.next[b]
		p.next[pr] = nx
		p.prev[nx] = pr
		p.touch(pr)
		p.touch(nx)
	}
	if p.levelEmpty(int(l)) {
		p.nonEmpty[l>>6] &^= 1 << (l & 63)
	}
}

func (p *pool) levelEmpty(l int) bool {
	return len(p.heaps[l]) == 0 && (p.lfu || p.next[p.n+l] == int32(p.n+l))
}

// first is the first block of non-empty level l in policy order.
func (p *pool) first(l int) int32 {
	h := p.heaps[l]
	if p.lfu {
		return h[0]
	}
	b := p.next[p.n+l]
	if len(h) > 0 && (b == int32(p.n+l) || p.stamp[h[0]] < p.stamp[b]) {
		return h[0]
	}
	return b
}

// victim is the cached block eviction takes first: the lowest level's
// first in policy order. The caller has checked cached > 0.
func (p *pool) victim() int32 { return p.first(p.lowest()) }

func (p *pool) lowest() int {
	if w := p.nonEmpty[0]; w != 0 {
		return bits.TrailingZeros64(w)
	}
	return 64 + bits.TrailingZeros64(p.nonEmpty[1])
}

// decided names the rule that made b, the victim, the one to evict: the
// policy, or "priority" when the policy alone (every level merged) would
// have taken another block, of a higher level.
func (p *pool) decided(b int32, policy uint8) uint8 {
	if bits.OnesCount64(p.nonEmpty[0])+bits.OnesCount64(p.nonEmpty[1]) == 1 {
		return policy
	}
	first := b
	for w := range p.nonEmpty {
		for m := p.nonEmpty[w]; m != 0; m &= m - 1 {
			if c := p.first(64*w + bits.TrailingZeros64(m)); p.before(c, first) {
				first = c
			}
		}
	}
	if first != b {
		return rulePriority
	}
	return policy
}

// before orders two cached blocks by the policy alone.
func (p *pool) before(a, b int32) bool {
	if p.lfu && p.hits[a] != p.hits[b] {
		return p.hits[a] < p.hits[b]
	}
	return p.stamp[a] < p.stamp[b]
}

func (p *pool) up(l uint8, i int) {
	h := p.heaps[l]
	for i > 0 {
		j := (i - 1) / 2
		if !p.before(h[i], h[j]) {
			return
		}
		p.swap(h, i, j)
		i = j
	}
}

func (p *pool) down(l uint8, i int) {
	h := p.heaps[l]
	for {
		c := 2*i + 1
		if c >= len(h) {
			return
		}
		if c+1 < len(h) && p.before(h[c+1], h[c]) {
			c++
		}
		if !p.before(h[c], h[i]) {
			return
		}
		p.swap(h, i, c)
		i = c
	}
}

func (p *pool) swap(h []int32, i, j int) {
	h[i], h[j] = h[j], h[i]
	p.hpos[h[i]], p.hpos[h[j]] = int32(i), int32(j)
	p.touch(h[i])
	p.touch(h[j])
}

func (p *pool) setPend(b kvcache.BlockID, on bool) {
	p.pend[b] = on
	p.touch(int32(b))
}

func (p *pool) stats() kvcache.PoolStats {
	free, cached := len(p.free), p.cached+p.parked
	return kvcache.PoolStats{
		Pool:   p.id,
		Total:  p.n,
		Free:   free,
		Cached: cached,
		InUse:  p.n - free - cached,
	}
}

// trackSalt starts keeping salt-free hashes in p, counting them in salt
// (shared by a paged pool and its host pool).
func (p *pool) trackSalt(salt map[xxh3.Uint128]int32) {
	p.salted = make([]bool, p.n)
	p.sfree = make([]xxh3.Uint128, p.n)
	p.salt = salt
}

// setSalt records that registered block b is salted and its chain without
// the salt is u.
func (p *pool) setSalt(b int32, u xxh3.Uint128) {
	if p.salted == nil || p.salted[b] {
		return
	}
	p.salted[b], p.sfree[b] = true, u
	p.salt[u]++
	p.touch(b)
}

func (p *pool) unsalt(b int32) {
	u := p.sfree[b]
	if c := p.salt[u] - 1; c > 0 {
		p.salt[u] = c
	} else {
		delete(p.salt, u)
	}
	p.salted[b] = false
}
