package paged

import (
	"fmt"
	"slices"

	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
	"github.com/kvx-dev/kvx/plugins/v1/worker"
)

// MambaPass is one stretch of a Mamba2 layer's walk over a sequence's rows
// in one call: positions [From, To) run with the dt floor (kernelspec.Mamba2's
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

// CheckSnapshots checks an item's snapshot slots against the layout: each
// must be in a state pool that holds every Mamba layer of the stage. The
// runtime has checked their blocks and positions. Errors are item errors
// naming the snapshot, the pool and the layer.
func (s *Stage) CheckSnapshots(it *worker.Item) error {
	for k, sn := range it.Snapshots {
		pi := slices.IndexFunc(s.Pools, func(p kvcache.Pool) bool { return p.ID == sn.Pool })
		bad := func(format string, args ...any) error {
			return kvcache.ItemErrorf([]kvcache.SeqID{it.Seq}, "seq %d at pos %d: snapshots[%d]: "+format,
				append([]any{it.Seq, it.Pos, k}, args...)...)
		}
		if pi < 0 || s.Pools[pi].TokensPerBlock != 0 {
			return bad("pool %d is not a state pool of the layout", sn.Pool)
		}
		for _, l := range s.Mambas {
			if _, ok := s.Place[l].State[pi]; !ok {
				return bad("pool %d does not hold mamba layer %d", sn.Pool, l)
			}
		}
	}
	return nil
}
