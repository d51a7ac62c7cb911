package main

import (
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/kvx-dev/kvx/cmd/builtin"
	"github.com/kvx-dev/kvx/core/engine"
	"github.com/kvx-dev/kvx/core/setup"
	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
	"github.com/kvx-dev/kvx/plugins/v1/spec"
)

func newPlanCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "plan",
		Short: "Print each stage's memory budget, device and host tiers, and guaranteed capacity before anything runs",
		Long: `Print each stage's memory budget, device and host tiers, and guaranteed
capacity before anything runs (with device cuda, from the free GPU memory
NVML reports).

Exit status: 0 when every stage's layout holds, 1 when a plugin failed, 2
for bad configuration or usage, a missing or wrong plugin, or a layout that
cannot hold the limits (the message names the numbers and the fix).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := loadConfig(g, nil)
			if err != nil {
				return usageErr(err)
			}
			p, err := setup.Prepare(cfg, "plan", builtin.Registry())
			if err != nil {
				return usageErr(err)
			}
			l := p.Launcher(g.logger())
			defer l.Close()
			tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
			fmt.Fprintf(tw, "model %s on %s, TP %d, PP %d, weights %s, cache manager %s, backend %s\n",
				p.Model.Name, p.Spec.Hardware.Name, cfg.TensorParallelSize, cfg.PipelineParallelSize,
				cfg.WeightsDtype, cfg.CacheManager, cfg.AttentionBackend)
			for i, st := range p.Stages {
				b := p.Budgets[i]
				mc := p.Spec.Managers[i]
				// The manager starts as the engine starts it, with its checks.
				s, err := engine.StartManager(cmd.Context(), p.Spec, l, i)
				switch {
				case err != nil && configError(err):
					return usageErr(p.BudgetHint(err))
				case err != nil:
					return engineErr(err)
				}
				layout, info := s.Layout, s.Info
				fmt.Fprintf(tw, "\nstage %d: layers %d..%d (%d with a cache)\n", i, st[0], st[1]-1, cacheLayers(mc.Layers))
				if cfg.Device == "cuda" {
					fmt.Fprintf(tw, "  memory source\t%s\n", b.Source)
				}
				fmt.Fprintf(tw, "  memory per GPU\t%s\n", gib(b.Memory))
				if b.Free > 0 {
					fmt.Fprintf(tw, "  free (NVML)\t%s\n", gib(b.Free))
				}
				fmt.Fprintf(tw, "  weights\t%s\n", gib(b.Weights))
				fmt.Fprintf(tw, "  activations (estimate)\t%s\n", gib(b.Activations))
				fmt.Fprintf(tw, "  runtime reserve\t%s\n", gib(b.Reserved))
				fmt.Fprintf(tw, "  cache budget (x %.2f)\t%s\n", b.Fraction, gib(b.Cache))
				writeTiers(tw, layout, info.Capabilities, mc)
				fmt.Fprintf(tw, "  guaranteed tokens per sequence\t%d\n", layout.MaxSeqTokens)
				if layout.MaxSequences > 0 {
					fmt.Fprintf(tw, "  resident sequences\t%d\n", layout.MaxSequences)
				}
				for _, w := range layout.Warnings {
					fmt.Fprintf(tw, "  warning: %s\n", w)
				}
			}
			return tw.Flush()
		},
	}
}

// tier sums the pools of one tier of a layout, as the manager laid them
// out: nothing here is recomputed from the config.
type tier struct {
	pools  []kvcache.Pool
	blocks int
	tokens int   // tokens the paged pools hold
	states int   // sequence states the state pools (TokensPerBlock 0) hold
	bytes  int64 // blocks x BlockBytes over the pools
}

// tierOf returns layout's pools of tier t, in layout order, and their sums.
func tierOf(layout kvcache.Layout, t kvcache.Tier) tier {
	var r tier
	for _, p := range layout.Pools {
		if p.Tier != t {
			continue
		}
		r.pools = append(r.pools, p)
		r.blocks += p.Blocks
		if p.TokensPerBlock > 0 {
			r.tokens += p.Blocks * p.TokensPerBlock
		} else {
			r.states += p.Blocks
		}
		r.bytes += int64(p.Blocks) * p.BlockBytes
	}
	return r
}

// hostUses says what a manager with caps, configured with mc, keeps on the
// host tier of its layout: "reuse offload" when it reuses prefixes and reuse
// is on (evicted reusable blocks move there and come back on a hit),
// "suspend" when it is a Suspender (preempted sequences wait there). nil
// when the layout has no host pools.
func hostUses(caps kvcache.Capabilities, mc kvcache.Config, host tier) []string {
	if len(host.pools) == 0 {
		return nil
	}
	var uses []string
	if caps.PrefixReuse && mc.EnableBlockReuse && host.tokens > 0 {
		uses = append(uses, "reuse offload (evicted reusable blocks, copied back on a hit)")
	}
	if caps.HostTier {
		uses = append(uses, "suspend (preempted sequences, resumed without recompute)")
	}
	return uses
}

// writeTiers prints layout's device and host tiers: a row per pool (tier,
// blocks, tokens per block, bytes per block, tokens held, bytes), then per
// tier its totals, and what the host tier is for with this manager.
func writeTiers(w io.Writer, layout kvcache.Layout, caps kvcache.Capabilities, mc kvcache.Config) {
	dev, host := tierOf(layout, kvcache.TierDevice), tierOf(layout, kvcache.TierHost)
	fmt.Fprintf(w, "  pool\ttier\tblocks\ttokens/block\tbytes/block\ttokens\tbytes\n")
	for _, t := range []tier{dev, host} {
		for _, p := range t.pools {
			tokens := "-" // a state pool holds one sequence's state per block
			if p.TokensPerBlock > 0 {
				tokens = fmt.Sprint(p.Blocks * p.TokensPerBlock)
			}
			fmt.Fprintf(w, "  %s\t%s\t%d\t%d\t%d\t%s\t%s\n", p.Name, p.Tier, p.Blocks, p.TokensPerBlock, p.BlockBytes, tokens, size(int64(p.Blocks)*p.BlockBytes))
		}
	}
	fmt.Fprintf(w, "  device tier\t%s\n", tierSummary(dev))
	switch {
	case len(host.pools) > 0:
		fmt.Fprintf(w, "  host tier\t%s of host_cache_size %s\n", tierSummary(host), size(mc.HostBytes))
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
		fmt.Fprintf(w, "  host tier\tnone: host_cache_size %s is not used by this manager here (see the warnings)\n", size(mc.HostBytes))
	default:
		fmt.Fprintf(w, "  host tier\tnone (host_cache_size 0)\n")
	}
}

// tierSummary is "2 pools, 300 blocks, 4800 tokens, 1 sequence state, 1.20 GiB".
func tierSummary(t tier) string {
	parts := []string{plural(len(t.pools), "pool"), plural(t.blocks, "block")}
	if t.tokens > 0 {
		parts = append(parts, fmt.Sprintf("%d tokens", t.tokens))
	}
	if t.states > 0 {
		parts = append(parts, plural(t.states, "sequence state"))
	}
	return strings.Join(append(parts, size(t.bytes)), ", ")
}

func plural(n int, what string) string {
	if n == 1 {
		return "1 " + what
	}
	return fmt.Sprintf("%d %ss", n, what)
}

func gib(n int64) string { return fmt.Sprintf("%.2f GiB", float64(n)/(1<<30)) }

// size is n bytes in GiB, MiB or KiB, whichever keeps a digit before the
// point (bytes below 1 KiB).
func size(n int64) string {
	switch {
	case n >= 1<<30:
		return gib(n)
	case n >= 1<<20:
		return fmt.Sprintf("%.2f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.2f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}

func cacheLayers(ls []spec.Layer) int {
	n := 0
	for _, l := range ls {
		if l.HasCache() {
			n++
		}
	}
	return n
}
