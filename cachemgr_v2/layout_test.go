package cachemgrv2

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
	"github.com/kvx-dev/kvx/plugins/v1/spec"
)

func baseCfg(layers []spec.Layer) kvcache.Config {
	return kvcache.Config{
		Stage: 1, Stages: 2, Layers: layers, TokensPerBlock: 64,
		DeviceBytes: 8 << 30, MaxBatchSize: 16, MaxNumTokens: 8192, MaxSeqLen: 262144, MaxDraftTokens: 1,
	}
}

func TestConfigureGroupsDSAWithMTP(t *testing.T) {
	layers := dsaStage(31, 30, true)                                 // last stage: 30 DSA layers + the MTP layer
	layers = append(layers, spec.Layer{Index: 62, FFN: spec.FFNMoE}) // no cache: ignored
	cfg := baseCfg(layers)
	cfg.HostBytes = 4 << 30
	_, lay := configure(t, cfg)
	if len(lay.Pools) != 2 {
		t.Fatalf("Pools = %+v, want one device and one host pool", lay.Pools)
	}
	dev, host := lay.Pools[0], lay.Pools[1]
	wantBytes := int64(31*(latentBytes+indexBytes)) * 64
	if dev.ID != 0 || dev.Tier != kvcache.TierDevice || dev.Name != "full" || dev.BlockBytes != wantBytes {
		t.Errorf("device pool = %+v, want id 0, device, full, %d bytes per block", dev, wantBytes)
	}
	if !slices.Contains(dev.Layers, 61) || len(dev.Layers) != 31 {
		t.Errorf("device pool layers = %v, want 31 layers including the MTP layer 61", dev.Layers)
	}
	if host.ID != 1 || host.Tier != kvcache.TierHost || host.BlockBytes != wantBytes || host.Blocks != int((4<<30)/wantBytes) {
		t.Errorf("host pool = %+v, want id 1, host, %d blocks", host, (4<<30)/wantBytes)
	}
	if want := int((8 << 30) / wantBytes); dev.Blocks != want {
		t.Errorf("device blocks = %d, want %d", dev.Blocks, want)
	}
	if lay.MaxSeqTokens != 262145 {
		t.Errorf("MaxSeqTokens = %d, want max_seq_len + draft = 262145", lay.MaxSeqTokens)
	}
}

func TestConfigureWindowGroups(t *testing.T) {
	layers := []spec.Layer{gqaLayer(0, 4096), gqaLayer(1, 0), gqaLayer(2, 4096), gqaLayer(3, 0), gqaLayer(4, 0)}
	cfg := baseCfg(layers)
	cfg.MaxSeqLen = 32768
	_, lay := configure(t, cfg)
	if len(lay.Pools) != 2 {
		t.Fatalf("Pools = %+v, want full and window-4096", lay.Pools)
	}
	full, win := lay.Pools[0], lay.Pools[1]
	if full.Name != "full" || !slices.Equal(full.Layers, []int{1, 3, 4}) || full.BlockBytes != 3*gqaBytes*64 {
		t.Errorf("full pool = %+v", full)
	}
	if win.Name != "window-4096" || win.Window != 4096 || !slices.Equal(win.Layers, []int{0, 2}) || win.BlockBytes != 2*gqaBytes*64 {
		t.Errorf("window pool = %+v", win)
	}
	// Every life cycle keeps ceil(capacity/tpb) blocks, so the typical step
	// gives both groups the same number of blocks.
	if full.Blocks != win.Blocks {
		t.Errorf("blocks full %d, window %d: want equal", full.Blocks, win.Blocks)
	}
	if used := int64(full.Blocks)*full.BlockBytes + int64(win.Blocks)*win.BlockBytes; used > cfg.DeviceBytes {
		t.Errorf("layout uses %d bytes > device_bytes %d", used, cfg.DeviceBytes)
	}
}

