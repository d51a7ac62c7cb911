package main

import (
	"context"
	"reflect"
	"strings"
	"testing"

	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
	"github.com/kvx-dev/kvx/plugins/v1/spec"
)

// tpb is the block size of these tests: a 9-token prompt has two full
// blocks that can be cached and one more block for its last token.
const tpb = 4

// configured returns a manager with a pool of blocks blocks and block
// reuse on.
func configured(t *testing.T, blocks, maxSeqLen int) *Manager {
	t.Helper()
	const bytesPerToken = 10
	m := New()
	_, err := m.Configure(context.Background(), kvcache.Config{
		Stages: 1,
		Layers: []spec.Layer{{Index: 0, Mixer: spec.MixerGQA,
			Buffers: []spec.Buffer{{Role: spec.RoleKV, BytesPerToken: bytesPerToken}}}},
		TokensPerBlock:   tpb,
		DeviceBytes:      int64(blocks * tpb * bytesPerToken),
		MaxBatchSize:     4,
		MaxNumTokens:     maxSeqLen,
		MaxSeqLen:        maxSeqLen,
		EnableBlockReuse: true,
	})
	if err != nil {
		t.Fatalf("Configure: %v", err)
	}
	return m
}

func prompt(salt int32) []int32 {
	p := make([]int32, 9)
	for i := range p {
		p[i] = salt*100 + int32(i)
	}
	return p
}

func (m *Manager) mustReserve(t *testing.T, it kvcache.ReserveItem) {
	t.Helper()
	gs, err := m.Reserve(context.Background(), []kvcache.ReserveItem{it})
	if err != nil || !gs[0].OK {
		t.Fatalf("Reserve(%+v) = %+v, %v; want a grant", it, gs, err)
	}
}

// serve runs a request's prompt through the cache (reusing what Lookup
// finds) and releases it.
func (m *Manager) serve(t *testing.T, id kvcache.SeqID, p []int32) {
	t.Helper()
	ctx := context.Background()
	reuse := m.lookup(t, p)
	m.mustReserve(t, kvcache.ReserveItem{Seq: id, New: true, Prompt: p, Reuse: reuse, Tokens: len(p) - reuse})
	if _, err := m.Commit(ctx, []kvcache.CommitItem{{Seq: id, Accepted: len(p) - reuse}}); err != nil {
		t.Fatalf("Commit(%d): %v", id, err)
	}
	if err := m.Release(ctx, []kvcache.SeqID{id}); err != nil {
		t.Fatalf("Release(%d): %v", id, err)
	}
}

func (m *Manager) lookup(t *testing.T, p []int32) int {
	t.Helper()
	n, err := m.Lookup(context.Background(), []kvcache.LookupItem{{Seq: 999, Prompt: p}})
	if err != nil {
		t.Fatalf("Lookup: %v", err)
	}
	return n[0]
}

func (m *Manager) pool(t *testing.T) kvcache.PoolStats {
	t.Helper()
	st, err := m.Stats(context.Background())
	if err != nil {
		t.Fatalf("Stats: %v", err)
	}
	return st.Pools[0]
}

// TestEvictsFirstIn: the prompt cached first is evicted first, even when it
// was reused last (an LRU cache would evict b instead).
func TestEvictsFirstIn(t *testing.T) {
	m := configured(t, 12, 32)
	a, b, c := prompt(1), prompt(2), prompt(3)
	m.serve(t, 1, a)
	m.serve(t, 2, b)
	m.serve(t, 3, c)
	m.serve(t, 4, a) // a hit: a is now the most recently used
	if got := m.lookup(t, a); got != 8 {
		t.Fatalf("Lookup(a) = %d after serving it twice, want 8", got)
	}
	if got, want := m.pool(t), (kvcache.PoolStats{Total: 12, Free: 6, Cached: 6}); got != want {
		t.Fatalf("pool %+v, want %+v", got, want)
	}

	// 8 blocks: the 6 free ones and the 2 oldest cached ones, a's.
	m.mustReserve(t, kvcache.ReserveItem{Seq: 5, New: true, Tokens: 32})
	for _, tc := range []struct {
		name string
		p    []int32
		want int
	}{{"a", a, 0}, {"b", b, 8}, {"c", c, 8}} {
		if got := m.lookup(t, tc.p); got != tc.want {
			t.Errorf("after evicting two blocks: Lookup(%s) = %d, want %d", tc.name, got, tc.want)
		}
	}
	st, _ := m.Stats(context.Background())
	if st.Evictions != 2 || st.ReusedTokens != 8 {
		t.Errorf("Stats: Evictions %d, ReusedTokens %d; want 2 and 8", st.Evictions, st.ReusedTokens)
	}
}

