package main

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Liveness and signals (issue 16): a plugin that stops answering is killed
// and replaced, a plugin that never completes its handshake is abandoned at
// the start timeout, and SIGINT, SIGTERM and SIGHUP stop kvx at every phase
// with a partial report, no process left, and exit 128 + the signal.

// processAlive reports whether pid runs (a zombie does not).
func processAlive(pid int) bool {
	st := processState(pid)
	return st != 0 && st != 'Z'
}

// processState is the state letter of /proc/pid/stat (R, S, T, Z, ...), or
// 0 when there is no such process.
func processState(pid int) byte {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 || i+2 >= len(s) {
		return '?'
	}
	return s[i+2]
}

// pluginOf returns the pid of a running plugin process of binary, waiting
// up to 20 s for one.
func pluginOf(t *testing.T, binary string) int {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		for _, pid := range pluginPIDs(t) {
			if exe, _ := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid)); strings.HasSuffix(exe, "/"+binary) {
				return pid
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("no %s plugin process within 20 s", binary)
	return 0
}

// onlyPluginOf is the pid of the one process of binary (pluginOf), waiting
// up to 20 s for there to be exactly one.
func onlyPluginOf(t *testing.T, binary string) int {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		var found []int
		for _, pid := range pluginPIDs(t) {
			if exe, _ := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid)); strings.HasSuffix(exe, "/"+binary) {
				found = append(found, pid)
			}
		}
		if len(found) == 1 {
			return found[0]
		}
	}
	t.Fatalf("not exactly one %s plugin process within 20 s", binary)
	return 0
}

// waitExit waits for cmd, at most limit, and returns its exit code (-1
// when a signal ended it).
func waitExit(t *testing.T, cmd *exec.Cmd, limit time.Duration, stderr *bytes.Buffer) int {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return ee.ExitCode()
		}
		if err != nil {
			t.Fatalf("kvx: %v", err)
		}
		return 0
	case <-time.After(limit):
		_ = cmd.Process.Kill()
		<-done
		t.Fatalf("kvx still running after %v\n%s", limit, stderr)
		return 0
	}
}

// noPluginLeft fails if a plugin process of the test's binaries runs.
func noPluginLeft(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for len(pluginPIDs(t)) > 0 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond) // reaped by now, unless leaked
	}
	if pids := pluginPIDs(t); len(pids) > 0 {
		t.Errorf("plugin processes left: %v", pids)
	}
}

