package cachemgrv1

import (
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
)

// op is one step of a ledger script on sequence 1 (unless seq is set).
type op struct {
	kind     string // "reserve", "commit", "unreserve", "release"
	seq      kvcache.SeqID
	item     kvcache.ReserveItem // reserve
	accepted int                 // commit
	// Expected ledger of the sequence afterwards (history, capacity, hold,
	// reserved, blocks in pool 0), and the grant's OK.
	hist, cap, hold, reserved, blocks int
	denied                            bool
}

func TestLedgerScripts(t *testing.T) {
	const tpb = 16
	tests := []struct {
		name string
		ops  []op
	}{{
		name: "prefill then decode with drafts: rejected drafts rewind from the ledger",
		ops: []op{
			{kind: "reserve", item: kvcache.ReserveItem{New: true, Tokens: 20}, cap: 20, reserved: 20, blocks: 2},
			{kind: "commit", accepted: 20, hist: 20, cap: 20, blocks: 2},
			{kind: "reserve", item: kvcache.ReserveItem{Tokens: 1, Draft: 2}, hist: 20, cap: 23, reserved: 3, blocks: 2},
			{kind: "commit", accepted: 1, hist: 21, cap: 21, blocks: 2},
			{kind: "reserve", item: kvcache.ReserveItem{Tokens: 1, Draft: 2}, hist: 21, cap: 24, reserved: 3, blocks: 2},
			{kind: "commit", accepted: 3, hist: 24, cap: 24, blocks: 2},
			// Crosses a block boundary with the drafts, all rejected: the new block is freed again.
			{kind: "reserve", item: kvcache.ReserveItem{Tokens: 6}, hist: 24, cap: 30, reserved: 6, blocks: 2},
			{kind: "commit", accepted: 6, hist: 30, cap: 30, blocks: 2},
			{kind: "reserve", item: kvcache.ReserveItem{Tokens: 1, Draft: 2}, hist: 30, cap: 33, reserved: 3, blocks: 3},
			{kind: "commit", accepted: 1, hist: 31, cap: 31, blocks: 2},
		},
	}, {
		name: "tight capacity: history lands exactly on capacity at a block boundary",
		ops: []op{
			{kind: "reserve", item: kvcache.ReserveItem{New: true, Tokens: 32}, cap: 32, reserved: 32, blocks: 2},
			{kind: "commit", accepted: 32, hist: 32, cap: 32, blocks: 2},
			{kind: "reserve", item: kvcache.ReserveItem{Tokens: 1, Draft: 1}, hist: 32, cap: 34, reserved: 2, blocks: 3},
			{kind: "commit", accepted: 1, hist: 33, cap: 33, blocks: 3},
			{kind: "reserve", item: kvcache.ReserveItem{Tokens: 0, Draft: 0}, hist: 33, cap: 33, blocks: 3},
			{kind: "commit", accepted: 0, hist: 33, cap: 33, blocks: 3},
		},
	}, {
		name: "hold is sticky and keeps capacity through commits",
		ops: []op{
			{kind: "reserve", item: kvcache.ReserveItem{New: true, Tokens: 10, Hold: 50}, cap: 50, hold: 50, reserved: 10, blocks: 4},
			{kind: "commit", accepted: 10, hist: 10, cap: 50, hold: 50, blocks: 4},
			{kind: "reserve", item: kvcache.ReserveItem{Tokens: 1, Draft: 2, Hold: 20}, hist: 10, cap: 50, hold: 50, reserved: 3, blocks: 4},
			{kind: "commit", accepted: 1, hist: 11, cap: 50, hold: 50, blocks: 4},
			{kind: "reserve", item: kvcache.ReserveItem{Tokens: 40, Draft: 2}, hist: 11, cap: 53, hold: 50, reserved: 42, blocks: 4},
			{kind: "commit", accepted: 41, hist: 52, cap: 52, hold: 50, blocks: 4},
		},
	}, {
		name: "unreserve restores an existing sequence exactly, and a new one disappears",
		ops: []op{
			{kind: "reserve", item: kvcache.ReserveItem{New: true, Tokens: 16}, cap: 16, reserved: 16, blocks: 1},
			{kind: "commit", accepted: 16, hist: 16, cap: 16, blocks: 1},
			{kind: "reserve", item: kvcache.ReserveItem{Tokens: 16, Draft: 1, Hold: 40}, hist: 16, cap: 40, hold: 40, reserved: 17, blocks: 3},
			{kind: "unreserve", hist: 16, cap: 16, blocks: 1},
			{kind: "reserve", item: kvcache.ReserveItem{Tokens: 1}, hist: 16, cap: 17, reserved: 1, blocks: 2},
			{kind: "commit", accepted: 1, hist: 17, cap: 17, blocks: 2},
			{kind: "reserve", seq: 2, item: kvcache.ReserveItem{New: true, Tokens: 5}, cap: 5, reserved: 5, blocks: 1},
			{kind: "unreserve", seq: 2, hist: -1},
		},
	}, {
		name: "denial for lack of blocks leaves the ledger as it was",
		ops: []op{
			{kind: "reserve", item: kvcache.ReserveItem{New: true, Tokens: 16 * 32}, cap: 512, reserved: 512, blocks: 32},
			{kind: "commit", accepted: 512, hist: 512, cap: 512, blocks: 32},
			{kind: "reserve", seq: 2, item: kvcache.ReserveItem{New: true, Tokens: 16 * 32}, cap: 512, reserved: 512, blocks: 32},
			{kind: "reserve", item: kvcache.ReserveItem{Tokens: 1}, hist: 512, cap: 512, blocks: 32, denied: true},
			{kind: "release", seq: 2, hist: -1},
			{kind: "reserve", item: kvcache.ReserveItem{Tokens: 1}, hist: 512, cap: 513, reserved: 1, blocks: 33},
		},
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m := configured(t, smallConfig(tpb, 64)) // 64 blocks, max_seq_len 512, 2 drafts
			for i, o := range tc.ops {
				seq := o.seq
				if seq == 0 {
					seq = 1
				}
				before := inspect(t, m)
				switch o.kind {
				case "reserve":
					it := o.item
					it.Seq = seq
					g := reserve(t, m, it)[0]
					if g.OK == o.denied {
						t.Fatalf("op %d: Reserve(%+v) OK = %v (%s), want %v", i, it, g.OK, g.Reason, !o.denied)
					}
					if o.denied {
						sameSnapshot(t, "a denied Reserve", before, inspect(t, m))
					}
				case "commit":
					commit(t, m, seq, o.accepted)
				case "unreserve":
					if err := m.Unreserve(bg, []kvcache.SeqID{seq}); err != nil {
						t.Fatalf("op %d: Unreserve: %v", i, err)
					}
				case "release":
					if err := m.Release(bg, []kvcache.SeqID{seq}); err != nil {
						t.Fatalf("op %d: Release: %v", i, err)
					}
				}
				snap := inspect(t, m)
				if len(snap.Violations) > 0 {
					t.Fatalf("op %d (%s): violations %v", i, o.kind, snap.Violations)
				}
				var got *kvcache.SeqState
				for k := range snap.Seqs {
					if snap.Seqs[k].Seq == seq {
						got = &snap.Seqs[k]
					}
				}
				if o.hist < 0 {
					if got != nil {
						t.Fatalf("op %d: seq %d still present: %+v", i, seq, *got)
					}
					continue
				}
				if got == nil {
					t.Fatalf("op %d: seq %d missing", i, seq)
				}
				if got.History != o.hist || got.Capacity != o.cap || got.Hold != o.hold || got.Reserved != o.reserved || got.Blocks[0] != o.blocks {
					t.Fatalf("op %d (%s): ledger = hist %d cap %d hold %d reserved %d blocks %d; want %d %d %d %d %d",
						i, o.kind, got.History, got.Capacity, got.Hold, got.Reserved, got.Blocks[0], o.hist, o.cap, o.hold, o.reserved, o.blocks)
				}
			}
		})
	}
}

