// Package conformance is the exported conformance suite of contract v1: it
// runs every check that the doc comments of plugins/v1/kvcache and
// plugins/v1/worker state against a cache manager or a worker, and reports
// all violations at once, like testing/fstest.TestFS.
//
// Plugin authors call TestManager or TestWorker from a test, once with their
// implementation in-process and once through pluginrpc.TestManagerPair (a
// real gRPC connection). The kvx CLI calls CheckManager and CheckWorker with
// a factory that starts a plugin process and returns its client.
//
// # Checks
//
// Every check runs on a fresh manager (or worker) from the factory, so one
// broken call cannot hide the others. A check stops at its first violation:
// CheckManager returns errors.Join of one *Violation per failed check, each
// naming the check, the call, what came back and what the contract says. The
// check names are listed by ManagerChecks and WorkerChecks, their rules by
// ManagerCheckDocs and WorkerCheckDocs. After every call that changes a
// manager the suite takes a deep Inspect and checks the invariants: no
// self-check Violations, 0 <= history <= capacity <= MaxSeqTokens, Free +
// Cached + InUse == Total, reference counts equal to the references
// recounted from the tables, tables that back the capacity, and after every
// grant the worker's view of each table (the grants' TableDeltas) equal to
// the manager's.
//
// # Factories and plugin processes
//
// A factory is called once per check, from the goroutine that runs the
// checks, one check at a time. When the value it returns also implements
// io.Closer, the suite calls Close when the check is done, so a factory may
// start one plugin process per call and have it stopped. A factory that
// cannot make a manager returns nil; the check then fails with a violation
// that says so.
package conformance

import (
	"context"
	"errors"
	"fmt"
	"io"
	"runtime/debug"
	"strings"
	"testing"
	"time"
)

// Violation is one failed check: one contract rule that an implementation
// broke.
type Violation struct {
	Check string // the check's name, one of ManagerChecks or WorkerChecks
	Call  string // what was called, with the arguments that matter
	Got   string // what came back
	Want  string // what the contract says
}

func (v *Violation) Error() string {
	return fmt.Sprintf("conformance %s: %s\n\tgot:  %s\n\twant: %s", v.Check, v.Call, v.Got, v.Want)
}

// Violations returns the *Violation values inside err (as returned by
// CheckManager or CheckWorker), in order; nil for a nil err.
func Violations(err error) []*Violation {
	var out []*Violation
	var walk func(error)
	walk = func(e error) {
		if e == nil {
			return
		}
		if v, ok := e.(*Violation); ok {
			out = append(out, v)
			return
		}
		switch u := e.(type) {
		case interface{ Unwrap() []error }:
			for _, x := range u.Unwrap() {
				walk(x)
			}
		case interface{ Unwrap() error }:
			walk(u.Unwrap())
		}
	}
	walk(err)
	return out
}

// failure carries a violation out of a check by panic; the runner recovers it.
type failure struct{ v *Violation }

// check is one named contract check.
type check[H any] struct {
	name string
	doc  string // the rule, one line
	run  func(h H)
}

// runOne runs one check and returns its violation, or nil. A panic of the
// implementation (in-process) is reported as a violation with its stack.
func runOne(name string, body func()) (v *Violation) {
	defer func() {
		r := recover()
		if r == nil {
			return
		}
		if f, ok := r.(failure); ok {
			v = f.v
			v.Check = name
			return
		}
		v = &Violation{Check: name, Call: "the check's calls", Got: fmt.Sprintf("panic: %v\n%s", r, trimStack(debug.Stack())),
			Want: "no call panics: errors are values"}
	}()
	body()
	return nil
}

func trimStack(s []byte) string {
	lines := strings.Split(string(s), "\n")
	if len(lines) > 24 {
		lines = lines[:24]
	}
	return strings.Join(lines, "\n\t")
}

// closeIfCloser closes x when it implements io.Closer; a Close error is
// ignored (the check's verdict is already made).
func closeIfCloser(x any) {
	if c, ok := x.(io.Closer); ok {
		_ = c.Close()
	}
}

// checkCtx returns the context of one check.
func checkCtx(ctx context.Context, timeout time.Duration) (context.Context, context.CancelFunc) {
	if timeout > 0 {
		return context.WithTimeout(ctx, timeout)
	}
	return context.WithCancel(ctx)
}

// selected reports whether check name is in only (nil: all).
func selected(only []string, name string) bool {
	if len(only) == 0 {
		return true
	}
	for _, o := range only {
		if o == name {
			return true
		}
	}
	return false
}

// report turns violations into the error of a Check function.
func report(vs []*Violation) error {
	if len(vs) == 0 {
		return nil
	}
	errs := make([]error, len(vs))
	for i, v := range vs {
		errs[i] = v
	}
	return errors.Join(errs...)
}

// testReport t.Errors each violation of err separately.
func testReport(t testing.TB, err error) {
	t.Helper()
	vs := Violations(err)
	for _, v := range vs {
		t.Error(v)
	}
	if len(vs) == 0 && err != nil {
		t.Error(err)
	}
}

// unknownChecks names the entries of only that are not checks.
func unknownChecks(only []string, names []string) error {
	var bad []string
	for _, o := range only {
		found := false
		for _, n := range names {
			found = found || n == o
		}
		if !found {
			bad = append(bad, o)
		}
	}
	if len(bad) == 0 {
		return nil
	}
	return fmt.Errorf("conformance: unknown checks %q; the checks are %s", bad, strings.Join(names, ", "))
}

// checkNames lists the names of cs in order.
func checkNames[H any](cs []check[H]) []string {
	out := make([]string, len(cs))
	for i, c := range cs {
		out[i] = c.name
	}
	return out
}

// checkDocs maps each check's name to its one-line rule.
func checkDocs[H any](cs []check[H]) map[string]string {
	out := make(map[string]string, len(cs))
	for _, c := range cs {
		out[c.name] = c.doc
	}
	return out
}

// runChecks runs the checks of cs that names selects (nil: all), each with
// run, and returns errors.Join of the violations; an unknown name is an
// options error.
func runChecks[H any](cs []check[H], names []string, run func(check[H]) *Violation) error {
	if err := unknownChecks(names, checkNames(cs)); err != nil {
		return err
	}
	var vs []*Violation
	for _, c := range cs {
		if !selected(names, c.name) {
			continue
		}
		if v := run(c); v != nil {
			vs = append(vs, v)
		}
	}
	return report(vs)
}
