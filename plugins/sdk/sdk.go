// Package sdk is the entry point for plugin authors: a plugin binary's main
// calls ServeCacheManager or ServeWorker with a factory for its
// implementation, and the kvx host (core/host) launches the binary, checks
// its Info and talks to it over gRPC as if it were in-process.
//
//	func main() {
//		sdk.ServeCacheManager(func() kvcache.Manager { return mymanager.New() })
//	}
//
// Name the binary kvx-<something> and put it next to kvx, in ./bin, or in a
// directory the host searches. Run by hand (without the host), it prints a
// notice and exits with status 1, unless DebugEnv is set: then it serves in
// debug mode (see debug.go), so that it can run under a debugger and kvx
// attaches to it.
//
// Logging: the plugin's stdout belongs to go-plugin's handshake. Log through
// hclog.Default(), which the SDK sets to its logger before it calls the
// factory. By default that logger writes JSON lines to the process's stderr,
// which the host parses and re-logs under the plugin's name at their own
// level. The default level comes from KVX_PLUGIN_LOG_LEVEL (the host sets it
// from its own level), else info.
package sdk

import (
	"os"
	"runtime"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/go-plugin"

	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
	"github.com/kvx-dev/kvx/plugins/v1/pluginrpc"
	"github.com/kvx-dev/kvx/plugins/v1/worker"
)

// Option configures Serve*.
type Option func(*options)

type options struct {
	logger hclog.Logger
}

// WithLogger replaces the default logger. It should write JSON lines to
// stderr (hclog's JSONFormat), or the host shows its lines as plain text at
// debug level.
func WithLogger(l hclog.Logger) Option {
	return func(o *options) { o.logger = l }
}

// DefaultLogger is the logger Serve* uses without WithLogger: JSON to
// stderr, level from pluginrpc.LogLevelEnv (info when unset or invalid).
func DefaultLogger() hclog.Logger {
	level := hclog.LevelFromString(os.Getenv(pluginrpc.LogLevelEnv))
	if level == hclog.NoLevel {
		level = hclog.Info
	}
	return hclog.New(&hclog.LoggerOptions{
		Output:     os.Stderr,
		JSONFormat: true,
		Level:      level,
	})
}

// ServeCacheManager serves the managers factory makes, contract v1, until
// the host closes the connection or kills the process. The factory is
// called once before serving, and once more for each further instance the
// host asks for: a kvx host runs one process per plugin binary and one
// instance per pipeline stage (pluginrpc.InstancesProtocol). Instances
// share nothing but the process.
// It does not return while serving; when started by hand (no handshake
// cookie) it exits the process with status 1. In debug mode (DebugEnv) it
// returns once interrupted.
func ServeCacheManager(factory func() kvcache.Manager, opts ...Option) {
	singleThread()
	logger := setup(opts)
	serve(pluginrpc.ServedPlugins(factory, nil), logger)
}

// ServeWorker serves the workers factory makes; see ServeCacheManager.
func ServeWorker(factory func() worker.Worker, opts ...Option) {
	singleThread()
	logger := setup(opts)
	serve(pluginrpc.ServedPlugins(nil, factory), logger)
}

// singleThread runs the plugin on one OS thread at a time. A plugin serves
// one call at a time (the contract), so further scheduler threads only spin
// between calls: on a 2-core host that costs the engine about a third of its
// step time. A worker whose device computes in parallel raises it again
// with runtime.GOMAXPROCS when configured; GOMAXPROCS in the environment
// always wins.
func singleThread() {
	if os.Getenv("GOMAXPROCS") == "" {
		runtime.GOMAXPROCS(1)
	}
}

// setup applies opts and installs the logger as hclog's default. The
// default logger is made here, before plugin.Serve redirects os.Stderr, so
// it writes to the real stderr that the host reads.
func setup(opts []Option) hclog.Logger {
	o := options{}
	for _, opt := range opts {
		opt(&o)
	}
	if o.logger == nil {
		o.logger = DefaultLogger()
		if debugName() != "" {
			o.logger = debugLogger()
		}
	}
	hclog.SetDefault(o.logger)
	return o.logger
}

func serve(plugins map[int]plugin.PluginSet, logger hclog.Logger) {
	cfg := &plugin.ServeConfig{
		HandshakeConfig:  pluginrpc.Handshake,
		VersionedPlugins: plugins,
		GRPCServer:       pluginrpc.NewGRPCServer,
		Logger:           logger,
	}
	if name := debugName(); name != "" {
		ctx, stop := debugContext()
		defer stop()
		if err := serveDebug(ctx, cfg, name, os.Stdout); err != nil {
			logger.Error("debug mode", "error", err)
			stop()
			os.Exit(1)
		}
		return
	}
	ignoreStopSignals()
	plugin.Serve(cfg)
}
