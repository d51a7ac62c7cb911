package mamba

import (
	"context"
	"testing"

	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
	"github.com/kvx-dev/kvx/plugins/v1/spec"
)

// Test model: a small hybrid stage, attention and mamba layers alternating.
const (
	kvPerToken = 2048 // bytes per token of one attention layer
	convBytes  = 64   // bytes of one layer's conv state
	ssmBytes   = 192  // bytes of one layer's SSM state
)

// hybridLayers returns attn attention layers and mamba mamba layers,
// interleaved, plus one FFN-only layer (no cache).
func hybridLayers(attn, mamba int) []spec.Layer {
	var out []spec.Layer
	for i := 0; attn > 0 || mamba > 0; i++ {
		if mamba > 0 && (i%2 == 0 || attn == 0) {
			out = append(out, spec.Layer{Index: len(out), Mixer: spec.MixerMamba, FFN: spec.FFNDense, Buffers: []spec.Buffer{
				{Role: spec.RoleConvState, BytesPerSeq: convBytes}, {Role: spec.RoleSSMState, BytesPerSeq: ssmBytes}}})
			mamba--
			continue
		}
		out = append(out, spec.Layer{Index: len(out), Mixer: spec.MixerGQA, FFN: spec.FFNDense, Buffers: []spec.Buffer{
			{Role: spec.RoleKV, BytesPerToken: kvPerToken}}})
		attn--
	}
	out = append(out, spec.Layer{Index: len(out), FFN: spec.FFNMoE})
	return out
}

// testConfig is a config of the hybrid stage with attnBlocks attention
// blocks and ssmSlots state slots when split by pool_ratio.
func testConfig(tpb, attnBlocks, ssmSlots int) kvcache.Config {
	layers := hybridLayers(2, 2)
	blockBytes := int64(2 * kvPerToken * tpb)
	state := int64(2 * (convBytes + ssmBytes))
	a, s := int64(attnBlocks)*blockBytes, int64(ssmSlots)*state
	return kvcache.Config{
		Stages: 1, Layers: layers, TokensPerBlock: tpb,
		DeviceBytes:  a + s + state/2,
		MaxBatchSize: 4, MaxNumTokens: 4 * tpb, MaxSeqLen: 32 * tpb,
		EnableBlockReuse: true,
		PoolRatio:        []float64{float64(a) / float64(a+s), float64(s) / float64(a+s)},
		Snapshots:        kvcache.SnapshotConfig{Interval: tpb},
	}
}

// configured returns a manager configured with cfg.
func configured(t testing.TB, cfg kvcache.Config) (*Manager, kvcache.Layout) {
	t.Helper()
	m := New()
	lay, err := m.Configure(context.Background(), cfg)
	if err != nil {
		t.Fatalf("Configure: %v", err)
	}
	return m, lay
}

// mustClean fails when the deep self-check finds anything.
func mustClean(t testing.TB, m *Manager, when string) {
	t.Helper()
	snap, err := m.Inspect(context.Background(), kvcache.InspectOptions{Tables: true})
	if err != nil {
		t.Fatalf("%s: Inspect: %v", when, err)
	}
	if len(snap.Violations) > 0 {
		t.Fatalf("%s: violations:\n%v", when, snap.Violations)
	}
}

func reserve(t testing.TB, m *Manager, items ...kvcache.ReserveItem) []kvcache.Grant {
	t.Helper()
	g, err := m.Reserve(context.Background(), items)
	if err != nil {
		t.Fatalf("Reserve: %v", err)
	}
	for i := range g {
		checkSnapshotSlots(t, m, &g[i])
	}
	return g
}

// checkSnapshotSlots: a grant's Snapshots name exactly the snapshot slots of
// its ssm table delta (the entries after the live slot), in increasing Pos.
func checkSnapshotSlots(t testing.TB, m *Manager, g *kvcache.Grant) {
	t.Helper()
	if m.life.ssm == nil {
		if len(g.Snapshots) > 0 {
			t.Fatalf("seq %d: snapshot slots %v on a stage without state", g.Seq, g.Snapshots)
		}
		return
	}
	var slots []kvcache.BlockID
	for _, d := range g.Tables {
		if d.Pool != m.life.ssm.id {
			continue
		}
		slots = d.Blocks
		if d.From == 0 && len(slots) > 0 {
			slots = slots[1:] // the live slot
		}
	}
	if len(slots) != len(g.Snapshots) {
		t.Fatalf("seq %d: ssm table delta has snapshot slots %v, Snapshots %v", g.Seq, slots, g.Snapshots)
	}
	for k, ss := range g.Snapshots {
		if ss.Block != slots[k] || ss.Pool != m.life.ssm.id || (k > 0 && ss.Pos <= g.Snapshots[k-1].Pos) {
			t.Fatalf("seq %d: Snapshots %v do not match the slots %v of pool %d in increasing pos", g.Seq, g.Snapshots, slots, m.life.ssm.id)
		}
	}
}

func commit(t testing.TB, m *Manager, items ...kvcache.CommitItem) {
	t.Helper()
	if _, err := m.Commit(context.Background(), items); err != nil {
		t.Fatalf("Commit: %v", err)
	}
}

func lookup(t testing.TB, m *Manager, p []int32) int {
	t.Helper()
	got, err := m.Lookup(context.Background(), []kvcache.LookupItem{{Seq: 1, Prompt: p}})
	if err != nil {
		t.Fatalf("Lookup: %v", err)
	}
	return got[0]
}

// prefill runs a new sequence through its whole prompt in chunks, reusing
// what Lookup offers, and returns the reused length.
func prefill(t testing.TB, m *Manager, id kvcache.SeqID, p []int32, chunk int) int {
	t.Helper()
	reuse := lookup(t, m, p)
	done := reuse
	for first := true; done < len(p); first = false {
		n := min(chunk, len(p)-done)
		it := kvcache.ReserveItem{Seq: id, Tokens: n}
		if first {
			it.New, it.Prompt, it.Reuse = true, p, reuse
		}
		if g := reserve(t, m, it); !g[0].OK {
			t.Fatalf("seq %d at %d: denied: %s", id, done, g[0].Reason)
		}
		commit(t, m, kvcache.CommitItem{Seq: id, Accepted: n})
		done += n
	}
	return reuse
}

func release(t testing.TB, m *Manager, ids ...kvcache.SeqID) {
	t.Helper()
	if err := m.Release(context.Background(), ids); err != nil {
		t.Fatalf("Release: %v", err)
	}
}

// tokens returns n tokens: shared with every other call of the same salt
// for the first common positions.
func tokens(n int, salt int32) []int32 {
	p := make([]int32, n)
	for i := range p {
		p[i] = salt*100003 + int32(i)%30011 + 1
	}
	return p
}
