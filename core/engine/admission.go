package engine

import (
	"context"
	"fmt"
	"slices"

	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
	"github.com/kvx-dev/kvx/plugins/v1/pipeline"
)

// admission is the scheduler's view of capacity: every call fans out to all
// pipeline stages and the answer is the same on every stage, by construction.
// A reservation is granted only when every stage grants it; a partial grant
// is undone on the stages that granted.
type admission struct {
	e   *Engine
	ctx context.Context
}

// Lookup returns, per request, the prompt tokens every stage can reuse.
// Stages may answer different lengths (a Mamba stage reuses only at its
// snapshot boundaries, an attention-only stage at any block), and the
// minimum of two valid lengths need not be valid on both. So the stages are
// asked again about the prompt cut at the minimum, which each answers with
// its longest valid length within it, until they agree: the answers only
// shrink, so this ends, at 0 at worst (reuse off for that request).
//
// When every stage's manager explains (Capabilities.Explain) the calls are
// Explain, else Lookup (reasons MissUnknown). The request keeps the
// explanation of the stage that limited its match in the first round, the
// one asked about the whole prompt: a later round asks about a prompt cut
// at that limit, whose answer would say partial_block. Every item carries
// the engine clock (LookupItem.Now).
func (a admission) Lookup(ids []kvcache.SeqID) []int {
	e := a.e
	out := make([]int, len(ids))
	if e.err != nil {
		return out
	}
	explain := e.explains()
	limit := make([]int, len(ids))   // prompt length asked about
	open := make([]int, 0, len(ids)) // indexes of ids still to settle
	for i, id := range ids {
		limit[i] = e.byID[id].tok.Len()
		if e.byID[id].wantPrompt {
			continue // every prompt position is computed: out[i] = 0
		}
		open = append(open, i)
	}
	for round := 0; len(open) > 0; round++ {
		if round == maxLookupRounds {
			for _, i := range open {
				out[i] = 0
			}
			break
		}
		items := make([]kvcache.LookupItem, len(open))
		for k, i := range open {
			r := e.byID[ids[i]]
			items[k] = kvcache.LookupItem{Seq: ids[i], Prompt: r.tok.Span(0, limit[i]), CacheSalt: r.salt, Now: e.now}
		}
		answers := make([][]kvcache.Explanation, len(e.stages))
		err := e.eachManager(func(st *stage) func() error {
			wait := pipeline.StartExplain(a.ctx, st.m, items, explain)
			return func() error { return lookupAnswer(st, wait, items, answers) }
		})
		if err != nil {
			e.err = err
			return make([]int, len(ids))
		}
		next := open[:0]
		for k, i := range open {
			lo, hi, by := answers[0][k].Tokens, answers[0][k].Tokens, 0
			for s, got := range answers[1:] {
				if got[k].Tokens < lo {
					lo, by = got[k].Tokens, s+1
				}
				hi = max(hi, got[k].Tokens)
			}
			if round == 0 {
				e.byID[ids[i]].explain = answers[by][k]
			}
			out[i] = lo
			if lo != hi {
				limit[i] = lo + 1 // the stages disagree: ask again within lo
				next = append(next, i)
			}
		}
		open = next
	}
	return out
}

// explains reports whether every stage's manager is an Explainer (its Info
// says Explain): the engine asks for explanations only then, so that all
// stages answer the same call.
func (e *Engine) explains() bool {
	for _, st := range e.stages {
		if !st.info.Capabilities.Explain {
			return false
		}
	}
	return len(e.stages) > 0
}

// lookupAnswer takes a stage's answer to Lookup (or Explain) into answers.
func lookupAnswer(st *stage, wait func() ([]kvcache.Explanation, error), items []kvcache.LookupItem, answers [][]kvcache.Explanation) error {
	got, err := wait()
	if err == nil && len(got) != len(items) {
		err = fmt.Errorf("returned %d answers for %d items", len(got), len(items))
	}
	if err == nil {
		for k, ex := range got {
			n := ex.Tokens
			if n < 0 || (n > 0 && n >= len(items[k].Prompt)) {
				err = fmt.Errorf("request %d: %d reusable tokens of a %d-token prompt: want 0 <= n < prompt length", items[k].Seq, n, len(items[k].Prompt))
				break
			}
			if ex.HostTokens < 0 || ex.HostTokens > n {
				err = fmt.Errorf("request %d: %d of %d reusable tokens on the host tier: want 0 <= host <= reusable", items[k].Seq, ex.HostTokens, n)
				break
			}
		}
	}
	if err != nil {
		return stageErr(st.idx, "lookup", err)
	}
	answers[st.idx] = got
	return nil
}

