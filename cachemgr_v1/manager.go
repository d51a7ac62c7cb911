// Package cachemgrv1 is a KV cache manager in the style of TensorRT-LLM's V1
// manager, implementing the plugins/v1/kvcache contract in-process.
//
// # Layout
//
// Configure groups the stage's layers by attention window. Each distinct
// window gets one fixed block pool whose block holds TokensPerBlock tokens of
// every paged buffer of every layer with that window (a DSA layer's latent and
// indexer key share the block's life cycle; an MTP layer is one more layer).
// Windows at least max_seq_len + max_draft_tokens wide are full attention.
// State buffers (Mamba conv and SSM state) live in one "ssm" pool of
// MaxBatchSize × Stages slots, one per resident sequence, carved out of the
// budget first. The rest of DeviceBytes is split across the paged pools in
// proportion to their bytes per token, so every paged pool has the same number
// of blocks; sliding-window pools get no discount for their window, which
// keeps the guarantee simple: one max_seq_len request (plus drafts), and one
// max_num_tokens chunk, always fit, or Configure fails with ErrInvalidConfig.
// Pools are listed full attention first, then windows ascending, then "ssm".
//
// # Ledger
//
// Per sequence the manager keeps history, capacity (token-granular; a pool
// table holds ceil(capacity/TokensPerBlock) blocks), hold, and the outstanding
// reservation (Tokens, Draft) with an undo record. Reserve grows capacity to
// max(capacity, history+Tokens+Draft, Hold); Hold is sticky (the sequence's
// hold becomes the largest Hold asked for until Release). Commit sets
// history += Accepted and capacity = max(history, hold), freeing the tail
// blocks beyond it: the rewind of rejected drafts comes from the ledger, never
// from a width the caller recomputes. Commit never allocates.
//
// # Bad items
//
// Reserve never returns an error for a bad item: the item is denied with a
// Reason starting "invalid:" and nothing else is affected (a Reserve error
// would also lose the other items' grants on the wire). Commit, Unreserve
// and Release apply every valid item and then return one item-scoped
// *kvcache.Error (kind KindInvalidArg, Seqs = the bad sequences); a bad
// Commit item leaves its sequence and reservation untouched.
//
// # Table deltas
//
// Grants carry, per pool whose table changed since the worker was last told,
// TableDelta{From, Blocks} such that table[:From] ++ Blocks is the table
// (Commit's tail shrink is told lazily, by the next Reserve of the
// sequence). In sliding-window pools, blocks that fell wholly before
// history - Window are released at Commit and their table positions become
// -1 in Inspect; the worker is not told (it never reads them).
//
// # Prefix reuse
//
// With EnableBlockReuse (and no state buffers on the stage), each full prompt
// block is named by a 128-bit xxh3 hash chain (parent hash + the block's
// tokens). As history passes a full prompt block, Commit registers the
// sequence's block under that hash in every pool, unless another block already
// holds it. Release drops references in reverse table order; a registered
// block with no reference becomes cached (evictable), others become free.
// Allocation takes free blocks first, then evicts the first cached block in
// eviction order (see Retention; by default the least recently used).
// Because tail blocks are released first, a chain's deeper blocks are older
// and go first; a cached child can outlive its evicted
// parent, which is harmless: Lookup stops at the first missing hash, and the
// child is evicted in its turn.
//
// A request's cache salt starts its chain: the first block's parent is the
// salt's hash (zero without a salt, so unsalted chains are unchanged), and
// two salts never share a block. With Config.KVEvents the first paged pool's
// registrations and evictions are reported as KV events (events.go), and
// so are the hashes its host pool holds.
//
// # Host tier
//
// With host_cache_size > 0 (and reuse on) every paged pool has a host pool
// of the same block size, listed after the device pools. A cached block
// that an allocation evicts is copied to the host tier instead of
// vanishing, and a reservation whose Reuse covers host blocks brings them
// back into fresh device blocks; the copies travel in Grant.Copies. The
// host tier evicts in the same order as the device (see Retention), with
// each block's priority and hits carried along. hostcache.go has the rules.
// Without a host tier nothing of it runs and grants carry no copies.
//
// # Explain
//
// The manager is a kvcache.Explainer (explain.go). Lookup and Explain share
// one walk over the prompt's chain (walk), so Explain's Tokens is Lookup's
// answer by construction; the walk also counts the matched blocks some pool
// serves from its host tier only (HostTokens: each costs a host→device
// copy, as Grant.HostReused counts them), which Lookup ignores at no extra
// cost. The reason for the first missing block is looked up only by
// Explain: in-flight by comparing the live sequences' uncommitted prompt
// hashes at that position (nothing is maintained for it on the Reserve or
// Commit paths); cache salt through the salt-free chain, looked up in the
// first pool's index (unsalted blocks) and in a count of salted blocks by
// salt-free hash, kept for the first paged pool and its host pool once a
// salted sequence was seen; evictions in a per-pool ghost record (hash →
// tier, rule, clock) of the last maxGhosts evictions, whatever the pool's
// size (reuse distances are a property of the workload, not of the cache:
// a small cache evicts blocks that come back long after), the oldest
// forgotten first: a forgotten eviction reads as never_stored. The record
// grows with the evictions, so a pool that evicts little costs little. The clock is the latest Now of any Lookup,
// Explain or Reserve item.
//
// # Retention and eviction policies
//
// A new sequence's Priority (1..100, 0 = DefaultPriority 35; others are
// denied "invalid:") and PriorityDuration (from the item's Now) go to the
// blocks it registers; a block it reuses, or that it would have
// registered but another block holds, takes its priority when higher (the
// later expiry when equal). Every pool, device and host, evicts the lowest
// priority first, then by Config.EvictionPolicy: "lru" (""), the least
// recently cached; "lfu", the fewest reuse hits since the content was
// stored (carried across tiers), the least recently cached among equals.
// Each priority level is a list (LRU, O(1)) or a heap (LFU, O(log n)) and
// a bitmap finds the lowest non-empty level (pool.go). When the clock
// passes a block's expiry (Reserve refreshes the pools as it advances), the
// block falls back to DefaultPriority at its old place in the policy order.
// An eviction is reported as decided by "priority" when the policy alone
// (all levels merged) would have taken another block.
//
// # Concurrency and allocation
//
// A Manager is not safe for concurrent use (the contract calls it from one
// goroutine at a time). In steady state Commit does not allocate and Reserve
// allocates only the slices it returns (one for the grants and, when some
// table changed, two for all deltas of the call); the ghost record, the
// expiry heaps and the LFU heaps grow to their bound first (amortized).
//
// # Self-check
//
// Inspect with Tables runs check.go's deep self-check: device and state
// pools are verified whole, host pools (which can hold millions of blocks)
// only where blocks changed since the last check, which proves as much
// because every write to a block's state marks it (checkHostPool).
package cachemgrv1

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
	"github.com/zeebo/xxh3"
)

