package mamba

import (
	"slices"
	"testing"

	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
)

// TestVictimQueueMatchesScan: the victim queue, synced, picks one eviction
// after another exactly what a scan of the remaining snapshots picks (the
// rule victim's doc states), for snapshots on and off live paths, of
// several levels, priorities and ticks, for every level asked; and it
// stays so, kept across changes the core makes without telling the hooks
// (a release unpins and touches a path, a new sequence pins one and
// raises its nodes' priority, commits install more, a reuse pins and
// touches a snapshot until its commit; and keys that change within a
// heap: a live path's priority rises, a release touches snapshots that
// another live path keeps hot, a cold node's priority expires).
func TestVictimQueueMatchesScan(t *testing.T) {
	const tpb = 16
	cfg := testConfig(tpb, 512, 64)
	cfg.MaxBatchSize = 8
	cfg.Snapshots = kvcache.SnapshotConfig{Interval: tpb}
	m, _ := configured(t, cfg)
	var now int64 // engine time: seq 3's priority lasts until 1000
	run := func(id kvcache.SeqID, p []int32, prio int) {
		t.Helper()
		reuse := lookup(t, m, p)
		for done, first := reuse, true; done < len(p); first = false {
			n := min(2*tpb, len(p)-done)
			it := kvcache.ReserveItem{Seq: id, Tokens: n, Priority: prio, Now: now}
			if id == 3 {
				it.PriorityDuration = 1000
			}
			if first {
				it.New, it.Prompt, it.Reuse = true, p, reuse
			}
			if g := reserve(t, m, it); !g[0].OK {
				t.Fatalf("seq %d at %d: denied: %s", id, done, g[0].Reason)
			}
			commit(t, m, kvcache.CommitItem{Seq: id, Accepted: n})
			done += n
		}
	}
	for id := kvcache.SeqID(1); id <= 6; id++ {
		prio := 0
		if id%3 == 0 {
			prio = 80
		}
		run(id, tokens(int(id+4)*tpb+3, int32(id)), prio)
	}
	release(t, m, 1, 3, 5) // 2, 4 and 6 stay live: their snapshots are on live paths
	l := &m.life
	picks := func(when string) {
		t.Helper()
		mustClean(t, m, when)
		var cold, hot int
		for _, sn := range l.snapList {
			if sn.node.Pins() == 0 {
				cold++
			} else {
				hot++
			}
		}
		if cold == 0 || hot == 0 {
			t.Fatalf("%s: %d snapshots off live paths, %d on them; want both", when, cold, hot)
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
			// The manager's own queue: what the pops take out, the next
			// sync puts back, as it does for a snapshot unpinned since.
			l.victims.sync(l.tree, l.snapList)
			var got []*snapshot
			for range len(want) {
				got = append(got, l.victims.pop(level))
			}
			t.Logf("%s, level %d: %d snapshots off live paths, %d on them: picks %v", when, level, cold, hot, ids(want))
			if !slices.Equal(got, want) {
				t.Errorf("%s, level %d: queue picks %v, scan picks %v", when, level, ids(got), ids(want))
			}
		}
		l.victims.sync(l.tree, l.snapList)
		mustClean(t, m, when+", synced")
	}
	picks("set up")
	release(t, m, 2)
	picks("seq 2 released")
	run(7, tokens(5*tpb+3, 1), 90) // reuses seq 1's prefix at a higher priority
	picks("seq 7 reuses seq 1's prefix")
	run(8, tokens(9*tpb+3, 8), 0)
	picks("seq 8 installs more")
	p := tokens(6*tpb+3, 4) // seq 4's prefix: its snapshot at 6 blocks, pinned until the commit
	reuse := lookup(t, m, p)
	if g := reserve(t, m, kvcache.ReserveItem{Seq: 9, New: true, Prompt: p, Reuse: reuse, Tokens: len(p) - reuse}); !g[0].OK || reuse != 6*tpb {
		t.Fatalf("seq 9: reuse %d, grant %+v", reuse, g[0])
	}
	if src := stateOf(m.Seq(9)).src; src == nil || src.pins == 0 {
		t.Fatalf("seq 9: reuse source %v not pinned", src)
	}
	picks("seq 9's reuse source pinned")
	commit(t, m, kvcache.CommitItem{Seq: 9, Accepted: len(p) - reuse})
	picks("seq 9 committed")
	run(10, tokens(5*tpb+3, 4), 0)
	release(t, m, 9, 10)
	picks("seqs 9 and 10 released: seq 4's first snapshots touched, still hot")
	run(12, tokens(5*tpb+3, 8), 95) // on seq 8's live path: its nodes' priority rises while they stay hot
	picks("seq 12 raises seq 8's priority")
	now = 2000
	run(11, tokens(3*tpb+3, 11), 0)
	picks("seq 3's priority expired: its snapshots' falls, still cold")
}

// scanVictim is victim's rule as a scan of list (every installed
// snapshot), the definition the victim queue is held to.
func scanVictim(list []*snapshot, level int) *snapshot {
	var cold, hot *snapshot
	var ck, hk victimKey
	for _, sn := range list {
		if sn.pins > 0 {
			continue
		}
		k := keyOf(sn)
		if sn.node.Pins() == 0 {
			if cold == nil || coldLess(&k, &ck) {
				cold, ck = sn, k
			}
		} else if hot == nil || hotLess(&k, &hk) {
			hot, hk = sn, k
		}
	}
	if cold != nil {
		return cold
	}
	if hot != nil && hot.level < level {
		return hot
	}
	return nil
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