// TestSeedA replays the shape of TensorRT-LLM #18661 on the last stage of a
// DSA model with its MTP layer: a 146k-token prompt in 8192-token chunks with
// block reuse off, ending with capacity exactly at history, then the first
// generation step with one draft that is rejected. Upstream this computed
// resize(capacity - rewind, history) with capacity - rewind < history and
// threw; here the rewind comes from the ledger and the state stays sound.
func TestSeedA(t *testing.T) {
	for _, prompt := range []int{146000, 146001, 146048, 169000} {
		m := configured(t, dsaStage(30, 60<<30))
		const seq = 115
		for pos, first := 0, true; pos < prompt; first = false {
			chunk := min(8192, prompt-pos)
			mustGrant(t, m, kvcache.ReserveItem{Seq: seq, New: first, Tokens: chunk})
			commit(t, m, seq, chunk)
			pos += chunk
		}
		st := seqState(t, m, seq)
		if st.History != prompt || st.Capacity != prompt {
			t.Fatalf("after prefill of %d: history %d capacity %d, want both %d", prompt, st.History, st.Capacity, prompt)
		}
		// First generation step: 1 token + 1 draft; the draft is rejected.
		mustGrant(t, m, kvcache.ReserveItem{Seq: seq, Tokens: 1, Draft: 1})
		if st := seqState(t, m, seq); st.Capacity != prompt+2 || st.Reserved != 2 || st.Draft != 1 {
			t.Fatalf("reserved: %+v", st)
		}
		commit(t, m, seq, 1)
		st = seqState(t, m, seq)
		if st.History != prompt+1 || st.Capacity != prompt+1 || st.Blocks[0] != kvcache.BlocksFor(prompt+1, 64) {
			t.Fatalf("prompt %d after a rejected draft: history %d capacity %d blocks %d", prompt, st.History, st.Capacity, st.Blocks[0])
		}
		noViolations(t, m)
		// Next step: the draft is accepted.
		mustGrant(t, m, kvcache.ReserveItem{Seq: seq, Tokens: 1, Draft: 1})
		commit(t, m, seq, 2)
		if st := seqState(t, m, seq); st.History != prompt+3 || st.Capacity != prompt+3 {
			t.Fatalf("after an accepted draft: %+v", st)
		}
		noViolations(t, m)
	}

	// The upstream draft-manager case: capacity 146,001 over history 146,000,
	// then a reservation of 1 (+1 draft) whose draft is rejected.
	m := configured(t, dsaStage(30, 60<<30))
	mustGrant(t, m, kvcache.ReserveItem{Seq: 7, New: true, Tokens: 146000, Hold: 146001})
	commit(t, m, 7, 146000)
	if st := seqState(t, m, 7); st.History != 146000 || st.Capacity != 146001 {
		t.Fatalf("setup: %+v", st)
	}
	mustGrant(t, m, kvcache.ReserveItem{Seq: 7, Tokens: 1, Draft: 1})
	commit(t, m, 7, 1)
	if st := seqState(t, m, 7); st.History != 146001 || st.Capacity != 146001 {
		t.Fatalf("draft-manager case: %+v", st)
	}
	noViolations(t, m)
}

