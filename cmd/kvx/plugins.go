package main

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/kvx-dev/kvx/cmd/builtin"
	"github.com/kvx-dev/kvx/core/host"
	"github.com/kvx-dev/kvx/core/registry"
	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
	"github.com/kvx-dev/kvx/plugins/v1/pluginrpc"
)

func newPluginsCmd(g *globals) *cobra.Command {
	var dirs []string
	cmd := &cobra.Command{
		Use:   "plugins",
		Short: "List the plugin binaries found, the config value that picks each, and what each supports",
		Args:  cobra.NoArgs,
		Long: `List the plugin binaries found, the config value that picks each, and what each supports.

The table gives each binary's config value, kind, contract (the kvcache
protocol versions and the wire protocol) and features ("all N" when it
offers every feature of this kvx's contract; otherwise the list, a required
one starred). Below it, each binary's name and version as it describes
itself and what it supports (mixers and capabilities), wrapped to 80
columns; the directory is printed once when every binary is in one.`,
		RunE: func(cmd *cobra.Command, _ []string) error {
			h := host.New(g.logger(), dirs)
			defer h.Close()
			found := h.Plugins()
			reg := builtin.Registry()
			oneDir := len(found) > 0
			for _, f := range found {
				oneDir = oneDir && filepath.Dir(f.Path) == filepath.Dir(found[0].Path)
			}
			tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
			head := "binary\tconfig\tkind\tcontract\tfeatures"
			if !oneDir {
				head += "\tpath"
			}
			fmt.Fprintln(tw, head)
			seen := map[string]bool{}
			var about [][2]string // binary, what it supports
			for _, f := range found {
				contract, features := "-", "-"
				if c := f.Contract; c != nil {
					contract, features = fmt.Sprintf("wire %d", c.Protocol), featureText(*c)
				}
				what := "-"
				switch {
				case f.Err != nil:
					what = "error: " + f.Err.Error()
				case f.Manager != nil:
					i := f.Manager
					contract = fmt.Sprintf("%v, %s", i.Protocols, contract)
					what = i.Name + " " + i.Version + ": " + managerSupports(i.Capabilities)
				case f.Worker != nil:
					i := f.Worker
					contract = fmt.Sprintf("%v, %s", i.Protocols, contract)
					var mx []string
					for _, m := range i.Mixers {
						if m == "" {
							mx = append(mx, "ffn-only")
							continue
						}
						mx = append(mx, string(m))
					}
					what = i.Name + " " + i.Version + ": device " + i.Device + ": " + strings.Join(mx, ", ")
				}
				name := f.Name
				if f.Shadowed {
					name += " (shadowed)"
				}
				seen[f.Name] = true
				row := fmt.Sprintf("%s\t%s\t%s\t%s\t%s", name, configValue(reg, f), f.Kind, contract, features)
				if !oneDir {
					row += "\t" + f.Path
				}
				fmt.Fprintln(tw, row)
				about = append(about, [2]string{name, what})
			}
			if len(found) == 0 {
				fmt.Fprintln(tw, "no kvx-* plugin binaries found in", strings.Join(h.SearchPath(), ", "), "; run `make build`")
			}
			for _, e := range slices.Concat(entries(reg.ManagerNames(), reg.ManagerBinary, "cache_manager"), entries(reg.BackendNames(), reg.BackendBinary, "attention_backend")) {
				if !seen[e[1]] {
					fmt.Fprintf(tw, "%s\t%s\tnot found\t-\t-\n", e[1], e[0])
				}
			}
			if err := tw.Flush(); err != nil {
				return err
			}
			if oneDir {
				fmt.Printf("found in %s\n", filepath.Dir(found[0].Path))
			}
			if len(about) > 0 {
				fmt.Println("\nwhat each supports (its name and version: mixers and capabilities):")
				width := 0
				for _, a := range about {
					width = max(width, len(a[0]))
				}
				for _, a := range about {
					for i, line := range wrapWords(a[1], 78-width-2) {
						label := ""
						if i == 0 {
							label = a[0]
						}
						fmt.Printf("  %-*s  %s\n", width, label, line)
					}
				}
			}
			return nil
		},
	}
	cmd.Flags().StringArrayVar(&dirs, "plugin-dir", nil, "also look in this directory (repeatable)")
	return cmd
}

// managerSupports lists a manager's mixers and capabilities.
func managerSupports(c kvcache.Capabilities) string {
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
	return strings.Join(caps, ", ")
}

// wrapWords breaks s at spaces into lines of at most width bytes (a word
// longer than width gets a line of its own).
func wrapWords(s string, width int) []string {
	var lines []string
	line := ""
	for _, w := range strings.Fields(s) {
		switch {
		case line == "":
			line = w
		case len(line)+1+len(w) <= width:
			line += " " + w
		default:
			lines = append(lines, line)
			line = w
		}
	}
	return append(lines, line)
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

// featureText names a side's features for a table cell: "all N" when they
// are exactly this kvx's N and none is required, else featureList.
func featureText(c pluginrpc.Contract) string {
	all := pluginrpc.Current().Features
	if len(c.Required) == 0 && len(c.Features) == len(all) && !slices.ContainsFunc(all, func(f pluginrpc.Feature) bool { return !c.Has(f) }) {
		return fmt.Sprintf("all %d", len(all))
	}
	return featureList(c)
}

// featureList names a side's features: "top_logprobs,kv_events*" (a
// required one starred), "none", or "?" when only its handshake is known.
func featureList(c pluginrpc.Contract) string {
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
