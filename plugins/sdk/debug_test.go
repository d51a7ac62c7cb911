package sdk

import (
	"bufio"
	"context"
	"io"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/go-plugin"

	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
	"github.com/kvx-dev/kvx/plugins/v1/pluginrpc"
)

// infoOnly is a manager that answers Info; nothing else is called.
type infoOnly struct{ kvcache.Manager }

func (infoOnly) Info(context.Context) (kvcache.Info, error) {
	return kvcache.Info{Name: "debugged", Protocols: []int{kvcache.ProtocolVersion}}, nil
}

// TestServeDebug: debug mode prints the reattach line, named after the
// binary, for the newest transport protocol; a go-plugin client given that
// config talks to the plugin; cancelling the context stops it.
func TestServeDebug(t *testing.T) {
	t.Setenv("PLUGIN_PROTOCOL_VERSIONS", "") // serveDebug sets it; restored after the test
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	out, w := io.Pipe()
	done := make(chan error, 1)
	cfg := &plugin.ServeConfig{
		HandshakeConfig:  pluginrpc.Handshake,
		VersionedPlugins: pluginrpc.ServedPlugins(func() kvcache.Manager { return infoOnly{} }, nil),
		GRPCServer:       pluginrpc.NewGRPCServer,
		Logger:           hclog.NewNullLogger(),
	}
	go func() { done <- serveDebug(ctx, cfg, "/x/kvx-my-plugin", w) }()

	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		t.Fatalf("reading the reattach line: %v", err)
	}
	name, value, _ := strings.Cut(strings.TrimSpace(line), "=")
	if name != "KVX_REATTACH_MY_PLUGIN" || !strings.HasPrefix(value, "'") || !strings.HasSuffix(value, "'") {
		t.Fatalf("printed %q, want KVX_REATTACH_MY_PLUGIN='json'", line)
	}
	r, err := pluginrpc.ParseReattach(strings.Trim(value, "'"))
	if err != nil {
		t.Fatal(err)
	}
	if r.Version != pluginrpc.InstancesProtocol || r.Pid != os.Getpid() || r.Protocol != string(plugin.ProtocolGRPC) {
		t.Errorf("reattach %+v, want version %d, pid %d, protocol grpc", r, pluginrpc.InstancesProtocol, os.Getpid())
	}

	rc, err := r.Config()
	if err != nil {
		t.Fatal(err)
	}
	client := plugin.NewClient(&plugin.ClientConfig{
		HandshakeConfig:  pluginrpc.Handshake,
		Plugins:          pluginrpc.HostPlugins()[r.Version],
		Reattach:         rc,
		AllowedProtocols: []plugin.Protocol{plugin.ProtocolGRPC},
		Logger:           hclog.NewNullLogger(),
	})
	defer client.Kill()
	rpc, err := client.Client()
	if err != nil {
		t.Fatalf("reattach: %v", err)
	}
	raw, err := rpc.Dispense(pluginrpc.ManagerPluginName)
	if err != nil {
		t.Fatal(err)
	}
	if info, err := raw.(kvcache.Manager).Info(ctx); err != nil || info.Name != "debugged" {
		t.Errorf("Info() through the reattached client = %+v, %v; want the served manager", info, err)
	}

	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("serveDebug after cancel: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("serveDebug did not return within 10s of cancel")
	}
}

func TestDebugName(t *testing.T) {
	for _, tc := range []struct {
		debug, cookie, want string
	}{
		{"", "", ""},
		{"0", "", ""},
		{"1", "", os.Args[0]},
		{"true", "", os.Args[0]},
		{"kvx-fifo", "", "kvx-fifo"},
		{"1", pluginrpc.Handshake.MagicCookieValue, ""}, // started by a host: serve normally
	} {
		t.Setenv(DebugEnv, tc.debug)
		t.Setenv(pluginrpc.Handshake.MagicCookieKey, tc.cookie)
		if got := debugName(); got != tc.want {
			t.Errorf("%s=%q, cookie %q: debugName() = %q, want %q", DebugEnv, tc.debug, tc.cookie, got, tc.want)
		}
	}
}
