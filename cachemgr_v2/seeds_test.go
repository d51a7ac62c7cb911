package cachemgrv2

import (
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
	"github.com/kvx-dev/kvx/plugins/v1/spec"
)

// seedACfg is the last pipeline stage of seed A: DSA layers plus the MTP
// layer, chunked prefill of 8192, one draft token, block reuse off, and a
// device budget of exactly one max_seq_len+draft request (a tight cache).
func seedACfg(prompt, outputs int) kvcache.Config {
	layers := dsaStage(31, 3, true)
	cfg := kvcache.Config{
		Stage: 1, Stages: 2, Layers: layers, TokensPerBlock: 64,
		MaxBatchSize: 16, MaxNumTokens: 8192, MaxSeqLen: prompt + outputs, MaxDraftTokens: 1,
	}
	cfg.DeviceBytes = int64(kvcache.BlocksFor(cfg.MaxSeqLen+1, 64)) * stageBlockBytes(layers, 64)
	return cfg
}

// TestSeedA_RejectedDraftAfterLongChunkedPrefill replays the shape of seed A
// (#18661): a ~146k prompt in 8192-token chunks, then generation with one MTP
// draft where the first draft after the prefill is rejected, on a cache with
// no slack. Capacity must land exactly at history after every commit, the
// rewind comes from the ledger (the caller passes only Accepted), and no
// violation may ever appear.
func TestSeedA_RejectedDraftAfterLongChunkedPrefill(t *testing.T) {
	for _, prompt := range []int{146000, 146048, 145983} { // mid-block, block-aligned, one short of a boundary
		t.Run(fmt.Sprint(prompt), func(t *testing.T) {
			const outputs = 40
			m, lay := configure(t, seedACfg(prompt, outputs))
			if lay.Pools[0].Blocks != kvcache.BlocksFor(prompt+outputs+1, 64) {
				t.Fatalf("layout has %d blocks, want exactly one request", lay.Pools[0].Blocks)
			}
			const id = 7
			hist := 0
			for hist < prompt {
				chunk := min(8192, prompt-hist)
				mustGrant(t, m, kvcache.ReserveItem{Seq: id, Tokens: chunk, New: hist == 0})
				mustCommit(t, m, id, chunk)
				hist += chunk
				s := seqState(t, inspect(t, m), id)
				if s.History != hist || s.Capacity != hist {
					t.Fatalf("after chunk: history %d capacity %d, want both %d", s.History, s.Capacity, hist)
				}
			}
			// Generation: reject, accept, reject, ... The first step is the
			// failing one upstream: cap == hist, reserve 1 + 1 draft, reject.
			for step := 0; hist < prompt+outputs-1; step++ {
				g := mustGrant(t, m, kvcache.ReserveItem{Seq: id, Tokens: 1, Draft: 1})
				s := seqState(t, inspect(t, m), id)
				if s.Capacity != hist+2 || s.Reserved != 2 || s.Draft != 1 {
					t.Fatalf("step %d reserved: %+v, want capacity %d, reserved 2, draft 1", step, s, hist+2)
				}
				if kvcache.BlocksFor(hist+2, 64) > kvcache.BlocksFor(hist, 64) && len(g.Tables) != 1 {
					t.Fatalf("step %d: crossing a block boundary granted tables %v", step, g.Tables)
				}
				accepted := 1 + step%2 // even steps reject the draft
				mustCommit(t, m, id, accepted)
				hist += accepted
				s = seqState(t, inspect(t, m), id)
				if s.History != hist || s.Capacity != hist || s.Reserved != 0 || s.Blocks[0] != kvcache.BlocksFor(hist, 64) {
					t.Fatalf("step %d committed: %+v, want history = capacity = %d in %d blocks", step, s, hist, kvcache.BlocksFor(hist, 64))
				}
			}
			// With a hold (GUARANTEED_NO_EVICT) capacity stays at the hold.
			m.Release(ctx, []kvcache.SeqID{id})
			hold := prompt + outputs
			mustGrant(t, m, kvcache.ReserveItem{Seq: 8, Tokens: 8192, Hold: hold, New: true})
			mustCommit(t, m, 8, 8192)
			if s := seqState(t, inspect(t, m), 8); s.Capacity != hold || s.History != 8192 {
				t.Fatalf("with hold: %+v, want capacity %d history 8192", s, hold)
			}
		})
	}
}

