package conformance

import (
	"fmt"
	"slices"
	"strings"

	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
)

// forkRule is the Fork check's rule, for ManagerCheckDocs.
const forkRule = "with Capabilities.Fork: the manager is a kvcache.Forker; Fork{Parent, Child} gives the child the parent's history with its full blocks shared " +
	"(RefCount 1 + children in every full-attention pool, InUse counting them once) and its last partial block copied on write " +
	"(a fresh block per child and a Copy from the parent's; state pools a fresh slot with a Copy too); the children then diverge " +
	"without touching the shared blocks; bad items are \"invalid:\" denials that leave no trace"

// fork calls Fork, which must not fail, checks the answer's shape, applies
// the granted children's tables to the worker's view at once (a fork's
// tables reach the worker with its next forward, before any commit) and
// inspects.
func (h *mh) fork(fk kvcache.Forker, items ...kvcache.ForkItem) []kvcache.Grant {
	parts := make([]string, len(items))
	for i, it := range items {
		parts[i] = fmt.Sprintf("{Parent:%d Child:%d}", it.Parent, it.Child)
	}
	h.last = "Fork(" + strings.Join(parts, " ") + ")"
	gs, err := fk.Fork(h.ctx, items)
	if err != nil {
		h.failf(h.last, "Fork fails only when the plugin is gone; a denial is OK=false with a Reason, never an error", "error %v", err)
	}
	if len(gs) != len(items) {
		h.failf(h.last, "one Grant per item, in order", "%d grants for %d items", len(gs), len(items))
	}
	for i, g := range gs {
		if g.Seq != items[i].Child {
			h.failf(h.last, "one Grant per item, in order, for the child", "grant %d is for seq %d, item %d's child is %d", i, g.Seq, i, items[i].Child)
		}
		if !g.OK && (len(g.Tables) > 0 || len(g.Copies) > 0) {
			h.failf(h.last, "a denial leaves no trace in the manager (and tells the worker nothing)",
				"child %d denied (%q) with %d table deltas and %d copies", g.Seq, g.Reason, len(g.Tables), len(g.Copies))
		}
		for _, c := range g.Copies {
			h.checkCopy(c, "Fork's Grant.Copies of child "+fmt.Sprint(g.Seq))
		}
		if g.OK {
			for _, d := range g.Tables {
				if d.From != 0 {
					h.failf(h.last, "a fork's Tables are the child's whole tables (From 0)", "child %d: %s", g.Seq, fmtDeltas(g.Tables))
				}
			}
			h.pending[g.Seq] = cloneDeltas(g.Tables)
			h.shadow[g.Seq] = h.workerTables(g.Seq)
			delete(h.pending, g.Seq)
		}
	}
	h.inspect()
	for _, g := range gs {
		if !g.OK {
			continue
		}
		st := h.mustSeq(g.Seq)
		for _, p := range h.full {
			if !slices.Equal(h.shadow[g.Seq][p], st.Tables[p]) {
				h.failf(h.last, "the worker's table (the fork's deltas) equals the manager's",
					"child %d pool %d: worker's table %v, Inspect's table %v", g.Seq, h.layout.Pools[p].ID, h.shadow[g.Seq][p], st.Tables[p])
			}
		}
	}
	return gs
}

