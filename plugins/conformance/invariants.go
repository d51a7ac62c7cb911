package conformance

import (
	"fmt"
	"slices"
	"strings"

	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
)

// invariants checks a deep snapshot against the contract and returns what is
// wrong (at most a few findings):
//
//   - Violations (the manager's own self-check) is empty;
//   - one PoolStats per layout pool, in layout order, with its id and Total
//     == Blocks, and Free + Cached + InUse == Total, none negative;
//   - per sequence: 0 <= History <= Capacity <= Layout.MaxSeqTokens,
//     0 <= Draft <= Reserved, Hold >= 0; Blocks and Tables have one entry per
//     pool; a table holds blocks of its pool, each once (a negative entry, a
//     block dropped by a sliding window, only in a window pool); Blocks
//     counts them; a resident sequence's table in every full-attention device
//     pool backs its capacity: at least ceil(Capacity / TokensPerBlock) blocks;
//   - at most Layout.MaxSequences resident sequences, when it is > 0;
//   - RefCounts[pool][block] equals the references counted over all tables,
//     and InUse equals the number of referenced blocks.
func (h *mh) invariants(s kvcache.Snapshot) []string {
	var bad []string
	add := func(format string, args ...any) {
		if len(bad) < 6 {
			bad = append(bad, fmt.Sprintf(format, args...))
		}
	}
	if len(s.Violations) > 0 {
		add("Violations (the manager's self-check) = %q, want none", s.Violations)
	}
	pools := h.layout.Pools
	if len(s.Pools) != len(pools) {
		add("%d PoolStats for the layout's %d pools", len(s.Pools), len(pools))
		return bad
	}
	for i, p := range s.Pools {
		lp := pools[i]
		if p.Pool != lp.ID || p.Total != lp.Blocks {
			add("PoolStats[%d] = %+v, want pool %d with Total %d (the layout's Blocks)", i, p, lp.ID, lp.Blocks)
		}
		if p.Free < 0 || p.Cached < 0 || p.InUse < 0 || p.Free+p.Cached+p.InUse != p.Total {
			add("pool %d: Free %d + Cached %d + InUse %d != Total %d (or negative)", p.Pool, p.Free, p.Cached, p.InUse, p.Total)
		}
	}
	if len(s.RefCounts) != len(pools) {
		add("%d RefCounts for %d pools (Inspect with Tables)", len(s.RefCounts), len(pools))
		return bad
	}
	if ms := h.layout.MaxSequences; ms > 0 {
		resident := 0
		for _, st := range s.Seqs {
			if !st.Suspended {
				resident++
			}
		}
		if resident > ms {
			add("%d resident sequences > Layout.MaxSequences %d", resident, ms)
		}
	}
	refs := make([][]int32, len(pools))
	for i, lp := range pools {
		refs[i] = make([]int32, lp.Blocks)
		if len(s.RefCounts[i]) != lp.Blocks {
			add("pool %d: %d RefCounts for %d blocks", lp.ID, len(s.RefCounts[i]), lp.Blocks)
			return bad
		}
	}
	for _, st := range s.Seqs {
		if st.History < 0 || st.History > st.Capacity {
			add("seq %d: history %d, capacity %d: want 0 <= history <= capacity", st.Seq, st.History, st.Capacity)
		}
		if st.Capacity > h.layout.MaxSeqTokens {
			add("seq %d: capacity %d > Layout.MaxSeqTokens %d, the most one sequence can hold", st.Seq, st.Capacity, h.layout.MaxSeqTokens)
		}
		if st.Draft < 0 || st.Draft > st.Reserved || st.Hold < 0 {
			add("seq %d: Reserved %d, Draft %d, Hold %d: want 0 <= Draft <= Reserved, Hold >= 0", st.Seq, st.Reserved, st.Draft, st.Hold)
		}
		if len(st.Blocks) != len(pools) || len(st.Tables) != len(pools) {
			add("seq %d: %d Blocks and %d Tables for %d pools", st.Seq, len(st.Blocks), len(st.Tables), len(pools))
			continue
		}
		for i, lp := range pools {
			n := 0
			for j, b := range st.Tables[i] {
				switch {
				case b < 0 && lp.Window > 0:
					continue
				case b < 0 || int(b) >= lp.Blocks:
					add("seq %d: pool %d table[%d] = block %d, outside [0, %d)", st.Seq, lp.ID, j, b, lp.Blocks)
					continue
				case slices.Contains(st.Tables[i][:j], b):
					add("seq %d: pool %d: block %d twice in one table %v", st.Seq, lp.ID, b, st.Tables[i])
				}
				refs[i][b]++
				n++
			}
			if st.Blocks[i] != n {
				add("seq %d: pool %d: Blocks %d, its table holds %d (%v)", st.Seq, lp.ID, st.Blocks[i], n, st.Tables[i])
			}
		}
		if st.Suspended {
			continue
		}
		for _, i := range h.full {
			if need := kvcache.BlocksFor(st.Capacity, h.tpb); len(st.Tables[i]) < need {
				add("seq %d: pool %d: %d blocks back capacity %d, want ceil(%d/%d) = %d", st.Seq, pools[i].ID, len(st.Tables[i]), st.Capacity, st.Capacity, h.tpb, need)
			}
		}
	}
	for i, lp := range pools {
		used := 0
		for b, r := range s.RefCounts[i] {
			if r != refs[i][b] {
				add("pool %d block %d: RefCount %d, the tables reference it %d times", lp.ID, b, r, refs[i][b])
			}
			if r > 0 {
				used++
			}
		}
		if s.Pools[i].InUse != used {
			add("pool %d: InUse %d, %d blocks have a reference", lp.ID, s.Pools[i].InUse, used)
		}
	}
	return bad
}

