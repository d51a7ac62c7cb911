package host

import (
	"os/exec"
	"syscall"
)

// setParentDeathSignal makes the kernel SIGKILL the child when the host
// dies, even by SIGKILL. Linux sends it when the thread that started the
// child exits; Go only ends threads whose goroutine called
// runtime.LockOSThread and returned without unlocking, so do not launch
// plugins from such a goroutine.
func setParentDeathSignal(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
