package main

import (
	"fmt"
	"os"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/kvx-dev/kvx/core/host"
)

func newPluginsCmd(g *globals) *cobra.Command {
	var dirs []string
	cmd := &cobra.Command{
		Use:   "plugins",
		Short: "List the plugin binaries found and what each supports",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			h := host.New(g.logger(), dirs)
			defer h.Close()
			found := h.Plugins()
			tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
			fmt.Fprintln(tw, "binary\tkind\tname\tversion\tprotocols\tsupports\tpath")
			for _, f := range found {
				name, version, protocols, supports := "-", "-", "-", "-"
				switch {
				case f.Err != nil:
					supports = "error: " + f.Err.Error()
				case f.Manager != nil:
					i := f.Manager
					name, version, protocols = i.Name, i.Version, fmt.Sprint(i.Protocols)
					c := i.Capabilities
					var caps []string
					for _, m := range c.Mixers {
						caps = append(caps, string(m))
					}
					for _, x := range []struct {
						on   bool
						name string
					}{{c.PrefixReuse, "prefix-reuse"}, {c.HostTier, "host-tier"}, {c.SSMState, "ssm-state"}, {c.SSMReuse, "ssm-reuse"}, {c.CacheSalt, "cache-salt"}, {c.KVEvents, "kv-events"}} {
						if x.on {
							caps = append(caps, x.name)
						}
					}
					supports = strings.Join(caps, ",")
				case f.Worker != nil:
					i := f.Worker
					name, version, protocols = i.Name, i.Version, fmt.Sprint(i.Protocols)
					var mx []string
					for _, m := range i.Mixers {
						if m == "" {
							mx = append(mx, "ffn-only")
							continue
						}
						mx = append(mx, string(m))
					}
					supports = "device " + i.Device + ": " + strings.Join(mx, ",")
				}
				path := f.Path
				if f.Shadowed {
					path += " (shadowed)"
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", f.Name, f.Kind, name, version, protocols, supports, path)
			}
			if len(found) == 0 {
				fmt.Fprintln(tw, "no kvx-* plugin binaries found in", strings.Join(h.SearchPath(), ", "), "; run `make build`")
			}
			return tw.Flush()
		},
	}
	cmd.Flags().StringArrayVar(&dirs, "plugin-dir", nil, "also look in this directory (repeatable)")
	return cmd
}