// maxLookupRounds bounds Lookup's rounds; requests whose stages still
// disagree after it reuse nothing. Real managers agree within two or three.
const maxLookupRounds = 8

// Reserve grants each ask on every stage or on none. It completes the
// scheduler's asks: every one gets the engine clock (Now), and a new
// sequence its prompt and salt (with reuse) and the request's retention
// priority and duration.
//
// With more than one stage, the lead stage (Engine.lead) reserves first and
// the others, at once, only the asks it granted; an ask another stage
// denies is undone on the stages that granted it, and that stage leads
// from then on. An undo restores the stage's capacity exactly but not
// always its cache: the cached blocks the allocation evicted come back only
// where nothing can have overwritten them (cachemgr_v1, cachemgr_v2:
// undo.go), and an evicted block whose offload to the host tier was undone
// below a parent that another reservation then evicted is lost with the
// host blocks under it. Asked all at once, the stage with the least room
// denies and the others undo, at every retry of a request that does not
// fit yet; led by that stage, the others are asked only what it granted.
func (a admission) Reserve(asks []kvcache.ReserveItem) []bool {
	e := a.e
	ok := make([]bool, len(asks))
	if e.err != nil || len(asks) == 0 {
		return ok
	}
	reuse := e.spec.Managers[0].EnableBlockReuse
	for i := range asks {
		ok[i] = true
		asks[i].Now = e.now
		if !asks[i].New {
			continue
		}
		r := e.byID[asks[i].Seq]
		if reuse {
			asks[i].Prompt, asks[i].CacheSalt = r.tok.All(), r.salt
		}
		asks[i].Priority, asks[i].PriorityDuration = r.priority, r.priorityDur
		if r.priority != 0 {
			e.warnRetention()
		}
	}
	grants := make([][]kvcache.Grant, len(e.stages))
	lead := e.lead
	if len(e.stages) == 1 {
		lead = -1 // one phase
	}
	err := a.reserveOn(asks, grants, func(st *stage) bool { return lead < 0 || st.idx == lead })
	if err == nil && lead >= 0 {
		// The other stages reserve what the lead granted (sub, at idx).
		var sub []kvcache.ReserveItem
		var idx []int
		for i, g := range grants[lead] {
			if g.OK {
				sub, idx = append(sub, asks[i]), append(idx, i)
			}
		}
		part := make([][]kvcache.Grant, len(e.stages))
		if len(sub) > 0 {
			err = a.reserveOn(sub, part, func(st *stage) bool { return st.idx != lead })
		}
		for s := range e.stages {
			if s == lead {
				continue
			}
			grants[s] = make([]kvcache.Grant, len(asks))
			for k, g := range part[s] {
				grants[s][idx[k]] = g
			}
		}
	}
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
				if ok[i] && lead >= 0 && s != lead && grants[lead][i].OK {
					e.lead = s
				}
				ok[i] = false
				if lead < 0 || s == lead || grants[lead][i].OK {
					e.log.Trace("reserve denied", "stage", s, "seq", asks[i].Seq, "reason", g[i].Reason)
				}
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
			e.ceil.Admit(uint64(ask.Seq), r.salt, r.tok.Prompt(), ask.Reuse)
			r.resident = true
			r.history = ask.Reuse
			e.resident++
			// The stages agree on Reuse; the host tier's share is the
			// largest any stage reports (a stage that brought more back
			// from its host tier paid the copies).
			r.hostReused = 0
			for s := range e.stages {
				r.hostReused = max(r.hostReused, min(grants[s][i].HostReused, ask.Reuse))
			}
		}
		for s, st := range e.stages {
			if t := grants[s][i].Tables; len(t) > 0 {
				st.deltas[ask.Seq] = append(st.deltas[ask.Seq], t...)
			}
			if ss := grants[s][i].Snapshots; len(ss) > 0 {
				st.snaps[ask.Seq] = ss
			} else {
				delete(st.snaps, ask.Seq)
			}
			st.copies = append(st.copies, grants[s][i].Copies...)
		}
	}
	return ok
}

