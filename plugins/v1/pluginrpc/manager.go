package pluginrpc

import (
	"context"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"

	"github.com/kvx-dev/kvx/plugins/internal/kvxpb"
	"github.com/kvx-dev/kvx/plugins/internal/plane"
	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
	"github.com/kvx-dev/kvx/plugins/v1/pipeline"
)

// ManagerClient is a kvcache.Manager whose calls go to a plugin over gRPC.
//
// It is safe for concurrent use. Errors follow the package doc: the plugin's
// *kvcache.Error survives the wire, a dead plugin gives KindUnavailable and
// the caller's cancelled ctx gives an error wrapping ctx.Err(). A result the
// plugin returned together with its error (Commit's copies after it applied
// the valid items) is returned with the error.
type ManagerClient struct {
	rpc  kvxpb.CacheManagerClient
	done <-chan struct{}
	// fam is shared by the instances of one plugin process.
	fam  *family
	opts []ClientOption
}

// The client always implements kvcache.Suspender, whether or not the
// served manager does: a plugin's manager without one answers
// KindUnsupported and its Info says no HostTier (the server sees to both),
// so the core, which suspends only on a HostTier manager, treats it as it
// treats the same manager in-process.
var _ kvcache.Manager = (*ManagerClient)(nil)
var _ kvcache.Suspender = (*ManagerClient)(nil)
var _ pipeline.StepEnder = (*ManagerClient)(nil)
var _ pipeline.StepStarter = (*ManagerClient)(nil)

// NewManagerClient returns a client of instance 0 of the plugin process on
// cc; NewInstance makes the others. lifetime ends when the plugin is gone
// (go-plugin's GRPCClient ctx); after that every call fails at once with
// KindUnavailable. A lifetime that never ends (context.Background) is fine.
func NewManagerClient(lifetime context.Context, cc grpc.ClientConnInterface, opts ...ClientOption) *ManagerClient {
	fam := &family{cc: cc, opener: plane.NewOpener(clientOpts(opts).grpcOnly)}
	c, _ := newManagerInstance(lifetime.Done(), fam, opts)
	return c
}

func newManagerInstance(done <-chan struct{}, fam *family, opts []ClientOption) (*ManagerClient, error) {
	id, err := fam.take()
	if err != nil {
		return nil, err
	}
	rpc := &managerRPC{CacheManagerClient: kvxpb.NewCacheManagerClient(fam.conn(id)), opener: fam.opener, inst: id}
	return &ManagerClient{rpc: rpc, done: done, fam: fam, opts: opts}, nil
}

// NewInstance returns a client of a further manager in the same plugin
// process, made by the plugin's factory: a fresh manager, to be configured
// like any other. The instances of a process share its data plane, so the
// calls of several instances made together reach it together (one wake-up
// for all the pipeline stages). It fails past MaxInstances. The process
// must serve instances (ServedPlugins; RegisterManagerServer serves one).
func (c *ManagerClient) NewInstance() (*ManagerClient, error) {
	return newManagerInstance(c.done, c.fam, c.opts)
}

// SharesProcess reports whether c and o are instances of one plugin process.
func (c *ManagerClient) SharesProcess(o *ManagerClient) bool {
	return c.fam == o.fam
}

// Done is closed when the plugin process has exited (never, for clients
// without a process lifetime).
func (c *ManagerClient) Done() <-chan struct{} { return c.done }

const managerService = "CacheManager."

// Info implements kvcache.Manager.
func (c *ManagerClient) Info(ctx context.Context) (kvcache.Info, error) {
	const m = managerService + "Info"
	if exited(c.done) {
		return kvcache.Info{}, errExited(m)
	}
	resp, err := c.rpc.Info(ctx, &kvxpb.ManagerInfoRequest{}, callOpts...)
	if err != nil {
		return kvcache.Info{}, fromStatus(ctx, c.done, m, err, nil)
	}
	return fromProtoManagerInfo(resp), nil
}

