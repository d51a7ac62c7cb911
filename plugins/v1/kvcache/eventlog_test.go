package kvcache

import (
	"reflect"
	"testing"
)

// TestEventLogJoins: a chain of device stores joins one event, a store
// that does not continue it starts another, host stores join each other but
// never a device store, removals join within their tier only, Unremove
// takes an unread removal back (dropping an emptied event), and Take hands
// over and forgets.
func TestEventLogJoins(t *testing.T) {
	var l EventLog
	l.Cleared()
	l.Stored(1, 0, false, []int32{1, 2}, 2)
	l.Stored(2, 1, true, []int32{3, 4}, 2) // continues the chain
	l.Stored(7, 5, true, []int32{9, 9}, 2) // another chain
	l.StoredHost(2, 2)
	l.StoredHost(1, 2)
	l.Stored(8, 7, true, []int32{0, 0}, 2) // after a host store: a new event
	l.Removed(TierDevice, 1)
	l.Removed(TierDevice, 2)
	l.Removed(TierHost, 1)
	if !l.Unremove(TierDevice, 2) || l.Unremove(TierDevice, 9) || !l.Unremove(TierHost, 1) || l.Unremove(TierHost, 1) {
		t.Fatal("Unremove: want true for unread removals of the tier, false otherwise")
	}
	want := []Event{
		{Kind: AllBlocksCleared},
		{Kind: BlockStored, Hashes: []uint64{1, 2}, Tokens: []int32{1, 2, 3, 4}, BlockSize: 2, Tier: TierDevice},
		{Kind: BlockStored, Hashes: []uint64{7}, Parent: 5, HasParent: true, Tokens: []int32{9, 9}, BlockSize: 2, Tier: TierDevice},
		{Kind: BlockStored, Hashes: []uint64{2, 1}, BlockSize: 2, Tier: TierHost},
		{Kind: BlockStored, Hashes: []uint64{8}, Parent: 7, HasParent: true, Tokens: []int32{0, 0}, BlockSize: 2, Tier: TierDevice},
		{Kind: BlockRemoved, Hashes: []uint64{1}, Tier: TierDevice},
	}
	if got := l.Take(); !reflect.DeepEqual(got, want) {
		t.Fatalf("events\n%+v\nwant\n%+v", got, want)
	}
	if got := l.Take(); len(got) != 0 {
		t.Fatalf("a second Take gave %+v, want nothing", got)
	}
}
