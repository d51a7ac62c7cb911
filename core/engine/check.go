package engine

import (
	"fmt"
	"strings"

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
		if p.Total != pools[i].Blocks {
			bad("pool %s: %d blocks in the snapshot, %d in the layout", pools[i].Name, p.Total, pools[i].Blocks)
		}
		if p.Free+p.Cached+p.InUse != p.Total || p.Free < 0 || p.Cached < 0 || p.InUse < 0 {
			bad("pool %s: free %d + cached %d + in use %d != total %d", pools[i].Name, p.Free, p.Cached, p.InUse, p.Total)
		}
		if pools[i].Tier == kvcache.TierDevice {
			used += p.InUse
			total += p.Total
		}
	}
	if total > 0 {
		st.usage = float64(used) / float64(total)
		st.peak = max(st.peak, st.usage)
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
			if want := kvcache.BlocksFor(s.Capacity, p.TokensPerBlock); s.Blocks[i] != want {
				bad("request %d: pool %s holds %d blocks for capacity %d, want %d", s.Seq, p.Name, s.Blocks[i], s.Capacity, want)
			}
		}
	}
	if len(snap.Seqs) != e.resident {
		bad("holds %d sequences, the engine has %d resident", len(snap.Seqs), e.resident)
	}
	if deep {
		// The snapshot is the engine's: its reference counts are recounted
		// in place (no copy of every pool's counts at every deep check);
		// the findings join Violations as "tables: ...". A plugin's server
		// has done this already (TablesChecked).
		kvcache.SealTables(pools, kvcache.InspectOptions{Tables: true, CheckTables: true}, snap)
	}
	for _, s := range snap.Violations {
		if strings.HasPrefix(s, "tables: ") {
			bad("%s", s) // found by kvcache.SealTables, here or where the tables are
		} else {
			bad("manager self-check: %s", s)
		}
	}
	return v
}
