package mamba

import (
	"context"
	"fmt"
	"slices"

	cachemgrv2 "github.com/kvx-dev/kvx/cachemgr_v2"
	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
)

// Inspect implements kvcache.Manager: cachemgrv2.Core.Inspect over the
// attention pools, then the state pools in Layout order: with Tables, the
// ssm table lists a resident sequence's live slot followed by the slots its
// outstanding step writes, the host-ssm table a suspended sequence's host
// slot. Violations are the core's deep self-check and this manager's
// (check). With Tables and CheckTables the core checks all the tables
// against the reference counts (cachemgrv2.Core.Seal), this manager's pools
// included.
func (m *Manager) Inspect(ctx context.Context, opts kvcache.InspectOptions) (kvcache.Snapshot, error) {
	snap, err := m.Core.Snapshot(ctx, opts)
	if err != nil {
		return snap, err
	}
	m.inspect(opts, &snap)
	m.Core.Seal(opts, &snap)
	return snap, nil
}

// inspect adds the state pools to snap.
func (m *Manager) inspect(opts kvcache.InspectOptions, snap *kvcache.Snapshot) {
	l := &m.life
	if l.ssm == nil {
		return
	}
	snap.Pools = l.poolStats(snap.Pools)
	for i := range snap.Seqs {
		st := &snap.Seqs[i]
		x := stateOf(m.Seq(st.Seq))
		t := ssmTable(x)
		st.Blocks = append(st.Blocks, len(t))
		var h []kvcache.BlockID
		if l.host != nil {
			if x != nil && x.host != NoBlock {
				h = []kvcache.BlockID{x.host}
			}
			st.Blocks = append(st.Blocks, len(h))
		}
		if opts.Tables {
			st.Tables = append(st.Tables, t)
			if l.host != nil {
				st.Tables = append(st.Tables, h)
			}
		}
	}
	if opts.Tables {
		snap.RefCounts = append(snap.RefCounts, slices.Clone(l.ssm.refs))
		if l.host != nil {
			snap.RefCounts = append(snap.RefCounts, slices.Clone(l.host.refs))
		}
		snap.Violations = append(snap.Violations, m.check()...)
	}
}

// ssmTable is a sequence's table in the ssm pool: the live slot, then the
// slots its outstanding step writes.
func ssmTable(x *seqState) []kvcache.BlockID {
	t := []kvcache.BlockID{}
	if x == nil {
		return t
	}
	if x.live != NoBlock {
		t = append(t, x.live)
	}
	for _, p := range x.pend {
		t = append(t, p.slot)
	}
	return t
}

