// Package pluginrpc carries contract v1 (plugins/v1/kvcache and
// plugins/v1/worker) over hashicorp/go-plugin with gRPC.
//
// The host side dispenses a *ManagerClient or *WorkerClient, which satisfy
// kvcache.Manager and worker.Worker: the core cannot tell them from an
// in-process implementation. The plugin side registers an implementation
// with ManagerPlugin or WorkerPlugin (plugin authors use plugins/sdk, which
// does that for them).
//
// # Wire
//
// The protocol is plugins/proto/kvx/v1/kvx.proto; its generated code stays
// internal. One converter per message translates each way. Calls are
// batch-granular and unary; ctx deadlines and cancellation cross the wire.
//
// # Errors
//
// A method's error crosses as a gRPC status: the code comes from the
// kvcache.Kind (one table, see errors.go), the message is the error text and
// a detail carries kvcache.Error.Seqs. The client rebuilds a *kvcache.Error,
// so errors.Is(err, kvcache.ErrCorrupt), kvcache.KindOf and Seqs work as
// in-process. A result returned together with an error (Commit after applying
// the valid items) crosses too. Transport failures (plugin killed, connection
// gone) come back as kind KindUnavailable; a call cut short by the caller's
// own ctx comes back wrapping ctx.Err().
//
// # Concurrency
//
// The contract lets the core call a plugin from one goroutine at a time; the
// server side serializes each instance's calls anyway, so a manager or
// worker never sees two at once. Clients are safe for concurrent use (calls
// queue at the server).
//
// # Instances
//
// Under the transport protocol (Protocol, see contract.go and instances.go) one
// plugin process serves an instance per pipeline stage, each made by the
// plugin's factory; the host gets the further instances of a process with
// NewInstance. The instances share the process's data plane: their calls
// are pipelined on it, the plugin serves the frames in order and answers
// the frames that came together in one write, and a forward over every
// stage is one chained call (pipeline.Chainer). Calls started on several
// instances (pipeline.CallStarter, pipeline.StepStarter) go in one write,
// and a started chained forward (pipeline.ChainStarter) runs while the caller
// goes on.
//
// # Data plane
//
// The per-step calls travel as frames on a data plane beside gRPC
// (plugins/internal/plane; the stubs that choose it are in stubs.go), in
// one version per system: on Linux in two byte rings in shared memory, the
// socket then carrying only doorbells and hang-ups (version 3); elsewhere
// on the unix socket (version 2). A plugin without a data plane is called
// over gRPC for everything; GRPCOnly keeps every call on gRPC.
package pluginrpc

import (
	"context"

	"github.com/hashicorp/go-plugin"
	"google.golang.org/grpc"

	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
	"github.com/kvx-dev/kvx/plugins/v1/worker"
)

// Handshake is the go-plugin handshake of every kvx plugin. The cookie only
// keeps plugin binaries from being run by hand; the protocol version,
// Protocol (contract.go), is the key of the plugin sets (ServedPlugins,
// HostPlugins).
var Handshake = plugin.HandshakeConfig{
	ProtocolVersion:  Protocol,
	MagicCookieKey:   "KVX_PLUGIN",
	MagicCookieValue: "kvx-plugin-5b0e3c1d7a9f",
}

// Names under which the plugins are dispensed.
const (
	ManagerPluginName = "cachemanager"
	WorkerPluginName  = "worker"
)

// LogLevelEnv names the environment variable from which a plugin takes its
// default log level ("trace", "debug", "info", "warn", "error"); the host
// sets it from its own logger's level.
const LogLevelEnv = "KVX_PLUGIN_LOG_LEVEL"

// MaxMessageBytes bounds one gRPC message in either direction. Forward
// carries a stage's activations (Batch.Hidden, Result.Hidden), which can reach
// hundreds of MiB for a long prefill chunk of a large model.
const MaxMessageBytes = 1 << 30

// ServedPlugins returns the plugin sets a plugin binary passes to
// plugin.ServeConfig: under Protocol, the one transport protocol,
// the process serves as many instances as the host asks for, one per call
// of the factory (instance 0 is made before serving). A nil factory leaves
// that kind unserved: its gRPC service is not registered, and calling it
// answers KindUnsupported.
func ServedPlugins(newManager func() kvcache.Manager, newWorker func() worker.Worker) map[int]plugin.PluginSet {
	set := plugin.PluginSet{ManagerPluginName: &ManagerPlugin{}, WorkerPluginName: &WorkerPlugin{}}
	if newManager != nil {
		set[ManagerPluginName] = &ManagerPlugin{New: firstThen(newManager(), newManager)}
	}
	if newWorker != nil {
		set[WorkerPluginName] = &WorkerPlugin{New: firstThen(newWorker(), newWorker)}
	}
	return map[int]plugin.PluginSet{Protocol: set}
}

// firstThen returns first on its first call and what more makes after: the
// instance made before serving is instance 0. Its callers are serialized
// (instances.get).
func firstThen[T any](first T, more func() T) func() T {
	used := false
	return func() T {
		if used {
			return more()
		}
		used = true
		return first
	}
}

