package paged

import (
	"reflect"
	"testing"

	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
)

func TestMambaPasses(t *testing.T) {
	snap := func(pos int) kvcache.SnapshotSlot {
		return kvcache.SnapshotSlot{Pos: pos, Pool: 1, Block: kvcache.BlockID(pos)}
	}
	for _, c := range []struct {
		name                        string
		pos, rows, draft, promptEnd int
		snaps                       []kvcache.SnapshotSlot
		want                        []MambaPass
	}{
		{"prefill in one pass", 0, 10, 0, 10, nil, []MambaPass{{From: 0, To: 10, Floor: true}}},
		{"snapshots cut it", 0, 10, 0, 10, []kvcache.SnapshotSlot{snap(4), snap(10)},
			[]MambaPass{{From: 0, To: 4, Floor: true, Snaps: []kvcache.SnapshotSlot{snap(4)}}, {From: 4, To: 10, Floor: true, Snaps: []kvcache.SnapshotSlot{snap(10)}}}},
		{"a snapshot where the walk starts", 5, 3, 0, 3, []kvcache.SnapshotSlot{snap(5)},
			[]MambaPass{{From: 5, To: 5, Snaps: []kvcache.SnapshotSlot{snap(5)}}, {From: 5, To: 8}}},
		{"the floor ends at the prompt", 0, 6, 0, 4, nil, []MambaPass{{From: 0, To: 4, Floor: true}, {From: 4, To: 6}}},
		{"decode with two drafts", 20, 3, 2, 8, nil,
			[]MambaPass{{From: 20, To: 21, Tail: true}, {From: 21, To: 22, Tail: true}, {From: 22, To: 23}}},
	} {
		got, err := MambaPasses(c.pos, c.rows, c.draft, c.promptEnd, c.snaps)
		if err != nil || !reflect.DeepEqual(got, c.want) {
			t.Errorf("%s: MambaPasses = %+v, %v; want %+v", c.name, got, err, c.want)
		}
	}
	if _, err := MambaPasses(10, 4, 0, 14, []kvcache.SnapshotSlot{snap(12), snap(11)}); err == nil {
		t.Error("snapshots out of order: no error")
	}
}