func TestCommitInvalidItems(t *testing.T) {
	m := configured(t, smallConfig(16, 64))
	reserve(t, m,
		kvcache.ReserveItem{Seq: 1, New: true, Tokens: 4, Draft: 2},
		kvcache.ReserveItem{Seq: 2, New: true, Tokens: 4, Draft: 2},
		kvcache.ReserveItem{Seq: 3, New: true, Tokens: 4})
	commit(t, m, 3, 4)
	before := seqState(t, m, 1)
	_, err := m.Commit(bg, []kvcache.CommitItem{
		{Seq: 1, Accepted: 3}, // fewer than Tokens: only drafts may be rejected
		{Seq: 2, Accepted: 5}, // valid
		{Seq: 3, Accepted: 1}, // no outstanding reservation
		{Seq: 9, Accepted: 1}, // unknown
		{Seq: 2, Accepted: 5}, // already committed above
	})
	var ke *kvcache.Error
	if !errors.As(err, &ke) || !errors.Is(err, kvcache.ErrInvalidArg) {
		t.Fatalf("Commit error = %v, want an item-scoped ErrInvalidArg", err)
	}
	if want := []kvcache.SeqID{1, 3, 9, 2}; !reflect.DeepEqual(ke.Seqs, want) {
		t.Errorf("error Seqs = %v, want %v", ke.Seqs, want)
	}
	for _, w := range []string{"seq 1: Accepted = 3 outside [4, 6]", "seq 3: no outstanding reservation", "seq 9: unknown sequence"} {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error %q lacks %q", err, w)
		}
	}
	if got := seqState(t, m, 1); !reflect.DeepEqual(got, before) {
		t.Errorf("seq 1 changed by a rejected commit: %+v, was %+v", got, before)
	}
	if got := seqState(t, m, 2); got.History != 5 || got.Capacity != 5 || got.Reserved != 0 {
		t.Errorf("seq 2 = %+v, want history 5 capacity 5", got)
	}
	for _, bad := range []int{7, -1} {
		if _, err := m.Commit(bg, []kvcache.CommitItem{{Seq: 1, Accepted: bad}}); !errors.Is(err, kvcache.ErrInvalidArg) {
			t.Errorf("Commit(Accepted %d) = %v, want ErrInvalidArg", bad, err)
		}
	}
	commit(t, m, 1, 6)
	noViolations(t, m)
}

