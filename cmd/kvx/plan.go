package main

import (
	"fmt"
	"os"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/kvx-dev/kvx/cmd/builtin"
	"github.com/kvx-dev/kvx/core/setup"
	"github.com/kvx-dev/kvx/plugins/v1/spec"
)

func newPlanCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "plan",
		Short: "Print each stage's memory budget, pool layout and guaranteed capacity before anything runs",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := loadConfig(g, nil)
			if err != nil {
				return usageErr(err)
			}
			res, err := setup.Resolve(cfg, "plan", false)
			if err != nil {
				return usageErr(err)
			}
			if err := setup.CheckPlugins(cfg, builtin.Registry()); err != nil {
				return usageErr(err)
			}
			log := g.logger()
			l := setup.NewLauncher(cfg, builtin.Registry(), log)
			defer l.Close()
			tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
			fmt.Fprintf(tw, "model %s on %s, TP %d, PP %d, weights %s, cache manager %s, backend %s\n",
				res.Model.Name, res.Spec.Hardware.Name, cfg.TensorParallelSize, cfg.PipelineParallelSize,
				cfg.WeightsDtype, cfg.CacheManager, cfg.AttentionBackend)
			for i, st := range res.Stages {
				b := res.Budgets[i]
				mc := res.Spec.Managers[i]
				m, err := l.Manager(cmd.Context(), i)
				if err != nil && configError(err) {
					return usageErr(err)
				} else if err != nil {
					return engineErr(err)
				}
				layout, err := m.Configure(cmd.Context(), mc)
				if err != nil {
					return usageErr(withBudgetHint(fmt.Errorf("stage %d: %w", i, err), res))
				}
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
				fmt.Fprintf(tw, "  pool\ttier\tblocks\ttokens/block\tbytes/block\ttokens\n")
				for _, p := range layout.Pools {
					fmt.Fprintf(tw, "  %s\t%s\t%d\t%d\t%d\t%d\n", p.Name, p.Tier, p.Blocks, p.TokensPerBlock, p.BlockBytes, p.Blocks*p.TokensPerBlock)
				}
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

func gib(n int64) string { return fmt.Sprintf("%.2f GiB", float64(n)/(1<<30)) }

func cacheLayers(ls []spec.Layer) int {
	n := 0
	for _, l := range ls {
		if l.HasCache() {
			n++
		}
	}
	return n
}
