package pluginrpc

import (
	"context"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/kvx-dev/kvx/plugins/internal/kvxpb"
	"github.com/kvx-dev/kvx/plugins/internal/plane"
)

// The per-step calls' stubs: each goes as a frame on the data plane
// (plugins/internal/plane) when the plugin opened one, else over gRPC; the
// servers answer the frames with the same methods as the gRPC calls.

// ClientOption configures a ManagerClient or WorkerClient.
type ClientOption func(*clientOptions)

type clientOptions struct {
	grpcOnly bool
}

// GRPCOnly keeps every call of the client on gRPC: it never opens a data
// plane (for comparisons, and for plugins whose host cannot share a local
// socket).
func GRPCOnly() ClientOption { return func(o *clientOptions) { o.grpcOnly = true } }

func clientOpts(opts []ClientOption) clientOptions {
	var o clientOptions
	for _, f := range opts {
		f(&o)
	}
	return o
}

// viaPlane sends one call to instance inst over plane p, or over gRPC when
// p is nil.
func viaPlane[Req proto.Message, Resp any, PResp interface {
	*Resp
	proto.Message
}](ctx context.Context, p *plane.Plane, inst uint16, m plane.Method, in Req, overGRPC func(context.Context, Req, ...grpc.CallOption) (PResp, error), opts []grpc.CallOption) (PResp, error) {
	if p == nil {
		return overGRPC(ctx, in, opts...)
	}
	out := PResp(new(Resp))
	if err := p.Call(ctx, inst, m, in, out); err != nil {
		return nil, err
	}
	return out, nil
}

// managerRPC is the host's CacheManager stub of one instance: the per-step
// calls go over the data plane when the plugin offers one, everything else
// over gRPC. The instances of one process share the opener, so their calls
// travel on one plane.
type managerRPC struct {
	kvxpb.CacheManagerClient
	opener *plane.Opener
	inst   uint16
}

func (r *managerRPC) plane(context.Context) *plane.Plane {
	return r.opener.Get(func(ctx context.Context, req *kvxpb.DataPlaneRequest) (grpc.ServerStreamingClient[kvxpb.DataPlane], error) {
		return r.CacheManagerClient.OpenDataPlane(ctx, req, callOpts...)
	})
}

// The control-plane calls travel on gRPC: corked calls go first.

func (r *managerRPC) Configure(ctx context.Context, in *kvxpb.ManagerConfig, opts ...grpc.CallOption) (*kvxpb.Layout, error) {
	r.flush(ctx)
	return r.CacheManagerClient.Configure(ctx, in, opts...)
}

func (r *managerRPC) Stats(ctx context.Context, in *kvxpb.StatsRequest, opts ...grpc.CallOption) (*kvxpb.ManagerStats, error) {
	r.flush(ctx)
	return r.CacheManagerClient.Stats(ctx, in, opts...)
}

func (r *managerRPC) Inspect(ctx context.Context, in *kvxpb.InspectOptions, opts ...grpc.CallOption) (*kvxpb.Snapshot, error) {
	r.flush(ctx)
	return r.CacheManagerClient.Inspect(ctx, in, opts...)
}

// flush sends the corked calls of an open plane; it opens none.
func (r *managerRPC) flush(ctx context.Context) {
	if p := r.opener.Current(); p != nil {
		p.Flush(ctx)
	}
}

func (r *managerRPC) Lookup(ctx context.Context, in *kvxpb.LookupRequest, opts ...grpc.CallOption) (*kvxpb.LookupResponse, error) {
	return viaPlane(ctx, r.plane(ctx), r.inst, plane.Lookup, in, r.CacheManagerClient.Lookup, opts)
}

func (r *managerRPC) Reserve(ctx context.Context, in *kvxpb.ReserveRequest, opts ...grpc.CallOption) (*kvxpb.ReserveResponse, error) {
	return viaPlane(ctx, r.plane(ctx), r.inst, plane.Reserve, in, r.CacheManagerClient.Reserve, opts)
}

func (r *managerRPC) Unreserve(ctx context.Context, in *kvxpb.Seqs, opts ...grpc.CallOption) (*kvxpb.Empty, error) {
	return viaPlane(ctx, r.plane(ctx), r.inst, plane.Unreserve, in, r.CacheManagerClient.Unreserve, opts)
}

func (r *managerRPC) Commit(ctx context.Context, in *kvxpb.CommitRequest, opts ...grpc.CallOption) (*kvxpb.CommitResult, error) {
	return viaPlane(ctx, r.plane(ctx), r.inst, plane.Commit, in, r.CacheManagerClient.Commit, opts)
}

func (r *managerRPC) Suspend(ctx context.Context, in *kvxpb.Seqs, opts ...grpc.CallOption) (*kvxpb.MoveResult, error) {
	return viaPlane(ctx, r.plane(ctx), r.inst, plane.Suspend, in, r.CacheManagerClient.Suspend, opts)
}

