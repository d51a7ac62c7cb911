package cachemgrv1

import (
	"context"

	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
	"github.com/zeebo/xxh3"
)

var _ kvcache.Explainer = (*Manager)(nil)

// Eviction rules, as a ghost records them (EvictedBy).
const (
	ruleLRU uint8 = iota
	ruleLFU
	rulePriority
)

var ruleNames = [...]string{kvcache.EvictionLRU, kvcache.EvictionLFU, "priority"}

// maxGhosts bounds one paged pool's ghost record (some 64 bytes an entry
// with its index slots: at most 64 MiB a pool).
const maxGhosts = 1 << 20

// ghost remembers the latest evictions of one paged pool (device and host
// tier), hash → tier, rule and clock, so Explain can say a block was
// evicted rather than never stored. It holds the last cap evictions, the
// oldest forgotten first (a ring); a forgotten eviction reads as
// never_stored. An eviction of a hash it holds replaces the old entry. The
// index is open addressing on hash.Lo like the pools' (at most half full,
// backward-shift deletion), grown by doubling up to 2 × cap, so adding
// allocates nothing once the ring is full; an index slot keeps the hash's
// Lo next to the ring slot, so probing and deleting touch the ring only
// for a match (the index is large and the ring larger: every avoided
// access is a cache miss saved on the eviction path).
type ghost struct {
	cap   int
	ring  []ghostEntry
	head  int // the slot the next entry overwrites once the ring is full
	live  int // entries in index
	index []ghostSlot
	mask  uint64
}

// ghostSlot is one index slot: ring slot s+1 (0 = empty) of a hash whose
// low 64 bits are lo.
type ghostSlot struct {
	lo uint64
	s  int32
}

type ghostEntry struct {
	h    xxh3.Uint128
	when int64
	tier kvcache.Tier
	by   uint8
	live bool // in index
}

func newGhost(capacity int) ghost {
	g := ghost{cap: max(1, min(capacity, maxGhosts))}
	g.index = make([]ghostSlot, 64)
	g.mask = 63
	return g
}

func (g *ghost) add(h xxh3.Uint128, tier kvcache.Tier, by uint8, when int64) {
	if 2*(g.live+1) > len(g.index) {
		g.grow()
	}
	if s, ok := g.slot(h); ok {
		g.remove(s)
	}
	e := ghostEntry{h: h, when: when, tier: tier, by: by, live: true}
	s := len(g.ring)
	if s < g.cap {
		g.ring = append(g.ring, e)
	} else {
		s = g.head
		if g.ring[s].live {
			g.remove(int32(s))
		}
		g.ring[s] = e
		g.head = (s + 1) % g.cap
	}
	g.insert(s)
}

func (g *ghost) find(h xxh3.Uint128) (ghostEntry, bool) {
	s, ok := g.slot(h)
	if !ok {
		return ghostEntry{}, false
	}
	return g.ring[s], true
}

func (g *ghost) slot(h xxh3.Uint128) (int32, bool) {
	for i := h.Lo & g.mask; g.index[i].s != 0; i = (i + 1) & g.mask {
		if e := g.index[i]; e.lo == h.Lo && g.ring[e.s-1].h == h {
			return e.s - 1, true
		}
	}
	return 0, false
}

func (g *ghost) insert(s int) {
	lo := g.ring[s].h.Lo
	i := lo & g.mask
	for g.index[i].s != 0 {
		i = (i + 1) & g.mask
	}
	g.index[i] = ghostSlot{lo: lo, s: int32(s) + 1}
	g.live++
}

// remove takes ring slot s out of the index (pool.unindex's algorithm).
func (g *ghost) remove(s int32) {
	i := g.ring[s].h.Lo & g.mask
	for g.index[i].s != s+1 {
		i = (i + 1) & g.mask
	}
	for j := i; ; {
		j = (j + 1) & g.mask
		v := g.index[j]
		if v.s == 0 {
			break
		}
		k := v.lo & g.mask
		if i <= j && i < k && k <= j || i > j && (i < k || k <= j) {
			continue
		}
		g.index[i] = v
		i = j
	}
	g.index[i] = ghostSlot{}
	g.ring[s].live = false
	g.live--
}

