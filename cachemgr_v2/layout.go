package cachemgrv2

import (
	"fmt"
	"math"
	"slices"
	"strings"

	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
	"github.com/kvx-dev/kvx/plugins/v1/spec"
)

// PoolGroup is the set of paged buffers that share one life cycle: all
// buffers of all layers with the same attention window. One block of a group
// holds tokens_per_block tokens of every one of its buffers (a DSA layer's
// latent and indexer key, the MTP layer's KV), so the buffers of a group share
// block ids and advance in the same call: no side pool can lag.
//
// Windowed groups keep their out-of-window blocks (stale-block release is not
// implemented), so every group needs ceil(capacity/tpb) blocks per sequence.
type PoolGroup struct {
	Name       string // "full" or "window-<W>"
	Window     int    // attention window; 0 = full attention
	Layers     []int  // spec.Layer.Index of its layers
	BlockBytes int64  // bytes of one block over all its layers and buffers
	Dev        *BlockPool
	Host       *BlockPool // nil without a host tier
}

// GroupLayers sorts the stage's buffers: paged buffers into pool groups by
// attention window (sorted by window), state buffers (Mamba conv and SSM
// state) into one per-sequence state, of stateBytes over stateLayers (their
// spec.Layer.Index). A buffer must have exactly one of BytesPerToken and
// BytesPerSeq, a layer a window >= 0: else ErrInvalidConfig, prefixed with
// name.
func GroupLayers(name string, layers []spec.Layer, tpb int) (groups []*PoolGroup, stateBytes int64, stateLayers []int, err error) {
	for _, l := range layers {
		var perToken, perSeq int64
		for _, b := range l.Buffers {
			if b.BytesPerToken < 0 || b.BytesPerSeq < 0 || (b.BytesPerToken > 0) == (b.BytesPerSeq > 0) {
				return nil, 0, nil, kvcache.Errorf(kvcache.KindInvalidConfig,
					"%s: layer %d buffer %s: bytes_per_token %d, bytes_per_seq %d: exactly one must be > 0",
					name, l.Index, b.Role, b.BytesPerToken, b.BytesPerSeq)
			}
			perToken += b.BytesPerToken
			perSeq += b.BytesPerSeq
		}
		if perSeq > 0 {
			stateBytes += perSeq
			stateLayers = append(stateLayers, l.Index)
		}
		if perToken == 0 {
			continue // no paged cache (a pure FFN block, or a state layer)
		}
		if l.Window < 0 {
			return nil, 0, nil, kvcache.Errorf(kvcache.KindInvalidConfig, "%s: layer %d window %d must be >= 0", name, l.Index, l.Window)
		}
		i := slices.IndexFunc(groups, func(g *PoolGroup) bool { return g.Window == l.Window })
		if i < 0 {
			gname := "full"
			if l.Window > 0 {
				gname = fmt.Sprintf("window-%d", l.Window)
			}
			groups = append(groups, &PoolGroup{Name: gname, Window: l.Window})
			i = len(groups) - 1
		}
		groups[i].Layers = append(groups[i].Layers, l.Index)
		groups[i].BlockBytes += perToken * int64(tpb)
	}
	slices.SortStableFunc(groups, func(a, b *PoolGroup) int { return a.Window - b.Window })
	return groups, stateBytes, stateLayers, nil
}

// groupLayers is GroupLayers for this manager: a layer with state buffers
// (Mamba) is refused, and so is a stage without a paged buffer.
func groupLayers(stage int, layers []spec.Layer, tpb int) ([]*PoolGroup, error) {
	groups, _, state, err := GroupLayers("cachemgr_v2", layers, tpb)
	switch {
	case err != nil:
		return nil, err
	case len(state) > 0:
		return nil, kvcache.Errorf(kvcache.KindInvalidConfig,
			"hybrid model (%d mamba layers): use cache_manager: mamba", len(state))
	case len(groups) == 0:
		return nil, kvcache.Errorf(kvcache.KindInvalidConfig, "cachemgr_v2: stage %d has no layer with a paged cache buffer", stage)
	}
	return groups, nil
}

