package engine

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/kvx-dev/kvx/core/report"
	"github.com/kvx-dev/kvx/core/sched"
)

// errDone ends the loop.
var errDone = errors.New("done")

// loop is the discrete-event step loop. Simulated time advances to when the
// first stage can take a micro-batch; micro-batches commit when their last
// stage finishes; at most one micro-batch per pipeline stage is in flight.
// A plugin that dies is restarted and every request recomputed.
func (e *Engine) loop(ctx context.Context) error {
	for {
		e.injectFaults() // restart.go: nothing unless Spec.Faults
		err := e.iterate(ctx)
		if e.live != nil {
			err = e.liveStep(ctx, err) // live.go: publish, take arrivals, wait when idle
		}
		if err == errDone {
			return e.settle()
		}
		if err == nil {
			continue
		}
		e.dropForward()
		dead, ok := deadStage(err)
		if !ok || ctx.Err() != nil {
			return err
		}
		if err := e.recoverStage(ctx, dead, err); err != nil {
			return err
		}
		e.err = nil
	}
}

// iterate schedules and forwards at most one micro-batch.
func (e *Engine) iterate(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	overlap := e.pend != nil && e.overlaps()
	var at int64 // overlap: the clock before the forward's answer
	admitted := e.next
	if overlap {
		// The forward in flight is the newest micro-batch, and every older
		// one completes before the next schedule, whatever the forward's
		// times (see overlaps). So they complete now, while the workers run.
		at = e.now
		e.rep.Engine.OverlappedSteps++
		for _, mb := range e.inflight {
			at = max(at, mb.done)
			if err := e.complete(ctx, mb); err != nil {
				return err
			}
		}
		e.inflight = e.inflight[:0]
		e.admitArrivals() // stamped again below, once the clock is known
	} else {
		if err := e.awaitForward(ctx); err != nil {
			return err
		}
		e.now = max(e.now, e.stages[0].free)
		if err := e.completeUpTo(ctx, e.now); err != nil {
			return err
		}
		e.admitArrivals()
		if len(e.inflight) >= len(e.stages) {
			e.now = e.inflight[0].done
			return nil
		}
	}
	if err := e.runForks(ctx); err != nil { // fork.go: before the children's first step
		return err
	}
	e.admitArrivals() // the forks' requests that run on their own
	step := e.sched.Schedule(admission{e, ctx})
	failed := e.err
	if failed != nil {
		// A plugin call failed inside Schedule, so its denials were not the
		// cache's answers: a request rejected for lack of space goes back to
		// the scheduler (a rejection it deserves comes again).
		e.requeueRejected(step.Rejected)
		step.Rejected = nil
	}
	e.handleRejected(step.Rejected)
	for _, id := range step.Preempted {
		e.rep.Requests.Preemptions++
		r := e.byID[id]
		if slices.Contains(step.Suspended, id) {
			e.rep.Requests.Suspensions++ // cache kept on the host tier: nothing to recompute
			r.suspends++
			continue
		}
		r.preempts++
		r.drafts = r.drafts[:0]
	}
	for _, id := range step.Dropped {
		// A suspension given up: the request recomputes after all.
		e.rep.Requests.Suspensions--
		r := e.byID[id]
		r.suspends--
		r.preempts++
		r.drafts = r.drafts[:0]
	}
	if overlap {
		// The forward's answer sets the clock the sequential engine would
		// have scheduled at: the arrivals just admitted take it.
		err := e.awaitForward(ctx)
		e.now = max(at, e.stages[0].free)
		if e.spec.Workload.Concurrency > 0 {
			for _, r := range e.reqs[admitted:e.next] {
				r.arrival = e.now
			}
		}
		if failed == nil {
			failed = err
		}
	}
	if failed != nil {
		return failed
	}
	if len(step.Items) == 0 {
		switch {
		case len(e.inflight) > 0:
			e.now = max(e.now, e.inflight[0].done)
		case e.next < len(e.reqs) && e.spec.Workload.Concurrency == 0:
			e.now = max(e.now, e.reqs[e.next].arrival)
		case len(e.forkPend) > 0:
			// A prefix ended in a turn's completion: fork it next.
		case e.sched.Idle() && e.next >= len(e.reqs):
			return errDone
		case e.sched.Idle() && e.canAdmitMore():
			// Closed loop: admitArrivals adds more on the next turn.
		default:
			return fmt.Errorf("engine: scheduler made no progress at step %d with %d waiting and %d running requests", e.steps, e.sched.Waiting(), e.sched.Running())
		}
		return nil
	}
	return e.startForward(ctx, step.Items)
}

