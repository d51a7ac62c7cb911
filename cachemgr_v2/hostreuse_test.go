package cachemgrv2

import (
	"reflect"
	"slices"
	"testing"

	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
)

// Scripted cases of the host tier for reuse (hostreuse.go) on tiny pools:
// smallCfg has one GQA group (device pool 0, host pool 1) of 4-token blocks.

const hostPool = 1 // smallCfg's host pool id (HostID = the number of groups)

// hostSetup caches p1's 3 full blocks, then lets seq 2 (32 tokens: a
// prompt of its own, or no prompt) take 8 of the device pool's 9 blocks,
// which offloads p1's 2 deepest blocks (the LRU leaves) to the host tier. It
// returns seq 1's device table and seq 2's grant.
func hostSetup(t *testing.T, hostBlocks int, prompt bool) (*Manager, []int32, []kvcache.BlockID, kvcache.Grant) {
	t.Helper()
	m, _ := configure(t, smallCfg(9, hostBlocks))
	p1 := tokens(13, 1)
	mustGrant(t, m, kvcache.ReserveItem{Seq: 1, Tokens: 13, New: true, Prompt: p1})
	mustCommit(t, m, 1, 13)
	t1 := slices.Clone(seqState(t, inspect(t, m), 1).Tables[0])
	m.Release(ctx, []kvcache.SeqID{1}) // 3 cached nodes, 6 free
	it := kvcache.ReserveItem{Seq: 2, Tokens: 32, New: true}
	if prompt {
		it.Prompt = tokens(32, 2)
	}
	g := mustGrant(t, m, it)
	return m, p1, t1, g
}

func lookupTiers(t *testing.T, m *Manager, p []int32) (int, int) {
	t.Helper()
	n, err := m.Lookup(ctx, []kvcache.LookupItem{{Prompt: p}})
	if err != nil {
		t.Fatal(err)
	}
	tok, host := m.LookupTiers("", p)
	if tok != n[0] {
		t.Fatalf("LookupTiers = %d tokens, Lookup %d", tok, n[0])
	}
	return tok, host
}

func poolStats(t *testing.T, m *Manager, pool int) kvcache.PoolStats {
	t.Helper()
	for _, p := range inspect(t, m).Pools {
		if p.Pool == pool {
			return p
		}
	}
	t.Fatalf("no pool %d", pool)
	return kvcache.PoolStats{}
}

func TestOffloadOnEviction(t *testing.T) {
	m, p1, t1, g := hostSetup(t, 4, true)
	// The two deepest of p1's nodes are evicted, leaf first (block 2, then
	// block 1), and copied to host blocks in that order.
	want := []kvcache.Copy{
		{SrcPool: 0, SrcBlock: t1[2], DstPool: hostPool, DstBlock: 0},
		{SrcPool: 0, SrcBlock: t1[1], DstPool: hostPool, DstBlock: 1},
	}
	if !reflect.DeepEqual(g.Copies, want) {
		t.Fatalf("grant copies %+v, want the offloads %+v", g.Copies, want)
	}
	if g.HostReused != 0 {
		t.Errorf("HostReused = %d for a sequence that reuses nothing", g.HostReused)
	}
	// Pending until seq 2 commits: not visible, accounted as cached.
	if n, h := lookupTiers(t, m, p1); n != 4 || h != 0 {
		t.Errorf("Lookup while the offload is pending = %d (%d on host), want 4 (0): only the device node", n, h)
	}
	if ps := poolStats(t, m, hostPool); ps.Cached != 2 || ps.Free != 2 || ps.InUse != 0 {
		t.Errorf("host pool while pending %+v, want 2 cached, 2 free", ps)
	}
	mustCommit(t, m, 2, 32)
	if n, h := lookupTiers(t, m, p1); n != 12 || h != 8 {
		t.Errorf("Lookup after commit = %d (%d on host), want 12 (8)", n, h)
	}
	if m.offloaded != 2 {
		t.Errorf("offloaded %d, want 2", m.offloaded)
	}
}

