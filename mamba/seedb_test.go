package mamba

import (
	"testing"

	cachemgrv2 "github.com/kvx-dev/kvx/cachemgr_v2"
	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
)

// pathAttached checks that every node of s's path is attached to the tree,
// pinned, with all its pages, and that path[i] is path[i-1]'s child.
func pathAttached(t *testing.T, m *Manager, s *cachemgrv2.Seq, when string) {
	t.Helper()
	parent := m.Tree().Root()
	for i, n := range s.Path() {
		if !m.Tree().Attached(n) || n.Parent() != parent || n.Pins() == 0 || !n.Complete() {
			t.Fatalf("%s: seq %d: path node %d: attached %v, child of path node %d %v, pins %d, complete %v",
				when, s.ID(), i, m.Tree().Attached(n), i-1, n.Parent() == parent, n.Pins(), n.Complete())
		}
		parent = n
	}
}

// TestSnapshotEvictionMidCommit reproduces the shape of upstream #17926: a
// sequence in the middle of its prefill, whose path ends in a leaf that
// holds an unpinned snapshot, while snapshot allocations must evict. Its own
// next step's allocations evict snapshots of its own path, and another
// sequence's allocations evict while its step is outstanding (between
// Reserve and Commit). Eviction frees snapshot slots only: no node is
// detached, the sequence's path stays attached and pinned, its Commit
// extends the path under the same leaf and installs what it wrote, and the
// deep self-check stays clean after every call.
func TestSnapshotEvictionMidCommit(t *testing.T) {
	const tpb = 16
	cfg := testConfig(tpb, 256, 4+3) // 4 live slots, 3 snapshot slots
	cfg.MaxSeqLen = 64 * tpb
	m, _ := configured(t, cfg)
	if m.life.snapCap != 3 {
		t.Fatalf("snapshot slots %d, want 3", m.life.snapCap)
	}
	chunk := 4 * tpb // four boundaries per step, more than the pool holds
	p := tokens(40*tpb+5, 1)

	// B's first step fills the pool: snapshots at 16, 32 and 48 (levels 0,
	// 1, 0), the last on B's leaf. Its next step's boundaries 64, 80, 96, 112
	// (levels 2, 0, 1, 0) must evict B's own unpinned snapshots, the leaf's
	// included (the upstream shape), or be skipped.
	b := kvcache.SeqID(2)
	if g := reserve(t, m, kvcache.ReserveItem{Seq: b, New: true, Prompt: p, Tokens: 3 * tpb}); !g[0].OK {
		t.Fatal(g[0].Reason)
	}
	commit(t, m, kvcache.CommitItem{Seq: b, Accepted: 3 * tpb})
	mustClean(t, m, "B step 1")
	sb := m.Seq(b)
	leaf := sb.Path()[len(sb.Path())-1]
	if m.life.snaps[leaf] == nil {
		t.Fatalf("B's leaf (block %d) holds no snapshot: the shape needs an unpinned snapshot on a leaf of a live path", len(sb.Path()))
	}
	for step := 2; step <= 6; step++ {
		leafSnap := m.life.snaps[sb.Path()[len(sb.Path())-1]]
		nodes := m.Tree().Nodes()
		ev := m.life.stats.Evicted
		if g := reserve(t, m, kvcache.ReserveItem{Seq: b, Tokens: chunk}); !g[0].OK {
			t.Fatal(g[0].Reason)
		}
		if m.life.stats.Evicted == ev && len(stateOf(sb).pend) > 0 {
			t.Fatalf("step %d: snapshot slots were taken without eviction from a full pool", step)
		}
		if m.Tree().Nodes() != nodes {
			t.Fatalf("step %d: Reserve changed the tree from %d to %d nodes: snapshot eviction must not detach", step, nodes, m.Tree().Nodes())
		}
		pathAttached(t, m, sb, "after Reserve")
		mustClean(t, m, "after Reserve")
		if step == 2 && (leafSnap == nil || m.life.snaps[leaf] != nil) {
			t.Fatalf("step 2: B's leaf snapshot was not evicted by B's own allocations (snapshots at %v)", snapPositions(m))
		}

		// Another sequence's step allocates (and evicts) while B's step is
		// outstanding.
		c := kvcache.SeqID(100 + step)
		q := tokens(6*tpb, int32(100+step))
		if g := reserve(t, m, kvcache.ReserveItem{Seq: c, New: true, Prompt: q, Tokens: len(q)}); !g[0].OK {
			t.Fatal(g[0].Reason)
		}
		pathAttached(t, m, sb, "after another sequence's Reserve")
		mustClean(t, m, "after another sequence's Reserve")

		depth := len(sb.Path())
		commit(t, m, kvcache.CommitItem{Seq: b, Accepted: chunk}, kvcache.CommitItem{Seq: c, Accepted: len(q)})
		if len(sb.Path()) != depth+4 || sb.Path()[depth].Parent() != sb.Path()[depth-1] {
			t.Fatalf("step %d: Commit extended the path from %d to %d blocks, or not under its old leaf", step, depth, len(sb.Path()))
		}
		pathAttached(t, m, sb, "after Commit")
		mustClean(t, m, "after Commit")
		release(t, m, c)
		mustClean(t, m, "after Release")
	}
	st, _ := m.Stats(t.Context())
	if st.Snapshots.Evicted == 0 || st.Snapshots.Skipped == 0 || st.Snapshots.Taken == 0 {
		t.Fatalf("snapshots %+v: want some taken, evicted and skipped", st.Snapshots)
	}
	// What B kept is reusable: Lookup finds the deepest snapshot on its path.
	release(t, m, b)
	mustClean(t, m, "B released")
	if got := lookup(t, m, p); got == 0 || m.life.snaps[m.Tree().Match(p, got/tpb, nil)[got/tpb-1]] == nil {
		t.Fatalf("Lookup after B = %d, want a boundary that holds a snapshot", got)
	}
}

