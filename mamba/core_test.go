package mamba

import (
	"context"
	"errors"
	"reflect"
	"slices"
	"testing"

	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
)

func inspectDeep(t *testing.T, m *Manager) kvcache.Snapshot {
	t.Helper()
	snap, err := m.Inspect(context.Background(), kvcache.InspectOptions{Tables: true})
	if err != nil {
		t.Fatal(err)
	}
	if len(snap.Violations) > 0 {
		t.Fatalf("violations: %v", snap.Violations)
	}
	return snap
}

// hostConfig is testConfig with a host tier as large as the device budget.
func hostConfig(tpb int) kvcache.Config {
	cfg := testConfig(tpb, 256, 4+8)
	cfg.HostBytes = cfg.DeviceBytes
	return cfg
}

// TestSuspendMovesLiveState: with a host tier, Suspend moves a sequence's
// live SSM state to a host-ssm slot (a copy ssm -> host-ssm) with its private
// attention blocks, and frees the live slot for another resident sequence;
// Resume copies it back into a free live slot (false, changing nothing,
// while all are held), and the next grant names the new live slot as ssm
// table entry 0.
func TestSuspendMovesLiveState(t *testing.T) {
	const tpb = 16
	ctx := context.Background()
	m, lay := configured(t, hostConfig(tpb))
	var names []string
	for i, p := range lay.Pools {
		names = append(names, p.Name)
		if p.ID != i {
			t.Fatalf("pool %d has id %d", i, p.ID)
		}
	}
	if !slices.Equal(names, []string{"full", "host-full", "ssm", "host-ssm"}) || lay.Pools[3].Blocks == 0 || lay.Pools[3].Tier != kvcache.TierHost {
		t.Fatalf("layout pools %+v, want full, host-full, ssm and a non-empty host-ssm", lay.Pools)
	}
	ssm, hostSSM := lay.Pools[2].ID, lay.Pools[3].ID
	prefill(t, m, 1, tokens(5*tpb+3, 1), 4*tpb)
	live := stateOf(m.Seq(1)).live
	ok, copies, err := m.Suspend(ctx, []kvcache.SeqID{1})
	if err != nil || !ok[0] {
		t.Fatalf("Suspend = %v, %v", ok, err)
	}
	host := stateOf(m.Seq(1)).host
	if !slices.Contains(copies, kvcache.Copy{SrcPool: ssm, SrcBlock: live, DstPool: hostSSM, DstBlock: host}) {
		t.Fatalf("Suspend copies %+v, want the live slot %d copied to host-ssm", copies, live)
	}
	if m.life.liveUsed != 0 {
		t.Fatalf("live slots held %d after Suspend, want 0", m.life.liveUsed)
	}
	st := inspectDeep(t, m).Seqs[0]
	if !st.Suspended || st.Blocks[2] != 0 || st.Blocks[3] != 1 {
		t.Fatalf("suspended seq %+v, want no ssm slot and one host-ssm slot", st)
	}
	// The freed live slot serves another resident sequence: four fit, a fifth does not.
	for id := kvcache.SeqID(10); id < 14; id++ {
		if g := reserve(t, m, kvcache.ReserveItem{Seq: id, New: true, Tokens: 1}); !g[0].OK {
			t.Fatalf("seq %d: %s", id, g[0].Reason)
		}
		commit(t, m, kvcache.CommitItem{Seq: id, Accepted: 1})
	}
	if g := reserve(t, m, kvcache.ReserveItem{Seq: 14, New: true, Tokens: 1}); g[0].OK {
		t.Fatal("a fifth resident sequence got a live slot")
	}
	before := inspectDeep(t, m)
	if ok, copies, err := m.Resume(ctx, []kvcache.SeqID{1}); err != nil || ok[0] || len(copies) != 0 {
		t.Fatalf("Resume with every live slot held = %v, %v, %v; want false, no copies", ok, copies, err)
	}
	if after := inspectDeep(t, m); !reflect.DeepEqual(after, before) {
		t.Fatal("a refused Resume changed the state")
	}
	release(t, m, 10)
	ok, copies, err = m.Resume(ctx, []kvcache.SeqID{1})
	if err != nil || !ok[0] {
		t.Fatalf("Resume = %v, %v", ok, err)
	}
	x := stateOf(m.Seq(1))
	if x.host != NoBlock || !slices.Contains(copies, kvcache.Copy{SrcPool: hostSSM, SrcBlock: host, DstPool: ssm, DstBlock: x.live}) {
		t.Fatalf("Resume copies %+v, want host-ssm slot %d copied to the new live slot %d", copies, host, x.live)
	}
	inspectDeep(t, m)
	g := reserve(t, m, kvcache.ReserveItem{Seq: 1, Tokens: 1})
	if !g[0].OK {
		t.Fatal(g[0].Reason)
	}
	var d *kvcache.TableDelta
	for i := range g[0].Tables {
		if g[0].Tables[i].Pool == ssm {
			d = &g[0].Tables[i]
		}
	}
	if d == nil || d.From != 0 || d.Blocks[0] != x.live {
		t.Fatalf("grant after Resume tables %+v, want the ssm table from 0 with live slot %d", g[0].Tables, x.live)
	}
	commit(t, m, kvcache.CommitItem{Seq: 1, Accepted: 1})
	inspectDeep(t, m)
}