// diffSnap returns the first difference between two snapshots ("" when
// equal), treating nil and empty slices alike.
func diffSnap(a, b kvcache.Snapshot) string {
	if !slices.Equal(a.Pools, b.Pools) {
		return fmt.Sprintf("pools %s, then %s", fmtPoolStats(a.Pools), fmtPoolStats(b.Pools))
	}
	if len(a.Seqs) != len(b.Seqs) {
		return fmt.Sprintf("sequences %s, then %s", fmtSeqIDs(a), fmtSeqIDs(b))
	}
	for i := range a.Seqs {
		if d := diffSeq(a.Seqs[i], b.Seqs[i]); d != "" {
			return d
		}
	}
	if len(a.RefCounts) != len(b.RefCounts) {
		return fmt.Sprintf("%d RefCounts pools, then %d", len(a.RefCounts), len(b.RefCounts))
	}
	for p := range a.RefCounts {
		if !slices.Equal(a.RefCounts[p], b.RefCounts[p]) {
			for k := range a.RefCounts[p] {
				if k >= len(b.RefCounts[p]) || a.RefCounts[p][k] != b.RefCounts[p][k] {
					return fmt.Sprintf("RefCounts[%d]: block %d differs (%v, then %v)", p, k, a.RefCounts[p], b.RefCounts[p])
				}
			}
			return fmt.Sprintf("RefCounts[%d] has %d blocks, then %d", p, len(a.RefCounts[p]), len(b.RefCounts[p]))
		}
	}
	if !slices.Equal(a.Violations, b.Violations) {
		return fmt.Sprintf("violations %q, then %q", a.Violations, b.Violations)
	}
	return ""
}

// diffSeq returns how two states of a sequence differ ("" when equal).
func diffSeq(a, b kvcache.SeqState) string {
	same := a.Seq == b.Seq && a.History == b.History && a.Capacity == b.Capacity && a.Reserved == b.Reserved &&
		a.Draft == b.Draft && a.Hold == b.Hold && a.Suspended == b.Suspended && slices.Equal(a.Blocks, b.Blocks) &&
		len(a.Tables) == len(b.Tables)
	for p := 0; same && p < len(a.Tables); p++ {
		same = slices.Equal(a.Tables[p], b.Tables[p])
	}
	if same {
		return ""
	}
	return fmt.Sprintf("%s, then %s", fmtSeq(a), fmtSeq(b))
}