// Name and Version identify the manager in Info.
const (
	Name    = "cachemgr-v1"
	Version = "0.1.0"
)

var _ kvcache.Manager = (*Manager)(nil)

// Manager is a V1-style cache manager for one pipeline stage. The zero value
// is not usable; call New, then Configure.
type Manager struct {
	configured bool
	cfg        kvcache.Config // scalars only; slices are not retained
	tpb        int
	limit      int // MaxSeqLen + MaxDraftTokens: the most capacity one sequence may ask for
	reuse      bool
	names      []string // pool names, Layout order

	paged []*pool // paged pools, ids 0..len-1
	host  []*pool // host pool of each paged pool (ids len(paged)..); nil without a host tier
	fresh []fresh // per paged pool with a host tier: this Reserve call's promotions
	ssm   *pool   // state pool (id len(paged)); nil without state buffers

	seqs  map[kvcache.SeqID]*sequence
	spare []*sequence
	h     hasher

	// Per-call scratch, reused.
	hashes []xxh3.Uint128
	staged []stagedDelta
	blocks []kvcache.BlockID
	spans  []span
	copies []kvcache.Copy // this Reserve call's tier copies, in order
	cur    *sequence      // the sequence whose reservation is being applied
	// hint[i] is the sequence of item i of the last Reserve call. Batches
	// tend to repeat their order step after step, so Reserve and Commit
	// find sequences here before asking the map.
	hint []*sequence
	// The self-check's per-block scratch (check.go), as large as the
	// largest pool checked so far: a check clears what it uses instead of
	// allocating two arrays the size of each pool (millions of blocks on a
	// cpu stage's default memory) on every call.
	chkRefs  []int32
	chkWhere []uint8

	c  counters
	ev events

	// Explain and retention (explain.go).
	rule      uint8 // the policy: ruleLRU or ruleLFU
	now       int64 // the clock: the latest Now of a Lookup, Explain or Reserve item
	refreshed int64 // the clock the pools last expired priorities at
	ghosts    []ghost
	fromHost  []bool // per reused position of the item being reserved: some pool took it from the host tier
	hostBlock int    // positions of the last granted item taken from the host tier
}

type counters struct {
	lookupTokens, reusedTokens, denials int64
	offloaded, promoted                 int64 // host tier: blocks copied device→host, host→device
	reclaimed                           int64 // host tier: hashes a device commit took back from the host
}

type stagedDelta struct{ pool, from, off, n int }

type span struct{ grant, from, to, cfrom, cto int }

// sequence is one request's ledger and tables on this stage.
type sequence struct {
	id                  kvcache.SeqID
	live                bool // false once dropped (the struct may wait in spare)
	history, capacity   int
	hold                int
	reserved, isNew     bool
	resTokens, resDraft int
	reused              int // tokens taken from the cache when created

	// Undo record of the outstanding reservation (existing sequences).
	undoCap, undoHold           int
	undoLen, undoTold, undoKeep []int32

	tables [][]kvcache.BlockID // per paged pool; len == ceil(capacity/tpb)
	stale  []int32             // per paged pool: leading positions released (windowed pools)
	told   []int32             // per paged pool: table length the worker was last told
	keep   []int32             // per paged pool: leading positions unchanged since then
	slot   kvcache.BlockID     // state slot; noBlock without a state pool

	hashes     []xxh3.Uint128 // chain hashes of the full prompt blocks (reuse on)
	registered int            // prompt blocks registered so far
	prompt     []int32        // the full prompt blocks, kept only with KV events on
	moved      []move         // host tier: pending blocks of the outstanding reservation
	prio       uint8          // retention priority of the blocks it stores
	exp        int64          // when prio ends; 0 = never
	sfree      []xxh3.Uint128 // salted sequences: the prompt's chain without the salt
	// evicted is what the outstanding reservation's allocations took from
	// the cache (undo.go): put back by an Unreserve.
	evicted []undone
}

