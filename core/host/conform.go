package host

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/kvx-dev/kvx/plugins/conformance"
	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
)

// Conformance is what Conform found of one plugin binary.
type Conformance struct {
	Path       string // the binary
	Kind       string // "cache manager" or "worker"
	Checks     int    // the checks of its kind's suite
	Violations []*conformance.Violation
}

// Conform runs plugins/conformance's suite of the plugin's kind against the
// binary name (a path, or a name found as Find finds it), each check on a
// fresh plugin process. The kind is the one the binary answers to: a cache
// manager, else (when it refuses the manager's handshake as another kind,
// not as another protocol) a worker; reuse also checks prefix reuse of a
// manager that reports the capability. What was negotiated is written to
// notices before the suite runs, and launchFailed hears of a launch that
// failed during it. The error is the plugin's or the path's: not found,
// neither kind, a protocol kvx does not speak, a suite that could not run;
// violations are not an error.
func (h *Host) Conform(ctx context.Context, name string, reuse bool, notices io.Writer, launchFailed func(error)) (Conformance, error) {
	path, err := h.Find(name)
	if err != nil {
		return Conformance{}, err
	}
	c := Conformance{Path: path}
	var failed error
	_, probe, err := h.LaunchManager(ctx, path)
	switch {
	case err == nil:
		probe.Kill()
		fmt.Fprintf(notices, "plugin %s: %v; features both offer: %v\n", path, probe.Contract(), probe.Features())
		c.Kind, c.Checks = "cache manager", len(conformance.ManagerChecks())
		// A failed launch yields nil, which the suite reports as a violation.
		failed = conformance.CheckManager(ctx, h.ManagerFactory(ctx, path, launchFailed), conformance.ManagerOptions{Reuse: reuse})
	case kvcache.KindOf(err) == kvcache.KindUnsupported && !errors.Is(err, ErrProtocol):
		if _, wp, werr := h.LaunchWorker(ctx, path); werr == nil {
			wp.Kill()
			fmt.Fprintf(notices, "plugin %s: %v; features both offer: %v\n", path, wp.Contract(), wp.Features())
		}
		c.Kind, c.Checks = "worker", len(conformance.WorkerChecks())
		failed = conformance.CheckWorker(ctx, h.WorkerFactory(ctx, path, launchFailed), conformance.WorkerOptions{})
	default:
		return Conformance{}, err
	}
	c.Violations = conformance.Violations(failed)
	if failed != nil && len(c.Violations) == 0 {
		return Conformance{}, failed
	}
	return c, nil
}
