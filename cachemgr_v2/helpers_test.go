package cachemgrv2

import (
	"context"
	"fmt"

	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
	"github.com/kvx-dev/kvx/plugins/v1/spec"
)

var ctx = context.Background()

// tb is what the helpers need of *testing.T, *testing.B and *rapid.T.
type tb interface {
	Helper()
	Fatal(args ...any)
	Fatalf(format string, args ...any)
}

// Per-token bytes of one rank's buffers, in the shape of DeepSeek-V3.2 with an
// fp8 KV cache (latent 512 + rope 64, indexer key 128 fp8 + fp32 scale).
const (
	latentBytes = 656
	indexBytes  = 132
	gqaBytes    = 1024
)

func dsaLayer(i int, mtp bool) spec.Layer {
	return spec.Layer{Index: i, Mixer: spec.MixerDSA, MTP: mtp, Buffers: []spec.Buffer{
		{Role: spec.RoleLatent, BytesPerToken: latentBytes},
		{Role: spec.RoleIndexKey, BytesPerToken: indexBytes},
	}}
}

func gqaLayer(i, window int) spec.Layer {
	return spec.Layer{Index: i, Mixer: spec.MixerGQA, Window: window, Buffers: []spec.Buffer{
		{Role: spec.RoleKV, BytesPerToken: gqaBytes},
	}}
}

func mambaLayer(i int) spec.Layer {
	return spec.Layer{Index: i, Mixer: spec.MixerMamba, Buffers: []spec.Buffer{
		{Role: spec.RoleConvState, BytesPerSeq: 4096},
		{Role: spec.RoleSSMState, BytesPerSeq: 1 << 20},
	}}
}

// dsaStage returns layers first..first+n-1, plus an MTP layer when mtp.
func dsaStage(first, n int, mtp bool) []spec.Layer {
	var ls []spec.Layer
	for i := range n {
		ls = append(ls, dsaLayer(first+i, false))
	}
	if mtp {
		ls = append(ls, dsaLayer(first+n, true))
	}
	return ls
}

// stageBlockBytes is what one block of the single "full" group of layers costs.
func stageBlockBytes(layers []spec.Layer, tpb int) int64 {
	var b int64
	for _, l := range layers {
		for _, buf := range l.Buffers {
			b += buf.BytesPerToken
		}
	}
	return b * int64(tpb)
}

func configure(t tb, cfg kvcache.Config) (*Manager, kvcache.Layout) {
	t.Helper()
	m := New()
	lay, err := m.Configure(ctx, cfg)
	if err != nil {
		t.Fatalf("Configure: %v", err)
	}
	return m, lay
}

// inspect returns a deep snapshot after checking the manager's own
// violations and the invariants an outside observer can recompute.
func inspect(t tb, m *Manager) kvcache.Snapshot {
	t.Helper()
	snap, err := m.Inspect(ctx, kvcache.InspectOptions{Tables: true})
	if err != nil {
		t.Fatalf("Inspect: %v", err)
	}
	if err := externalCheck(m, snap); err != nil {
		t.Fatal(err)
	}
	return snap
}

func externalCheck(m *Manager, snap kvcache.Snapshot) error {
	for _, v := range snap.Violations {
		return fmt.Errorf("violation: %s (and %d more)", v, len(snap.Violations)-1)
	}
	tpb := m.tpb
	count := make([][]int32, len(snap.Pools))
	for i, p := range snap.Pools {
		if p.Free+p.Cached+p.InUse != p.Total {
			return fmt.Errorf("pool %d: free %d + cached %d + in use %d != total %d", p.Pool, p.Free, p.Cached, p.InUse, p.Total)
		}
		count[i] = make([]int32, p.Total)
	}
	ng := len(m.dev)
	for _, s := range snap.Seqs {
		if s.History < 0 || s.History > s.Capacity {
			return fmt.Errorf("seq %d: history %d, capacity %d", s.Seq, s.History, s.Capacity)
		}
		for g := range ng {
			n := s.Blocks[g]
			if m.host != nil {
				n += s.Blocks[ng+g]
			}
			if want := kvcache.BlocksFor(s.Capacity, tpb); n != want {
				return fmt.Errorf("seq %d: group %d holds %d blocks, want ceil(%d/%d) = %d", s.Seq, g, n, s.Capacity, tpb, want)
			}
		}
		for p, tab := range s.Tables {
			if len(tab) != s.Blocks[p] {
				return fmt.Errorf("seq %d: pool %d: table of %d, Blocks %d", s.Seq, p, len(tab), s.Blocks[p])
			}
			for _, b := range tab {
				count[p][b]++
			}
		}
	}
	for p := range count {
		inUse := 0
		for b, c := range count[p] {
			if c != snap.RefCounts[p][b] {
				return fmt.Errorf("pool %d block %d: %d tables reference it, refcount %d", p, b, c, snap.RefCounts[p][b])
			}
			if c > 0 {
				inUse++
			}
		}
		if inUse != snap.Pools[p].InUse {
			return fmt.Errorf("pool %d: %d blocks referenced, InUse %d", p, inUse, snap.Pools[p].InUse)
		}
	}
	return nil
}

func reserve1(t tb, m *Manager, it kvcache.ReserveItem) kvcache.Grant {
	t.Helper()
	gs, err := m.Reserve(ctx, []kvcache.ReserveItem{it})
	if err != nil {
		t.Fatalf("Reserve(%+v): %v", it, err)
	}
	return gs[0]
}

func mustGrant(t tb, m *Manager, it kvcache.ReserveItem) kvcache.Grant {
	t.Helper()
	g := reserve1(t, m, it)
	if !g.OK {
		t.Fatalf("Reserve(seq %d, tokens %d, draft %d) denied: %s", it.Seq, it.Tokens, it.Draft, g.Reason)
	}
	return g
}

func mustCommit(t tb, m *Manager, seq kvcache.SeqID, accepted int) {
	t.Helper()
	if _, err := m.Commit(ctx, []kvcache.CommitItem{{Seq: seq, Accepted: accepted}}); err != nil {
		t.Fatalf("Commit(seq %d, accepted %d): %v", seq, accepted, err)
	}
}

func seqState(t tb, snap kvcache.Snapshot, id kvcache.SeqID) kvcache.SeqState {
	t.Helper()
	for _, s := range snap.Seqs {
		if s.Seq == id {
			return s
		}
	}
	t.Fatalf("seq %d not in snapshot", id)
	return kvcache.SeqState{}
}

// tokens returns n tokens: prefix followed by seed-derived values.
func tokens(n int, seed int32) []int32 {
	p := make([]int32, n)
	for i := range p {
		p[i] = seed*1000003 + int32(i)
	}
	return p
}