// New returns an unconfigured manager.
func New() *Manager { return &Manager{} }

// Info describes the manager. It never fails except for a done ctx.
func (m *Manager) Info(ctx context.Context) (kvcache.Info, error) {
	if err := ctx.Err(); err != nil {
		return kvcache.Info{}, err
	}
	return kvcache.Info{
		Name:      Name,
		Version:   Version,
		Protocols: []int{kvcache.ProtocolVersion},
		Capabilities: kvcache.Capabilities{
			Mixers:           slices.Clone(supportedMixers),
			PrefixReuse:      true,
			HostTier:         false,
			SSMState:         true,
			SSMReuse:         false,
			CacheSalt:        true,
			KVEvents:         true,
			Explain:          true,
			Retention:        true,
			EvictionPolicies: slices.Clone(policies),
			Fork:             true,
		},
	}, nil
}

// Configure lays out the pools (see the package doc) and resets all state:
// calling it again drops every sequence and cached block. Errors are
// ErrInvalidConfig naming the field, the value and the limit, or the numbers
// and the fix when the budget cannot hold one max_seq_len request or one
// max_num_tokens chunk.
func (m *Manager) Configure(ctx context.Context, cfg kvcache.Config) (kvcache.Layout, error) {
	if err := ctx.Err(); err != nil {
		return kvcache.Layout{}, err
	}
	layout, plans, err := plan(cfg)
	if err != nil {
		return kvcache.Layout{}, err
	}
	*m = Manager{}
	m.cfg = cfg
	m.cfg.Layers, m.cfg.PoolRatio, m.cfg.Snapshots.OffsetsFromEnd = nil, nil, nil
	m.tpb = cfg.TokensPerBlock
	m.limit = cfg.MaxSeqLen + cfg.MaxDraftTokens
	hasState := plans[len(plans)-1].pool.TokensPerBlock == 0
	m.reuse = cfg.EnableBlockReuse && !hasState && len(plans) > 0
	for _, p := range plans {
		m.names = append(m.names, p.pool.Name)
		if p.pool.TokensPerBlock == 0 {
			m.ssm = newPool(p.pool.ID, 0, 0, p.pool.Blocks, false)
			continue
		}
		if p.pool.Tier == kvcache.TierHost {
			hp := newPool(p.pool.ID, p.pool.Window, m.tpb, p.pool.Blocks, true)
			hp.pend = make([]bool, hp.n)
			m.host = append(m.host, hp)
			continue
		}
		m.paged = append(m.paged, newPool(p.pool.ID, p.pool.Window, m.tpb, p.pool.Blocks, m.reuse))
	}
	if m.host != nil {
		m.fresh = make([]fresh, len(m.paged))
		for pi, p := range m.paged {
			p.pend = make([]bool, p.n)
			p.logRegs = true
			m.fresh[pi].src = make([]int32, p.n)
		}
		for _, hp := range m.host {
			hp.track()
		}
	}
	if cfg.EvictionPolicy == kvcache.EvictionLFU {
		m.rule = ruleLFU
	}
	if m.reuse {
		for pi, p := range m.paged {
			m.ghosts = append(m.ghosts, newGhost(maxGhosts))
			if m.rule == ruleLFU {
				p.useLFU()
				if m.host != nil {
					m.host[pi].useLFU()
				}
			}
		}
	}
	if cfg.KVEvents && m.reuse && len(m.paged) > 0 {
		m.ev.on = true
		m.ev.Cleared()
		m.paged[0].evicted = m.ev.removedDevice
		if m.host != nil {
			m.host[0].evicted = m.ev.removedHost
		}
	}
	m.seqs = make(map[kvcache.SeqID]*sequence, 2*cfg.MaxBatchSize*cfg.Stages)
	m.h = newHasher(m.tpb)
	m.configured = true
	return layout, nil
}

func (m *Manager) ready(ctx context.Context, op string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if !m.configured {
		return kvcache.Errorf(kvcache.KindInvalidArg, "%s: %s called before Configure", Name, op)
	}
	return nil
}

// Lookup returns, per item, how many leading prompt tokens every pool holds
// now: the longest chain of registered full blocks, capped at
// floor((len(Prompt)-1)/TokensPerBlock)*TokensPerBlock so at least one token
// is left to compute. It is 0 with block reuse off. It changes nothing but
// the LookupTokens counter and the clock (Now). Explain shares its walk.
func (m *Manager) Lookup(ctx context.Context, items []kvcache.LookupItem) ([]int, error) {
	if err := m.ready(ctx, "Lookup"); err != nil {
		return nil, err
	}
	out := make([]int, len(items))
	for i := range items {
		prompt := items[i].Prompt
		m.c.lookupTokens += int64(len(prompt))
		m.now = max(m.now, items[i].Now)
		if !m.reuse {
			continue
		}
		n, _, _ := m.walk(prompt, items[i].CacheSalt, m.lookupLimit(prompt))
		out[i] = n * m.tpb
	}
	return out, nil
}

