package mamba

import (
	"context"
	"fmt"
	"slices"

	cachemgrv2 "github.com/kvx-dev/kvx/cachemgr_v2"
	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
	"github.com/kvx-dev/kvx/plugins/v1/spec"
)

// Name and Version identify the manager in Info.
const (
	Name    = "mamba"
	Version = "0.1.0"
)

// NoBlock marks an absent block or slot.
const NoBlock = cachemgrv2.NoBlock

var (
	_ kvcache.Manager   = (*Manager)(nil)
	_ kvcache.Suspender = (*Manager)(nil) // the host tier
	_ kvcache.Explainer = (*Manager)(nil) // cachemgrv2.Core.Explain, with MissSnapshot
	_ kvcache.Forker    = (*Manager)(nil) // cachemgrv2.Core.Fork, with a copy of the live state
)

var _ cachemgrv2.Hooks = (*life)(nil)

// Manager is the hybrid (Mamba) cache manager of one pipeline stage: a
// cachemgrv2.Core, which runs the sequence life cycle over the attention
// pool groups, plus the SSM life cycle (life) hooked into it; see the package
// doc. The zero value is not usable: call New, then Configure. The core
// calls it from one goroutine at a time; it does no locking.
type Manager struct {
	cachemgrv2.Core
	life life
}

// life is the SSM life cycle of a stage: live state slots, snapshots and
// their retention, and live states on the host tier. It implements
// cachemgrv2.Hooks; per sequence it keeps a *seqState in Seq.Ext.
type life struct {
	tree *cachemgrv2.Tree
	tpb  int
	cfg  *kvcache.Config

	ssm      *slots // the state pool; nil without state layers
	host     *slots // host-ssm: suspended live states and offloaded snapshots; nil without a host tier
	live     int    // live slots: MaxBatchSize × Stages
	liveUsed int
	snapCap  int // slots for snapshots: the pool's slots beyond the live ones
	nSnaps   int // installed snapshots plus slots being written
	snapOn   bool
	step     int
	offsets  []int
	snaps    map[*cachemgrv2.Node]*snapshot // snapshots in ssm slots
	// snapList is snaps' values, snapshot.at each one's index, for the
	// victim queue's pass over every snapshot (victimQueue.sync):
	// iterating the map cost more than the rest of such a pass (the deep
	// check proves the two agree).
	snapList []*snapshot
	hsnaps   map[*cachemgrv2.Node]*snapshot // snapshots in host-ssm slots, cached or pending
	// atDepth counts the snapshots, on either tier, at each depth of the
	// tree (a snapshot at pos is on a node at depth pos/tpb). A long path
	// holds snapshots at few of its depths: a look at the count spares the
	// maps' lookups at the others (Reusable at every block a Lookup walks,
	// a release's touch of its path, the deep check's walk).
	atDepth []int32
	snapSeq uint64
	stats   kvcache.SnapshotStats
	tick    uint64

	bounds  []int
	victims victimQueue // planSnaps's eviction candidates (victim)
}

// snapshot is an SSM state installed on the tree node of the block that ends
// at pos, in a slot of the ssm pool or, offloaded, of the host-ssm pool (a
// node holds at most one snapshot, on one tier).
type snapshot struct {
	node  *cachemgrv2.Node
	ref   int32 // node.Ref(), for the victim queue's reads of the tree's index (victimQueue.sync)
	slot  kvcache.BlockID
	host  bool      // slot is in host-ssm (l.hsnaps), else in ssm (l.snaps)
	pend  *seqState // host: the sequence whose outstanding grant copies it there; nil once settled
	pos   int
	level int
	tick  uint64   // LRU key: install, reuse, release of a sequence on its path
	id    uint64   // creation order, the last tie-break
	pins  int32    // sequences whose grant copies it into their live slot
	at    int32    // in ssm: its index in life.snapList
	heap  *keyHeap // the victim heap holding it (life.victims); nil when none
	hi    int32    // its index there
}

// pendingOff is an offload that a sequence's outstanding grant copies: the
// host-ssm slot it writes stays held until the reservation settles, even if
// its snapshot is dropped meanwhile.
type pendingOff struct {
	sn   *snapshot
	slot kvcache.BlockID
}

