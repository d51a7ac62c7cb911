package engine

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/kvx-dev/kvx/core/sched"
	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
	"github.com/kvx-dev/kvx/plugins/v1/pipeline"
	"github.com/kvx-dev/kvx/plugins/v1/worker"
)

// pendingForward is a micro-batch whose forward was started and not yet
// waited for.
type pendingForward struct {
	mb       *microBatch
	items    []sched.Item
	at       int64 // the clock when it was started: no stage starts before
	tokens   int
	proposed int // draft tokens
	// sent counts, per stage, the releases and copies that went with it:
	// the first ones of the stage's lists.
	released, copies []int
	wait             func() ([]worker.Result, error)
}

// startForward starts one micro-batch's forward through every stage;
// awaitForward waits for it and puts it in flight.
func (e *Engine) startForward(ctx context.Context, items []sched.Item) error {
	if err := e.settle(); err != nil { // the copies of the last end of step go with this forward
		return err
	}
	e.steps++
	e.fwdStart = time.Now()
	e.pend = e.startOnce(ctx, &microBatch{step: e.steps}, items, e.now)
	return nil
}

// awaitForward waits for the started forward, if any, and schedules its
// completion on the simulated clock. Items a worker refuses (a
// request-scoped error) fail alone and the rest run again from the first
// stage, at once; table deltas are idempotent, so a repeat is safe.
func (e *Engine) awaitForward(ctx context.Context) error {
	p := e.pend
	e.pend = nil
	for p != nil {
		res, err := p.wait()
		e.dog.disarm(slotForward)
		if err == nil {
			e.sawForward(time.Since(e.fwdStart))
		}
		err = e.finishOnce(p, res, err)
		if err == nil {
			e.inflight = append(e.inflight, p.mb)
			slices.SortStableFunc(e.inflight, func(a, b *microBatch) int { return cmp.Compare(a.done, b.done) })
			return nil
		}
		bad := itemSeqs(err)
		if len(bad) == 0 {
			return err
		}
		if ferr := e.failRequests(ctx, bad, true, err.Error()); ferr != nil {
			return ferr
		}
		items := slices.DeleteFunc(p.items, func(it sched.Item) bool { return slices.Contains(bad, it.ID) })
		if len(items) == 0 {
			return nil
		}
		e.fwdStart = time.Now()
		p = e.startOnce(ctx, p.mb, items, p.at)
	}
	return nil
}

// dropForward waits for the started forward, if any, and forgets it: a
// stage died, or the run stops.
func (e *Engine) dropForward() {
	if p := e.pend; p != nil {
		e.pend = nil
		_, _ = p.wait()
		e.dog.disarm(slotForward)
	}
}

// startOnce builds every stage's batch for items and starts the forward.
func (e *Engine) startOnce(ctx context.Context, mb *microBatch, items []sched.Item, at int64) *pendingForward {
	mb.items = items
	wItems := make([]worker.Item, len(items))
	tokens, proposed := 0, 0
	for i, it := range items {
		r := e.byID[it.ID]
		// Drafts come from the last sample: a generation step right after a
		// prefill chunk that did not sample (a recompute split at a block
		// boundary) has none, and its reserved draft slots are released by
		// the commit like rejected drafts.
		draft := min(it.Draft, len(r.drafts))
		toks := r.tok.Span(it.Pos, it.Pos+it.Tokens) // the worker only reads them
		if draft > 0 {
			toks = slices.Concat(toks, r.drafts[:draft])
		}
		wItems[i] = worker.Item{Seq: it.ID, Pos: it.Pos, Tokens: toks, Draft: draft, Sample: it.Sample}
		if it.Sample {
			wItems[i].TopLogprobs = r.topK
			wItems[i].Logits = e.spec.KeepOutputs // a vocabulary-wide row: only when kept
			wItems[i].Logprobs = r.dec.Logprobs
			wItems[i].Sampling = r.sampling(it.Pos)
		}
		if r.wantPrompt && it.Prefill && it.Pos <= len(r.promptLP) && len(r.promptLP) < r.prompt-1 {
			// This chunk holds the next positions without a row.
			wItems[i].PromptLogprobs, wItems[i].PromptTopLogprobs = true, r.promptTopK
			if end := it.Pos + it.Tokens; !it.Sample && end < r.tok.Len() {
				wItems[i].Next = r.tok.At(end)
			}
		}
		tokens += len(toks)
		proposed += draft
		r.reserved = true // in flight: an end of step the forward overlaps sees it so
	}
	// Every stage's batch is known before the first runs: the activations
	// go from stage to stage inside the workers (inside the worker process,
	// when one serves every stage).
	p := &pendingForward{mb: mb, items: items, at: at, tokens: tokens, proposed: proposed,
		released: make([]int, len(e.stages)), copies: make([]int, len(e.stages))}
	ws := make([]worker.Worker, len(e.stages))
	bs := make([]worker.Batch, len(e.stages))
	for _, st := range e.stages {
		its := wItems
		if st.idx > 0 {
			its = slices.Clone(wItems)
		}
		for i := range its {
			its[i].Tables, its[i].Snapshots = st.deltas[its[i].Seq], nil
			if len(st.snaps) > 0 { // only hybrid managers grant state saves
				its[i].Snapshots = st.snaps[its[i].Seq]
			}
		}
		ws[st.idx] = st.w
		bs[st.idx] = worker.Batch{Step: mb.step, Items: its, Released: st.released, Copies: st.copies}
		p.released[st.idx], p.copies[st.idx] = len(st.released), len(st.copies)
	}
	e.dog.arm(slotForward, "worker forward", e.forwardBound(), e.workers()...)
	p.wait = pipeline.StartForwardStages(ctx, ws, bs)
	return p
}