func (r *managerRPC) Resume(ctx context.Context, in *kvxpb.Seqs, opts ...grpc.CallOption) (*kvxpb.MoveResult, error) {
	return viaPlane(ctx, r.plane(ctx), r.inst, plane.Resume, in, r.CacheManagerClient.Resume, opts)
}

func (r *managerRPC) Release(ctx context.Context, in *kvxpb.Seqs, opts ...grpc.CallOption) (*kvxpb.Empty, error) {
	return viaPlane(ctx, r.plane(ctx), r.inst, plane.Release, in, r.CacheManagerClient.Release, opts)
}

func (r *managerRPC) EndStep(ctx context.Context, in *kvxpb.EndStepRequest, opts ...grpc.CallOption) (*kvxpb.EndStepResult, error) {
	return viaPlane(ctx, r.plane(ctx), r.inst, plane.EndStep, in, r.CacheManagerClient.EndStep, opts)
}

// handlers are the framed calls a manager server answers.
func (s *managerServer) handlers() map[plane.Method]plane.Handler {
	s.once.Do(func() { s.framed = s.makeHandlers() })
	return s.framed
}

func (s *managerServer) makeHandlers() map[plane.Method]plane.Handler {
	return map[plane.Method]plane.Handler{
		plane.Lookup:    plane.Handle(s.Lookup),
		plane.Reserve:   plane.Handle(s.Reserve),
		plane.Unreserve: plane.Handle(s.Unreserve),
		plane.Commit:    plane.Handle(s.Commit),
		plane.Suspend:   plane.Handle(s.Suspend),
		plane.Resume:    plane.Handle(s.Resume),
		plane.Release:   plane.Handle(s.Release),
		plane.EndStep:   plane.Handle(s.EndStep),
	}
}

// OpenDataPlane implements the CacheManager service.
func (s *managerServer) OpenDataPlane(req *kvxpb.DataPlaneRequest, stream grpc.ServerStreamingServer[kvxpb.DataPlane]) error {
	return plane.Serve(req, stream, s.routes())
}

// routes returns the handlers of the instances that the plane serves: the
// process's instances (registerManagers), or s alone as instance 0.
func (s *managerServer) routes() plane.Route {
	if s.route != nil {
		return s.route
	}
	return plane.Sole(s.handlers)
}

// workerRPC is managerRPC for a worker.
type workerRPC struct {
	kvxpb.WorkerClient
	opener *plane.Opener
	inst   uint16
}

func (r *workerRPC) plane(context.Context) *plane.Plane {
	return r.opener.Get(func(ctx context.Context, req *kvxpb.DataPlaneRequest) (grpc.ServerStreamingClient[kvxpb.DataPlane], error) {
		return r.WorkerClient.OpenDataPlane(ctx, req, callOpts...)
	})
}

func (r *workerRPC) Forward(ctx context.Context, in *kvxpb.Batch, opts ...grpc.CallOption) (*kvxpb.Result, error) {
	return viaPlane(ctx, r.plane(ctx), r.inst, plane.Forward, in, r.WorkerClient.Forward, opts)
}

func (r *workerRPC) CopyBlocks(ctx context.Context, in *kvxpb.CopyBlocksRequest, opts ...grpc.CallOption) (*kvxpb.Empty, error) {
	return viaPlane(ctx, r.plane(ctx), r.inst, plane.CopyBlocks, in, r.WorkerClient.CopyBlocks, opts)
}

// OpenDataPlane implements the Worker service.
func (s *workerServer) OpenDataPlane(req *kvxpb.DataPlaneRequest, stream grpc.ServerStreamingServer[kvxpb.DataPlane]) error {
	return plane.Serve(req, stream, s.routes())
}

// handlers are the framed calls a worker server answers.
func (s *workerServer) handlers() map[plane.Method]plane.Handler {
	s.once.Do(func() {
		s.framed = map[plane.Method]plane.Handler{
			plane.Forward:    s.forwardFramed,
			plane.CopyBlocks: plane.Handle(s.CopyBlocks),
		}
	})
	return s.framed
}

// forwardFramed is Forward on the data plane, in a chain or not: a
// flagTake frame's batch gets the activations the previous frame kept,
// and a flagKeep frame keeps its result's for the next (ForwardChain).
func (s *workerServer) forwardFramed(ctx context.Context, b []byte, ch *plane.Chain) (proto.Message, error) {
	req := new(kvxpb.Batch)
	if err := proto.Unmarshal(b, req); err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "data plane: undecodable request: %v", err)
	}
	if ch.Flags&plane.FlagTake != 0 {
		if !ch.OK {
			return nil, status.Error(codes.Aborted, "data plane: not run: the previous stage of the chain failed")
		}
		req.Hidden = ch.Kept
	}
	ch.Kept, ch.OK = nil, false
	resp, err := s.Forward(ctx, req)
	if err == nil && ch.Flags&plane.FlagKeep != 0 {
		ch.Kept, ch.OK = resp.GetHidden(), true
		resp.Hidden = nil
	}
	return resp, err
}

// routes: see managerServer.routes.
func (s *workerServer) routes() plane.Route {
	if s.route != nil {
		return s.route
	}
	return plane.Sole(s.handlers)
}
