package cachemgrv2

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
)

// This file holds what the Core adds for explainable caching and cache
// control (package doc, Explain and Retention): Explain with its miss
// reasons, the ghost record of evictions, retention priorities with their
// expiry, and the eviction policies. The tree and the core call it through
// one-line hooks (newNode, recycle, evictLeaf, register, Commit), so that
// the eviction code stays where it is.

var _ kvcache.Explainer = (*Core)(nil)

// EvictionPolicies are the Config.EvictionPolicy values a manager built on
// Core accepts, kvcache.EvictionLRU first ("" means it).
var EvictionPolicies = []string{kvcache.EvictionLRU, kvcache.EvictionLFU}

// CheckEvictionPolicy refuses (ErrInvalidConfig, prefixed with the manager's
// name) a Config.EvictionPolicy that is not one of EvictionPolicies or "".
func CheckEvictionPolicy(name, policy string) error {
	if policy == "" || slices.Contains(EvictionPolicies, policy) {
		return nil
	}
	return kvcache.Errorf(kvcache.KindInvalidConfig, "%s: eviction_policy = %q: must be one of %s (\"\" = %s)",
		name, policy, strings.Join(EvictionPolicies, ", "), kvcache.EvictionLRU)
}

// ---- retention: priorities, their expiry, the policy ----

// retention is the tree's eviction-order state beyond the heap itself.
type retention struct {
	lfu      bool    // Config.EvictionPolicy is lfu
	policy   uint8   // byLRU or byLFU: what decides among equal priorities
	now      int64   // the manager clock: the latest Now of a Lookup, Explain or Reserve item
	expClock int64   // the clock when expiry was last processed (expire)
	exp      []*Node // min-heap on Node.until of the nodes whose priority expires
	// heapPrio counts the eviction heap's nodes per priority, so that an
	// eviction knows whether priority decided it.
	heapPrio [kvcache.MaxPriority + 1]int32
	ghosts   ghosts
	// firsts lists the root's children by the hash of their tokens alone
	// (their keys mix in the salt), for MissCacheSalt.
	firsts map[uint64][]*Node
}

// What decided an eviction (ghost.by).
const (
	byLRU uint8 = iota
	byLFU
	byPriority
)

var byNames = [...]string{kvcache.EvictionLRU, kvcache.EvictionLFU, "priority"}

// maxGhosts bounds the ghost record: the last 2^20 evictions, whatever the
// pools' size (reuse distances are the workload's, not the cache's: a small
// cache evicts blocks that come back long after). It grows with the
// evictions (some 40 bytes each), so a manager that evicts little costs
// little.
const maxGhosts = 1 << 20

// configure sets the policy and the ghost record.
func (r *retention) configure(policy string, _ []int) {
	r.lfu = policy == kvcache.EvictionLFU
	r.policy = byLRU
	if r.lfu {
		r.policy = byLFU
	}
	r.ghosts = ghosts{max: maxGhosts}
}

// observe moves the manager clock to now when it is later.
func (t *Tree) observe(now int64) {
	t.ret.now = max(t.ret.now, now)
}

// expire re-keys every node whose priority expired at the clock: it falls
// back to DefaultPriority, and a node in the eviction heap moves to its new
// place. The Core calls it at the start of Reserve, before any eviction.
func (t *Tree) expire() {
	r := &t.ret
	for len(r.exp) > 0 && r.exp[0].until <= r.now {
		n := r.exp[0]
		t.touch(n)
		t.expRemove(n)
		in, hin := n.heapIdx >= 0, n.h.hidx > 0
		if in {
			t.heapRemove(n)
		}
		if hin {
			t.hremove(n) // the host heap orders by the same key
		}
		n.prio, n.until = DefaultPriority, 0
		t.setHot(n)
		if in {
			t.heapPush(n)
		}
		if hin {
			t.hpush(n)
		}
	}
	r.expClock = r.now
}

// retain gives node n the retention of a sequence (priority prio until
// until, 0 for ever). fresh: n was just stored for that sequence, so it
// takes it as it is and its hit count starts again; else n takes it only
// when prio is higher than n's effective priority, or equal with a later
// expiry. A priority whose expiry the clock passed is the default.
func (t *Tree) retain(n *Node, prio int8, until int64, fresh bool) {
	if until != 0 && until <= t.ret.now {
		prio, until = DefaultPriority, 0 // the sequence's priority is over already
	}
	t.touch(n) // the heap key may change (dirty.go)
	if fresh {
		n.hits = 0
		t.setRetention(n, prio, until)
		return
	}
	cur := n.prio
	if n.until != 0 && n.until <= t.ret.now {
		cur = DefaultPriority // expired; expire has not re-keyed it yet
	}
	if prio > cur || prio == cur && n.until != 0 && (until == 0 || until > n.until) {
		t.setRetention(n, prio, until)
	}
}