func TestReserveInvalidItems(t *testing.T) {
	setup := func() *Manager {
		m := configured(t, smallConfig(16, 64))
		mustGrant(t, m, kvcache.ReserveItem{Seq: 1, New: true, Tokens: 10})
		commit(t, m, 1, 10)
		mustGrant(t, m, kvcache.ReserveItem{Seq: 2, New: true, Tokens: 10}) // outstanding
		return m
	}
	good := kvcache.ReserveItem{Seq: 1, Tokens: 3, Draft: 1}
	tests := []struct {
		name string
		item kvcache.ReserveItem
		want string
	}{
		{"negative tokens", kvcache.ReserveItem{Seq: 5, New: true, Tokens: -1}, "Tokens = -1"},
		{"negative draft", kvcache.ReserveItem{Seq: 5, New: true, Draft: -1}, "Draft = -1"},
		{"too many drafts", kvcache.ReserveItem{Seq: 5, New: true, Draft: 3}, "Draft = 3; must be <= max draft tokens 2"},
		{"negative hold", kvcache.ReserveItem{Seq: 5, New: true, Hold: -1}, "Hold = -1"},
		{"hold beyond max_seq_len", kvcache.ReserveItem{Seq: 5, New: true, Hold: 515}, "Hold = 515"},
		{"unknown", kvcache.ReserveItem{Seq: 5, Tokens: 1}, "unknown sequence"},
		{"new for existing", kvcache.ReserveItem{Seq: 1, New: true, Tokens: 1}, "already exists"},
		{"outstanding", kvcache.ReserveItem{Seq: 2, Tokens: 1}, "outstanding"},
		{"reuse on existing", kvcache.ReserveItem{Seq: 1, Reuse: 16}, "Reuse = 16"},
		{"reuse with reuse off", kvcache.ReserveItem{Seq: 5, New: true, Tokens: 1, Reuse: 16, Prompt: make([]int32, 40)}, "block reuse is off"},
		{"past max_seq_len", kvcache.ReserveItem{Seq: 1, Tokens: 503, Draft: 2}, "history 10 + Tokens 503 + Draft 2 = 515 exceeds max_seq_len 512"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m := setup()
			ref := setup()
			mustGrant(t, ref, good)
			g := reserve(t, m, tc.item, good)
			if g[0].OK || !strings.HasPrefix(g[0].Reason, "invalid:") || !strings.Contains(g[0].Reason, tc.want) {
				t.Fatalf("Reserve(%+v) = %+v, want a denial \"invalid: ...%s...\"", tc.item, g[0], tc.want)
			}
			if !g[1].OK {
				t.Fatalf("good item denied next to a bad one: %s", g[1].Reason)
			}
			sameSnapshot(t, "a bad item", inspect(t, ref), inspect(t, m))
		})
	}
}

