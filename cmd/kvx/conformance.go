package main

import (
	"errors"
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"github.com/kvx-dev/kvx/core/host"
	"github.com/kvx-dev/kvx/plugins/conformance"
	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
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
			log := g.logger()
			h := host.New(log, nil)
			defer h.Close()
			path, err := h.Find(args[0])
			if err != nil {
				return usageErr(err)
			}
			ctx := cmd.Context()
			var failed error
			var kind string
			_, probe, err := h.LaunchManager(ctx, path)
			switch {
			case err == nil:
				probe.Kill()
				fmt.Printf("plugin %s: %v; features both offer: %v\n", path, probe.Contract(), probe.Features())
				kind = "cache manager"
				// A failed launch yields nil, which the suite reports as a violation.
				failed = conformance.CheckManager(ctx, h.ManagerFactory(ctx, path, launchFailed), conformance.ManagerOptions{Reuse: reuse})
			case kvcache.KindOf(err) == kvcache.KindUnsupported && !errors.Is(err, host.ErrProtocol):
				if _, wp, werr := h.LaunchWorker(ctx, path); werr == nil {
					wp.Kill()
					fmt.Printf("plugin %s: %v; features both offer: %v\n", path, wp.Contract(), wp.Features())
				}
				kind = "worker"
				failed = conformance.CheckWorker(ctx, h.WorkerFactory(ctx, path, launchFailed), conformance.WorkerOptions{})
			default:
				return usageErr(err)
			}
			vs := conformance.Violations(failed)
			if failed != nil && len(vs) == 0 {
				return usageErr(failed)
			}
			for _, v := range vs {
				fmt.Println("FAIL", v.Error())
			}
			checks := len(conformance.ManagerChecks())
			if kind == "worker" {
				checks = len(conformance.WorkerChecks())
			}
			fmt.Printf("%s %s: %d passed, %d failed\n", kind, path, checks-len(vs), len(vs))
			if len(vs) > 0 {
				return engineErr(fmt.Errorf("%d conformance violations", len(vs)))
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&reuse, "reuse", true, "also check prefix reuse when the manager reports the capability")
	return cmd
}

func launchFailed(err error) { fmt.Fprintln(os.Stderr, "launch:", err) }
