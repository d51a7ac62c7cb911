package conformance

import (
	"fmt"
	"math/rand/v2"
	"slices"

	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
)

// rseq is the random driver's model of one sequence.
type rseq struct {
	id        kvcache.SeqID
	prompt    []int32
	target    int // history at which the request is finished
	history   int
	hold      int // the largest Hold asked for since it was created
	suspended bool

	reserved      bool
	tokens, draft int
	created       bool             // the outstanding reservation created it
	pre           kvcache.SeqState // its state before the outstanding reservation
	preHold       int
}

// driver is the seeded random driver of checkRandom.
type driver struct {
	h     *mh
	rng   *rand.Rand
	seqs  []*rseq // live, in creation order
	bases [][]int32
	stats kvcache.Stats
	op    int
	n     driverCounts
}

// driverCounts tally what the random driver did, for its log line.
type driverCounts struct {
	grants, denials, commits, badCommits, unreserves, releases, lookups, moves, reused int
}

func checkRandom(h *mh) {
	h.setup(h.o.Reuse, nil)
	seed := h.o.Seed
	if h.o.Logf != nil {
		h.o.Logf("conformance Random: seed %d, %d operations (ManagerOptions.Seed and RandomOps)", seed, h.o.RandomOps)
	}
	d := &driver{h: h, rng: rand.New(rand.NewPCG(seed, 0x6b7678))}
	defer func() {
		if r := recover(); r != nil {
			if f, ok := r.(failure); ok {
				f.v.Call = fmt.Sprintf("seed %d, operation %d of %d: %s", seed, d.op, h.o.RandomOps, f.v.Call)
			}
			panic(r)
		}
	}()
	for range 4 {
		b := make([]int32, 6*h.tpb)
		for i := range b {
			b[i] = int32(d.rng.IntN(30000) + 1)
		}
		d.bases = append(d.bases, b)
	}
	d.stats = h.statsAgree()
	for d.op = 1; d.op <= h.o.RandomOps; d.op++ {
		d.step()
		d.checkModel()
	}
	if h.o.Logf != nil {
		h.o.Logf("conformance Random: %+v; final stats %+v", d.n, d.stats)
	}
	// Drain: commit what is reserved, release everything; nothing stays in use.
	var coms []kvcache.CommitItem
	for _, s := range d.seqs {
		if s.reserved {
			coms = append(coms, kvcache.CommitItem{Seq: s.id, Accepted: s.tokens})
		}
	}
	if len(coms) > 0 {
		h.commit(coms...)
	}
	var ids []kvcache.SeqID
	for _, s := range d.seqs {
		ids = append(ids, s.id)
	}
	if len(ids) > 0 {
		h.release(ids...)
	}
	for _, ps := range h.snap.Pools {
		if ps.InUse != 0 {
			h.failf(h.last, "Release of every sequence leaves no block in use", "%s", fmtPoolStats(h.snap.Pools))
		}
	}
}

func (d *driver) step() {
	w := d.rng.IntN(100)
	switch {
	case w < 32:
		d.reserve()
	case w < 64:
		d.commit()
	case w < 72:
		d.unreserve()
	case w < 85:
		d.release()
	case w < 90:
		d.lookup()
	default:
		if d.h.sp != nil && d.h.info.Capabilities.HostTier {
			d.move()
		} else {
			d.release()
		}
	}
}

// pick returns up to n distinct live sequences that satisfy ok, at random.
func (d *driver) pick(n int, ok func(*rseq) bool) []*rseq {
	var c []*rseq
	for _, s := range d.seqs {
		if ok(s) {
			c = append(c, s)
		}
	}
	d.rng.Shuffle(len(c), func(i, j int) { c[i], c[j] = c[j], c[i] })
	return c[:min(n, len(c))]
}

func (d *driver) find(id kvcache.SeqID) *rseq {
	for _, s := range d.seqs {
		if s.id == id {
			return s
		}
	}
	return nil
}

