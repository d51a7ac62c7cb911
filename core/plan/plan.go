// Package plan is kvx plan's work: every stage's cache manager started as
// the engine starts it (engine.StartManager, with its capability checks),
// and per stage the memory budget, the device and host tiers of the
// layout the manager laid out, and the guaranteed capacity, written as a
// table. Nothing here is recomputed from the config: the tiers are the
// layout's own pools.
package plan

import (
	"context"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/kvx-dev/kvx/core/engine"
	"github.com/kvx-dev/kvx/core/setup"
	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
	"github.com/kvx-dev/kvx/plugins/v1/spec"
)

// Stage is one stage's plan: its layers, its budget, and its manager's
// answer.
type Stage struct {
	Layers [2]int         // layers Layers[0]..Layers[1]-1
	Budget setup.Budget   // the stage's memory split
	Config kvcache.Config // what the manager was configured with
	Layout kvcache.Layout // what it laid out
	Caps   kvcache.Capabilities
}

// Stages starts every stage's manager of p through l, as the engine starts
// it, and returns the stages' plans. The caller owns what l started. An
// error is StartManager's: setup.ConfigError says whether it is the
// configuration's (p.BudgetHint then says which setting sized the cache).
func Stages(ctx context.Context, p *setup.Prepared, l *setup.Launcher) ([]Stage, error) {
	var out []Stage
	for i, st := range p.Stages {
		s, err := engine.StartManager(ctx, p.Spec, l, i)
		if err != nil {
			return nil, err
		}
		out = append(out, Stage{Layers: st, Budget: p.Budgets[i], Config: p.Spec.Managers[i], Layout: s.Layout, Caps: s.Info.Capabilities})
	}
	return out, nil
}

// Write writes the plan of p's stages as kvx plan prints it: the model and
// the run's shape, then per stage its layers, memory, tiers and capacity.
func Write(w io.Writer, p *setup.Prepared, stages []Stage) error {
	cfg := p.Config
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "model %s on %s, TP %d, PP %d, weights %s, cache manager %s, backend %s\n",
		p.Model.Name, p.Spec.Hardware.Name, cfg.TensorParallelSize, cfg.PipelineParallelSize,
		cfg.WeightsDtype, cfg.CacheManager, cfg.AttentionBackend)
	for i, st := range stages {
		b, mc, layout := st.Budget, st.Config, st.Layout
		fmt.Fprintf(tw, "\nstage %d: layers %d..%d (%d with a cache)\n", i, st.Layers[0], st.Layers[1]-1, cacheLayers(mc.Layers))
		if cfg.Device == "cuda" {
			fmt.Fprintf(tw, "  memory source\t%s\n", b.Source)
		}
		fmt.Fprintf(tw, "  memory per GPU\t%s\n", GiB(b.Memory))
		if b.Free > 0 {
			fmt.Fprintf(tw, "  free (NVML)\t%s\n", GiB(b.Free))
		}
		fmt.Fprintf(tw, "  weights\t%s\n", GiB(b.Weights))
		fmt.Fprintf(tw, "  activations (estimate)\t%s\n", GiB(b.Activations))
		fmt.Fprintf(tw, "  runtime reserve\t%s\n", GiB(b.Reserved))
		fmt.Fprintf(tw, "  cache budget (x %.2f)\t%s\n", b.Fraction, GiB(b.Cache))
		WriteTiers(tw, layout, st.Caps, mc)
		fmt.Fprintf(tw, "  guaranteed tokens per sequence\t%d\n", layout.MaxSeqTokens)
		if layout.MaxSequences > 0 {
			fmt.Fprintf(tw, "  resident sequences\t%d\n", layout.MaxSequences)
		}
		for _, w := range layout.Warnings {
			fmt.Fprintf(tw, "  warning: %s\n", w)
		}
	}
	return tw.Flush()
}

// Tier sums the pools of one tier of a layout, as the manager laid them
// out: nothing here is recomputed from the config.
type Tier struct {
	Pools  []kvcache.Pool
	Blocks int
	Tokens int   // tokens the paged pools hold
	States int   // sequence states the state pools (TokensPerBlock 0) hold
	Bytes  int64 // blocks x BlockBytes over the pools
}

// TierOf returns layout's pools of tier t, in layout order, and their sums.
func TierOf(layout kvcache.Layout, t kvcache.Tier) Tier {
	var r Tier
	for _, p := range layout.Pools {
		if p.Tier != t {
			continue
		}
		r.Pools = append(r.Pools, p)
		r.Blocks += p.Blocks
		if p.TokensPerBlock > 0 {
			r.Tokens += p.Blocks * p.TokensPerBlock
		} else {
			r.States += p.Blocks
		}
		r.Bytes += int64(p.Blocks) * p.BlockBytes
	}
	return r
}

