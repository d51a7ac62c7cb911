package kvcache

import "fmt"

// maxTableFindings bounds what CheckTables reports: past it the tables are
// broken enough that more lines add nothing.
const maxTableFindings = 10

// CheckTables recounts the block references in snap's tables and compares
// them with its reference counts, pool by pool of pools (the manager's
// Layout.Pools): no block is owned twice except shared reuse with matching
// counts, and no table names a block beyond its pool. A negative entry is a
// released slot of a windowed pool. It returns one line per finding, at most
// maxTableFindings plus one, and none for a sound snapshot. snap needs
// InspectOptions.Tables; it is not changed.
func CheckTables(pools []Pool, snap *Snapshot) []string {
	var v []string
	if len(snap.RefCounts) != len(pools) {
		return []string{fmt.Sprintf("%d reference-count tables for %d pools", len(snap.RefCounts), len(pools))}
	}
	counts := make([][]int32, len(pools))
	for i, p := range pools {
		counts[i] = make([]int32, p.Blocks)
	}
	for _, s := range snap.Seqs {
		for p, table := range s.Tables {
			if p >= len(pools) {
				v = append(v, fmt.Sprintf("request %d: table for pool %d of %d", s.Seq, p, len(pools)))
				break
			}
			for _, b := range table {
				if b < 0 {
					continue
				}
				if int(b) >= len(counts[p]) {
					v = append(v, fmt.Sprintf("request %d: block %d beyond pool %s of %d blocks", s.Seq, b, pools[p].Name, len(counts[p])))
					continue
				}
				counts[p][b]++
			}
		}
	}
	for p := range pools {
		got := snap.RefCounts[p]
		if len(got) != len(counts[p]) {
			v = append(v, fmt.Sprintf("pool %s: %d reference counts for %d blocks", pools[p].Name, len(got), len(counts[p])))
			continue
		}
		for b, n := range counts[p] {
			if got[b] != n {
				v = append(v, fmt.Sprintf("pool %s block %d: reference count %d, tables reference it %d times", pools[p].Name, b, got[b], n))
				if len(v) > maxTableFindings {
					return v
				}
			}
		}
	}
	return v
}

// SealTables does what InspectOptions.CheckTables asks of the side that holds
// the tables: when opts asks for it and snap still carries its tables, it
// checks them with CheckTables, adds the findings to Violations (each
// starting "tables: "), drops the tables and reference counts and sets
// TablesChecked. Otherwise it leaves snap as it is.
func SealTables(pools []Pool, opts InspectOptions, snap *Snapshot) {
	if !opts.Tables || !opts.CheckTables || snap.TablesChecked {
		return
	}
	for _, f := range CheckTables(pools, snap) {
		snap.Violations = append(snap.Violations, "tables: "+f)
	}
	for i := range snap.Seqs {
		snap.Seqs[i].Tables = nil
	}
	snap.RefCounts = nil
	snap.TablesChecked = true
}
