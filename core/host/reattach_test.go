//go:build unix

package host

import (
	"bufio"
	"errors"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kvx-dev/kvx/plugins/sdk"
	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
	"github.com/kvx-dev/kvx/plugins/v1/pluginrpc"
)

// debugPlugin is the fake plugin started by hand in the SDK's debug mode.
type debugPlugin struct {
	cmd     *exec.Cmd
	stderr  syncBuffer
	exited  chan struct{} // closed once it exited, with waitErr set
	waitErr error
	name    string // the variable it printed
	value   string // its value
}

// startDebugPlugin starts the fake manager with sdk.DebugEnv set, as an
// author would under a debugger, and reads the reattach line it prints.
// The plugin is interrupted when the test ends.
func startDebugPlugin(t *testing.T) *debugPlugin {
	t.Helper()
	p := &debugPlugin{cmd: exec.Command(fakeManager), exited: make(chan struct{})}
	p.cmd.Env = append(os.Environ(), sdk.DebugEnv+"=1")
	p.cmd.Stderr = &p.stderr
	out, err := p.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			select {
			case lines <- sc.Text():
			default:
			}
		}
		p.waitErr = p.cmd.Wait()
		close(p.exited)
	}()
	t.Cleanup(func() {
		_ = p.cmd.Process.Signal(syscall.SIGINT)
		select {
		case <-p.exited:
		case <-time.After(10 * time.Second):
			_ = p.cmd.Process.Kill()
		}
	})
	select {
	case line := <-lines:
		name, value, ok := strings.Cut(line, "=")
		if !ok || !strings.HasPrefix(value, "'") || !strings.HasSuffix(value, "'") {
			t.Fatalf("debug plugin printed %q, want NAME='json'", line)
		}
		p.name, p.value = name, strings.Trim(value, "'")
	case <-time.After(30 * time.Second):
		t.Fatalf("debug plugin printed no reattach line in 30s; stderr:\n%s", p.stderr.String())
	}
	return p
}

// TestReattachDebugPlugin: a plugin in debug mode prints its reattach
// variable; with it set, the host talks to that process (Info, Stats, a
// second instance) instead of starting one, leaves it running on Close,
// attaches again from a new host, and sees it exit.
func TestReattachDebugPlugin(t *testing.T) {
	p := startDebugPlugin(t)
	if want := pluginrpc.ReattachEnv(fakeManager); p.name != want || want != "KVX_REATTACH_FAKE_MANAGER" {
		t.Fatalf("debug plugin printed variable %s, want %s (KVX_REATTACH_FAKE_MANAGER)", p.name, want)
	}
	t.Setenv(p.name, p.value)
	pid := p.cmd.Process.Pid
	ctx := ctxTimeout(t)

	h, logs := newHost(t)
	m, proc, err := h.LaunchManager(ctx, fakeManager)
	if err != nil {
		t.Fatalf("LaunchManager with %s set: %v\nplugin stderr:\n%s", p.name, err, p.stderr.String())
	}
	if info, err := m.Info(ctx); err != nil || info.Name != "fake" {
		t.Fatalf("Info() = %+v, %v; want the fake manager", info, err)
	}
	st, err := m.Stats(ctx)
	if err != nil || st.Sequences != pid || proc.Pid() != pid {
		t.Fatalf("Stats: plugin pid %d (err %v), Process.Pid %d; want the debug plugin's pid %d", st.Sequences, err, proc.Pid(), pid)
	}
	second, err := h.ManagerInstance(ctx, m, proc)
	if err != nil {
		t.Fatalf("ManagerInstance: %v", err)
	}
	if st, err := second.Stats(ctx); err != nil || st.Sequences != pid || st.Evictions != 1 {
		t.Errorf("second instance: pid %d, instance %d (err %v); want pid %d, instance 1", st.Sequences, st.Evictions, err, pid)
	}
	if !strings.Contains(logs.String(), "attaching to a plugin in debug mode") {
		t.Errorf("host log does not say it attached:\n%s", logs.String())
	}

	h.Close()
	if err := p.cmd.Process.Signal(syscall.Signal(0)); err != nil {
		t.Fatalf("the debug plugin is gone after the host closed (%v): the host must leave it running", err)
	}

	h2, _ := newHost(t)
	m2, proc2, err := h2.LaunchManager(ctx, fakeManager)
	if err != nil {
		t.Fatalf("second host: LaunchManager: %v", err)
	}
	if st, err := m2.Stats(ctx); err != nil || st.Sequences != pid {
		t.Fatalf("second host: Stats pid %d, %v; want %d", st.Sequences, err, pid)
	}

	// Interrupted (Ctrl-C in the debugger's terminal), the plugin stops
	// cleanly and the host sees it go.
	if err := p.cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	select {
	case <-p.exited:
		if p.waitErr != nil {
			t.Errorf("debug plugin exited with %v after SIGINT, want status 0\n%s", p.waitErr, p.stderr.String())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("debug plugin did not exit within 10s of SIGINT")
	}
	waitDone(t, proc2)
	if _, err := m2.Stats(ctx); !errors.Is(err, kvcache.ErrUnavailable) {
		t.Errorf("Stats after the debug plugin exited: %v, want kind unavailable", err)
	}
}

// TestReattachBadVariable: a reattach variable that cannot be used is a
// launch error naming the variable, and nothing is started.
func TestReattachBadVariable(t *testing.T) {
	name := pluginrpc.ReattachEnv(fakeManager)
	for _, tc := range []struct {
		value, want string
	}{
		{"{not json", "want JSON like"},
		{`{"protocol":"grpc","version":2,"network":"unix","address":"/tmp/x"}`, "pid missing"},
		{`{"protocol":"grpc","version":9,"network":"unix","address":"/tmp/x","pid":1}`, "the plugin is newer than this kvx (plugin: protocol 9"},
	} {
		t.Setenv(name, tc.value)
		h, _ := newHost(t)
		_, _, err := h.LaunchManager(ctxTimeout(t), fakeManager)
		if err == nil || !strings.Contains(err.Error(), name) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s=%s: LaunchManager error %v, want one naming %s and saying %q", name, tc.value, err, name, tc.want)
		}
		if n := tracked(h); n != 0 {
			t.Errorf("%s=%s: %d processes tracked after a refused launch", name, tc.value, n)
		}
	}
}