func TestPromoteOnHit(t *testing.T) {
	m, p1, t1, _ := hostSetup(t, 4, true)
	mustCommit(t, m, 2, 32)
	m.Release(ctx, []kvcache.SeqID{2})   // device: p1's block 0 and seq 2's 8 blocks, all cached
	hostPages := []kvcache.BlockID{1, 0} // p1's blocks 1 and 2 on the host (offloaded 2 first)

	g := mustGrant(t, m, kvcache.ReserveItem{Seq: 3, Tokens: 1, New: true, Prompt: p1, Reuse: 12})
	if g.HostReused != 8 {
		t.Errorf("HostReused = %d, want 8 (blocks 1 and 2)", g.HostReused)
	}
	st := seqState(t, inspect(t, m), 3)
	tab := st.Tables[0]
	if tab[0] != t1[0] {
		t.Errorf("table block 0 = %d, want the device node's page %d", tab[0], t1[0])
	}
	// 3 device blocks were needed (2 promotions, 1 fresh): 3 of seq 2's
	// leaves were evicted; the host had 2 free blocks for the first two
	// (the promoted nodes are pinned), the third vanished, and with it the
	// two offloaded below it, which nothing could reach any more. Then the
	// promotions copy host -> device into the sequence's table.
	if len(g.Copies) != 4 {
		t.Fatalf("grant copies %+v, want 2 offloads then 2 promotions", g.Copies)
	}
	for i, c := range g.Copies[:2] {
		if c.SrcPool != 0 || c.DstPool != hostPool || c.DstBlock != kvcache.BlockID(2+i) {
			t.Errorf("copy %d = %+v, want an offload into host block %d", i, c, 2+i)
		}
	}
	for j, c := range g.Copies[2:] {
		want := kvcache.Copy{SrcPool: hostPool, SrcBlock: hostPages[j], DstPool: 0, DstBlock: tab[1+j]}
		if c != want {
			t.Errorf("promotion copy %d = %+v, want %+v", j, c, want)
		}
	}
	n1 := m.tree.child(m.tree.root, "", p1[:4])
	n2 := m.tree.child(n1, "", p1[4:8])
	if n2.pages[0] != tab[1] || n2.h.pend != 1 || n2.HostPages()[0] != hostPages[0] {
		t.Errorf("promoted node: device page %d (table %d), pending %d, host page %d", n2.pages[0], tab[1], n2.h.pend, n2.HostPages()[0])
	}
	mustCommit(t, m, 3, 1)
	if n2.OnHost() || n2.h.n != 0 || n2.h.pend != 0 {
		t.Errorf("after commit the node holds host pages %v (pending %d)", n2.HostPages(), n2.h.pend)
	}
	// The promotion's host blocks are free again (and the dropped offloads').
	if ps := poolStats(t, m, hostPool); ps.Free != 4 || ps.Cached != 0 {
		t.Errorf("host pool after commit %+v, want 4 free", ps)
	}
	if n, _ := lookupTiers(t, m, tokens(32, 2)); n != 20 {
		t.Errorf("Lookup(p2) = %d, want 20: its last 3 blocks vanished", n)
	}
	if n, h := lookupTiers(t, m, p1); n != 12 || h != 0 {
		t.Errorf("Lookup after promotion = %d (%d on host), want 12 (0)", n, h)
	}
}

