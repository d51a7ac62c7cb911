package mamba

import (
	"slices"
	"testing"

	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
)

// TestVictimQueueMatchesScan: the victim queue that planSnaps builds at its
// second eviction picks, one eviction after another, exactly what a scan of
// the remaining snapshots picks, for snapshots on and off live paths, of
// several levels, priorities and ticks, for every level asked.
func TestVictimQueueMatchesScan(t *testing.T) {
	const tpb = 16
	cfg := testConfig(tpb, 512, 64)
	cfg.MaxBatchSize = 8
	cfg.Snapshots = kvcache.SnapshotConfig{Interval: tpb}
	m, _ := configured(t, cfg)
	for id := kvcache.SeqID(1); id <= 6; id++ {
		p := tokens(int(id+4)*tpb+3, int32(id))
		prio := 0
		if id%3 == 0 {
			prio = 80
		}
		for done, first := 0, true; done < len(p); first = false {
			n := min(2*tpb, len(p)-done)
			it := kvcache.ReserveItem{Seq: id, Tokens: n, Priority: prio}
			if first {
				it.New, it.Prompt = true, p
			}
			if g := reserve(t, m, it); !g[0].OK {
				t.Fatalf("seq %d at %d: denied: %s", id, done, g[0].Reason)
			}
			commit(t, m, kvcache.CommitItem{Seq: id, Accepted: n})
			done += n
		}
	}
	release(t, m, 1, 3, 5) // 2, 4 and 6 stay live: their snapshots are on live paths
	mustClean(t, m, "set up")
	l := &m.life
	var cold, hot int
	for _, sn := range l.snapList {
		if sn.node.Pins() == 0 {
			cold++
		} else {
			hot++
		}
	}
	if cold == 0 || hot == 0 {
		t.Fatalf("%d snapshots off live paths, %d on them; want both", cold, hot)
	}
	for _, level := range []int{0, 1, 2, 3, 64} {
		list := slices.Clone(l.snapList)
		var want []*snapshot
		for range len(list) + 1 {
			v := scanVictim(list, level)
			want = append(want, v)
			if v == nil {
				break
			}
			list = slices.DeleteFunc(list, func(sn *snapshot) bool { return sn == v })
		}
		var q victimQueue
		q.build(l.snapList)
		var got []*snapshot
		for range len(want) {
			got = append(got, q.pop(level))
		}
		t.Logf("level %d: %d snapshots off live paths, %d on them: picks %v", level, cold, hot, ids(want))
		if !slices.Equal(got, want) {
			t.Errorf("level %d: queue picks %v, scan picks %v", level, ids(got), ids(want))
		}
	}
}

func ids(sns []*snapshot) []int64 {
	out := make([]int64, len(sns))
	for i, sn := range sns {
		out[i] = -1
		if sn != nil {
			out[i] = int64(sn.id)
		}
	}
	return out
}
