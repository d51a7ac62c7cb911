package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"sync"
	"syscall"
)

// stopSignals are the signals that stop kvx at any phase (the plugins'
// start-up included): the run in progress stops, its partial report is
// written, every plugin process is killed and reaped, and kvx exits
// 128 + the signal's number (130, 143, 129). A second one exits at once
// (the plugins then die by the parent-death signal, on Linux).
var stopSignals = []os.Signal{syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP}

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
		sig := <-ch
		in.mu.Lock()
		in.sig = sig
		in.mu.Unlock()
		cancel(fmt.Errorf("received %v", signalName(sig)))
		sig = <-ch
		fmt.Fprintf(os.Stderr, "kvx: %v again: exiting now\n", signalName(sig))
		os.Exit(exitCode(sig))
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
