package host

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"sync"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/go-plugin/runner"
)

// groupRunner is go-plugin's runner.Runner for a plugin binary this host
// starts: the process gets a process group of its own (on unix), so that a
// kill takes whatever it started too (a wrapper script that does not exec
// leaves the real plugin, or a sleep, holding go-plugin's pipes: killing
// only the script would leave go-plugin waiting on them forever). Its pid
// is known as soon as the process runs, also while go-plugin still waits
// for the handshake, so a start can be abandoned (Process.Abort).
type groupRunner struct {
	cmd            *exec.Cmd
	stdout, stderr io.ReadCloser

	mu     sync.Mutex
	pid    int
	reaped bool // Wait returned: the group is gone, and its id may be reused
	killed bool // Kill was called: a death by SIGKILL is no error
	// outside: the process was ended by a signal this host had not sent
	// when Wait reaped it (how: its state).
	outside bool
	how     string
	done    chan struct{} // closed when Wait returned
}

var _ runner.Runner = (*groupRunner)(nil)

func newGroupRunner(cmd *exec.Cmd) (*groupRunner, error) {
	ownGroup(cmd)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return nil, err
	}
	return &groupRunner{cmd: cmd, stdout: stdout, stderr: stderr, done: make(chan struct{})}, nil
}

// runnerFunc is a plugin.ClientConfig.RunnerFunc that runs cmd, and keeps
// the runner it makes in *r (under mu). go-plugin hands the func a blank
// command that carries only the environment it made (the host's, then the
// handshake's), which goes after cmd's own.
func runnerFunc(cmd *exec.Cmd, r **groupRunner, mu *sync.Mutex) func(hclog.Logger, *exec.Cmd, string) (runner.Runner, error) {
	return func(_ hclog.Logger, spec *exec.Cmd, _ string) (runner.Runner, error) {
		cmd.Env = append(cmd.Env, spec.Env...)
		cmd.Stdin = spec.Stdin
		gr, err := newGroupRunner(cmd)
		if err != nil {
			return nil, err
		}
		mu.Lock()
		*r = gr
		mu.Unlock()
		return gr, nil
	}
}

func (r *groupRunner) Start(context.Context) error {
	if err := r.cmd.Start(); err != nil {
		return err
	}
	r.mu.Lock()
	r.pid = r.cmd.Process.Pid
	r.mu.Unlock()
	return nil
}

// Pid returns the process id, 0 before the process started.
func (r *groupRunner) Pid() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.pid
}

// Wait waits for the process, then kills what is left of its group (a
// wrapper's children): once the group is empty its id may be reused, so
// Kill does nothing after Wait. A process this host killed exited as asked:
// Wait returns nil for it (go-plugin logs an error otherwise).
func (r *groupRunner) Wait(context.Context) error {
	err := r.cmd.Wait()
	r.mu.Lock()
	defer r.mu.Unlock()
	_ = killGroup(r.pid)
	r.reaped = true
	if ps := r.cmd.ProcessState; ps != nil && ps.ExitCode() == -1 && !r.killed { // -1: ended by a signal
		r.outside, r.how = true, ps.String()
	}
	close(r.done)
	if r.killed {
		return nil
	}
	return err
}

// startReapWait bounds how long a failed start waits for its process to be
// reaped before it judges how the process ended (killedFromOutside): its
// standard output closed, so it has ended or is about to.
const startReapWait = 500 * time.Millisecond

// killedFromOutside reports, once the process has been reaped (waiting up
// to wait for it), whether a signal this host had not sent ended it: a
// plugin killed while it started, before its handshake, whose closed
// standard output go-plugin reports as it does a binary that wrote no
// handshake at all. (go-plugin kills the process after such a start, so
// Wait, not Kill, tells: Diagnose has it reaped first.)
func (r *groupRunner) killedFromOutside(wait time.Duration) (string, bool) {
	select {
	case <-r.done:
	case <-time.After(wait):
		return "", false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.how, r.outside
}

// Kill sends SIGKILL to the process's whole group (elsewhere than unix, to
// the process). A process group lives as long as one of its processes,
// zombies included, so the id names no other group until Wait.
func (r *groupRunner) Kill(context.Context) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	pid := r.pid
	if pid == 0 || r.reaped {
		return nil
	}
	r.killed = true
	if err := killGroup(pid); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return err
	}
	return nil
}

func (r *groupRunner) Stdout() io.ReadCloser { return r.stdout }
func (r *groupRunner) Stderr() io.ReadCloser { return r.stderr }
func (r *groupRunner) Name() string          { return r.cmd.Path }
func (r *groupRunner) ID() string            { return fmt.Sprint(r.Pid()) }

// Diagnose explains a start whose standard output ended or began without
// go-plugin's handshake line. go-plugin asks before it kills the process,
// so the process is reaped first (within startReapWait: its output has
// closed) and a death from outside is told from a binary that is no plugin.
func (r *groupRunner) Diagnose(context.Context) string {
	if how, killed := r.killedFromOutside(startReapWait); killed {
		return fmt.Sprintf("the process ended (%s) before it wrote its handshake: killed while it started", how)
	}
	return "the binary did not write go-plugin's handshake line first on its standard output: " +
		"it is not a kvx plugin (build it with plugins/sdk), or a wrapper script wrote something first"
}

func (r *groupRunner) PluginToHost(network, addr string) (string, string, error) {
	return network, addr, nil
}

func (r *groupRunner) HostToPlugin(network, addr string) (string, string, error) {
	return network, addr, nil
}