// Reserve grants or denies each item in order, atomically over all pools: a
// grant allocated every block it needs in every pool, a denial allocated
// nothing and left no trace (except the ReserveDenials counter). Denials for
// lack of space say which pool and the numbers; bad items (negative or
// too-large sizes, unknown or duplicate sequences, an outstanding
// reservation, Reuse beyond what the cache holds) are denied with a Reason
// starting "invalid:". The error is non-nil only for a done ctx or a call
// before Configure. The returned grants and their deltas are the caller's.
func (m *Manager) Reserve(ctx context.Context, items []kvcache.ReserveItem) ([]kvcache.Grant, error) {
	if err := m.ready(ctx, "Reserve"); err != nil {
		return nil, err
	}
	grants := make([]kvcache.Grant, len(items))
	m.staged, m.blocks, m.spans, m.copies = m.staged[:0], m.blocks[:0], m.spans[:0], m.copies[:0]
	if len(m.hint) < len(items) {
		m.hint = append(m.hint, make([]*sequence, len(items)-len(m.hint))...)
	}
	for i := range items {
		it := &items[i]
		grants[i].Seq = it.Seq
		from, cfrom := len(m.staged), len(m.copies)
		m.tick(it.Now)
		m.hostBlock = 0
		s, reason := m.reserveOne(it, m.find(i, it.Seq))
		if m.hint[i] != s {
			m.hint[i] = s
		}
		if reason != "" {
			grants[i].Reason = reason
			m.c.denials++
			continue
		}
		grants[i].OK = true
		grants[i].HostReused = m.hostBlock * m.tpb
		if len(m.staged) > from || len(m.copies) > cfrom {
			m.spans = append(m.spans, span{i, from, len(m.staged), cfrom, len(m.copies)})
		}
	}
	if m.fresh != nil {
		m.endCall()
	}
	if len(m.copies) > 0 {
		copies := slices.Clone(m.copies)
		for _, sp := range m.spans {
			if sp.cto > sp.cfrom {
				grants[sp.grant].Copies = copies[sp.cfrom:sp.cto:sp.cto]
			}
		}
	}
	if len(m.staged) > 0 {
		blocks := make([]kvcache.BlockID, len(m.blocks))
		copy(blocks, m.blocks)
		deltas := make([]kvcache.TableDelta, len(m.staged))
		for k, d := range m.staged {
			deltas[k] = kvcache.TableDelta{Pool: d.pool, From: d.from, Blocks: blocks[d.off : d.off+d.n : d.off+d.n]}
		}
		for _, sp := range m.spans {
			if sp.to > sp.from {
				grants[sp.grant].Tables = deltas[sp.from:sp.to:sp.to]
			}
		}
	}
	return grants, nil
}

func invalid(seq kvcache.SeqID, format string, args ...any) string {
	return fmt.Sprintf("invalid: seq %d: ", seq) + fmt.Sprintf(format, args...)
}

// find returns the live sequence id, looking at the hint for item i first.
func (m *Manager) find(i int, id kvcache.SeqID) *sequence {
	if i < len(m.hint) {
		if s := m.hint[i]; s != nil && s.live && s.id == id {
			return s
		}
	}
	return m.seqs[id]
}