// TestReuseSourcePinned checks that a snapshot being copied into a new
// sequence's live slot is not evicted before that sequence's first Commit,
// whatever other steps allocate, and that reuse starts at exactly the
// snapshot's boundary.
func TestReuseSourcePinned(t *testing.T) {
	const tpb = 16
	cfg := testConfig(tpb, 256, 4+2)
	cfg.MaxSeqLen = 64 * tpb
	m, _ := configured(t, cfg)
	p := tokens(8*tpb+3, 1)
	prefill(t, m, 1, p, 8*tpb)
	release(t, m, 1)
	r := lookup(t, m, p)
	if r == 0 {
		t.Fatal("nothing to reuse")
	}
	g := reserve(t, m, kvcache.ReserveItem{Seq: 2, New: true, Prompt: p, Reuse: r, Tokens: len(p) - r})
	if !g[0].OK || len(g[0].Copies) != 1 {
		t.Fatalf("reuse grant %+v, want OK with one snapshot copy", g[0])
	}
	src := m.life.snaps[m.Tree().Match(p, r/tpb, nil)[r/tpb-1]]
	if src == nil || src.pins != 1 || g[0].Copies[0].SrcBlock != src.slot || g[0].Copies[0].DstBlock != stateOf(m.Seq(2)).live {
		t.Fatalf("copy %+v: want the snapshot at %d (pinned) into the live slot", g[0].Copies[0], r)
	}
	// Fill the snapshot pool with other prompts while the copy is pending.
	for i := range 4 {
		q := tokens(8*tpb, int32(50+i))
		if g := reserve(t, m, kvcache.ReserveItem{Seq: kvcache.SeqID(10 + i), New: true, Prompt: q, Tokens: len(q)}); !g[0].OK {
			t.Fatal(g[0].Reason)
		}
		if m.life.snaps[src.node] != src {
			t.Fatalf("the pinned reuse source was evicted by seq %d's snapshots", 10+i)
		}
		commit(t, m, kvcache.CommitItem{Seq: kvcache.SeqID(10 + i), Accepted: len(q)})
		release(t, m, kvcache.SeqID(10+i))
		if i == 1 {
			break // two sequences at a time besides seq 2 fit the live slots
		}
	}
	mustClean(t, m, "pool filled")
	commit(t, m, kvcache.CommitItem{Seq: 2, Accepted: len(p) - r})
	if src.pins != 0 {
		t.Fatalf("source pins %d after the first Commit, want 0", src.pins)
	}
	mustClean(t, m, "after Commit")
}

// TestThinningKeepsSharedPrefix: one prompt takes far more snapshots than
// the pool holds (a long shared prefix, then a long unique suffix). Pure LRU
// would keep only the suffix's last snapshots; thinning keeps an even spread,
// so the next request with the same prefix and another suffix still hits,
// at a boundary in the shared part.
func TestThinningKeepsSharedPrefix(t *testing.T) {
	const tpb, prefix, suffix = 16, 100, 300 // blocks
	cfg := testConfig(tpb, 1024, 4+8)        // 8 snapshot slots for 400 boundaries
	cfg.MaxSeqLen = 512 * tpb
	cfg.MaxNumTokens = 32 * tpb
	m, _ := configured(t, cfg)
	shared := tokens(prefix*tpb, 1)
	a := append(append([]int32(nil), shared...), tokens(suffix*tpb+1, 2)...)
	prefill(t, m, 1, a, cfg.MaxNumTokens)
	release(t, m, 1)
	mustClean(t, m, "A done")
	b := append(append([]int32(nil), shared...), tokens(suffix*tpb+1, 3)...)
	got := lookup(t, m, b)
	if got < prefix*tpb/2 || got > prefix*tpb {
		t.Fatalf("Lookup of the same prefix with another suffix = %d tokens, want a hit in [%d, %d] (snapshots kept at %v)",
			got, prefix*tpb/2, prefix*tpb, snapPositions(m))
	}
	if r := prefill(t, m, 2, b, cfg.MaxNumTokens); r != got {
		t.Fatalf("reused %d, Lookup said %d", r, got)
	}
	mustClean(t, m, "B done")
}

func snapPositions(m *Manager) []int {
	var out []int
	m.Tree().Walk(func(n *cachemgrv2.Node) {
		if sn := m.life.snaps[n]; sn != nil {
			out = append(out, sn.pos)
		}
	})
	return out
}