// pendingSnap is a snapshot slot the outstanding step writes at pos.
type pendingSnap struct {
	pos  int
	slot kvcache.BlockID
}

// seqState is one sequence's SSM state on a stage with state layers.
type seqState struct {
	live     kvcache.BlockID // live state slot; NoBlock while suspended
	host     kvcache.BlockID // host slot holding the live state while suspended; NoBlock otherwise
	sentLive bool            // the worker knows live as its ssm table entry 0
	pend     []pendingSnap
	offs     []pendingOff // snapshots the outstanding grant offloads to host-ssm
	src      *snapshot    // pinned reuse source (on either tier) until the first Commit
}

func stateOf(s *cachemgrv2.Seq) *seqState {
	x, _ := s.Ext.(*seqState)
	return x
}

// New returns an unconfigured manager.
func New() *Manager { return &Manager{Core: cachemgrv2.NewCore(Name)} }

// Info implements kvcache.Manager. The host tier works when Configure is
// given host bytes (Suspend, Resume).
func (m *Manager) Info(ctx context.Context) (kvcache.Info, error) {
	return cachemgrv2.Describe(ctx, Name, Version, kvcache.Capabilities{
		Mixers:           []spec.Mixer{spec.MixerGQA, spec.MixerMLA, spec.MixerDSA, spec.MixerMamba},
		PrefixReuse:      true,
		HostTier:         true,
		SSMState:         true,
		SSMReuse:         true,
		CacheSalt:        true,
		KVEvents:         true,
		Explain:          true,
		Retention:        true,
		EvictionPolicies: slices.Clone(cachemgrv2.EvictionPolicies),
		Fork:             true,
	})
}

// Configure implements kvcache.Manager: it lays out the attention pool groups,
// the ssm pool and, with HostBytes, their host pools (package doc, Sizing)
// and resets all state. It fails with ErrInvalidConfig, naming the numbers
// and the fix, when one MaxSeqLen request with its states, the live states
// of every resident sequence, or one MaxNumTokens chunk cannot fit, and an
// EvictionPolicy other than lru, lfu or "".
func (m *Manager) Configure(ctx context.Context, cfg kvcache.Config) (kvcache.Layout, error) {
	if err := ctx.Err(); err != nil {
		return kvcache.Layout{}, err
	}
	if err := cachemgrv2.CheckEvictionPolicy(Name, cfg.EvictionPolicy); err != nil {
		return kvcache.Layout{}, err
	}
	p, err := planLayout(&cfg)
	if err != nil {
		return kvcache.Layout{}, err
	}
	n := len(p.groups)
	hasState := p.stateBytes > 0
	reuse := cfg.EnableBlockReuse && n > 0 && (!hasState || p.snapshots)
	m.life = life{
		tpb:     cfg.TokensPerBlock,
		live:    p.live,
		snapOn:  p.snapshots,
		step:    p.step,
		offsets: p.offsets,
		snaps:   map[*cachemgrv2.Node]*snapshot{},
		hsnaps:  map[*cachemgrv2.Node]*snapshot{},
		victims: newVictimQueue(),
	}
	m.Init(cachemgrv2.CoreConfig{
		Name: Name, Config: cfg, Groups: p.groups, DevBlocks: p.devBlocks, HostBlocks: p.hostBlocks, HostID: n,
		Reuse:    reuse,
		ReuseOff: fmt.Sprintf("enable_block_reuse %v, attention groups %d, snapshots %v", cfg.EnableBlockReuse, n, p.snapshots),
		Hooks:    &m.life,
		Layout:   p.layout.Pools,
	})
	m.life.tree = m.Tree()
	m.life.cfg = &cfg
	if hasState {
		id := n
		if p.hostBlocks != nil {
			id = 2 * n
		}
		m.life.ssm = newSlots(id, p.ssmBlocks)
		m.life.snapCap = p.ssmBlocks - p.live
		if p.hostBlocks != nil {
			m.life.host = newSlots(id+1, p.hostSlots)
		}
	}
	lay := p.layout
	lay.Pools = slices.Clone(lay.Pools)
	lay.Warnings = slices.Clone(lay.Warnings)
	return lay, nil
}

