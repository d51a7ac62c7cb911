//go:build unix

package host

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
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

// TestLaunchesAreNotKept: a launched and killed plugin leaves little of
// itself on the host's heap. Managed launches kept about 24 KB each
// (go-plugin's list of Managed clients for CleanupClients never drops one),
// so every plugin restart of a long-running kvx serve grew it; unmanaged,
// about 2.5 KB a launch stays (measured over 40 launches on this machine).
func TestLaunchesAreNotKept(t *testing.T) {
	h := New(hclog.NewNullLogger(), nil) // no log lines kept either
	t.Cleanup(h.Close)
	heap := func() int64 {
		runtime.GC()
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return int64(m.HeapAlloc)
	}
	launch := func() {
		_, proc, err := h.LaunchManager(ctxTimeout(t), fakeManager)
		if err != nil {
			t.Fatal(err)
		}
		proc.Kill()
	}
	for range 5 { // what the first launches make once
		launch()
	}
	const n = 40
	before := heap()
	for range n {
		launch()
	}
	per := (heap() - before) / n
	t.Logf("the heap grew %d bytes a launch over %d launches", per, n)
	if per > 12<<10 {
		t.Errorf("the heap grew %d bytes a launch over %d launches and kills, want at most %d: something keeps each dead plugin", per, n, 12<<10)
	}
}
