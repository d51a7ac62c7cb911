package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/kvx-dev/kvx/cmd/builtin"
	"github.com/kvx-dev/kvx/core/host"
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
				contract, features, what := f.Describe()
				name := f.Name
				if f.Shadowed {
					name += " (shadowed)"
				}
				seen[f.Name] = true
				row := fmt.Sprintf("%s\t%s\t%s\t%s\t%s", name, reg.Setting(f.Name, f.Kind), f.Kind, contract, features)
				if !oneDir {
					row += "\t" + f.Path
				}
				fmt.Fprintln(tw, row)
				about = append(about, [2]string{name, what})
			}
			if len(found) == 0 {
				fmt.Fprintln(tw, "no kvx-* plugin binaries found in", strings.Join(h.SearchPath(), ", "), "; run `make build`")
			}
			for _, e := range reg.Settings() {
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