// Reserve implements kvcache.Manager: cachemgrv2.Core.Reserve, whose grants
// for a new sequence also take a live state slot (denied when all are held
// by resident sequences) and, with Reuse, copy the snapshot at Reuse into it
// from either tier (Grant.Copies); a granted step that crosses snapshot
// boundaries of the prompt gets its snapshot slots, best-effort, and with a
// host tier a copy ssm -> host-ssm for each snapshot it evicts (package doc,
// Host tier). On a stage with
// state layers every grant's Tables end with the ssm table delta: the live
// slot (entry 0, when the worker may not know it), then this step's
// snapshot slots, which Grant.Snapshots name with their positions.
func (m *Manager) Reserve(ctx context.Context, items []kvcache.ReserveItem) ([]kvcache.Grant, error) {
	m.life.tick++
	return m.Core.Reserve(ctx, items)
}

// Commit implements kvcache.Manager: cachemgrv2.Core.Commit, which also ends
// the pin of a reuse source, caches the snapshots the step offloaded on the
// host tier and installs those it wrote on the tree nodes of their
// boundaries. It never allocates and never evicts.
func (m *Manager) Commit(ctx context.Context, items []kvcache.CommitItem) (kvcache.CommitResult, error) {
	m.life.tick++
	return m.Core.Commit(ctx, items)
}

// Release implements kvcache.Manager: cachemgrv2.Core.Release, which also
// frees each sequence's live slot (or host slot) and unwritten snapshot
// slots and marks its path's snapshots as used now.
func (m *Manager) Release(ctx context.Context, seqs []kvcache.SeqID) error {
	m.life.tick++
	return m.Core.Release(ctx, seqs)
}

// Suspend implements kvcache.Suspender (the host tier): cachemgrv2.Core.Suspend.
// A sequence's private attention blocks move to the host tier (evicting
// cached host nodes to make room: suspended sequences come first) and its
// live SSM state goes with them: it is copied to a slot of the host ssm pool
// (Copies, ssm to host-ssm), evicting the least valuable cached host
// snapshot when none is free (never a pinned or pending one), and its live
// slot is freed for another resident sequence. A sequence stays resident
// (false, nothing changes) when its private blocks do not fit the host pools
// or no host ssm slot is free or evictable; one already suspended is true,
// and one with a reservation outstanding is an item error. Without a host
// tier (host_bytes 0) the call fails with ErrUnsupported.
func (m *Manager) Suspend(ctx context.Context, seqs []kvcache.SeqID) ([]bool, []kvcache.Copy, error) {
	return m.Core.Suspend(ctx, seqs)
}

// Resume implements kvcache.Suspender: cachemgrv2.Core.Resume. The live state
// comes back into a free live slot (false while all are held by resident
// sequences, or while the device cannot make room for its attention
// blocks), and the sequence's next grant names the new slot as its ssm
// table entry 0.
func (m *Manager) Resume(ctx context.Context, seqs []kvcache.SeqID) ([]bool, []kvcache.Copy, error) {
	return m.Core.Resume(ctx, seqs)
}

// Stats implements kvcache.Manager: the core's counters, every pool in
// Layout order and the snapshot counters.
func (m *Manager) Stats(ctx context.Context) (kvcache.Stats, error) {
	st, err := m.Core.Stats(ctx)
	if err != nil {
		return st, err
	}
	st.Pools = m.life.poolStats(st.Pools)
	st.Snapshots = m.life.stats
	return st, nil
}

// poolStats appends the state pools' stats (ssm, then host-ssm) to the
// core's, which come first in the Layout.
func (l *life) poolStats(out []kvcache.PoolStats) []kvcache.PoolStats {
	if l.ssm != nil {
		out = append(out, l.ssm.stats())
	}
	if l.host != nil {
		out = append(out, l.host.stats())
	}
	return out
}

// Reusable implements cachemgrv2.Hooks: on a stage with state layers, reuse
// must end on a block boundary that holds a snapshot on either tier, a
// pending offload excepted (so partial-block reuse never applies there);
// elsewhere any cached prefix is reusable. end, the node of the last full
// block, is at depth tokens/tpb.
func (l *life) Reusable(end *cachemgrv2.Node, tokens int) bool {
	return l.ssm == nil || tokens%l.tpb == 0 && l.anyAt(tokens/l.tpb) && l.source(end) != nil
}

