package pluginrpc

import (
	"context"

	"google.golang.org/grpc"

	"github.com/kvx-dev/kvx/plugins/internal/kvxpb"
	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
	"github.com/kvx-dev/kvx/plugins/v1/worker"
)

// WorkerClient is a worker.Worker whose calls go to a plugin over gRPC. It
// is safe for concurrent use; errors are as for ManagerClient.
type WorkerClient struct {
	rpc  kvxpb.WorkerClient
	done <-chan struct{}
}

var _ worker.Worker = (*WorkerClient)(nil)

// NewWorkerClient returns a client on cc; see NewManagerClient for lifetime.
func NewWorkerClient(lifetime context.Context, cc grpc.ClientConnInterface, opts ...ClientOption) *WorkerClient {
	rpc := &workerRPC{WorkerClient: kvxpb.NewWorkerClient(cc)}
	rpc.opener.off = clientOpts(opts).grpcOnly
	return &WorkerClient{rpc: rpc, done: lifetime.Done()}
}

// Done is closed when the plugin process has exited (never, for clients
// without a process lifetime).
func (c *WorkerClient) Done() <-chan struct{} { return c.done }

const workerService = "Worker."

// Info implements worker.Worker.
func (c *WorkerClient) Info(ctx context.Context) (worker.Info, error) {
	const m = workerService + "Info"
	if exited(c.done) {
		return worker.Info{}, errExited(m)
	}
	resp, err := c.rpc.Info(ctx, &kvxpb.WorkerInfoRequest{}, callOpts...)
	if err != nil {
		partial := new(kvxpb.WorkerInfo)
		err = fromStatus(ctx, c.done, m, err, partial)
		return fromProtoWorkerInfo(partial), err
	}
	return fromProtoWorkerInfo(resp), nil
}

// Configure implements worker.Worker.
func (c *WorkerClient) Configure(ctx context.Context, cfg worker.Config) (worker.Setup, error) {
	const m = workerService + "Configure"
	if exited(c.done) {
		return worker.Setup{}, errExited(m)
	}
	req, err := toProtoWorkerConfig(cfg)
	if err != nil {
		return worker.Setup{}, kvcache.Errorf(kvcache.KindInvalidConfig, "kvx plugin %s: %v", m, err)
	}
	resp, err := c.rpc.Configure(ctx, req, callOpts...)
	if err != nil {
		partial := new(kvxpb.Setup)
		err = fromStatus(ctx, c.done, m, err, partial)
		return fromProtoSetup(partial), err
	}
	return fromProtoSetup(resp), nil
}

// Forward implements worker.Worker.
func (c *WorkerClient) Forward(ctx context.Context, b worker.Batch) (worker.Result, error) {
	const m = workerService + "Forward"
	if exited(c.done) {
		return worker.Result{}, errExited(m)
	}
	resp, err := c.rpc.Forward(ctx, toProtoBatch(&b), callOpts...)
	if err != nil {
		partial := new(kvxpb.Result)
		err = fromStatus(ctx, c.done, m, err, partial)
		res, _ := fromProtoResult(partial)
		return res, err
	}
	res, err := fromProtoResult(resp)
	if err != nil {
		return worker.Result{}, malformed(m, err)
	}
	return res, nil
}

// CopyBlocks implements worker.Worker.
func (c *WorkerClient) CopyBlocks(ctx context.Context, copies []kvcache.Copy) error {
	const m = workerService + "CopyBlocks"
	if exited(c.done) {
		return errExited(m)
	}
	if _, err := c.rpc.CopyBlocks(ctx, toProtoCopyBlocksRequest(copies), callOpts...); err != nil {
		return fromStatus(ctx, c.done, m, err, nil)
	}
	return nil
}

// Health implements worker.Worker.
func (c *WorkerClient) Health(ctx context.Context) error {
	const m = workerService + "Health"
	if exited(c.done) {
		return errExited(m)
	}
	if _, err := c.rpc.Health(ctx, &kvxpb.HealthRequest{}, callOpts...); err != nil {
		return fromStatus(ctx, c.done, m, err, nil)
	}
	return nil
}

// RegisterWorkerServer serves w as the Worker service on s, one call at a
// time (see RegisterManagerServer).
func RegisterWorkerServer(s grpc.ServiceRegistrar, w worker.Worker) {
	kvxpb.RegisterWorkerServer(s, &workerServer{impl: w, gate: newGate()})
}

type workerServer struct {
	kvxpb.UnimplementedWorkerServer
	impl worker.Worker
	gate gate
}

func (s *workerServer) Info(ctx context.Context, _ *kvxpb.WorkerInfoRequest) (*kvxpb.WorkerInfo, error) {
	if err := s.gate.enter(ctx); err != nil {
		return nil, toStatus(err, nil)
	}
	defer s.gate.leave()
	info, err := s.impl.Info(ctx)
	out := toProtoWorkerInfo(info)
	if err != nil {
		return nil, toStatus(err, out)
	}
	return out, nil
}

func (s *workerServer) Configure(ctx context.Context, req *kvxpb.WorkerConfig) (*kvxpb.Setup, error) {
	cfg, err := fromProtoWorkerConfig(req)
	if err != nil {
		return nil, toStatus(err, nil)
	}
	if err := s.gate.enter(ctx); err != nil {
		return nil, toStatus(err, nil)
	}
	defer s.gate.leave()
	setup, err := s.impl.Configure(ctx, cfg)
	out := toProtoSetup(setup)
	if err != nil {
		return nil, toStatus(err, out)
	}
	return out, nil
}

func (s *workerServer) Forward(ctx context.Context, req *kvxpb.Batch) (*kvxpb.Result, error) {
	if err := s.gate.enter(ctx); err != nil {
		return nil, toStatus(err, nil)
	}
	defer s.gate.leave()
	b, err := fromProtoBatch(req)
	if err != nil {
		return nil, toStatus(err, nil)
	}
	res, err := s.impl.Forward(ctx, b)
	out := toProtoResult(&res)
	if err != nil {
		return nil, toStatus(err, out)
	}
	return out, nil
}

func (s *workerServer) CopyBlocks(ctx context.Context, req *kvxpb.CopyBlocksRequest) (*kvxpb.Empty, error) {
	if err := s.gate.enter(ctx); err != nil {
		return nil, toStatus(err, nil)
	}
	defer s.gate.leave()
	copies, err := fromProtoCopyBlocksRequest(req)
	if err != nil {
		return nil, toStatus(err, nil)
	}
	if err := s.impl.CopyBlocks(ctx, copies); err != nil {
		return nil, toStatus(err, nil)
	}
	return &kvxpb.Empty{}, nil
}

func (s *workerServer) Health(ctx context.Context, _ *kvxpb.HealthRequest) (*kvxpb.Empty, error) {
	if err := s.gate.enter(ctx); err != nil {
		return nil, toStatus(err, nil)
	}
	defer s.gate.leave()
	if err := s.impl.Health(ctx); err != nil {
		return nil, toStatus(err, nil)
	}
	return &kvxpb.Empty{}, nil
}
