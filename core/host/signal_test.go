//go:build unix

package host

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/go-plugin"
)

func killHard(t *testing.T, pid int) {
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Errorf("kill -9 %d: %v", pid, err)
	}
}

// signalHelperEnv makes the test binary run signalHelper instead of tests:
// a host process that launches the fake manager, prints its pid, and waits
// to be signalled. Its value is the fake manager's path and a mode: "handle"
// calls HandleSignals and turns the parent-death signal off, so only
// HandleSignals can kill the plugin; "nohandle" relies on the parent-death
// signal alone.
const signalHelperEnv = "KVX_HOST_TEST_SIGNAL_HELPER"

func signalHelper() {
	args := strings.Fields(os.Getenv(signalHelperEnv))
	h := New(hclog.New(&hclog.LoggerOptions{Output: os.Stderr, Level: hclog.Info}), nil)
	if len(args) < 2 || args[1] != "nohandle" {
		h.HandleSignals()
		parentDeathSignal = func(*exec.Cmd) {}
	}
	_, proc, err := h.LaunchManager(context.Background(), args[0])
	if err != nil {
		fmt.Fprintln(os.Stderr, "launch:", err)
		os.Exit(2)
	}
	fmt.Println(proc.Pid())
	time.Sleep(time.Minute)
	os.Exit(3) // not signalled in time
}

// startHelper runs the signal helper and returns it with its plugin's pid.
func startHelper(t *testing.T, mode string) (*exec.Cmd, int, *syncBuffer) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	// TMPDIR: a helper killed by SIGKILL cannot remove its socket directory.
	cmd.Env = append(os.Environ(), signalHelperEnv+"="+fakeManager+" "+mode, "TMPDIR="+t.TempDir())
	var stderr syncBuffer
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		t.Fatalf("helper printed no pid: %v\n%s", err, stderr.String())
	}
	pid, err := strconv.Atoi(strings.TrimSpace(line))
	if err != nil || !alive(pid) {
		t.Fatalf("helper printed %q (%v); plugin alive=%v", line, err, alive(pid))
	}
	return cmd, pid, &stderr
}

func waitGone(t *testing.T, pid int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for alive(pid) {
		if time.Now().After(deadline) {
			t.Fatalf("plugin pid %d still running 10s after its host ended", pid)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestHandleSignals: SIGTERM and SIGINT to a host that called HandleSignals
// kill its plugin and then end the host by that signal.
func TestHandleSignals(t *testing.T) {
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGINT} {
		t.Run(sig.String(), func(t *testing.T) {
			cmd, pid, stderr := startHelper(t, "handle")
			if err := cmd.Process.Signal(sig); err != nil {
				t.Fatal(err)
			}
			err := cmd.Wait()
			var ee *exec.ExitError
			if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != sig {
				t.Errorf("host ended with %v, want killed by %v\n%s", err, sig, stderr.String())
			}
			if !strings.Contains(stderr.String(), "stopping plugins") {
				t.Errorf("host did not log that it stopped its plugins:\n%s", stderr.String())
			}
			waitGone(t, pid)
		})
	}
}

// TestCleanupClients: launches are Managed, so go-plugin's CleanupClients
// kills them too.
func TestCleanupClients(t *testing.T) {
	h, _ := newHost(t)
	_, proc, err := h.LaunchManager(ctxTimeout(t), fakeManager)
	if err != nil {
		t.Fatal(err)
	}
	plugin.CleanupClients()
	if alive(proc.Pid()) {
		t.Errorf("plugin pid %d alive after plugin.CleanupClients", proc.Pid())
	}
}