// TestSeedA_DraftPaddedAfterReservation: upstream padded the draft tokens
// after the reservation and then committed a wider rewind. Here a Commit
// beyond what was reserved is an item error that changes nothing, and a
// second reservation cannot widen an outstanding one.
func TestSeedA_DraftPaddedAfterReservation(t *testing.T) {
	cfg := seedACfg(1000, 100)
	cfg.MaxDraftTokens, cfg.MaxNumTokens = 3, 1024
	cfg.DeviceBytes = 2 * int64(kvcache.BlocksFor(cfg.MaxSeqLen+3, 64)) * stageBlockBytes(cfg.Layers, 64)
	m, _ := configure(t, cfg)
	mustGrant(t, m, kvcache.ReserveItem{Seq: 1, Tokens: 1000, New: true})
	mustCommit(t, m, 1, 1000)
	mustGrant(t, m, kvcache.ReserveItem{Seq: 2, Tokens: 10, New: true})
	mustCommit(t, m, 2, 10)

	mustGrant(t, m, kvcache.ReserveItem{Seq: 1, Tokens: 1, Draft: 1})
	mustGrant(t, m, kvcache.ReserveItem{Seq: 2, Tokens: 1, Draft: 1})
	before := inspect(t, m)

	// The padder widened the draft to 3 after Reserve: not in the ledger.
	if g := reserve1(t, m, kvcache.ReserveItem{Seq: 1, Tokens: 0, Draft: 2}); g.OK || !strings.HasPrefix(g.Reason, "invalid: ") || !strings.Contains(g.Reason, "outstanding") {
		t.Errorf("second Reserve while outstanding = %+v, want an invalid denial", g)
	}
	_, err := m.Commit(ctx, []kvcache.CommitItem{{Seq: 1, Accepted: 3}, {Seq: 2, Accepted: 2}, {Seq: 99, Accepted: 1}})
	var ke *kvcache.Error
	if !errors.As(err, &ke) || !errors.Is(err, kvcache.ErrInvalidArg) || !slices.Equal(ke.Seqs, []kvcache.SeqID{1, 99}) {
		t.Fatalf("Commit = %v, want an item error about seqs 1 and 99", err)
	}
	if !strings.Contains(err.Error(), "accepted 3 > reserved tokens 1 + draft 1") {
		t.Errorf("Commit error %q does not give the numbers", err)
	}
	after := inspect(t, m)
	if got, want := seqState(t, after, 1), seqState(t, before, 1); !reflect.DeepEqual(got, want) {
		t.Errorf("invalid commit changed seq 1:\n got %+v\nwant %+v", got, want)
	}
	if s := seqState(t, after, 2); s.History != 12 || s.Capacity != 12 || s.Reserved != 0 {
		t.Errorf("valid item in the same batch not applied: %+v", s)
	}
	// The outstanding reservation is still there and commits within bounds.
	mustCommit(t, m, 1, 1)
	if s := seqState(t, inspect(t, m), 1); s.History != 1001 || s.Capacity != 1001 {
		t.Errorf("after commit: %+v", s)
	}
	// Accepted below Tokens is refused too.
	mustGrant(t, m, kvcache.ReserveItem{Seq: 2, Tokens: 4})
	if _, err := m.Commit(ctx, []kvcache.CommitItem{{Seq: 2, Accepted: 3}}); !errors.Is(err, kvcache.ErrInvalidArg) {
		t.Errorf("Commit(accepted < tokens) = %v, want item error", err)
	}
}

