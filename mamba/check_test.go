package mamba

import (
	"testing"
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
		{"live slot count", func(m *Manager) { m.life.liveUsed-- }},
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