// ValidateConfig checks the scalar limits of cfg shared by the managers built
// on Core; errors are ErrInvalidConfig prefixed with name, naming the field,
// the value and what is allowed.
func ValidateConfig(name string, cfg *kvcache.Config) error {
	bad := func(field string, v any, want string) error {
		return kvcache.Errorf(kvcache.KindInvalidConfig, "%s: %s = %v: %s", name, field, v, want)
	}
	switch {
	case cfg.TokensPerBlock <= 0:
		return bad("tokens_per_block", cfg.TokensPerBlock, "must be > 0")
	case cfg.DeviceBytes <= 0:
		return bad("device_bytes", cfg.DeviceBytes, "must be > 0")
	case cfg.HostBytes < 0:
		return bad("host_bytes", cfg.HostBytes, "must be >= 0 (0 = no host tier)")
	case cfg.MaxBatchSize <= 0:
		return bad("max_batch_size", cfg.MaxBatchSize, "must be > 0")
	case cfg.MaxNumTokens <= 0:
		return bad("max_num_tokens", cfg.MaxNumTokens, "must be > 0")
	case cfg.MaxSeqLen <= 0:
		return bad("max_seq_len", cfg.MaxSeqLen, "must be > 0")
	case cfg.MaxDraftTokens < 0:
		return bad("max_draft_tokens", cfg.MaxDraftTokens, "must be >= 0")
	case cfg.AvgSeqLen < 0 || cfg.AvgSeqLen > cfg.MaxSeqLen:
		return bad("avg_seq_len", cfg.AvgSeqLen, fmt.Sprintf("must be in [0, max_seq_len %d] (0 = unset)", cfg.MaxSeqLen))
	}
	return nil
}

// typicalBlocks is a group's block demand in the typical step: one context
// chunk plus MaxBatchSize-1 generating sequences of the typical length (the
// avg_seq_len hint, else the max_seq_len limit), each with its drafts. Every
// life cycle of this manager keeps ceil(tokens/tpb) blocks per sequence.
func typicalBlocks(cfg *kvcache.Config, g *PoolGroup) float64 {
	typical := cfg.AvgSeqLen
	if typical == 0 {
		typical = cfg.MaxSeqLen
	}
	tpb := cfg.TokensPerBlock
	chunk := kvcache.BlocksFor(min(cfg.MaxNumTokens, cfg.MaxSeqLen)+cfg.MaxDraftTokens, tpb)
	gen := kvcache.BlocksFor(typical+cfg.MaxDraftTokens, tpb)
	return float64(chunk) + float64(cfg.MaxBatchSize-1)*float64(gen)
}

// SplitBudget divides budget bytes between pool groups in proportion to
// weights (a typical step's bytes per group, or a pool_ratio), in whole
// blocks of blockBytes[g], giving every group at least floors[g] blocks (the
// hard constraints) and sharing the rest among the others in proportion. It
// returns nil when the floors alone do not fit. All slices have one entry per
// group; weights must be > 0.
func SplitBudget(budget int64, weights []float64, blockBytes []int64, floors []int) []int {
	n := len(weights)
	blocks := make([]int, n)
	fixed := make([]bool, n)
	var floorBytes int64
	for g := range n {
		floorBytes += int64(floors[g]) * blockBytes[g]
	}
	if floorBytes > budget {
		return nil
	}
	for {
		rest, w := budget, 0.0
		for g := range n {
			if fixed[g] {
				rest -= int64(blocks[g]) * blockBytes[g]
			} else {
				w += weights[g]
			}
		}
		changed := false
		for g := range n {
			if fixed[g] {
				continue
			}
			blocks[g] = int(math.Floor(float64(rest) * weights[g] / w / float64(blockBytes[g])))
			if blocks[g] < floors[g] {
				blocks[g], fixed[g], changed = floors[g], true, true
			}
		}
		if !changed {
			return blocks
		}
	}
}