func (d *driver) remove(id kvcache.SeqID) {
	d.seqs = slices.DeleteFunc(d.seqs, func(s *rseq) bool { return s.id == id })
}

// newPrompt is a prompt that shares a prefix with others (block reuse).
func (d *driver) newPrompt() []int32 {
	h := d.h
	base := d.bases[d.rng.IntN(len(d.bases))]
	shared := d.rng.IntN(len(base) + 1)
	n := max(1, shared+d.rng.IntN(20*h.tpb))
	n = min(n, h.cfg.MaxSeqLen/2)
	p := make([]int32, n)
	copy(p, base[:min(shared, n)])
	for i := min(shared, n); i < n; i++ {
		p[i] = int32(d.rng.IntN(30000) + 1)
	}
	return p
}

func (d *driver) chunk() int {
	return 1 + d.rng.IntN(d.h.cfg.MaxNumTokens)
}

func (d *driver) reserve() {
	h := d.h
	n := 1 + d.rng.IntN(3)
	ready := d.pick(n, func(s *rseq) bool { return !s.reserved && !s.suspended && s.history < s.target })
	var items []kvcache.ReserveItem
	var news []*rseq
	for i := 0; i < n; i++ {
		if i < len(ready) && d.rng.IntN(10) < 7 {
			s := ready[i]
			it := kvcache.ReserveItem{Seq: s.id}
			if s.history < len(s.prompt) {
				it.Tokens = min(d.chunk(), len(s.prompt)-s.history)
			} else {
				it.Tokens, it.Draft = 1, d.rng.IntN(h.cfg.MaxDraftTokens+1)
			}
			items = append(items, it)
			continue
		}
		if len(d.seqs)+len(news) >= 3*h.cfg.MaxBatchSize {
			continue
		}
		s := &rseq{id: h.id(), prompt: d.newPrompt()}
		s.target = min(len(s.prompt)+1+d.rng.IntN(48), h.cfg.MaxSeqLen)
		it := kvcache.ReserveItem{Seq: s.id, New: true}
		if h.cfg.EnableBlockReuse {
			it.Prompt = s.prompt
			if d.rng.IntN(10) < 7 {
				got := h.lookup(kvcache.LookupItem{Seq: s.id, Prompt: s.prompt})
				it.Reuse = got[0] - h.tpb*d.rng.IntN(2)
				it.Reuse = max(it.Reuse, 0)
			}
		}
		it.Tokens = min(d.chunk(), len(s.prompt)-it.Reuse)
		if d.rng.IntN(10) == 0 {
			it.Hold = d.rng.IntN(s.target + 1)
		}
		items = append(items, it)
		news = append(news, s)
	}
	if len(items) == 0 {
		return
	}
	before := h.snap
	gs := h.reserve(items...)
	// free is a lower bound of each full-attention device pool's free
	// blocks when item i is processed: earlier grants took at most the
	// blocks they added.
	free := make([]int, len(h.layout.Pools))
	for _, p := range h.full {
		free[p] = before.Pools[p].Free
	}
	for i, g := range gs {
		it := items[i]
		s := d.find(it.Seq)
		if s == nil {
			s = news[slices.IndexFunc(news, func(x *rseq) bool { return x.id == it.Seq })]
		}
		need, have := d.need(before, it, s)
		if !g.OK {
			fits := true
			for _, p := range h.full {
				fits = fits && need-have[p] <= free[p]
			}
			if fits {
				h.failf(h.last, "a reservation is denied only when it does not fit: the driver sends only valid items",
					"seq %d denied (%q) needing %d blocks (capacity %d tokens) with at least %d free in every full-attention pool before it: %s",
					it.Seq, g.Reason, need, need*h.tpb, minOf(free, h.full), fmtPoolStats(before.Pools))
			}
		} else {
			st := h.mustSeq(it.Seq)
			for _, p := range h.full {
				free[p] -= max(len(st.Tables[p])-have[p], 0)
			}
		}
		if !g.OK {
			d.n.denials++
			if it.New {
				if seqOf(h.snap, it.Seq) != nil {
					h.failf(h.last, "a denied new sequence leaves no trace", "seq %d listed", it.Seq)
				}
			} else if diff := diffSeq(*seqOf(before, it.Seq), *h.mustSeq(it.Seq)); diff != "" {
				h.failf(h.last, "a denial leaves no trace in the manager", "seq %d: %s", it.Seq, diff)
			}
			continue
		}
		d.n.grants++
		if it.Reuse > 0 {
			d.n.reused++
		}
		if it.New {
			s.history = it.Reuse
			s.created = true
			d.seqs = append(d.seqs, s)
		} else {
			s.created = false
			s.pre = *seqOf(before, it.Seq)
		}
		s.reserved, s.tokens, s.draft = true, it.Tokens, it.Draft
		s.preHold = s.hold
		s.hold = max(s.hold, it.Hold)
		st := h.mustSeq(s.id)
		h.afterReserve(st, s.history, it.Tokens, it.Draft)
		if st.Capacity < s.hold {
			h.failf(h.last, "Reserve{Hold h}: capacity >= h", "%s, want capacity >= %d", fmtSeq(*st), s.hold)
		}
	}
}

