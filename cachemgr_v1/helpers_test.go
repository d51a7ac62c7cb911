package cachemgrv1

import (
	"context"
	"reflect"
	"testing"

	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
	"github.com/kvx-dev/kvx/plugins/v1/spec"
)

var bg = context.Background()

// gqaLayers returns n GQA layers of bpt bytes per token each, with window w.
func gqaLayers(first, n int, bpt int64, w int) []spec.Layer {
	ls := make([]spec.Layer, n)
	for i := range ls {
		ls[i] = spec.Layer{Index: first + i, Mixer: spec.MixerGQA, Window: w,
			Buffers: []spec.Buffer{{Role: spec.RoleKV, BytesPerToken: bpt}}}
	}
	return ls
}

// smallConfig is a full-attention stage of two layers (100 bytes per token
// in all) whose pool has exactly blocks blocks of tpb tokens.
func smallConfig(tpb, blocks int) kvcache.Config {
	return kvcache.Config{
		Stage: 0, Stages: 1,
		Layers:         gqaLayers(0, 2, 50, 0),
		TokensPerBlock: tpb,
		DeviceBytes:    int64(blocks * tpb * 100),
		MaxBatchSize:   8,
		MaxNumTokens:   tpb,
		MaxSeqLen:      tpb * blocks / 2,
		MaxDraftTokens: 2,
	}
}

func configured(t testing.TB, cfg kvcache.Config) *Manager {
	t.Helper()
	m := New()
	if _, err := m.Configure(bg, cfg); err != nil {
		t.Fatalf("Configure: %v", err)
	}
	return m
}

func reserve(t testing.TB, m *Manager, items ...kvcache.ReserveItem) []kvcache.Grant {
	t.Helper()
	g, err := m.Reserve(bg, items)
	if err != nil {
		t.Fatalf("Reserve(%+v) error: %v", items, err)
	}
	if len(g) != len(items) {
		t.Fatalf("Reserve returned %d grants for %d items", len(g), len(items))
	}
	return g
}

func mustGrant(t testing.TB, m *Manager, it kvcache.ReserveItem) kvcache.Grant {
	t.Helper()
	g := reserve(t, m, it)[0]
	if !g.OK {
		t.Fatalf("Reserve(%+v) denied: %s", it, g.Reason)
	}
	return g
}

func commit(t testing.TB, m *Manager, seq kvcache.SeqID, accepted int) {
	t.Helper()
	if _, err := m.Commit(bg, []kvcache.CommitItem{{Seq: seq, Accepted: accepted}}); err != nil {
		t.Fatalf("Commit(seq %d, %d): %v", seq, accepted, err)
	}
}

func inspect(t testing.TB, m *Manager) kvcache.Snapshot {
	t.Helper()
	s, err := m.Inspect(bg, kvcache.InspectOptions{Tables: true})
	if err != nil {
		t.Fatalf("Inspect: %v", err)
	}
	return s
}

func seqState(t testing.TB, m *Manager, seq kvcache.SeqID) kvcache.SeqState {
	t.Helper()
	for _, s := range inspect(t, m).Seqs {
		if s.Seq == seq {
			return s
		}
	}
	t.Fatalf("seq %d not found by Inspect", seq)
	return kvcache.SeqState{}
}

func noViolations(t testing.TB, m *Manager) {
	t.Helper()
	if v := inspect(t, m).Violations; len(v) > 0 {
		t.Fatalf("violations: %v", v)
	}
}

func sameSnapshot(t testing.TB, what string, before, after kvcache.Snapshot) {
	t.Helper()
	if !reflect.DeepEqual(before, after) {
		t.Fatalf("%s changed the state:\nbefore %+v\nafter  %+v", what, before, after)
	}
}

// prompt returns n tokens: the blocks of prefix (a list of block labels,
// each expanded to tpb tokens), then a distinct tail.
func prompt(tpb int, labels []int32, tail int, salt int32) []int32 {
	p := make([]int32, 0, len(labels)*tpb+tail)
	for _, l := range labels {
		for i := 0; i < tpb; i++ {
			p = append(p, l*1000+int32(i))
		}
	}
	for i := 0; i < tail; i++ {
		p = append(p, -(salt*1000 + int32(i) + 1))
	}
	return p
}
