// Command kvx runs, compares and plans LLM-serving engine configurations
// whose cache managers and attention backends are plugins.
//
//	kvx run --config F [--set k=v]... [--json out.json]
//	kvx compare [--config F] --vary key=a,b[,c] [--json out.json]
//	kvx plan --config F
//	kvx generate --config F --prompts P.jsonl [--top-logprobs K] [--json out.json]
//	kvx serve --config F [--host 127.0.0.1] [--port 8000]
//	kvx bench --url http://127.0.0.1:8000 [--concurrency N | --rate R] [--json out.json] [--html out.html]
//	kvx plugins
//	kvx calibrate --config F [--out FILE] [--json] [--refit FILE]...
//
//	kvx --version
//
// Exit status: 0 when every run finished, 1 when an engine failed or an
// invariant broke (generate: or a prompt failed), 2 for bad configuration or
// usage (every variant's configuration, plugin paths and output paths are
// checked before the first run, and a plugin of the wrong kind or protocol
// is a configuration error too), 130, 143 or 129 when SIGINT, SIGTERM or
// SIGHUP stopped it (the partial report is written first; see signals.go).
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"runtime/pprof"

	"github.com/hashicorp/go-hclog"
	"github.com/spf13/cobra"
)

// exitError carries an exit status through cobra.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string { return e.err.Error() }
func (e *exitError) Unwrap() error { return e.err }

func usageErr(err error) error  { return &exitError{code: 2, err: err} }
func engineErr(err error) error { return &exitError{code: 1, err: err} }

func main() {
	ctx, in := signalContext(context.Background())
	root := newRoot()
	err := root.ExecuteContext(ctx)
	if sig, normal := in.caught(); sig != nil && !(normal && err == nil) {
		// An interrupt is not a failure of the run: say what stopped it.
		fmt.Fprintf(os.Stderr, "kvx: stopped by %s\n", signalName(sig))
		os.Exit(exitCode(sig))
	}
	if err == nil {
		return
	}
	fmt.Fprintln(os.Stderr, "kvx:", err)
	var ee *exitError
	if errors.As(err, &ee) {
		os.Exit(ee.code)
	}
	os.Exit(2)
}

// globals are the flags every command shares.
type globals struct {
	configs    []string
	sets       []string
	logLevel   string
	cpuProfile string
	memProfile string
}

func (g *globals) logger() hclog.Logger {
	return hclog.New(&hclog.LoggerOptions{Name: "kvx", Level: hclog.LevelFromString(g.logLevel), Output: os.Stderr})
}

func newRoot() *cobra.Command {
	g := &globals{}
	root := &cobra.Command{
		Use:           "kvx",
		Short:         "An LLM-serving engine whose KV cache managers and attention backends are plugins",
		SilenceUsage:  true,
		SilenceErrors: true,
		Version:       kvxVersion(),
	}
	root.SetVersionTemplate(versionText())
	root.PersistentFlags().StringArrayVarP(&g.configs, "config", "c", nil, "YAML config file (repeatable; later files override earlier ones)")
	root.PersistentFlags().StringArrayVar(&g.sets, "set", nil, "override one key, e.g. --set kv_cache_config.tokens_per_block=64 (repeatable)")
	root.PersistentFlags().StringVar(&g.logLevel, "log-level", "warn", "log level: trace, debug, info, warn, error")
	root.PersistentFlags().StringVar(&g.cpuProfile, "cpuprofile", "", "write a CPU profile of kvx itself to this file")
	root.PersistentFlags().StringVar(&g.memProfile, "memprofile", "", "write a heap profile of kvx itself to this file when the command ends (after a GC: what is still held)")
	root.PersistentPreRunE = func(*cobra.Command, []string) error {
		if g.memProfile != "" {
			// Refuse an unwritable path now, not after the run.
			f, err := os.Create(g.memProfile)
			if err != nil {
				return err
			}
			_ = f.Close()
		}
		if g.cpuProfile == "" {
			return nil
		}
		f, err := os.Create(g.cpuProfile)
		if err != nil {
			return err
		}
		return pprof.StartCPUProfile(f)
	}
	root.PersistentPostRun = func(*cobra.Command, []string) {
		if g.cpuProfile != "" {
			pprof.StopCPUProfile()
		}
		if g.memProfile != "" {
			writeHeapProfile(g.memProfile)
		}
	}
	root.AddCommand(newRunCmd(g), newCompareCmd(g), newPlanCmd(g), newGenerateCmd(g), newServeCmd(g), newPluginsCmd(g), newConformanceCmd(g), newCalibrateCmd(g), newBenchCmd(g))
	return root
}

// writeHeapProfile writes the heap profile of what is live after a GC to
// path (--memprofile); a failure is reported, not fatal: the command's
// work is done.
func writeHeapProfile(path string) {
	runtime.GC()
	f, err := os.Create(path)
	if err == nil {
		err = pprof.Lookup("heap").WriteTo(f, 0)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "kvx: --memprofile %s: %v\n", path, err)
	}
}
