package engine

import (
	"context"
	"fmt"

	"github.com/kvx-dev/kvx/core/report"
	"github.com/kvx-dev/kvx/core/sched"
	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
	"github.com/kvx-dev/kvx/plugins/v1/pipeline"
)

// Forked requests (OpenAI's n and best_of: several sequences of one prompt).
//
// A group's prompt is prefilled once, by a hidden prefix request of the
// prompt's first P-1 tokens (it samples one token, which nobody sees). When
// it ends, the engine forks its sequence on every stage (kvcache.Forker)
// into the group's requests: each starts resident at history P-1 sharing
// the prefix's full blocks, with its own copy of the last partial block,
// and runs the prompt's last token as its first step, which samples its
// first token with its own Decoding. So each choice's tokens are those it
// would have had as a request of its own (a kernel reads KV in logical
// order, the sampler draws from the seed and the position only), and the
// prompt's KV is computed and held once. A request the fork cannot take
// (a manager without Fork, a denial, no resident room, a prefix lost to a
// plugin restart, a one-token prompt) runs as a request of its own, as
// before forks existed: the answer is the same, only the cost differs.

// forkGroup is a prefix request and the requests its sequence forks into.
type forkGroup struct {
	pre      *request
	children []*request
}

// forks reports whether every stage's manager forks sequences (its Info
// says Fork and it is a kvcache.Forker).
func (e *Engine) forks() bool {
	for _, st := range e.stages {
		if _, ok := st.m.(kvcache.Forker); !ok || !st.info.Capabilities.Fork {
			return false
		}
	}
	return len(e.stages) > 0
}

// runForks forks the sequences of the prefix requests that ended since the
// last call into their groups' requests, then releases the prefixes.
func (e *Engine) runForks(ctx context.Context) error {
	if len(e.forkPend) == 0 {
		return nil
	}
	if err := e.settle(); err != nil { // Fork follows the end of step that committed the prefixes
		return err
	}
	groups := e.forkPend
	e.forkPend = nil
	var items []kvcache.ForkItem
	var kids []*request
	var pres []kvcache.SeqID
	room := e.sched.Room()
	ok := e.forks()
	for _, g := range groups {
		if g.pre.resident {
			pres = append(pres, g.pre.id)
		}
		for _, c := range g.children {
			if ok && g.pre.resident && c.rejected == "" && room > 0 {
				room--
				c.history = g.pre.history
				items = append(items, kvcache.ForkItem{Parent: g.pre.id, Child: c.id})
				kids = append(kids, c)
				continue
			}
			e.unfork(c)
		}
	}
	if len(items) > 0 {
		if err := e.fork(ctx, items, kids, groups); err != nil {
			return err
		}
	}
	if len(pres) > 0 {
		if err := e.release(ctx, pres); err != nil {
			return err
		}
	}
	for _, g := range groups {
		if e.live != nil {
			g.pre.state = stForgotten // nobody reads it: the live engine's compaction drops it
			delete(e.byID, g.pre.id)
		}
	}
	return nil
}

// fork asks every stage to fork items and takes in the children every
// stage granted; the others run on their own (unfork), released first on
// the stages that granted them.
func (e *Engine) fork(ctx context.Context, items []kvcache.ForkItem, kids []*request, groups []*forkGroup) error {
	grants := make([][]kvcache.Grant, len(e.stages))
	e.dog.arm(slotCall, "cache manager fork", e.spec.Liveness.Call, e.managers()...)
	err := e.eachStage(func(st *stage) error {
		g, err := st.m.(kvcache.Forker).Fork(ctx, items)
		if err == nil && len(g) != len(items) {
			err = fmt.Errorf("returned %d grants for %d forks", len(g), len(items))
		}
		if err != nil {
			return stageErr(st.idx, "fork", err)
		}
		grants[st.idx] = g
		return nil
	})
	e.dog.disarm(slotCall)
	if err != nil {
		return err
	}
	granted := make([]bool, len(items))
	for i := range items {
		granted[i] = true
		for s := range e.stages {
			if !grants[s][i].OK {
				granted[i] = false
				e.log.Trace("fork denied", "stage", s, "parent", items[i].Parent, "child", items[i].Child, "reason", grants[s][i].Reason)
			}
		}
	}
	err = e.eachManager(func(st *stage) func() error {
		var undo []kvcache.SeqID
		for i, g := range grants[st.idx] {
			if g.OK && !granted[i] {
				undo = append(undo, items[i].Child)
			}
		}
		if len(undo) == 0 {
			return noCall
		}
		wait := pipeline.StartRelease(ctx, st.m, undo)
		return func() error {
			if err := wait(); err != nil {
				return stageErr(st.idx, "release of a fork another stage denied", err)
			}
			return nil
		}
	})
	if err != nil {
		return err
	}
	pre := map[kvcache.SeqID]*request{}
	for _, g := range groups {
		pre[g.pre.id] = g.pre
	}
	var refused []kvcache.SeqID
	for i, c := range kids {
		if !granted[i] {
			c.history = 0
			e.unfork(c)
			continue
		}
		p := pre[items[i].Parent]
		for s, st := range e.stages {
			g := grants[s][i]
			st.deltas[c.id] = append(st.deltas[c.id], g.Tables...)
			st.copies = append(st.copies, g.Copies...)
		}
		c.resident, c.admitted, c.reused = true, true, p.reused
		c.state = stActive
		e.resident++
		e.active++
		e.admitted += int64(c.prompt)
		e.admittedReused += int64(c.reused)
		e.byID[c.id] = c
		e.reqs = append(e.reqs, c) // admitArrivals skips it: it is active already
		if reason := e.sched.AddForked(sched.Request{ID: c.id, Prompt: c.prompt, MaxNew: c.maxNew}, c.history); reason != "" {
			refused = append(refused, c.id)
			c.state = stRejected
			e.active--
			e.rep.Requests.Rejections = append(e.rep.Requests.Rejections, report.Rejection{ID: uint64(c.id), Reason: reason})
		}
	}
	e.forked += int64(len(kids))
	if len(refused) > 0 {
		return e.release(ctx, refused)
	}
	return nil
}

// unfork makes c a request of its own: it arrives now and is admitted as
// any other (a cancelled one is dropped on arrival).
func (e *Engine) unfork(c *request) {
	c.state = stPending
	e.byID[c.id] = c
	e.reqs = append(e.reqs, c)
}
