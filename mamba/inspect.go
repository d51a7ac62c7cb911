package mamba

import (
	"context"
	"fmt"
	"slices"

	cachemgrv2 "github.com/kvx-dev/kvx/cachemgr_v2"
	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
)

// Inspect implements kvcache.Manager. Sequences come in SeqID order; with
// Tables, each attention pool's table lists the sequence's blocks and the
// ssm table its live slot followed by the slots its outstanding step writes.
// Violations come from a deep self-check (see check) that recomputes every
// count, the tree and the snapshot pool.
func (m *Manager) Inspect(ctx context.Context, opts kvcache.InspectOptions) (kvcache.Snapshot, error) {
	if err := m.ready(ctx, "Inspect"); err != nil {
		return kvcache.Snapshot{}, err
	}
	snap := kvcache.Snapshot{Pools: m.poolStats()}
	np := len(snap.Pools)
	for _, id := range m.seqIDs() {
		s := m.seqs[id]
		st := kvcache.SeqState{Seq: id, History: s.led.History, Capacity: s.led.Capacity, Hold: s.led.Hold, Blocks: make([]int, np)}
		if s.led.Reserved {
			st.Reserved, st.Draft = s.led.Tokens+s.led.Draft, s.led.Draft
		}
		if opts.Tables {
			st.Tables = make([][]kvcache.BlockID, np)
		}
		for g := range m.dev {
			st.Blocks[g] = len(s.tables[g])
			if opts.Tables {
				st.Tables[g] = slices.Clone(s.tables[g])
			}
		}
		if m.ssm != nil {
			t := m.ssmTable(s)
			st.Blocks[len(m.dev)] = len(t)
			if opts.Tables {
				st.Tables[len(m.dev)] = t
			}
		}
		snap.Seqs = append(snap.Seqs, st)
	}
	if opts.Tables {
		for _, p := range m.dev {
			r := make([]int32, p.Total())
			for b := range r {
				r[b] = p.Refs(kvcache.BlockID(b))
			}
			snap.RefCounts = append(snap.RefCounts, r)
		}
		if m.ssm != nil {
			snap.RefCounts = append(snap.RefCounts, slices.Clone(m.ssm.refs))
		}
		snap.Violations = m.check()
	}
	return snap, nil
}

// ssmTable is s's table in the ssm pool: the live slot, then the slots its
// outstanding step writes.
func (m *Manager) ssmTable(s *sequence) []kvcache.BlockID {
	t := make([]kvcache.BlockID, 0, 1+len(s.pend))
	if s.live != NoBlock {
		t = append(t, s.live)
	}
	for _, p := range s.pend {
		t = append(t, p.slot)
	}
	return t
}