func TestUnreservePromotionAndOffload(t *testing.T) {
	m, p1, _, _ := hostSetup(t, 4, true)
	mustCommit(t, m, 2, 32)
	m.Release(ctx, []kvcache.SeqID{2})
	p2 := tokens(32, 2)
	if n, _ := lookupTiers(t, m, p2); n != 28 {
		t.Fatalf("Lookup(p2) = %d, want 28 (all 8 blocks cached, at most len-1)", n)
	}
	mustGrant(t, m, kvcache.ReserveItem{Seq: 3, Tokens: 1, New: true, Prompt: p1, Reuse: 12})
	if err := m.Unreserve(ctx, []kvcache.SeqID{3}); err != nil {
		t.Fatal(err)
	}
	// The promotions never ran: p1's blocks 1 and 2 are back on the host,
	// where their copies stayed. The offloads never ran either, and nothing
	// wrote the device pages they came from: the put-back (undo.go) gives
	// seq 2's three evicted leaves (two offloaded, one without host room)
	// their device pages back, and the offloads' host blocks are free: p2
	// is whole on the device again, on no other tier.
	if n, h := lookupTiers(t, m, p1); n != 12 || h != 8 {
		t.Errorf("Lookup(p1) after Unreserve = %d (%d on host), want 12 (8)", n, h)
	}
	if n, h := lookupTiers(t, m, p2); n != 28 || h != 0 {
		t.Errorf("Lookup(p2) after Unreserve = %d (%d on host), want 28 (0): the evictions are undone", n, h)
	}
	if ps := poolStats(t, m, hostPool); ps.Cached != 2 || ps.Free != 2 {
		t.Errorf("host pool after Unreserve %+v, want p1's 2 cached, 2 free", ps)
	}
	if ps := poolStats(t, m, 0); ps.InUse != 0 || ps.Cached != 9 {
		t.Errorf("device pool after Unreserve %+v, want 9 cached (p1's block 0 and p2's 8)", ps)
	}
	// And the host copies still serve a new sequence.
	g := mustGrant(t, m, kvcache.ReserveItem{Seq: 4, Tokens: 1, New: true, Prompt: p1, Reuse: 12})
	if g.HostReused != 8 {
		t.Errorf("HostReused after the undone promotion = %d, want 8", g.HostReused)
	}
}

func TestSharedPromotionInOneCall(t *testing.T) {
	m, p1, _, _ := hostSetup(t, 4, true)
	mustCommit(t, m, 2, 32)
	m.Release(ctx, []kvcache.SeqID{2})
	gs, err := m.Reserve(ctx, []kvcache.ReserveItem{
		{Seq: 3, Tokens: 1, New: true, Prompt: p1, Reuse: 12},
		{Seq: 4, Tokens: 1, New: true, Prompt: p1, Reuse: 12},
	})
	if err != nil || !gs[0].OK || !gs[1].OK {
		t.Fatalf("Reserve = %+v, %v", gs, err)
	}
	promo := func(g kvcache.Grant) []kvcache.Copy {
		var out []kvcache.Copy
		for _, c := range g.Copies {
			if c.SrcPool == hostPool {
				out = append(out, c)
			}
		}
		return out
	}
	if p3, p4 := promo(gs[0]), promo(gs[1]); len(p3) != 2 || !reflect.DeepEqual(p3, p4) {
		t.Fatalf("promotion copies %+v and %+v, want the same two in both grants", p3, p4)
	}
	if gs[0].HostReused != 8 || gs[1].HostReused != 8 {
		t.Errorf("HostReused = %d, %d, want 8 each", gs[0].HostReused, gs[1].HostReused)
	}
	snap := inspect(t, m)
	if t3, t4 := seqState(t, snap, 3).Tables[0], seqState(t, snap, 4).Tables[0]; !slices.Equal(t3[:3], t4[:3]) {
		t.Errorf("tables %v and %v, want the same 3 reused blocks", t3, t4)
	}
	// The earlier grant is undone; the later one still brings the blocks.
	if err := m.Unreserve(ctx, []kvcache.SeqID{3}); err != nil {
		t.Fatal(err)
	}
	n2 := m.tree.child(m.tree.child(m.tree.root, "", p1[:4]), "", p1[4:8])
	if n2.h.pend != 1 || n2.nPages == 0 || n2.h.n == 0 {
		t.Fatalf("shared node after one Unreserve: pending %d, device %d, host %d; want still pending on both", n2.h.pend, n2.nPages, n2.h.n)
	}
	inspect(t, m)
	mustCommit(t, m, 4, 1)
	if n2.h.n != 0 || n2.nPages == 0 {
		t.Errorf("after the commit: device %d, host %d pages; want device only", n2.nPages, n2.h.n)
	}
	inspect(t, m)

	// Both undone: the node is back on the host tier.
	m2, p1, _, _ := hostSetup(t, 4, true)
	mustCommit(t, m2, 2, 32)
	m2.Release(ctx, []kvcache.SeqID{2})
	if _, err := m2.Reserve(ctx, []kvcache.ReserveItem{
		{Seq: 3, Tokens: 1, New: true, Prompt: p1, Reuse: 12},
		{Seq: 4, Tokens: 1, New: true, Prompt: p1, Reuse: 12},
	}); err != nil {
		t.Fatal(err)
	}
	if err := m2.Unreserve(ctx, []kvcache.SeqID{4, 3}); err != nil {
		t.Fatal(err)
	}
	if n, h := lookupTiers(t, m2, p1); n != 12 || h != 8 {
		t.Errorf("Lookup after both Unreserves = %d (%d on host), want 12 (8)", n, h)
	}
}

