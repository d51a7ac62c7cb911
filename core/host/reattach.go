package host

import (
	"fmt"
	"os"

	"github.com/hashicorp/go-plugin"

	"github.com/kvx-dev/kvx/plugins/v1/pluginrpc"
)

// Debug reattach: a plugin binary started by hand in the SDK's debug mode
// (sdk.DebugEnv, usually under a debugger) prints its reattach variable,
// such as
//
//	KVX_REATTACH_FIFO='{"protocol":"grpc","version":3,"network":"unix","address":"/tmp/plugin123","pid":4242}'
//
// With that variable in the host's environment, every launch of the binary
// it names (pluginrpc.ReattachEnv of the launch's path: ./bin/kvx-fifo and
// /opt/kvx/kvx-fifo alike) connects to the running process instead of
// starting one. The host never kills it: Process.Kill and Close leave it
// serving, and Process.Done closes when it exits. The plugin's own
// environment is its own: the host's log level and thread counts do not
// reach it.

// reattach points cfg at the running plugin named by path's reattach
// variable, when it is set; it leaves cfg alone otherwise. cfg's
// VersionedPlugins are the versions the host speaks.
func (h *Host) reattach(cfg *plugin.ClientConfig, path string) error {
	name := pluginrpc.ReattachEnv(path)
	value := os.Getenv(name)
	if value == "" {
		return nil
	}
	r, err := pluginrpc.ParseReattach(value)
	if err != nil {
		return fmt.Errorf("plugin %s: %s: %w", path, name, err)
	}
	set, ok := cfg.VersionedPlugins[r.Version]
	if !ok {
		return fmt.Errorf("plugin %s (%s): %w", path, name, protocolMismatch(r.Version, h.ours()))
	}
	rc, err := r.Config()
	if err != nil {
		return fmt.Errorf("plugin %s: %s: %w", path, name, err)
	}
	// A reattached client takes its plugin set from Plugins, and cannot
	// set up TLS: the plugin was not started with a client certificate.
	cfg.RunnerFunc, cfg.UnixSocketConfig, cfg.Reattach, cfg.Plugins, cfg.AutoMTLS = nil, nil, rc, set, false
	h.logger.Info("attaching to a plugin in debug mode", "path", path, "variable", name,
		"pid", r.Pid, "network", r.Network, "address", r.Address, "protocol", r.Version)
	return nil
}