// TestSeedA_MTPStageAdmission: the last stage's MTP layer shares the main
// pool group, so its bytes are in the block size and admission counts them;
// two stages driven with atomic admission (deny on one stage: unreserve on
// all) keep identical ledgers: nothing lags.
func TestSeedA_MTPStageAdmission(t *testing.T) {
	const budget = 64 << 20
	stage := func(first int, mtp bool) kvcache.Config {
		return kvcache.Config{
			Stage: first / 4, Stages: 2, Layers: dsaStage(first, 4, mtp), TokensPerBlock: 64, DeviceBytes: budget,
			MaxBatchSize: 8, MaxNumTokens: 2048, MaxSeqLen: 4096, MaxDraftTokens: 1,
		}
	}
	m0, lay0 := configure(t, stage(0, false))
	m1, lay1 := configure(t, stage(4, true))
	bb1 := stageBlockBytes(dsaStage(4, 4, true), 64)
	if lay1.Pools[0].BlockBytes != bb1 || lay1.Pools[0].BlockBytes != lay0.Pools[0].BlockBytes*5/4 {
		t.Fatalf("MTP stage block bytes %d, want %d (5/4 of stage 0's %d)", lay1.Pools[0].BlockBytes, bb1, lay0.Pools[0].BlockBytes)
	}
	if want := int(budget / bb1); lay1.Pools[0].Blocks != want {
		t.Fatalf("MTP stage blocks %d, want %d", lay1.Pools[0].Blocks, want)
	}

	stages := []*Manager{m0, m1}
	granted, unreserved := 0, 0
	outstanding := map[kvcache.SeqID]bool{}
	for id := kvcache.SeqID(1); id < 200; id++ {
		// One step: a new 1000-token prefill plus a decode step of every
		// running sequence, admitted atomically over both stages.
		items := []kvcache.ReserveItem{{Seq: id, Tokens: 1000, New: true}}
		for s := range outstanding {
			items = append(items, kvcache.ReserveItem{Seq: s, Tokens: 1, Draft: 1})
		}
		var per [2][]kvcache.Grant
		for i, m := range stages {
			gs, err := m.Reserve(ctx, items)
			if err != nil {
				t.Fatal(err)
			}
			per[i] = gs
		}
		var commit []kvcache.CommitItem
		for j, it := range items {
			if per[0][j].OK && per[1][j].OK {
				if it.New {
					granted++
					outstanding[it.Seq] = true
				}
				commit = append(commit, kvcache.CommitItem{Seq: it.Seq, Accepted: it.Tokens + min(it.Draft, int(it.Seq)%2)})
				continue
			}
			if !per[1][j].OK && per[0][j].OK {
				// Stage 0 has more room (no MTP layer): the MTP stage is the one
				// that denies, and stage 0 must give the grant back.
				if err := m0.Unreserve(ctx, []kvcache.SeqID{it.Seq}); err != nil {
					t.Fatal(err)
				}
				unreserved++
			} else if per[1][j].OK {
				t.Fatalf("stage 0 denied seq %d but the MTP stage granted it", it.Seq)
			}
			if !it.New {
				delete(outstanding, it.Seq) // preempt it on both stages
				for _, m := range stages {
					if err := m.Release(ctx, []kvcache.SeqID{it.Seq}); err != nil {
						t.Fatal(err)
					}
				}
			}
		}
		for _, m := range stages {
			if _, err := m.Commit(ctx, commit); err != nil {
				t.Fatal(err)
			}
		}
		s0, s1 := inspect(t, m0), inspect(t, m1)
		for k := range s0.Seqs {
			a, b := s0.Seqs[k], s1.Seqs[k]
			if a.Seq != b.Seq || a.History != b.History || a.Capacity != b.Capacity || a.Blocks[0] != b.Blocks[0] {
				t.Fatalf("stage ledgers diverge: %+v vs %+v", a, b)
			}
		}
		if len(s0.Seqs) != len(s1.Seqs) {
			t.Fatalf("stage 0 holds %d sequences, stage 1 %d", len(s0.Seqs), len(s1.Seqs))
		}
		if s1.Pools[0].InUse > lay1.Pools[0].Blocks {
			t.Fatalf("MTP stage uses %d > %d blocks", s1.Pools[0].InUse, lay1.Pools[0].Blocks)
		}
	}
	if granted == 0 || unreserved == 0 {
		t.Fatalf("admitted %d, rolled back %d: want both > 0", granted, unreserved)
	}
}

