package mamba

import (
	"context"
	"slices"
	"testing"

	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
)

// snapHostConfig is a stage whose ssm pool holds 4 snapshot slots beside its
// 4 live states, with a host tier as large as the device budget: a
// 67-token prompt fills the snapshot slots (boundaries 16, 32, 48, 64).
func snapHostConfig(tpb int) kvcache.Config {
	cfg := testConfig(tpb, 256, 4+4)
	cfg.HostBytes = cfg.DeviceBytes
	return cfg
}

// offloadSetup caches p1's 4 snapshots, then reserves seq 2's whole 67-token
// prompt p2 in one step, whose 4 snapshot slots evict p1's: it returns p1
// and seq 2's grant, whose reservation is outstanding.
func offloadSetup(t *testing.T, m *Manager, tpb int) ([]int32, kvcache.Grant) {
	t.Helper()
	p1 := tokens(4*tpb+3, 1)
	prefill(t, m, 1, p1, 8*tpb)
	release(t, m, 1)
	if n := lookup(t, m, p1); n != 4*tpb || len(m.life.snaps) != 4 {
		t.Fatalf("Lookup = %d with %d snapshots after caching p1, want %d with 4", n, len(m.life.snaps), 4*tpb)
	}
	p2 := tokens(4*tpb+3, 2)
	g := reserve(t, m, kvcache.ReserveItem{Seq: 2, New: true, Prompt: p2, Tokens: len(p2)})[0]
	if !g.OK || len(g.Snapshots) != 4 {
		t.Fatalf("Reserve(p2) = %+v, want granted with 4 snapshot slots", g)
	}
	return p1, g
}

// offloads returns the grant's ssm -> host-ssm copies.
func offloads(m *Manager, g kvcache.Grant) []kvcache.Copy {
	var out []kvcache.Copy
	for _, c := range g.Copies {
		if c.SrcPool == m.life.ssm.id && c.DstPool == m.life.host.id {
			out = append(out, c)
		}
	}
	return out
}

// TestSnapshotsOffloadToHost: with a host tier, the snapshots a reservation
// evicts from their ssm slots move to host-ssm slots (copies ssm ->
// host-ssm in its grant, from exactly the slots the step then writes), are
// invisible while that reservation is outstanding, count as boundary hits
// once it commits (Lookup as before the eviction), and a new sequence that
// reuses them gets a host-ssm -> live copy, the source pinned until its
// commit, and the full boundary.
func TestSnapshotsOffloadToHost(t *testing.T) {
	const tpb = 16
	ctx := context.Background()
	m, _ := configured(t, snapHostConfig(tpb))
	p1, g := offloadSetup(t, m, tpb)
	offs := offloads(m, g)
	var from, written []kvcache.BlockID
	for _, c := range offs {
		from = append(from, c.SrcBlock)
	}
	for _, ss := range g.Snapshots {
		written = append(written, ss.Block)
	}
	slices.Sort(from)
	slices.Sort(written)
	if len(offs) != 4 || !slices.Equal(from, written) {
		t.Fatalf("seq 2's copies %+v, want 4 offloads ssm -> host-ssm from the slots its step writes %v", g.Copies, written)
	}
	if len(m.life.snaps) != 0 || len(m.life.hsnaps) != 4 {
		t.Fatalf("%d device and %d host snapshots, want 0 and 4", len(m.life.snaps), len(m.life.hsnaps))
	}
	mustClean(t, m, "with the offloads pending")
	if n := lookup(t, m, p1); n != 0 {
		t.Fatalf("Lookup = %d with the offloads pending, want 0 (their copies may not run)", n)
	}
	commit(t, m, kvcache.CommitItem{Seq: 2, Accepted: 4*tpb + 3})
	mustClean(t, m, "after the commit")
	if n := lookup(t, m, p1); n != 4*tpb {
		t.Fatalf("Lookup = %d with p1's snapshots on the host tier, want %d", n, 4*tpb)
	}
	st, _ := m.Stats(ctx)
	if hs := st.Pools[len(st.Pools)-1]; hs.Pool != m.life.host.id || hs.Cached != 4 || hs.InUse != 0 {
		t.Fatalf("host-ssm stats %+v, want 4 cached", hs)
	}
	g3 := reserve(t, m, kvcache.ReserveItem{Seq: 3, New: true, Prompt: p1, Reuse: 4 * tpb, Tokens: 3})[0]
	if !g3.OK {
		t.Fatalf("Reserve(p1, Reuse %d) = %+v", 4*tpb, g3)
	}
	x := stateOf(m.Seq(3))
	if x.src == nil || !x.src.host || x.src.pos != 4*tpb || x.src.pins != 1 ||
		!slices.Contains(g3.Copies, kvcache.Copy{SrcPool: m.life.host.id, SrcBlock: x.src.slot, DstPool: m.life.ssm.id, DstBlock: x.live}) {
		t.Fatalf("seq 3's copies %+v (source %+v), want the host snapshot at %d copied host-ssm -> live slot %d, pinned", g3.Copies, x.src, 4*tpb, x.live)
	}
	mustClean(t, m, "with the reuse copy pending")
	src := x.src
	commit(t, m, kvcache.CommitItem{Seq: 3, Accepted: 3})
	if x.src != nil || m.life.hsnaps[src.node] != src || src.pins != 0 {
		t.Fatalf("after seq 3's commit: source %v, host snapshot %+v; want unpinned and still on the host tier", x.src, src)
	}
	mustClean(t, m, "after seq 3")
	release(t, m, 2, 3)
	if reused := prefill(t, m, 4, p1, 8*tpb); reused != 4*tpb {
		t.Fatalf("seq 4 reused %d, want %d", reused, 4*tpb)
	}
	mustClean(t, m, "after seq 4")
}

