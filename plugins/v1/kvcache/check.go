package kvcache

import (
	"fmt"
	"slices"
)

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
	if len(snap.RefCounts) != len(pools) {
		return []string{fmt.Sprintf("%d reference-count tables for %d pools", len(snap.RefCounts), len(pools))}
	}
	left := make([][]int32, len(pools))
	for i := range pools {
		left[i] = slices.Clone(snap.RefCounts[i])
	}
	return checkTables(pools, snap, left)
}

// checkTables is CheckTables, recounting in left (a copy of the reference
// counts, which it changes): every table reference takes one off its block,
// so a sound snapshot leaves zeros.
func checkTables(pools []Pool, snap *Snapshot, left [][]int32) []string {
	var v []string
	for _, s := range snap.Seqs {
		for p, table := range s.Tables {
			if p >= len(pools) {
				v = append(v, fmt.Sprintf("request %d: table for pool %d of %d", s.Seq, p, len(pools)))
				break
			}
			if len(left[p]) != pools[p].Blocks {
				continue // reported below
			}
			for _, b := range table {
				if b < 0 {
					continue
				}
				if int(b) >= len(left[p]) {
					v = append(v, fmt.Sprintf("request %d: block %d beyond pool %s of %d blocks", s.Seq, b, pools[p].Name, len(left[p])))
					continue
				}
				left[p][b]--
			}
		}
	}
	type block struct{ pool, b int }
	var odd []block
	for p := range pools {
		if len(left[p]) != pools[p].Blocks {
			v = append(v, fmt.Sprintf("pool %s: %d reference counts for %d blocks", pools[p].Name, len(left[p]), pools[p].Blocks))
			continue
		}
		for b, n := range left[p] {
			if n != 0 && len(odd) <= maxTableFindings {
				odd = append(odd, block{p, b})
			}
		}
	}
	if len(odd) == 0 {
		return v
	}
	// Name the numbers of the blocks that do not add up: recount their
	// references (a second pass, only when something is wrong).
	refs := make(map[block]int32, len(odd))
	for _, o := range odd {
		refs[o] = 0
	}
	for _, s := range snap.Seqs {
		for p, table := range s.Tables {
			for _, b := range table {
				if _, ok := refs[block{p, int(b)}]; ok {
					refs[block{p, int(b)}]++
				}
			}
		}
	}
	for _, o := range odd {
		n := refs[o]
		v = append(v, fmt.Sprintf("pool %s block %d: reference count %d, tables reference it %d times", pools[o.pool].Name, o.b, left[o.pool][o.b]+n, n))
		if len(v) > maxTableFindings {
			break
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
	var findings []string
	if len(snap.RefCounts) != len(pools) {
		findings = []string{fmt.Sprintf("%d reference-count tables for %d pools", len(snap.RefCounts), len(pools))}
	} else {
		findings = checkTables(pools, snap, snap.RefCounts) // dropped below: recount in place
	}
	for _, f := range findings {
		snap.Violations = append(snap.Violations, "tables: "+f)
	}
	for i := range snap.Seqs {
		snap.Seqs[i].Tables = nil
	}
	snap.RefCounts = nil
	snap.TablesChecked = true
}