// reserveOn asks the stages that on selects to reserve asks, at once, and
// puts each one's grants in grants.
func (a admission) reserveOn(asks []kvcache.ReserveItem, grants [][]kvcache.Grant, on func(*stage) bool) error {
	return a.e.eachManager(func(st *stage) func() error {
		if !on(st) {
			return noCall
		}
		wait := pipeline.StartReserve(a.ctx, st.m, asks)
		return func() error {
			g, err := wait()
			if err == nil && len(g) != len(asks) {
				err = fmt.Errorf("returned %d grants for %d asks", len(g), len(asks))
			}
			if err != nil {
				return stageErr(st.idx, "reserve", err)
			}
			grants[st.idx] = g
			return nil
		}
	})
}

// warnRetention logs, once per run, that a retention priority reaches a
// manager that ignores it (its Info lacks Retention): priorities are hints.
func (e *Engine) warnRetention() {
	if e.warnedRetention {
		return
	}
	for _, st := range e.stages {
		if !st.info.Capabilities.Retention {
			e.warnedRetention = true
			e.log.Warn("requests carry a retention priority, but the cache manager ignores it (its Info does not say Retention)",
				"stage", st.idx, "manager", st.info.Name+" "+st.info.Version)
			return
		}
	}
}

// undo unreserves, on each stage of grants, the asks that stage granted but
// that are not granted overall.
func (a admission) undo(grants [][]kvcache.Grant, asks []kvcache.ReserveItem, ok []bool) {
	e := a.e
	err := e.eachManager(func(st *stage) func() error {
		var seqs []kvcache.SeqID
		for i, g := range grants[st.idx] {
			if g.OK && !ok[i] {
				seqs = append(seqs, asks[i].Seq)
			}
		}
		if len(seqs) == 0 {
			return noCall
		}
		wait := pipeline.StartUnreserve(a.ctx, st.m, seqs)
		return func() error {
			if err := wait(); err != nil {
				return stageErr(st.idx, "unreserve", err)
			}
			return nil
		}
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
	// The scheduler suspends only when every stage has a Suspender (sp).
	start := func(sp kvcache.Suspender, to bool, seqs []kvcache.SeqID) func() ([]bool, []kvcache.Copy, error) {
		if to {
			return pipeline.StartSuspend(a.ctx, sp, seqs)
		}
		return pipeline.StartResume(a.ctx, sp, seqs)
	}
	moved := make([][]bool, len(e.stages))
	copies := make([][]kvcache.Copy, len(e.stages)) // after the last end of step's
	err := e.eachManager(func(st *stage) func() error {
		wait := start(st.sp, suspend, ids)
		return func() error {
			res, c, err := wait()
			if err != nil && len(itemSeqs(err)) == 0 {
				return stageErr(st.idx, "suspend or resume", err)
			}
			if len(res) != len(ids) {
				res = make([]bool, len(ids)) // refused as a whole
			}
			moved[st.idx], copies[st.idx] = res, c
			return nil
		}
	})
	if err != nil {
		e.err = err
		return ok
	}
	for i, st := range e.stages {
		st.copies = append(st.copies, copies[i]...)
	}
	for i := range ids {
		ok[i] = true
		for _, res := range moved {
			ok[i] = ok[i] && res[i]
		}
	}
	defer func() { // once the moves back are settled
		for i, id := range ids {
			switch {
			case !ok[i]:
			case suspend:
				e.ceil.Drop(uint64(id))
			default:
				r := e.byID[id]
				e.ceil.Hold(uint64(id), min(r.history, r.prompt))
			}
		}
	}()
	err = e.eachManager(func(st *stage) func() error {
		var back []kvcache.SeqID
		for i, id := range ids {
			if moved[st.idx][i] && !ok[i] {
				back = append(back, id)
			}
		}
		if len(back) == 0 {
			return noCall
		}
		wait := start(st.sp, !suspend, back)
		return func() error {
			res, copies, err := wait()
			st.copies = append(st.copies, copies...)
			if err == nil && slices.Contains(res, false) {
				err = fmt.Errorf("could not undo a partial suspend or resume of %v", back)
			}
			if err != nil {
				return stageErr(st.idx, "undo suspend or resume", err)
			}
			return nil
		}
	})
	if err != nil {
		e.err = err
		clear(ok)
	}
	return ok
}