// need returns the blocks per full-attention pool that item it needs after
// it is granted, and the blocks its sequence holds before (per pool index).
func (d *driver) need(before kvcache.Snapshot, it kvcache.ReserveItem, s *rseq) (int, []int) {
	h := d.h
	have := make([]int, len(h.layout.Pools))
	var tokens int
	if it.New {
		tokens = max(it.Reuse+it.Tokens+it.Draft, it.Hold)
		reused := it.Reuse / h.tpb
		if d.hostReuse() {
			reused = 0 // a reused block may come back from the host into a fresh device block
		}
		for _, p := range h.full {
			have[p] = reused
		}
	} else {
		st := seqOf(before, it.Seq)
		tokens = max(st.Capacity, st.History+it.Tokens+it.Draft, st.Hold, it.Hold)
		for _, p := range h.full {
			have[p] = len(st.Tables[p])
		}
	}
	return kvcache.BlocksFor(tokens, h.tpb), have
}

func minOf(v []int, at []int) int {
	m := -1
	for _, i := range at {
		if m < 0 || v[i] < m {
			m = v[i]
		}
	}
	return m
}

func (d *driver) commit() {
	h := d.h
	ss := d.pick(1+d.rng.IntN(3), func(s *rseq) bool { return s.reserved })
	if len(ss) == 0 {
		return
	}
	var items []kvcache.CommitItem
	for _, s := range ss {
		items = append(items, kvcache.CommitItem{Seq: s.id, Accepted: s.tokens + d.rng.IntN(s.draft+1)})
	}
	var bad *rseq
	if len(ss) > 1 && d.rng.IntN(8) == 0 {
		bad = ss[len(ss)-1]
		if d.rng.IntN(2) == 0 || bad.tokens == 0 {
			items[len(items)-1].Accepted = bad.tokens + bad.draft + 1
		} else {
			items[len(items)-1].Accepted = bad.tokens - 1
		}
		ss = ss[:len(ss)-1]
	}
	before := h.snap
	d.n.commits++
	if bad != nil {
		d.n.badCommits++
	}
	_, err := h.commitRaw(items)
	if bad != nil {
		var good []kvcache.SeqID
		for _, s := range ss {
			good = append(good, s.id)
		}
		h.itemErr(err, []kvcache.SeqID{bad.id}, good, "a Commit item out of [Tokens, Tokens+Draft] is an item-scoped error")
	} else if err != nil {
		h.failf(h.last, "Commit of reserved sequences with Tokens <= Accepted <= Tokens+Draft cannot fail", "error %v", err)
	}
	h.inspect()
	h.noAlloc(before)
	if bad != nil {
		if diff := diffSeq(*seqOf(before, bad.id), *h.mustSeq(bad.id)); diff != "" {
			h.failf(h.last, "a bad Commit item changes nothing for its sequence", "seq %d: %s", bad.id, diff)
		}
	}
	for i, s := range ss {
		s.history += items[i].Accepted
		s.reserved, s.created, s.tokens, s.draft = false, false, 0, 0
		h.afterCommit(h.mustSeq(s.id), s.history, s.hold)
	}
}