func (m *Manager) seqIDs() []kvcache.SeqID {
	ids := make([]kvcache.SeqID, 0, len(m.seqs))
	for id := range m.seqs {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids
}

// check is the deep self-check behind Inspect's Violations:
//
//   - per sequence: 0 <= history <= capacity <= max_seq_len+max_draft,
//     capacity == max(history, hold) without a reservation, ceil(capacity/tpb)
//     blocks in every attention group, a live slot (state pool), snapshot
//     slots only with a reservation and only at boundaries inside its step,
//     a tree path that holds the prompt's blocks in order and whose pages are
//     the table's or private;
//   - attention pools: reference counts equal those recomputed from the
//     tables, free + cached + in use == total, owned pages match their node;
//   - tree: cachemgrv2.Tree.Check with the pins recomputed from the paths;
//   - ssm pool: reference counts recomputed from live and written slots,
//     every slot in exactly one state (free once on the stack, in use, or
//     owned by exactly one installed snapshot), live slots at most
//     MaxBatchSize × Stages, snapshots at most the snapshot slots;
//   - snapshots: each sits on an attached node with all its pages, at the
//     node's depth × tpb, keyed by that node, with its level, and pins equal
//     to the sequences whose reuse copy is pending.
func (m *Manager) check() []string {
	var v []string
	bad := func(format string, args ...any) {
		if len(v) < 50 {
			v = append(v, fmt.Sprintf(format, args...))
		}
	}
	tpb := m.tpb
	refs := make([][]int32, len(m.dev))
	for g, p := range m.dev {
		refs[g] = make([]int32, p.Total())
	}
	var srefs []int32
	if m.ssm != nil {
		srefs = make([]int32, len(m.ssm.refs))
	}
	m.tree.BeginCheck()
	snapPins := map[*snapshot]int32{}
	live, pending := 0, 0
	for _, id := range m.seqIDs() {
		s := m.seqs[id]
		l := &s.led
		if l.History < 0 || l.History > l.Capacity || l.Capacity > m.maxTokens {
			bad("seq %d: history %d, capacity %d: want 0 <= history <= capacity <= %d", id, l.History, l.Capacity, m.maxTokens)
		}
		if !l.Reserved && l.Capacity != max(l.History, l.Hold) {
			bad("seq %d: capacity %d without a reservation, want max(history %d, hold %d)", id, l.Capacity, l.History, l.Hold)
		}
		want := m.blocksFor(l.Capacity)
		for g, pool := range m.dev {
			if len(s.tables[g]) != want {
				bad("seq %d: pool %s: %d table entries, want ceil(capacity %d / %d) = %d", id, m.groups[g].Name, len(s.tables[g]), l.Capacity, tpb, want)
			}
			for _, b := range s.tables[g] {
				if b < 0 || int(b) >= pool.Total() {
					bad("seq %d: pool %s: block %d out of range [0, %d)", id, m.groups[g].Name, b, pool.Total())
					continue
				}
				refs[g][b]++
			}
		}
		if m.ssm != nil {
			if s.live < 0 || int(s.live) >= len(srefs) {
				bad("seq %d: live slot %d out of range [0, %d)", id, s.live, len(srefs))
			} else {
				srefs[s.live]++
				live++
			}
			if len(s.pend) > 0 && !l.Reserved {
				bad("seq %d: %d snapshot slots written without a reservation", id, len(s.pend))
			}
			for _, p := range s.pend {
				pending++
				if p.slot < 0 || int(p.slot) >= len(srefs) {
					bad("seq %d: snapshot slot %d out of range", id, p.slot)
					continue
				}
				srefs[p.slot]++
				if p.pos <= l.History || p.pos > l.History+l.Tokens || p.pos%tpb != 0 || p.pos > len(s.prompt) {
					bad("seq %d: snapshot at %d outside its step (history %d, tokens %d, prompt blocks %d)", id, p.pos, l.History, l.Tokens, len(s.prompt)/tpb)
				}
			}
		} else if s.live != NoBlock || len(s.pend) > 0 {
			bad("seq %d: state slots on a stage without state layers", id)
		}
		if s.src != nil {
			snapPins[s.src]++
			if !s.created || m.snaps[s.src.node] != s.src {
				bad("seq %d: reuse source pinned but not installed, or kept past the first commit", id)
			}
		}
		if len(s.path) > l.History/tpb || len(s.path) > len(s.prompt)/tpb {
			bad("seq %d: tree path of %d blocks beyond history %d / prompt %d", id, len(s.path), l.History, len(s.prompt))
		}
		parent := m.tree.Root()
		for i, n := range s.path {
			m.tree.CountPin(n)
			if n.Parent() != parent {
				bad("seq %d: path node %d is not a child of path node %d", id, i, i-1)
			}
			if !slices.Equal(n.Tokens(), s.prompt[i*tpb:(i+1)*tpb]) {
				bad("seq %d: path node %d holds other tokens than prompt block %d", id, i, i)
			}
			for g, pool := range m.dev {
				if i < len(s.tables[g]) {
					if b := s.tables[g][i]; pool.Owner(b) != nil && pool.Owner(b) != n {
						bad("seq %d: pool %s: table block %d (%d) is the page of another node", id, m.groups[g].Name, i, b)
					}
				}
			}
			parent = n
		}
	}

	for g, pool := range m.dev {
		free, cached := 0, 0
		for b := range refs[g] {
			id := kvcache.BlockID(b)
			r := pool.Refs(id)
			if r != refs[g][b] {
				bad("pool %s: block %d: refcount %d, recomputed %d", m.groups[g].Name, b, r, refs[g][b])
			}
			o := pool.Owner(id)
			switch {
			case r == 0 && o == nil:
				free++
			case r == 0:
				cached++
			}
			if o != nil && o.Pages()[g] != id {
				bad("pool %s: block %d owned by a node that does not hold it", m.groups[g].Name, b)
			}
		}
		if st := pool.Stats(); st.Free != free || st.Cached != cached || st.Free+st.Cached+st.InUse != st.Total {
			bad("pool %s: stats %+v, recomputed free %d, cached %d", m.groups[g].Name, st, free, cached)
		}
	}
	v = append(v, m.tree.Check()...)

	if m.ssm == nil {
		if len(m.snaps) > 0 || m.nSnaps != 0 {
			bad("ssm: %d snapshots (%d counted) without a state pool", len(m.snaps), m.nSnaps)
		}
		return v
	}
	sp := m.ssm
	if live != m.liveUsed || live > m.live {
		bad("ssm: %d live slots held, counted %d, at most %d (max_batch_size × pipeline_parallel_size)", live, m.liveUsed, m.live)
	}
	if n := len(m.snaps) + pending; n != m.nSnaps || n > m.snapCap {
		bad("ssm: %d installed + %d written snapshots, counted %d, at most %d snapshot slots", len(m.snaps), pending, m.nSnaps, m.snapCap)
	}
	onFree := make([]bool, len(sp.refs))
	for _, b := range sp.free {
		if b < 0 || int(b) >= len(onFree) || onFree[b] {
			bad("ssm: slot %d on the free stack twice or out of range", b)
			continue
		}
		onFree[b] = true
	}
	for b := range sp.refs {
		if sp.refs[b] != srefs[b] {
			bad("ssm: slot %d: refcount %d, recomputed %d", b, sp.refs[b], srefs[b])
		}
		o := sp.owner[b]
		if o != nil && (sp.refs[b] != 0 || m.snaps[o.node] != o || o.slot != kvcache.BlockID(b)) {
			bad("ssm: slot %d owned by a snapshot that is not installed there (refs %d)", b, sp.refs[b])
		}
		if f := sp.refs[b] == 0 && o == nil; f != onFree[b] {
			bad("ssm: slot %d: unreferenced and unowned %v, on the free stack %v", b, f, onFree[b])
		}
	}
	if st := sp.stats(); st.Free+st.Cached+st.InUse != st.Total || st.Cached != len(m.snaps) {
		bad("ssm: stats %+v with %d installed snapshots", st, len(m.snaps))
	}
	// Depth of every attached node, parents first.
	depth := map[*cachemgrv2.Node]int{}
	m.tree.Walk(func(n *cachemgrv2.Node) { depth[n] = depth[n.Parent()] + 1 })
	for n, sn := range m.snaps {
		d, ok := depth[n]
		switch {
		case sn.node != n:
			bad("snapshot at %d keyed by another node", sn.pos)
		case !ok:
			bad("snapshot at %d on a node that is not attached to the tree", sn.pos)
		case !n.Complete():
			bad("snapshot at %d on a node without all its pages (evicted)", sn.pos)
		case d*tpb != sn.pos:
			bad("snapshot at %d on a node at depth %d (%d tokens)", sn.pos, d, d*tpb)
		}
		if sn.level != boundaryLevel(sn.pos, m.step) {
			bad("snapshot at %d: level %d, want %d", sn.pos, sn.level, boundaryLevel(sn.pos, m.step))
		}
		if sn.slot < 0 || int(sn.slot) >= len(sp.owner) || sp.owner[sn.slot] != sn {
			bad("snapshot at %d: slot %d not owned by it", sn.pos, sn.slot)
		}
		if sn.pins != snapPins[sn] {
			bad("snapshot at %d: pins %d, recomputed %d", sn.pos, sn.pins, snapPins[sn])
		}
	}
	return v
}
