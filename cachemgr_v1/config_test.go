package cachemgrv1

import (
	"context"
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
	"github.com/kvx-dev/kvx/plugins/v1/spec"
)

// dsaStage is the last stage of a DeepSeek-V3.2-like model at PP 2: n DSA
// layers plus the MTP layer, each with a latent and an indexer key buffer.
func dsaStage(n int, deviceBytes int64) kvcache.Config {
	var ls []spec.Layer
	for i := 0; i <= n; i++ {
		ls = append(ls, spec.Layer{Index: 31 + i, Mixer: spec.MixerDSA, MTP: i == n,
			Buffers: []spec.Buffer{
				{Role: spec.RoleLatent, BytesPerToken: 656},
				{Role: spec.RoleIndexKey, BytesPerToken: 132},
			}})
	}
	return kvcache.Config{
		Stage: 1, Stages: 2, Layers: ls, TokensPerBlock: 64,
		DeviceBytes: deviceBytes, MaxBatchSize: 16, MaxNumTokens: 8192,
		MaxSeqLen: 262144, MaxDraftTokens: 1,
	}
}

func hybridStage() kvcache.Config {
	ls := gqaLayers(0, 2, 512, 0)
	for i := 2; i < 6; i++ {
		ls = append(ls, spec.Layer{Index: i, Mixer: spec.MixerMamba, Buffers: []spec.Buffer{
			{Role: spec.RoleConvState, BytesPerSeq: 1000},
			{Role: spec.RoleSSMState, BytesPerSeq: 9000},
		}})
	}
	return kvcache.Config{
		Stage: 0, Stages: 2, Layers: ls, TokensPerBlock: 64,
		DeviceBytes: 1 << 30, MaxBatchSize: 8, MaxNumTokens: 4096,
		MaxSeqLen: 65536, EnableBlockReuse: true,
	}
}

func TestConfigureLayout(t *testing.T) {
	const gib = int64(1) << 30
	swa := kvcache.Config{
		Stages: 1, TokensPerBlock: 32, DeviceBytes: 64 << 20,
		Layers:       append(append(gqaLayers(0, 2, 1024, 0), gqaLayers(2, 2, 1024, 4096)...), gqaLayers(4, 1, 2048, 1<<20)...),
		MaxBatchSize: 4, MaxNumTokens: 2048, MaxSeqLen: 8192,
	}
	hy := hybridStage()
	// ssm slots: 8 × 2 stages of 4 × 10,000 bytes; the rest over 1,024 B/token.
	hyBlocks := int((hy.DeviceBytes - 16*40000) / (64 * 1024))
	tests := []struct {
		name      string
		cfg       kvcache.Config
		pools     []kvcache.Pool
		maxSeq    int
		maxSeqs   int
		warnWords []string
	}{{
		name: "dsa last stage with mtp",
		cfg:  dsaStage(30, 60*gib),
		pools: []kvcache.Pool{{ID: 0, Name: "full", Tier: kvcache.TierDevice,
			Layers:         seqInts(31, 62),
			TokensPerBlock: 64, BlockBytes: 64 * 31 * 788, Blocks: int(60 * gib / (64 * 31 * 788))}},
		maxSeq: min(int(60*gib/(64*31*788))*64, 262144+1), // capped at max_seq_len + draft
	}, {
		name: "sliding window pools, huge window merged into full",
		cfg:  swa,
		pools: []kvcache.Pool{
			{ID: 0, Name: "full", Tier: kvcache.TierDevice, Layers: []int{0, 1, 4}, TokensPerBlock: 32, BlockBytes: 32 * 4096, Blocks: (64 << 20) / (32 * 6144)},
			{ID: 1, Name: "window-4096", Tier: kvcache.TierDevice, Window: 4096, Layers: []int{2, 3}, TokensPerBlock: 32, BlockBytes: 32 * 2048, Blocks: (64 << 20) / (32 * 6144)},
		},
		maxSeq:    min((64<<20)/(32*6144)*32, 8192), // capped at max_seq_len
		warnWords: []string{"window 1,048,576", "full-attention pool"},
	}, {
		name: "hybrid mamba: ssm slots carved out first, reuse off",
		cfg:  hy,
		pools: []kvcache.Pool{
			{ID: 0, Name: "full", Tier: kvcache.TierDevice, Layers: []int{0, 1}, TokensPerBlock: 64, BlockBytes: 64 * 1024, Blocks: hyBlocks},
			{ID: 1, Name: "ssm", Tier: kvcache.TierDevice, Layers: []int{2, 3, 4, 5}, BlockBytes: 40000, Blocks: 16},
		},
		maxSeq:    min(hyBlocks*64, 65536), // capped at max_seq_len
		maxSeqs:   16,
		warnWords: []string{"enable_block_reuse is off"},
	}}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			l, err := New().Configure(bg, tc.cfg)
			if err != nil {
				t.Fatalf("Configure: %v", err)
			}
			if !reflect.DeepEqual(l.Pools, tc.pools) {
				t.Errorf("Pools = %+v\nwant %+v", l.Pools, tc.pools)
			}
			if l.MaxSeqTokens != tc.maxSeq || l.MaxSequences != tc.maxSeqs {
				t.Errorf("MaxSeqTokens, MaxSequences = %d, %d; want %d, %d", l.MaxSeqTokens, l.MaxSequences, tc.maxSeq, tc.maxSeqs)
			}
			all := strings.Join(l.Warnings, "\n")
			for _, w := range tc.warnWords {
				if !strings.Contains(all, w) {
					t.Errorf("Warnings %q lack %q", l.Warnings, w)
				}
			}
		})
	}
}

