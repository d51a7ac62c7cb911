package engine

import (
	"context"
	"fmt"
	"slices"

	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
	"github.com/kvx-dev/kvx/plugins/v1/pipeline"
	"github.com/kvx-dev/kvx/plugins/v1/worker"
)

// completeUpTo commits every in-flight micro-batch that finished by t.
func (e *Engine) completeUpTo(ctx context.Context, t int64) error {
	for len(e.inflight) > 0 && e.inflight[0].done <= t {
		mb := e.inflight[0]
		e.inflight = e.inflight[1:]
		if err := e.complete(ctx, mb); err != nil {
			return err
		}
	}
	return nil
}

// complete ends one micro-batch's step: it starts the commit, the release
// of the finished requests and the invariant snapshot on every stage (settle
// takes their answers), and advances the requests and the scheduler.
func (e *Engine) complete(ctx context.Context, mb *microBatch) error {
	if err := e.settle(); err != nil { // no call went out since the last end of step
		return err
	}
	if err := e.collectEvents(ctx); err != nil {
		return err
	}
	commits := make([]kvcache.CommitItem, 0, len(mb.items))
	emits := make([][]int32, len(mb.items))
	sampled := make([]int, len(mb.items)) // before capping at the request's output length
	for i, it := range mb.items {
		r := e.byID[it.ID]
		accepted := it.Tokens
		if it.Sample {
			out, ok := mb.outputs[it.ID]
			if !ok || len(out.Tokens) == 0 {
				return fmt.Errorf("step %d: last stage returned no output for request %d", mb.step, it.ID)
			}
			if it.Prefill && len(out.Tokens) != 1 {
				return fmt.Errorf("step %d: request %d: prefill sampled %d tokens, want 1", mb.step, it.ID, len(out.Tokens))
			}
			acc := len(out.Tokens) - 1
			if acc > it.Draft {
				return fmt.Errorf("step %d: request %d: %d drafts accepted of %d proposed", mb.step, it.ID, acc, it.Draft)
			}
			accepted += acc
			e.rep.Tokens.DraftAccepted += int64(acc)
			emit := out.Tokens
			sampled[i] = len(emit)
			if rem := r.maxNew - len(r.tok.Generated()); len(emit) > rem {
				emit = emit[:rem]
			}
			if n, ok := r.stopAt(emit); ok {
				// A stop condition ends it here: the scheduler and the
				// release below see the shorter length.
				emit = emit[:n]
				r.stopped = true
				r.maxNew = len(r.tok.Generated()) + n
				e.sched.Shorten(it.ID, r.maxNew)
			}
			emits[i] = emit
			r.drafts = append(r.drafts[:0], out.Drafts...)
			if e.spec.KeepOutputs && out.Logits != nil {
				r.logits, r.logitsAt = out.Logits, len(r.tok.Generated())+len(out.Tokens)-1
			}
			if r.topK > 0 && len(out.TopLogprobs) == len(out.Tokens) {
				// One list per emitted token, as the tokens are cut.
				r.logprobs = append(r.logprobs, out.TopLogprobs[:len(emit)]...)
			}
			if r.dec.Logprobs && len(out.Logprobs) == len(out.Tokens) {
				r.chosen = append(r.chosen, out.Logprobs[:len(emit)]...)
			}
		}
		commits = append(commits, kvcache.CommitItem{Seq: it.ID, Accepted: accepted})
	}
	// Requests that this step finishes are released in the same call, but
	// for the prefix of forked requests, whose sequence the fork takes
	// first (fork.go).
	var finishing []kvcache.SeqID
	ends := make([]bool, len(mb.items))
	for i, it := range mb.items {
		r := e.byID[it.ID]
		if ends[i] = len(r.tok.Generated())+len(emits[i]) >= r.maxNew; ends[i] && r.group == nil {
			finishing = append(finishing, it.ID)
		}
	}
	e.commits++
	var inspect *kvcache.InspectOptions
	deep := false
	if c := e.spec.CheckEvery; c > 0 && e.commits%int64(c) == 0 {
		e.rep.Invariants.CheckedSteps++
		deep = e.spec.DeepEvery > 0 && e.rep.Invariants.CheckedSteps%int64(e.spec.DeepEvery) == 0
		inspect = &kvcache.InspectOptions{Tables: deep, CheckTables: deep}
	}
	// Commit, release the finished and inspect, in one call per stage that
	// is only started here: a plugin gets it with the next step's first
	// call, and settle checks the answers then (see ending).
	end := &ending{step: mb.step, waits: make([]func() (pipeline.EndStepResult, error), len(e.stages)), inspect: inspect != nil, deep: deep}
	req := pipeline.EndStepRequest{Commits: commits, Release: finishing, Inspect: inspect}
	e.dog.arm(slotCall, "cache manager end of step (start)", e.spec.Liveness.Call, e.managers()...)
	_ = e.eachStage(func(st *stage) error {
		end.waits[st.idx] = pipeline.StartEndStep(ctx, st.m, req)
		st.released = append(st.released, finishing...)
		for _, id := range finishing {
			st.forget(id)
		}
		return nil
	})
	e.dog.disarm(slotCall)
	e.ending = end
	for _, id := range finishing {
		r := e.byID[id]
		if r.resident {
			e.resident--
		}
		r.resident = false
	}
	for i, it := range mb.items {
		r := e.byID[it.ID]
		r.reserved = false
		if it.Prefill && !r.admitted { // its first prefill chunk, which took the reused prefix
			r.admitted = true
			e.admitted += int64(r.prompt)
			e.admittedReused += int64(r.reused)
		}
		r.history += commits[i].Accepted
		if it.Prefill {
			e.ceil.Hold(uint64(it.ID), min(r.history, r.prompt))
		}
		r.tok.Append(emits[i]...)
		if len(emits[i]) > 0 && r.firstTok < 0 {
			r.firstTok = mb.done
		}
		if r.group == nil {
			e.rep.Tokens.Generated += int64(len(emits[i]))
		}
		finished := e.sched.Complete(it.ID, commits[i].Accepted, sampled[i])
		if finished != ends[i] {
			return fmt.Errorf("step %d: request %d: the scheduler says finished %v, the engine released it %v", mb.step, it.ID, finished, !finished)
		}
		if finished {
			r.state, r.finish = stDone, mb.done
			e.active--
			if r.group != nil {
				e.forkPend = append(e.forkPend, r.group) // resident at its history until the fork
				continue
			}
			r.history = 0
			e.bar.tick(e)
		}
	}
	for _, id := range finishing {
		e.ceil.Drop(uint64(id))
	}
	e.sample(mb.done)
	e.bar.update(e)
	return nil
}

