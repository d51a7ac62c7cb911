package main

import (
	"fmt"
	"os"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/kvx-dev/kvx/cmd/builtin"
	"github.com/kvx-dev/kvx/core/host"
	"github.com/kvx-dev/kvx/core/registry"
	"github.com/kvx-dev/kvx/plugins/v1/pluginrpc"
)

func newPluginsCmd(g *globals) *cobra.Command {
	var dirs []string
	cmd := &cobra.Command{
		Use:   "plugins",
		Short: "List the plugin binaries found, the config value that picks each, and what each supports",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			h := host.New(g.logger(), dirs)
			defer h.Close()
			found := h.Plugins()
			reg := builtin.Registry()
			tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
			fmt.Fprintln(tw, "binary\tconfig\tkind\tname\tversion\tcontract\tprotocol\tfeatures\tsupports\tpath")
			seen := map[string]bool{}
			for _, f := range found {
				name, version, protocols, supports := "-", "-", "-", "-"
				protocol, features := "-", "-"
				if c := f.Contract; c != nil {
					protocol, features = fmt.Sprint(c.Protocol), featureText(*c)
				}
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
					}{{c.PrefixReuse, "prefix-reuse"}, {c.HostTier, "host-tier"}, {c.SSMState, "ssm-state"}, {c.SSMReuse, "ssm-reuse"}, {c.CacheSalt, "cache-salt"}, {c.KVEvents, "kv-events"},
						{c.Explain, "explain"}, {c.Retention, "retention"}} {
						if x.on {
							caps = append(caps, x.name)
						}
					}
					if len(c.EvictionPolicies) > 0 {
						caps = append(caps, "eviction:"+strings.Join(c.EvictionPolicies, "/"))
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
				seen[f.Name] = true
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", f.Name, configValue(reg, f), f.Kind, name, version, protocols, protocol, features, supports, path)
			}
			if len(found) == 0 {
				fmt.Fprintln(tw, "no kvx-* plugin binaries found in", strings.Join(h.SearchPath(), ", "), "; run `make build`")
			}
			for _, e := range slices.Concat(entries(reg.ManagerNames(), reg.ManagerBinary, "cache_manager"), entries(reg.BackendNames(), reg.BackendBinary, "attention_backend")) {
				if !seen[e[1]] {
					fmt.Fprintf(tw, "%s\t%s\tnot found\t-\t-\t-\t-\t-\t-\t-\n", e[1], e[0])
				}
			}
			return tw.Flush()
		},
	}
	cmd.Flags().StringArrayVar(&dirs, "plugin-dir", nil, "also look in this directory (repeatable)")
	return cmd
}

// configValue is the setting that picks f: "cache_manager: v1" for a
// registered binary, "cache_manager: PATH" (or attention_backend) for
// another plugin of a known kind, "-" otherwise.
func configValue(reg *registry.Registry, f host.Found) string {
	if key, name := reg.Named(f.Name); key != "" {
		return key + ": " + name
	}
	switch f.Kind {
	case pluginrpc.ManagerPluginName:
		return "cache_manager: PATH"
	case pluginrpc.WorkerPluginName:
		return "attention_backend: PATH"
	}
	return "-"
}

// entries pairs every registered name with its setting and binary:
// {"cache_manager: v1", "kvx-cachemgr-v1"}.
func entries(names []string, binary func(string) string, key string) [][2]string {
	out := make([][2]string, len(names))
	for i, n := range names {
		out[i] = [2]string{key + ": " + n, binary(n)}
	}
	return out
}

// featureText names a side's features for a table cell: "top_logprobs",
// a required one starred ("kv_events*"), "none", or "?" when only its
// handshake is known.
func featureText(c pluginrpc.Contract) string {
	if c.Features == nil && c.Required == nil && c.Build == "" {
		return "?"
	}
	var fs []string
	for _, f := range c.Features {
		if slices.Contains(c.Required, f) {
			fs = append(fs, string(f)+"*")
		} else {
			fs = append(fs, string(f))
		}
	}
	for _, f := range c.Required {
		if !slices.Contains(c.Features, f) {
			fs = append(fs, string(f)+"*")
		}
	}
	if len(fs) == 0 {
		return "none"
	}
	return strings.Join(fs, ",")
}