func fmtSeq(s kvcache.SeqState) string {
	var b strings.Builder
	fmt.Fprintf(&b, "{seq %d history %d capacity %d reserved %d draft %d hold %d", s.Seq, s.History, s.Capacity, s.Reserved, s.Draft, s.Hold)
	if s.Suspended {
		b.WriteString(" suspended")
	}
	fmt.Fprintf(&b, " blocks %v", s.Blocks)
	if s.Tables != nil {
		fmt.Fprintf(&b, " tables %v", s.Tables)
	}
	b.WriteString("}")
	return b.String()
}

func fmtSeqIDs(s kvcache.Snapshot) string {
	ids := make([]kvcache.SeqID, len(s.Seqs))
	for i, st := range s.Seqs {
		ids[i] = st.Seq
	}
	return fmt.Sprint(ids)
}

func fmtPoolStats(ps []kvcache.PoolStats) string {
	parts := make([]string, len(ps))
	for i, p := range ps {
		parts[i] = fmt.Sprintf("pool %d: %d free + %d cached + %d in use of %d", p.Pool, p.Free, p.Cached, p.InUse, p.Total)
	}
	return "[" + strings.Join(parts, "; ") + "]"
}

func fmtPools(ps []kvcache.Pool) string {
	parts := make([]string, len(ps))
	for i, p := range ps {
		parts[i] = fmt.Sprintf("{id %d %q %s window %d tpb %d blocks %d}", p.ID, p.Name, p.Tier, p.Window, p.TokensPerBlock, p.Blocks)
	}
	return "[" + strings.Join(parts, " ") + "]"
}

func fmtConfig(c kvcache.Config) string {
	return fmt.Sprintf("{%d layers, TokensPerBlock %d, DeviceBytes %d, HostBytes %d, MaxSeqLen %d, MaxNumTokens %d, MaxBatchSize %d, MaxDraftTokens %d, EnableBlockReuse %v}",
		len(c.Layers), c.TokensPerBlock, c.DeviceBytes, c.HostBytes, c.MaxSeqLen, c.MaxNumTokens, c.MaxBatchSize, c.MaxDraftTokens, c.EnableBlockReuse)
}

func fmtReserve(items []kvcache.ReserveItem) string {
	parts := make([]string, len(items))
	for i, it := range items {
		var b strings.Builder
		fmt.Fprintf(&b, "{Seq %d Tokens %d Draft %d", it.Seq, it.Tokens, it.Draft)
		if it.Hold != 0 {
			fmt.Fprintf(&b, " Hold %d", it.Hold)
		}
		if it.New {
			b.WriteString(" New")
		}
		if it.Prompt != nil {
			fmt.Fprintf(&b, " Prompt [%d tokens]", len(it.Prompt))
		}
		if it.Reuse != 0 {
			fmt.Fprintf(&b, " Reuse %d", it.Reuse)
		}
		b.WriteString("}")
		parts[i] = b.String()
	}
	return strings.Join(parts, ", ")
}

func fmtCommit(items []kvcache.CommitItem) string {
	parts := make([]string, len(items))
	for i, it := range items {
		parts[i] = fmt.Sprintf("{Seq %d Accepted %d}", it.Seq, it.Accepted)
	}
	return strings.Join(parts, ", ")
}

func fmtDeltas(ds []kvcache.TableDelta) string {
	parts := make([]string, len(ds))
	for i, d := range ds {
		parts[i] = fmt.Sprintf("{pool %d from %d %v}", d.Pool, d.From, d.Blocks)
	}
	return "[" + strings.Join(parts, " ") + "]"
}
