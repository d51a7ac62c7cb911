package sdk

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"syscall"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/go-plugin"

	"github.com/kvx-dev/kvx/plugins/v1/pluginrpc"
)

// Debug mode: a plugin started by hand, under a debugger, that kvx attaches
// to instead of starting a process of its own.
//
//	KVX_PLUGIN_DEBUG=1 dlv exec ./bin/kvx-fifo       # or just ./bin/kvx-fifo
//	KVX_REATTACH_FIFO='{"protocol":"grpc","version":3,"network":"unix","address":"/tmp/plugin123","pid":4242}'
//
// The plugin serves until it is interrupted (Ctrl-C) or killed, and prints
// one line on stdout: the variable that tells kvx (core/host) where it
// listens. Export it in the shell that runs kvx; every launch of that plugin
// binary then attaches to the running process: kvx neither starts nor kills
// it. Each kvx run that attaches gets the plugin's instances again, from
// instance 0, and configures them afresh.

// DebugEnv names the environment variable that turns debug mode on: "1" or
// "true" names the reattach variable after the binary (os.Args[0]); any
// other non-empty value is taken as the binary's name (useful when a
// debugger builds it under a name of its own, as `dlv debug` does).
const DebugEnv = "KVX_PLUGIN_DEBUG"

// debugName returns the binary name debug mode is on for, or "" when it is
// off. A plugin that a host started (the handshake cookie is set) serves
// normally whatever DebugEnv says, so that a variable exported in the
// host's shell cannot stall every launch.
func debugName() string {
	if os.Getenv(pluginrpc.Handshake.MagicCookieKey) == pluginrpc.Handshake.MagicCookieValue {
		return ""
	}
	switch v := os.Getenv(DebugEnv); v {
	case "", "0", "false":
		return ""
	case "1", "true":
		return os.Args[0]
	default:
		return v
	}
}

// debugLogger is the default logger in debug mode: plain text for a person
// (no host reads the plugin's stderr), level from LogLevelEnv, else debug.
func debugLogger() hclog.Logger {
	l := DefaultLogger()
	level := l.GetLevel()
	if os.Getenv(pluginrpc.LogLevelEnv) == "" {
		level = hclog.Debug
	}
	return hclog.New(&hclog.LoggerOptions{Output: os.Stderr, Level: level})
}

// serveDebug serves cfg in go-plugin's test mode until ctx ends (or the
// server stops) and writes the reattach line for binary to out once it
// listens.
func serveDebug(ctx context.Context, cfg *plugin.ServeConfig, binary string, out io.Writer) error {
	// Without a host, nobody tells go-plugin which transport versions it
	// may use: offer every one served, so that it picks the newest.
	versions := make([]string, 0, len(cfg.VersionedPlugins))
	for _, v := range slices.Sorted(maps.Keys(cfg.VersionedPlugins)) {
		versions = append(versions, strconv.Itoa(v))
	}
	if err := os.Setenv("PLUGIN_PROTOCOL_VERSIONS", strings.Join(versions, ",")); err != nil {
		return err
	}
	reattach := make(chan *plugin.ReattachConfig, 1)
	closed := make(chan struct{})
	cfg.Test = &plugin.ServeTestConfig{Context: ctx, ReattachConfigCh: reattach, CloseCh: closed}
	go plugin.Serve(cfg)
	select {
	case rc := <-reattach:
		r := pluginrpc.Reattach{Protocol: string(rc.Protocol), Version: rc.ProtocolVersion,
			Network: rc.Addr.Network(), Address: rc.Addr.String(), Pid: rc.Pid}
		name := pluginrpc.ReattachEnv(binary)
		fmt.Fprintf(out, "%s='%s'\n", name, r.JSON())
		cfg.Logger.Info("debug mode: serving until interrupted; export the line above where kvx runs",
			"variable", name, "pid", rc.Pid, "address", r.Address)
	case <-closed:
		return errors.New("plugin server stopped before it listened (see the log above)")
	}
	<-closed
	return nil
}

// debugContext ends on SIGINT or SIGTERM, so that an interrupted debug
// plugin closes its socket before it exits.
func debugContext() (context.Context, context.CancelFunc) {
	return signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
}