func (t *Tree) setRetention(n *Node, prio int8, until int64) {
	if prio == DefaultPriority {
		until = 0 // nothing to fall back from
	}
	if n.prio == prio && n.until == until {
		return
	}
	in, hin := n.heapIdx >= 0, n.h.hidx > 0
	if in {
		t.heapRemove(n)
	}
	if hin {
		t.hremove(n) // the host heap orders by the same key
	}
	n.prio, n.until = prio, until
	t.setHot(n)
	switch {
	case until != 0 && n.expIdx >= 0:
		t.expFix(int(n.expIdx))
	case until != 0:
		n.expIdx = int32(len(t.ret.exp))
		t.ret.exp = append(t.ret.exp, n)
		t.expUp(int(n.expIdx))
	case n.expIdx >= 0:
		t.expRemove(n)
	}
	if in {
		t.heapPush(n)
	}
	if hin {
		t.hpush(n)
	}
}

// forget drops what retention keeps of a node being recycled.
func (t *Tree) forget(n *Node) {
	if n.expIdx >= 0 {
		t.expRemove(n)
	}
	if n.parent == t.root {
		h := hashTokens(n.tokens)
		l := t.ret.firsts[h]
		if i := slices.Index(l, n); i >= 0 {
			l[i] = l[len(l)-1]
			l[len(l)-1] = nil
			l = l[:len(l)-1]
		}
		if len(l) == 0 {
			delete(t.ret.firsts, h)
		} else {
			t.ret.firsts[h] = l
		}
	}
}

// indexFirst lists a new child of the root under its tokens' hash.
func (t *Tree) indexFirst(n *Node) {
	if t.ret.firsts == nil {
		t.ret.firsts = map[uint64][]*Node{}
	}
	h := hashTokens(n.tokens)
	t.ret.firsts[h] = append(t.ret.firsts[h], n)
}

// expiry heap: min-heap on Node.until, intrusive index Node.expIdx.

func (t *Tree) expRemove(n *Node) {
	e := t.ret.exp
	i, last := int(n.expIdx), len(e)-1
	if i != last {
		t.expSwap(i, last)
	}
	e[last] = nil
	t.ret.exp = e[:last]
	n.expIdx = -1
	if i != last {
		t.expFix(i)
	}
}

func (t *Tree) expSwap(i, j int) {
	e := t.ret.exp
	e[i], e[j] = e[j], e[i]
	e[i].expIdx, e[j].expIdx = int32(i), int32(j)
}

func (t *Tree) expFix(i int) {
	t.expUp(i)
	e := t.ret.exp
	for {
		l := 2*i + 1
		if l >= len(e) {
			return
		}
		m := l
		if r := l + 1; r < len(e) && e[r].until < e[l].until {
			m = r
		}
		if e[m].until >= e[i].until {
			return
		}
		t.expSwap(i, m)
		i = m
	}
}

func (t *Tree) expUp(i int) {
	e := t.ret.exp
	for i > 0 {
		p := (i - 1) / 2
		if e[i].until >= e[p].until {
			return
		}
		t.expSwap(i, p)
		i = p
	}
}

