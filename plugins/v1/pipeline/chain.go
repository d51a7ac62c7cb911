package pipeline

import (
	"context"
	"fmt"

	"github.com/kvx-dev/kvx/plugins/v1/worker"
)

// Chainer is an optional worker.Worker interface, found by type assertion: one
// call runs a micro-batch over several pipeline stages, each stage's
// activations handed to the next where the workers run instead of through
// the caller. The plugin client implements it for the stages' workers that
// one plugin process serves (pluginrpc.InstancesProtocol), so a step's
// forward wakes that process once instead of once per stage. Callers use
// ForwardStages.
type Chainer interface {
	// ForwardChain runs bs[0] on this worker, then bs[i] on next[i-1] for
	// each i > 0, in order, each with the previous result's activations as
	// its Hidden (bs[i].Hidden is ignored for i > 0). It returns the results
	// of the stages that ran, in order, every Hidden but the last one's
	// left out. When a stage fails, the results before it come back with a
	// *StageError naming it, and the later stages did not run. ok false
	// means it cannot chain these workers (they are not served together):
	// nothing ran.
	ForwardChain(ctx context.Context, next []worker.Worker, bs []worker.Batch) (res []worker.Result, ok bool, err error)
}

// ChainStarter is an optional worker.Worker interface, found by type assertion,
// beside Chainer: it sends what ForwardChain would and returns without
// waiting for the answers, which wait returns. The caller may do other work
// (a pipeline's next manager phase) while the stages run. The batches are
// encoded before it returns, so the caller may change them afterwards. Call
// wait exactly once; no other call on these workers may come before it.
// ok false means it cannot chain these workers: nothing was sent and wait
// is nil. Callers use StartForwardStages.
type ChainStarter interface {
	StartForwardChain(ctx context.Context, next []worker.Worker, bs []worker.Batch) (wait func() ([]worker.Result, error), ok bool)
}

// StageError is the error of one stage of ForwardStages.
type StageError struct {
	Stage int // index into the workers
	Err   error
}

func (e *StageError) Error() string { return fmt.Sprintf("stage %d: %v", e.Stage, e.Err) }
func (e *StageError) Unwrap() error { return e.Err }

// ForwardStages runs bs[i] on ws[i] in order, each batch taking the previous
// result's Hidden: in one call when ws[0] chains the others (Chainer), else
// by Forward on each. Its results and errors are ForwardChain's: the
// results of the stages that ran and, when one failed, a *StageError. The
// two ways give the same results, Hidden of the stages before the last
// aside (nil after a chain).
func ForwardStages(ctx context.Context, ws []worker.Worker, bs []worker.Batch) ([]worker.Result, error) {
	if len(ws) != len(bs) {
		return nil, fmt.Errorf("forward over %d stages with %d batches", len(ws), len(bs))
	}
	if len(ws) == 0 {
		return nil, nil
	}
	if c, ok := ws[0].(Chainer); ok && len(ws) > 1 {
		if res, ok, err := c.ForwardChain(ctx, ws[1:], bs); ok {
			return res, err
		}
	}
	return forwardEach(ctx, ws, bs)
}

// StartForwardStages starts ForwardStages and returns a wait that gives its
// results and error. When ws[0] is a ChainStarter for the others, the
// batches are sent before it returns and the workers run while the caller
// goes on; otherwise the forward runs now, on the calling goroutine, and
// wait only returns what it gave. Either way the results are the same.
// Call wait exactly once, before any other call on these workers.
func StartForwardStages(ctx context.Context, ws []worker.Worker, bs []worker.Batch) (wait func() ([]worker.Result, error)) {
	if len(ws) > 1 && len(ws) == len(bs) {
		if c, ok := ws[0].(ChainStarter); ok {
			if wait, ok := c.StartForwardChain(ctx, ws[1:], bs); ok {
				return wait
			}
		}
	}
	res, err := ForwardStages(ctx, ws, bs)
	return func() ([]worker.Result, error) { return res, err }
}

// forwardEach runs bs[i] on ws[i] by Forward, in order.
func forwardEach(ctx context.Context, ws []worker.Worker, bs []worker.Batch) ([]worker.Result, error) {
	res := make([]worker.Result, 0, len(ws))
	var hidden []byte
	for i, w := range ws {
		b := bs[i]
		if i > 0 {
			b.Hidden = hidden
		}
		r, err := w.Forward(ctx, b)
		if err != nil {
			return res, &StageError{Stage: i, Err: err}
		}
		hidden = r.Hidden
		res = append(res, r)
	}
	return res, nil
}
