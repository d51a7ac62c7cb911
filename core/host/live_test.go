//go:build unix

package host

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
)

// hangingWrapper writes a plugin wrapper script that does not exec: it
// starts a sleep and waits on it, holding go-plugin's pipes, and writes
// both pids to files. It returns the script and a func that reads the pids.
func hangingWrapper(t *testing.T) (string, func() []int) {
	t.Helper()
	dir := t.TempDir()
	script := filepath.Join(dir, "kvx-wrapper")
	body := fmt.Sprintf("#!/bin/sh\necho $$ > %[1]s/sh.pid\nsleep 100000 &\necho $! > %[1]s/sleep.pid\nwait\n", dir)
	if err := os.WriteFile(script, []byte(body), 0o755); err != nil {
		t.Fatal(err)
	}
	return script, func() []int {
		var pids []int
		for _, f := range []string{"sh.pid", "sleep.pid"} {
			b, err := os.ReadFile(filepath.Join(dir, f))
			if err != nil {
				t.Fatalf("the wrapper wrote no %s: %v", f, err)
			}
			pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
			if err != nil {
				t.Fatal(err)
			}
			pids = append(pids, pid)
		}
		return pids
	}
}

// waitStopped waits until pid is in the stopped state (the signal is
// delivered asynchronously).
func waitStopped(t *testing.T, pid int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		s := string(b)
		if i := strings.LastIndexByte(s, ')'); i >= 0 && i+2 < len(s) && s[i+2] == 'T' {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("pid %d not stopped 10 s after SIGSTOP: %q", pid, s)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func wantGone(t *testing.T, pids []int) {
	t.Helper()
	for _, pid := range pids {
		waitGone(t, pid)
	}
}

// TestStartTimeout: a wrapper script that never hands over to the plugin
// is abandoned at the start timeout, without waiting on the pipes its
// child holds: the launch fails with ErrStartTimeout, and the wrapper and
// its child are gone (the whole process group was killed).
func TestStartTimeout(t *testing.T) {
	h, _ := newHost(t)
	h.StartTimeout = time.Second
	script, pids := hangingWrapper(t)
	start := time.Now()
	_, _, err := h.LaunchManager(ctxTimeout(t), script)
	took := time.Since(start)
	if !errors.Is(err, ErrStartTimeout) || !strings.Contains(err.Error(), script) || !strings.Contains(err.Error(), goPluginStartTimeout) {
		t.Fatalf("LaunchManager(hanging wrapper) = %v, want ErrStartTimeout naming the script and go-plugin's reason", err)
	}
	// The timeout is 1 s; killWait + abandonWait (6 s) would mean the launch
	// waited on the pipes. Generous: this is an ordering check.
	if took > killWait {
		t.Errorf("the launch took %v, want about the 1 s start timeout", took)
	}
	wantGone(t, pids())
	if n := tracked(h); n != 0 {
		t.Errorf("host tracks %d processes, want 0", n)
	}
}

// TestStartKilled: a plugin process killed from outside before its
// handshake died while it started, as a plugin can at any time: the launch
// fails with kvcache.ErrUnavailable (the engine then starts it again, as
// the soak under faults needs), naming how the process ended. A binary
// that exits by itself without a handshake is not a plugin: its error says
// so, and is not ErrUnavailable.
func TestStartKilled(t *testing.T) {
	h, _ := newHost(t)
	dir := t.TempDir()
	for _, c := range []struct {
		name, body string
		died       bool
	}{
		{"killed", "#!/bin/sh\nkill -9 $$\n", true},
		{"silent", "#!/bin/sh\nexit 0\n", false},
	} {
		script := filepath.Join(dir, "kvx-"+c.name)
		if err := os.WriteFile(script, []byte(c.body), 0o755); err != nil {
			t.Fatal(err)
		}
		_, _, err := h.LaunchManager(ctxTimeout(t), script)
		if err == nil {
			t.Fatalf("%s: the launch succeeded", c.name)
		}
		if got := errors.Is(err, kvcache.ErrUnavailable); got != c.died {
			t.Errorf("%s: LaunchManager = %v; ErrUnavailable %v, want %v", c.name, err, got, c.died)
		}
		if c.died && !strings.Contains(err.Error(), "killed") {
			t.Errorf("%s: %v does not say how the process ended", c.name, err)
		}
		if !c.died && !strings.Contains(err.Error(), "handshake line") {
			t.Errorf("%s: %v does not say the binary wrote no handshake", c.name, err)
		}
	}
	if n := tracked(h); n != 0 {
		t.Errorf("host tracks %d processes, want 0", n)
	}
}

// TestStartCancelled: a launch whose ctx ends during the handshake returns
// at once with ctx's error and leaves no process, whatever the start
// timeout.
func TestStartCancelled(t *testing.T) {
	h, _ := newHost(t)
	script, pids := hangingWrapper(t)
	ctx, cancel := context.WithCancel(ctxTimeout(t))
	time.AfterFunc(500*time.Millisecond, cancel)
	start := time.Now()
	_, _, err := h.LaunchManager(ctx, script)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("LaunchManager cancelled mid-handshake = %v, want context.Canceled", err)
	}
	if took := time.Since(start); took > 30*time.Second {
		t.Errorf("the launch took %v after its ctx ended", took)
	}
	wantGone(t, pids())
}

// TestAbortStoppedPlugin: a plugin stopped with SIGSTOP answers nothing;
// Abort kills it at once (no graceful wait), and the call in flight fails
// as unavailable.
func TestAbortStoppedPlugin(t *testing.T) {
	h, _ := newHost(t)
	ctx := ctxTimeout(t)
	m, proc, err := h.LaunchManager(ctx, fakeManager)
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(proc.Pid(), syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	waitStopped(t, proc.Pid())
	errc := make(chan error, 1)
	go func() {
		_, err := m.Stats(ctx)
		errc <- err
	}()
	time.Sleep(200 * time.Millisecond)
	proc.Abort()
	waitDone(t, proc)
	select {
	case err := <-errc:
		if kvcache.KindOf(err) != kvcache.KindUnavailable {
			t.Errorf("call in flight on an aborted plugin: %v, want kind %v", err, kvcache.KindUnavailable)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the call in flight did not return after Abort")
	}
	if alive(proc.Pid()) {
		t.Errorf("pid %d alive after Abort", proc.Pid())
	}
}

// TestStoppedPluginAtInstanceIsKilled: a further instance asked of a plugin
// process that stopped answering fails within the start timeout, as a dead
// plugin (KindUnavailable, so the engine starts it again), and the process
// is killed.
func TestStoppedPluginAtInstanceIsKilled(t *testing.T) {
	h, _ := newHost(t)
	h.StartTimeout = time.Second
	ctx := ctxTimeout(t)
	m, proc, err := h.LaunchManager(ctx, fakeManager)
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(proc.Pid(), syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	waitStopped(t, proc.Pid())
	_, err = h.ManagerInstance(ctx, m, proc)
	if kvcache.KindOf(err) != kvcache.KindUnavailable || !strings.Contains(err.Error(), "did not answer Info") {
		t.Errorf("ManagerInstance of a stopped plugin = %v, want kind %v naming the call", err, kvcache.KindUnavailable)
	}
	waitDone(t, proc)
	if alive(proc.Pid()) {
		t.Errorf("pid %d alive after it missed the start timeout", proc.Pid())
	}
}