// Configure implements kvcache.Manager.
func (c *ManagerClient) Configure(ctx context.Context, cfg kvcache.Config) (kvcache.Layout, error) {
	const m = managerService + "Configure"
	if exited(c.done) {
		return kvcache.Layout{}, errExited(m)
	}
	req, err := toProtoManagerConfig(cfg)
	if err != nil {
		return kvcache.Layout{}, kvcache.Errorf(kvcache.KindInvalidConfig, "kvx plugin %s: %v", m, err)
	}
	resp, err := c.rpc.Configure(ctx, req, callOpts...)
	if err != nil {
		partial := new(kvxpb.Layout)
		err = fromStatus(ctx, c.done, m, err, partial)
		return fromProtoLayout(partial), err
	}
	return fromProtoLayout(resp), nil
}

// Lookup implements kvcache.Manager.
func (c *ManagerClient) Lookup(ctx context.Context, items []kvcache.LookupItem) ([]int, error) {
	const m = managerService + "Lookup"
	if exited(c.done) {
		return nil, errExited(m)
	}
	resp, err := c.rpc.Lookup(ctx, toProtoLookupRequest(items, false, c.fam.has(FeatureRawTokens)), callOpts...)
	return c.lookupAnswer(ctx, resp, err)
}

// Explain implements kvcache.Explainer: a Lookup that asks for the
// explanation. A served manager that is no Explainer answers
// KindUnsupported (its Info says no Explain; the core asks only one that
// says so).
func (c *ManagerClient) Explain(ctx context.Context, items []kvcache.LookupItem) ([]kvcache.Explanation, error) {
	const m = managerService + "Lookup"
	if exited(c.done) {
		return nil, errExited(m)
	}
	resp, err := c.rpc.Lookup(ctx, toProtoLookupRequest(items, true, c.fam.has(FeatureRawTokens)), callOpts...)
	return c.explainAnswer(ctx, resp, err)
}

// explainAnswer decodes an explained Lookup answer, or the partial one
// beside err.
func (c *ManagerClient) explainAnswer(ctx context.Context, resp *kvxpb.LookupResponse, err error) ([]kvcache.Explanation, error) {
	return answerOf(ctx, c.done, managerService+"Lookup", resp, err, fromProtoExplainResponse)
}

// lookupAnswer decodes a Lookup answer, or the partial one beside err.
func (c *ManagerClient) lookupAnswer(ctx context.Context, resp *kvxpb.LookupResponse, err error) ([]int, error) {
	if err != nil {
		partial := new(kvxpb.LookupResponse)
		err = fromStatus(ctx, c.done, managerService+"Lookup", err, partial)
		return fromProtoLookupResponse(partial), err
	}
	return fromProtoLookupResponse(resp), nil
}

// Reserve implements kvcache.Manager.
func (c *ManagerClient) Reserve(ctx context.Context, items []kvcache.ReserveItem) ([]kvcache.Grant, error) {
	const m = managerService + "Reserve"
	if exited(c.done) {
		return nil, errExited(m)
	}
	resp, err := c.rpc.Reserve(ctx, toProtoReserveRequest(items, c.fam.has(FeatureRawTokens)), callOpts...)
	return c.reserveAnswer(ctx, resp, err)
}

// reserveAnswer decodes a Reserve answer, or the partial one beside err.
func (c *ManagerClient) reserveAnswer(ctx context.Context, resp *kvxpb.ReserveResponse, err error) ([]kvcache.Grant, error) {
	return answerOf(ctx, c.done, managerService+"Reserve", resp, err, fromProtoReserveResponse)
}

// Unreserve implements kvcache.Manager.
func (c *ManagerClient) Unreserve(ctx context.Context, seqs []kvcache.SeqID) error {
	const m = managerService + "Unreserve"
	if exited(c.done) {
		return errExited(m)
	}
	if _, err := c.rpc.Unreserve(ctx, toProtoSeqs(seqs), callOpts...); err != nil {
		return fromStatus(ctx, c.done, m, err, nil)
	}
	return nil
}

// Commit implements kvcache.Manager.
func (c *ManagerClient) Commit(ctx context.Context, items []kvcache.CommitItem) (kvcache.CommitResult, error) {
	const m = managerService + "Commit"
	if exited(c.done) {
		return kvcache.CommitResult{}, errExited(m)
	}
	resp, err := c.rpc.Commit(ctx, toProtoCommitRequest(items), callOpts...)
	return answerOf(ctx, c.done, m, resp, err, fromProtoCommitResult)
}

