package sdk

import (
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"
)

const signalChildEnv = "KVX_SDK_TEST_SIGNAL_CHILD"

// TestIgnoreStopSignals: a process that called ignoreStopSignals survives
// SIGTERM and SIGHUP sent to it (it exits 0 after them); without the call
// SIGTERM kills it (the check can fail).
func TestIgnoreStopSignals(t *testing.T) {
	if os.Getenv(signalChildEnv) != "" {
		if os.Getenv(signalChildEnv) == "ignore" {
			ignoreStopSignals()
		}
		syscall.Kill(os.Getpid(), syscall.SIGTERM)
		syscall.Kill(os.Getpid(), syscall.SIGHUP)
		time.Sleep(100 * time.Millisecond)
		os.Exit(0)
	}
	for _, mode := range []string{"ignore", "default"} {
		cmd := exec.Command(os.Args[0], "-test.run", "^TestIgnoreStopSignals$")
		cmd.Env = append(os.Environ(), signalChildEnv+"="+mode)
		err := cmd.Run()
		killed := false
		if ee, ok := err.(*exec.ExitError); ok {
			if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
				killed = true
			}
		}
		if mode == "ignore" && err != nil {
			t.Errorf("with ignoreStopSignals: %v, want exit 0", err)
		}
		if mode == "default" && !killed {
			t.Errorf("without ignoreStopSignals: %v, want killed by SIGTERM", err)
		}
	}
}