// check is this manager's part of the deep self-check behind Inspect's
// Violations (the core checks ledgers, attention tables, pools and the
// tree):
//
//   - per sequence: a live slot while resident, a host slot instead while
//     suspended, snapshot slots only with a reservation and only at
//     boundaries inside its step;
//   - ssm pools: reference counts recomputed from live, host and written
//     slots, holds from the outstanding offloads, every slot in exactly one
//     state (free once on the stack, in use, owned by exactly one installed
//     snapshot, or in host-ssm pending: held by one outstanding offload and
//     owned by its snapshot unless that was dropped since), Cached equal to
//     the snapshots plus those held slots, live slots at most MaxBatchSize
//     × Stages, device snapshots at most the snapshot slots;
//   - snapshots, on either tier: each sits on an attached node with its
//     pages on some tier, at the node's depth × tpb, keyed by that node on
//     one tier only, with its level, pins equal to the sequences whose
//     reuse copy is pending, and (host) pending exactly while one
//     sequence's outstanding offload names it, never pinned then.
func (m *Manager) check() []string {
	l := &m.life
	var v []string
	bad := func(format string, args ...any) { v = append(v, fmt.Sprintf(format, args...)) }
	if l.ssm == nil {
		m.EachSeq(func(s *cachemgrv2.Seq) {
			if s.Ext != nil {
				bad("seq %d: state slots on a stage without state layers", s.ID())
			}
		})
		if len(l.snaps) > 0 || l.nSnaps != 0 {
			bad("ssm: %d snapshots (%d counted) without a state pool", len(l.snaps), l.nSnaps)
		}
		return v
	}
	tpb := l.tpb
	srefs := make([]int32, len(l.ssm.refs))
	var hrefs, hholds []int32
	if l.host != nil {
		hrefs = make([]int32, len(l.host.refs))
		hholds = make([]int32, len(l.host.refs))
	}
	snapPins := map[*snapshot]int32{}
	offPend := map[*snapshot]*seqState{}
	live, pending := 0, 0
	m.EachSeq(func(s *cachemgrv2.Seq) {
		id, led, x := s.ID(), s.Ledger(), stateOf(s)
		if x == nil {
			bad("seq %d: no state slots on a stage with state layers", id)
			return
		}
		switch {
		case s.Suspended() && (x.live != NoBlock || x.host < 0 || int(x.host) >= len(hrefs)):
			bad("seq %d: suspended with live slot %d, host slot %d (host ssm pool of %d)", id, x.live, x.host, len(hrefs))
		case s.Suspended():
			hrefs[x.host]++
		case x.host != NoBlock || x.live < 0 || int(x.live) >= len(srefs):
			bad("seq %d: resident with live slot %d (pool of %d), host slot %d", id, x.live, len(srefs), x.host)
		default:
			srefs[x.live]++
			live++
		}
		if len(x.pend) > 0 && !led.Reserved {
			bad("seq %d: %d snapshot slots written without a reservation", id, len(x.pend))
		}
		for _, p := range x.pend {
			pending++
			if p.slot < 0 || int(p.slot) >= len(srefs) {
				bad("seq %d: snapshot slot %d out of range", id, p.slot)
				continue
			}
			srefs[p.slot]++
			if p.pos <= led.History || p.pos > led.History+led.Tokens || p.pos%tpb != 0 || p.pos > s.PromptBlocks()*tpb {
				bad("seq %d: snapshot at %d outside its step (history %d, tokens %d, prompt blocks %d)", id, p.pos, led.History, led.Tokens, s.PromptBlocks())
			}
		}
		if len(x.offs) > 0 && !led.Reserved {
			bad("seq %d: %d snapshot offloads pending without a reservation", id, len(x.offs))
		}
		for _, o := range x.offs {
			if o.slot < 0 || int(o.slot) >= len(hrefs) {
				bad("seq %d: offload to host-ssm slot %d out of range (host ssm pool of %d)", id, o.slot, len(hrefs))
				continue
			}
			hholds[o.slot]++
			if sn := o.sn; l.hsnaps[sn.node] == sn && sn.slot == o.slot {
				if offPend[sn] != nil || sn.pend != x {
					bad("seq %d: offload of the snapshot at %d pending on another sequence or twice", id, sn.pos)
				}
				offPend[sn] = x
			}
		}
		if sn := x.src; sn != nil {
			snapPins[sn]++
			if !s.New() || sn.host && l.source(sn.node) != sn || !sn.host && l.snaps[sn.node] != sn {
				bad("seq %d: reuse source pinned but not installed, or kept past the first commit", id)
			}
		}
	})
	if live != l.liveUsed || live > l.live {
		bad("ssm: %d live slots held, counted %d, at most %d (max_batch_size × pipeline_parallel_size)", live, l.liveUsed, l.live)
	}
	if n := len(l.snaps) + pending; n != l.nSnaps || n > l.snapCap {
		bad("ssm: %d installed + %d written snapshots, counted %d, at most %d snapshot slots", len(l.snaps), pending, l.nSnaps, l.snapCap)
	}
	v = append(v, l.ssm.check("ssm", srefs, make([]int32, len(srefs)), func(o *snapshot, b kvcache.BlockID) bool {
		return !o.host && l.snaps[o.node] == o && o.slot == b
	})...)
	if l.host != nil {
		v = append(v, l.host.check("host-ssm", hrefs, hholds, func(o *snapshot, b kvcache.BlockID) bool {
			pending := int32(0) // the hold of the offload that writes it
			if o.pend != nil {
				pending = 1
			}
			return o.host && l.hsnaps[o.node] == o && o.slot == b && hholds[b] == pending
		})...)
		dropped := 0 // held for an offload whose snapshot went since
		for b, h := range l.host.holds {
			if h > 0 && l.host.owner[b] == nil {
				dropped++
			}
		}
		if st := l.host.stats(); st.Cached != len(l.hsnaps)+dropped {
			bad("host-ssm: stats %+v with %d host snapshots and %d slots held for dropped ones", st, len(l.hsnaps), dropped)
		}
	} else if len(l.hsnaps) > 0 {
		bad("host-ssm: %d host snapshots without a host tier", len(l.hsnaps))
	}
	if st := l.ssm.stats(); st.Cached != len(l.snaps) {
		bad("ssm: stats %+v with %d installed snapshots", st, len(l.snaps))
	}
	// The depth index against a recount from the snapshots' positions
	// (checkSnap proves each is its node's depth).
	atDepth := make([]int32, len(l.atDepth))
	for _, snaps := range []map[*cachemgrv2.Node]*snapshot{l.snaps, l.hsnaps} {
		for _, sn := range snaps {
			if d := sn.pos / tpb; d < 0 || d >= len(atDepth) {
				bad("snapshot at %d beyond the depth index (%d depths)", sn.pos, len(atDepth))
			} else {
				atDepth[d]++
			}
		}
	}
	for d, n := range atDepth {
		if n != l.atDepth[d] {
			bad("snapshots at depth %d: %d indexed, %d recounted", d, l.atDepth[d], n)
		}
	}
	// The depth of each node that holds a snapshot, and whether it is
	// attached, from the node's records (Tree.Placed), which the core's
	// part of the same deep check proves: a walk up from each snapshot's
	// node, even memoised, cost most of this check on seed-b.yaml, whose
	// snapshots lie on paths of thousands of blocks.
	checkSnap := func(n *cachemgrv2.Node, sn *snapshot, host bool, pool *slots) {
		tier := "ssm"
		if host {
			tier = "host-ssm"
		}
		d, ok := l.tree.Placed(n)
		switch {
		case sn.node != n || sn.host != host || sn.ref != n.Ref():
			bad("%s snapshot at %d keyed by another node or tier (host %v), or its node's ref wrong", tier, sn.pos, sn.host)
		case !ok:
			bad("%s snapshot at %d on a node that is not attached to the tree", tier, sn.pos)
		case !n.Stored():
			bad("%s snapshot at %d on a node that holds its pages on no tier (evicted)", tier, sn.pos)
		case d*tpb != sn.pos:
			bad("%s snapshot at %d on a node at depth %d (%d tokens)", tier, sn.pos, d, d*tpb)
		}
		if sn.level != boundaryLevel(sn.pos, l.step) {
			bad("%s snapshot at %d: level %d, want %d", tier, sn.pos, sn.level, boundaryLevel(sn.pos, l.step))
		}
		if sn.slot < 0 || int(sn.slot) >= len(pool.owner) || pool.owner[sn.slot] != sn {
			bad("%s snapshot at %d: slot %d not owned by it", tier, sn.pos, sn.slot)
		}
		if sn.pins != snapPins[sn] {
			bad("%s snapshot at %d: pins %d, recomputed %d", tier, sn.pos, sn.pins, snapPins[sn])
		}
		if sn.pend != offPend[sn] || sn.pend != nil && sn.pins != 0 {
			bad("%s snapshot at %d: pending %v, named by an outstanding offload %v, pins %d", tier, sn.pos, sn.pend != nil, offPend[sn] != nil, sn.pins)
		}
	}
	if len(l.snapList) != len(l.snaps) {
		bad("ssm: %d snapshots listed, %d installed", len(l.snapList), len(l.snaps))
	}
	for i, sn := range l.snapList {
		if int(sn.at) != i || l.snaps[sn.node] != sn {
			bad("ssm: listed snapshot %d at %d (records %d) is not its node's", sn.id, i, sn.at)
		}
		if h := sn.heap; h != nil && (h != &l.victims.cold && h != &l.victims.hot || sn.hi < 0 || int(sn.hi) >= len(h.h) || h.h[sn.hi].sn != sn) {
			bad("victim queue: snapshot %d not at the place it records (%d)", sn.id, sn.hi)
		}
	}
	// The victim queue holds listed snapshots at the places they record,
	// with their level and id, in heap order; the other keys and the heap
	// itself may be stale until the next planSnaps syncs it.
	for _, h := range []*keyHeap{&l.victims.cold, &l.victims.hot} {
		for i := range h.h {
			k := &h.h[i]
			switch sn := k.sn; {
			case sn == nil || l.snaps[sn.node] != sn || sn.heap != h || int(sn.hi) != i || k.level != sn.level || k.id != sn.id:
				bad("victim queue: entry %d is not a listed snapshot placed there", i)
			case i > 0 && h.less(k, &h.h[(i-1)/2]):
				bad("victim queue: entry %d (snapshot %d) ahead of its parent", i, sn.id)
			}
		}
	}
	for n, sn := range l.snaps {
		checkSnap(n, sn, false, l.ssm)
		if l.hsnaps[n] != nil {
			bad("snapshot at %d held on both tiers", sn.pos)
		}
	}
	if l.host != nil {
		for n, sn := range l.hsnaps {
			checkSnap(n, sn, true, l.host)
		}
	}
	return v
}