func seqInts(from, to int) []int {
	var s []int
	for i := from; i < to; i++ {
		s = append(s, i)
	}
	return s
}

func TestConfigureErrors(t *testing.T) {
	ok := smallConfig(16, 64)
	mod := func(f func(*kvcache.Config)) kvcache.Config {
		c := ok
		c.Layers = append([]spec.Layer(nil), ok.Layers...)
		f(&c)
		return c
	}
	tests := []struct {
		name string
		cfg  kvcache.Config
		want []string // substrings of the message
	}{
		{"tokens per block", mod(func(c *kvcache.Config) { c.TokensPerBlock = 0 }), []string{"tokens_per_block = 0", "> 0"}},
		{"no layers", mod(func(c *kvcache.Config) { c.Layers = nil }), []string{"Layers is empty"}},
		{"no cache buffer", mod(func(c *kvcache.Config) { c.Layers = []spec.Layer{{Index: 0, FFN: spec.FFNDense}} }), []string{"none of the 1 layers"}},
		{"stages", mod(func(c *kvcache.Config) { c.Stages = 0 }), []string{"pipeline_parallel_size", "= 0"}},
		{"stage", mod(func(c *kvcache.Config) { c.Stage = 2; c.Stages = 2 }), []string{"Stage = 2", "[0, 2)"}},
		{"device bytes", mod(func(c *kvcache.Config) { c.DeviceBytes = 0 }), []string{"DeviceBytes", "= 0"}},
		{"batch", mod(func(c *kvcache.Config) { c.MaxBatchSize = -1 }), []string{"max_batch_size = -1"}},
		{"num tokens", mod(func(c *kvcache.Config) { c.MaxNumTokens = 0 }), []string{"max_num_tokens = 0"}},
		{"seq len", mod(func(c *kvcache.Config) { c.MaxSeqLen = 0 }), []string{"max_seq_len = 0"}},
		{"draft", mod(func(c *kvcache.Config) { c.MaxDraftTokens = -1 }), []string{"MaxDraftTokens", "= -1"}},
		{"avg seq len", mod(func(c *kvcache.Config) { c.AvgSeqLen = -5 }), []string{"avg_seq_len = -5"}},
		{"window", mod(func(c *kvcache.Config) { c.Layers[1].Window = -1 }), []string{"layer 1", "window = -1"}},
		{"mixer", mod(func(c *kvcache.Config) { c.Layers[0].Mixer = "rwkv" }), []string{`mixer "rwkv"`, "gqa, mla, dsa, mamba"}},
		{"buffer both", mod(func(c *kvcache.Config) {
			c.Layers[0].Buffers = []spec.Buffer{{Role: spec.RoleKV, BytesPerToken: 4, BytesPerSeq: 4}}
		}), []string{`buffer "kv"`, "exactly one"}},
		{"seed A budget too small", dsaStage(30, 4<<30), []string{
			"stage 1: 2,747 blocks of 64 tokens hold 175,808 tokens",
			"needs 262,145 (262,144 + 1 draft) = 4,097 blocks",
			"raise kv_cache_config.free_gpu_memory_fraction or lower max_seq_len"}},
		{"chunk too big", mod(func(c *kvcache.Config) { c.MaxNumTokens = 65 * 16 }), []string{
			"64 blocks of 16 tokens cannot hold one max_num_tokens chunk of 1,040 tokens (65 blocks)", "lower max_num_tokens"}},
		{"ssm slots too big", func() kvcache.Config { c := hybridStage(); c.DeviceBytes = 600000; return c }(), []string{
			"16 SSM state slots (max_batch_size 8 × pipeline_parallel_size 2) of 40,000 bytes need 640,000 bytes", "lower max_batch_size"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := New().Configure(bg, tc.cfg)
			if !errors.Is(err, kvcache.ErrInvalidConfig) {
				t.Fatalf("Configure error = %v, want ErrInvalidConfig", err)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
		})
	}
}

func TestInfoAndUnconfigured(t *testing.T) {
	m := New()
	info, err := m.Info(bg)
	if err != nil {
		t.Fatal(err)
	}
	c := info.Capabilities
	if info.Name != Name || !reflect.DeepEqual(info.Protocols, []int{kvcache.ProtocolVersion}) ||
		!c.PrefixReuse || c.HostTier || !c.SSMState || c.SSMReuse || len(c.Mixers) != 4 {
		t.Errorf("Info = %+v", info)
	}
	if _, err := m.Reserve(bg, []kvcache.ReserveItem{{Seq: 1, New: true, Tokens: 1}}); !errors.Is(err, kvcache.ErrInvalidArg) ||
		!strings.Contains(err.Error(), "before Configure") {
		t.Errorf("Reserve before Configure = %v, want ErrInvalidArg", err)
	}
	m = configured(t, smallConfig(16, 64))
	ctx, cancel := context.WithCancel(bg)
	cancel()
	if _, err := m.Commit(ctx, nil); !errors.Is(err, context.Canceled) {
		t.Errorf("Commit with a canceled ctx = %v", err)
	}
	// V1's host tier holds evicted blocks for reuse only: it pauses by
	// Release and recompute, so it is no Suspender and the core never asks
	// it to suspend.
	if _, ok := any(m).(kvcache.Suspender); ok {
		t.Errorf("%T implements kvcache.Suspender; V1 suspends nothing", m)
	}
}

func TestCommas(t *testing.T) {
	for n, want := range map[int64]string{0: "0", 999: "999", 1000: "1,000", 262145: "262,145", -1234567: "-1,234,567", -12: "-12"} {
		if got := commas64(n); got != want {
			t.Errorf("commas64(%d) = %q, want %q", n, got, want)
		}
	}
}
