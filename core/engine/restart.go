package engine

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
)

// RestartPolicy bounds how the engine replaces plugins that died (faults.go).
// The zero value is MaxRestarts restarts and no wait between them.
type RestartPolicy struct {
	// Max is the restart budget of the engine's life: the restart after it
	// is refused and the engine stops with an error (a server exits
	// non-zero, for its supervisor to restart it). 0 means MaxRestarts.
	Max int
	// Backoff is the wait before a restart that follows another with no
	// step committed in between; it doubles with each such restart, up to
	// MaxBackoff. The first restart after progress waits Backoff too, so a
	// crash loop never spins. 0: no wait.
	Backoff    time.Duration
	MaxBackoff time.Duration
}

func (p RestartPolicy) max() int {
	if p.Max > 0 {
		return p.Max
	}
	return MaxRestarts
}

// Delay is the wait before a restart that follows streak others with no
// step committed in between (0 for the first after progress): Backoff
// doubled streak times, at most MaxBackoff.
func (p RestartPolicy) Delay(streak int) time.Duration {
	if p.Backoff <= 0 {
		return 0
	}
	d := p.Backoff << min(streak, 20)
	if p.MaxBackoff > 0 && d > p.MaxBackoff {
		d = p.MaxBackoff
	}
	return d
}

// restartState is what the engine remembers between restarts.
type restartState struct {
	streak  int   // restarts since a step last committed
	commits int64 // e.commits at the last restart
}

// backoff waits before a restart (Delay of the restarts in a row).
// It returns early when ctx ends or a live engine is stopped.
func (e *Engine) backoff(ctx context.Context) {
	p := e.spec.Restarts
	rs := &e.restarts
	if e.commits != rs.commits {
		rs.streak = 0 // progress since the last restart
	}
	d := p.Delay(rs.streak)
	rs.streak++
	rs.commits = e.commits
	if d <= 0 {
		return
	}
	e.log.Warn("waiting before the restart", "backoff", d.String(), "restarts in a row", rs.streak)
	var stop <-chan struct{}
	if e.live != nil {
		stop = e.live.stopC
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	case <-stop:
	}
}

// Fault is an injected plugin death, for tests of fault containment: at the
// start of the first loop iteration at which Step forwards have started,
// the engine kills (Stopper.Stop: SIGKILL to the process group) the plugin
// of stage Stage named by Plugin ("manager" or "worker"). It then finds it
// dead at its next call and takes the path of a real crash. Only plugin
// processes can be killed: in-process values ignore it.
type Fault struct {
	Plugin string // "manager" or "worker"
	Stage  int
	Step   uint64
}

// FaultEnv is the environment variable kvx reads fault injections from
// (ParseFaults). Its name says it is no setting for production; it is
// outside the KVX_ prefix of the config keys on purpose.
const FaultEnv = "UNSAFE_KVX_FAULT_INJECTION"

// ParseFaults reads a list of faults, "kill:<manager|worker>[.<stage>]:<step>"
// separated by commas; for example "kill:worker:40,kill:manager.1:120".
// An error names the entry, what was wrong and what is allowed.
func ParseFaults(s string) ([]Fault, error) {
	var out []Fault
	for _, ent := range strings.Split(s, ",") {
		ent = strings.TrimSpace(ent)
		if ent == "" {
			continue
		}
		parts := strings.Split(ent, ":")
		if len(parts) != 3 || parts[0] != "kill" {
			return nil, fmt.Errorf("%s: entry %q: want kill:<manager|worker>[.<stage>]:<step>", FaultEnv, ent)
		}
		f := Fault{Plugin: parts[1]}
		if p, st, ok := strings.Cut(parts[1], "."); ok {
			n, err := strconv.Atoi(st)
			if err != nil || n < 0 {
				return nil, fmt.Errorf("%s: entry %q: stage %q: want an integer >= 0", FaultEnv, ent, st)
			}
			f.Plugin, f.Stage = p, n
		}
		if f.Plugin != "manager" && f.Plugin != "worker" {
			return nil, fmt.Errorf("%s: entry %q: plugin %q: want manager or worker", FaultEnv, ent, f.Plugin)
		}
		step, err := strconv.ParseUint(parts[2], 10, 64)
		if err != nil || step < 1 {
			return nil, fmt.Errorf("%s: entry %q: step %q: want an integer >= 1", FaultEnv, ent, parts[2])
		}
		f.Step = step
		out = append(out, f)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%s=%q names no fault: want kill:<manager|worker>[.<stage>]:<step>[,...]", FaultEnv, s)
	}
	slices.SortStableFunc(out, func(a, b Fault) int { return cmp.Compare(int64(a.Step), int64(b.Step)) })
	return out, nil
}

// checkFaults refuses faults on stages the engine does not have.
func checkFaults(fs []Fault, stages int) error {
	for _, f := range fs {
		if f.Stage >= stages {
			return fmt.Errorf("%s: kill:%s.%d:%d: stage %d, the engine has %d stage(s)", FaultEnv, f.Plugin, f.Stage, f.Step, f.Stage, stages)
		}
	}
	return nil
}

// injectFaults kills the plugins whose Fault is due. The faults are sorted
// by step (ParseFaults); each fires once.
func (e *Engine) injectFaults() {
	for len(e.faults) > 0 && e.steps >= e.faults[0].Step {
		f := e.faults[0]
		e.faults = e.faults[1:]
		stopper, ok := e.launch.(Stopper)
		if !ok || f.Stage >= len(e.stages) {
			continue
		}
		var target any = e.stages[f.Stage].m
		if f.Plugin == "worker" {
			target = e.stages[f.Stage].w
		}
		e.log.Warn("FAULT INJECTION: killing a plugin on purpose ("+FaultEnv+")", "plugin", f.Plugin, "stage", f.Stage, "step", e.steps)
		stopper.Stop(target)
	}
}
