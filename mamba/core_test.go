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