// Suspend implements kvcache.Suspender.
func (c *ManagerClient) Suspend(ctx context.Context, seqs []kvcache.SeqID) ([]bool, []kvcache.Copy, error) {
	return c.move(ctx, managerService+"Suspend", c.rpc.Suspend, seqs)
}

// Resume implements kvcache.Suspender.
func (c *ManagerClient) Resume(ctx context.Context, seqs []kvcache.SeqID) ([]bool, []kvcache.Copy, error) {
	return c.move(ctx, managerService+"Resume", c.rpc.Resume, seqs)
}

func (c *ManagerClient) move(ctx context.Context, m string,
	call func(context.Context, *kvxpb.Seqs, ...grpc.CallOption) (*kvxpb.MoveResult, error),
	seqs []kvcache.SeqID) ([]bool, []kvcache.Copy, error) {
	if exited(c.done) {
		return nil, nil, errExited(m)
	}
	resp, err := call(ctx, toProtoSeqs(seqs), callOpts...)
	return c.moveAnswer(ctx, m, resp, err)
}

// moveAnswer decodes a Suspend or Resume (m) answer, or the partial one
// beside err.
func (c *ManagerClient) moveAnswer(ctx context.Context, m string, resp *kvxpb.MoveResult, err error) ([]bool, []kvcache.Copy, error) {
	if err != nil {
		partial := new(kvxpb.MoveResult)
		err = fromStatus(ctx, c.done, m, err, partial)
		ok, copies, _ := fromProtoMoveResult(partial)
		return ok, copies, err
	}
	ok, copies, err := fromProtoMoveResult(resp)
	if err != nil {
		return nil, nil, malformed(m, err)
	}
	return ok, copies, nil
}

// Release implements kvcache.Manager.
func (c *ManagerClient) Release(ctx context.Context, seqs []kvcache.SeqID) error {
	const m = managerService + "Release"
	if exited(c.done) {
		return errExited(m)
	}
	if _, err := c.rpc.Release(ctx, toProtoSeqs(seqs), callOpts...); err != nil {
		return fromStatus(ctx, c.done, m, err, nil)
	}
	return nil
}

// Stats implements kvcache.Manager.
func (c *ManagerClient) Stats(ctx context.Context) (kvcache.Stats, error) {
	const m = managerService + "Stats"
	if exited(c.done) {
		return kvcache.Stats{}, errExited(m)
	}
	resp, err := c.rpc.Stats(ctx, &kvxpb.StatsRequest{}, callOpts...)
	if err != nil {
		partial := new(kvxpb.ManagerStats)
		err = fromStatus(ctx, c.done, m, err, partial)
		return fromProtoStats(partial), err
	}
	return fromProtoStats(resp), nil
}

// Inspect implements kvcache.Manager.
func (c *ManagerClient) Inspect(ctx context.Context, opts kvcache.InspectOptions) (kvcache.Snapshot, error) {
	const m = managerService + "Inspect"
	if exited(c.done) {
		return kvcache.Snapshot{}, errExited(m)
	}
	resp, err := c.rpc.Inspect(ctx, toProtoInspectOptions(opts), callOpts...)
	return answerOf(ctx, c.done, m, resp, err, fromProtoSnapshot)
}

// EndStep implements pipeline.StepEnder: Commit, Release and Inspect in one
// round trip.
func (c *ManagerClient) EndStep(ctx context.Context, req pipeline.EndStepRequest) (pipeline.EndStepResult, error) {
	const m = managerService + "EndStep"
	if exited(c.done) {
		return pipeline.EndStepResult{}, errExited(m)
	}
	resp, err := c.rpc.EndStep(ctx, toProtoEndStepRequest(req), callOpts...)
	return answerOf(ctx, c.done, m, resp, err, fromProtoEndStepResult)
}