// checkRetention is the deep self-check of retention (Core.check): the
// expiry heap lists, heap-ordered at their indexes, exactly attached nodes
// with an expiry, none expired at the last expire; every node of the
// eviction heap has a priority in range and, with an expiry, is in the
// expiry heap; the per-priority counts of the eviction heap are right.
// (Tree.Check verifies the eviction heap's order with less, so its keys.)
func (t *Tree) checkRetention() []string {
	var v []string
	bad := func(format string, args ...any) { v = append(v, fmt.Sprintf(format, args...)) }
	r := &t.ret
	for i, n := range r.exp {
		switch {
		case int(n.expIdx) != i:
			bad("retention: expiry heap entry %d records index %d", i, n.expIdx)
		case n.until == 0 || n.prio == DefaultPriority:
			bad("retention: node %p in the expiry heap with priority %d until %d", n, n.prio, n.until)
		case n.allIdx < 0:
			bad("retention: node %p in the expiry heap is not attached", n)
		case n.until <= r.expClock:
			bad("retention: node %p: priority %d expired at %d, not re-keyed at %d", n, n.prio, n.until, r.expClock)
		}
		if i > 0 && n.until < r.exp[(i-1)/2].until {
			bad("retention: expiry heap order broken at %d", i)
		}
	}
	var counts [kvcache.MaxPriority + 1]int32
	for _, n := range t.heap {
		if n.prio < kvcache.MinPriority || int(n.prio) > kvcache.MaxPriority {
			bad("retention: node %p: priority %d outside %d..%d", n, n.prio, kvcache.MinPriority, kvcache.MaxPriority)
			continue
		}
		counts[n.prio]++
		if n.until != 0 && (n.expIdx < 0 || int(n.expIdx) >= len(r.exp) || r.exp[n.expIdx] != n) {
			bad("retention: node %p: priority %d until %d but not in the expiry heap", n, n.prio, n.until)
		}
		if n.until == 0 && n.expIdx >= 0 {
			bad("retention: node %p: no expiry but in the expiry heap", n)
		}
	}
	if counts != r.heapPrio {
		bad("retention: eviction heap counts per priority %v, recounted %v", r.heapPrio, counts)
	}
	return v
}

// seqRetention is the retention a new sequence's item asks for: its
// priority (0: DefaultPriority) and when it ends (0: never). checkPriority
// must have passed.
func seqRetention(it *kvcache.ReserveItem) (int8, int64) {
	if it.Priority == 0 || it.Priority == int(DefaultPriority) {
		return DefaultPriority, 0
	}
	if it.PriorityDuration == 0 {
		return int8(it.Priority), 0
	}
	return int8(it.Priority), it.Now + it.PriorityDuration
}

// checkPriority says why an item's retention is invalid ("" when it is not).
func checkPriority(it *kvcache.ReserveItem) string {
	switch {
	case it.Priority != 0 && (it.Priority < kvcache.MinPriority || it.Priority > kvcache.MaxPriority):
		return fmt.Sprintf("invalid: seq %d: priority %d outside %d..%d (0 = default %d)",
			it.Seq, it.Priority, kvcache.MinPriority, kvcache.MaxPriority, kvcache.DefaultPriority)
	case it.PriorityDuration < 0:
		return fmt.Sprintf("invalid: seq %d: priority_duration %d must be >= 0 (0 = as long as cached)", it.Seq, it.PriorityDuration)
	}
	return ""
}

// reused applies a new sequence's reuse to the tree once it stands (its
// first Commit, or its Release before one; an Unreserve leaves no trace):
// every node its Reuse covered counts a hit and takes its retention when
// higher.
func (c *Core) reused(s *Seq) {
	for _, n := range s.path[:s.reusePend] {
		c.tree.touch(n)
		n.hits++
		c.tree.retain(n, s.prio, s.until, false)
	}
	s.reusePend = 0
}

// ---- the ghost record of evictions ----

// ghosts remembers the latest evictions by block position (Node.pos), at
// most max of them; the oldest is forgotten first (FIFO), and a forgotten
// eviction explains as MissNeverStored.
type ghosts struct {
	m    ghostSet
	ring []ghostRec // evictions in order, a ring once full
	next int        // the ring slot the next eviction overwrites, once full
	max  int
}

// ghostRec is one eviction in the ring: its position and when it was
// evicted (kept here, not in the index, which an eviction probes: 16
// bytes a slot there, four to a cache line).
type ghostRec struct {
	pos uint64
	at  int64
}

// ghost is a remembered eviction as the ghost record answers it.
type ghost struct {
	at   int64
	tier uint8 // 0 device, 1 host
	by   uint8 // byLRU, byLFU, byPriority
}

// ghostEntry is a position's entry in the index: the ring slot of its
// latest eviction (an older ring entry of the same position does not
// forget it) and how it was evicted.
type ghostEntry struct {
	slot int32
	tier uint8
	by   uint8
}

func (g *ghosts) add(pos uint64, tier kvcache.Tier, by uint8, at int64) {
	if g.max == 0 {
		return
	}
	slot := len(g.ring)
	if slot < g.max {
		g.ring = append(g.ring, ghostRec{pos: pos, at: at})
	} else {
		slot = g.next
		if i, ok := g.m.find(g.ring[slot].pos); ok && g.m.slots[i].slot == int32(slot) {
			g.m.del(i)
		}
		g.ring[slot] = ghostRec{pos: pos, at: at}
		g.next = (slot + 1) % g.max
	}
	e := ghostEntry{slot: int32(slot), by: by}
	if tier == kvcache.TierHost {
		e.tier = 1
	}
	g.m.put(pos, e)
}

