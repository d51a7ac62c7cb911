package engine

import (
	"context"
	"errors"
	"fmt"
	"reflect"

	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
)

// A prefix cache reset (vLLM's POST /reset_prefix_cache) drops every cached
// block of every stage's manager, in every tier, so that the next requests
// find nothing to reuse: what a benchmark does between its warm-up and its
// measured phase.
//
// The manager contract (kvcache.Manager) has no call that only drops the
// cache, and adding a method to a published interface is not how it grows.
// It has one that does more: Configure resets all state ("calling it again
// drops every sequence and cached block", which the conformance suite checks
// as "a config that configured once configures again"). So a reset is a
// second Configure of every stage's manager with the same configuration, and
// it is done only when the engine holds no sequence, as vLLM refuses to reset
// while blocks are in use: at the loop's idle point, after the last end of
// step reached the managers. The layout a manager gives must be the one the
// worker was configured with; one that differs reconfigures the worker too.
// The counters a manager keeps since Configure (evictions, snapshots) carry
// over in the stage's base, so the report still counts the whole life.

// ErrBusy is the error of a prefix cache reset asked for while the engine
// serves requests: it resets only when idle.
var ErrBusy = errors.New("the engine is serving requests")

// ResetResult is what a prefix cache reset did.
type ResetResult struct {
	// CachedBlocks are the blocks, over every stage and tier, that held
	// reusable content before the reset; CachedAfter those after it (0).
	CachedBlocks, CachedAfter int
	// WorkerReconfigured is set when a manager's new layout differed and
	// the worker was configured again to match.
	WorkerReconfigured bool
}

// resetReq is one ResetPrefixCache call waiting for the loop.
type resetReq struct {
	res  ResetResult
	err  error
	done chan struct{}
}

// ResetPrefixCache drops every cached prefix block of every stage's manager
// (see above). It waits for the loop's next idle point; while requests are
// being served it fails at once with ErrBusy naming them, and after the
// engine stopped with ErrStopped. ctx bounds the wait only: a reset the loop
// has taken completes.
func (lv *Live) ResetPrefixCache(ctx context.Context) (ResetResult, error) {
	rq := &resetReq{done: make(chan struct{})}
	lv.mu.Lock()
	if lv.stopped {
		lv.mu.Unlock()
		return ResetResult{}, ErrStopped
	}
	lv.resets = append(lv.resets, rq)
	lv.mu.Unlock()
	lv.wake()
	select {
	case <-rq.done:
		return rq.res, rq.err
	case <-lv.doneC:
		return ResetResult{}, ErrStopped
	case <-ctx.Done():
		return ResetResult{}, ctx.Err()
	}
}

// refuseResets answers the resets waiting with ErrBusy when requests are
// open; the loop calls it each turn. With none open the resets wait for
// idle, which the loop reaches next.
func (lv *Live) refuseResets(e *Engine) {
	if len(lv.open) == 0 {
		return
	}
	lv.mu.Lock()
	rs := lv.resets
	lv.resets = nil
	lv.mu.Unlock()
	for _, rq := range rs {
		rq.err = fmt.Errorf("%w: %d requests in flight (%d running, %d waiting): the prefix cache is reset only when none is (as vLLM's reset_prefix_cache)",
			ErrBusy, len(lv.open), e.sched.Running(), e.sched.Waiting())
		close(rq.done)
	}
}

// runResets performs the resets waiting, on the loop goroutine at its idle
// point (nothing admitted, the last end of step settled). An error is a
// plugin call's, for the loop to act on (a dead plugin is restarted, which
// empties its cache too).
func (lv *Live) runResets(ctx context.Context, e *Engine) error {
	lv.mu.Lock()
	rs := lv.resets
	lv.resets = nil
	lv.mu.Unlock()
	if len(rs) == 0 {
		return nil
	}
	res, err := e.resetPrefixCache(ctx)
	for _, rq := range rs {
		rq.res, rq.err = res, err
		close(rq.done)
	}
	lv.refreshStats(ctx, e, true)
	return err
}

// resetPrefixCache configures every stage's manager again (see above).
func (e *Engine) resetPrefixCache(ctx context.Context) (ResetResult, error) {
	var res ResetResult
	if err := e.collectEvents(ctx); err != nil { // what happened before the reset goes out first
		return res, err
	}
	for _, st := range e.stages {
		e.dog.arm(slotCall, fmt.Sprintf("stage %d: cache manager Configure for a prefix cache reset", st.idx), e.spec.Liveness.Configure, st.m, st.w)
		err := e.resetStage(ctx, st, &res)
		e.dog.disarm(slotCall)
		if err != nil {
			return res, err
		}
	}
	if err := e.collectEvents(ctx); err != nil { // the AllBlocksCleared of the new Configure
		return res, err
	}
	e.log.Info("prefix cache reset", "cached blocks dropped", res.CachedBlocks, "left", res.CachedAfter)
	return res, nil
}

func (e *Engine) resetStage(ctx context.Context, st *stage, res *ResetResult) error {
	before, err := st.m.Stats(ctx)
	if err != nil {
		return stageErr(st.idx, "stats before the prefix cache reset", err)
	}
	if before.Sequences > 0 {
		return stageErr(st.idx, "prefix cache reset", fmt.Errorf("the manager holds %d sequences at the engine's idle point, want 0", before.Sequences))
	}
	for _, p := range before.Pools {
		res.CachedBlocks += p.Cached
	}
	st.base.Evictions += before.Evictions
	st.base.Snapshots = addSnapshots(st.base.Snapshots, before.Snapshots)
	mc := e.spec.Managers[st.idx]
	mc.KVEvents = st.events != nil
	layout, err := st.m.Configure(ctx, mc)
	if err != nil {
		return stageErr(st.idx, "configure for a prefix cache reset", err)
	}
	if !reflect.DeepEqual(layout.Pools, st.layout.Pools) || layout.MaxSeqTokens != st.layout.MaxSeqTokens || layout.MaxSequences != st.layout.MaxSequences {
		wc := e.spec.Workers[st.idx]
		wc.Layout = layout
		if _, err := st.w.Configure(ctx, wc); err != nil {
			return stageErr(st.idx, "configure worker for a prefix cache reset", err)
		}
		res.WorkerReconfigured = true
		st.layout = layout
		st.sp = suspender(st.m, st.info, layout)
	}
	// Copies the next forward would make are of blocks the manager forgot.
	st.copies = st.copies[:0]
	after, err := st.m.Stats(ctx)
	if err != nil {
		return stageErr(st.idx, "stats after the prefix cache reset", err)
	}
	for _, p := range after.Pools {
		res.CachedAfter += p.Cached
	}
	return nil
}

// baseStats are a stage's manager counters from before its last reset.
type baseStats struct {
	Evictions int64
	Snapshots kvcache.SnapshotStats
}
