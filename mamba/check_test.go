package mamba

import (
	"context"
	"slices"
	"strings"
	"testing"

	cachemgrv2 "github.com/kvx-dev/kvx/cachemgr_v2"
	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
)

// TestCheckFindsCorruption: the deep self-check notices broken snapshot and
// slot bookkeeping (each corruption on a fresh manager).
func TestCheckFindsCorruption(t *testing.T) {
	const tpb = 16
	for _, tc := range []struct {
		name    string
		corrupt func(m *Manager)
	}{
		{"snapshot position", func(m *Manager) {
			for _, sn := range m.life.snaps {
				sn.pos += tpb
				return
			}
		}},
		{"snapshot pins", func(m *Manager) {
			for _, sn := range m.life.snaps {
				sn.pins++
				return
			}
		}},
		{"slot freed while owned", func(m *Manager) {
			for _, sn := range m.life.snaps {
				m.life.ssm.free = append(m.life.ssm.free, sn.slot)
				return
			}
		}},
		{"snapshot count", func(m *Manager) { m.life.nSnaps++ }},
		// victim scans snapList, not the map: the two must agree.
		{"snapshot left off the list", func(m *Manager) {
			m.life.snapList = m.life.snapList[:len(m.life.snapList)-1]
		}},
		{"list index", func(m *Manager) { m.life.snapList[0].at++ }},
		{"listed snapshot not installed", func(m *Manager) {
			sn := *m.life.snapList[0]
			m.life.snapList[0] = &sn
		}},
		{"live slot count", func(m *Manager) { m.life.liveUsed-- }},
		{"in-use slot count", func(m *Manager) { m.life.ssm.inUse++ }},
		// Reusable, release touches and the check's own walk skip the
		// depths the index says hold no snapshot.
		{"depth index", func(m *Manager) { m.life.atDepth[m.life.snapList[0].pos/tpb]-- }},
		// The victim queue outlives a planSnaps: its places and order must
		// hold between them.
		{"victim queue place", func(m *Manager) {
			m.life.victims.sync(m.life.tree, m.life.snapList)
			m.life.victims.cold.h[0].sn.hi++
		}},
		{"victim queue order", func(m *Manager) {
			m.life.victims.sync(m.life.tree, m.life.snapList)
			m.life.victims.cold.h[0].prio = kvcache.MaxPriority + 1
		}},
		{"victim queue holds a dropped snapshot", func(m *Manager) {
			m.life.victims.sync(m.life.tree, m.life.snapList)
			sn := *m.life.victims.cold.h[0].sn
			m.life.victims.cold.push(keyOf(&sn))
		}},
		{"node evicted under its snapshot", func(m *Manager) {
			// Evict behind the manager's back, as an eviction that forgets
			// the snapshot would.
			for n := m.Tree().EvictLeaf(); n != nil && m.life.snaps[n] == nil; n = m.Tree().EvictLeaf() {
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, _ := configured(t, testConfig(tpb, 256, 4+16))
			prefill(t, m, 1, tokens(10*tpb+3, 1), 4*tpb)
			release(t, m, 1)
			prefill(t, m, 2, tokens(6*tpb+1, 1), 4*tpb)
			mustClean(t, m, "before")
			tc.corrupt(m)
			if v := m.check(); len(v) == 0 {
				t.Fatal("check found nothing")
			}
		})
	}
}

// TestCheckFindsHostSnapshotCorruption: the deep self-check notices broken
// host-ssm bookkeeping: a leaked slot, a slot owned twice, a pending host
// snapshot that no offload names, a hold dropped early, a snapshot on both
// tiers (each corruption on a fresh manager with offloaded snapshots, one
// reservation's offloads still pending).
func TestCheckFindsHostSnapshotCorruption(t *testing.T) {
	const tpb = 16
	anyHost := func(m *Manager) *snapshot {
		for _, sn := range m.life.hsnaps {
			if sn.pend == nil {
				return sn
			}
		}
		return nil
	}
	for _, tc := range []struct {
		name    string
		corrupt func(m *Manager)
	}{
		{"host slot leaked", func(m *Manager) {
			// The snapshot is forgotten, its slot neither owned nor free.
			sn := anyHost(m)
			delete(m.life.hsnaps, sn.node)
			m.life.host.owner[sn.slot] = nil
		}},
		{"host slot freed while owned", func(m *Manager) {
			m.life.host.free = append(m.life.host.free, anyHost(m).slot)
		}},
		{"host slot owned twice", func(m *Manager) {
			a := anyHost(m)
			for _, sn := range m.life.hsnaps {
				if sn != a && sn.pend == nil {
					m.life.host.evict(sn.slot)
					sn.slot = a.slot
					return
				}
			}
		}},
		{"host slot given to a suspended state", func(m *Manager) {
			stateOf(m.Seq(9)).host = anyHost(m).slot
		}},
		{"pending without an offload", func(m *Manager) { anyHost(m).pend = stateOf(m.Seq(9)) }},
		{"hold dropped early", func(m *Manager) {
			x := stateOf(m.Seq(3))
			m.life.host.unhold(x.offs[0].slot)
		}},
		{"snapshot on both tiers", func(m *Manager) {
			sn := anyHost(m)
			m.life.snaps[sn.node] = &snapshot{node: sn.node, slot: sn.slot, pos: sn.pos, level: sn.level}
		}},
		{"host snapshot pins", func(m *Manager) { anyHost(m).pins++ }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, _ := configured(t, snapHostConfig(tpb))
			_, _ = offloadSetup(t, m, tpb)
			commit(t, m, kvcache.CommitItem{Seq: 2, Accepted: 4*tpb + 3})
			release(t, m, 2)
			// Seq 9 is suspended; seq 3's step evicts p2's snapshots, pending.
			reserve(t, m, kvcache.ReserveItem{Seq: 9, New: true, Tokens: 1})
			commit(t, m, kvcache.CommitItem{Seq: 9, Accepted: 1})
			if ok, _, err := m.Suspend(context.Background(), []kvcache.SeqID{9}); err != nil || !ok[0] {
				t.Fatalf("Suspend = %v, %v", ok, err)
			}
			g := reserve(t, m, kvcache.ReserveItem{Seq: 3, New: true, Prompt: tokens(4*tpb+3, 3), Tokens: 4*tpb + 3})[0]
			if len(offloads(m, g)) == 0 || anyHost(m) == nil {
				t.Fatalf("seq 3's grant %+v offloads nothing, or no cached host snapshot is left", g)
			}
			mustClean(t, m, "before")
			tc.corrupt(m)
			if v := m.check(); len(v) == 0 {
				t.Fatal("check found nothing")
			}
		})
	}
}

// TestCheckFindsDetachedSnapshotNode: a snapshot whose node was evicted and
// pruned behind the manager's back is on a node that is not attached to
// the tree (Tree.Placed), and the check says so.
func TestCheckFindsDetachedSnapshotNode(t *testing.T) {
	const tpb = 16
	m, _ := configured(t, testConfig(tpb, 256, 4+16))
	prefill(t, m, 1, tokens(10*tpb+3, 1), 4*tpb)
	release(t, m, 1)
	mustClean(t, m, "before")
	var n *cachemgrv2.Node
	for n = m.Tree().EvictLeaf(); n != nil && m.life.snaps[n] == nil; n = m.Tree().EvictLeaf() {
	}
	if n == nil {
		t.Fatal("no snapshot node to evict")
	}
	m.Tree().Prune()
	if m.Tree().Attached(n) {
		t.Fatal("Prune left the evicted snapshot node attached")
	}
	want := "not attached to the tree"
	if v := m.check(); !slices.ContainsFunc(v, func(s string) bool { return strings.Contains(s, want) }) {
		t.Errorf("check() = %q, want a violation %q", v, want)
	}
}