func TestSuspendEvictsCachedHostNodes(t *testing.T) {
	m, p1, _, _ := hostSetup(t, 3, false)
	mustCommit(t, m, 2, 32)
	// Host: p1's 2 offloaded blocks cached, 1 free; device: p1's block 0
	// and 8 free. A sequence with 2 private blocks suspends: it takes the
	// free host block and evicts the host LRU leaf (p1's block 2).
	m.Release(ctx, []kvcache.SeqID{2})
	mustGrant(t, m, kvcache.ReserveItem{Seq: 5, Tokens: 5, New: true})
	mustCommit(t, m, 5, 5)
	ok, copies, err := m.Suspend(ctx, []kvcache.SeqID{5})
	if err != nil || !ok[0] || len(copies) != 2 {
		t.Fatalf("Suspend = %v, %+v, %v; want it moved with 2 copies", ok, copies, err)
	}
	if n, h := lookupTiers(t, m, p1); n != 8 || h != 4 {
		t.Errorf("Lookup(p1) after Suspend = %d (%d on host), want 8 (4): the host leaf was evicted", n, h)
	}
	if ps := poolStats(t, m, hostPool); ps.InUse != 2 || ps.Cached != 1 || ps.Free != 0 {
		t.Errorf("host pool %+v, want 2 in use (suspended), 1 cached", ps)
	}
	// A sequence needing more than free + evictable host blocks stays
	// resident, and nothing changes.
	mustGrant(t, m, kvcache.ReserveItem{Seq: 6, Tokens: 9, New: true})
	mustCommit(t, m, 6, 9)
	before := inspect(t, m)
	if ok, _, err := m.Suspend(ctx, []kvcache.SeqID{6}); err != nil || ok[0] {
		t.Fatalf("Suspend of 3 blocks with 1 evictable = %v, %v; want refused", ok, err)
	}
	if !reflect.DeepEqual(inspect(t, m), before) {
		t.Error("refused Suspend changed state")
	}
	// An offload never displaces a suspended sequence: evicting p1's block
	// 0 from the device evicts the older cached host node (p1's block 1)
	// for it; the suspended blocks stay.
	m.Release(ctx, []kvcache.SeqID{6})
	g := mustGrant(t, m, kvcache.ReserveItem{Seq: 8, Tokens: 32, Draft: 2, New: true})
	if len(g.Copies) != 1 || g.Copies[0].DstPool != hostPool {
		t.Fatalf("grant copies %+v, want one offload", g.Copies)
	}
	mustCommit(t, m, 8, 32)
	if ps := poolStats(t, m, hostPool); ps.InUse != 2 || ps.Cached != 1 {
		t.Errorf("host pool %+v, want the 2 suspended blocks and 1 cached", ps)
	}
	if n, h := lookupTiers(t, m, p1); n != 4 || h != 4 {
		t.Errorf("Lookup(p1) = %d (%d on host), want 4 (4)", n, h)
	}
	if ok, copies, err := m.Resume(ctx, []kvcache.SeqID{5}); err != nil || ok[0] || copies != nil {
		t.Errorf("Resume with the device full = %v, %v, %v; want not yet", ok, copies, err)
	}
}