func TestConfigureRefusesMamba(t *testing.T) {
	layers := []spec.Layer{mambaLayer(0), gqaLayer(1, 0), mambaLayer(2), {Index: 3, FFN: spec.FFNMoE}}
	_, err := New().Configure(ctx, baseCfg(layers))
	if !errors.Is(err, kvcache.ErrInvalidConfig) {
		t.Fatalf("Configure(hybrid) = %v, want ErrInvalidConfig", err)
	}
	if want := "hybrid model (2 mamba layers): use cache_manager: mamba"; !strings.Contains(err.Error(), want) {
		t.Errorf("Configure(hybrid) = %q, want it to contain %q", err, want)
	}
	info, _ := New().Info(ctx)
	if info.Capabilities.SSMState || slices.Contains(info.Capabilities.Mixers, spec.MixerMamba) {
		t.Errorf("Info capabilities = %+v, want no SSM state and no mamba mixer", info.Capabilities)
	}
}

// TestConfigureProof: the layout must hold one max_seq_len+draft request end
// to end and one max_num_tokens chunk; the exact minimum passes, one byte less
// fails with the numbers and the fix.
func TestConfigureProof(t *testing.T) {
	layers := dsaStage(0, 2, true)
	bb := stageBlockBytes(layers, 64)
	for _, tc := range []struct {
		name              string
		seqLen, numTokens int
		wantBlocks        int
		wantFix           string
	}{
		{"seq bound", 146000, 8192, (146000 + 1 + 63) / 64, "lower max_seq_len to at most 145983"},
		{"chunk bound", 1000, 16384, 16384 / 64, "lower max_num_tokens to at most 16320"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := baseCfg(layers)
			cfg.MaxSeqLen, cfg.MaxNumTokens = tc.seqLen, tc.numTokens
			cfg.DeviceBytes = int64(tc.wantBlocks) * bb
			_, lay := configure(t, cfg)
			if lay.Pools[0].Blocks != tc.wantBlocks {
				t.Errorf("blocks = %d, want %d", lay.Pools[0].Blocks, tc.wantBlocks)
			}
			if want := min(tc.wantBlocks*64, tc.seqLen+1); lay.MaxSeqTokens != want {
				t.Errorf("MaxSeqTokens = %d, want %d", lay.MaxSeqTokens, want)
			}
			cfg.DeviceBytes--
			_, err := New().Configure(ctx, cfg)
			if !errors.Is(err, kvcache.ErrInvalidConfig) {
				t.Fatalf("Configure(one byte short) = %v, want ErrInvalidConfig", err)
			}
			for _, want := range []string{"max_seq_len", "max_num_tokens", "free_gpu_memory_fraction", "raise", tc.wantFix} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not mention %q", err, want)
				}
			}
		})
	}
}

// TestConfigureHintsOnlyChangeSpeed: whatever avg_seq_len and pool_ratio say,
// every group holds one full request, the guarantee is the same and the
// budget is respected.
func TestConfigureHintsOnlyChangeSpeed(t *testing.T) {
	layers := []spec.Layer{gqaLayer(0, 0), gqaLayer(1, 512), dsaLayer(2, false), gqaLayer(3, 512)}
	base := baseCfg(layers)
	base.MaxSeqLen, base.TokensPerBlock = 20000, 32
	floor := kvcache.BlocksFor(20001, 32)
	var bytesPerAll int64
	for _, l := range layers {
		bytesPerAll += l.Buffers[0].BytesPerToken * 32
		if len(l.Buffers) > 1 {
			bytesPerAll += l.Buffers[1].BytesPerToken * 32
		}
	}
	base.DeviceBytes = int64(floor)*bytesPerAll + 12345
	for _, avg := range []int{0, 1, 32, 20000} {
		for _, ratio := range [][]float64{nil, {0.5, 0.5}, {0.99, 0.01}, {0.01, 0.99}} {
			cfg := base
			cfg.AvgSeqLen, cfg.PoolRatio = avg, ratio
			_, lay := configure(t, cfg)
			var used int64
			for _, p := range lay.Pools {
				if p.Blocks < floor {
					t.Errorf("avg %d ratio %v: pool %s has %d blocks < %d for one request", avg, ratio, p.Name, p.Blocks, floor)
				}
				used += int64(p.Blocks) * p.BlockBytes
			}
			if used > cfg.DeviceBytes {
				t.Errorf("avg %d ratio %v: uses %d > %d bytes", avg, ratio, used, cfg.DeviceBytes)
			}
			if lay.MaxSeqTokens != 20001 {
				t.Errorf("avg %d ratio %v: MaxSeqTokens %d, want 20001", avg, ratio, lay.MaxSeqTokens)
			}
		}
	}
}

