package engine

import "sync"

// eachStage calls f for every stage, concurrently when there are several, and
// returns the error of the lowest stage that failed. Each phase's calls go to
// different plugin processes, so running them side by side hides the
// round-trip latency of all but one; f must touch only its own stage. Stage
// 0 runs on the calling goroutine, whose stack has long grown to what a
// call needs (a fresh goroutine's stack is copied as it grows, every phase).
func (e *Engine) eachStage(f func(st *stage) error) error {
	if len(e.stages) == 1 {
		return f(e.stages[0])
	}
	errs := make([]error, len(e.stages))
	var wg sync.WaitGroup
	for i, st := range e.stages[1:] {
		wg.Go(func() { errs[i+1] = f(st) })
	}
	errs[0] = f(e.stages[0])
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// eachManager is eachStage for a phase of manager calls: when every stage
// answered, it settles the end of step those calls carried to the managers
// (see ending), before the caller applies their answers.
func (e *Engine) eachManager(f func(st *stage) error) error {
	if err := e.eachStage(f); err != nil {
		return err
	}
	return e.settle()
}
