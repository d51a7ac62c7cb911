package cachemgrv1

import (
	"fmt"
	"math"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
	"github.com/kvx-dev/kvx/plugins/v1/spec"
)

// maxBlocksPerPool bounds one pool's block count, so that a tiny model on a
// huge simulated device does not make the manager's per-block metadata
// (about 40 bytes a block) explode. Extra memory is reported as a warning.
const maxBlocksPerPool = 1 << 24

// poolPlan is one pool of a layout before it is built.
type poolPlan struct {
	pool          kvcache.Pool
	bytesPerToken int64 // paged pools: sum over the pool's layers and paged buffers
}

// plan validates cfg and computes the layout. It does not touch m.
func plan(cfg kvcache.Config) (kvcache.Layout, []poolPlan, error) {
	if err := validate(cfg); err != nil {
		return kvcache.Layout{}, nil, err
	}
	st := fmt.Sprintf("stage %d", cfg.Stage)
	limit := cfg.MaxSeqLen + cfg.MaxDraftTokens
	var warnings []string

	// Group paged buffers by effective window; collect state buffers.
	type group struct {
		window int
		layers []int
		bpt    int64
	}
	groups := map[int]*group{}
	var stateLayers []int
	var stateBytes int64
	merged := map[int]bool{}
	for _, l := range cfg.Layers {
		var bpt, bps int64
		for _, b := range l.Buffers {
			bpt += b.BytesPerToken
			bps += b.BytesPerSeq
		}
		if bpt > 0 {
			w := l.Window
			if w >= limit {
				// A window that covers a whole max_seq_len request (plus drafts)
				// never drops anything: it is full attention.
				if !merged[w] {
					merged[w] = true
					warnings = append(warnings, fmt.Sprintf(
						"%s: attention window %s >= max_seq_len %s + max_draft_tokens %d; its layers share the full-attention pool",
						st, commas(w), commas(cfg.MaxSeqLen), cfg.MaxDraftTokens))
				}
				w = 0
			}
			g := groups[w]
			if g == nil {
				g = &group{window: w}
				groups[w] = g
			}
			g.layers = append(g.layers, l.Index)
			g.bpt += bpt
		}
		if bps > 0 {
			stateLayers = append(stateLayers, l.Index)
			stateBytes += bps
		}
	}
	windows := make([]int, 0, len(groups))
	for w := range groups {
		windows = append(windows, w)
	}
	sort.Ints(windows) // full attention (0) first, then windows ascending

	budget := cfg.DeviceBytes
	var plans []poolPlan
	layout := kvcache.Layout{}

	// The state pool is carved out first: one slot per resident sequence.
	var ssm *poolPlan
	if len(stateLayers) > 0 {
		slots := cfg.MaxBatchSize * cfg.Stages
		need := stateBytes * int64(slots)
		if stateBytes > 0 && need/stateBytes != int64(slots) || need > budget {
			return kvcache.Layout{}, nil, kvcache.Errorf(kvcache.KindInvalidConfig,
				"cachemgr-v1: %s: %s SSM state slots (max_batch_size %s × pipeline_parallel_size %d) of %s bytes need %s bytes, more than the %s bytes of cache memory; raise kv_cache_config.free_gpu_memory_fraction or lower max_batch_size",
				st, commas(slots), commas(cfg.MaxBatchSize), cfg.Stages, commas64(stateBytes), commas64(need), commas64(budget))
		}
		budget -= need
		ssm = &poolPlan{pool: kvcache.Pool{
			Name:       "ssm",
			Tier:       kvcache.TierDevice,
			Layers:     stateLayers,
			BlockBytes: stateBytes,
			Blocks:     slots,
		}}
		layout.MaxSequences = slots
	}

	// Paged pools: the remaining budget is split in proportion to per-token
	// bytes, so every pool gets the same number of blocks (a sequence needs
	// the same number of token slots in each of them).
	var sumBPT int64
	for _, w := range windows {
		sumBPT += groups[w].bpt
	}
	if len(windows) > 0 {
		tpb := int64(cfg.TokensPerBlock)
		blockSet := tpb * sumBPT // bytes of one block in every pool
		if blockSet/tpb != sumBPT {
			return kvcache.Layout{}, nil, kvcache.Errorf(kvcache.KindInvalidConfig,
				"cachemgr-v1: %s: tokens_per_block %d × %s bytes per token overflows", st, tpb, commas64(sumBPT))
		}
		n := budget / blockSet
		if n > maxBlocksPerPool {
			warnings = append(warnings, fmt.Sprintf(
				"%s: %s blocks per pool fit in the budget; using %s (the manager's limit), the rest of the memory stays unused",
				st, commas64(n), commas(maxBlocksPerPool)))
			n = maxBlocksPerPool
		}
		blocks := int(n)
		hold := blocks * cfg.TokensPerBlock
		needBlocks := kvcache.BlocksFor(limit, cfg.TokensPerBlock)
		if blocks < needBlocks {
			return kvcache.Layout{}, nil, kvcache.Errorf(kvcache.KindInvalidConfig,
				"cachemgr-v1: %s: %s blocks of %d tokens hold %s tokens; one max_seq_len request needs %s (%s + %d draft) = %s blocks; %s bytes of cache memory over %s bytes per token (%d paged pools%s); raise kv_cache_config.free_gpu_memory_fraction or lower max_seq_len",
				st, commas(blocks), cfg.TokensPerBlock, commas(hold), commas(limit), commas(cfg.MaxSeqLen), cfg.MaxDraftTokens,
				commas(needBlocks), commas64(budget), commas64(sumBPT), len(windows), ssmNote(ssm))
		}
		if chunk := kvcache.BlocksFor(cfg.MaxNumTokens, cfg.TokensPerBlock); blocks < chunk {
			return kvcache.Layout{}, nil, kvcache.Errorf(kvcache.KindInvalidConfig,
				"cachemgr-v1: %s: %s blocks of %d tokens cannot hold one max_num_tokens chunk of %s tokens (%s blocks); raise kv_cache_config.free_gpu_memory_fraction or lower max_num_tokens",
				st, commas(blocks), cfg.TokensPerBlock, commas(cfg.MaxNumTokens), commas(chunk))
		}
		for _, w := range windows {
			g := groups[w]
			name := "full"
			if w > 0 {
				name = "window-" + strconv.Itoa(w)
			}
			plans = append(plans, poolPlan{
				pool: kvcache.Pool{
					ID:             len(plans),
					Name:           name,
					Tier:           kvcache.TierDevice,
					Window:         w,
					Layers:         g.layers,
					TokensPerBlock: cfg.TokensPerBlock,
					BlockBytes:     tpb * g.bpt,
					Blocks:         blocks,
				},
				bytesPerToken: g.bpt,
			})
		}
		layout.MaxSeqTokens = min(hold, limit)
		// The host tier (hostcache.go) serves prefix reuse only, which a
		// stage with state buffers does not have.
		if cfg.HostBytes > 0 && cfg.EnableBlockReuse && ssm == nil {
			nh := cfg.HostBytes / blockSet
			switch {
			case nh == 0:
				warnings = append(warnings, fmt.Sprintf(
					"%s: host_cache_size %s bytes is less than one block in every paged pool (%s bytes); no host tier",
					st, commas64(cfg.HostBytes), commas64(blockSet)))
			case nh > maxBlocksPerPool:
				warnings = append(warnings, fmt.Sprintf(
					"%s: %s host blocks per pool fit in host_cache_size; using %s (the manager's limit), the rest of the host memory stays unused",
					st, commas64(nh), commas(maxBlocksPerPool)))
				nh = maxBlocksPerPool
			}
			if nh > 0 {
				k := len(plans)
				for i := range k {
					hp := plans[i]
					hp.pool.ID = k + i
					hp.pool.Name = "host-" + hp.pool.Name
					hp.pool.Tier = kvcache.TierHost
					hp.pool.Blocks = int(nh)
					hp.pool.Layers = slices.Clone(hp.pool.Layers)
					plans = append(plans, hp)
				}
			}
		}
	} else {
		// A stage of state layers only: no token limit beyond the request's.
		layout.MaxSeqTokens = limit
	}
	if ssm != nil {
		ssm.pool.ID = len(plans)
		plans = append(plans, *ssm)
	}

	if cfg.HostBytes > 0 && !(cfg.EnableBlockReuse && ssm == nil && len(windows) > 0) {
		warnings = append(warnings, fmt.Sprintf("%s: host_cache_size %s bytes ignored: cachemgr-v1's host tier holds evicted blocks for prefix reuse, which is off on this stage (pause frees and recomputes)", st, commas64(cfg.HostBytes)))
	}
	if len(cfg.PoolRatio) > 0 {
		warnings = append(warnings, st+": pool_ratio has no effect: cachemgr-v1 splits memory in proportion to bytes per token")
	}
	if cfg.Snapshots.Interval > 0 || len(cfg.Snapshots.OffsetsFromEnd) > 0 {
		warnings = append(warnings, st+": mamba_state_config snapshots have no effect: cachemgr-v1 does not reuse SSM state")
	}
	if cfg.EnableBlockReuse && ssm != nil {
		warnings = append(warnings, st+": enable_block_reuse is off on this stage: its SSM state cannot be reused, so no prefix can be")
	}
	if cfg.EnableBlockReuse && len(windows) > 0 && windows[len(windows)-1] > 0 {
		warnings = append(warnings, st+": prefix reuse needs every block of the prefix in the sliding-window pools too; blocks that left the window become evictable early and limit reuse")
	}

	layout.Pools = make([]kvcache.Pool, len(plans))
	for i, p := range plans {
		layout.Pools[i] = p.pool
	}
	layout.Warnings = warnings
	return layout, plans, nil
}

