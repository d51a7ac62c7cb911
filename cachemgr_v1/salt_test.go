package cachemgrv1

import (
	"slices"
	"testing"

	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
)

func saltLookup(t *testing.T, m *Manager, salt string, p []int32) int {
	t.Helper()
	got, err := m.Lookup(bg, []kvcache.LookupItem{{Seq: 99, Prompt: p, CacheSalt: salt}})
	if err != nil {
		t.Fatalf("Lookup: %v", err)
	}
	return got[0]
}

// run computes p as a new sequence under salt (reusing what Lookup offers),
// commits it and keeps it resident; it returns the tokens reused and the
// sequence's block table.
func run(t *testing.T, m *Manager, seq kvcache.SeqID, salt string, p []int32) (int, []kvcache.BlockID) {
	t.Helper()
	r := saltLookup(t, m, salt, p)
	mustGrant(t, m, kvcache.ReserveItem{Seq: seq, New: true, Tokens: len(p) - r, Prompt: p, Reuse: r, CacheSalt: salt})
	commit(t, m, seq, len(p)-r)
	return r, seqState(t, m, seq).Tables[0]
}

// TestCacheSaltIsolates: the same prompt under two salts reuses nothing
// across the salts and everything within one, and the two salts' sequences
// share no block.
func TestCacheSaltIsolates(t *testing.T) {
	const tpb = 4
	cfg := smallConfig(tpb, 32)
	cfg.EnableBlockReuse = true
	m := configured(t, cfg)
	p := prompt(tpb, []int32{1, 2, 3}, 1, 0) // 3 full blocks + 1

	if r, _ := run(t, m, 1, "tenant-a", p); r != 0 {
		t.Fatalf("first run reused %d tokens, want 0", r)
	}
	if err := m.Release(bg, []kvcache.SeqID{1}); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		salt string
		want int
	}{{"tenant-a", 3 * tpb}, {"tenant-b", 0}, {"", 0}, {"tenant-a ", 0}} {
		if got := saltLookup(t, m, tc.salt, p); got != tc.want {
			t.Errorf("Lookup(salt %q) = %d, want %d", tc.salt, got, tc.want)
		}
	}
	g := reserve(t, m, kvcache.ReserveItem{Seq: 2, New: true, Tokens: 1, Prompt: p, Reuse: 3 * tpb, CacheSalt: "tenant-b"})[0]
	if g.OK {
		t.Fatalf("Reserve(Reuse %d under another salt) granted, want a denial", 3*tpb)
	}
	ra, ta := run(t, m, 3, "tenant-a", p)
	rb, tb := run(t, m, 4, "tenant-b", p)
	if ra != 3*tpb || rb != 0 {
		t.Fatalf("reused %d (same salt) and %d (other salt), want %d and 0", ra, rb, 3*tpb)
	}
	for _, b := range tb {
		if slices.Contains(ta, b) {
			t.Fatalf("salts share block %d: tables %v and %v", b, ta, tb)
		}
	}
	if r, _ := run(t, m, 5, "tenant-b", p); r != 3*tpb {
		t.Errorf("second tenant-b run reused %d, want %d", r, 3*tpb)
	}
	noViolations(t, m)
}

// TestEventsStoreAndEvict: with KVEvents, Configure reports AllBlocksCleared,
// a commit past full prompt blocks reports them stored with the manager's own
// chain hashes (salt included), and evicting them reports them removed.
func TestEventsStoreAndEvict(t *testing.T) {
	const tpb = 4
	cfg := smallConfig(tpb, 8)
	cfg.EnableBlockReuse, cfg.KVEvents = true, true
	m := configured(t, cfg)
	evs, _ := m.Events(bg)
	if len(evs) != 1 || evs[0].Kind != kvcache.AllBlocksCleared {
		t.Fatalf("events after Configure = %+v, want one AllBlocksCleared", evs)
	}
	p := prompt(tpb, []int32{1, 2, 3}, 1, 0)
	run(t, m, 1, "s", p)
	var want []uint64
	for _, h := range m.h.chain(nil, "s", p, 3) {
		want = append(want, h.Lo)
	}
	evs, _ = m.Events(bg)
	if len(evs) != 1 || evs[0].Kind != kvcache.BlockStored || !slices.Equal(evs[0].Hashes, want) ||
		evs[0].HasParent || !slices.Equal(evs[0].Tokens, p[:3*tpb]) || evs[0].BlockSize != tpb || evs[0].Tier != kvcache.TierDevice {
		t.Fatalf("events after the commit = %+v, want one BlockStored of hashes %v, tokens %v", evs, want, p[:3*tpb])
	}
	if evs, _ = m.Events(bg); len(evs) != 0 {
		t.Fatalf("Events again = %+v, want none (they were taken)", evs)
	}
	if err := m.Release(bg, []kvcache.SeqID{1}); err != nil {
		t.Fatal(err)
	}
	// Two sequences of 16 fresh tokens need all 8 blocks: the 3 cached go.
	run(t, m, 2, "", prompt(tpb, []int32{7, 8, 9, 10}, 0, 0))
	run(t, m, 3, "", prompt(tpb, []int32{11, 12, 13, 14}, 0, 0))
	evs, _ = m.Events(bg)
	var removed []uint64
	stored := 0
	for _, e := range evs {
		switch e.Kind {
		case kvcache.BlockRemoved:
			removed = append(removed, e.Hashes...)
		case kvcache.BlockStored:
			stored += len(e.Hashes)
		}
	}
	slices.Sort(removed)
	slices.Sort(want)
	if !slices.Equal(removed, want) || stored != 8 {
		t.Fatalf("events %+v: removed %v, stored %d blocks; want removed %v and 8 stored", evs, removed, stored, want)
	}
}

// TestEventsOffRecordNothing: without KVEvents a manager records nothing.
func TestEventsOffRecordNothing(t *testing.T) {
	cfg := smallConfig(4, 8)
	cfg.EnableBlockReuse = true
	m := configured(t, cfg)
	run(t, m, 1, "", prompt(4, []int32{1, 2, 3}, 1, 0))
	if evs, _ := m.Events(bg); len(evs) != 0 || m.ev.on {
		t.Fatalf("events with KVEvents off = %+v, want none", evs)
	}
}
