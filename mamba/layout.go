package mamba

import (
	"fmt"
	"math"
	"slices"
	"strings"

	cachemgrv2 "github.com/kvx-dev/kvx/cachemgr_v2"
	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
)

// plan is a validated layout before its pools are built.
type plan struct {
	groups     []*cachemgrv2.PoolGroup
	devBlocks  []int // per attention group
	hostBlocks []int // per attention group; nil without a host tier
	hostSlots  int   // host ssm slots (suspended live states and offloaded snapshots)
	stateBytes int64 // bytes of one sequence state over the stage's state layers
	stateLayer []int
	ssmBlocks  int // live + snapshot slots; 0 without state layers
	live       int
	step       int   // snapshot boundary step in tokens; 0 = no periodic snapshots
	offsets    []int // additional offsets from the prompt's end
	snapshots  bool  // snapshots are taken (reuse on, state layers, attention groups, a policy)
	layout     kvcache.Layout
}

func invalid(format string, args ...any) error {
	return kvcache.Errorf(kvcache.KindInvalidConfig, "mamba: "+format, args...)
}

// validate checks cfg's limits (cachemgrv2.ValidateConfig) and the
// mamba-only fields.
func validate(cfg *kvcache.Config) error {
	if err := cachemgrv2.ValidateConfig(Name, cfg); err != nil {
		return err
	}
	bad := func(field string, v any, want string) error {
		return invalid("%s = %v: %s", field, v, want)
	}
	switch {
	case cfg.Stages < 0:
		return bad("pipeline_parallel_size", cfg.Stages, "must be >= 1")
	case cfg.Snapshots.Interval < 0:
		return bad("mamba_state_config.periodic_snapshot_interval", cfg.Snapshots.Interval, "must be >= 0 (0 = none)")
	}
	for i, o := range cfg.Snapshots.OffsetsFromEnd {
		if o < 0 {
			return bad(fmt.Sprintf("mamba_state_config.additional_snapshot_offsets_from_end[%d]", i), o, "must be >= 0")
		}
	}
	return nil
}

// groupLayers sorts the stage's buffers (cachemgrv2.GroupLayers): paged
// buffers into pool groups by window, state buffers into one state.
func groupLayers(p *plan, cfg *kvcache.Config) error {
	groups, stateBytes, stateLayers, err := cachemgrv2.GroupLayers(Name, cfg.Layers, cfg.TokensPerBlock)
	if err != nil {
		return err
	}
	if len(groups) == 0 && stateBytes == 0 {
		return invalid("stage %d has no layer with a cache buffer", cfg.Stage)
	}
	p.groups, p.stateBytes, p.stateLayer = groups, stateBytes, stateLayers
	return nil
}

// boundaryLevel is the retention level of a snapshot at pos: the number of
// trailing zero bits of pos/step (every 2^k-th boundary has level >= k).
func boundaryLevel(pos, step int) int {
	if step <= 0 || pos <= 0 || pos%step != 0 {
		return 0
	}
	q := pos / step
	l := 0
	for q%2 == 0 {
		q /= 2
		l++
	}
	return l
}

func gcd(a, b int) int {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}