func (d *driver) unreserve() {
	h := d.h
	ss := d.pick(1+d.rng.IntN(2), func(s *rseq) bool { return s.reserved })
	if len(ss) == 0 {
		return
	}
	ids := make([]kvcache.SeqID, len(ss))
	for i, s := range ss {
		ids[i] = s.id
	}
	h.unreserve(ids...)
	d.n.unreserves++
	for _, s := range ss {
		if s.created {
			if seqOf(h.snap, s.id) != nil {
				h.failf(h.last, "Unreserve of a new sequence's reservation makes it disappear", "seq %d listed: %s", s.id, fmtSeq(*seqOf(h.snap, s.id)))
			}
			d.remove(s.id)
			continue
		}
		if diff := diffSeq(s.pre, *h.mustSeq(s.id)); diff != "" {
			h.failf(h.last, "Unreserve restores the sequence's state before Reserve exactly", "seq %d: %s", s.id, diff)
		}
		s.reserved, s.tokens, s.draft, s.hold = false, 0, 0, s.preHold
	}
}

func (d *driver) release() {
	h := d.h
	ss := d.pick(2, func(s *rseq) bool { return !s.reserved && s.history >= s.target })
	if len(ss) == 0 && d.rng.IntN(3) == 0 {
		ss = d.pick(1, func(s *rseq) bool { return !s.reserved }) // preemption
	}
	if len(ss) == 0 {
		return
	}
	ids := make([]kvcache.SeqID, len(ss))
	for i, s := range ss {
		ids[i] = s.id
	}
	if d.rng.IntN(10) == 0 {
		unknown := h.id()
		all := append(slices.Clone(ids), unknown)
		h.last = fmt.Sprintf("Release(%v)", all)
		err := h.m.Release(h.ctx, all)
		h.itemErr(err, []kvcache.SeqID{unknown}, ids, "Release of an unknown sequence is an item-scoped error")
		for _, id := range ids {
			delete(h.shadow, id)
		}
		h.inspect()
	} else {
		h.release(ids...)
	}
	d.n.releases++
	for _, id := range ids {
		if seqOf(h.snap, id) != nil {
			h.failf(h.last, "Release frees the sequence", "seq %d listed", id)
		}
		d.remove(id)
	}
}

func (d *driver) lookup() {
	var items []kvcache.LookupItem
	for range 1 + d.rng.IntN(3) {
		items = append(items, kvcache.LookupItem{Seq: d.h.id(), Prompt: d.newPrompt()})
	}
	d.n.lookups++
	d.h.lookup(items...)
}

