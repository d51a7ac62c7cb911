package engine

import (
	"context"
	"errors"
	"fmt"

	"github.com/kvx-dev/kvx/core/report"
	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
)

// MaxRestarts bounds plugin restarts in one run unless RestartPolicy.Max
// says otherwise: a plugin that keeps dying stops the engine (non-zero
// exit) instead of looping forever.
const MaxRestarts = 8

// stageError is an error of one stage's plugin call.
type stageError struct {
	stage int
	op    string
	err   error
}

func (e *stageError) Error() string { return fmt.Sprintf("stage %d: %s: %v", e.stage, e.op, e.err) }
func (e *stageError) Unwrap() error { return e.err }

func stageErr(stage int, op string, err error) error {
	return &stageError{stage: stage, op: op, err: err}
}

// deadStage returns the stage whose plugin went away, if err says so.
func deadStage(err error) (int, bool) {
	var se *stageError
	if errors.As(err, &se) && errors.Is(se.err, kvcache.ErrUnavailable) {
		return se.stage, true
	}
	return 0, false
}

// itemSeqs returns the requests a request-scoped error is about.
func itemSeqs(err error) []kvcache.SeqID {
	var ke *kvcache.Error
	if errors.As(err, &ke) && ke.Kind == kvcache.KindInvalidArg {
		return ke.Seqs
	}
	return nil
}

// recoverStage restarts the plugins after one of stage dead's died, and
// recomputes every request: micro-batches in flight are dropped, every
// stage's manager and worker are replaced (their processes serve every
// stage), and the scheduler requeues every admitted request at the front.
// Generated tokens are kept; nothing is lost.
func (e *Engine) recoverStage(ctx context.Context, dead int, cause error) error {
	budget := e.spec.Restarts.max()
	if e.rep.Engine.PluginRestarts >= budget {
		return fmt.Errorf("%d plugin restarts, the budget (plugin_restarts.max %d) is spent, giving up: %w", e.rep.Engine.PluginRestarts, budget, cause)
	}
	e.rep.Engine.PluginRestarts++
	e.dropForward()
	e.dropEnding()
	e.log.Warn("plugin died; restarting it and recomputing every request", "stage", dead, "error", cause)
	if e.live != nil {
		// /health answers 503 with this reason until the restart is done.
		e.live.setRecovering(fmt.Sprintf("restarting the plugins of stage %d (restart %d of %d) after: %v", dead, e.rep.Engine.PluginRestarts, budget, cause))
		defer e.live.setRecovering("")
	}
	e.backoff(ctx) // once per death
	// Every stage restarts, its manager and its worker: one process serves
	// every stage's instance of a plugin binary, so the dead stage's
	// processes are the other stages' too. All are stopped before any
	// starts, so that no restart kills a process a stage restarted just
	// before it now uses (restarting stage by stage did: each stopped the
	// process the previous one had just moved to, until the budget was
	// spent).
	if sp, ok := e.launch.(Stopper); ok {
		for _, st := range e.stages {
			sp.Stop(st.m)
			sp.Stop(st.w)
		}
	}
	for i, st := range e.stages {
		err := e.startStage(ctx, st)
		// A plugin that dies (or hangs) while it restarts is started again,
		// within the same budget.
		for err != nil && errors.Is(err, kvcache.ErrUnavailable) && ctx.Err() == nil && e.rep.Engine.PluginRestarts < budget {
			e.rep.Engine.PluginRestarts++
			e.log.Warn("plugin died while restarting; starting it again", "stage", i, "error", err)
			e.backoff(ctx)
			err = e.startStage(ctx, st)
		}
		if err != nil {
			return fmt.Errorf("restart of stage %d after %v: %w", i, cause, err)
		}
	}
	var resident []kvcache.SeqID
	for _, r := range e.reqs {
		if r.resident {
			resident = append(resident, r.id)
		}
		e.ceil.Drop(uint64(r.id))
		r.resident, r.reserved, r.history = false, false, 0
		r.drafts = r.drafts[:0]
	}
	e.resident = 0
	e.inflight = e.inflight[:0]
	for _, st := range e.stages {
		clear(st.deltas)
		clear(st.snaps)
		st.copies = st.copies[:0]
		st.released = append(st.released[:0], resident...)
	}
	for _, id := range e.sched.RequeueAll() {
		r := e.byID[id]
		r.preempts++
		e.rep.Requests.Preemptions++
	}
	return nil
}

// failRequests ends requests with a request-scoped error: the scheduler
// forgets them, their sequences are released, the report names them, and
// the engine goes on.
func (e *Engine) failRequests(ctx context.Context, ids []kvcache.SeqID, inFlight bool, reason string) error {
	var release []kvcache.SeqID
	for _, id := range ids {
		r := e.byID[id]
		if r == nil || r.state != stActive {
			continue
		}
		e.sched.Abort(id)
		if inFlight {
			e.sched.Complete(id, 0, 0) // ends the in-flight state of the aborted request
		}
		r.state = stFailed
		e.active--
		e.rep.Requests.Failures = append(e.rep.Requests.Failures, report.Rejection{ID: uint64(id), Reason: reason})
		if r.resident {
			release = append(release, id)
		}
		e.bar.tick(e)
	}
	if len(release) == 0 {
		return nil
	}
	return e.release(ctx, release)
}
