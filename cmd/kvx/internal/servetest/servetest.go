// Package servetest runs kvx serve as a process for the tests of cmd/kvx
// and of cmd/kvx/soaktest (a package of its own, so that its minute of
// soak runs beside the others): start it and wait until it listens, stop it
// with SIGTERM and read its exit code, and list the plugin processes left
// behind.
package servetest

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// SyncBuffer is a bytes.Buffer that a child's output and the test may use
// at once.
type SyncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *SyncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *SyncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// Served is a kvx serve process: its command, the base URL it listens on
// and its standard error so far.
type Served struct {
	Cmd    *exec.Cmd
	Base   string
	Stderr *SyncBuffer
}

// Start starts cmd (kvx serve with --port 0) and returns once it says where
// it listens; the process is killed when the test ends.
func Start(t testing.TB, cmd *exec.Cmd) *Served {
	t.Helper()
	pipe, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	s := &Served{Cmd: cmd, Stderr: &SyncBuffer{}}
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	sc := bufio.NewScanner(pipe)
	for sc.Scan() {
		fmt.Fprintln(s.Stderr, sc.Text())
		if u, ok := strings.CutPrefix(sc.Text(), "kvx serve: listening on "); ok {
			s.Base = u
			break
		}
	}
	if s.Base == "" {
		_ = cmd.Wait()
		t.Fatalf("kvx serve did not listen:\n%s", s.Stderr)
	}
	go io.Copy(s.Stderr, pipe)
	return s
}

// Stop sends SIGTERM and returns the exit code (Wait).
func (s *Served) Stop(t testing.TB) int {
	t.Helper()
	if err := s.Cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	return s.Wait(t)
}

// Wait returns the process's exit code; a process still running 30 s on
// is killed and fails the test.
func (s *Served) Wait(t testing.TB) int {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- s.Cmd.Wait() }()
	select {
	case err := <-done:
		if ee, ok := err.(*exec.ExitError); ok {
			return ee.ExitCode()
		}
		if err != nil {
			t.Fatal(err)
		}
		return 0
	case <-time.After(30 * time.Second):
		_ = s.Cmd.Process.Kill()
		t.Fatalf("kvx serve still runs 30 s after SIGTERM\n%s", s.Stderr)
		return 0
	}
}

// PluginPIDs lists the live processes whose executable is a plugin binary
// of binDir (anything there but kvx itself); zombies are not alive.
func PluginPIDs(t testing.TB, binDir string) []int {
	t.Helper()
	pids, err := Plugins(binDir, nil)
	if err != nil {
		t.Skip("no /proc")
	}
	return pids
}

// Plugins lists the live processes whose executable is a plugin binary of
// binDir (anything there but kvx itself); zombies are not alive. With
// sessions, only the processes of one of those sessions: a kvx started in
// a session of its own (NewSession) keeps its plugins in it, also once
// they are orphaned (core/host gives each plugin a process group of its
// own, not a session).
func Plugins(binDir string, sessions []int) ([]int, error) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		exe, err := os.Readlink(filepath.Join("/proc", e.Name(), "exe"))
		if err != nil || !strings.HasPrefix(exe, binDir) || strings.HasSuffix(exe, "/kvx") {
			continue
		}
		stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue // gone
		}
		// pid (comm) state ppid pgrp session ...; comm may hold spaces
		// and parentheses, so the fields are counted from the last ')'.
		f := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:]))
		if len(f) < 4 || f[0] == "Z" {
			continue // a zombie: dead, waiting for a reaper
		}
		if sid, _ := strconv.Atoi(f[3]); sessions != nil && !slices.Contains(sessions, sid) {
			continue
		}
		pids = append(pids, pid)
	}
	return pids, nil
}

// NewSession makes cmd start in a session of its own, whose id is its
// pid (Plugins' sessions).
func NewSession(cmd *exec.Cmd) {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Setsid = true
}