func TestReserveDenialIsAtomicAcrossPools(t *testing.T) {
	cfg := hybridStage() // 16 ssm slots, plenty of blocks
	cfg.EnableBlockReuse = false
	m := configured(t, cfg)
	for i := range 16 {
		g := mustGrant(t, m, kvcache.ReserveItem{Seq: kvcache.SeqID(i), New: true, Tokens: 100})
		if len(g.Tables) != 2 || g.Tables[0].Pool != 1 || len(g.Tables[0].Blocks) != 1 || g.Tables[1].Pool != 0 || len(g.Tables[1].Blocks) != 2 {
			t.Fatalf("grant tables = %+v, want one ssm slot and two blocks", g.Tables)
		}
	}
	before := inspect(t, m)
	g := reserve(t, m, kvcache.ReserveItem{Seq: 99, New: true, Tokens: 100})[0]
	if g.OK || !strings.Contains(g.Reason, "no free state slot") || !strings.Contains(g.Reason, "all 16") {
		t.Fatalf("17th sequence = %+v, want a denial for the ssm pool", g)
	}
	sameSnapshot(t, "an ssm denial", before, inspect(t, m))
	st, _ := m.Stats(bg)
	if st.ReserveDenials != 1 || st.Sequences != 16 {
		t.Errorf("Stats = %+v", st)
	}

	// Paged pool exhaustion: two pools (full and window), the full one binds.
	wcfg := kvcache.Config{
		Stages: 1, TokensPerBlock: 16, MaxBatchSize: 4, MaxNumTokens: 64, MaxSeqLen: 256,
		Layers:      append(gqaLayers(0, 1, 100, 0), gqaLayers(1, 1, 100, 32)...),
		DeviceBytes: 20 * 16 * 200,
	}
	m = configured(t, wcfg)
	mustGrant(t, m, kvcache.ReserveItem{Seq: 1, New: true, Tokens: 256})
	commit(t, m, 1, 256) // window pool keeps only the last blocks
	before = inspect(t, m)
	if before.Pools[1].InUse >= before.Pools[0].InUse {
		t.Fatalf("window pool should have released stale blocks: %+v", before.Pools)
	}
	g = reserve(t, m, kvcache.ReserveItem{Seq: 2, New: true, Tokens: 80})[0]
	if g.OK || !strings.Contains(g.Reason, "pool 0 (full) needs 5 more blocks for capacity 80") || !strings.Contains(g.Reason, "has 4 free + 0 evictable of 20") {
		t.Fatalf("Reserve = %+v, want a denial naming pool 0", g)
	}
	sameSnapshot(t, "a paged denial", before, inspect(t, m))
}

func TestTableDeltasRebuildTables(t *testing.T) {
	m := configured(t, smallConfig(4, 64))
	worker := map[kvcache.SeqID][]kvcache.BlockID{}
	apply := func(gs []kvcache.Grant) {
		for _, g := range gs {
			for _, d := range g.Tables {
				tab := worker[g.Seq]
				if d.From > len(tab) {
					t.Fatalf("delta From %d beyond the worker's table of %d", d.From, len(tab))
				}
				worker[g.Seq] = append(tab[:d.From:d.From], d.Blocks...)
			}
		}
	}
	check := func() {
		for _, s := range inspect(t, m).Seqs {
			if !reflect.DeepEqual(worker[s.Seq], s.Tables[0]) && !(len(worker[s.Seq]) == 0 && len(s.Tables[0]) == 0) {
				t.Fatalf("seq %d: worker table %v, manager %v", s.Seq, worker[s.Seq], s.Tables[0])
			}
		}
	}
	apply(reserve(t, m, kvcache.ReserveItem{Seq: 1, New: true, Tokens: 6}, kvcache.ReserveItem{Seq: 2, New: true, Tokens: 3}))
	check()
	commit(t, m, 1, 6)
	commit(t, m, 2, 3)
	g := reserve(t, m, kvcache.ReserveItem{Seq: 1, Tokens: 1, Draft: 2}, kvcache.ReserveItem{Seq: 2, Tokens: 1})
	if len(g[1].Tables) != 0 {
		t.Errorf("seq 2 needed no block but got deltas %+v", g[1].Tables)
	}
	apply(g)
	check()
	commit(t, m, 1, 1) // rejects both drafts: the third block is freed
	commit(t, m, 2, 1)
	g = reserve(t, m, kvcache.ReserveItem{Seq: 1, Tokens: 1})
	if len(g[0].Tables) != 1 || g[0].Tables[0].From != 2 || len(g[0].Tables[0].Blocks) != 0 {
		t.Errorf("after a rewind the next delta should truncate to 2 blocks: %+v", g[0].Tables)
	}
	apply(g)
	check()
	// An unreserved reservation never reached the worker.
	reserve(t, m, kvcache.ReserveItem{Seq: 2, Tokens: 8})
	if err := m.Unreserve(bg, []kvcache.SeqID{2}); err != nil {
		t.Fatal(err)
	}
	apply(reserve(t, m, kvcache.ReserveItem{Seq: 2, Tokens: 5}))
	check()
}