// startKvx starts the kvx binary with args; stderr is collected.
func startKvx(t *testing.T, args ...string) (*exec.Cmd, *bytes.Buffer) {
	t.Helper()
	cmd := kvxCommand(t, args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	return cmd, &stderr
}

// TestStoppedPluginIsReplaced: kill -STOP of the cache-manager plugin, or
// of the worker plugin, mid-run. The call waiting on it misses its deadline
// (2 s here), the watchdog kills the process, the engine restarts it and
// recomputes, and every request completes; no process is left.
func TestStoppedPluginIsReplaced(t *testing.T) {
	for _, binary := range []string{"kvx-cachemgr-v2", "kvx-backend-dsa"} {
		t.Run(binary, func(t *testing.T) {
			js := filepath.Join(t.TempDir(), "r.json")
			cmd, stderr := startKvx(t, "run", "-c", "testdata/small.yaml", "--set", "workload.requests=1500", "--no-progress",
				"--set", "plugin_timeouts.call=2s", "--set", "plugin_timeouts.forward=2s", "--set", "plugin_timeouts.configure=5s", "--json", js)
			pluginOf(t, binary)
			pluginOf(t, "kvx-backend-dsa")     // the worker starts after the manager
			time.Sleep(500 * time.Millisecond) // mid-run: the 1500 requests take about 4 s
			// The process serving now: under load a first start can time out
			// and be replaced, and its process outlive the replacement for a
			// while.
			victim := onlyPluginOf(t, binary)
			if err := syscall.Kill(victim, syscall.SIGSTOP); err != nil {
				waitExit(t, cmd, 60*time.Second, stderr)
				t.Fatalf("the stop of pid %d did not land: %v", victim, err)
			}
			// A zombie takes the signal too: only a process that reaches
			// state T (the signal is delivered when it next runs) was
			// stopped mid-run.
			st := processState(victim)
			for wait := time.Now(); st != 'T' && st != 'Z' && st != 0 && time.Since(wait) < time.Second; st = processState(victim) {
				time.Sleep(time.Millisecond)
			}
			if st != 'T' {
				waitExit(t, cmd, 60*time.Second, stderr)
				t.Fatalf("pid %d is in state %q after SIGSTOP, not stopped: the run ended (or the plugin exited) first\n%s", victim, st, stderr)
			}
			stopped := time.Now()
			var gone time.Duration
			for processAlive(victim) && time.Since(stopped) < 60*time.Second {
				time.Sleep(10 * time.Millisecond)
			}
			if !processAlive(victim) {
				gone = time.Since(stopped)
			}
			if code := waitExit(t, cmd, 60*time.Second, stderr); code != 0 {
				t.Fatalf("kvx run with a stopped %s: exit %d\n%s", binary, code, stderr)
			}
			if gone == 0 {
				_ = syscall.Kill(victim, syscall.SIGKILL)
				t.Fatalf("the stopped plugin pid %d was never killed", victim)
			}
			t.Logf("stopped %s (pid %d) killed %v after SIGSTOP (deadline 2 s)", binary, victim, gone.Round(time.Millisecond))
			r := readReports(t, js)[0]
			if r.Engine.PluginRestarts < 1 || !strings.Contains(stderr.String(), "did not answer within its deadline") {
				t.Errorf("restarts %d; want the stopped plugin detected and replaced\n%s", r.Engine.PluginRestarts, stderr)
			}
			if r.Requests.Completed != r.Requests.Total || r.Requests.Failed != 0 || r.Invariants.Violations != 0 {
				t.Errorf("requests %+v invariants %+v; want every request completed", r.Requests, r.Invariants)
			}
			noPluginLeft(t)
		})
	}
}

// wrapperScript writes an executable shell script that records its own pid
// and its child's (a sleep of secs seconds) in dir, waits for the sleep,
// then runs tail (nothing: it never execs a plugin before that).
func wrapperScript(t *testing.T, dir string, secs int, tail string) (string, func() []int) {
	t.Helper()
	script := filepath.Join(dir, "wrapper.sh")
	body := fmt.Sprintf("#!/bin/sh\necho $$ > %[1]s/sh.pid\nsleep %[2]d &\necho $! > %[1]s/sleep.pid\nwait\n%[3]s\n", dir, secs, tail)
	if err := os.WriteFile(script, []byte(body), 0o755); err != nil {
		t.Fatal(err)
	}
	return script, func() []int {
		var pids []int
		deadline := time.Now().Add(20 * time.Second)
		for _, f := range []string{"sh.pid", "sleep.pid"} {
			for {
				b, err := os.ReadFile(filepath.Join(dir, f))
				if pid, perr := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && perr == nil {
					pids = append(pids, pid)
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("the wrapper wrote no %s within 20 s", f)
				}
				time.Sleep(20 * time.Millisecond)
			}
		}
		return pids
	}
}

func wantProcessesGone(t *testing.T, pids []int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for _, pid := range pids {
		for processAlive(pid) && time.Now().Before(deadline) {
			time.Sleep(20 * time.Millisecond)
		}
		if processAlive(pid) {
			t.Errorf("pid %d (the wrapper or its child) still runs", pid)
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}

// TestHangingWrapperTimesOut: a wrapper script that never execs the plugin
// (it sleeps, holding go-plugin's pipes) fails the run at the start timeout
// with a message that names it, and its child goes with it.
func TestHangingWrapperTimesOut(t *testing.T) {
	t.Parallel()
	script, pids := wrapperScript(t, t.TempDir(), 100000, "")
	cmd, stderr := startKvx(t, "run", "-c", "testdata/small.yaml", "--set", "cache_manager="+script,
		"--set", "plugin_timeouts.start=1s", "--no-progress")
	code := waitExit(t, cmd, 30*time.Second, stderr)
	if code == 0 || code > 128 {
		t.Errorf("exit %d, want a failure", code)
	}
	for _, w := range []string{script, "start timeout of 1s", "plugin_timeouts.start"} {
		if !strings.Contains(stderr.String(), w) {
			t.Errorf("message lacks %q:\n%s", w, stderr)
		}
	}
	wantProcessesGone(t, pids())
	noPluginLeft(t)
}

// TestSignalsStopKvx: SIGINT, SIGTERM and SIGHUP, sent while a plugin is
// in its start-up (a wrapper that sleeps before it execs the plugin) and
// mid-run, stop kvx with exit 130, 143 and 129; the run's report says it
// was interrupted (not that a plugin failed) and no process is left.
func TestSignalsStopKvx(t *testing.T) {
	t.Parallel()
	for _, sig := range []syscall.Signal{syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP} {
		want := 128 + int(sig)
		t.Run(signalName(sig)+"/start-up", func(t *testing.T) {
			script, pids := wrapperScript(t, t.TempDir(), 60, "exec "+filepath.Join(binDir, "kvx-cachemgr-v2"))
			cmd, stderr := startKvx(t, "run", "-c", "testdata/small.yaml", "--set", "cache_manager="+script, "--no-progress")
			started := pids() // the wrapper runs: kvx waits for its handshake
			if err := cmd.Process.Signal(sig); err != nil {
				t.Fatal(err)
			}
			if code := waitExit(t, cmd, 20*time.Second, stderr); code != want {
				t.Errorf("exit %d, want %d\n%s", code, want, stderr)
			}
			wantProcessesGone(t, started)
			noPluginLeft(t)
		})
		t.Run(signalName(sig)+"/mid-run", func(t *testing.T) {
			js := filepath.Join(t.TempDir(), "r.json")
			cmd, stderr := startKvx(t, "run", "-c", "testdata/small.yaml", "--set", "workload.requests=20000", "--set", "workload.rate=0",
				"--no-progress", "--json", js)
			pluginOf(t, "kvx-backend-dsa")
			time.Sleep(time.Second) // running
			if err := cmd.Process.Signal(sig); err != nil {
				t.Fatal(err)
			}
			if code := waitExit(t, cmd, 20*time.Second, stderr); code != want {
				t.Errorf("exit %d, want %d\n%s", code, want, stderr)
			}
			r := readReports(t, js)[0]
			if !strings.HasPrefix(r.Error, "run interrupted") || r.Requests.Total != 20000 || r.Requests.Completed == r.Requests.Total {
				t.Errorf("report error %q, requests %+v; want an interrupted run's partial report", r.Error, r.Requests)
			}
			if s := stderr.String(); strings.Contains(s, "plugin died") || !strings.Contains(s, "stopped by "+signalName(sig)) {
				t.Errorf("stderr reports a plugin failure, or not the signal:\n%s", s)
			}
			noPluginLeft(t)
		})
	}
}

// TestInterruptedCompareStopsAtOnce: SIGINT during compare's first variant
// stops the comparison: no next variant runs, and the report holds the one
// that was interrupted.
func TestInterruptedCompareStopsAtOnce(t *testing.T) {
	t.Parallel()
	js := filepath.Join(t.TempDir(), "r.json")
	cmd, stderr := startKvx(t, "compare", "-c", "testdata/small.yaml", "--set", "workload.requests=20000", "--set", "workload.rate=0",
		"--vary", "cache_manager=v1,v2", "--no-progress", "--json", js)
	pluginOf(t, "kvx-backend-dsa")
	time.Sleep(time.Second)
	if err := cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	if code := waitExit(t, cmd, 20*time.Second, stderr); code != 130 {
		t.Errorf("exit %d, want 130\n%s", code, stderr)
	}
	rs := readReports(t, js)
	if len(rs) != 1 || !strings.HasPrefix(rs[0].Error, "run interrupted") {
		t.Errorf("%d reports %+v, want the interrupted first variant alone", len(rs), rs)
	}
	noPluginLeft(t)
}