func TestHostFullSkipsOffload(t *testing.T) {
	m, _ := configure(t, smallCfg(9, 2))
	// A suspended sequence fills the host tier.
	mustGrant(t, m, kvcache.ReserveItem{Seq: 1, Tokens: 8, New: true})
	mustCommit(t, m, 1, 8)
	if ok, _, err := m.Suspend(ctx, []kvcache.SeqID{1}); err != nil || !ok[0] {
		t.Fatalf("Suspend = %v, %v", ok, err)
	}
	p := tokens(13, 3)
	mustGrant(t, m, kvcache.ReserveItem{Seq: 2, Tokens: 13, New: true, Prompt: p})
	mustCommit(t, m, 2, 13)
	m.Release(ctx, []kvcache.SeqID{2}) // 3 cached device nodes, 6 free
	g := mustGrant(t, m, kvcache.ReserveItem{Seq: 3, Tokens: 32, New: true})
	if len(g.Copies) != 0 {
		t.Fatalf("grant copies %+v with a full host tier, want none", g.Copies)
	}
	if n, h := lookupTiers(t, m, p); n != 4 || h != 0 {
		t.Errorf("Lookup = %d (%d on host), want 4 (0): the 2 evicted blocks vanished", n, h)
	}
	if ps := poolStats(t, m, hostPool); ps.InUse != 2 || ps.Cached != 0 {
		t.Errorf("host pool %+v, want the suspended sequence's 2 blocks only", ps)
	}
}

func TestRegistrationAdoptsHostNode(t *testing.T) {
	m, p1, _, _ := hostSetup(t, 4, false)
	mustCommit(t, m, 2, 32)
	m.Release(ctx, []kvcache.SeqID{2})
	if n, h := lookupTiers(t, m, p1); n != 12 || h != 8 {
		t.Fatalf("Lookup(p1) = %d (%d on host), want 12 (8)", n, h)
	}
	// Seq 7 computes p1 itself (no reuse): its commit meets the tree's
	// blocks, the device one and the two host ones, and keeps one copy of
	// each on the device; the host blocks are freed.
	mustGrant(t, m, kvcache.ReserveItem{Seq: 7, Tokens: 13, New: true, Prompt: p1})
	mustCommit(t, m, 7, 13)
	snap := inspect(t, m)
	tab := seqState(t, snap, 7).Tables[0]
	n := m.tree.root
	for i := range 3 {
		n = m.tree.child(n, "", p1[i*4:(i+1)*4])
		if n == nil || n.pages[0] != tab[i] || n.h.n != 0 {
			t.Fatalf("node %d: %+v, want seq 7's table block %d on the device only", i, n, tab[i])
		}
	}
	if ps := poolStats(t, m, hostPool); ps.Cached != 0 || ps.Free != 4 {
		t.Errorf("host pool %+v, want p1's 2 host blocks freed", ps)
	}
	if got, h := lookupTiers(t, m, p1); got != 12 || h != 0 {
		t.Errorf("Lookup = %d (%d on host), want 12 (0)", got, h)
	}
}