// reserveOne applies one item to s (the sequence it.Seq, nil when unknown).
// It returns the sequence afterwards (nil when there is none) and "" on a
// grant, or the denial reason.
func (m *Manager) reserveOne(it *kvcache.ReserveItem, s *sequence) (*sequence, string) {
	switch {
	case it.Tokens < 0:
		return s, invalid(it.Seq, "Tokens = %d; must be >= 0", it.Tokens)
	case it.Draft < 0:
		return s, invalid(it.Seq, "Draft = %d; must be >= 0", it.Draft)
	case it.Draft > m.cfg.MaxDraftTokens:
		return s, invalid(it.Seq, "Draft = %d; must be <= max draft tokens %d", it.Draft, m.cfg.MaxDraftTokens)
	case it.Hold < 0:
		return s, invalid(it.Seq, "Hold = %d; must be >= 0", it.Hold)
	case it.Hold > m.limit:
		return s, invalid(it.Seq, "Hold = %s; must be <= max_seq_len %s + max draft tokens %d",
			commas(it.Hold), commas(m.cfg.MaxSeqLen), m.cfg.MaxDraftTokens)
	case it.Tokens > m.limit:
		return s, invalid(it.Seq, "Tokens = %s; must be <= max_seq_len %s + max draft tokens %d",
			commas(it.Tokens), commas(m.cfg.MaxSeqLen), m.cfg.MaxDraftTokens)
	case it.Reuse < 0:
		return s, invalid(it.Seq, "Reuse = %d; must be >= 0", it.Reuse)
	case it.Priority != 0 && (it.Priority < kvcache.MinPriority || it.Priority > kvcache.MaxPriority):
		return s, invalid(it.Seq, "Priority = %d; must be in [%d, %d] (0 = default %d)",
			it.Priority, kvcache.MinPriority, kvcache.MaxPriority, kvcache.DefaultPriority)
	case it.PriorityDuration < 0:
		return s, invalid(it.Seq, "PriorityDuration = %d ns; must be >= 0 (0 = for as long as cached)", it.PriorityDuration)
	}
	var hashes []xxh3.Uint128
	reuseBlocks := 0
	history, capacity, hold := 0, 0, 0
	if it.New {
		if s != nil {
			return s, invalid(it.Seq, "New for a sequence that already exists (history %s)", commas(s.history))
		}
		if m.reuse && len(it.Prompt) >= m.tpb {
			m.hashes = m.h.chain(m.hashes[:0], it.CacheSalt, it.Prompt, len(it.Prompt)/m.tpb)
			hashes = m.hashes
		}
		if it.Reuse > 0 {
			switch {
			case !m.reuse:
				return s, invalid(it.Seq, "Reuse = %d but block reuse is off on this stage", it.Reuse)
			case it.Reuse%m.tpb != 0:
				return s, invalid(it.Seq, "Reuse = %d; must be a multiple of tokens_per_block %d", it.Reuse, m.tpb)
			case it.Reuse > len(it.Prompt)-1:
				return s, invalid(it.Seq, "Reuse = %d; must be <= len(Prompt)-1 = %d", it.Reuse, len(it.Prompt)-1)
			}
			reuseBlocks = it.Reuse / m.tpb
			if got := m.matched(hashes[:reuseBlocks]); got < reuseBlocks {
				return s, invalid(it.Seq, "Reuse = %s exceeds the %s prompt tokens the cache holds now (Lookup)",
					commas(it.Reuse), commas(got*m.tpb))
			}
		}
		history, capacity = it.Reuse, it.Reuse
	} else {
		switch {
		case s == nil:
			return s, invalid(it.Seq, "unknown sequence (New not set)")
		case s.reserved:
			return s, invalid(it.Seq, "a reservation of %d tokens + %d draft is outstanding; Commit or Unreserve it first",
				s.resTokens, s.resDraft)
		case it.Reuse != 0:
			return s, invalid(it.Seq, "Reuse = %d on an existing sequence; reuse is for new sequences only", it.Reuse)
		}
		history, capacity, hold = s.history, s.capacity, s.hold
	}
	end := history + it.Tokens + it.Draft
	if end > m.limit {
		return s, invalid(it.Seq, "history %s + Tokens %s + Draft %d = %s exceeds max_seq_len %s + max draft tokens %d",
			commas(history), commas(it.Tokens), it.Draft, commas(end), commas(m.cfg.MaxSeqLen), m.cfg.MaxDraftTokens)
	}
	hold = max(hold, it.Hold)
	newCap := max(capacity, end, hold)
	want := kvcache.BlocksFor(newCap, m.tpb)

	// Check every pool before touching any: all or nothing.
	for pi, p := range m.paged {
		have := reuseBlocks
		if s != nil {
			have = len(s.tables[pi])
		}
		extra := want - have
		if reuseBlocks > 0 {
			extra += m.onHost(pi, hashes[:reuseBlocks]) // promotions need fresh device blocks
		}
		if extra <= 0 {
			continue
		}
		avail := p.available()
		pinned := 0
		if reuseBlocks > 0 {
			pinned = cachedAmong(p, hashes[:reuseBlocks])
			avail -= pinned
		}
		if extra > avail {
			return s, fmt.Sprintf("seq %d: pool %d (%s) needs %s more blocks for capacity %s (history %s + %s tokens + %d draft, hold %s), has %s free + %s evictable of %s",
				it.Seq, p.id, m.names[p.id], commas(extra), commas(newCap), commas(history), commas(it.Tokens), it.Draft,
				commas(hold), commas(len(p.free)), commas(p.cached-pinned), commas(p.n))
		}
	}
	if it.New && m.ssm != nil && len(m.ssm.free) == 0 {
		return s, fmt.Sprintf("seq %d: pool %d (ssm) has no free state slot: all %s are held by resident sequences",
			it.Seq, m.ssm.id, commas(m.ssm.n))
	}

	// Apply; nothing below can fail.
	if it.New {
		s = m.newSeq(it.Seq)
		m.cur = s
		s.isNew = true
		s.prio, s.exp = defaultLevel, 0
		if it.Priority != 0 {
			s.prio = uint8(it.Priority)
		}
		if it.PriorityDuration > 0 && s.prio != defaultLevel {
			s.exp = it.Now + it.PriorityDuration
		}
		if m.host != nil && reuseBlocks > 0 {
			m.fromHost = slices.Grow(m.fromHost[:0], reuseBlocks)[:reuseBlocks]
			clear(m.fromHost)
		}
		if m.ssm != nil {
			s.slot = m.ssm.alloc()
			off := len(m.blocks)
			m.blocks = append(m.blocks, s.slot)
			m.staged = append(m.staged, stagedDelta{pool: m.ssm.id, from: 0, off: off, n: 1})
		}
		for pi, p := range m.paged {
			t := s.tables[pi]
			if m.host != nil {
				t = m.attach(pi, t, hashes[:reuseBlocks])
			} else {
				for j := 0; j < reuseBlocks; j++ {
					b, _ := p.lookup(hashes[j])
					p.acquire(b)
					p.raise(int32(b), s.prio, s.exp)
					t = append(t, b)
				}
			}
			s.tables[pi] = t
		}
		if m.host != nil {
			for _, h := range m.fromHost[:reuseBlocks] {
				if h {
					m.hostBlock++
				}
			}
		}
		s.history, s.capacity = it.Reuse, it.Reuse
		s.registered = reuseBlocks
		s.reused = it.Reuse
		s.hashes = append(s.hashes[:0], hashes...)
		if it.CacheSalt != "" && len(hashes) > 0 {
			m.saltOn()
			s.sfree = m.h.chain(s.sfree[:0], "", it.Prompt, len(hashes))
		}
		if m.ev.on {
			s.prompt = append(s.prompt[:0], it.Prompt[:len(hashes)*m.tpb]...)
			if len(s.moved) > 0 {
				p := m.paged[0]
				for j, b := range s.tables[0] { // promoted blocks are device content again
					if p.pend[b] {
						m.ev.stored(s, j, m.tpb)
					}
				}
			}
		}
		m.c.reusedTokens += int64(it.Reuse)
		m.seqs[it.Seq] = s
	}
	m.cur = s
	if !it.New {
		s.evicted = s.evicted[:0] // a new sequence's started empty, before its reuse
	}
	s.undoCap, s.undoHold = s.capacity, s.hold
	s.hold, s.capacity = hold, newCap
	for pi, p := range m.paged {
		t := s.tables[pi]
		s.undoLen[pi], s.undoTold[pi], s.undoKeep[pi] = int32(len(t)), s.told[pi], s.keep[pi]
		for len(t) < want {
			t = append(t, m.allocDev(pi))
		}
		s.tables[pi] = t
		if n := int32(len(t)); s.keep[pi] != n || s.told[pi] != n {
			k := int(s.keep[pi])
			off := len(m.blocks)
			m.blocks = append(m.blocks, t[k:]...)
			m.staged = append(m.staged, stagedDelta{pool: p.id, from: k, off: off, n: len(t) - k})
			s.told[pi], s.keep[pi] = n, n
		}
	}
	s.reserved = true
	s.resTokens, s.resDraft = it.Tokens, it.Draft
	return s, ""
}