// get is pos's latest remembered eviction, if any.
func (g *ghosts) get(pos uint64) (ghost, bool) {
	e, ok := g.m.get(pos)
	if !ok {
		return ghost{}, false
	}
	return ghost{at: g.ring[e.slot].at, tier: e.tier, by: e.by}, true
}

// ghostSet is the ghost record's index, position -> entry: open addressing
// with linear probing and backward-shift deletion, grown by doubling at 3/4
// load. Once full the record deletes as often as it adds; Go's map left
// deleted slots behind that every insert then probed past (the hot spot of
// an eviction), and here a deletion leaves none. Positions are mixPos
// hashes, so their low bits index the table directly. TestGhostSet holds
// it to a map.
type ghostSet struct {
	slots []ghostSlot // len a power of two (or 0)
	n     int         // used slots
}

// ghostSlot is one slot of the index: 16 bytes, the entry's fields
// inlined beside used.
type ghostSlot struct {
	pos      uint64
	slot     int32
	tier, by uint8
	used     bool
}

func (s *ghostSlot) entry() ghostEntry { return ghostEntry{slot: s.slot, tier: s.tier, by: s.by} }

// find returns pos's slot and true, or the empty slot where it would go
// and false (0, false on an empty table).
func (s *ghostSet) find(pos uint64) (int, bool) {
	if len(s.slots) == 0 {
		return 0, false
	}
	mask := len(s.slots) - 1
	for i := int(pos) & mask; ; i = (i + 1) & mask {
		switch e := &s.slots[i]; {
		case !e.used:
			return i, false
		case e.pos == pos:
			return i, true
		}
	}
}

// get is pos's entry, if any.
func (s *ghostSet) get(pos uint64) (ghostEntry, bool) {
	if i, ok := s.find(pos); ok {
		return s.slots[i].entry(), true
	}
	return ghostEntry{}, false
}

// put sets pos's entry.
func (s *ghostSet) put(pos uint64, e ghostEntry) {
	if 4*(s.n+1) > 3*len(s.slots) {
		old := s.slots
		s.slots = make([]ghostSlot, max(2*len(old), 16))
		for _, o := range old {
			if o.used {
				i, _ := s.find(o.pos)
				s.slots[i] = o
			}
		}
	}
	i, ok := s.find(pos)
	if !ok {
		s.n++
	}
	s.slots[i] = ghostSlot{pos: pos, slot: e.slot, tier: e.tier, by: e.by, used: true}
}

// del empties used slot i, shifting back the entries after it in its probe
// run that may move into the hole (those whose home is not between the hole
// and them), so that every entry stays reachable from its home.
func (s *ghostSet) del(i int) {
	mask := len(s.slots) - 1
	s.n--
	for j := i; ; {
		j = (j + 1) & mask
		e := s.slots[j]
		if !e.used {
			break
		}
		if home := int(e.pos) & mask; (j-home)&mask >= (j-i)&mask {
			s.slots[i] = e
			i = j
		}
	}
	s.slots[i] = ghostSlot{}
}

// evicted records that n just lost its pages in tier (the hook at the point
// a node loses its pages; "device" for the device tier's eviction): by the
// policy, or by priority when an eviction candidate of a higher priority
// was left in the heap.
func (t *Tree) evicted(n *Node, tier kvcache.Tier) {
	by := t.ret.policy
	if tier == kvcache.TierDevice {
		for p := int(n.prio) + 1; p <= kvcache.MaxPriority; p++ {
			if t.ret.heapPrio[p] > 0 {
				by = byPriority
				break
			}
		}
	}
	t.ret.ghosts.add(n.pos, tier, by, t.ret.now)
}

// mixPos is the position hash of a block keyed key under a parent at
// position parent (the root is at 0).
func mixPos(parent, key uint64) uint64 {
	p := parent*0x9E3779B97F4A7C15 + key
	p ^= p >> 32
	p *= 0xD6E8FEB86659FD93
	return p ^ p>>32
}