// source is the snapshot a new sequence may copy at n: the device one, else
// a settled host one; nil when none.
func (l *life) source(n *cachemgrv2.Node) *snapshot {
	if sn := l.snaps[n]; sn != nil {
		return sn
	}
	if sn := l.hsnaps[n]; sn != nil && sn.pend == nil {
		return sn
	}
	return nil
}

// held reports whether n, a node at depth d, holds a snapshot on either
// tier (pending or not).
func (l *life) held(n *cachemgrv2.Node, d int) bool {
	return l.anyAt(d) && (l.snaps[n] != nil || l.hsnaps[n] != nil)
}

// anyAt reports whether some snapshot, on either tier, is on a node at
// depth d.
func (l *life) anyAt(d int) bool { return d < len(l.atDepth) && l.atDepth[d] > 0 }

// index adds delta to the count of snapshots at the depth of pos
// (atDepth).
func (l *life) index(pos int, delta int32) {
	d := pos / l.tpb
	if d >= len(l.atDepth) {
		l.atDepth = append(l.atDepth, make([]int32, d+1-len(l.atDepth))...)
	}
	l.atDepth[d] += delta
}

// Admit implements cachemgrv2.Hooks: a new sequence needs a free live slot.
func (l *life) Admit(it *kvcache.ReserveItem) string {
	if l.ssm != nil && l.liveUsed >= l.live {
		return fmt.Sprintf("no capacity: new seq %d: all %d live state slots (max_batch_size %d × pipeline_parallel_size %d) are held by resident sequences",
			it.Seq, l.live, l.cfg.MaxBatchSize, max(l.cfg.Stages, 1))
	}
	return ""
}

// Reserved implements cachemgrv2.Hooks: a new sequence takes its live slot
// and, with Reuse, the copy of the snapshot at Reuse (from ssm or host-ssm),
// pinned; then the step's snapshot slots are placed, offloading the
// snapshots they evict (copies ssm -> host-ssm, before the forward that
// writes the freed slots).
func (l *life) Reserved(s *cachemgrv2.Seq, it *kvcache.ReserveItem, g *kvcache.Grant) {
	if l.ssm == nil {
		return
	}
	x := stateOf(s)
	if s.New() {
		x = &seqState{live: l.ssm.take(), host: NoBlock}
		s.Ext = x
		l.liveUsed++
		if it.Reuse > 0 {
			path := s.Path()
			src := l.source(path[len(path)-1])
			if src == nil {
				panic(fmt.Sprintf("mamba: seq %d: the snapshot at %d that Reusable saw is gone", it.Seq, it.Reuse))
			}
			src.pins++
			src.tick = l.tick
			x.src = src
			pool := l.ssm.id
			if src.host {
				pool = l.host.id
			}
			g.Copies = append(g.Copies, kvcache.Copy{SrcPool: pool, SrcBlock: src.slot, DstPool: l.ssm.id, DstBlock: x.live})
			l.stats.ReusedTokens += int64(it.Reuse)
		}
	}
	l.planSnaps(s, x, it.Tokens, g)
	for _, p := range x.pend {
		g.Snapshots = append(g.Snapshots, kvcache.SnapshotSlot{Pos: p.pos, Pool: l.ssm.id, Block: p.slot})
	}
}

// Tables implements cachemgrv2.Hooks: the ssm table delta, the live slot
// (from entry 0, when the worker may not know it: a new, resumed or
// unreserved sequence) and then the step's snapshot slots (entries 1..k,
// boundaries ascending).
func (l *life) Tables(s *cachemgrv2.Seq, dst []kvcache.TableDelta) []kvcache.TableDelta {
	if l.ssm == nil {
		return dst
	}
	x := stateOf(s)
	d := kvcache.TableDelta{Pool: l.ssm.id, From: 1}
	if !x.sentLive {
		d.From = 0
		d.Blocks = append(d.Blocks, x.live)
		x.sentLive = true
	}
	for _, p := range x.pend {
		d.Blocks = append(d.Blocks, p.slot)
	}
	return append(dst, d)
}