// TestSuspendWithDraftsInFlight: Suspend during an outstanding reservation is
// refused with an item error and changes nothing (the forward may still write
// those blocks); after Commit it moves the private blocks to the host, Reserve
// is denied until Resume, and the first grant after Resume carries the table
// from the first moved block.
func TestSuspendWithDraftsInFlight(t *testing.T) {
	layers := dsaStage(0, 2, true)
	bb := stageBlockBytes(layers, 16)
	cfg := kvcache.Config{
		Layers: layers, TokensPerBlock: 16, DeviceBytes: 20 * bb, HostBytes: 20 * bb,
		MaxBatchSize: 4, MaxNumTokens: 64, MaxSeqLen: 256, MaxDraftTokens: 2, EnableBlockReuse: true,
	}
	m, lay := configure(t, cfg)
	dev, host := lay.Pools[0].ID, lay.Pools[1].ID
	prompt := tokens(40, 1)
	mustGrant(t, m, kvcache.ReserveItem{Seq: 1, Tokens: 40, New: true, Prompt: prompt})
	mustCommit(t, m, 1, 40) // blocks 0, 1 registered in the tree; block 2 private
	mustGrant(t, m, kvcache.ReserveItem{Seq: 1, Tokens: 1, Draft: 2})
	before := inspect(t, m)

	ok, copies, err := m.Suspend(ctx, []kvcache.SeqID{1})
	var ke *kvcache.Error
	if !errors.As(err, &ke) || !slices.Equal(ke.Seqs, []kvcache.SeqID{1}) || ok[0] || len(copies) != 0 {
		t.Fatalf("Suspend with drafts in flight = %v, %v, %v; want false, no copies, item error", ok, copies, err)
	}
	if after := inspect(t, m); !reflect.DeepEqual(after, before) {
		t.Fatalf("refused Suspend changed state:\n got %+v\nwant %+v", after, before)
	}

	mustCommit(t, m, 1, 2) // one draft rejected: history 42, capacity 42, 3 blocks
	resident := seqState(t, inspect(t, m), 1)
	ok, copies, err = m.Suspend(ctx, []kvcache.SeqID{1})
	if err != nil || !ok[0] {
		t.Fatalf("Suspend = %v, %v", ok, err)
	}
	// Only the private block 2 moves; the registered prompt blocks stay pinned.
	if len(copies) != 1 || copies[0].SrcPool != dev || copies[0].DstPool != host || copies[0].SrcBlock != resident.Tables[dev][2] {
		t.Fatalf("Suspend copies = %+v, want block %d device -> host", copies, resident.Tables[dev][2])
	}
	snap := inspect(t, m)
	s := seqState(t, snap, 1)
	if !s.Suspended || s.History != 42 || s.Capacity != 42 || s.Blocks[dev] != 2 || s.Blocks[host] != 1 {
		t.Fatalf("suspended state %+v", s)
	}
	if st, _ := m.Stats(ctx); st.SuspendedSeqs != 1 {
		t.Errorf("Stats.SuspendedSeqs = %d, want 1", st.SuspendedSeqs)
	}
	if g := reserve1(t, m, kvcache.ReserveItem{Seq: 1, Tokens: 1, Draft: 2}); g.OK || !strings.HasPrefix(g.Reason, "suspended") {
		t.Fatalf("Reserve while suspended = %+v, want a suspended denial", g)
	}
	if _, err := m.Commit(ctx, []kvcache.CommitItem{{Seq: 1, Accepted: 1}}); !errors.Is(err, kvcache.ErrInvalidArg) {
		t.Errorf("Commit while suspended = %v, want item error", err)
	}
	// Another sequence takes the freed block meanwhile.
	mustGrant(t, m, kvcache.ReserveItem{Seq: 2, Tokens: 16, New: true})

	ok, copies, err = m.Resume(ctx, []kvcache.SeqID{1})
	if err != nil || !ok[0] || len(copies) != 1 || copies[0].SrcPool != host || copies[0].DstPool != dev || copies[0].SrcBlock != s.Tables[host][0] {
		t.Fatalf("Resume = %v, %+v, %v", ok, copies, err)
	}
	s = seqState(t, inspect(t, m), 1)
	if s.Suspended || s.Blocks[host] != 0 || s.Tables[dev][2] != copies[0].DstBlock {
		t.Fatalf("resumed state %+v", s)
	}
	g := mustGrant(t, m, kvcache.ReserveItem{Seq: 1, Tokens: 1, Draft: 2})
	if len(g.Tables) != 1 || g.Tables[0].From != 2 || !slices.Equal(g.Tables[0].Blocks, seqState(t, inspect(t, m), 1).Tables[dev][2:]) {
		t.Fatalf("first grant after Resume: %+v, want the table from the moved block 2", g.Tables)
	}
	mustCommit(t, m, 1, 3)
	inspect(t, m)
}

