package pipeline

import (
	"context"
	"errors"
	"fmt"

	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
)

// StepEnder is an optional kvcache.Manager interface, found by type assertion: one
// call that ends a step on a stage. EndStep has exactly the effects of
// Commit(Commits), then Release(Release), then, when Inspect is set,
// Inspect(*Inspect). The plugin client implements it, so over gRPC the end
// of a step costs one round trip per stage instead of three; a manager need
// not implement it (EndStep below falls back to the three calls).
type StepEnder interface {
	EndStep(ctx context.Context, req EndStepRequest) (EndStepResult, error)
}

// EndStepRequest is the end of one step on one stage.
type EndStepRequest struct {
	Commits []kvcache.CommitItem
	Release []kvcache.SeqID
	Inspect *kvcache.InspectOptions // nil: no snapshot
}

// EndStepResult is what the three calls return.
type EndStepResult struct {
	Commit   kvcache.CommitResult
	Snapshot *kvcache.Snapshot // nil unless the request asked for one
}

// EndStep ends a step on m: through StepEnder when m implements it, else with
// Commit, Release and Inspect in that order. Refused commit or release items
// come back as one item-scoped *kvcache.Error listing their sequences, after
// everything valid was applied and the snapshot taken; any other error
// stops the sequence of calls and is returned as is.
func EndStep(ctx context.Context, m kvcache.Manager, req EndStepRequest) (EndStepResult, error) {
	if se, ok := m.(StepEnder); ok {
		return se.EndStep(ctx, req)
	}
	var res EndStepResult
	var refused []kvcache.SeqID
	var msgs []string
	keep := func(err error) error {
		var ke *kvcache.Error
		if errors.As(err, &ke) && ke.Kind == kvcache.KindInvalidArg && len(ke.Seqs) > 0 {
			refused = append(refused, ke.Seqs...)
			msgs = append(msgs, ke.Msg)
			return nil
		}
		return err
	}
	cr, err := m.Commit(ctx, req.Commits)
	res.Commit = cr
	if err := keep(err); err != nil {
		return res, err
	}
	if len(req.Release) > 0 {
		if err := keep(m.Release(ctx, req.Release)); err != nil {
			return res, err
		}
	}
	if req.Inspect != nil {
		snap, err := m.Inspect(ctx, *req.Inspect)
		if err != nil {
			return res, err
		}
		res.Snapshot = &snap
	}
	if len(refused) > 0 {
		return res, kvcache.ItemErrorf(refused, "%s", fmt.Sprint(msgs))
	}
	return res, nil
}

// StepStarter is an optional kvcache.Manager interface, found by type assertion: it
// sends the end of a step without waiting for the answer, which wait
// returns. Every later call on the manager is applied after it, so a caller
// may go on with the next step's calls before it waits; the plugin client
// implements it by sending the end of a step together with the next call,
// one round trip where there were two. Call wait once.
type StepStarter interface {
	StartEndStep(ctx context.Context, req EndStepRequest) (wait func() (EndStepResult, error))
}

// StartEndStep starts the end of a step on m: through StepStarter when m
// implements it, else by running EndStep now, whose answer wait returns.
func StartEndStep(ctx context.Context, m kvcache.Manager, req EndStepRequest) (wait func() (EndStepResult, error)) {
	if ss, ok := m.(StepStarter); ok {
		return ss.StartEndStep(ctx, req)
	}
	res, err := EndStep(ctx, m, req)
	return func() (EndStepResult, error) { return res, err }
}

// CallStarter is an optional kvcache.Manager interface, found by type assertion:
// each method starts the call of the same name and returns without its
// answer, which wait returns. The caller waits before it makes any other
// call on the same manager; calls on other managers may come in between.
// The plugin client implements it so that the calls of the stages one
// process serves go in one write, sent when the first of them is waited
// for: the engine starts a call on every stage, then waits for each, and
// the process wakes once. Call each wait exactly once. Callers use the
// functions Start* below, which fall back to the plain call, run at once.
type CallStarter interface {
	StartLookup(ctx context.Context, items []kvcache.LookupItem) (wait func() ([]int, error))
	StartReserve(ctx context.Context, items []kvcache.ReserveItem) (wait func() ([]kvcache.Grant, error))
	StartUnreserve(ctx context.Context, seqs []kvcache.SeqID) (wait func() error)
	StartRelease(ctx context.Context, seqs []kvcache.SeqID) (wait func() error)
}