// CheckPoolRatio checks a pool_ratio hint: one entry per pool (named by
// names), each > 0 and finite; else ErrInvalidConfig prefixed with name.
func CheckPoolRatio(name string, ratio []float64, names []string) error {
	if len(ratio) != len(names) {
		return kvcache.Errorf(kvcache.KindInvalidConfig,
			"%s: pool_ratio has %d entries, want %d (one per pool: %s)", name, len(ratio), len(names), strings.Join(names, ", "))
	}
	for i, r := range ratio {
		if !(r > 0) || math.IsInf(r, 0) {
			return kvcache.Errorf(kvcache.KindInvalidConfig, "%s: pool_ratio[%d] (%s) = %v: must be > 0", name, i, names[i], r)
		}
	}
	return nil
}

// RatioWarnings says, for each pool whose share of budget (blocks of
// blockBytes) is more than 0.01 off its pool_ratio entry, that the floors
// (what) moved it; none without a ratio.
func RatioWarnings(ratio []float64, blocks []int, blockBytes []int64, budget int64, names []string, what string) []string {
	var w []string
	for i, r := range ratio {
		if got := float64(int64(blocks[i])*blockBytes[i]) / float64(budget); math.Abs(got-r) > 0.01 {
			w = append(w, fmt.Sprintf("pool_ratio[%d] (%s) = %.3f became %.3f to hold %s", i, names[i], r, got, what))
		}
	}
	return w
}

// SplitHost divides hostBytes between pools in proportion to devBytes (each
// pool's device bytes, or the part of them that can be suspended), in whole
// blocks of blockBytes. It returns nil when hostBytes is 0 (no host tier),
// and a warning for each pool (named by names) that gets no block, whose
// sequences then cannot be suspended.
func SplitHost(hostBytes int64, devBytes, blockBytes []int64, names []string) ([]int, []string) {
	if hostBytes <= 0 {
		return nil, nil
	}
	var total int64
	for _, b := range devBytes {
		total += b
	}
	host := make([]int, len(devBytes))
	var warn []string
	for g := range devBytes {
		share := float64(devBytes[g]) / float64(total)
		host[g] = int(float64(hostBytes) * share / float64(blockBytes[g]))
		if host[g] == 0 {
			warn = append(warn, fmt.Sprintf(
				"host_bytes %d gives pool %s no host block (%d bytes each): Suspend will fail", hostBytes, names[g], blockBytes[g]))
		}
	}
	return host, warn
}