func (g *ghost) grow() {
	g.index = make([]ghostSlot, 2*len(g.index))
	g.mask = uint64(len(g.index) - 1)
	g.live = 0
	for s := range g.ring {
		if g.ring[s].live {
			g.insert(s)
		}
	}
}

// walk is the one prefix match behind Lookup and Explain (Reserve's check
// of Reuse applies the same rule, held, to the hashes it has): the first n
// full blocks of prompt (at most limit) are held by
// every pool now, host of them by some pool's host tier only (taking them
// costs a host→device copy). When n < limit, next is the hash of block n,
// the first one missing.
func (m *Manager) walk(prompt []int32, salt string, limit int) (n, host int, next xxh3.Uint128) {
	parent := saltRoot(salt)
	for ; n < limit; n++ {
		h := m.h.next(parent, prompt[n*m.tpb:(n+1)*m.tpb])
		ok, onHost := m.held(h)
		if !ok {
			return n, host, h
		}
		if onHost {
			host++
		}
		parent = h
	}
	return n, host, xxh3.Uint128{}
}

// held reports whether every pool can serve hash h now, and whether some
// pool serves it from its host tier only.
func (m *Manager) held(h xxh3.Uint128) (ok, host bool) {
	for pi, p := range m.paged {
		if _, ok := p.live(h); ok {
			continue
		}
		if m.host == nil {
			return false, false
		}
		if _, _, ok := m.shared(pi, h); !ok {
			if _, ok := m.host[pi].live(h); !ok {
				return false, false
			}
		}
		host = true
	}
	return true, host
}

// lookupLimit is how many full blocks of prompt a match may cover: every
// full block before the last token.
func (m *Manager) lookupLimit(prompt []int32) int {
	if len(prompt) <= m.tpb {
		return 0
	}
	return (len(prompt) - 1) / m.tpb
}

// Explain implements kvcache.Explainer: per item, Tokens is what Lookup
// returns (the same walk), HostTokens the matched tokens of blocks that
// some pool serves from its host tier only (each costs a host→device copy
// when reused; Grant.HostReused counts the same way), and Miss the reason
// the next prompt block is not matched, checked in this order:
//
//   - reuse_off: block reuse is off on this stage;
//   - partial_block: the match reached the last full block before the
//     prompt's last token;
//   - in_flight: a live sequence's prompt has the block but has not
//     committed it yet (it is being computed), or a pool holds it pending
//     (its copy belongs to a reservation not yet committed);
//   - cache_salt: the first paged pool holds the same tokens (the whole
//     prefix) under another cache salt, or unsalted;
//   - evicted: the first pool missing the block evicted it (EvictedTier:
//     device when it vanished from the device tier, without a host tier or
//     with one that had no room; host when the host tier evicted it;
//     EvictedBy the policy, or "priority" when the policy alone would have
//     evicted a block of a higher retention priority; EvictedAt the
//     manager's clock then, the latest Now it had seen), as far as the
//     pool's ghost record remembers (see ghost);
//   - never_stored otherwise.
//
// Like Lookup it changes nothing but the LookupTokens counter and the
// clock. The slice is the caller's.
func (m *Manager) Explain(ctx context.Context, items []kvcache.LookupItem) ([]kvcache.Explanation, error) {
	if err := m.ready(ctx, "Explain"); err != nil {
		return nil, err
	}
	out := make([]kvcache.Explanation, len(items))
	for i := range items {
		it := &items[i]
		m.c.lookupTokens += int64(len(it.Prompt))
		m.now = max(m.now, it.Now)
		ex := &out[i]
		if !m.reuse {
			ex.Miss = kvcache.MissReuseOff
			continue
		}
		limit := m.lookupLimit(it.Prompt)
		n, host, next := m.walk(it.Prompt, it.CacheSalt, limit)
		ex.Tokens, ex.HostTokens = n*m.tpb, host*m.tpb
		if n == limit {
			ex.Miss = kvcache.MissPartialBlock
			continue
		}
		m.why(ex, it, n, next)
	}
	return out, nil
}

