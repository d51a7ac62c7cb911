package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"
)

// stopSignals are the signals that stop kvx at any phase (the plugins'
// start-up included): the run in progress stops, its partial report is
// written, every plugin process is killed and reaped, and kvx exits
// 128 + the signal's number (130, 143, 129). A second one exits at once
// (the plugins then die by the parent-death signal, on Linux), unless it
// is the first one again within echoWindow: GNU timeout and a kill of the
// process group deliver one request twice (to the process, then to its
// group), and that must still drain.
var stopSignals = []os.Signal{syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP}

// echoWindow is how soon after a stop signal the same signal counts as the
// same request (see stopSignals).
const echoWindow = time.Second

// exitsNow reports whether next, arriving after since the first stop
// signal first, ends kvx at once.
func exitsNow(first, next os.Signal, since time.Duration) bool {
	return next != first || since >= echoWindow
}

// interrupt is the signal handling of one kvx process.
type interrupt struct {
	mu     sync.Mutex
	sig    os.Signal
	normal bool // a stop signal is the command's normal end (kvx serve)
}

type interruptKey struct{}

// stopIsNormal marks, for the command running with ctx, that a stop signal
// is how it normally ends: kvx serve shuts down gracefully on one and then
// exits 0 when it returns no error (a batch run stopped by a signal exits
// 128 + the signal's number).
func stopIsNormal(ctx context.Context) {
	if in, ok := ctx.Value(interruptKey{}).(*interrupt); ok {
		in.mu.Lock()
		in.normal = true
		in.mu.Unlock()
	}
}

// signalContext returns a ctx that is cancelled, with a cause that names
// the signal, when one of stopSignals arrives, and the handler that records
// which one.
func signalContext(parent context.Context) (context.Context, *interrupt) {
	in := &interrupt{}
	ctx, cancel := context.WithCancelCause(context.WithValue(parent, interruptKey{}, in))
	ch := make(chan os.Signal, 2)
	signal.Notify(ch, stopSignals...)
	go func() {
		first := <-ch
		at := time.Now()
		in.mu.Lock()
		in.sig = first
		in.mu.Unlock()
		cancel(fmt.Errorf("received %v", signalName(first)))
		for sig := range ch {
			if exitsNow(first, sig, time.Since(at)) {
				fmt.Fprintf(os.Stderr, "kvx: %v again: exiting now\n", signalName(sig))
				os.Exit(exitCode(sig))
			}
		}
	}()
	return ctx, in
}

// caught returns the first stop signal received, or nil, and whether it
// was the command's normal end (stopIsNormal).
func (in *interrupt) caught() (os.Signal, bool) {
	in.mu.Lock()
	defer in.mu.Unlock()
	return in.sig, in.normal
}

// exitCode is the status of a process ended by sig, as a shell reports it.
func exitCode(sig os.Signal) int {
	if s, ok := sig.(syscall.Signal); ok {
		return 128 + int(s)
	}
	return 1
}

func signalName(sig os.Signal) string {
	switch sig {
	case syscall.SIGINT:
		return "SIGINT"
	case syscall.SIGTERM:
		return "SIGTERM"
	case syscall.SIGHUP:
		return "SIGHUP"
	}
	return sig.String()
}