// Unreserved implements cachemgrv2.Hooks: the step's snapshot slots are
// freed and its offloaded snapshots dropped (their copies never ran); the
// worker may or may not have applied the undone grant, so the next one
// names the live slot again.
func (l *life) Unreserved(s *cachemgrv2.Seq) {
	if x := stateOf(s); x != nil {
		l.freePending(x)
		l.settleOffs(x, false)
		x.sentLive = false
	}
}

// Committed implements cachemgrv2.Hooks: the reuse source is unpinned, the
// snapshots the step offloaded are cached on the host tier and those it
// wrote are installed.
func (l *life) Committed(s *cachemgrv2.Seq) {
	x := stateOf(s)
	if x == nil {
		return
	}
	if x.src != nil {
		x.src.pins--
		x.src = nil
	}
	l.settleOffs(x, true)
	l.install(s, x)
}

// Dropped implements cachemgrv2.Hooks: the live (or host) slot and the
// unwritten snapshot slots are freed, the reuse source unpinned, the
// offloads of an outstanding grant settled (kept on a release, dropped when
// the creating reservation is undone), and on a release the path's
// snapshots are marked as used now.
func (l *life) Dropped(s *cachemgrv2.Seq, touch bool) {
	if x := stateOf(s); x != nil {
		if x.live != NoBlock {
			l.ssm.unref(x.live)
			l.liveUsed--
		}
		if x.host != NoBlock {
			l.host.unref(x.host)
		}
		l.freePending(x)
		l.settleOffs(x, touch)
		if x.src != nil {
			x.src.pins--
			x.src = nil
		}
	}
	if touch {
		for i, n := range s.Path() {
			if !l.anyAt(i + 1) {
				continue
			}
			if sn := l.snaps[n]; sn != nil {
				sn.tick = l.tick
			}
			if sn := l.hsnaps[n]; sn != nil {
				sn.tick = l.tick
			}
		}
	}
}

// CanFork implements cachemgrv2.Hooks: a child needs a free live slot,
// as a new sequence does.
func (l *life) CanFork(parent *cachemgrv2.Seq, child kvcache.SeqID) string {
	if l.ssm != nil && l.liveUsed >= l.live {
		return fmt.Sprintf("no capacity: fork of seq %d into %d: all %d live state slots (max_batch_size %d × pipeline_parallel_size %d) are held by resident sequences",
			parent.ID(), child, l.live, l.cfg.MaxBatchSize, max(l.cfg.Stages, 1))
	}
	return ""
}

// Forked implements cachemgrv2.Hooks: the child takes a live slot and a
// copy of the parent's live state into it (the state after the parent's
// history, which the child's next step continues).
func (l *life) Forked(parent, child *cachemgrv2.Seq, g *kvcache.Grant) {
	if l.ssm == nil {
		return
	}
	px := stateOf(parent)
	x := &seqState{live: l.ssm.take(), host: NoBlock}
	child.Ext = x
	l.liveUsed++
	g.Copies = append(g.Copies, kvcache.Copy{SrcPool: l.ssm.id, SrcBlock: px.live, DstPool: l.ssm.id, DstBlock: x.live})
}

// Evicted implements cachemgrv2.Hooks: a node's snapshot goes with its pages,
// whichever tier holds it (the node itself stays until a prune).
func (l *life) Evicted(n *cachemgrv2.Node) {
	if sn := l.snaps[n]; sn != nil {
		l.dropSnap(sn)
	}
	if sn := l.hsnaps[n]; sn != nil {
		l.dropHostSnap(sn)
	}
}

// CanSuspend implements cachemgrv2.Hooks: a live state needs a host ssm
// slot, free or taken from a cached host snapshot (suspended states come
// first).
func (l *life) CanSuspend(s *cachemgrv2.Seq) bool {
	return l.ssm == nil || l.host != nil && (len(l.host.free) > 0 || l.hostVictim() != nil)
}

