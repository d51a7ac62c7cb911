package mamba

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/kvx-dev/kvx/plugins/model"
	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
)

// TestConfigureRefuses: a budget that cannot hold one max_seq_len request
// with its states, or the live states, fails with ErrInvalidConfig naming
// the numbers and the fix.
func TestConfigureRefuses(t *testing.T) {
	const tpb = 16
	base := testConfig(tpb, 256, 4+8)
	state := int64(2 * (convBytes + ssmBytes))
	block := int64(2 * kvPerToken * tpb)
	for _, tc := range []struct {
		name  string
		edit  func(c *kvcache.Config)
		wants []string
	}{
		{"request", func(c *kvcache.Config) { c.MaxSeqLen = 1000 * tpb; c.PoolRatio = nil },
			[]string{"max_seq_len 16000", "1000 blocks", "lower max_seq_len to at most"}},
		{"live states", func(c *kvcache.Config) { c.DeviceBytes = 32*block + 3*state; c.PoolRatio = nil },
			[]string{"4 live SSM states (max_batch_size 4 × pipeline_parallel_size 1)", "lower max_batch_size to at most 2"}},
		{"chunk", func(c *kvcache.Config) { c.MaxNumTokens = 400 * tpb; c.PoolRatio = nil },
			[]string{"max_num_tokens 6400", "lower max_num_tokens"}},
		{"pool_ratio", func(c *kvcache.Config) { c.PoolRatio = []float64{1} }, []string{"pool_ratio has 1 entries, want 2 (one per pool: full, ssm)"}},
		{"avg_seq_len", func(c *kvcache.Config) { c.AvgSeqLen = c.MaxSeqLen + 1 }, []string{"avg_seq_len = 513"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := base
			tc.edit(&cfg)
			_, err := New().Configure(context.Background(), cfg)
			if !errors.Is(err, kvcache.ErrInvalidConfig) {
				t.Fatalf("Configure = %v, want ErrInvalidConfig", err)
			}
			for _, w := range tc.wants {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
			}
		})
	}
}

// ultraStage is the seed-B stage: Nemotron-3-Ultra at TP 4 with fp8 KV and
// float16 SSM state, 80 GB of cache per rank.
func ultraStage(t *testing.T) kvcache.Config {
	m, err := model.Load("nemotron-3-ultra-550b-a55b")
	if err != nil {
		t.Fatal(err)
	}
	m.Layers = m.Layers[:len(m.Layers)-m.NumNextN]
	if err := model.FillBuffers(&m, model.Dtypes{KV: "fp8", SSM: "float16"}, 4); err != nil {
		t.Fatal(err)
	}
	return kvcache.Config{
		Stages: 1, Layers: m.Layers, TokensPerBlock: 64, DeviceBytes: 80e9,
		MaxBatchSize: 8, MaxNumTokens: 16384, MaxSeqLen: 1 << 20, EnableBlockReuse: true,
		Snapshots: kvcache.SnapshotConfig{Interval: 256, OffsetsFromEnd: []int{0}},
	}
}

// TestSplitFromLimits: without avg_seq_len the seed-B stage's split comes
// from the limits and leaves the snapshot pool hundreds of slots, not the
// live floor plus a few (the upstream max_seq_len / 2 fallback); every
// split, whatever the hints, holds one max_seq_len request and the live
// states.
func TestSplitFromLimits(t *testing.T) {
	for _, avg := range []int{0, 1, 9000, 1 << 19, 1 << 20} {
		for _, ratio := range [][]float64{nil, {0.5, 0.5}, {0.999999, 0.000001}} {
			cfg := ultraStage(t)
			cfg.AvgSeqLen, cfg.PoolRatio = avg, ratio
			m, lay := configured(t, cfg)
			if lay.MaxSeqTokens != cfg.MaxSeqLen || lay.MaxSequences != 8 {
				t.Fatalf("avg %d ratio %v: MaxSeqTokens %d, MaxSequences %d", avg, ratio, lay.MaxSeqTokens, lay.MaxSequences)
			}
			if m.life.snapCap < 1 {
				t.Fatalf("avg %d ratio %v: %d snapshot slots", avg, ratio, m.life.snapCap)
			}
			if ratio == nil && m.life.snapCap < 500 {
				t.Errorf("avg %d: %d snapshot slots (pools %+v): the split starves the snapshot pool", avg, m.life.snapCap, lay.Pools)
			}
		}
	}
}

// TestNeverFitsIsDenied: a reservation beyond max_seq_len is denied with its
// numbers, and a new sequence beyond the live slots waits (a denial).
func TestNeverFitsIsDenied(t *testing.T) {
	const tpb = 16
	m, _ := configured(t, testConfig(tpb, 256, 4+8))
	g := reserve(t, m, kvcache.ReserveItem{Seq: 1, New: true, Tokens: 32, Hold: 32*tpb + 1})
	if g[0].OK || !strings.Contains(g[0].Reason, "hold 513 > max_seq_len 512") {
		t.Fatalf("grant %+v, want a denial naming hold 513 and max_seq_len 512", g[0])
	}
	for i := range 4 {
		if g := reserve(t, m, kvcache.ReserveItem{Seq: kvcache.SeqID(10 + i), New: true, Tokens: tpb}); !g[0].OK {
			t.Fatal(g[0].Reason)
		}
	}
	g = reserve(t, m, kvcache.ReserveItem{Seq: 20, New: true, Tokens: tpb})
	if g[0].OK || !strings.Contains(g[0].Reason, "all 4 live state slots") {
		t.Fatalf("grant %+v, want a denial for the live state slots", g[0])
	}
	mustClean(t, m, "after the denials")
}

// TestHostSplitFollowsDevice: host_bytes splits as the device pools did,
// the ssm pool's snapshot slots included (host-ssm holds offloaded snapshots
// beside suspended live states), and without snapshots host-ssm follows the
// live states alone.
func TestHostSplitFollowsDevice(t *testing.T) {
	const tpb = 16
	for _, snaps := range []bool{true, false} {
		cfg := testConfig(tpb, 64, 4+12)
		cfg.HostBytes = cfg.DeviceBytes
		if !snaps {
			cfg.Snapshots = kvcache.SnapshotConfig{}
		}
		_, lay := configured(t, cfg)
		byName := map[string]kvcache.Pool{}
		for _, p := range lay.Pools {
			byName[p.Name] = p
		}
		full, ssm := byName["full"], byName["ssm"]
		ssmBytes := int64(ssm.Blocks) * ssm.BlockBytes
		if !snaps {
			ssmBytes = int64(lay.MaxSequences) * ssm.BlockBytes
		}
		total := int64(full.Blocks)*full.BlockBytes + ssmBytes
		wantFull := int(float64(cfg.HostBytes) * float64(int64(full.Blocks)*full.BlockBytes) / float64(total) / float64(full.BlockBytes))
		wantSSM := int(float64(cfg.HostBytes) * float64(ssmBytes) / float64(total) / float64(ssm.BlockBytes))
		if got := byName["host-full"].Blocks; got != wantFull {
			t.Errorf("snapshots %v: host-full has %d blocks, want %d", snaps, got, wantFull)
		}
		if got := byName["host-ssm"].Blocks; got != wantSSM || snaps && got <= lay.MaxSequences {
			t.Errorf("snapshots %v: host-ssm has %d slots, want %d (more than the %d live states with snapshots)", snaps, got, wantSSM, lay.MaxSequences)
		}
	}
}