// StartEndStep implements pipeline.StepStarter. On a data plane the end of
// the step is corked: it goes to the plugin with the next call, whose answer
// brings its answer too. Over gRPC alone it is EndStep, run now.
func (c *ManagerClient) StartEndStep(ctx context.Context, req pipeline.EndStepRequest) func() (pipeline.EndStepResult, error) {
	const m = managerService + "EndStep"
	r, ok := c.rpc.(*managerRPC)
	var dp *plane.Plane
	if ok && !exited(c.done) {
		dp = r.plane(ctx)
	}
	if dp == nil {
		res, err := c.EndStep(ctx, req)
		return func() (pipeline.EndStepResult, error) { return res, err }
	}
	resp := new(kvxpb.EndStepResult)
	call := dp.Cork(ctx, r.inst, plane.EndStep, toProtoEndStepRequest(req), resp)
	return func() (pipeline.EndStepResult, error) {
		return answerOf(ctx, c.done, m, resp, dp.Finish(call), fromProtoEndStepResult)
	}
}

// RegisterManagerServer serves m as the CacheManager service on s. The server
// runs one call at a time (a call waits for the previous one, or for its ctx
// to end), so m needs no locking. Errors m returns travel as described in the
// package doc.
func RegisterManagerServer(s grpc.ServiceRegistrar, m kvcache.Manager) {
	kvxpb.RegisterCacheManagerServer(s, &managerServer{impl: m, gate: newGate()})
}

type managerServer struct {
	kvxpb.UnimplementedCacheManagerServer
	impl kvcache.Manager
	gate gate
	// pools is the layout of the last Configure that succeeded, for the
	// table checks it runs on a deep inspection (kvcache.SealTables); set
	// and read inside the gate.
	pools []kvcache.Pool
	// route finds the instances of its process (nil: s serves alone).
	route  plane.Route
	once   sync.Once
	framed map[plane.Method]plane.Handler
}

func (s *managerServer) Info(ctx context.Context, _ *kvxpb.ManagerInfoRequest) (*kvxpb.ManagerInfo, error) {
	if err := s.gate.enter(ctx); err != nil {
		return nil, toStatus(err, nil)
	}
	defer s.gate.leave()
	info, err := s.impl.Info(ctx)
	if _, ok := s.impl.(kvcache.Suspender); !ok {
		// What is served: Suspend and Resume answer KindUnsupported.
		info.Capabilities.HostTier = false
	}
	if _, ok := s.impl.(kvcache.EventReporter); !ok {
		info.Capabilities.KVEvents = false
	}
	if _, ok := s.impl.(kvcache.Explainer); !ok {
		info.Capabilities.Explain = false // an explained Lookup answers KindUnsupported
	}
	if _, ok := s.impl.(kvcache.Forker); !ok {
		info.Capabilities.Fork = false // Fork answers KindUnsupported
	}
	out := toProtoManagerInfo(info)
	if err != nil {
		return nil, toStatus(err, out)
	}
	return out, nil
}

func (s *managerServer) Configure(ctx context.Context, req *kvxpb.ManagerConfig) (*kvxpb.Layout, error) {
	cfg, err := fromProtoManagerConfig(req)
	if err != nil {
		return nil, toStatus(err, nil)
	}
	if err := s.gate.enter(ctx); err != nil {
		return nil, toStatus(err, nil)
	}
	defer s.gate.leave()
	layout, err := s.impl.Configure(ctx, cfg)
	out := toProtoLayout(layout)
	if err != nil {
		return nil, toStatus(err, out)
	}
	s.pools = layout.Pools
	return out, nil
}

func (s *managerServer) Lookup(ctx context.Context, req *kvxpb.LookupRequest) (*kvxpb.LookupResponse, error) {
	if err := s.gate.enter(ctx); err != nil {
		return nil, toStatus(err, nil)
	}
	defer s.gate.leave()
	if req.GetExplain() {
		ex, ok := s.impl.(kvcache.Explainer)
		if !ok {
			return nil, toStatus(kvcache.Errorf(kvcache.KindUnsupported, "Lookup: explain: the cache manager does not explain (it is no kvcache.Explainer)"), nil)
		}
		items, err := fromProtoLookupRequest(req)
		if err != nil {
			return nil, toStatus(err, nil)
		}
		res, err := ex.Explain(ctx, items)
		out := toProtoExplainResponse(res)
		if err != nil {
			return nil, toStatus(err, out)
		}
		return out, nil
	}
	items, err := fromProtoLookupRequest(req)
	if err != nil {
		return nil, toStatus(err, nil)
	}
	tokens, err := s.impl.Lookup(ctx, items)
	out := toProtoLookupResponse(tokens)
	if err != nil {
		return nil, toStatus(err, out)
	}
	return out, nil
}