// TestSuspendHostFull: a sequence whose private blocks do not fit on the host
// stays resident (false), and without a host tier Suspend is unsupported.
func TestSuspendHostFull(t *testing.T) {
	layers := []spec.Layer{gqaLayer(0, 0)}
	bb := stageBlockBytes(layers, 4)
	cfg := kvcache.Config{Layers: layers, TokensPerBlock: 4, DeviceBytes: 16 * bb, HostBytes: 2 * bb,
		MaxBatchSize: 4, MaxNumTokens: 16, MaxSeqLen: 32}
	m, _ := configure(t, cfg)
	mustGrant(t, m, kvcache.ReserveItem{Seq: 1, Tokens: 12, New: true})
	mustCommit(t, m, 1, 12)
	before := inspect(t, m)
	ok, copies, err := m.Suspend(ctx, []kvcache.SeqID{1})
	if err != nil || ok[0] || copies != nil {
		t.Fatalf("Suspend(3 blocks, host 2) = %v, %v, %v; want false", ok, copies, err)
	}
	if !reflect.DeepEqual(inspect(t, m), before) {
		t.Fatal("refused Suspend changed state")
	}
	cfg.HostBytes = 0
	m, _ = configure(t, cfg)
	if _, _, err := m.Suspend(ctx, nil); !errors.Is(err, kvcache.ErrUnsupported) {
		t.Errorf("Suspend without host tier = %v, want ErrUnsupported", err)
	}
}