// hostUses says what a manager with caps, configured with mc, keeps on the
// host tier of its layout: "reuse offload" when it reuses prefixes and reuse
// is on (evicted reusable blocks move there and come back on a hit),
// "suspend" when it is a Suspender (preempted sequences wait there). nil
// when the layout has no host pools.
func hostUses(caps kvcache.Capabilities, mc kvcache.Config, host Tier) []string {
	if len(host.Pools) == 0 {
		return nil
	}
	var uses []string
	if caps.PrefixReuse && mc.EnableBlockReuse && host.Tokens > 0 {
		uses = append(uses, "reuse offload (evicted reusable blocks, copied back on a hit)")
	}
	if caps.HostTier {
		uses = append(uses, "suspend (preempted sequences, resumed without recompute)")
	}
	return uses
}

// WriteTiers prints layout's device and host tiers: a row per pool (tier,
// blocks, tokens per block, bytes per block, tokens held, bytes), then per
// tier its totals, and what the host tier is for with this manager.
func WriteTiers(w io.Writer, layout kvcache.Layout, caps kvcache.Capabilities, mc kvcache.Config) {
	dev, host := TierOf(layout, kvcache.TierDevice), TierOf(layout, kvcache.TierHost)
	fmt.Fprintf(w, "  pool\ttier\tblocks\ttokens/block\tbytes/block\ttokens\tbytes\n")
	for _, t := range []Tier{dev, host} {
		for _, p := range t.Pools {
			tokens := "-" // a state pool holds one sequence's state per block
			if p.TokensPerBlock > 0 {
				tokens = fmt.Sprint(p.Blocks * p.TokensPerBlock)
			}
			fmt.Fprintf(w, "  %s\t%s\t%d\t%d\t%d\t%s\t%s\n", p.Name, p.Tier, p.Blocks, p.TokensPerBlock, p.BlockBytes, tokens, Size(int64(p.Blocks)*p.BlockBytes))
		}
	}
	fmt.Fprintf(w, "  device tier\t%s\n", Summary(dev))
	switch {
	case len(host.Pools) > 0:
		fmt.Fprintf(w, "  host tier\t%s of host_cache_size %s\n", Summary(host), Size(mc.HostBytes))
		uses := hostUses(caps, mc, host)
		what := "nothing this manager says it uses"
		switch len(uses) {
		case 1:
			what = uses[0]
		case 2:
			what = uses[0] + " and " + uses[1] + ", sharing one host budget"
		}
		fmt.Fprintf(w, "  host tier holds\t%s\n", what)
	case mc.HostBytes > 0:
		fmt.Fprintf(w, "  host tier\tnone: host_cache_size %s is not used by this manager here (see the warnings)\n", Size(mc.HostBytes))
	default:
		fmt.Fprintf(w, "  host tier\tnone (host_cache_size 0)\n")
	}
}

// Summary is "2 pools, 300 blocks, 4800 tokens, 1 sequence state, 1.20 GiB".
func Summary(t Tier) string {
	parts := []string{plural(len(t.Pools), "pool"), plural(t.Blocks, "block")}
	if t.Tokens > 0 {
		parts = append(parts, fmt.Sprintf("%d tokens", t.Tokens))
	}
	if t.States > 0 {
		parts = append(parts, plural(t.States, "sequence state"))
	}
	return strings.Join(append(parts, Size(t.Bytes)), ", ")
}

func plural(n int, what string) string {
	if n == 1 {
		return "1 " + what
	}
	return fmt.Sprintf("%d %ss", n, what)
}

// GiB is n bytes in GiB, two decimals.
func GiB(n int64) string { return fmt.Sprintf("%.2f GiB", float64(n)/(1<<30)) }

// Size is n bytes in GiB, MiB or KiB, whichever keeps a digit before the
// point (bytes below 1 KiB).
func Size(n int64) string {
	switch {
	case n >= 1<<30:
		return GiB(n)
	case n >= 1<<20:
		return fmt.Sprintf("%.2f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.2f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}

// cacheLayers counts the layers of ls that keep a cache.
func cacheLayers(ls []spec.Layer) int {
	n := 0
	for _, l := range ls {
		if l.HasCache() {
			n++
		}
	}
	return n
}
