package mamba

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
)

func explain(t *testing.T, m *Manager, p []int32) kvcache.Explanation {
	t.Helper()
	items := []kvcache.LookupItem{{Seq: 1, Prompt: p}}
	ex, err := m.Explain(context.Background(), items)
	if err != nil {
		t.Fatalf("Explain: %v", err)
	}
	if n := lookup(t, m, p); ex[0].Tokens != n {
		t.Fatalf("Explain Tokens %d, Lookup %d", ex[0].Tokens, n)
	}
	return ex[0]
}

// TestExplainSnapshotBoundary: with snapshots every two blocks, a prompt
// whose three blocks are cached is reusable only up to the snapshot at two
// blocks: the miss is the snapshot boundary, not the cache.
func TestExplainSnapshotBoundary(t *testing.T) {
	const tpb = 16
	cfg := testConfig(tpb, 64, 4+8)
	cfg.Snapshots.Interval = 2 * tpb
	m, _ := configured(t, cfg)
	p := tokens(3*tpb+1, 1)
	prefill(t, m, 1, p, 4*tpb)
	release(t, m, 1)
	mustClean(t, m, "after prefill")
	for _, tc := range []struct {
		what   string
		prompt []int32
		want   kvcache.Explanation
	}{
		{"three blocks cached, snapshot at two", p, kvcache.Explanation{Tokens: 2 * tpb, Miss: kvcache.MissSnapshot}},
		{"two blocks and a token", p[:2*tpb+1], kvcache.Explanation{Tokens: 2 * tpb, Miss: kvcache.MissPartialBlock}},
		{"one block cached, no snapshot at it", append(slices.Clone(p[:tpb]), tokens(2*tpb, 2)...), kvcache.Explanation{Miss: kvcache.MissSnapshot}},
		{"never stored", tokens(3*tpb+1, 3), kvcache.Explanation{Miss: kvcache.MissNeverStored}},
	} {
		if got := explain(t, m, tc.prompt); got != tc.want {
			t.Errorf("%s: Explain = %+v, want %+v", tc.what, got, tc.want)
		}
	}
}

func TestExplainRetentionPolicyInfo(t *testing.T) {
	ctx := context.Background()
	info, err := New().Info(ctx)
	if err != nil || !info.Capabilities.Explain || !info.Capabilities.Retention ||
		!slices.Equal(info.Capabilities.EvictionPolicies, []string{"lru", "lfu"}) {
		t.Fatalf("Info = %+v, %v: want Explain, Retention and policies lru, lfu", info.Capabilities, err)
	}
	cfg := testConfig(16, 64, 4+8)
	cfg.EvictionPolicy = "fifo"
	if _, err := New().Configure(ctx, cfg); !errors.Is(err, kvcache.ErrInvalidConfig) || !strings.Contains(err.Error(), `"fifo"`) {
		t.Fatalf("Configure(eviction_policy fifo) = %v, want ErrInvalidConfig naming it", err)
	}
	cfg.EvictionPolicy = "lfu"
	m, _ := configured(t, cfg)
	g := reserve(t, m, kvcache.ReserveItem{Seq: 1, New: true, Tokens: 1, Prompt: tokens(1, 1), Priority: 0x7f})
	if g[0].OK || !strings.HasPrefix(g[0].Reason, "invalid: seq 1: priority 127 outside 1..100") {
		t.Fatalf("Reserve(priority 127) = %+v, want denied as invalid", g[0])
	}
	cfg.EnableBlockReuse = false
	m, _ = configured(t, cfg)
	if got := explain(t, m, tokens(40, 1)); got != (kvcache.Explanation{Miss: kvcache.MissReuseOff}) {
		t.Fatalf("reuse off: Explain = %+v", got)
	}
}

// TestSnapshotRetentionPriority: with room for two snapshots, a third
// evicts the cold snapshot of the lowest node priority, not the least
// recently used one; the prompt whose snapshot went then misses at the
// snapshot boundary.
func TestSnapshotRetentionPriority(t *testing.T) {
	const tpb = 16
	m, _ := configured(t, testConfig(tpb, 64, 4+2))
	run := func(id kvcache.SeqID, p []int32, prio int) {
		t.Helper()
		if g := reserve(t, m, kvcache.ReserveItem{Seq: id, New: true, Tokens: len(p), Prompt: p, Priority: prio}); !g[0].OK {
			t.Fatalf("seq %d: %s", id, g[0].Reason)
		}
		commit(t, m, kvcache.CommitItem{Seq: id, Accepted: len(p)})
		release(t, m, id)
	}
	a, b, c := tokens(tpb+1, 1), tokens(tpb+1, 2), tokens(tpb+1, 3)
	run(1, a, 80)
	run(2, b, 0)
	run(3, c, 0)
	mustClean(t, m, "after three prompts")
	if m.life.stats.Evicted != 1 {
		t.Fatalf("snapshots evicted %d, want 1", m.life.stats.Evicted)
	}
	for _, tc := range []struct {
		p    []int32
		want kvcache.Explanation
	}{
		{a, kvcache.Explanation{Tokens: tpb, Miss: kvcache.MissPartialBlock}},
		{b, kvcache.Explanation{Miss: kvcache.MissSnapshot}},
		{c, kvcache.Explanation{Tokens: tpb, Miss: kvcache.MissPartialBlock}},
	} {
		if got := explain(t, m, tc.p); got != tc.want {
			t.Errorf("prompt %d: Explain = %+v, want %+v", tc.p[0], got, tc.want)
		}
	}
}