// planLayout groups the layers, splits the budgets and proves the layout can
// hold one MaxSeqLen+MaxDraftTokens request end to end and one MaxNumTokens
// chunk. The groups' pools are created by the caller.
func planLayout(cfg *kvcache.Config) ([]*PoolGroup, kvcache.Layout, []int, []int, error) {
	var lay kvcache.Layout
	if err := ValidateConfig("cachemgr_v2", cfg); err != nil {
		return nil, lay, nil, nil, err
	}
	tpb := cfg.TokensPerBlock
	groups, err := groupLayers(cfg.Stage, cfg.Layers, tpb)
	if err != nil {
		return nil, lay, nil, nil, err
	}
	n := len(groups)
	names := make([]string, n)
	weights := make([]float64, n)
	bb := make([]int64, n)
	floors := make([]int, n)
	reqTokens := cfg.MaxSeqLen + cfg.MaxDraftTokens
	floor := max(kvcache.BlocksFor(reqTokens, tpb), kvcache.BlocksFor(cfg.MaxNumTokens, tpb))
	var minBytes, perBlockAll int64
	for g, pg := range groups {
		names[g] = pg.Name
		bb[g] = pg.BlockBytes
		floors[g] = floor
		weights[g] = typicalBlocks(cfg, pg) * float64(pg.BlockBytes)
		minBytes += int64(floor) * pg.BlockBytes
		perBlockAll += pg.BlockBytes
	}
	if cfg.AvgSeqLen == 0 {
		lay.Warnings = append(lay.Warnings, fmt.Sprintf(
			"avg_seq_len unset: the pool split uses a typical step of max_seq_len %d tokens per sequence (a sizing hint: speed only)", cfg.MaxSeqLen))
	}
	if cfg.PoolRatio != nil {
		if err := CheckPoolRatio("cachemgr_v2", cfg.PoolRatio, names); err != nil {
			return nil, lay, nil, nil, err
		}
		copy(weights, cfg.PoolRatio)
	}
	dev := SplitBudget(cfg.DeviceBytes, weights, bb, floors)
	if dev == nil {
		fit := int(cfg.DeviceBytes / perBlockAll)
		return nil, lay, nil, nil, kvcache.Errorf(kvcache.KindInvalidConfig,
			"cachemgr_v2: device_bytes %d cannot hold one request end to end: max_seq_len %d + max_draft_tokens %d = %d tokens "+
				"and one max_num_tokens %d chunk need %d blocks of %d tokens in each pool group (%s), %d bytes in all; "+
				"raise the KV budget (%s) to at least %d bytes%s",
			cfg.DeviceBytes, cfg.MaxSeqLen, cfg.MaxDraftTokens, reqTokens, cfg.MaxNumTokens, floor, tpb,
			strings.Join(names, ", "), minBytes, BudgetKeys, minBytes, ShrinkFix(*cfg, fit))
	}
	lay.Warnings = append(lay.Warnings, RatioWarnings(cfg.PoolRatio, dev, bb, cfg.DeviceBytes, names, "one max_seq_len request")...)
	devBytes := make([]int64, n)
	for g := range n {
		devBytes[g] = int64(dev[g]) * bb[g]
	}
	host, warn := SplitHost(cfg.HostBytes, devBytes, bb, names)
	lay.Warnings = append(lay.Warnings, warn...)
	poolTokens := math.MaxInt
	for g, pg := range groups {
		pg.Layers = slices.Clip(pg.Layers)
		lay.Pools = append(lay.Pools, kvcache.Pool{
			ID: g, Name: pg.Name, Tier: kvcache.TierDevice, Window: pg.Window, Layers: pg.Layers,
			TokensPerBlock: tpb, BlockBytes: pg.BlockBytes, Blocks: dev[g],
		})
		poolTokens = min(poolTokens, dev[g]*tpb)
	}
	for g, pg := range groups {
		if host != nil {
			lay.Pools = append(lay.Pools, kvcache.Pool{
				ID: n + g, Name: "host-" + pg.Name, Tier: kvcache.TierHost, Window: pg.Window, Layers: pg.Layers,
				TokensPerBlock: tpb, BlockBytes: pg.BlockBytes, Blocks: host[g],
			})
		}
	}
	lay.MaxSeqTokens = min(poolTokens, reqTokens)
	return groups, lay, dev, host, nil
}

// BudgetKeys names the settings that size a stage's cache budget, for a
// message that says to raise it: the manager sees only the bytes, not
// which of the two set them.
const BudgetKeys = "kv_cache_config.free_gpu_memory_fraction, or kv_cache_config.max_tokens where it caps the budget"

// ShrinkFix is the tail of a message that the cache, fitBlocks blocks in
// each pool group, cannot hold one request end to end: ", or lower
// max_seq_len to at most N" (and max_num_tokens, where that is too large
// as well), naming only what exceeds the fit and only values a request can
// run at; "" when no such value exists.
func ShrinkFix(cfg kvcache.Config, fitBlocks int) string {
	tpb := cfg.TokensPerBlock
	fit := fitBlocks * tpb
	var fixes []string
	if kvcache.BlocksFor(cfg.MaxSeqLen+cfg.MaxDraftTokens, tpb) > fitBlocks {
		if fit-cfg.MaxDraftTokens < 2 { // one prompt and one output token
			return ""
		}
		fixes = append(fixes, fmt.Sprintf("max_seq_len to at most %d", fit-cfg.MaxDraftTokens))
	}
	if kvcache.BlocksFor(cfg.MaxNumTokens, tpb) > fitBlocks {
		if fit < 1 {
			return ""
		}
		fixes = append(fixes, fmt.Sprintf("max_num_tokens to at most %d", fit))
	}
	if len(fixes) == 0 {
		return ""
	}
	return ", or lower " + strings.Join(fixes, " and ")
}
