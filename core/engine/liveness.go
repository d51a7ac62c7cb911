package engine

import (
	"sync"
	"time"
)

// Liveness bounds the engine's waits on its plugins: every plugin call has
// a deadline derived from what it is, and a watchdog kills the plugin
// behind a call that misses its deadline (Stopper.Stop, which kills the
// process group). The call then fails as a crashed plugin's would
// (kvcache.KindUnavailable), and the engine takes the path it takes for a
// crash: the stage's plugins are restarted and every request is
// recomputed, within MaxRestarts. So a plugin that stops answering (kill
// -STOP, a deadlock, a lost wake-up) costs its deadline plus about a
// watchdog tick, never a hung engine.
//
// A zero field leaves that kind of call unbounded; the zero Liveness (what
// in-process runs use: nothing there can be killed) starts no watchdog.
type Liveness struct {
	// Configure bounds the Info and Configure calls of a stage's plugins
	// when they are started or restarted (a worker's Configure loads its
	// weights and allocates its pools). The launch itself is bounded by the
	// plugin host's start timeout.
	Configure time.Duration
	// Call bounds every other manager call (one phase over every stage:
	// lookup, reserve, suspend, the end of a step), and a worker's calls
	// other than a forward.
	Call time.Duration
	// Forward is the least deadline of a forward over every stage, from
	// its start to its answer: the deadline is the larger of Forward and
	// ForwardFactor times the slowest forward seen so far in the run.
	Forward       time.Duration
	ForwardFactor float64
}

func (l Liveness) on() bool { return l.Configure > 0 || l.Call > 0 || l.Forward > 0 }

// watchTick is how often the watchdog looks at the armed calls: the most a
// plugin that missed its deadline lives past it, before the kill.
const watchTick = 100 * time.Millisecond

// Watchdog slots: the engine waits on at most one phase of manager calls
// (or one stage start) and one forward at a time; they overlap when the
// next step is scheduled while the workers run (step overlap).
const (
	slotCall = iota
	slotForward
	numSlots
)

// watchdog watches the engine's waits on its plugins and kills the plugins
// behind one that missed its deadline. The engine's goroutine arms and
// disarms slots; the watchdog's goroutine kills. A nil *watchdog watches
// nothing: its methods do nothing.
type watchdog struct {
	stop  Stopper
	log   func(msg string, args ...any)
	mu    sync.Mutex
	slots [numSlots]watch
	done  chan struct{} // closed by close: the goroutine returns
	ended chan struct{} // closed by the goroutine as it returns
}

// watch is one armed wait.
type watch struct {
	armed    bool
	what     string
	since    time.Time
	deadline time.Time
	targets  []any // the clients to stop when it misses its deadline
}

// newWatchdog starts a watchdog that stops plugins through s; nil when l
// bounds nothing or s is nil.
func newWatchdog(l Liveness, s Stopper, log func(msg string, args ...any)) *watchdog {
	if !l.on() || s == nil {
		return nil
	}
	d := &watchdog{stop: s, log: log, done: make(chan struct{}), ended: make(chan struct{})}
	go d.run()
	return d
}

// close stops the watchdog's goroutine and waits for it to return, so that
// no Stopper.Stop is in progress, or starts, once close has returned: the
// engine's caller may read or reuse its Launcher as soon as Run returns.
func (d *watchdog) close() {
	if d != nil {
		close(d.done)
		<-d.ended
	}
}

// arm starts watching slot: what names the wait for the log; the clients
// in targets (managers or workers the Launcher returned) are stopped when
// it has not been disarmed within bound of now. A bound <= 0 disarms.
// Arming an armed slot replaces what it watched.
func (d *watchdog) arm(slot int, what string, bound time.Duration, targets ...any) {
	if d == nil {
		return
	}
	d.mu.Lock()
	w := &d.slots[slot]
	w.armed = bound > 0
	if w.armed {
		w.what = what
		w.since = time.Now()
		w.deadline = w.since.Add(bound)
		w.targets = append(w.targets[:0], targets...)
	}
	d.mu.Unlock()
}

// disarm stops watching slot.
func (d *watchdog) disarm(slot int) {
	if d == nil {
		return
	}
	d.mu.Lock()
	d.slots[slot].armed = false
	d.mu.Unlock()
}

func (d *watchdog) run() {
	defer close(d.ended)
	t := time.NewTicker(watchTick)
	defer t.Stop()
	for {
		select {
		case <-d.done:
			return
		case now := <-t.C:
			d.check(now)
		}
	}
}

// check kills the targets of every armed wait past its deadline.
func (d *watchdog) check(now time.Time) {
	var kill []any
	d.mu.Lock()
	for i := range d.slots {
		w := &d.slots[i]
		if !w.armed || now.Before(w.deadline) {
			continue
		}
		w.armed = false
		d.log("plugin did not answer within its deadline; killing it (its process group) to restart it",
			"call", w.what, "deadline", w.deadline.Sub(w.since).String(), "waited", now.Sub(w.since).Round(time.Millisecond).String())
		kill = append(kill, w.targets...)
	}
	d.mu.Unlock()
	for _, c := range kill {
		d.stop.Stop(c)
	}
}

// forwardBound is the deadline of the next forward: the larger of l.Forward
// and l.ForwardFactor times the slowest forward seen (0: unbounded).
func (e *Engine) forwardBound() time.Duration {
	l := e.spec.Liveness
	if l.Forward <= 0 {
		return 0
	}
	return max(l.Forward, time.Duration(l.ForwardFactor*float64(e.slowest)))
}

// sawForward records the wall time of a forward that answered.
func (e *Engine) sawForward(d time.Duration) {
	e.slowest = max(e.slowest, d)
}

// managers returns every stage's manager, as watchdog targets.
func (e *Engine) managers() []any {
	out := e.targets[:0]
	for _, st := range e.stages {
		if st.m != nil {
			out = append(out, st.m)
		}
	}
	e.targets = out
	return out
}

// workers returns every stage's worker, as watchdog targets.
func (e *Engine) workers() []any {
	out := e.targets[:0]
	for _, st := range e.stages {
		if st.w != nil {
			out = append(out, st.w)
		}
	}
	e.targets = out
	return out
}
