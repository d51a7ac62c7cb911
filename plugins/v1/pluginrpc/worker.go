package pluginrpc

import (
	"context"
	"fmt"
	"sync"

	"google.golang.org/grpc"

	"github.com/kvx-dev/kvx/plugins/internal/kvxpb"
	"github.com/kvx-dev/kvx/plugins/internal/plane"
	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
	"github.com/kvx-dev/kvx/plugins/v1/pipeline"
	"github.com/kvx-dev/kvx/plugins/v1/worker"
)

// WorkerClient is a worker.Worker whose calls go to a plugin over gRPC. It
// is safe for concurrent use; errors are as for ManagerClient.
type WorkerClient struct {
	rpc  kvxpb.WorkerClient
	done <-chan struct{}
	fam  *family // see ManagerClient
	opts []ClientOption
}

var _ worker.Worker = (*WorkerClient)(nil)

// NewWorkerClient returns a client of instance 0 of the plugin process on
// cc; see NewManagerClient.
func NewWorkerClient(lifetime context.Context, cc grpc.ClientConnInterface, opts ...ClientOption) *WorkerClient {
	fam := &family{cc: cc, opener: plane.NewOpener(clientOpts(opts).grpcOnly)}
	c, _ := newWorkerInstance(lifetime.Done(), fam, opts)
	return c
}

func newWorkerInstance(done <-chan struct{}, fam *family, opts []ClientOption) (*WorkerClient, error) {
	id, err := fam.take()
	if err != nil {
		return nil, err
	}
	rpc := &workerRPC{WorkerClient: kvxpb.NewWorkerClient(fam.conn(id)), opener: fam.opener, inst: id}
	return &WorkerClient{rpc: rpc, done: done, fam: fam, opts: opts}, nil
}

// NewInstance returns a client of a further worker in the same plugin
// process; see ManagerClient.NewInstance.
func (c *WorkerClient) NewInstance() (*WorkerClient, error) {
	return newWorkerInstance(c.done, c.fam, c.opts)
}

