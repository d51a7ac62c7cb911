package cachemgrv2

import (
	"context"
	"slices"

	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
	"github.com/kvx-dev/kvx/plugins/v1/spec"
)

// Version is the manager's version, reported by Info.
const Version = "0.1.0"

var (
	_ kvcache.Manager   = (*Manager)(nil)
	_ kvcache.Suspender = (*Manager)(nil) // the host tier
	_ kvcache.Explainer = (*Manager)(nil) // explained lookups (explain.go)
	_ kvcache.Forker    = (*Manager)(nil) // n > 1: children share the prompt's blocks (fork.go)
)

// Manager is a TensorRT-LLM "KV cache manager V2" style cache manager for one
// pipeline stage: pool groups by life cycle, a device and a host tier with
// suspend/resume, a radix tree of committed prompt blocks with pins and
// deferred pruning, and a per-sequence Ledger. It is a Core without Hooks;
// see the package doc.
//
// The core calls it from one goroutine at a time (kvcache package doc); it
// does no locking.
type Manager struct {
	Core
}

// New returns an unconfigured manager.
func New() *Manager { return &Manager{Core: NewCore("cachemgr_v2")} }

// Info implements kvcache.Manager.
func (m *Manager) Info(ctx context.Context) (kvcache.Info, error) {
	return Describe(ctx, "cachemgr_v2", Version, kvcache.Capabilities{
		Mixers:           []spec.Mixer{spec.MixerGQA, spec.MixerMLA, spec.MixerDSA},
		PrefixReuse:      true,
		HostTier:         true,
		CacheSalt:        true,
		KVEvents:         true,
		Explain:          true,
		Retention:        true,
		EvictionPolicies: slices.Clone(EvictionPolicies),
		Fork:             true,
	})
}

// Describe is the Info answer of a manager built on Core: its name, version
// and capabilities under this contract's protocol version, or ctx's error.
func Describe(ctx context.Context, name, version string, caps kvcache.Capabilities) (kvcache.Info, error) {
	if err := ctx.Err(); err != nil {
		return kvcache.Info{}, err
	}
	return kvcache.Info{Name: name, Version: version, Protocols: []int{kvcache.ProtocolVersion}, Capabilities: caps}, nil
}

// Configure implements kvcache.Manager. It groups the stage's paged buffers
// into pool groups by attention window, splits DeviceBytes between them from
// a typical step (AvgSeqLen, else MaxSeqLen; PoolRatio overrides: hints that
// change speed only) with at least one MaxSeqLen+MaxDraftTokens request and
// one MaxNumTokens chunk per group, and splits HostBytes in the same
// proportions. Models with state buffers are refused (ErrInvalidConfig), as
// is an EvictionPolicy other than lru, lfu or "". Configure resets all state.
func (m *Manager) Configure(ctx context.Context, cfg kvcache.Config) (kvcache.Layout, error) {
	if err := ctx.Err(); err != nil {
		return kvcache.Layout{}, err
	}
	if err := CheckEvictionPolicy("cachemgr_v2", cfg.EvictionPolicy); err != nil {
		return kvcache.Layout{}, err
	}
	groups, lay, devBlocks, hostBlocks, err := planLayout(&cfg)
	if err != nil {
		return kvcache.Layout{}, err
	}
	m.Init(CoreConfig{
		Name: "cachemgr_v2", Config: cfg, Groups: groups,
		DevBlocks: devBlocks, HostBlocks: hostBlocks, HostID: len(groups),
		Reuse: cfg.EnableBlockReuse, ReuseOff: "enable_block_reuse is off",
		Layout: lay.Pools,
	})
	return cloneLayout(lay), nil
}

func cloneLayout(l kvcache.Layout) kvcache.Layout {
	l.Pools = slices.Clone(l.Pools)
	for i := range l.Pools {
		l.Pools[i].Layers = slices.Clone(l.Pools[i].Layers)
	}
	l.Warnings = slices.Clone(l.Warnings)
	return l
}