func TestHostCheckFindsCorruption(t *testing.T) {
	m, _, _, _ := hostSetup(t, 4, true)
	mustCommit(t, m, 2, 32)
	var hostNode *Node
	for _, n := range m.tree.all {
		if n.OnHost() {
			hostNode = n
		}
	}
	if hostNode == nil {
		t.Fatal("no host node")
	}
	for _, tc := range []struct {
		name   string
		break_ func()
		undo   func()
	}{
		{"host page not owned", func() { m.host[0].owner[hostNode.hpages()[0]] = nil }, func() { m.host[0].owner[hostNode.hpages()[0]] = hostNode }},
		{"pending count", func() { hostNode.h.pend++ }, func() { hostNode.h.pend-- }},
		{"host evictable", func() { m.tree.ht.evictable++ }, func() { m.tree.ht.evictable-- }},
		{"hold without a move", func() { m.host[0].holds[hostNode.hpages()[0]]++ }, func() { m.host[0].holds[hostNode.hpages()[0]]-- }},
	} {
		tc.break_()
		snap, _ := m.Inspect(ctx, kvcache.InspectOptions{Tables: true})
		if len(snap.Violations) == 0 {
			t.Errorf("%s: the deep check found nothing", tc.name)
		}
		tc.undo()
	}
	inspect(t, m)
}

// TestEvictionKeepsParentOfPendingOffload: in one Reserve call, item A's
// allocation offloads p1's deepest node (pending until A settles); item B
// then needs a block, and the heap's next leaf is that node's parent. B
// evicts another node instead (keepParents), so when A is undone (as when
// another pipeline stage denied it) the child gets its device pages back
// below a parent still on the device, and p1 is found whole.
func TestEvictionKeepsParentOfPendingOffload(t *testing.T) {
	m, _ := configure(t, smallCfg(9, 4))
	p1, q := tokens(13, 1), tokens(5, 3)
	mustGrant(t, m, kvcache.ReserveItem{Seq: 1, Tokens: 13, New: true, Prompt: p1})
	mustCommit(t, m, 1, 13)
	mustGrant(t, m, kvcache.ReserveItem{Seq: 3, Tokens: 5, New: true, Prompt: q})
	mustCommit(t, m, 3, 5)
	m.Release(ctx, []kvcache.SeqID{1, 3}) // p1's 3 nodes (older) and q's 1 cached, 5 free
	gs, err := m.Reserve(ctx, []kvcache.ReserveItem{
		{Seq: 10, Tokens: 24, New: true}, // 5 free + p1's deepest node, offloaded
		{Seq: 11, Tokens: 4, New: true},  // one more: p1's middle node is the next leaf
	})
	if err != nil || !gs[0].OK || !gs[1].OK {
		t.Fatalf("Reserve = %+v, %v; want both granted", gs, err)
	}
	if len(gs[0].Copies) != 1 || len(gs[1].Copies) != 1 {
		t.Fatalf("copies %+v / %+v: want one offload each", gs[0].Copies, gs[1].Copies)
	}
	if err := m.Unreserve(ctx, []kvcache.SeqID{10}); err != nil {
		t.Fatal(err)
	}
	mustCommit(t, m, 11, 4)
	if v := inspect(t, m).Violations; len(v) > 0 {
		t.Fatalf("violations: %v", v)
	}
	if n, _ := lookupTiers(t, m, p1); n != 12 {
		t.Fatalf("Lookup(p1) after A was undone = %d, want 12: B must not evict the parent of A's pending offload", n)
	}
	if n, _ := lookupTiers(t, m, q); n != 4 {
		t.Errorf("Lookup(q) = %d, want 4 (q's node went to the host tier in B's place)", n)
	}
}

// hostEvents returns the hashes of the events of kind on tier in evs.
func hostEvents(evs []kvcache.Event, kind kvcache.EventKind, tier kvcache.Tier) []uint64 {
	var out []uint64
	for _, e := range evs {
		if e.Kind == kind && e.Tier == tier {
			out = append(out, e.Hashes...)
		}
	}
	slices.Sort(out)
	return out
}