func TestReleaseAndUnreserveUnknown(t *testing.T) {
	m := configured(t, smallConfig(16, 64))
	mustGrant(t, m, kvcache.ReserveItem{Seq: 1, New: true, Tokens: 30})
	mustGrant(t, m, kvcache.ReserveItem{Seq: 2, New: true, Tokens: 30})
	commit(t, m, 2, 30)
	err := m.Unreserve(bg, []kvcache.SeqID{7, 2})
	var ke *kvcache.Error
	if !errors.As(err, &ke) || !reflect.DeepEqual(ke.Seqs, []kvcache.SeqID{7, 2}) {
		t.Fatalf("Unreserve = %v, want an item error about 7 and 2", err)
	}
	err = m.Release(bg, []kvcache.SeqID{1, 8, 2, 1})
	if !errors.As(err, &ke) || !reflect.DeepEqual(ke.Seqs, []kvcache.SeqID{8, 1}) || !errors.Is(err, kvcache.ErrInvalidArg) {
		t.Fatalf("Release = %v, want an item error about 8 and the second 1", err)
	}
	snap := inspect(t, m)
	if len(snap.Seqs) != 0 || snap.Pools[0].Free != 64 || len(snap.Violations) > 0 {
		t.Fatalf("after Release: %+v", snap)
	}
}

func TestSlidingWindowRelease(t *testing.T) {
	cfg := kvcache.Config{
		Stages: 1, TokensPerBlock: 32, MaxBatchSize: 4, MaxNumTokens: 128, MaxSeqLen: 1024,
		Layers:      append(gqaLayers(0, 1, 64, 0), gqaLayers(1, 1, 64, 128)...),
		DeviceBytes: 64 * 32 * 128,
	}
	m := configured(t, cfg)
	pos := 0
	for _, chunk := range []int{100, 100, 120, 1} {
		mustGrant(t, m, kvcache.ReserveItem{Seq: 1, New: pos == 0, Tokens: chunk})
		commit(t, m, 1, chunk)
		pos += chunk
	}
	// history 321: blocks wholly before 321-128 = 193 are 0..5 (end at 192).
	st := seqState(t, m, 1)
	if st.Blocks[0] != 11 || st.Blocks[1] != 5 {
		t.Fatalf("blocks = %v, want full 11, window 11-6 = 5", st.Blocks)
	}
	for j, b := range st.Tables[1] {
		if (j < 6) != (b == noBlock) {
			t.Fatalf("window table %v: positions 0..5 should be -1", st.Tables[1])
		}
	}
	noViolations(t, m)
	if err := m.Release(bg, []kvcache.SeqID{1}); err != nil {
		t.Fatal(err)
	}
	snap := inspect(t, m)
	if snap.Pools[1].Free != 64 || len(snap.Violations) > 0 {
		t.Fatalf("after release: %+v", snap)
	}
}

func TestStateOnlyStage(t *testing.T) {
	cfg := hybridStage()
	cfg.Layers = cfg.Layers[2:] // Mamba layers only
	l, err := New().Configure(bg, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if len(l.Pools) != 1 || l.Pools[0].Name != "ssm" || l.MaxSeqTokens != cfg.MaxSeqLen || l.MaxSequences != 16 {
		t.Fatalf("layout = %+v", l)
	}
	m := configured(t, cfg)
	g := mustGrant(t, m, kvcache.ReserveItem{Seq: 1, New: true, Tokens: 4000})
	if len(g.Tables) != 1 || g.Tables[0].Pool != 0 || len(g.Tables[0].Blocks) != 1 {
		t.Fatalf("grant = %+v, want one state slot", g)
	}
	commit(t, m, 1, 4000)
	if st := seqState(t, m, 1); st.History != 4000 || st.Capacity != 4000 || st.Blocks[0] != 1 {
		t.Fatalf("state = %+v", st)
	}
	noViolations(t, m)
	if err := m.Release(bg, []kvcache.SeqID{1}); err != nil {
		t.Fatal(err)
	}
	if p := inspect(t, m).Pools[0]; p.Free != 16 {
		t.Fatalf("slot not freed: %+v", p)
	}
}
