package engine

// eachStage calls f for every stage, in stage order, and returns the error
// of the lowest stage that failed; every stage's f runs.
func (e *Engine) eachStage(f func(st *stage) error) error {
	var first error
	for _, st := range e.stages {
		if err := f(st); err != nil && first == nil {
			first = err
		}
	}
	return first
}

// eachManager runs one manager call on every stage: start sends stage st's
// call (kvcache.Start*) and returns its wait, which takes the answer; the
// waits run, in stage order, once every stage's call is started. So a
// plugin process that serves every stage gets the calls in one write and
// wakes once, and separate processes work side by side. It returns the
// error of the lowest stage that failed, after every wait ran. When every
// stage answered, it settles the end of step those calls carried to the
// managers (see ending), before the caller applies their answers.
func (e *Engine) eachManager(start func(st *stage) (wait func() error)) error {
	e.dog.arm(slotCall, "cache manager calls of one phase", e.spec.Liveness.Call, e.managers()...)
	waits := make([]func() error, len(e.stages))
	for _, st := range e.stages {
		waits[st.idx] = start(st)
	}
	var first error
	for _, wait := range waits {
		if err := wait(); err != nil && first == nil {
			first = err
		}
	}
	e.dog.disarm(slotCall)
	if first != nil {
		return first
	}
	return e.settle()
}

// noCall is the wait of a stage that has no call to make.
func noCall() error { return nil }
