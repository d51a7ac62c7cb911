package main

import (
	"os"

	"github.com/spf13/cobra"

	"github.com/kvx-dev/kvx/cmd/builtin"
	"github.com/kvx-dev/kvx/core/plan"
	"github.com/kvx-dev/kvx/core/setup"
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
			stages, err := plan.Stages(cmd.Context(), p, l)
			switch {
			case err != nil && setup.ConfigError(err):
				return usageErr(p.BudgetHint(err))
			case err != nil:
				return engineErr(err)
			}
			return plan.Write(os.Stdout, p, stages)
		},
	}
}