// TestDenialKeepsReusedBlocks: a reservation that reuses cached blocks and
// does not fit is denied without evicting the blocks it meant to reuse, and
// leaves the manager as it was.
func TestDenialKeepsReusedBlocks(t *testing.T) {
	ctx := context.Background()
	m := configured(t, 12, 40)
	a := prompt(1)
	m.serve(t, 1, a)
	m.mustReserve(t, kvcache.ReserveItem{Seq: 2, New: true, Tokens: 36}) // 9 of the 10 free blocks
	before, _ := m.Inspect(ctx, kvcache.InspectOptions{Tables: true})

	// a's 2 blocks plus 3 more for Hold 20; 1 block is free and nothing
	// else is cached.
	gs, err := m.Reserve(ctx, []kvcache.ReserveItem{{Seq: 3, New: true, Prompt: a, Reuse: 8, Tokens: 1, Hold: 20}})
	if err != nil || gs[0].OK || !strings.Contains(gs[0].Reason, "3 more blocks") {
		t.Fatalf("Reserve = %+v, %v; want a denial for 3 more blocks", gs, err)
	}
	after, _ := m.Inspect(ctx, kvcache.InspectOptions{Tables: true})
	if !reflect.DeepEqual(before, after) {
		t.Errorf("a denial changed the manager:\nbefore %+v\nafter  %+v", before, after)
	}
	if got := m.lookup(t, a); got != 8 {
		t.Errorf("Lookup(a) = %d after the denial, want 8", got)
	}
}

// TestSamePrefixTwice: two requests that compute the same prompt at once
// cache it once; the second one's blocks are freed on release.
func TestSamePrefixTwice(t *testing.T) {
	ctx := context.Background()
	m := configured(t, 12, 32)
	a := prompt(1)
	for _, id := range []kvcache.SeqID{1, 2} {
		m.mustReserve(t, kvcache.ReserveItem{Seq: id, New: true, Prompt: a, Tokens: len(a)})
	}
	if _, err := m.Commit(ctx, []kvcache.CommitItem{{Seq: 1, Accepted: len(a)}, {Seq: 2, Accepted: len(a)}}); err != nil {
		t.Fatal(err)
	}
	if err := m.Release(ctx, []kvcache.SeqID{1, 2}); err != nil {
		t.Fatal(err)
	}
	if got, want := m.pool(t), (kvcache.PoolStats{Total: 12, Free: 10, Cached: 2}); got != want {
		t.Errorf("pool %+v, want %+v: one copy of the prompt's two full blocks", got, want)
	}
	if got := m.lookup(t, a); got != 8 {
		t.Errorf("Lookup(a) = %d, want 8", got)
	}
}

// TestConfigureRefusesState: fifo says it manages no SSM state, and a stage
// with a Mamba layer is a configuration error that names the layer.
func TestConfigureRefusesState(t *testing.T) {
	info, _ := New().Info(context.Background())
	if info.Capabilities.SSMState || info.Capabilities.HostTier {
		t.Fatalf("Capabilities %+v: fifo has no SSM state and no host tier", info.Capabilities)
	}
	_, err := New().Configure(context.Background(), kvcache.Config{
		Stages: 1, TokensPerBlock: tpb, DeviceBytes: 1 << 20, MaxBatchSize: 1, MaxNumTokens: 16, MaxSeqLen: 16,
		Layers: []spec.Layer{
			{Index: 0, Mixer: spec.MixerGQA, Buffers: []spec.Buffer{{Role: spec.RoleKV, BytesPerToken: 10}}},
			{Index: 1, Mixer: spec.MixerMamba, Buffers: []spec.Buffer{{Role: spec.RoleSSMState, BytesPerSeq: 100}}},
		},
	})
	if kvcache.KindOf(err) != kvcache.KindInvalidConfig || !strings.Contains(err.Error(), "layer 1 (mamba)") {
		t.Errorf("Configure with a mamba layer: %v, want an invalid-config error naming layer 1 (mamba)", err)
	}
}