func ssmNote(ssm *poolPlan) string {
	if ssm == nil {
		return ""
	}
	return fmt.Sprintf(", after %s SSM state slots", commas(ssm.pool.Blocks))
}

// policies are the eviction policies Configure accepts, LRU first.
var policies = []string{kvcache.EvictionLRU, kvcache.EvictionLFU}

var supportedMixers = []spec.Mixer{spec.MixerGQA, spec.MixerMLA, spec.MixerDSA, spec.MixerMamba}

// validate checks every field plan relies on; errors name the key, the value
// and the limit.
func validate(cfg kvcache.Config) error {
	bad := func(format string, args ...any) error {
		return kvcache.Errorf(kvcache.KindInvalidConfig, "cachemgr-v1: stage %d: "+format, append([]any{cfg.Stage}, args...)...)
	}
	switch {
	case cfg.Stages < 1:
		return bad("pipeline_parallel_size (Stages) = %d; must be >= 1", cfg.Stages)
	case cfg.Stage < 0 || cfg.Stage >= cfg.Stages:
		return bad("Stage = %d; must be in [0, %d)", cfg.Stage, cfg.Stages)
	case cfg.TokensPerBlock <= 0:
		return bad("kv_cache_config.tokens_per_block = %d; must be > 0", cfg.TokensPerBlock)
	case cfg.TokensPerBlock > 1<<20:
		return bad("kv_cache_config.tokens_per_block = %d; must be <= %d", cfg.TokensPerBlock, 1<<20)
	case cfg.DeviceBytes <= 0:
		return bad("device cache bytes (DeviceBytes) = %d; must be > 0 (raise kv_cache_config.free_gpu_memory_fraction)", cfg.DeviceBytes)
	case cfg.HostBytes < 0:
		return bad("kv_cache_config.host_cache_size = %d; must be >= 0", cfg.HostBytes)
	case cfg.MaxBatchSize <= 0:
		return bad("max_batch_size = %d; must be > 0", cfg.MaxBatchSize)
	case cfg.MaxNumTokens <= 0:
		return bad("max_num_tokens = %d; must be > 0", cfg.MaxNumTokens)
	case cfg.MaxSeqLen <= 0:
		return bad("max_seq_len = %d; must be > 0", cfg.MaxSeqLen)
	case cfg.MaxSeqLen > math.MaxInt32/2:
		return bad("max_seq_len = %d; must be <= %d", cfg.MaxSeqLen, math.MaxInt32/2)
	case cfg.MaxDraftTokens < 0:
		return bad("speculative_config max draft tokens (MaxDraftTokens) = %d; must be >= 0", cfg.MaxDraftTokens)
	case cfg.MaxDraftTokens > 1<<16:
		return bad("speculative_config max draft tokens (MaxDraftTokens) = %d; must be <= %d", cfg.MaxDraftTokens, 1<<16)
	case cfg.AvgSeqLen < 0:
		return bad("kv_cache_config.avg_seq_len = %d; must be >= 0 (0 = unset)", cfg.AvgSeqLen)
	case len(cfg.Layers) == 0:
		return bad("Layers is empty: the stage has no layers")
	case cfg.EvictionPolicy != "" && !slices.Contains(policies, cfg.EvictionPolicy):
		return bad("kv_cache_config.eviction_policy = %q; must be one of %s (\"\" means %s)",
			cfg.EvictionPolicy, strings.Join(policies, ", "), kvcache.EvictionLRU)
	}
	hasBuf := false
	for i, l := range cfg.Layers {
		if l.Window < 0 {
			return bad("layer %d (Layers[%d]): window = %d; must be >= 0 (0 = full attention)", l.Index, i, l.Window)
		}
		if l.Mixer != spec.MixerNone && !supported(l.Mixer) {
			return bad("layer %d (Layers[%d]): mixer %q is not supported by cachemgr-v1 (supported: %s)", l.Index, i, l.Mixer, mixerList())
		}
		for _, b := range l.Buffers {
			if b.BytesPerToken < 0 || b.BytesPerSeq < 0 || (b.BytesPerToken > 0) == (b.BytesPerSeq > 0) {
				return bad("layer %d (Layers[%d]) buffer %q: bytes_per_token = %d, bytes_per_seq = %d; exactly one must be > 0",
					l.Index, i, b.Role, b.BytesPerToken, b.BytesPerSeq)
			}
			hasBuf = true
		}
	}
	if !hasBuf {
		return bad("none of the %d layers has a cache buffer (Layers[].Buffers)", len(cfg.Layers))
	}
	return nil
}

func supported(m spec.Mixer) bool {
	for _, s := range supportedMixers {
		if s == m {
			return true
		}
	}
	return false
}

func mixerList() string {
	s := make([]string, len(supportedMixers))
	for i, m := range supportedMixers {
		s[i] = string(m)
	}
	return strings.Join(s, ", ")
}

// commas formats n with thousands separators: 262145 -> "262,145".
func commas(n int) string { return commas64(int64(n)) }

func commas64(n int64) string {
	s := strconv.FormatInt(n, 10)
	neg := strings.HasPrefix(s, "-")
	if neg {
		s = s[1:]
	}
	if len(s) <= 3 {
		if neg {
			return "-" + s
		}
		return s
	}
	var b strings.Builder
	if neg {
		b.WriteByte('-')
	}
	head := len(s) % 3
	if head > 0 {
		b.WriteString(s[:head])
	}
	for i := head; i < len(s); i += 3 {
		if b.Len() > 0 && !(neg && b.Len() == 1) {
			b.WriteByte(',')
		}
		b.WriteString(s[i : i+3])
	}
	return b.String()
}