// why fills in the reason prompt block n (hash h) of it is not held.
func (m *Manager) why(ex *kvcache.Explanation, it *kvcache.LookupItem, n int, h xxh3.Uint128) {
	if m.computing(n, h) {
		ex.Miss = kvcache.MissInFlight
		return
	}
	first := -1 // the first pool that cannot serve h
	for pi, p := range m.paged {
		if b, ok := p.lookup(h); ok {
			if p.pend != nil && p.pend[b] {
				ex.Miss = kvcache.MissInFlight
				return
			}
			continue
		}
		if m.host != nil {
			if b, ok := m.host[pi].lookup(h); ok {
				if m.host[pi].pend[b] {
					ex.Miss = kvcache.MissInFlight
					return
				}
				continue
			}
		}
		if first < 0 {
			first = pi
		}
	}
	if first < 0 { // every pool holds it: only a shared promotion of a Reserve in progress does
		ex.Miss = kvcache.MissInFlight
		return
	}
	if first == 0 && m.otherSalt(it, n, h) {
		ex.Miss = kvcache.MissCacheSalt
		return
	}
	if g, ok := m.ghosts[first].find(h); ok {
		ex.Miss = kvcache.MissEvicted
		ex.EvictedTier, ex.EvictedBy, ex.EvictedAt = g.tier, ruleNames[g.by], g.when
		return
	}
	ex.Miss = kvcache.MissNeverStored
}

// otherSalt reports whether the first paged pool (either tier) holds
// prompt block n of it under another salt than it.CacheSalt, which the
// pool lacks under its own (h). Unsalted blocks are found in the index
// under the salt-free chain; salted ones in the pool's salt counts (kept
// only once a salted sequence was seen, see Manager.saltOn).
func (m *Manager) otherSalt(it *kvcache.LookupItem, n int, h xxh3.Uint128) bool {
	u := h
	if it.CacheSalt != "" {
		m.hashes = m.h.chain(m.hashes[:0], "", it.Prompt, n+1)
		u = m.hashes[n]
		if _, ok := m.paged[0].lookup(u); ok {
			return true
		}
		if m.host != nil {
			if _, ok := m.host[0].lookup(u); ok {
				return true
			}
		}
	}
	return m.paged[0].salt[u] > 0
}

// tick advances the clock to now and lets every pool expire priorities.
func (m *Manager) tick(now int64) {
	if now <= m.now && now <= m.refreshed {
		return
	}
	m.now = max(m.now, now)
	m.refreshed = m.now
	for _, p := range m.paged {
		if len(p.exq) > 0 && p.exq[0].at <= m.now || p.at < m.now {
			p.refresh(m.now)
		}
	}
	for _, p := range m.host {
		if len(p.exq) > 0 && p.exq[0].at <= m.now || p.at < m.now {
			p.refresh(m.now)
		}
	}
}

// saltOn starts the salt-free index of the first paged pool and its host
// pool, at the first salted sequence: before it no salted block exists.
func (m *Manager) saltOn() {
	if m.paged[0].salted != nil {
		return
	}
	idx := map[xxh3.Uint128]int32{}
	m.paged[0].trackSalt(idx)
	if m.host != nil {
		m.host[0].trackSalt(idx)
	}
}

// computing reports whether a live sequence's prompt has block n with
// chain hash h but has not committed it yet. A chain hash names the whole
// prefix, so it can only be the sequence's block n: one comparison per live
// sequence (at most max_batch_size × stages), and nothing to maintain on
// the Reserve and Commit paths.
func (m *Manager) computing(n int, h xxh3.Uint128) bool {
	for _, s := range m.seqs {
		if n >= s.registered && n < len(s.hashes) && s.hashes[n] == h {
			return true
		}
	}
	return false
}