// TestSeedB_EvictionWhileLivePathPinned is seed B's shape for the tree: a
// Reserve must evict cached nodes while another live sequence, mid-prefill,
// has its path pinned, including nodes whose siblings and children get
// evicted. The pinned path survives, evicted nodes are pruned only at the
// next safe point, and the live sequence keeps registering blocks under its
// pinned parent.
func TestSeedB_EvictionWhileLivePathPinned(t *testing.T) {
	layers := []spec.Layer{gqaLayer(0, 0), gqaLayer(1, 128)} // two pool groups
	bb := stageBlockBytes(layers, 4)
	cfg := kvcache.Config{Layers: layers, TokensPerBlock: 4, DeviceBytes: 20 * bb,
		MaxBatchSize: 4, MaxNumTokens: 16, MaxSeqLen: 80, EnableBlockReuse: true, PoolRatio: []float64{0.5, 0.5}}
	m, lay := configure(t, cfg)
	if lay.Pools[0].Blocks != 20 || lay.Pools[1].Blocks != 20 {
		t.Fatalf("pools: %+v, want 20 blocks each", lay.Pools)
	}

	// A: 6 blocks committed and released: a cached chain A0..A5.
	a := tokens(25, 1)
	mustGrant(t, m, kvcache.ReserveItem{Seq: 1, Tokens: 25, New: true, Prompt: a})
	mustCommit(t, m, 1, 25)
	m.Release(ctx, []kvcache.SeqID{1})
	// B shares A0, A1 and continues with its own blocks, chunked.
	b := append(slices.Clone(a[:8]), tokens(24, 2)...)
	look, _ := m.Lookup(ctx, []kvcache.LookupItem{{Prompt: b}})
	if look[0] != 8 {
		t.Fatalf("Lookup(B) = %d, want 8", look[0])
	}
	mustGrant(t, m, kvcache.ReserveItem{Seq: 2, Tokens: 4, New: true, Prompt: b, Reuse: 8})
	mustCommit(t, m, 2, 4) // B2 registered: path A0 A1 B2
	snap := inspect(t, m)
	if s := seqState(t, snap, 2); s.Tables[0][0] != m.tree.Match(a, 1, nil)[0].pages[0] {
		t.Fatalf("B does not share A0's page: %v", s.Tables[0])
	}
	nodesBefore := m.tree.Nodes()
	evictable := m.tree.Evictable() // A2..A5
	if evictable != 4 {
		t.Fatalf("evictable = %d, want A2..A5", evictable)
	}

	// C needs every free block plus all evictable ones.
	free := snap.Pools[0].Free
	need := (free + evictable) * 4
	st0, _ := m.Stats(ctx)
	mustGrant(t, m, kvcache.ReserveItem{Seq: 3, Tokens: need, New: true})
	st1, _ := m.Stats(ctx)
	if got := st1.Evictions - st0.Evictions; got != int64(evictable*len(lay.Pools)) {
		t.Errorf("evicted %d blocks, want %d", got, evictable*len(lay.Pools))
	}
	// Pruning is deferred: evicted nodes are still attached, without pages.
	if m.tree.Nodes() != nodesBefore {
		t.Errorf("nodes %d right after eviction, want %d (pruning deferred)", m.tree.Nodes(), nodesBefore)
	}
	inspect(t, m)
	// B's pinned path survived and is still a cache hit.
	look, _ = m.Lookup(ctx, []kvcache.LookupItem{{Prompt: b}})
	if look[0] != 12 {
		t.Fatalf("Lookup(B) after eviction = %d, want 12 (A0 A1 B2)", look[0])
	}
	// More denials: nothing is evictable and nothing is free.
	if g := reserve1(t, m, kvcache.ReserveItem{Seq: 4, Tokens: 4, New: true}); g.OK {
		t.Fatalf("Reserve with a full cache granted: %+v", g)
	}
	// B continues its prefill: registration under the pinned B2.
	m.Release(ctx, []kvcache.SeqID{3})
	for hist := 12; hist < len(b); hist += 4 {
		mustGrant(t, m, kvcache.ReserveItem{Seq: 2, Tokens: 4})
		mustCommit(t, m, 2, 4)
	}
	if m.tree.Nodes() != 2+6 {
		t.Errorf("nodes = %d after pruning, want A0 A1 + B2..B7 = 8", m.tree.Nodes())
	}
	look, _ = m.Lookup(ctx, []kvcache.LookupItem{{Prompt: append(slices.Clone(b), 9)}})
	if look[0] != len(b) {
		t.Errorf("Lookup(B+1) = %d, want %d", look[0], len(b))
	}
	if look, _ = m.Lookup(ctx, []kvcache.LookupItem{{Prompt: a}}); look[0] != 8 {
		t.Errorf("Lookup(A) = %d, want 8 (A2.. evicted)", look[0])
	}
	inspect(t, m)
}