func (s *managerServer) Reserve(ctx context.Context, req *kvxpb.ReserveRequest) (*kvxpb.ReserveResponse, error) {
	if err := s.gate.enter(ctx); err != nil {
		return nil, toStatus(err, nil)
	}
	defer s.gate.leave()
	items, err := fromProtoReserveRequest(req)
	if err != nil {
		return nil, toStatus(err, nil)
	}
	grants, err := s.impl.Reserve(ctx, items)
	out := toProtoReserveResponse(grants)
	if err != nil {
		return nil, toStatus(err, out)
	}
	return out, nil
}

func (s *managerServer) Unreserve(ctx context.Context, req *kvxpb.Seqs) (*kvxpb.Empty, error) {
	if err := s.gate.enter(ctx); err != nil {
		return nil, toStatus(err, nil)
	}
	defer s.gate.leave()
	if err := s.impl.Unreserve(ctx, fromProtoSeqs(req)); err != nil {
		return nil, toStatus(err, nil)
	}
	return &kvxpb.Empty{}, nil
}

func (s *managerServer) Commit(ctx context.Context, req *kvxpb.CommitRequest) (*kvxpb.CommitResult, error) {
	if err := s.gate.enter(ctx); err != nil {
		return nil, toStatus(err, nil)
	}
	defer s.gate.leave()
	items, err := fromProtoCommitRequest(req)
	if err != nil {
		return nil, toStatus(err, nil)
	}
	res, err := s.impl.Commit(ctx, items)
	out := toProtoCommitResult(res)
	if err != nil {
		return nil, toStatus(err, out)
	}
	return out, nil
}

func (s *managerServer) Suspend(ctx context.Context, req *kvxpb.Seqs) (*kvxpb.MoveResult, error) {
	sp, ok := s.impl.(kvcache.Suspender)
	if !ok {
		return nil, toStatus(errNoSuspender("Suspend"), nil)
	}
	return s.move(ctx, sp.Suspend, req)
}

func (s *managerServer) Resume(ctx context.Context, req *kvxpb.Seqs) (*kvxpb.MoveResult, error) {
	sp, ok := s.impl.(kvcache.Suspender)
	if !ok {
		return nil, toStatus(errNoSuspender("Resume"), nil)
	}
	return s.move(ctx, sp.Resume, req)
}

// errNoSuspender is the answer to Suspend or Resume (call) of a manager
// that is no kvcache.Suspender.
func errNoSuspender(call string) error {
	return kvcache.Errorf(kvcache.KindUnsupported, "%s: the cache manager has no host tier (it is no kvcache.Suspender)", call)
}

func (s *managerServer) move(ctx context.Context,
	call func(context.Context, []kvcache.SeqID) ([]bool, []kvcache.Copy, error),
	req *kvxpb.Seqs) (*kvxpb.MoveResult, error) {
	if err := s.gate.enter(ctx); err != nil {
		return nil, toStatus(err, nil)
	}
	defer s.gate.leave()
	ok, copies, err := call(ctx, fromProtoSeqs(req))
	out := toProtoMoveResult(ok, copies)
	if err != nil {
		return nil, toStatus(err, out)
	}
	return out, nil
}

func (s *managerServer) Release(ctx context.Context, req *kvxpb.Seqs) (*kvxpb.Empty, error) {
	if err := s.gate.enter(ctx); err != nil {
		return nil, toStatus(err, nil)
	}
	defer s.gate.leave()
	if err := s.impl.Release(ctx, fromProtoSeqs(req)); err != nil {
		return nil, toStatus(err, nil)
	}
	return &kvxpb.Empty{}, nil
}