// Priority is the node's retention priority now (kvcache.MinPriority..
// MaxPriority; an expiry takes effect at the next Reserve), for managers
// whose own cache entries live on nodes (mamba's snapshots).
func (n *Node) Priority() int { return int(n.prio) }

// ---- Explain ----

// Explain implements kvcache.Explainer: per item, Tokens is what Lookup
// returns (the same walk, walk), HostTokens the matched tokens whose nodes
// sit on the host tier, and Miss why the match stopped (package doc,
// Explain). Like Lookup it changes nothing but the LookupTokens counter and
// the clock.
func (c *Core) Explain(ctx context.Context, items []kvcache.LookupItem) ([]kvcache.Explanation, error) {
	if err := c.ready(ctx, "Explain"); err != nil {
		return nil, err
	}
	out := make([]kvcache.Explanation, len(items))
	for i := range items {
		p := items[i].Prompt
		c.tree.observe(items[i].Now)
		c.stats.LookupTokens += int64(len(p))
		out[i] = c.explain(items[i].CacheSalt, p)
	}
	return out, nil
}

func (c *Core) explain(salt string, p []int32) kvcache.Explanation {
	if !c.reuse {
		return kvcache.Explanation{Miss: kvcache.MissReuseOff}
	}
	if len(p) <= 1 || len(c.dev) == 0 {
		return kvcache.Explanation{Miss: kvcache.MissPartialBlock}
	}
	tpb := c.tpb
	best, blocks, end := c.walk(salt, p)
	e := kvcache.Explanation{Tokens: best}
	e.HostTokens = c.hostTokens(best, blocks, end)
	switch {
	case best < blocks*tpb:
		e.Miss = kvcache.MissSnapshot // the Hooks allow no reuse further (mamba: no snapshot there)
	case blocks == (len(p)-1)/tpb:
		e.Miss = kvcache.MissPartialBlock
	default:
		c.missAt(&e, salt, p, blocks, end)
	}
	return e
}

// missAt explains why prompt block i, under parent (the end of the match),
// is not cached: a live sequence is computing it, it was evicted (the ghost
// record), it is cached under another salt (first block only), or it was
// never stored.
func (c *Core) missAt(e *kvcache.Explanation, salt string, p []int32, i int, parent *Node) {
	tpb := c.tpb
	blk := p[i*tpb : (i+1)*tpb]
	pos := mixPos(parent.pos, c.tree.key(parent, salt, blk))
	switch g, ok := c.tree.ret.ghosts.get(pos); {
	case c.inFlight(salt, p, i, pos):
		e.Miss = kvcache.MissInFlight
	case ok:
		e.Miss, e.EvictedTier, e.EvictedBy, e.EvictedAt = kvcache.MissEvicted, kvcache.TierDevice, byNames[g.by], g.at
		if g.tier == 1 {
			e.EvictedTier = kvcache.TierHost
		}
	case i == 0 && c.tree.otherSalt(salt, blk):
		e.Miss = kvcache.MissCacheSalt
	default:
		e.Miss = kvcache.MissNeverStored
	}
}

// inFlight reports whether a live sequence holds prompt block i (at
// position pos) among the prompt blocks it has not committed to the tree
// yet: same salt, same block tokens, same position hash (so the same
// blocks before it). A sequence's position hashes are computed once, on
// this path only (Seq.posh).
func (c *Core) inFlight(salt string, p []int32, i int, pos uint64) bool {
	tpb := c.tpb
	blk := p[i*tpb : (i+1)*tpb]
	for _, s := range c.seqs {
		if s.regStop || s.salt != salt || len(s.path) > i || s.nblk <= i ||
			!sameTokens(s.PromptBlock(i, tpb), blk) {
			continue
		}
		for j := len(s.posh); j <= i; j++ {
			prev := uint64(0)
			if j > 0 {
				prev = s.posh[j-1]
			}
			key := hashTokens(s.PromptBlock(j, tpb))
			if j == 0 {
				key = saltKey(key, s.salt)
			}
			s.posh = append(s.posh, mixPos(prev, key))
		}
		if s.posh[i] == pos {
			return true
		}
	}
	return false
}

// otherSalt reports whether the tree caches first block blk, with all its
// pages, under a salt other than salt.
func (t *Tree) otherSalt(salt string, blk []int32) bool {
	for _, n := range t.ret.firsts[hashTokens(blk)] {
		if n.salt != salt && n.complete() && sameTokens(n.tokens, blk) {
			return true
		}
	}
	return false
}