// matched is how many leading hashes every pool holds: walk's rule
// (held) over hashes already computed.
func (m *Manager) matched(hashes []xxh3.Uint128) int {
	for j, h := range hashes {
		if ok, _ := m.held(h); !ok {
			return j
		}
	}
	return len(hashes)
}

// cachedAmong counts the blocks registered under hashes that are cached
// (unreferenced): attaching them takes them out of the evictable set.
func cachedAmong(p *pool, hashes []xxh3.Uint128) int {
	n := 0
	for _, h := range hashes {
		if b, ok := p.lookup(h); ok && p.ref[b] == 0 {
			n++
		}
	}
	return n
}

func (m *Manager) newSeq(id kvcache.SeqID) *sequence {
	var s *sequence
	if k := len(m.spare); k > 0 {
		s = m.spare[k-1]
		m.spare = m.spare[:k-1]
	} else {
		n := len(m.paged)
		s = &sequence{
			tables:   make([][]kvcache.BlockID, n),
			stale:    make([]int32, n),
			told:     make([]int32, n),
			keep:     make([]int32, n),
			undoLen:  make([]int32, n),
			undoTold: make([]int32, n),
			undoKeep: make([]int32, n),
		}
	}
	hashes, tables, prompt, moved, sfree, evicted := s.hashes[:0], s.tables, s.prompt[:0], s.moved[:0], s.sfree[:0], s.evicted[:0]
	for i := range tables {
		tables[i] = tables[i][:0]
		s.stale[i], s.told[i], s.keep[i] = 0, 0, 0
	}
	*s = sequence{
		id: id, live: true, slot: noBlock, hashes: hashes, tables: tables, prompt: prompt, moved: moved, sfree: sfree,
		evicted: evicted,
		stale:   s.stale, told: s.told, keep: s.keep,
		undoLen: s.undoLen, undoTold: s.undoTold, undoKeep: s.undoKeep,
	}
	return s
}