func (s *managerServer) Stats(ctx context.Context, _ *kvxpb.StatsRequest) (*kvxpb.ManagerStats, error) {
	if err := s.gate.enter(ctx); err != nil {
		return nil, toStatus(err, nil)
	}
	defer s.gate.leave()
	st, err := s.impl.Stats(ctx)
	out := toProtoStats(st)
	if err != nil {
		return nil, toStatus(err, out)
	}
	return out, nil
}

func (s *managerServer) Inspect(ctx context.Context, req *kvxpb.InspectOptions) (*kvxpb.Snapshot, error) {
	if err := s.gate.enter(ctx); err != nil {
		return nil, toStatus(err, nil)
	}
	defer s.gate.leave()
	opts := fromProtoInspectOptions(req)
	snap, err := s.impl.Inspect(ctx, opts)
	if err == nil {
		kvcache.SealTables(s.pools, opts, &snap)
	}
	out := toProtoSnapshot(snap)
	if err != nil {
		return nil, toStatus(err, out)
	}
	return out, nil
}

func (s *managerServer) EndStep(ctx context.Context, req *kvxpb.EndStepRequest) (*kvxpb.EndStepResult, error) {
	if err := s.gate.enter(ctx); err != nil {
		return nil, toStatus(err, nil)
	}
	defer s.gate.leave()
	r, err := fromProtoEndStepRequest(req)
	if err != nil {
		return nil, toStatus(err, nil)
	}
	res, err := pipeline.EndStep(ctx, s.impl, r)
	if res.Snapshot != nil && r.Inspect != nil {
		kvcache.SealTables(s.pools, *r.Inspect, res.Snapshot)
	}
	out := toProtoEndStepResult(res)
	if err != nil {
		return nil, toStatus(err, out)
	}
	return out, nil
}

// gate lets one call at a time into an implementation; a waiting call gives
// up when its ctx ends.
type gate chan struct{}

func newGate() gate { return make(gate, 1) }