func checkFork(h *mh) {
	h.info = h.callInfo()
	fk, isForker := h.m.(kvcache.Forker)
	if !h.info.Capabilities.Fork {
		return // the host runs each child as its own request
	}
	if !isForker {
		h.failf("Info()", "Info says Fork only for a kvcache.Forker", "Capabilities.Fork set, the manager (%T) has no Fork method", h.m)
	}
	h.setup(h.o.Reuse, nil)
	tpb := h.tpb
	const children = 3
	p := prompt(3*tpb+tpb/2, 11)
	hist := len(p) - 1 // what the engine forks at: the last prompt token is each child's own
	full := hist / tpb
	a := h.id()
	pst := h.prefill(a, p, hist)
	parent := deepSnap(h.snap)
	parentTables := slices.Clone(pst.Tables)
	inUse := map[int]int{}
	for _, ps := range h.snap.Pools {
		inUse[ps.Pool] = ps.InUse
	}

	// Bad items are denials and change nothing.
	before := deepSnap(h.snap)
	other := h.id()
	bad := h.fork(fk, kvcache.ForkItem{Parent: h.id(), Child: h.id()}, kvcache.ForkItem{Parent: a, Child: a})
	for _, g := range bad {
		if g.OK || !strings.HasPrefix(g.Reason, "invalid:") {
			h.failf(h.last, "a fork of an unknown parent, or into a sequence that exists, is a denial whose Reason starts with \"invalid:\"", "grant %+v", g)
		}
	}
	if d := diffSnap(before, h.snap); d != "" {
		h.failf(h.last, "a denied fork leaves no trace", "%s", d)
	}
	h.grant(kvcache.ReserveItem{Seq: a, Tokens: 1})
	g := h.fork(fk, kvcache.ForkItem{Parent: a, Child: other})[0]
	if g.OK || !strings.HasPrefix(g.Reason, "invalid:") {
		h.failf(h.last, "a fork of a parent with an outstanding reservation is a denial whose Reason starts with \"invalid:\"", "grant %+v", g)
	}
	h.unreserve(a)

	// n = 1 + children sequences over one prefill.
	ids := make([]kvcache.SeqID, children)
	items := make([]kvcache.ForkItem, children)
	for i := range ids {
		ids[i] = h.id()
		items[i] = kvcache.ForkItem{Parent: a, Child: ids[i]}
	}
	gs := h.fork(fk, items...)
	for i, g := range gs {
		if !g.OK {
			h.failf(h.last, "a fork whose partial block and state fit in free blocks is granted", "child %d denied: %q; pools before: %s", ids[i], g.Reason, fmtPoolStats(parent.Pools))
		}
	}
	if d := diffSeq(*seqOf(parent, a), *h.mustSeq(a)); d != "" {
		h.failf(h.last, "Fork leaves the parent as it was", "parent %d: %s", a, d)
	}
	partial := make(map[kvcache.BlockID]bool)
	for i, id := range ids {
		st := h.mustSeq(id)
		if st.History != hist || st.Capacity < hist || st.Reserved != 0 || st.Hold != 0 {
			h.failf(h.last, "a child starts at the parent's history with no reservation and no hold", "%s, want history %d", fmtSeq(*st), hist)
		}
		for _, pi := range h.full {
			pid := h.layout.Pools[pi].ID
			t := st.Tables[pi]
			if len(t) != kvcache.BlocksFor(hist, tpb) {
				h.failf(h.last, "a child holds the blocks of its history", "child %d pool %d: %d blocks %v, want %d", id, pid, len(t), t, kvcache.BlocksFor(hist, tpb))
			}
			if !slices.Equal(t[:full], parentTables[pi][:full]) {
				h.failf(h.last, "a child shares the parent's full blocks by reference", "child %d pool %d: table %v, the parent's %v", id, pid, t, parentTables[pi])
			}
			for _, b := range t[:full] {
				if r := h.snap.RefCounts[pi][b]; r != 1+children {
					h.failf(h.last, "a full block shared by a parent and its children has RefCount 1 + children", "pool %d block %d: RefCount %d, want %d", pid, b, r, 1+children)
				}
			}
			if full < len(t) {
				b, src := t[full], parentTables[pi][full]
				if b == src || partial[b] || h.snap.RefCounts[pi][b] != 1 {
					h.failf(h.last, "the last partial block is copied on write: each child writes a block of its own",
						"child %d pool %d: block %d (the parent's %d, RefCount %d)", id, pid, b, src, h.snap.RefCounts[pi][b])
				}
				partial[b] = true
				if !slices.Contains(gs[i].Copies, kvcache.Copy{SrcPool: pid, SrcBlock: src, DstPool: pid, DstBlock: b}) {
					h.failf(h.last, "the copy-on-write of the last partial block is a Copy from the parent's block to the child's",
						"child %d pool %d: copies %+v, want one %d -> %d", id, pid, gs[i].Copies, src, b)
				}
			}
		}
		for pi, pool := range h.layout.Pools {
			if pool.TokensPerBlock != 0 || pool.Tier != kvcache.TierDevice || len(parentTables[pi]) == 0 || len(st.Tables[pi]) == 0 {
				continue
			}
			src, b := parentTables[pi][0], st.Tables[pi][0]
			if b == src || !slices.Contains(gs[i].Copies, kvcache.Copy{SrcPool: pool.ID, SrcBlock: src, DstPool: pool.ID, DstBlock: b}) {
				h.failf(h.last, "a child's per-sequence state is a fresh slot with a Copy of the parent's",
					"child %d state pool %d: slot %d, the parent's %d, copies %+v", id, pool.ID, b, src, gs[i].Copies)
			}
		}
	}
	cow := kvcache.BlocksFor(hist, tpb) - full
	for _, pi := range h.full {
		pid := h.layout.Pools[pi].ID
		for _, ps := range h.snap.Pools {
			if ps.Pool == pid && ps.InUse != inUse[pid]+children*cow {
				h.failf(h.last, "the shared blocks are held once: InUse grows by the children's partial blocks only",
					"pool %d: InUse %d after the fork, %d before, want %d", pid, ps.InUse, inUse[pid], inUse[pid]+children*cow)
			}
		}
	}

	// The sequences diverge: each writes its own tokens, the shared blocks
	// stay as they were.
	all := append([]kvcache.SeqID{a}, ids...)
	for step := 0; step < tpb; step++ {
		res := make([]kvcache.ReserveItem, len(all))
		com := make([]kvcache.CommitItem, len(all))
		for i, id := range all {
			res[i], com[i] = kvcache.ReserveItem{Seq: id, Tokens: 1}, kvcache.CommitItem{Seq: id, Accepted: 1}
		}
		for _, g := range h.reserve(res...) {
			if !g.OK {
				h.failf(h.last, "the forked sequences grow like any others", "seq %d denied: %q", g.Seq, g.Reason)
			}
		}
		h.commit(com...)
	}
	for _, id := range all {
		st := h.mustSeq(id)
		for _, pi := range h.full {
			if !slices.Equal(st.Tables[pi][:full], parentTables[pi][:full]) {
				h.failf(h.last, "a forked sequence never changes the shared full blocks", "seq %d pool %d: table %v, the shared blocks %v",
					id, h.layout.Pools[pi].ID, st.Tables[pi], parentTables[pi][:full])
			}
			if full < len(st.Tables[pi]) && id != a && st.Tables[pi][full] == parentTables[pi][full] {
				h.failf(h.last, "a child writes its own copy of the partial block", "child %d pool %d writes the parent's block %d", id, h.layout.Pools[pi].ID, st.Tables[pi][full])
			}
		}
	}

	// The parent may go first: its children keep the shared blocks.
	h.release(a)
	for _, pi := range h.full {
		for _, b := range parentTables[pi][:full] {
			if r := h.snap.RefCounts[pi][b]; r != children {
				h.failf(h.last, "releasing the parent leaves its children's shared blocks held", "pool %d block %d: RefCount %d, want %d", h.layout.Pools[pi].ID, b, r, children)
			}
		}
	}
	h.release(ids...)
	for _, ps := range h.snap.Pools {
		if ps.InUse != 0 {
			h.failf(h.last, "Release of the parent and every child frees every block", "%s", fmtPoolStats(h.snap.Pools))
		}
	}

	// At a block boundary nothing is copied: every block is shared.
	b := h.id()
	q := prompt(2*tpb+1, 12)
	h.prefill(b, q, 2*tpb)
	c := h.id()
	g = h.fork(fk, kvcache.ForkItem{Parent: b, Child: c})[0]
	if !g.OK {
		h.failf(h.last, "a fork at a block boundary needs no block and is granted", "denied: %q", g.Reason)
	}
	for _, cp := range g.Copies {
		if pi := h.idx[cp.DstPool]; h.layout.Pools[pi].TokensPerBlock > 0 && slices.Contains(h.full, pi) {
			h.failf(h.last, "a fork whose history ends at a block boundary copies no attention block", "copies %+v", g.Copies)
		}
	}
	h.release(b, c)
}