// Suspended implements cachemgrv2.Hooks: the live state is copied to a host
// ssm slot (evicting the least valuable cached host snapshot when none is
// free) and the live slot freed.
func (l *life) Suspended(s *cachemgrv2.Seq, copies []kvcache.Copy) []kvcache.Copy {
	x := stateOf(s)
	if x == nil {
		return copies
	}
	if len(l.host.free) == 0 {
		l.dropHostSnap(l.hostVictim())
	}
	x.host = l.host.take()
	copies = append(copies, kvcache.Copy{SrcPool: l.ssm.id, SrcBlock: x.live, DstPool: l.host.id, DstBlock: x.host})
	l.ssm.unref(x.live)
	l.liveUsed--
	x.live, x.sentLive = NoBlock, false
	return copies
}

// CanResume implements cachemgrv2.Hooks: the live state needs a free live
// slot.
func (l *life) CanResume(s *cachemgrv2.Seq) bool {
	return l.ssm == nil || l.liveUsed < l.live
}

// Resumed implements cachemgrv2.Hooks: the live state is copied back into a
// fresh live slot and the host slot freed.
func (l *life) Resumed(s *cachemgrv2.Seq, copies []kvcache.Copy) []kvcache.Copy {
	x := stateOf(s)
	if x == nil {
		return copies
	}
	x.live = l.ssm.take()
	l.liveUsed++
	copies = append(copies, kvcache.Copy{SrcPool: l.host.id, SrcBlock: x.host, DstPool: l.ssm.id, DstBlock: x.live})
	l.host.unref(x.host)
	x.host = NoBlock
	return copies
}

// dropSnap evicts an installed, unpinned snapshot from its ssm slot, which
// becomes free; the tree is not touched.
func (l *life) dropSnap(sn *snapshot) {
	delete(l.snaps, sn.node)
	l.index(sn.pos, -1)
	if sn.heap != nil {
		sn.heap.remove(int(sn.hi))
	}
	last := l.snapList[len(l.snapList)-1]
	l.snapList[sn.at], last.at = last, sn.at
	l.snapList[len(l.snapList)-1] = nil
	l.snapList = l.snapList[:len(l.snapList)-1]
	l.ssm.evict(sn.slot)
	l.nSnaps--
	l.stats.Evicted++
}

// dropHostSnap evicts a host snapshot from its host-ssm slot: a cached slot
// becomes free, a pending one stays held by its offload until that settles.
func (l *life) dropHostSnap(sn *snapshot) {
	delete(l.hsnaps, sn.node)
	l.index(sn.pos, -1)
	l.host.evict(sn.slot)
	l.stats.Evicted++
}

// offload moves sn, just evicted from its ssm slot from, to a host-ssm slot
// (a free one, else one freed by evicting a less valuable cached host
// snapshot) with a copy in g, pending on x's reservation. Without a host
// tier, or without room there, sn vanishes.
func (l *life) offload(sn *snapshot, from kvcache.BlockID, x *seqState, g *kvcache.Grant) {
	if l.host == nil {
		return
	}
	if len(l.host.free) == 0 {
		v := l.hostVictim()
		if v == nil || !colder(v, sn) {
			return
		}
		l.dropHostSnap(v)
	}
	sn.host, sn.pend = true, x
	sn.slot = l.host.takeFor(sn)
	l.hsnaps[sn.node] = sn
	l.index(sn.pos, 1)
	x.offs = append(x.offs, pendingOff{sn: sn, slot: sn.slot})
	g.Copies = append(g.Copies, kvcache.Copy{SrcPool: l.ssm.id, SrcBlock: from, DstPool: l.host.id, DstBlock: sn.slot})
}

// settleOffs ends x's pending offloads: keep (Commit, Release: the grant's
// copies were handed to the worker) caches each snapshot still there on the
// host tier; otherwise (Unreserve: the copies never ran) it is dropped. Each
// offload's slot hold goes either way.
func (l *life) settleOffs(x *seqState, keep bool) {
	for _, o := range x.offs {
		sn := o.sn
		if l.hsnaps[sn.node] == sn && sn.slot == o.slot {
			sn.pend = nil
			if !keep {
				l.dropHostSnap(sn)
			}
		}
		l.host.unhold(o.slot)
	}
	x.offs = x.offs[:0]
}