// Unreserve undoes each sequence's outstanding reservation exactly: a
// sequence created by it disappears (its reused blocks go back to the cache),
// an existing one gets back its capacity, hold and tables. Cached blocks
// evicted to make room, and host blocks a promotion took, are put back as
// cached content when nothing overwrote them (undo.go). Sequences that are unknown or have no reservation are reported in one
// item-scoped error after the others were applied.
func (m *Manager) Unreserve(ctx context.Context, seqs []kvcache.SeqID) error {
	if err := m.ready(ctx, "Unreserve"); err != nil {
		return err
	}
	var bad itemErrors
	for _, id := range seqs {
		s := m.seqs[id]
		switch {
		case s == nil:
			bad.add(id, "unknown sequence")
			continue
		case !s.reserved:
			bad.add(id, "no outstanding reservation")
			continue
		}
		m.settle(s, false)
		if s.isNew {
			m.drop(s)
			m.putBack(s)
			continue
		}
		for pi, p := range m.paged {
			t := s.tables[pi]
			for int32(len(t)) > s.undoLen[pi] {
				p.release(t[len(t)-1])
				t = t[:len(t)-1]
			}
			s.tables[pi] = t
			s.told[pi], s.keep[pi] = s.undoTold[pi], s.undoKeep[pi]
		}
		s.capacity, s.hold = s.undoCap, s.undoHold
		s.reserved, s.resTokens, s.resDraft = false, 0, 0
		m.putBack(s)
	}
	return bad.err("Unreserve", len(seqs))
}

// Commit ends each sequence's reservation: history += Accepted, capacity =
// max(history, hold), and blocks past ceil(capacity/TokensPerBlock) are freed.
// Accepted must lie in [Tokens, Tokens+Draft] of the reservation (only drafts
// may be rejected). It registers full prompt blocks for reuse and releases
// sliding-window blocks that left the window. It never allocates. Bad items
// (unknown sequence, no reservation, Accepted out of range) are left
// untouched and reported in one item-scoped error after the others were
// applied. CommitResult is always empty: V1 takes no snapshots.
func (m *Manager) Commit(ctx context.Context, items []kvcache.CommitItem) (kvcache.CommitResult, error) {
	if err := m.ready(ctx, "Commit"); err != nil {
		return kvcache.CommitResult{}, err
	}
	var bad itemErrors
	for i := range items {
		it := items[i]
		s := m.find(i, it.Seq)
		switch {
		case s == nil:
			bad.add(it.Seq, "unknown sequence")
		case !s.reserved:
			bad.add(it.Seq, "no outstanding reservation")
		case it.Accepted < s.resTokens || it.Accepted > s.resTokens+s.resDraft:
			bad.add(it.Seq, fmt.Sprintf("Accepted = %d outside [%d, %d] (reserved %d tokens + %d draft; only drafts may be rejected)",
				it.Accepted, s.resTokens, s.resTokens+s.resDraft, s.resTokens, s.resDraft))
		default:
			m.commitOne(s, it.Accepted)
		}
	}
	return kvcache.CommitResult{}, bad.err("Commit", len(items))
}

func (m *Manager) commitOne(s *sequence, accepted int) {
	if len(s.moved) > 0 {
		m.settle(s, true)
	}
	s.history += accepted
	s.reserved, s.isNew, s.resTokens, s.resDraft = false, false, 0, 0
	s.capacity = max(s.history, s.hold)
	want := kvcache.BlocksFor(s.capacity, m.tpb)
	full := min(len(s.hashes), s.history/m.tpb)
	for pi, p := range m.paged {
		t := s.tables[pi]
		for len(t) > want {
			if b := t[len(t)-1]; b != noBlock {
				p.release(b)
			}
			t = t[:len(t)-1]
		}
		s.tables[pi] = t
		if s.keep[pi] > int32(want) {
			s.keep[pi] = int32(want)
		}
		// Register full prompt blocks before any leaves the window.
		for j := s.registered; j < full; j++ {
			if b := t[j]; b != noBlock {
				m.store(pi, s, j, b)
			}
		}
		if p.window > 0 && s.history > p.window {
			stale := int32((s.history - p.window) / m.tpb)
			for j := stale - 1; j >= s.stale[pi]; j-- {
				p.release(t[j])
				t[j] = noBlock
			}
			s.stale[pi] = max(s.stale[pi], stale)
		}
	}
	if full > s.registered {
		s.registered = full
	}
}

// store registers prompt block j of s, held in block b of paged pool pi,
// with s's retention (raised to the host's when the host tier gave the
// hash up). When another block holds the hash, that block takes s's
// priority if higher.
func (m *Manager) store(pi int, s *sequence, j int, b kvcache.BlockID) {
	p, h := m.paged[pi], s.hashes[j]
	ok, o := m.claim(pi, h)
	if !ok {
		return
	}
	if !p.register(b, h) {
		if held, ok := p.lookup(h); ok {
			p.raise(int32(held), s.prio, s.exp)
		}
		return
	}
	if s.prio != defaultLevel || s.exp != 0 || o.had { // else register's default retention is s's
		p.keep(int32(b), s.prio, s.exp, o.hits)
		if o.had {
			p.raise(int32(b), o.prio, o.exp)
		}
	}
	if pi == 0 && len(s.sfree) > j {
		p.setSalt(int32(b), s.sfree[j])
	}
	if pi == 0 && m.ev.on {
		m.ev.stored(s, j, m.tpb)
	}
}

