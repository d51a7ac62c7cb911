package kvcache

import "slices"

// EventLog is a cache manager's record of the KV events since its last
// Events call (EventReporter), as kvx's managers keep it: events of one
// kind and tier recorded one after another join one event (a device
// BlockStored only when it continues the chain: its parent is the hash
// stored last), and a removal can be taken back while it is unread (an
// undone reservation gave the block back). The zero value is empty. Not
// safe for concurrent use.
type EventLog struct {
	list []Event
}

// Cleared records AllBlocksCleared.
func (l *EventLog) Cleared() { l.list = append(l.list, Event{Kind: AllBlocksCleared}) }

// Stored records that the device tier stores the block hashed h, with its
// blockSize tokens; parent is the hash of the block before it (hasParent
// false for a prompt's first block).
func (l *EventLog) Stored(h, parent uint64, hasParent bool, tokens []int32, blockSize int) {
	if k := len(l.list) - 1; k >= 0 && hasParent {
		last := &l.list[k]
		if last.Kind == BlockStored && last.Tier == TierDevice && last.Hashes[len(last.Hashes)-1] == parent {
			last.Hashes = append(last.Hashes, h)
			last.Tokens = append(last.Tokens, tokens...)
			return
		}
	}
	ev := Event{Kind: BlockStored, Hashes: []uint64{h}, Tokens: append([]int32(nil), tokens...), BlockSize: blockSize, Tier: TierDevice}
	if hasParent {
		ev.Parent, ev.HasParent = parent, true
	}
	l.list = append(l.list, ev)
}

// StoredHost records that the host tier stores the block hashed h: its
// content settled there (the device's BlockStored named its tokens and
// parent, which this one leaves out).
func (l *EventLog) StoredHost(h uint64, blockSize int) {
	if k := len(l.list) - 1; k >= 0 && l.list[k].Kind == BlockStored && l.list[k].Tier == TierHost {
		l.list[k].Hashes = append(l.list[k].Hashes, h)
		return
	}
	l.list = append(l.list, Event{Kind: BlockStored, Hashes: []uint64{h}, BlockSize: blockSize, Tier: TierHost})
}

// Removed records that tier no longer holds the block hashed h.
func (l *EventLog) Removed(tier Tier, h uint64) {
	if k := len(l.list) - 1; k >= 0 && l.list[k].Kind == BlockRemoved && l.list[k].Tier == tier {
		l.list[k].Hashes = append(l.list[k].Hashes, h)
		return
	}
	l.list = append(l.list, Event{Kind: BlockRemoved, Hashes: []uint64{h}, Tier: tier})
}

// Unremove takes h out of the unread BlockRemoved events of tier (the
// removal was undone) and reports whether it was there.
func (l *EventLog) Unremove(tier Tier, h uint64) bool {
	for k := len(l.list) - 1; k >= 0; k-- {
		ev := &l.list[k]
		if ev.Kind != BlockRemoved || ev.Tier != tier {
			continue
		}
		if i := slices.Index(ev.Hashes, h); i >= 0 {
			ev.Hashes = slices.Delete(ev.Hashes, i, i+1)
			if len(ev.Hashes) == 0 {
				l.list = slices.Delete(l.list, k, k+1)
			}
			return true
		}
	}
	return false
}

// Unread returns the events recorded since the last Take, oldest first;
// the slice is the log's.
func (l *EventLog) Unread() []Event { return l.list }

// Take returns the events recorded since the last Take, oldest first, and
// forgets them; the slice is the caller's.
func (l *EventLog) Take() []Event {
	out := l.list
	l.list = nil
	return out
}
