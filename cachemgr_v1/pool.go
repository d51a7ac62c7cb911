package cachemgrv1

import (
	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
	"github.com/zeebo/xxh3"
)

// noBlock marks a table position whose block was released because it left
// the attention window (sliding-window pools only).
const noBlock kvcache.BlockID = -1

// pool is one fixed block pool. Every block is in exactly one of three
// states:
//
//   - free:   ref == 0, not registered, on the free stack;
//   - cached: ref == 0, registered under a hash, on the LRU list (evictable);
//   - in use: ref > 0 (registered or not).
//
// The state pool ("ssm") uses the same type with tpb == 0 and never
// registers hashes.
//
// With a host tier (hostcache.go) a registered block may also be pending:
// its content arrives by a copy of a reservation not yet committed, so no
// other request may read it and nothing may evict it. A pending device block
// is in use (its sequence references it); a pending host block has ref 0 and
// is on neither the free stack nor the LRU list (counted in parked).
type pool struct {
	id     int
	window int // attention window; 0 = full attention
	tpb    int // tokens per block; 0 for the state pool
	n      int // total blocks

	ref    []int32
	hashed []bool
	hash   []xxh3.Uint128
	// LRU list of cached blocks, intrusive, with a sentinel at index n:
	// next[n] is the least recently used, prev[n] the most recent.
	prev, next []int32
	cached     int
	free       []kvcache.BlockID // stack; the top is allocated first
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

	// gen[b] counts the allocations of block b (reuse on): content a
	// block held before its last allocation may have been overwritten.
	gen []uint32

	evictions int64
	// evicted, when set (KV events on, first pool), is told the hash of
	// each cached block alloc evicts.
	evicted func(h xxh3.Uint128)
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
		p.prev = make([]int32, n+1)
		p.next = make([]int32, n+1)
		p.prev[n], p.next[n] = int32(n), int32(n)
		size := 2
		for size < 2*n {
			size *= 2
		}
		p.index = make([]int32, size)
		p.mask = uint64(size - 1)
	}
	return p
}

// available is how many blocks alloc can hand out now.
func (p *pool) available() int { return len(p.free) + p.cached }

// alloc hands out one block with ref 1: a free one if any, else the least
// recently used cached one, whose hash is dropped. The caller has checked
// available() > 0.
func (p *pool) alloc() kvcache.BlockID {
	if k := len(p.free); k > 0 {
		b := p.free[k-1]
		p.free = p.free[:k-1]
		p.ref[b] = 1
		if p.gen != nil {
			p.gen[b]++
		}
		return b
	}
	b := p.next[p.n]
	p.unlink(b)
	p.cached--
	if p.evicted != nil {
		p.evicted(p.hash[b])
	}
	p.unindex(b)
	p.hashed[b] = false
	p.evictions++
	p.ref[b] = 1
	p.gen[b]++
	return kvcache.BlockID(b)
}

// acquire takes one more reference to a registered block (prefix reuse);
// a cached block leaves the LRU list.
func (p *pool) acquire(b kvcache.BlockID) {
	if p.ref[b] == 0 {
		p.unlink(int32(b))
		p.cached--
	}
	p.ref[b]++
}

// release drops one reference; at zero a registered block becomes cached
// (most recently used) and any other block becomes free.
func (p *pool) release(b kvcache.BlockID) {
	p.ref[b]--
	if p.ref[b] != 0 {
		return
	}
	if p.hashed != nil && p.hashed[b] {
		p.pushMRU(int32(b))
		p.cached++
		return
	}
	p.free = append(p.free, b)
}

// register records that in-use block b holds the full block whose chain hash
// is h, and reports whether b is newly registered. When another block
// already holds h it keeps it and b stays unregistered (no duplicates).
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
	p.hashed[b] = true
	p.nreg++
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
func (p *pool) forget(b kvcache.BlockID) {
	p.unindex(int32(b))
	p.hashed[b] = false
}

// lookup returns the block registered under h.
func (p *pool) lookup(h xxh3.Uint128) (kvcache.BlockID, bool) {
	for i := h.Lo & p.mask; p.index[i] != 0; i = (i + 1) & p.mask {
		if b := p.index[i] - 1; p.hash[b] == h {
			return kvcache.BlockID(b), true
		}
	}
	return 0, false
}

// unindex removes registered block b from the index (Knuth's algorithm R:
// later entries of the probe run move back into the hole).
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
		i = j
	}
	p.index[i] = 0
	p.nreg--
}

func (p *pool) unlink(b int32) {
	pr, nx := p.prev[b], p.next[b]
	p.next[pr] = nx
	p.prev[nx] = pr
}

func (p *pool) pushMRU(b int32) {
	s := int32(p.n)
	last := p.prev[s]
	p.next[last] = b
	p.prev[b] = last
	p.next[b] = s
	p.prev[s] = b
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