// drop frees every block of s (tail first, so a chain's deeper blocks become
// the older cache entries) and forgets it.
func (m *Manager) drop(s *sequence) {
	if len(s.moved) > 0 {
		m.settle(s, true) // Release: the grant's copies went to the worker
	}
	for pi, p := range m.paged {
		t := s.tables[pi]
		for j := len(t) - 1; j >= 0; j-- {
			if t[j] != noBlock {
				p.release(t[j])
			}
		}
	}
	if m.ssm != nil && s.slot != noBlock {
		m.ssm.release(s.slot)
	}
	delete(m.seqs, s.id)
	s.live = false
	m.spare = append(m.spare, s)
}

// Release frees finished or preempted sequences, with or without an
// outstanding reservation; registered prompt blocks stay cached for reuse.
// Unknown sequences are reported in one item-scoped error after the others
// were released.
func (m *Manager) Release(ctx context.Context, seqs []kvcache.SeqID) error {
	if err := m.ready(ctx, "Release"); err != nil {
		return err
	}
	var bad itemErrors
	for _, id := range seqs {
		s := m.seqs[id]
		if s == nil {
			bad.add(id, "unknown sequence")
			continue
		}
		m.drop(s)
	}
	return bad.err("Release", len(seqs))
}

// Stats returns cumulative counters and the pools' current accounting.
func (m *Manager) Stats(ctx context.Context) (kvcache.Stats, error) {
	if err := m.ready(ctx, "Stats"); err != nil {
		return kvcache.Stats{}, err
	}
	st := kvcache.Stats{
		Pools:          m.poolStats(),
		Sequences:      len(m.seqs),
		LookupTokens:   m.c.lookupTokens,
		ReusedTokens:   m.c.reusedTokens,
		ReserveDenials: m.c.denials,
	}
	for _, p := range m.paged {
		st.Evictions += p.evictions
	}
	return st, nil
}

func (m *Manager) poolStats() []kvcache.PoolStats {
	out := make([]kvcache.PoolStats, 0, len(m.paged)+1)
	for _, p := range m.paged {
		out = append(out, p.stats())
	}
	for _, p := range m.host {
		out = append(out, p.stats())
	}
	if m.ssm != nil {
		out = append(out, m.ssm.stats())
	}
	return out
}

// Inspect returns every sequence's ledger (sorted by SeqID), the pools'
// accounting and the findings of a deep self-check (see Violations). With
// opts.Tables it adds each sequence's tables (a position released by a
// sliding window reads -1; the state pool's table is the sequence's slot) and
// every block's reference count. Cost: O(device blocks + table entries)
// for the self-check, plus the host blocks changed since the last one (see
// check); the reference counts it returns are copies, O(blocks).
func (m *Manager) Inspect(ctx context.Context, opts kvcache.InspectOptions) (kvcache.Snapshot, error) {
	if err := m.ready(ctx, "Inspect"); err != nil {
		return kvcache.Snapshot{}, err
	}
	snap := kvcache.Snapshot{Pools: m.poolStats()}
	ids := make([]kvcache.SeqID, 0, len(m.seqs))
	for id := range m.seqs {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	npools := len(m.paged) + len(m.host)
	if m.ssm != nil {
		npools++
	}
	for _, id := range ids {
		s := m.seqs[id]
		st := kvcache.SeqState{
			Seq:      id,
			History:  s.history,
			Capacity: s.capacity,
			Hold:     s.hold,
			Blocks:   make([]int, npools),
		}
		if s.reserved {
			st.Reserved, st.Draft = s.resTokens+s.resDraft, s.resDraft
		}
		for pi := range m.paged {
			st.Blocks[pi] = len(s.tables[pi]) - int(s.stale[pi])
		}
		if m.ssm != nil && s.slot != noBlock {
			st.Blocks[m.ssm.id] = 1
		}
		if opts.Tables {
			st.Tables = make([][]kvcache.BlockID, npools)
			for pi := range m.paged {
				st.Tables[pi] = slices.Clone(s.tables[pi])
			}
			if m.ssm != nil {
				st.Tables[m.ssm.id] = []kvcache.BlockID{s.slot}
			}
		}
		snap.Seqs = append(snap.Seqs, st)
	}
	if opts.Tables {
		snap.RefCounts = make([][]int32, 0, npools)
		for _, p := range m.paged {
			snap.RefCounts = append(snap.RefCounts, slices.Clone(p.ref))
		}
		for _, p := range m.host {
			snap.RefCounts = append(snap.RefCounts, slices.Clone(p.ref))
		}
		if m.ssm != nil {
			snap.RefCounts = append(snap.RefCounts, slices.Clone(m.ssm.ref))
		}
	}
	if opts.Tables {
		snap.Violations = m.check()
	}
	return snap, nil
}

// itemErrors collects per-item problems of one call.
type itemErrors struct {
	seqs []kvcache.SeqID
	msgs []string
}

func (e *itemErrors) add(id kvcache.SeqID, msg string) {
	e.seqs = append(e.seqs, id)
	e.msgs = append(e.msgs, fmt.Sprintf("seq %d: %s", id, msg))
}

func (e *itemErrors) err(op string, total int) error {
	if len(e.seqs) == 0 {
		return nil
	}
	return kvcache.ItemErrorf(e.seqs, "%s: %s: %d of %d items rejected (the others were applied): %s",
		Name, op, len(e.seqs), total, strings.Join(e.msgs, "; "))
}