func TestConfigureRatioSplitsBytes(t *testing.T) {
	layers := []spec.Layer{gqaLayer(0, 0), gqaLayer(1, 1024)}
	cfg := baseCfg(layers)
	cfg.MaxSeqLen, cfg.MaxNumTokens = 1024, 1024
	cfg.DeviceBytes = 1000 * gqaBytes * 64
	cfg.PoolRatio = []float64{0.75, 0.25}
	_, lay := configure(t, cfg)
	if lay.Pools[0].Blocks != 750 || lay.Pools[1].Blocks != 250 {
		t.Errorf("blocks = %d, %d, want 750, 250", lay.Pools[0].Blocks, lay.Pools[1].Blocks)
	}
}

func TestConfigureInvalid(t *testing.T) {
	ok := baseCfg(dsaStage(0, 2, false))
	for _, tc := range []struct {
		name string
		mod  func(*kvcache.Config)
		want string
	}{
		{"tpb", func(c *kvcache.Config) { c.TokensPerBlock = 0 }, "tokens_per_block = 0"},
		{"device", func(c *kvcache.Config) { c.DeviceBytes = 0 }, "device_bytes = 0"},
		{"host", func(c *kvcache.Config) { c.HostBytes = -1 }, "host_bytes = -1"},
		{"batch", func(c *kvcache.Config) { c.MaxBatchSize = 0 }, "max_batch_size = 0"},
		{"numtokens", func(c *kvcache.Config) { c.MaxNumTokens = -5 }, "max_num_tokens = -5"},
		{"seqlen", func(c *kvcache.Config) { c.MaxSeqLen = 0 }, "max_seq_len = 0"},
		{"draft", func(c *kvcache.Config) { c.MaxDraftTokens = -1 }, "max_draft_tokens = -1"},
		{"avg", func(c *kvcache.Config) { c.AvgSeqLen = c.MaxSeqLen + 1 }, "avg_seq_len = 262145"},
		{"ratio len", func(c *kvcache.Config) { c.PoolRatio = []float64{0.5, 0.5} }, "pool_ratio has 2 entries, want 1"},
		{"ratio value", func(c *kvcache.Config) { c.PoolRatio = []float64{0} }, "pool_ratio[0] (full) = 0"},
		{"no layers", func(c *kvcache.Config) { c.Layers = nil }, "stage 1 has no layer"},
		{"buffer", func(c *kvcache.Config) {
			c.Layers = []spec.Layer{{Index: 0, Buffers: []spec.Buffer{{Role: spec.RoleKV, BytesPerToken: 4, BytesPerSeq: 4}}}}
		}, "layer 0 buffer kv"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := ok
			tc.mod(&cfg)
			_, err := New().Configure(ctx, cfg)
			if !errors.Is(err, kvcache.ErrInvalidConfig) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Configure = %v, want ErrInvalidConfig containing %q", err, tc.want)
			}
		})
	}
}

func TestCallsBeforeConfigure(t *testing.T) {
	m := New()
	if _, err := m.Reserve(ctx, nil); !errors.Is(err, kvcache.ErrInvalidArg) {
		t.Errorf("Reserve before Configure = %v, want ErrInvalidArg", err)
	}
	if _, err := m.Inspect(ctx, kvcache.InspectOptions{}); !errors.Is(err, kvcache.ErrInvalidArg) {
		t.Errorf("Inspect before Configure = %v, want ErrInvalidArg", err)
	}
}