// finishOnce takes the results of a forward startOnce started: the stages
// that ran took their releases and copies, and when every stage ran the
// micro-batch is accounted for and gets its time on the clock.
func (e *Engine) finishOnce(p *pendingForward, results []worker.Result, err error) error {
	mb, items := p.mb, p.items
	prevEnd := p.at
	var last worker.Result
	free := make([]int64, len(e.stages))
	for i, res := range results {
		st := e.stages[i]
		st.released = st.released[:copy(st.released, st.released[p.released[i]:])]
		st.copies = st.copies[:copy(st.copies, st.copies[p.copies[i]:])]
		e.modelled = res.Modelled
		start := max(prevEnd, st.free)
		if st.idx > 0 {
			start = max(prevEnd+e.transferNanos(p.tokens), st.free)
		}
		free[st.idx] = start + max(res.Nanos, 1) // a forward takes time (see overlaps)
		prevEnd = free[st.idx]
		last = res
	}
	if err != nil {
		stage := len(results)
		var se *pipeline.StageError
		if errors.As(err, &se) {
			stage, err = se.Stage, se.Err
		}
		return stageErr(stage, fmt.Sprintf("forward step %d", mb.step), err)
	}
	// The micro-batch ran on every stage: account for it.
	for i, st := range e.stages {
		st.free = free[i]
		for _, it := range items {
			st.forget(it.ID)
		}
	}
	for _, it := range items {
		r := e.byID[it.ID]
		switch {
		case it.Prefill && r.preempts > 0:
			e.rep.Tokens.Recomputed += int64(it.Tokens)
			r.recomputed += it.Tokens
		case it.Prefill && it.Pos == it.Reuse:
			// The first chunk of the first admission: prompt tokens the
			// cache supplied, by tier, and the computed ones by reason.
			// (After a preemption reuse only saves recompute.)
			e.accountCache(r, it.Reuse)
			r.reused = it.Reuse
		}
	}
	e.rep.Tokens.DraftProposed += int64(p.proposed)
	mb.done = prevEnd
	e.takePromptRows(items, last.Prompt)
	mb.outputs = make(map[kvcache.SeqID]worker.Output, len(last.Outputs))
	for _, o := range last.Outputs {
		mb.outputs[o.Seq] = o
	}
	return nil
}

// transferNanos is the simulated time to hand activations to the next stage.
func (e *Engine) transferNanos(tokens int) int64 {
	bw := e.spec.Hardware.NVLinkBW
	if bw <= 0 {
		return 0
	}
	return int64(float64(tokens*e.spec.Hidden*2) / bw * 1e9)
}

// takePromptRows keeps, of each item's prompt rows, those of the positions
// its request has no row for yet, up to the prompt's last but one: so a
// recompute (after a preemption or a plugin restart) adds none, and each
// position's row is taken once whatever the chunking.
func (e *Engine) takePromptRows(items []sched.Item, rows []worker.PromptLogprobs) {
	for _, p := range rows {
		r := e.byID[p.Seq]
		k := slices.IndexFunc(items, func(it sched.Item) bool { return it.ID == p.Seq })
		if r == nil || k < 0 {
			continue
		}
		from := len(r.promptLP) - items[k].Pos // the first row not yet taken
		if from < 0 || from >= len(p.Logprobs) {
			continue
		}
		n := min(len(p.Logprobs), r.prompt-1-items[k].Pos)
		if n <= from {
			continue
		}
		r.promptLP = append(r.promptLP, p.Logprobs[from:n]...)
		if r.promptTopK > 0 && len(p.TopLogprobs) == len(p.Logprobs) {
			r.promptTop = append(r.promptTop, p.TopLogprobs[from:n]...)
		}
	}
}