// planLayout validates cfg, groups the layers, splits the budget and proves
// that one MaxSeqLen request fits end to end with its states and that every
// resident state fits.
func planLayout(cfg *kvcache.Config) (*plan, error) {
	if err := validate(cfg); err != nil {
		return nil, err
	}
	p := &plan{}
	if err := groupLayers(p, cfg); err != nil {
		return nil, err
	}
	lay := &p.layout
	tpb := cfg.TokensPerBlock
	stages := max(cfg.Stages, 1)
	reqTokens := cfg.MaxSeqLen + cfg.MaxDraftTokens
	chunk := min(cfg.MaxNumTokens, reqTokens)
	floor := max(kvcache.BlocksFor(reqTokens, tpb), kvcache.BlocksFor(cfg.MaxNumTokens, tpb))
	hasState := p.stateBytes > 0

	if hasState {
		p.live = cfg.MaxBatchSize * stages
		lay.MaxSequences = p.live
		if cfg.Snapshots.Interval > 0 {
			p.step = cfg.Snapshots.Interval
			if p.step%tpb != 0 {
				p.step = p.step / gcd(p.step, tpb) * tpb
				lay.Warnings = append(lay.Warnings, fmt.Sprintf(
					"mamba_state_config.periodic_snapshot_interval %d is not a multiple of tokens_per_block %d: snapshots every %d tokens (reuse happens only at block boundaries)",
					cfg.Snapshots.Interval, tpb, p.step))
			}
		}
		p.offsets = slices.Clone(cfg.Snapshots.OffsetsFromEnd)
		p.snapshots = cfg.EnableBlockReuse && len(p.groups) > 0 && (p.step > 0 || len(p.offsets) > 0)
		switch {
		case cfg.EnableBlockReuse && len(p.groups) == 0:
			lay.Warnings = append(lay.Warnings, fmt.Sprintf(
				"stage %d has state layers but no attention layer: prefix reuse is off on this stage (and so on every stage)", cfg.Stage))
		case cfg.EnableBlockReuse && !p.snapshots:
			lay.Warnings = append(lay.Warnings,
				"enable_block_reuse is on but mamba_state_config sets no snapshot (periodic_snapshot_interval 0, no additional_snapshot_offsets_from_end): no prefix can be reused")
		}
	}
	snapFloor := 0
	if p.snapshots {
		snapFloor = 1
	}
	ssmFloor := p.live + snapFloor

	// Hard floors first.
	n := len(p.groups)
	names := make([]string, 0, n+1)
	var attnFloorBytes, perBlockAll int64
	for _, g := range p.groups {
		names = append(names, g.Name)
		attnFloorBytes += int64(floor) * g.BlockBytes
		perBlockAll += g.BlockBytes
	}
	ssmFloorBytes := int64(ssmFloor) * p.stateBytes
	if hasState {
		names = append(names, "ssm")
	}
	if minBytes := attnFloorBytes + ssmFloorBytes; minBytes > cfg.DeviceBytes {
		var fixes []string
		fixes = append(fixes, fmt.Sprintf("raise the KV budget (%s) to at least %d bytes", cachemgrv2.BudgetKeys, minBytes))
		if perBlockAll > 0 && cfg.DeviceBytes > ssmFloorBytes {
			fit := int((cfg.DeviceBytes - ssmFloorBytes) / perBlockAll)
			if fix := cachemgrv2.ShrinkFix(*cfg, fit); fix != "" {
				fixes = append(fixes, strings.TrimPrefix(fix, ", or "))
			}
		}
		if hasState && cfg.DeviceBytes > attnFloorBytes {
			if b := (int((cfg.DeviceBytes-attnFloorBytes)/p.stateBytes) - snapFloor) / stages; b >= 1 && b < cfg.MaxBatchSize {
				fixes = append(fixes, fmt.Sprintf("lower max_batch_size to at most %d", b))
			}
		}
		return nil, invalid("stage %d: device_bytes %d cannot hold one request end to end with its states: "+
			"max_seq_len %d + max_draft_tokens %d = %d tokens and one max_num_tokens %d chunk need %d blocks of %d tokens "+
			"in each attention pool group (%d bytes), and %d live SSM states (max_batch_size %d × pipeline_parallel_size %d) "+
			"+ %d snapshot slot(s) of %d bytes need %d bytes: %d bytes in all (pools %s); %s",
			cfg.Stage, cfg.DeviceBytes, cfg.MaxSeqLen, cfg.MaxDraftTokens, reqTokens, cfg.MaxNumTokens, floor, tpb,
			attnFloorBytes, p.live, cfg.MaxBatchSize, stages, snapFloor, p.stateBytes, ssmFloorBytes, minBytes,
			strings.Join(names, ", "), strings.Join(fixes, ", or "))
	}

	// The split: weights are the bytes of a typical step (a hint).
	m := n
	if hasState {
		m++
	}
	weights := make([]float64, m)
	bb := make([]int64, m)
	floors := make([]int, m)
	resident := float64(max(p.live, cfg.MaxBatchSize))
	var attnTokens, snaps float64
	if cfg.AvgSeqLen > 0 {
		attnTokens = float64(chunk) + (resident-1)*float64(cfg.AvgSeqLen+cfg.MaxDraftTokens)
		if p.snapshots {
			snaps = resident * float64(perRequestSnaps(cfg.AvgSeqLen, p.step, len(p.offsets)))
		}
	} else {
		attnTokens = float64(reqTokens) + (resident-1)*float64(chunk)
		if p.snapshots {
			snaps = float64(perRequestSnaps(cfg.MaxSeqLen, p.step, len(p.offsets))) +
				(resident-1)*float64(perRequestSnaps(chunk, p.step, len(p.offsets)))
		}
		lay.Warnings = append(lay.Warnings, fmt.Sprintf(
			"avg_seq_len unset: the pool split comes from the limits (one max_seq_len %d request with its snapshots, plus one max_num_tokens %d chunk per other resident sequence), a sizing hint: speed only",
			cfg.MaxSeqLen, cfg.MaxNumTokens))
	}
	for g, pg := range p.groups {
		bb[g] = pg.BlockBytes
		floors[g] = floor
		weights[g] = attnTokens / float64(tpb) * float64(pg.BlockBytes)
	}
	if hasState {
		bb[n] = p.stateBytes
		floors[n] = ssmFloor
		weights[n] = (float64(p.live) + snaps) * float64(p.stateBytes)
	}
	if cfg.PoolRatio != nil {
		if err := cachemgrv2.CheckPoolRatio(Name, cfg.PoolRatio, names); err != nil {
			return nil, err
		}
		copy(weights, cfg.PoolRatio)
	}
	var blocks []int
	if hasState && !p.snapshots && cfg.PoolRatio == nil {
		// Without snapshots the ssm pool needs exactly the live states.
		blocks = make([]int, m)
		blocks[n] = ssmFloor
		if n > 0 {
			copy(blocks, cachemgrv2.SplitBudget(cfg.DeviceBytes-ssmFloorBytes, weights[:n], bb[:n], floors[:n]))
		}
	} else {
		blocks = cachemgrv2.SplitBudget(cfg.DeviceBytes, weights, bb, floors)
	}
	if blocks == nil {
		return nil, invalid("stage %d: the floors of %d bytes do not fit device_bytes %d", cfg.Stage, attnFloorBytes+ssmFloorBytes, cfg.DeviceBytes) // checked above
	}
	lay.Warnings = append(lay.Warnings, cachemgrv2.RatioWarnings(cfg.PoolRatio, blocks, bb, cfg.DeviceBytes, names, "one max_seq_len request and the live states")...)
	p.devBlocks = blocks[:n]
	// The host tier splits as the device does: attention blocks in
	// proportion to their device pools, and the ssm pool's live and
	// snapshot slots (the live states alone without snapshots), since
	// host-ssm holds both suspended live states and offloaded snapshots.
	share := make([]int64, m)
	for i := range m {
		share[i] = int64(blocks[i]) * bb[i]
	}
	if hasState && !p.snapshots {
		share[n] = int64(p.live) * p.stateBytes
	}
	host, warn := cachemgrv2.SplitHost(cfg.HostBytes, share, bb, names)
	lay.Warnings = append(lay.Warnings, warn...)
	if host != nil {
		p.hostBlocks = host[:n]
		if hasState {
			p.hostSlots = host[n]
		}
	}
	poolTokens := math.MaxInt
	for g, pg := range p.groups {
		pg.Layers = slices.Clip(pg.Layers)
		lay.Pools = append(lay.Pools, kvcache.Pool{
			ID: g, Name: pg.Name, Tier: kvcache.TierDevice, Window: pg.Window, Layers: slices.Clone(pg.Layers),
			TokensPerBlock: tpb, BlockBytes: pg.BlockBytes, Blocks: blocks[g],
		})
		poolTokens = min(poolTokens, blocks[g]*tpb)
	}
	if hasState {
		p.ssmBlocks = blocks[n]
		if p.snapshots && p.ssmBlocks-p.live < 8 {
			lay.Warnings = append(lay.Warnings, fmt.Sprintf(
				"the ssm pool holds %d snapshot slots beside %d live states: prefix reuse will rarely hit; raise the KV budget or pool_ratio of ssm",
				p.ssmBlocks-p.live, p.live))
		}
	}
	if p.hostBlocks != nil {
		for g, pg := range p.groups {
			lay.Pools = append(lay.Pools, kvcache.Pool{
				ID: n + g, Name: "host-" + pg.Name, Tier: kvcache.TierHost, Window: pg.Window, Layers: slices.Clone(pg.Layers),
				TokensPerBlock: tpb, BlockBytes: pg.BlockBytes, Blocks: p.hostBlocks[g],
			})
		}
	}
	if hasState {
		id := n
		if p.hostBlocks != nil {
			id = 2 * n
		}
		lay.Pools = append(lay.Pools, kvcache.Pool{
			ID: id, Name: "ssm", Tier: kvcache.TierDevice, Layers: slices.Clone(p.stateLayer),
			BlockBytes: p.stateBytes, Blocks: p.ssmBlocks,
		})
		if p.hostBlocks != nil {
			lay.Pools = append(lay.Pools, kvcache.Pool{
				ID: id + 1, Name: "host-ssm", Tier: kvcache.TierHost, Layers: slices.Clone(p.stateLayer),
				BlockBytes: p.stateBytes, Blocks: p.hostSlots,
			})
		}
	}
	lay.MaxSeqTokens = min(poolTokens, reqTokens)
	return p, nil
}

// perRequestSnaps is the number of snapshots one request of tokens tokens
// takes: its periodic boundaries plus the additional offsets.
func perRequestSnaps(tokens, step, offsets int) int {
	n := offsets
	if step > 0 {
		n += tokens / step
	}
	return n
}
