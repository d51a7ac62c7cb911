package paged

import (
	"fmt"

	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
)

// MambaPass is one stretch of a Mamba2 layer's walk over a sequence's rows
// in one call: positions [From, To) run with the dt floor (kernel.Mamba2's
// DtMin) when Floor, without it otherwise; after them the state is saved
// into Snaps (the item's snapshots at To, in order) and, when Tail, kept
// for a rollback of rejected draft rows. A pass may be empty (From == To)
// when a snapshot falls where the previous one ended.
type MambaPass struct {
	From, To int
	Floor    bool
	Snaps    []kvcache.SnapshotSlot
	Tail     bool
}

// MambaPasses cuts a Mamba2 layer's rows pos..pos+rows-1 of one sequence
// into the passes every computing device makes, so their states match byte
// for byte: a pass ends at every snapshot position, where the draft tail
// (the last draft rows) begins, after every row of the tail, and at
// promptEnd, the first position without the dt floor (transformers floors
// dt in prefill only; promptEnd is the position of the sequence's first
// sampled token, or pos+rows while it has sampled none). Snapshots must be
// ascending and at positions >= pos; one before where the walk stands is an
// error.
func MambaPasses(pos, rows, draft, promptEnd int, snaps []kvcache.SnapshotSlot) ([]MambaPass, error) {
	end := pos + rows
	tailFrom := end - draft
	var ps []MambaPass
	for at := pos; at < end; {
		next := end
		if len(snaps) > 0 && snaps[0].Pos < next {
			next = snaps[0].Pos
		}
		if at >= tailFrom {
			next = at + 1
		} else if draft > 0 && tailFrom < next {
			next = tailFrom
		}
		floor := true
		if at >= promptEnd {
			floor = false // a generated token: transformers' decode step has no floor
		} else if promptEnd < next {
			next = promptEnd
		}
		if next < at {
			return nil, fmt.Errorf("snapshot at %d is before the %d tokens the state covers", next, at)
		}
		p := MambaPass{From: at, To: next, Floor: floor}
		at = next
		for len(snaps) > 0 && snaps[0].Pos == at {
			p.Snaps = append(p.Snaps, snaps[0])
			snaps = snaps[1:]
		}
		p.Tail = draft > 0 && at >= tailFrom && at < end
		ps = append(ps, p)
	}
	return ps, nil
}
