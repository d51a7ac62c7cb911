package host

import (
	"syscall"
	"testing"
)

// TestParentDeathKillsPlugin: a host killed with SIGKILL runs no handler;
// the parent-death signal still takes its plugin down.
func TestParentDeathKillsPlugin(t *testing.T) {
	cmd, pid, _ := startHelper(t, "nohandle")
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	waitGone(t, pid)
}