// SuspendStarter is CallStarter for a kvcache.Suspender's two calls, found by type
// assertion on the kvcache.Suspender.
type SuspendStarter interface {
	StartSuspend(ctx context.Context, seqs []kvcache.SeqID) (wait func() ([]bool, []kvcache.Copy, error))
	StartResume(ctx context.Context, seqs []kvcache.SeqID) (wait func() ([]bool, []kvcache.Copy, error))
}

// StartLookup starts m.Lookup (see CallStarter).
func StartLookup(ctx context.Context, m kvcache.Manager, items []kvcache.LookupItem) (wait func() ([]int, error)) {
	if cs, ok := m.(CallStarter); ok {
		return cs.StartLookup(ctx, items)
	}
	n, err := m.Lookup(ctx, items)
	return func() ([]int, error) { return n, err }
}

// ExplainStarter is CallStarter for a kvcache.Explainer's call, found by
// type assertion on the manager.
type ExplainStarter interface {
	StartExplain(ctx context.Context, items []kvcache.LookupItem) (wait func() ([]kvcache.Explanation, error))
}

// StartExplain starts m's explained lookup when explain is set (the
// manager's Info says Explain, so it is a kvcache.Explainer), else its
// Lookup, whose answers it wraps as Explanations of MissUnknown.
func StartExplain(ctx context.Context, m kvcache.Manager, items []kvcache.LookupItem, explain bool) (wait func() ([]kvcache.Explanation, error)) {
	if explain {
		if es, ok := m.(ExplainStarter); ok {
			return es.StartExplain(ctx, items)
		}
		if ex, ok := m.(kvcache.Explainer); ok {
			res, err := ex.Explain(ctx, items)
			return func() ([]kvcache.Explanation, error) { return res, err }
		}
	}
	lookup := StartLookup(ctx, m, items)
	return func() ([]kvcache.Explanation, error) {
		n, err := lookup()
		var ex []kvcache.Explanation
		if n != nil {
			ex = make([]kvcache.Explanation, len(n))
			for i, t := range n {
				ex[i].Tokens = t
			}
		}
		return ex, err
	}
}

// StartReserve starts m.Reserve (see CallStarter).
func StartReserve(ctx context.Context, m kvcache.Manager, items []kvcache.ReserveItem) (wait func() ([]kvcache.Grant, error)) {
	if cs, ok := m.(CallStarter); ok {
		return cs.StartReserve(ctx, items)
	}
	g, err := m.Reserve(ctx, items)
	return func() ([]kvcache.Grant, error) { return g, err }
}

// StartUnreserve starts m.Unreserve (see CallStarter).
func StartUnreserve(ctx context.Context, m kvcache.Manager, seqs []kvcache.SeqID) (wait func() error) {
	if cs, ok := m.(CallStarter); ok {
		return cs.StartUnreserve(ctx, seqs)
	}
	err := m.Unreserve(ctx, seqs)
	return func() error { return err }
}

// StartSuspend starts s.Suspend (see SuspendStarter).
func StartSuspend(ctx context.Context, s kvcache.Suspender, seqs []kvcache.SeqID) (wait func() ([]bool, []kvcache.Copy, error)) {
	if ss, ok := s.(SuspendStarter); ok {
		return ss.StartSuspend(ctx, seqs)
	}
	ok, copies, err := s.Suspend(ctx, seqs)
	return func() ([]bool, []kvcache.Copy, error) { return ok, copies, err }
}

// StartResume starts s.Resume (see SuspendStarter).
func StartResume(ctx context.Context, s kvcache.Suspender, seqs []kvcache.SeqID) (wait func() ([]bool, []kvcache.Copy, error)) {
	if ss, ok := s.(SuspendStarter); ok {
		return ss.StartResume(ctx, seqs)
	}
	ok, copies, err := s.Resume(ctx, seqs)
	return func() ([]bool, []kvcache.Copy, error) { return ok, copies, err }
}

// StartRelease starts m.Release (see CallStarter).
func StartRelease(ctx context.Context, m kvcache.Manager, seqs []kvcache.SeqID) (wait func() error) {
	if cs, ok := m.(CallStarter); ok {
		return cs.StartRelease(ctx, seqs)
	}
	err := m.Release(ctx, seqs)
	return func() error { return err }
}
