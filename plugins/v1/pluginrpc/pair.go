package pluginrpc

import (
	"context"
	"net"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/test/bufconn"

	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
	"github.com/kvx-dev/kvx/plugins/v1/worker"
)

// TestManagerPair serves m on an in-memory gRPC connection, through the same
// ManagerPlugin, server and converters as a plugin process, and returns the
// client end. Everything is torn down when the test ends. Conformance suites
// use it to run their checks over the wire without a process.
func TestManagerPair(t testing.TB, m kvcache.Manager) kvcache.Manager {
	t.Helper()
	p := newPair(t, func(s *grpc.Server) error { return (&ManagerPlugin{Impl: m}).GRPCServer(nil, s) })
	t.Cleanup(p.close)
	c, err := (&ManagerPlugin{}).GRPCClient(context.Background(), nil, p.conn)
	if err != nil {
		t.Fatalf("ManagerPlugin.GRPCClient: %v", err)
	}
	if _, err := c.(*ManagerClient).Negotiate(context.Background(), Current()); err != nil {
		t.Fatalf("Negotiate: %v", err)
	}
	return c.(*ManagerClient)
}

// TestWorkerPair is TestManagerPair for a worker.
func TestWorkerPair(t testing.TB, w worker.Worker) worker.Worker {
	t.Helper()
	p := newPair(t, func(s *grpc.Server) error { return (&WorkerPlugin{Impl: w}).GRPCServer(nil, s) })
	t.Cleanup(p.close)
	c, err := (&WorkerPlugin{}).GRPCClient(context.Background(), nil, p.conn)
	if err != nil {
		t.Fatalf("WorkerPlugin.GRPCClient: %v", err)
	}
	if _, err := c.(*WorkerClient).Negotiate(context.Background(), Current()); err != nil {
		t.Fatalf("Negotiate: %v", err)
	}
	return c.(*WorkerClient)
}

// pair is a gRPC server and a client connection to it over a listener.
type pair struct {
	server *grpc.Server
	conn   *grpc.ClientConn
}

// newPair serves on an in-memory listener.
func newPair(t testing.TB, register func(*grpc.Server) error) *pair {
	t.Helper()
	lis := bufconn.Listen(1 << 20)
	return newPairOn(t, lis, func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }, register)
}

func newPairOn(t testing.TB, lis net.Listener, dial func(context.Context, string) (net.Conn, error), register func(*grpc.Server) error) *pair {
	t.Helper()
	s := NewGRPCServer(nil)
	if err := register(s); err != nil {
		t.Fatalf("register plugin: %v", err)
	}
	go func() { _ = s.Serve(lis) }()
	conn, err := grpc.NewClient("passthrough:///kvx-plugin", append(DialOptions(),
		grpc.WithContextDialer(dial),
		grpc.WithTransportCredentials(insecure.NewCredentials()))...)
	if err != nil {
		s.Stop()
		t.Fatalf("grpc.NewClient: %v", err)
	}
	return &pair{server: s, conn: conn}
}

func (p *pair) close() {
	_ = p.conn.Close()
	p.server.Stop()
}

// TestManagerInstances serves the managers newManager makes as the
// instances of one plugin process on an in-memory gRPC
// connection, and returns n instance clients, which share its data plane.
// Torn down when the test ends.
func TestManagerInstances(t testing.TB, newManager func() kvcache.Manager, n int) []kvcache.Manager {
	t.Helper()
	p := newPair(t, func(s *grpc.Server) error { return (&ManagerPlugin{New: newManager}).GRPCServer(nil, s) })
	t.Cleanup(p.close)
	c, err := (&ManagerPlugin{}).GRPCClient(context.Background(), nil, p.conn)
	if err != nil {
		t.Fatalf("ManagerPlugin.GRPCClient: %v", err)
	}
	first := c.(*ManagerClient)
	ms := []kvcache.Manager{first}
	for len(ms) < n {
		m, err := first.NewInstance()
		if err != nil {
			t.Fatalf("NewInstance: %v", err)
		}
		ms = append(ms, m)
	}
	return ms
}

// TestWorkerInstances is TestManagerInstances for workers.
func TestWorkerInstances(t testing.TB, newWorker func() worker.Worker, n int) []worker.Worker {
	t.Helper()
	p := newPair(t, func(s *grpc.Server) error { return (&WorkerPlugin{New: newWorker}).GRPCServer(nil, s) })
	t.Cleanup(p.close)
	c, err := (&WorkerPlugin{}).GRPCClient(context.Background(), nil, p.conn)
	if err != nil {
		t.Fatalf("WorkerPlugin.GRPCClient: %v", err)
	}
	first := c.(*WorkerClient)
	ws := []worker.Worker{first}
	for len(ws) < n {
		w, err := first.NewInstance()
		if err != nil {
			t.Fatalf("NewInstance: %v", err)
		}
		ws = append(ws, w)
	}
	return ws
}