// TestUnreserveDropsOffloads: an Unreserve of the reservation whose grant
// offloads snapshots drops them (the copies never ran) and frees their
// host-ssm slots, both when the reservation created the sequence and when
// it did not; the device slots it evicted are not given back either.
func TestUnreserveDropsOffloads(t *testing.T) {
	const tpb = 16
	ctx := context.Background()
	for _, created := range []bool{true, false} {
		t.Run(map[bool]string{true: "new", false: "existing"}[created], func(t *testing.T) {
			m, _ := configured(t, snapHostConfig(tpb))
			var p1 []int32
			var g kvcache.Grant
			if created {
				p1, g = offloadSetup(t, m, tpb)
			} else {
				p1 = tokens(4*tpb+3, 1)
				prefill(t, m, 1, p1, 8*tpb)
				release(t, m, 1)
				p2 := tokens(4*tpb+3, 2)
				reserve(t, m, kvcache.ReserveItem{Seq: 2, New: true, Prompt: p2, Tokens: tpb - 1}) // no boundary yet
				commit(t, m, kvcache.CommitItem{Seq: 2, Accepted: tpb - 1})
				g = reserve(t, m, kvcache.ReserveItem{Seq: 2, Tokens: len(p2) - tpb + 1})[0]
			}
			if n := len(offloads(m, g)); n != 4 {
				t.Fatalf("grant copies %+v, want 4 offloads", g.Copies)
			}
			if err := m.Unreserve(ctx, []kvcache.SeqID{2}); err != nil {
				t.Fatal(err)
			}
			mustClean(t, m, "after Unreserve")
			if len(m.life.hsnaps) != 0 || len(m.life.host.free) != len(m.life.host.refs) {
				t.Fatalf("%d host snapshots, %d of %d host-ssm slots free after Unreserve; want none and all",
					len(m.life.hsnaps), len(m.life.host.free), len(m.life.host.refs))
			}
			if n := lookup(t, m, p1); n != 0 {
				t.Fatalf("Lookup = %d after Unreserve, want 0 (p1's snapshots were evicted, their offloads dropped)", n)
			}
		})
	}
}

// TestSuspendEvictsHostSnapshot: suspended live states come first on the
// host tier: a Suspend that finds every host-ssm slot taken evicts the
// least valuable cached host snapshot and copies the live state into its
// slot; a pinned host snapshot (a reuse copy pending) is never evicted, so
// once it is the only one left a Suspend stays resident.
func TestSuspendEvictsHostSnapshot(t *testing.T) {
	const tpb = 16
	ctx := context.Background()
	m, _ := configured(t, snapHostConfig(tpb))
	p1, _ := offloadSetup(t, m, tpb)
	commit(t, m, kvcache.CommitItem{Seq: 2, Accepted: 4*tpb + 3})
	release(t, m, 2)
	if len(m.life.hsnaps) != 4 {
		t.Fatalf("%d host snapshots, want 4", len(m.life.hsnaps))
	}
	// Seq 5 pins the host snapshot at 64 until its commit.
	reserve(t, m, kvcache.ReserveItem{Seq: 5, New: true, Prompt: p1, Reuse: 4 * tpb, Tokens: 3})
	pinned := stateOf(m.Seq(5)).src
	if pinned == nil || !pinned.host {
		t.Fatalf("seq 5's reuse source %+v, want a host snapshot", pinned)
	}
	id := kvcache.SeqID(10)
	suspend := func() (bool, []kvcache.Copy) {
		t.Helper()
		reserve(t, m, kvcache.ReserveItem{Seq: id, New: true, Tokens: 1})
		commit(t, m, kvcache.CommitItem{Seq: id, Accepted: 1})
		ok, copies, err := m.Suspend(ctx, []kvcache.SeqID{id})
		if err != nil {
			t.Fatal(err)
		}
		if ok[0] {
			id++
		}
		return ok[0], copies
	}
	for len(m.life.host.free) > 0 {
		if ok, _ := suspend(); !ok {
			t.Fatalf("seq %d stayed resident with %d host-ssm slots free", id, len(m.life.host.free))
		}
	}
	for n := len(m.life.hsnaps); n > 1; n-- {
		want := m.life.hostVictim()
		slot, live := want.slot, kvcache.BlockID(NoBlock)
		ok, copies := suspend()
		if len(copies) > 0 {
			live = copies[len(copies)-1].SrcBlock
		}
		if !ok || len(m.life.hsnaps) != n-1 || m.life.hsnaps[want.node] != nil || want == pinned {
			t.Fatalf("Suspend with host-ssm full = %v: %d host snapshots (the victim at %d kept %v), want the victim evicted",
				ok, len(m.life.hsnaps), want.pos, m.life.hsnaps[want.node] != nil)
		}
		if x := stateOf(m.Seq(id - 1)); x.host != slot || !slices.Contains(copies, kvcache.Copy{SrcPool: m.life.ssm.id, SrcBlock: live, DstPool: m.life.host.id, DstBlock: slot}) {
			t.Fatalf("Suspend copies %+v, host slot %d; want the live state copied into the victim's slot %d", copies, x.host, slot)
		}
		mustClean(t, m, "after an eviction")
	}
	if ok, copies := suspend(); ok || len(copies) != 0 || m.life.hsnaps[pinned.node] != pinned {
		t.Fatalf("Suspend with only a pinned host snapshot = %v, copies %v; want resident, the snapshot kept", ok, copies)
	}
	mustClean(t, m, "after the refusal")
}
