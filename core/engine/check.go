package engine

import (
	"fmt"

	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
)

// maxViolationsKept bounds the violations quoted in the report.
const maxViolationsKept = 10

// check compares every stage's snapshot, taken at the end of a step, with
// what the engine committed. Any difference stops the run: a manager whose
// ledger disagrees with the engine, or with another stage, is the seed-A
// failure.
func (e *Engine) check(snaps []*kvcache.Snapshot, deep bool) error {
	inv := &e.rep.Invariants
	if deep {
		inv.DeepChecks++
	}
	var v []string
	for i, st := range e.stages {
		if snaps[i] == nil {
			v = append(v, fmt.Sprintf("stage %d: no snapshot at the end of the step", i))
			continue
		}
		v = append(v, e.checkStage(st, snaps[i], deep)...)
	}
	if len(v) == 0 {
		return nil
	}
	inv.Violations += len(v)
	for _, s := range v {
		if len(inv.First) < maxViolationsKept {
			inv.First = append(inv.First, s)
		}
	}
	return fmt.Errorf("%w at step %d: %s", ErrInvariant, e.steps, v[0])
}

func (e *Engine) checkStage(st *stage, snap *kvcache.Snapshot, deep bool) []string {
	var v []string
	bad := func(format string, args ...any) {
		v = append(v, fmt.Sprintf("stage %d: ", st.idx)+fmt.Sprintf(format, args...))
	}
	cfg := e.spec.Managers[st.idx]
	pools := st.layout.Pools
	if len(snap.Pools) != len(pools) {
		bad("%d pools in the snapshot, %d in the layout", len(snap.Pools), len(pools))
		return v
	}
	var used, total int
	for i, p := range snap.Pools {
		if p.Free+p.Cached+p.InUse != p.Total || p.Free < 0 || p.Cached < 0 || p.InUse < 0 {
			bad("pool %s: free %d + cached %d + in use %d != total %d", pools[i].Name, p.Free, p.Cached, p.InUse, p.Total)
		}
		if pools[i].Tier == kvcache.TierDevice {
			used += p.InUse
			total += p.Total
		}
	}
	if total > 0 {
		st.peak = max(st.peak, float64(used)/float64(total))
	}
	limit := cfg.MaxSeqLen + cfg.MaxDraftTokens
	for _, s := range snap.Seqs {
		r := e.byID[s.Seq]
		if r == nil || !r.resident {
			bad("holds sequence %d, which the engine released or never admitted", s.Seq)
			continue
		}
		if s.History < 0 || s.History > s.Capacity {
			bad("request %d: history %d, capacity %d: need 0 <= history <= capacity", s.Seq, s.History, s.Capacity)
		}
		if s.History != r.history {
			bad("request %d: history %d, but the engine committed %d", s.Seq, s.History, r.history)
		}
		if s.Capacity > max(limit, s.Hold) {
			bad("request %d: capacity %d exceeds max_seq_len + draft = %d", s.Seq, s.Capacity, limit)
		}
		if (s.Reserved > 0) != r.reserved {
			bad("request %d: outstanding reservation %d, engine in flight %v", s.Seq, s.Reserved, r.reserved)
		}
		if s.Suspended || len(s.Blocks) != len(pools) {
			continue
		}
		for i, p := range pools {
			if p.Tier != kvcache.TierDevice || p.TokensPerBlock == 0 || p.Window > 0 {
				continue
			}
			if want := ceilDiv(s.Capacity, p.TokensPerBlock); s.Blocks[i] != want {
				bad("request %d: pool %s holds %d blocks for capacity %d, want %d", s.Seq, p.Name, s.Blocks[i], s.Capacity, want)
			}
		}
	}
	if len(snap.Seqs) != e.resident {
		bad("holds %d sequences, the engine has %d resident", len(snap.Seqs), e.resident)
	}
	for _, s := range snap.Violations {
		bad("manager self-check: %s", s)
	}
	if deep {
		v = append(v, checkRefs(st, snap)...)
	}
	return v
}

// checkRefs recounts block references from the tables and compares them with
// the manager's reference counts: no block owned twice except shared reuse
// with matching counts, no block beyond its pool.
func checkRefs(st *stage, snap *kvcache.Snapshot) []string {
	var v []string
	pools := st.layout.Pools
	if len(snap.RefCounts) != len(pools) {
		return []string{fmt.Sprintf("stage %d: %d reference-count tables for %d pools", st.idx, len(snap.RefCounts), len(pools))}
	}
	counts := make([][]int32, len(pools))
	for i, p := range pools {
		counts[i] = make([]int32, p.Blocks)
	}
	for _, s := range snap.Seqs {
		for p, table := range s.Tables {
			if p >= len(pools) {
				v = append(v, fmt.Sprintf("stage %d: request %d: table for pool %d of %d", st.idx, s.Seq, p, len(pools)))
				break
			}
			for _, b := range table {
				if b < 0 {
					continue // released slot of a windowed pool
				}
				if int(b) >= len(counts[p]) {
					v = append(v, fmt.Sprintf("stage %d: request %d: block %d beyond pool %s of %d blocks", st.idx, s.Seq, b, pools[p].Name, len(counts[p])))
					continue
				}
				counts[p][b]++
			}
		}
	}
	for p := range pools {
		got := snap.RefCounts[p]
		if len(got) != len(counts[p]) {
			v = append(v, fmt.Sprintf("stage %d: pool %s: %d reference counts for %d blocks", st.idx, pools[p].Name, len(got), len(counts[p])))
			continue
		}
		for b, n := range counts[p] {
			if got[b] != n {
				v = append(v, fmt.Sprintf("stage %d: pool %s block %d: reference count %d, tables reference it %d times", st.idx, pools[p].Name, b, got[b], n))
				if len(v) > maxViolationsKept {
					return v
				}
			}
		}
	}
	return v
}

func ceilDiv(a, b int) int { return (a + b - 1) / b }
