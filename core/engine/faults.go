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

// recoverStage restarts the plugins of a stage that died and recomputes every
// request: micro-batches in flight are dropped, every resident sequence is
// released on the other stages, and the scheduler requeues every admitted
// request at the front. Generated tokens are kept; nothing is lost. A stage
// whose manager or worker went with the dead one (one process serves every
// stage's instance) is restarted too.
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
	e.backoff(ctx) // once per death; the stages that went with it restart at once
	restarted := make([]bool, len(e.stages))
	restart := func(i int) error {
		if st, ok := e.launch.(Stopper); ok {
			st.Stop(e.stages[i].m)
			st.Stop(e.stages[i].w)
		}
		err := e.startStage(ctx, e.stages[i])
		// A plugin that dies (or hangs) while it restarts is started again,
		// within the same budget.
		for err != nil && errors.Is(err, kvcache.ErrUnavailable) && ctx.Err() == nil && e.rep.Engine.PluginRestarts < budget {
			e.rep.Engine.PluginRestarts++
			e.log.Warn("plugin died while restarting; starting it again", "stage", i, "error", err)
			e.backoff(ctx)
			err = e.startStage(ctx, e.stages[i])
		}
		if err != nil {
			return fmt.Errorf("restart of stage %d after %v: %w", i, cause, err)
		}
		restarted[i] = true
		return nil
	}
	if err := restart(dead); err != nil {
		return err
	}
	var resident []kvcache.SeqID
	for _, r := range e.reqs {
		if r.resident {
			resident = append(resident, r.id)
		}
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
		if restarted[st.idx] {
			continue
		}
		// Release whatever the surviving stage holds: a call that failed may
		// have reached some stages and not others, so ask the stage itself.
		e.dog.arm(slotCall, fmt.Sprintf("stage %d: Inspect and Health after a restart", st.idx), e.spec.Liveness.Call, st.m, st.w)
		snap, err := st.m.Inspect(ctx, kvcache.InspectOptions{})
		health := st.w.Health(ctx)
		e.dog.disarm(slotCall)
		if errors.Is(err, kvcache.ErrUnavailable) || errors.Is(health, kvcache.ErrUnavailable) {
			// Its manager or its worker went too (a process shared with the
			// dead stage, or stopped with it): replace both now, or the next
			// step finds the dead one and restarts again.
			e.log.Warn("restarting a stage whose plugins went with the dead one", "stage", st.idx)
			if err := restart(st.idx); err != nil {
				return err
			}
			continue
		}
		if err != nil {
			return stageErr(st.idx, "inspect after restart", err)
		}
		held := make([]kvcache.SeqID, len(snap.Seqs))
		for i, sq := range snap.Seqs {
			held[i] = sq.Seq
		}
		if len(held) == 0 {
			continue
		}
		e.dog.arm(slotCall, fmt.Sprintf("stage %d: Release after a restart", st.idx), e.spec.Liveness.Call, st.m)
		err = st.m.Release(ctx, held)
		e.dog.disarm(slotCall)
		if err != nil {
			return stageErr(st.idx, fmt.Sprintf("release after restart of stage %d", dead), err)
		}
		st.released = append(st.released, held...)
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