// ending is the end of one step, started on every stage by complete and
// settled by the engine's next call to the managers. Everything the engine
// does in between depends only on what it committed, not on the answers:
// the answers carry block copies for the next forward, the snapshot for the
// invariant check and the items a stage refused. So a plugin manager is
// woken once per step for the end of one step and the start of the next
// (pipeline.StepStarter), and the check still sees the engine exactly as it
// was at the end of the step: settle runs after the next phase's calls
// return and before their answers are applied.
type ending struct {
	step    uint64
	waits   []func() (pipeline.EndStepResult, error) // per stage
	inspect bool
	deep    bool
}

// settle takes the answers of the started end of a step, if any: it hands
// their copies to the workers and checks the snapshots. A stage that refused
// a commit or a release broke the contract (a commit cannot fail): the run
// stops with the stage, the step and the requests.
func (e *Engine) settle() error {
	end := e.ending
	if end == nil {
		return nil
	}
	e.ending = nil
	res := make([]pipeline.EndStepResult, len(e.stages))
	e.dog.arm(slotCall, "cache manager end of step", e.spec.Liveness.Call, e.managers()...)
	err := e.eachStage(func(st *stage) error {
		r, err := end.waits[st.idx]()
		if err != nil {
			return stageErr(st.idx, fmt.Sprintf("end of step %d", end.step), err)
		}
		res[st.idx] = r
		return nil
	})
	e.dog.disarm(slotCall)
	if err != nil {
		return err
	}
	snaps := make([]*kvcache.Snapshot, len(e.stages))
	for i, st := range e.stages {
		st.copies = append(st.copies, res[i].Commit.Copies...)
		snaps[i] = res[i].Snapshot
	}
	if end.inspect {
		return e.check(snaps, end.deep)
	}
	return nil
}

// dropEnding forgets the started end of a step after a stage died: the
// surviving stages still get it (before anything else the engine sends
// them), and the answers no longer matter.
func (e *Engine) dropEnding() {
	if end := e.ending; end != nil {
		e.ending = nil
		e.dog.arm(slotCall, "cache manager end of step (dropped)", e.spec.Liveness.Call, e.managers()...)
		for _, wait := range end.waits {
			_, _ = wait()
		}
		e.dog.disarm(slotCall)
	}
}

// release frees sequences on every stage and tells the workers.
func (e *Engine) release(ctx context.Context, ids []kvcache.SeqID) error {
	err := e.eachManager(func(st *stage) func() error {
		wait := pipeline.StartRelease(ctx, st.m, ids)
		return func() error {
			if err := wait(); err != nil {
				return stageErr(st.idx, "release", err)
			}
			st.released = append(st.released, ids...)
			for _, id := range ids {
				st.forget(id)
			}
			return nil
		}
	})
	if err != nil {
		return err
	}
	for _, id := range ids {
		r := e.byID[id]
		if r.resident {
			e.resident--
		}
		r.resident, r.history, r.reserved = false, 0, false
		e.ceil.Drop(uint64(id))
	}
	return nil
}

// stopAt says whether a stop condition ends r within emit, the tokens this
// step adds: the number of them to keep, true. A stop id ends it at that
// token (kept) once at least dec.MinTokens tokens were generated with it;
// dec.StopText is then asked about everything generated up to there.
func (r *request) stopAt(emit []int32) (int, bool) {
	d := &r.dec
	if len(emit) == 0 || len(d.StopIDs) == 0 && d.StopText == nil {
		return 0, false
	}
	before := len(r.tok.Generated())
	n, stop := len(emit), false
	for j, t := range emit {
		if before+j+1 >= d.MinTokens && slices.Contains(d.StopIDs, t) {
			n, stop = j+1, true
			break
		}
	}
	if d.StopText != nil {
		gen := slices.Concat(r.tok.Generated(), emit[:n])
		if keep, ok := d.StopText(gen, before); ok && keep > before && keep <= len(gen) {
			n, stop = keep-before, true
		}
	}
	return n, stop
}

// sampling is the worker.Sampling of r's next sampled item at pos: nil for
// a greedy request without min_tokens; otherwise dec.Sampling (greedy when
// nil) with the prompt's length, the min_tokens mask of its stop ids and,
// when penalized, the tokens before pos.
func (r *request) sampling(pos int) *worker.Sampling {
	d := &r.dec
	masked := d.MinTokens > 0 && len(d.StopIDs) > 0
	if d.Sampling == nil && !masked {
		return nil
	}
	var s worker.Sampling
	if d.Sampling != nil {
		s = *d.Sampling
	}
	s.Prompt = r.prompt
	if masked {
		s.MinTokens, s.StopIDs = d.MinTokens, d.StopIDs
	}
	if s.Penalized() {
		s.Context = r.tok.Span(0, pos)
	}
	return &s
}