// TestSuspendRefusedWhenHostSSMFull: once every host-ssm slot holds a
// suspended state, Suspend answers false for the next sequence and changes
// nothing, though its attention blocks would fit the host; without a host
// tier Suspend is unsupported.
func TestSuspendRefusedWhenHostSSMFull(t *testing.T) {
	const tpb = 16
	ctx := context.Background()
	m, _ := configured(t, hostConfig(tpb))
	slots := len(m.life.host.free)
	if slots == 0 || slots > 16 {
		t.Fatalf("%d host-ssm slots, want a few", slots)
	}
	for id := kvcache.SeqID(1); ; id++ {
		prefill(t, m, id, tokens(tpb+1, int32(id)), 4*tpb)
		before := inspectDeep(t, m)
		ok, copies, err := m.Suspend(ctx, []kvcache.SeqID{id})
		if err != nil {
			t.Fatal(err)
		}
		if ok[0] {
			continue
		}
		if int(id) != slots+1 || len(copies) != 0 || len(m.life.host.free) != 0 || m.HostPools()[0].Free() == 0 {
			t.Fatalf("seq %d refused (copies %v) with %d host-ssm slots free, %d host blocks free; want the refusal at seq %d when host-ssm is full",
				id, copies, len(m.life.host.free), m.HostPools()[0].Free(), slots+1)
		}
		if after := inspectDeep(t, m); !reflect.DeepEqual(after, before) {
			t.Fatal("a refused Suspend changed the state")
		}
		break
	}
	m, _ = configured(t, testConfig(tpb, 256, 4+8))
	if _, _, err := m.Suspend(ctx, nil); !errors.Is(err, kvcache.ErrUnsupported) {
		t.Fatalf("Suspend without host tier = %v, want ErrUnsupported", err)
	}
}

// TestDivergingPromptsRegisterTheirOwnBlocks: two requests computed side by
// side share four blocks and then diverge for four. Registration goes on
// past the shared blocks the other request put in the tree, so both
// requests' later blocks, and the snapshots on them, are cached: a third
// request with either prompt reuses it all.
func TestDivergingPromptsRegisterTheirOwnBlocks(t *testing.T) {
	const tpb = 16
	cfg := testConfig(tpb, 256, 4+24)
	m, _ := configured(t, cfg)
	shared := tokens(4*tpb, 1)
	a := append(slices.Clone(shared), tokens(4*tpb+1, 2)...)
	b := append(slices.Clone(shared), tokens(4*tpb+1, 3)...)
	for done, first := 0, true; done < len(a); first = false {
		n := min(4*tpb, len(a)-done)
		items := []kvcache.ReserveItem{{Seq: 1, Tokens: n}, {Seq: 2, Tokens: n}}
		if first {
			items[0].New, items[0].Prompt = true, a
			items[1].New, items[1].Prompt = true, b
		}
		for _, g := range reserve(t, m, items...) {
			if !g.OK {
				t.Fatal(g.Reason)
			}
		}
		commit(t, m, kvcache.CommitItem{Seq: 1, Accepted: n}, kvcache.CommitItem{Seq: 2, Accepted: n})
		done += n
		mustClean(t, m, "step")
	}
	if n := m.Tree().Nodes(); n != 12 {
		t.Fatalf("tree holds %d nodes, want 12 (4 shared, 4 + 4 unique)", n)
	}
	if la, lb := lookup(t, m, a), lookup(t, m, b); la != 8*tpb || lb != 8*tpb {
		t.Fatalf("Lookup(a) = %d, Lookup(b) = %d while both run, want %d each", la, lb, 8*tpb)
	}
	release(t, m, 1, 2)
	if r := prefill(t, m, 3, b, 4*tpb); r != 8*tpb {
		t.Fatalf("a third request with b's prompt reused %d tokens, want %d", r, 8*tpb)
	}
	mustClean(t, m, "seq 3")
}