// overlaps reports whether the next step may be scheduled while the
// started forward runs, with the same result as after it. The forward
// decides the clock (when stage 0 is free and when the micro-batch is
// done), and the sequential engine schedules once stage 0 is free and
// fewer micro-batches than stages are in flight, completing those done by
// then. With two stages that is every micro-batch but the newest, whatever
// the times: the one before it is in flight until then or completes, and
// the newest finishes after both stage 0 and the one before it (a forward
// takes time on the last stage). The clock itself is used only to stamp
// arrivals: closed-loop arrivals are stamped once it is known; open-loop
// ones would be admitted by it, so an open loop overlaps only once every
// request has arrived. With more stages which micro-batches complete
// depends on the times.
func (e *Engine) overlaps() bool {
	return !e.spec.Sequential && len(e.stages) == 2 && len(e.inflight) < len(e.stages) &&
		(e.spec.Workload.Concurrency > 0 || e.next >= len(e.reqs))
}

// admitArrivals hands arrived requests to the scheduler: by timestamp in an
// open loop, or keeping Concurrency requests active in a closed loop.
func (e *Engine) admitArrivals() {
	for e.next < len(e.reqs) {
		r := e.reqs[e.next]
		if r.state == stActive { // a forked request (fork.go): running already
			e.next++
			continue
		}
		if r.rejected != "" && (e.spec.Workload.Concurrency > 0 || r.arrival <= e.now) {
			// Known to be unrunnable before it arrived: rejected on arrival,
			// without a slot in the loop or a word to the scheduler.
			e.next++
			r.state = stRejected
			e.rep.Requests.Rejections = append(e.rep.Requests.Rejections, report.Rejection{ID: uint64(r.id), Reason: r.rejected})
			e.bar.tick(e)
			continue
		}
		if c := e.spec.Workload.Concurrency; c > 0 {
			if e.active >= c {
				return
			}
			r.arrival = e.now
		} else if r.arrival > e.now {
			return
		}
		e.next++
		e.active++
		r.state = stActive
		e.sched.Add(sched.Request{ID: r.id, Prompt: r.prompt, MaxNew: r.maxNew})
	}
}

// requeueRejected hands rejected requests back to the scheduler as they
// stand: prompt plus what they generated so far, for what is left to generate.
func (e *Engine) requeueRejected(rs []sched.Rejection) {
	for _, rj := range rs {
		r := e.byID[rj.ID]
		if r == nil || r.state != stActive {
			continue
		}
		generated := len(r.tok.Generated())
		e.sched.Add(sched.Request{ID: r.id, Prompt: r.tok.Len(), MaxNew: r.maxNew - generated})
	}
}

func (e *Engine) canAdmitMore() bool {
	c := e.spec.Workload.Concurrency
	return e.next < len(e.reqs) && (c == 0 || e.active < c)
}

func (e *Engine) handleRejected(rs []sched.Rejection) {
	for _, rj := range rs {
		r := e.byID[rj.ID]
		if r == nil || r.state != stActive {
			continue
		}
		r.state = stRejected
		e.active--
		e.rep.Requests.Rejections = append(e.rep.Requests.Rejections, report.Rejection{ID: uint64(rj.ID), Reason: rj.Reason})
		e.bar.tick(e)
	}
}