func (g gate) enter(ctx context.Context) error {
	select {
	case g <- struct{}{}:
		return nil
	default:
	}
	select {
	case g <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (g gate) leave() { <-g }

var _ pipeline.CallStarter = (*ManagerClient)(nil)
var _ pipeline.SuspendStarter = (*ManagerClient)(nil)

// startCall starts call m with request in. On a data plane it is corked,
// so the calls the stages start together share one write, sent by the
// first wait; without a plane the gRPC call runs on a goroutine of its
// own. wait returns the answer, or a status error.
func startCall[Resp any, PResp interface {
	*Resp
	proto.Message
}](ctx context.Context, c *ManagerClient, m plane.Method, in proto.Message, overGRPC func(context.Context) (PResp, error)) (wait func() (PResp, error)) {
	var dp *plane.Plane
	r, ok := c.rpc.(*managerRPC)
	if ok {
		dp = r.plane(ctx)
	}
	if dp == nil {
		var out PResp
		var err error
		done := make(chan struct{})
		go func() {
			defer close(done)
			out, err = overGRPC(ctx)
		}()
		return func() (PResp, error) {
			<-done
			return out, err
		}
	}
	out := PResp(new(Resp))
	call := dp.Cork(ctx, r.inst, m, in, out)
	return func() (PResp, error) {
		if err := dp.Finish(call); err != nil {
			return nil, err
		}
		return out, nil
	}
}

// StartLookup implements pipeline.CallStarter.
func (c *ManagerClient) StartLookup(ctx context.Context, items []kvcache.LookupItem) func() ([]int, error) {
	const m = managerService + "Lookup"
	if exited(c.done) {
		return func() ([]int, error) { return nil, errExited(m) }
	}
	in := toProtoLookupRequest(items, false, c.fam.has(FeatureRawTokens))
	wait := startCall(ctx, c, plane.Lookup, in, func(ctx context.Context) (*kvxpb.LookupResponse, error) {
		return c.rpc.Lookup(ctx, in, callOpts...)
	})
	return func() ([]int, error) {
		resp, err := wait()
		return c.lookupAnswer(ctx, resp, err)
	}
}

// StartExplain implements pipeline.ExplainStarter.
func (c *ManagerClient) StartExplain(ctx context.Context, items []kvcache.LookupItem) func() ([]kvcache.Explanation, error) {
	const m = managerService + "Lookup"
	if exited(c.done) {
		return func() ([]kvcache.Explanation, error) { return nil, errExited(m) }
	}
	in := toProtoLookupRequest(items, true, c.fam.has(FeatureRawTokens))
	wait := startCall(ctx, c, plane.Lookup, in, func(ctx context.Context) (*kvxpb.LookupResponse, error) {
		return c.rpc.Lookup(ctx, in, callOpts...)
	})
	return func() ([]kvcache.Explanation, error) {
		resp, err := wait()
		return c.explainAnswer(ctx, resp, err)
	}
}

// StartReserve implements pipeline.CallStarter.
func (c *ManagerClient) StartReserve(ctx context.Context, items []kvcache.ReserveItem) func() ([]kvcache.Grant, error) {
	const m = managerService + "Reserve"
	if exited(c.done) {
		return func() ([]kvcache.Grant, error) { return nil, errExited(m) }
	}
	in := toProtoReserveRequest(items, c.fam.has(FeatureRawTokens))
	wait := startCall(ctx, c, plane.Reserve, in, func(ctx context.Context) (*kvxpb.ReserveResponse, error) {
		return c.rpc.Reserve(ctx, in, callOpts...)
	})
	return func() ([]kvcache.Grant, error) {
		resp, err := wait()
		return c.reserveAnswer(ctx, resp, err)
	}
}

// StartUnreserve implements pipeline.CallStarter.
func (c *ManagerClient) StartUnreserve(ctx context.Context, seqs []kvcache.SeqID) func() error {
	return c.startSeqs(ctx, managerService+"Unreserve", plane.Unreserve, c.rpc.Unreserve, seqs)
}

// StartRelease implements pipeline.CallStarter.
func (c *ManagerClient) StartRelease(ctx context.Context, seqs []kvcache.SeqID) func() error {
	return c.startSeqs(ctx, managerService+"Release", plane.Release, c.rpc.Release, seqs)
}

// startSeqs starts a call that takes sequences and answers nothing.
func (c *ManagerClient) startSeqs(ctx context.Context, name string, m plane.Method,
	call func(context.Context, *kvxpb.Seqs, ...grpc.CallOption) (*kvxpb.Empty, error), seqs []kvcache.SeqID) func() error {
	if exited(c.done) {
		return func() error { return errExited(name) }
	}
	in := toProtoSeqs(seqs)
	wait := startCall(ctx, c, m, in, func(ctx context.Context) (*kvxpb.Empty, error) {
		return call(ctx, in, callOpts...)
	})
	return func() error {
		if _, err := wait(); err != nil {
			return fromStatus(ctx, c.done, name, err, nil)
		}
		return nil
	}
}

// StartSuspend implements pipeline.SuspendStarter.
func (c *ManagerClient) StartSuspend(ctx context.Context, seqs []kvcache.SeqID) func() ([]bool, []kvcache.Copy, error) {
	return c.startMove(ctx, managerService+"Suspend", plane.Suspend, c.rpc.Suspend, seqs)
}

// StartResume implements pipeline.SuspendStarter.
func (c *ManagerClient) StartResume(ctx context.Context, seqs []kvcache.SeqID) func() ([]bool, []kvcache.Copy, error) {
	return c.startMove(ctx, managerService+"Resume", plane.Resume, c.rpc.Resume, seqs)
}

// startMove starts Suspend or Resume.
func (c *ManagerClient) startMove(ctx context.Context, name string, m plane.Method,
	call func(context.Context, *kvxpb.Seqs, ...grpc.CallOption) (*kvxpb.MoveResult, error),
	seqs []kvcache.SeqID) func() ([]bool, []kvcache.Copy, error) {
	if exited(c.done) {
		return func() ([]bool, []kvcache.Copy, error) { return nil, nil, errExited(name) }
	}
	in := toProtoSeqs(seqs)
	wait := startCall(ctx, c, m, in, func(ctx context.Context) (*kvxpb.MoveResult, error) {
		return call(ctx, in, callOpts...)
	})
	return func() ([]bool, []kvcache.Copy, error) {
		resp, err := wait()
		return c.moveAnswer(ctx, name, resp, err)
	}
}