// HostPlugins returns the plugin sets a host passes to plugin.ClientConfig,
// whose clients are made with opts: the dispensed client is instance 0 of
// its process, and NewInstance makes the others.
func HostPlugins(opts ...ClientOption) map[int]plugin.PluginSet {
	return map[int]plugin.PluginSet{
		Protocol: {
			ManagerPluginName: &ManagerPlugin{ClientOptions: opts},
			WorkerPluginName:  &WorkerPlugin{ClientOptions: opts},
		},
	}
}

// NewGRPCServer makes the gRPC server a plugin serves on: opts (TLS from
// go-plugin) plus message limits raised to MaxMessageBytes. It fits
// plugin.ServeConfig.GRPCServer.
func NewGRPCServer(opts []grpc.ServerOption) *grpc.Server {
	opts = append(opts, grpc.MaxRecvMsgSize(MaxMessageBytes), grpc.MaxSendMsgSize(MaxMessageBytes),
		grpc.InitialWindowSize(windowBytes), grpc.InitialConnWindowSize(windowBytes),
		grpc.NumStreamWorkers(2))
	return grpc.NewServer(opts...)
}

// windowBytes is the HTTP/2 flow-control window of both ends. A fixed
// window, larger than a 256-request step's messages, turns off gRPC's
// bandwidth-delay probing (a ping per data burst) which only costs time on
// a local socket.
const windowBytes = 4 << 20

// DialOptions are the client options the host passes to go-plugin
// (plugin.ClientConfig.GRPCDialOptions); they match NewGRPCServer.
func DialOptions() []grpc.DialOption {
	return []grpc.DialOption{
		grpc.WithInitialWindowSize(windowBytes),
		grpc.WithInitialConnWindowSize(windowBytes),
	}
}

// ManagerPlugin is the go-plugin plugin.GRPCPlugin of a cache manager. On
// the plugin side Impl is served; on the host side Impl is nil and
// GRPCClient dispenses a *ManagerClient.
type ManagerPlugin struct {
	plugin.NetRPCUnsupportedPlugin
	Impl kvcache.Manager
	// New, when set, makes the manager of each instance the host asks for;
	// it takes precedence over Impl, which is served as the only instance
	// (TestManagerPair).
	New           func() kvcache.Manager
	ClientOptions []ClientOption // host side: how GRPCClient makes the client
	// Contract, when set, is what the plugin's Hello answers instead of
	// Current() (tests that play a plugin of another revision).
	Contract *Contract
}

var _ plugin.GRPCPlugin = (*ManagerPlugin)(nil)

// GRPCServer registers the Contract service and New's instances or Impl
// on s; with neither, only the Contract service.
func (p *ManagerPlugin) GRPCServer(_ *plugin.GRPCBroker, s *grpc.Server) error {
	registerContract(s, p.Contract)
	switch {
	case p.New != nil:
		registerManagers(s, p.New)
	case p.Impl != nil:
		RegisterManagerServer(s, p.Impl)
	}
	return nil
}

// GRPCClient returns a *ManagerClient on c. go-plugin passes a ctx that ends
// when the plugin process exits; the client uses it to fail fast.
func (p *ManagerPlugin) GRPCClient(ctx context.Context, _ *plugin.GRPCBroker, c *grpc.ClientConn) (any, error) {
	return NewManagerClient(ctx, c, p.ClientOptions...), nil
}

// WorkerPlugin is the go-plugin plugin.GRPCPlugin of a worker; see
// ManagerPlugin.
type WorkerPlugin struct {
	plugin.NetRPCUnsupportedPlugin
	Impl          worker.Worker
	New           func() worker.Worker // see ManagerPlugin.New
	ClientOptions []ClientOption       // host side: how GRPCClient makes the client
	Contract      *Contract            // see ManagerPlugin.Contract
}

var _ plugin.GRPCPlugin = (*WorkerPlugin)(nil)

// GRPCServer registers the Contract service and New's instances or Impl
// on s; with neither, only the Contract service.
func (p *WorkerPlugin) GRPCServer(_ *plugin.GRPCBroker, s *grpc.Server) error {
	registerContract(s, p.Contract)
	switch {
	case p.New != nil:
		registerWorkers(s, p.New)
	case p.Impl != nil:
		RegisterWorkerServer(s, p.Impl)
	}
	return nil
}

// GRPCClient returns a *WorkerClient on c; see ManagerPlugin.GRPCClient.
func (p *WorkerPlugin) GRPCClient(ctx context.Context, _ *plugin.GRPCBroker, c *grpc.ClientConn) (any, error) {
	return NewWorkerClient(ctx, c, p.ClientOptions...), nil
}

// callOpts lift the client-side message limits for every call.
var callOpts = []grpc.CallOption{
	grpc.MaxCallRecvMsgSize(MaxMessageBytes),
	grpc.MaxCallSendMsgSize(MaxMessageBytes),
}