// TestHostTierEvents: with KV events, an offload is a device BlockRemoved at
// the eviction and a host BlockStored (no tokens, no parent) once the
// evicting reservation commits; a promotion is a device BlockStored, and
// the host BlockRemoved follows when its copy is done. An undone offload
// records nothing: Unreserve takes the device removals back.
func TestHostTierEvents(t *testing.T) {
	setup := func() (*Manager, []uint64) {
		cfg := smallCfg(9, 4)
		cfg.KVEvents = true
		m, _ := configure(t, cfg)
		if evs, _ := m.Events(ctx); len(evs) != 1 || evs[0].Kind != kvcache.AllBlocksCleared {
			t.Fatalf("events after Configure %+v, want AllBlocksCleared", evs)
		}
		mustGrant(t, m, kvcache.ReserveItem{Seq: 1, Tokens: 13, New: true, Prompt: tokens(13, 1)})
		mustCommit(t, m, 1, 13)
		m.Release(ctx, []kvcache.SeqID{1})
		evs, _ := m.Events(ctx)
		stored := hostEvents(evs, kvcache.BlockStored, kvcache.TierDevice)
		if len(stored) != 3 {
			t.Fatalf("events after caching 3 blocks %+v", evs)
		}
		return m, stored
	}
	m, _ := setup()
	n1 := m.tree.child(m.tree.root, "", tokens(13, 1)[:4])
	n2 := m.tree.child(n1, "", tokens(13, 1)[4:8])
	n3 := m.tree.child(n2, "", tokens(13, 1)[8:12])
	off := []uint64{n2.chain, n3.chain}
	slices.Sort(off)
	mustGrant(t, m, kvcache.ReserveItem{Seq: 2, Tokens: 32, New: true, Prompt: tokens(32, 2)})
	evs, _ := m.Events(ctx)
	if got := hostEvents(evs, kvcache.BlockRemoved, kvcache.TierDevice); !slices.Equal(got, off) || len(hostEvents(evs, kvcache.BlockStored, kvcache.TierHost)) != 0 {
		t.Fatalf("events of the offloading Reserve %+v: want device removals of %x and no host store while pending", evs, off)
	}
	mustCommit(t, m, 2, 32)
	evs, _ = m.Events(ctx)
	if got := hostEvents(evs, kvcache.BlockStored, kvcache.TierHost); !slices.Equal(got, off) {
		t.Fatalf("events of the Commit %+v: want host stores of %x", evs, off)
	}
	for _, e := range evs {
		if e.Kind == kvcache.BlockStored && e.Tier == kvcache.TierHost && (len(e.Tokens) != 0 || e.HasParent || e.BlockSize != 4) {
			t.Errorf("host BlockStored %+v: want no tokens, no parent, block size 4", e)
		}
	}
	m.Release(ctx, []kvcache.SeqID{2})
	m.Events(ctx)
	mustGrant(t, m, kvcache.ReserveItem{Seq: 3, Tokens: 1, New: true, Prompt: tokens(13, 1), Reuse: 12})
	evs, _ = m.Events(ctx)
	if got := hostEvents(evs, kvcache.BlockStored, kvcache.TierDevice); !slices.Equal(got, off) || len(hostEvents(evs, kvcache.BlockRemoved, kvcache.TierHost)) != 0 {
		t.Fatalf("events of the promoting Reserve %+v: want device stores of %x, no host removal while pending", evs, off)
	}
	mustCommit(t, m, 3, 1)
	evs, _ = m.Events(ctx)
	if got := hostEvents(evs, kvcache.BlockRemoved, kvcache.TierHost); !slices.Equal(got, off) || len(hostEvents(evs, kvcache.BlockStored, kvcache.TierHost)) != 0 {
		t.Fatalf("events of the promotion's Commit %+v: want host removals of %x (the offloads it made vanished unsettled)", evs, off)
	}

	m, _ = setup()
	mustGrant(t, m, kvcache.ReserveItem{Seq: 2, Tokens: 32, New: true, Prompt: tokens(32, 2)})
	if err := m.Unreserve(ctx, []kvcache.SeqID{2}); err != nil {
		t.Fatal(err)
	}
	if evs, _ := m.Events(ctx); len(evs) != 0 {
		t.Fatalf("events after an undone offload %+v, want none (the device removals taken back)", evs)
	}
}