// SharesProcess reports whether c and o are instances of one plugin process.
func (c *WorkerClient) SharesProcess(o *WorkerClient) bool {
	return c.fam == o.fam
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
	if cfg.Hardware.Calibration != nil && !c.fam.has(FeatureSimCalibration) {
		return worker.Setup{}, kvcache.Errorf(kvcache.KindUnsupported,
			"sim calibration %q given, but the worker plugin does not offer feature %s (it would run the datasheet roofline): rebuild it against this kvx's plugins/sdk",
			cfg.Hardware.Calibration.Name, FeatureSimCalibration)
	}
	if cfg.Hardware.CopyLatency > 0 && cfg.Device == "sim" && !c.fam.has(FeatureCopyLatency) {
		return worker.Setup{}, kvcache.Errorf(kvcache.KindUnsupported,
			"hardware %q: copy_latency %g s given, but the sim worker plugin does not offer feature %s (it would charge block copies their bytes only): rebuild it against this kvx's plugins/sdk",
			cfg.Hardware.Name, cfg.Hardware.CopyLatency, FeatureCopyLatency)
	}
	if cfg.Dtype != "" && cfg.Dtype != worker.DtypeFloat32 && !c.fam.has(FeatureComputeDtype) {
		return worker.Setup{}, kvcache.Errorf(kvcache.KindUnsupported,
			"dtype %s given, but the worker plugin does not offer feature %s (it would compute in float32): rebuild it against this kvx's plugins/sdk",
			cfg.Dtype, FeatureComputeDtype)
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
	if err := c.unsupported(&b); err != nil {
		return worker.Result{}, err
	}
	resp, err := c.rpc.Forward(ctx, toProtoBatch(&b), callOpts...)
	return answerOf(ctx, c.done, m, resp, err, fromProtoResult)
}

// unsupported refuses a batch that asks for a feature the plugin does not
// offer, which it would ignore (an item's TopLogprobs without
// FeatureTopLogprobs would come back with no logprobs; a sampled item
// without FeatureSampling would come back greedy).
func (c *WorkerClient) unsupported(b *worker.Batch) error {
	top, samp, prompt := c.fam.has(FeatureTopLogprobs), c.fam.has(FeatureSampling), c.fam.has(FeaturePromptLogprobs)
	if top && samp && prompt {
		return nil
	}
	var noPrompt []kvcache.SeqID
	for _, it := range b.Items {
		if !prompt && it.PromptLogprobs {
			noPrompt = append(noPrompt, it.Seq)
		}
	}
	if len(noPrompt) > 0 {
		// Request-scoped: those requests fail alone, the others run.
		return kvcache.ItemErrorf(noPrompt,
			"prompt logprobs (echo with logprobs, or prompt_logprobs) need a worker plugin with feature %s, which this one lacks: rebuild it against this kvx's plugins/sdk",
			FeaturePromptLogprobs)
	}
	for _, it := range b.Items {
		switch {
		case !top && it.TopLogprobs > 0:
			return kvcache.Errorf(kvcache.KindUnsupported,
				"batch item seq %d asks for top_logprobs %d, but the worker plugin does not offer feature %s: rebuild it against this kvx's plugins/sdk",
				it.Seq, it.TopLogprobs, FeatureTopLogprobs)
		case !samp && (it.Logprobs || it.Sampling != nil):
			return kvcache.Errorf(kvcache.KindUnsupported,
				"batch item seq %d asks for sampling (%s) or logprobs (%t), but the worker plugin does not offer feature %s: rebuild it against this kvx's plugins/sdk",
				it.Seq, describeSampling(it.Sampling), it.Logprobs, FeatureSampling)
		}
	}
	return nil
}

// describeSampling names a sampling's main parameters for an error.
func describeSampling(s *worker.Sampling) string {
	if s == nil {
		return "greedy"
	}
	return fmt.Sprintf("temperature %g, seed %d", s.Temperature, s.Seed)
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
	// route finds the instances of its process (nil: s serves alone).
	route  plane.Route
	once   sync.Once
	framed map[plane.Method]plane.Handler
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

var (
	_ pipeline.Chainer      = (*WorkerClient)(nil)
	_ pipeline.ChainStarter = (*WorkerClient)(nil)
)

// ForwardChain implements pipeline.Chainer for the instances of one plugin
// process on a data plane: the stages' batches go in one write, each marked
// to take the activations the previous one kept in the plugin, and the
// answers come back together. Other workers, or no data plane: ok is false.
func (c *WorkerClient) ForwardChain(ctx context.Context, next []worker.Worker, bs []worker.Batch) ([]worker.Result, bool, error) {
	wait, ok := c.StartForwardChain(ctx, next, bs)
	if !ok {
		return nil, false, nil
	}
	res, err := wait()
	return res, true, err
}

// StartForwardChain implements pipeline.ChainStarter: ForwardChain's write
// now, its answers read by wait.
func (c *WorkerClient) StartForwardChain(ctx context.Context, next []worker.Worker, bs []worker.Batch) (func() ([]worker.Result, error), bool) {
	const m = workerService + "Forward"
	if len(bs) != len(next)+1 || exited(c.done) {
		return nil, false
	}
	for i := range bs {
		if err := c.unsupported(&bs[i]); err != nil {
			err = &pipeline.StageError{Stage: i, Err: err}
			return func() ([]worker.Result, error) { return nil, err }, true
		}
	}
	rpcs := []*workerRPC{}
	for _, w := range append([]worker.Worker{c}, next...) {
		wc, ok := w.(*WorkerClient)
		if !ok || !c.SharesProcess(wc) {
			return nil, false
		}
		r, ok := wc.rpc.(*workerRPC)
		if !ok {
			return nil, false
		}
		rpcs = append(rpcs, r)
	}
	dp := rpcs[0].plane(ctx)
	if dp == nil {
		return nil, false
	}
	frames := make([]plane.Frame, len(bs))
	for i := range bs {
		b := bs[i]
		var flags byte
		if i > 0 {
			b.Hidden, flags = nil, plane.FlagTake
		}
		if i < len(bs)-1 {
			flags |= plane.FlagKeep
		}
		frames[i] = plane.Frame{Inst: rpcs[i].inst, M: plane.Forward, Flags: flags, Req: toProtoBatch(&b), Resp: new(kvxpb.Result)}
	}
	calls, err := dp.Send(ctx, frames)
	if err != nil {
		err = &pipeline.StageError{Stage: 0, Err: fromStatus(ctx, c.done, m, err, nil)}
		return func() ([]worker.Result, error) { return nil, err }, true
	}
	return func() ([]worker.Result, error) {
		res := make([]worker.Result, 0, len(bs))
		var failed error
		for i, call := range calls {
			err := dp.Await(ctx, call) // every answer is read, so the plane stays in step
			if failed != nil {
				continue
			}
			r, err := answerOf(ctx, c.done, m, frames[i].Resp.(*kvxpb.Result), err, fromProtoResult)
			if err != nil {
				failed = &pipeline.StageError{Stage: i, Err: err}
				continue
			}
			res = append(res, r)
		}
		return res, failed
	}, true
}