// move suspends resident sequences or resumes suspended ones.
func (d *driver) move() {
	h := d.h
	suspend := d.rng.IntN(2) == 0
	ss := d.pick(1+d.rng.IntN(2), func(s *rseq) bool { return !s.reserved && s.suspended != suspend })
	if len(ss) == 0 {
		return
	}
	ids := make([]kvcache.SeqID, len(ss))
	for i, s := range ss {
		ids[i] = s.id
	}
	before := h.snap
	var ok []bool
	var cs []kvcache.Copy
	var err error
	if suspend {
		h.last = fmt.Sprintf("Suspend(%v)", ids)
		ok, cs, err = h.sp.Suspend(h.ctx, ids)
	} else {
		h.last = fmt.Sprintf("Resume(%v)", ids)
		ok, cs, err = h.sp.Resume(h.ctx, ids)
	}
	if err != nil || len(ok) != len(ids) {
		h.failf(h.last, "Suspend and Resume of live sequences without a reservation answer one bool per sequence", "%v, error %v", ok, err)
	}
	// Suspend copies device to host. Resume copies host to device, and may
	// first move cached device blocks it evicts to the host tier (device to
	// host), each before any copy that writes that device block again.
	written := map[[2]int]bool{} // device blocks a Resume copy wrote
	for _, c := range cs {
		h.checkCopy(c, "copies")
		src, dst := h.layout.Pools[h.idx[c.SrcPool]].Tier, h.layout.Pools[h.idx[c.DstPool]].Tier
		switch {
		case suspend && (src != kvcache.TierDevice || dst != kvcache.TierHost):
			h.failf(h.last, "Suspend copies device to host", "copy %+v", c)
		case !suspend && src == kvcache.TierHost && dst == kvcache.TierDevice:
			written[[2]int{c.DstPool, int(c.DstBlock)}] = true
		case !suspend && src == kvcache.TierDevice && dst == kvcache.TierHost:
			if written[[2]int{c.SrcPool, int(c.SrcBlock)}] {
				h.failf(h.last, "a Resume offload reads an evicted device block before any copy writes it", "copy %+v after a copy into that block", c)
			}
		case !suspend:
			h.failf(h.last, "Resume copies host to device (and offloads device to host)", "copy %+v", c)
		}
	}
	h.inspect()
	d.n.moves++
	for i, s := range ss {
		st, pre := h.mustSeq(s.id), seqOf(before, s.id)
		if st.History != pre.History || st.Capacity != pre.Capacity || st.Hold != pre.Hold {
			h.failf(h.last, "Suspend and Resume keep the ledger", "%s, before %s", fmtSeq(*st), fmtSeq(*pre))
		}
		if ok[i] {
			s.suspended = suspend
		}
		if st.Suspended != s.suspended {
			h.failf(h.last, "Suspend reports true for a sequence it moved (false: it stays resident); Resume true for one it brought back",
				"seq %d: answered %v, Inspect Suspended %v", s.id, ok[i], st.Suspended)
		}
	}
}

// checkModel compares the manager's ledger with the driver's model and the
// counters with their previous values.
func (d *driver) checkModel() {
	h := d.h
	if len(h.snap.Seqs) != len(d.seqs) {
		var want []kvcache.SeqID
		for _, s := range d.seqs {
			want = append(want, s.id)
		}
		slices.Sort(want)
		h.failf(h.last, "Inspect lists exactly the live sequences", "Inspect %s, live %v", fmtSeqIDs(h.snap), want)
	}
	for _, s := range d.seqs {
		st := h.mustSeq(s.id)
		res := 0
		if s.reserved {
			res = s.tokens + s.draft
		}
		if st.History != s.history || st.Reserved != res || st.Suspended != s.suspended || st.Capacity < s.hold ||
			st.Capacity < s.history+res {
			h.failf(h.last, "the ledger follows the calls: history += Accepted, Reserved = Tokens+Draft while outstanding, capacity >= max(hold, history+Reserved)",
				"%s, want history %d, reserved %d, suspended %v, hold %d", fmtSeq(*st), s.history, res, s.suspended, s.hold)
		}
	}
	st := h.statsAgree()
	if st.LookupTokens < d.stats.LookupTokens || st.ReserveDenials < d.stats.ReserveDenials || st.Evictions < d.stats.Evictions {
		h.failf("Stats() after "+h.last, "Stats are cumulative counters: LookupTokens, ReserveDenials and Evictions never decrease",
			"%+v, before %+v", st, d.stats)
	}
	d.stats = st
}

// hostReuse reports whether the manager's host pools may serve prefix
// reuse (a layout with host pools: cachemgr_v1's keep evicted reusable
// blocks, v2's and mamba's keep them beside suspended sequences): reusing a
// block the host holds takes a device block. A manager whose host pools
// only suspend is judged as loosely, never wrongly.
func (d *driver) hostReuse() bool {
	for _, p := range d.h.layout.Pools {
		if p.Tier == kvcache.TierHost && p.Blocks > 0 {
			return true
		}
	}
	return false
}
