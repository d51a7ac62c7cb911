package sdk

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"os"
	"os/signal"
	"path/filepath"
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
//	KVX_REATTACH_FIFO='{"protocol":"grpc","version":2,"network":"unix","address":"/tmp/plugin123","pid":4242}'
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

// ReattachEnvPrefix starts the name of every reattach variable (ReattachEnv).
// kvx's config loader leaves these variables alone: they are not config keys.
const ReattachEnvPrefix = "KVX_REATTACH_"

// ReattachEnv returns the name of the variable through which kvx attaches to
// a running plugin binary (a path or a file name): ReattachEnvPrefix and the
// file name without "kvx-", upper-cased, with every character other than a
// letter or a digit replaced by '_'. kvx-fifo and ./bin/kvx-fifo give
// KVX_REATTACH_FIFO; kvx-cachemgr-v1 gives KVX_REATTACH_CACHEMGR_V1.
func ReattachEnv(binary string) string {
	name := strings.TrimPrefix(filepath.Base(binary), "kvx-")
	return ReattachEnvPrefix + strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z':
			return r - 'a' + 'A'
		case r >= 'A' && r <= 'Z', r >= '0' && r <= '9':
			return r
		}
		return '_'
	}, name)
}

// Reattach says where a running plugin listens: the value of its reattach
// variable, as JSON. It is go-plugin's ReattachConfig in a form that
// survives a shell.
type Reattach struct {
	Protocol string `json:"protocol"` // "grpc"
	Version  int    `json:"version"`  // the transport protocol version it serves (go-plugin's negotiated version)
	Network  string `json:"network"`  // "unix" or "tcp"
	Address  string `json:"address"`  // socket path or host:port
	Pid      int    `json:"pid"`
}

// ParseReattach reads the value of a reattach variable. Every field must be
// set; the error names what is missing.
func ParseReattach(s string) (Reattach, error) {
	var r Reattach
	dec := json.NewDecoder(strings.NewReader(s))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&r); err != nil {
		return Reattach{}, fmt.Errorf("reattach config %q: %v; want JSON like %s", s, err, Reattach{"grpc", 2, "unix", "/tmp/plugin123", 4242}.JSON())
	}
	var missing []string
	for _, f := range []struct {
		name string
		ok   bool
	}{
		{"protocol", r.Protocol != ""}, {"version", r.Version > 0}, {"network", r.Network != ""},
		{"address", r.Address != ""}, {"pid", r.Pid > 0},
	} {
		if !f.ok {
			missing = append(missing, f.name)
		}
	}
	if len(missing) > 0 {
		return Reattach{}, fmt.Errorf("reattach config %q: %s missing", s, strings.Join(missing, ", "))
	}
	return r, nil
}

// JSON is r as the value of a reattach variable.
func (r Reattach) JSON() string {
	b, _ := json.Marshal(r) // a struct of strings and ints cannot fail
	return string(b)
}

// Config returns the go-plugin reattach config of r, for
// plugin.ClientConfig.Reattach. It is in go-plugin's test mode: the client
// never kills the process, which belongs to whoever started it.
func (r Reattach) Config() (*plugin.ReattachConfig, error) {
	var addr net.Addr
	var err error
	switch r.Network {
	case "unix":
		addr, err = net.ResolveUnixAddr("unix", r.Address)
	case "tcp":
		addr, err = net.ResolveTCPAddr("tcp", r.Address)
	default:
		err = fmt.Errorf("network %q; want unix or tcp", r.Network)
	}
	if err != nil {
		return nil, fmt.Errorf("reattach config: %w", err)
	}
	return &plugin.ReattachConfig{Protocol: plugin.Protocol(r.Protocol), ProtocolVersion: r.Version,
		Addr: addr, Pid: r.Pid, Test: true}, nil
}

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
		r := Reattach{Protocol: string(rc.Protocol), Version: rc.ProtocolVersion,
			Network: rc.Addr.Network(), Address: rc.Addr.String(), Pid: rc.Pid}
		name := ReattachEnv(binary)
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
