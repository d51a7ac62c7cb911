package main

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"github.com/kvx-dev/kvx/core/host"
)

func newConformanceCmd(g *globals) *cobra.Command {
	var reuse bool
	cmd := &cobra.Command{
		Use:   "conformance PLUGIN",
		Short: "Run the contract conformance suite against a plugin binary (a cache manager or a worker)",
		Long: `Run every contract check of plugins/conformance against a plugin binary,
each check on a fresh plugin process, and report all violations at once.
PLUGIN is a path or a binary name found like the engine finds plugins.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			h := host.New(g.logger(), nil)
			defer h.Close()
			c, err := h.Conform(cmd.Context(), args[0], reuse, os.Stdout, launchFailed)
			if err != nil {
				return usageErr(err)
			}
			for _, v := range c.Violations {
				fmt.Println("FAIL", v.Error())
			}
			fmt.Printf("%s %s: %d passed, %d failed\n", c.Kind, c.Path, c.Checks-len(c.Violations), len(c.Violations))
			if len(c.Violations) > 0 {
				return engineErr(fmt.Errorf("%d conformance violations", len(c.Violations)))
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&reuse, "reuse", true, "also check prefix reuse when the manager reports the capability")
	return cmd
}

func launchFailed(err error) { fmt.Fprintln(os.Stderr, "launch:", err) }
