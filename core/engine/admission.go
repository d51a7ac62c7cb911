package engine

import (
	"context"
	"fmt"
	"slices"

	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
)

// admission is the scheduler's view of capacity: every call fans out to all
// pipeline stages and the answer is the same on every stage, by construction.
// A reservation is granted only when every stage grants it; a partial grant
// is undone on the stages that granted.
type admission struct {
	e   *Engine
	ctx context.Context
}

// Lookup returns, per request, the reusable prompt tokens on every stage:
// the minimum over stages, so all stages reuse the same prefix.
func (a admission) Lookup(ids []kvcache.SeqID) []int {
	e := a.e
	out := make([]int, len(ids))
	if e.err != nil {
		return out
	}
	items := make([]kvcache.LookupItem, len(ids))
	for i, id := range ids {
		items[i] = kvcache.LookupItem{Seq: id, Prompt: e.byID[id].tokens}
	}
	answers := make([][]int, len(e.stages))
	err := e.eachStage(func(st *stage) error {
		got, err := st.m.Lookup(a.ctx, items)
		if err == nil && len(got) != len(items) {
			err = fmt.Errorf("returned %d answers for %d items", len(got), len(items))
		}
		if err != nil {
			return stageErr(st.idx, "lookup", err)
		}
		answers[st.idx] = got
		return nil
	})
	if err != nil {
		e.err = err
		return out
	}
	for s, got := range answers {
		for i, n := range got {
			if s == 0 || n < out[i] {
				out[i] = n
			}
		}
	}
	return out
}

// Reserve grants each ask on every stage or on none.
func (a admission) Reserve(asks []kvcache.ReserveItem) []bool {
	e := a.e
	ok := make([]bool, len(asks))
	if e.err != nil || len(asks) == 0 {
		return ok
	}
	reuse := e.spec.Managers[0].EnableBlockReuse
	for i := range asks {
		ok[i] = true
		if asks[i].New && reuse {
			asks[i].Prompt = e.byID[asks[i].Seq].tokens
		}
	}
	grants := make([][]kvcache.Grant, len(e.stages))
	err := e.eachStage(func(st *stage) error {
		g, err := st.m.Reserve(a.ctx, asks)
		if err == nil && len(g) != len(asks) {
			err = fmt.Errorf("returned %d grants for %d asks", len(g), len(asks))
		}
		if err != nil {
			return stageErr(st.idx, "reserve", err)
		}
		grants[st.idx] = g
		return nil
	})
	if err != nil {
		// Undo what the stages that answered granted; nothing is granted.
		e.err = err
		a.undo(grants, asks, make([]bool, len(asks)))
		clear(ok)
		return ok
	}
	for s, g := range grants {
		for i := range g {
			if !g[i].OK {
				ok[i] = false
				e.log.Trace("reserve denied", "stage", s, "seq", asks[i].Seq, "reason", g[i].Reason)
			}
		}
	}
	a.undo(grants, asks, ok)
	if e.err != nil {
		clear(ok)
		return ok
	}
	for i, ask := range asks {
		if !ok[i] {
			continue
		}
		r := e.byID[ask.Seq]
		if ask.New {
			r.resident = true
			r.history = ask.Reuse
			e.resident++
		}
		for s, st := range e.stages {
			if t := grants[s][i].Tables; len(t) > 0 {
				st.deltas[ask.Seq] = append(st.deltas[ask.Seq], t...)
			}
			st.copies = append(st.copies, grants[s][i].Copies...)
		}
	}
	return ok
}

// undo unreserves, on each stage of grants, the asks that stage granted but
// that are not granted overall.
func (a admission) undo(grants [][]kvcache.Grant, asks []kvcache.ReserveItem, ok []bool) {
	e := a.e
	err := e.eachStage(func(st *stage) error {
		var seqs []kvcache.SeqID
		for i, g := range grants[st.idx] {
			if g.OK && !ok[i] {
				seqs = append(seqs, asks[i].Seq)
			}
		}
		if len(seqs) == 0 {
			return nil
		}
		if err := st.m.Unreserve(a.ctx, seqs); err != nil {
			return stageErr(st.idx, "unreserve", err)
		}
		return nil
	})
	if err != nil && e.err == nil {
		e.err = err
	}
}

// Release frees sequences on every stage: preempted requests (recomputed
// when admitted again) or rejected ones. The loop counts preemptions from
// the step's Preempted list.
func (a admission) Release(ids []kvcache.SeqID) {
	e := a.e
	if e.err != nil {
		return
	}
	if err := e.release(a.ctx, ids); err != nil {
		e.err = err
	}
}

// Suspend implements sched.Suspender: each sequence moves to the host tier on
// every stage or stays resident on all.
func (a admission) Suspend(ids []kvcache.SeqID) []bool { return a.move(ids, true) }

// Resume implements sched.Suspender: each sequence comes back on every stage
// or stays suspended on all.
func (a admission) Resume(ids []kvcache.SeqID) []bool { return a.move(ids, false) }

// move suspends or resumes ids on every stage. A sequence one stage refused
// is moved back on the stages that moved it, so all stages agree; a refused
// item (a reservation in flight) is a refusal, not an error.
func (a admission) move(ids []kvcache.SeqID, suspend bool) []bool {
	e := a.e
	ok := make([]bool, len(ids))
	if e.err != nil || len(ids) == 0 {
		return ok
	}
	op := func(m kvcache.Manager, to bool, seqs []kvcache.SeqID) ([]bool, []kvcache.Copy, error) {
		if to {
			return m.Suspend(a.ctx, seqs)
		}
		return m.Resume(a.ctx, seqs)
	}
	moved := make([][]bool, len(e.stages))
	err := e.eachStage(func(st *stage) error {
		res, copies, err := op(st.m, suspend, ids)
		if err != nil && len(itemSeqs(err)) == 0 {
			return stageErr(st.idx, "suspend or resume", err)
		}
		if len(res) != len(ids) {
			res = make([]bool, len(ids)) // refused as a whole
		}
		moved[st.idx] = res
		st.copies = append(st.copies, copies...)
		return nil
	})
	if err != nil {
		e.err = err
		return ok
	}
	for i := range ids {
		ok[i] = true
		for _, res := range moved {
			ok[i] = ok[i] && res[i]
		}
	}
	err = e.eachStage(func(st *stage) error {
		var back []kvcache.SeqID
		for i, id := range ids {
			if moved[st.idx][i] && !ok[i] {
				back = append(back, id)
			}
		}
		if len(back) == 0 {
			return nil
		}
		res, copies, err := op(st.m, !suspend, back)
		st.copies = append(st.copies, copies...)
		if err == nil && slices.Contains(res, false) {
			err = fmt.Errorf("could not undo a partial suspend or resume of %v", back)
		}
		if err != nil {
			return stageErr(st.idx, "undo suspend or resume", err)
		}
		return nil
	})
	if err != nil {
		e.err = err
		clear(ok)
	}
	return ok
}