// TestPartialReuse: the core's partial-block reuse (behind its switch)
// works on a stage without state layers, with a copy-on-write of the partly
// matched block; on a stage with state layers reuse still ends on a block
// boundary that holds a snapshot.
func TestPartialReuse(t *testing.T) {
	const tpb = 16
	layers := hybridLayers(2, 0)
	attn := kvcache.Config{
		Stages: 1, Layers: layers, TokensPerBlock: tpb, DeviceBytes: 64 * 2 * kvPerToken * tpb,
		MaxBatchSize: 4, MaxNumTokens: 4 * tpb, MaxSeqLen: 32 * tpb, EnableBlockReuse: true,
	}
	for _, state := range []bool{false, true} {
		cfg := attn
		if state {
			cfg = testConfig(tpb, 256, 4+16)
		}
		m := New()
		m.SetPartialReuse(true)
		if _, err := m.Configure(context.Background(), cfg); err != nil {
			t.Fatal(err)
		}
		a := tokens(3*tpb, 1)
		prefill(t, m, 1, a, 4*tpb)
		release(t, m, 1)
		b := append(slices.Clone(a[:tpb+5]), tokens(2*tpb, 9)...)
		got := lookup(t, m, b)
		if !state {
			if got != tpb+5 {
				t.Fatalf("attention-only Lookup = %d, want %d (one block and 5 tokens)", got, tpb+5)
			}
			g := reserve(t, m, kvcache.ReserveItem{Seq: 2, New: true, Prompt: b, Reuse: got, Tokens: len(b) - got})
			if !g[0].OK || len(g[0].Copies) != 1 || g[0].Copies[0].SrcPool != 0 {
				t.Fatalf("partial reuse grant %+v, want one copy-on-write in the attention pool", g[0])
			}
			commit(t, m, kvcache.CommitItem{Seq: 2, Accepted: len(b) - got})
		} else if got != tpb {
			t.Fatalf("Lookup with state layers = %d, want the snapshot boundary %d", got, tpb)
		}
		mustClean(t, m, "after partial reuse")
	}
}

// TestHostTierKeepsAttentionBlocks: cached attention blocks the device
// evicts go to the host tier through the core, their snapshots stay in
// their device slots, and reuse through host blocks still ends exactly at a
// snapshot boundary: the blocks come back with host -> device copies
// (Grant.HostReused) and the snapshot with its ssm copy.
func TestHostTierKeepsAttentionBlocks(t *testing.T) {
	const tpb = 16
	cfg := testConfig(tpb, 40, 4+8)
	cfg.Snapshots.Interval = 2 * tpb // snapshots at 32 and 64 of an 83-token prompt
	cfg.HostBytes = cfg.DeviceBytes
	m, lay := configured(t, cfg)
	hostFull, ssm := -1, -1
	for _, p := range lay.Pools {
		switch p.Name {
		case "host-full":
			hostFull = p.ID
		case "ssm":
			ssm = p.ID
		}
	}
	p1 := tokens(5*tpb+3, 1)
	prefill(t, m, 1, p1, 4*tpb)
	release(t, m, 1) // 5 cached attention blocks, snapshots at 32 and 64
	if got := lookup(t, m, p1); got != 64 {
		t.Fatalf("Lookup = %d, want 64 (the last snapshot boundary)", got)
	}
	// Two sequences take the device: p1's 5 blocks are evicted, leaf first,
	// to the host tier.
	gs := reserve(t, m,
		kvcache.ReserveItem{Seq: 2, Tokens: 1, Hold: 32 * tpb, New: true},
		kvcache.ReserveItem{Seq: 3, Tokens: 1, Hold: 8 * tpb, New: true})
	if !gs[0].OK || !gs[1].OK {
		t.Fatalf("Reserve = %+v", gs)
	}
	offloads := 0
	for _, c := range gs[1].Copies {
		if c.DstPool == hostFull {
			offloads++
		}
	}
	if offloads != 5 {
		t.Fatalf("seq 3's copies %+v, want 5 offloads to pool %d", gs[1].Copies, hostFull)
	}
	commit(t, m, kvcache.CommitItem{Seq: 2, Accepted: 1}, kvcache.CommitItem{Seq: 3, Accepted: 1})
	mustClean(t, m, "after the offloads")
	if tok, host := m.LookupTiers("", p1); tok != 64 || host != 64 {
		t.Fatalf("LookupTiers = %d (%d on host), want 64 (64): host blocks up to the snapshot at 64", tok, host)
	}
	if got := lookup(t, m, p1[:60]); got != 32 {
		t.Errorf("Lookup(60 tokens) = %d, want 32: the snapshot boundary below 59", got)
	}
	release(t, m, 2, 3)
	// Seq 4 reuses 64 tokens: 4 blocks come back, the snapshot at 64 is
	// copied into its live slot.
	g := reserve(t, m, kvcache.ReserveItem{Seq: 4, Tokens: 5*tpb + 3 - 64, New: true, Prompt: p1, Reuse: 64})[0]
	if !g.OK || g.HostReused != 64 {
		t.Fatalf("Reserve with Reuse 64 = %+v, want granted with HostReused 64", g)
	}
	promos, snapCopy := 0, false
	for _, c := range g.Copies {
		switch {
		case c.SrcPool == hostFull:
			promos++
		case c.SrcPool == ssm && c.DstPool == ssm:
			snapCopy = true
		}
	}
	if promos != 4 || !snapCopy {
		t.Fatalf("copies %+v: want 4 host -> device copies and the snapshot's ssm copy", g.Copies)
	}
	mustClean(t, m, "with the promotion pending")
	commit(t, m, kvcache.CommitItem{Seq: 4, Accepted: 5*tpb + 3 - 64})
	mustClean(t, m, "after the commit")
	if tok, host := m.LookupTiers("", p1); tok != 64 || host != 0 {
		t.Errorf("LookupTiers after the promotion = %d (%d on host), want 64 (0)", tok, host)
	}
}