// hostVictim is the least valuable cached host snapshot (lowest node
// priority, then least recently used lineage, then lowest level) that is
// neither pinned nor pending; nil when there is none.
func (l *life) hostVictim() *snapshot {
	var v *snapshot
	for _, sn := range l.hsnaps {
		if sn.pins == 0 && sn.pend == nil && (v == nil || colder(sn, v)) {
			v = sn
		}
	}
	return v
}

func (l *life) freePending(x *seqState) {
	for _, p := range x.pend {
		l.ssm.unref(p.slot)
		l.nSnaps--
	}
	x.pend = x.pend[:0]
}

// planSnaps gives the outstanding step of s (tokens after history) a slot
// for each snapshot boundary it crosses, best-effort; the snapshots it
// evicts are offloaded with copies in g.
func (l *life) planSnaps(s *cachemgrv2.Seq, x *seqState, tokens int, g *kvcache.Grant) {
	nblk := s.PromptBlocks()
	if !l.snapOn || nblk == 0 {
		return
	}
	hist := s.Ledger().History
	lo, hi := hist, min(hist+tokens, nblk*l.tpb)
	if hi <= lo {
		return
	}
	tpb := l.tpb
	bs := l.bounds[:0]
	if l.step > 0 {
		for b := (lo/l.step + 1) * l.step; b <= hi; b += l.step {
			bs = append(bs, b)
		}
	}
	for _, off := range l.offsets {
		b := (s.PromptLen() - off) / tpb * tpb
		if b > lo && b <= hi && !slices.Contains(bs, b) {
			bs = append(bs, b)
		}
	}
	l.bounds = bs
	if len(bs) == 0 {
		return
	}
	l.victims.synced = false
	slices.Sort(bs)
	path := s.Path()
	node, depth := l.tree.Root(), 0
	if len(path) > 0 {
		node, depth = path[len(path)-1], len(path)
	}
	for _, b := range bs {
		d := b / tpb
		for node != nil && depth < d {
			depth++
			if depth <= len(path) {
				node = path[depth-1]
			} else {
				node = l.tree.SaltedChild(node, s.Salt(), s.PromptBlock(depth-1, tpb))
			}
		}
		if node != nil && node.Stored() && l.held(node, d) {
			continue // already held by the cache, on either tier
		}
		slot, ok := l.snapSlot(boundaryLevel(b, l.step), x, g)
		if !ok {
			l.stats.Skipped++
			continue
		}
		x.pend = append(x.pend, pendingSnap{pos: b, slot: slot})
	}
}

// snapSlot takes a slot for a snapshot of level: a free one while fewer than
// snapCap snapshots exist, else one freed by evicting a victim (package doc,
// retention), which is offloaded to the host tier when it has room (a copy
// in g, pending on x's reservation, ahead of the forward that writes the
// slot); false when there is none and the snapshot is skipped.
func (l *life) snapSlot(level int, x *seqState, g *kvcache.Grant) (kvcache.BlockID, bool) {
	if l.nSnaps >= l.snapCap {
		v := l.victim(level)
		if v == nil {
			return NoBlock, false
		}
		from := v.slot
		l.dropSnap(v)
		l.offload(v, from, x, g)
	}
	l.nSnaps++
	return l.ssm.take(), true
}

// install puts the snapshots the committed step wrote on the tree nodes of
// their boundaries (pinned by s's path). A boundary whose node already holds
// a snapshot, or that registration could not reach, frees its slot.
func (l *life) install(s *cachemgrv2.Seq, x *seqState) {
	path := s.Path()
	for _, p := range x.pend {
		d := p.pos / l.tpb
		if d < 1 || d > len(path) || l.held(path[d-1], d) {
			if d < 1 || d > len(path) {
				l.stats.Skipped++
			}
			l.ssm.unref(p.slot)
			l.nSnaps--
			continue
		}
		n := path[d-1]
		l.snapSeq++
		sn := &snapshot{node: n, ref: n.Ref(), slot: p.slot, pos: p.pos, level: boundaryLevel(p.pos, l.step), tick: l.tick, id: l.snapSeq}
		l.snaps[n] = sn
		l.index(sn.pos, 1)
		sn.at = int32(len(l.snapList))
		l.snapList = append(l.snapList, sn)
		l.ssm.install(p.slot, sn)
		l.stats.Taken++
	}
	x.pend = x.pend[:0]
}
