//go:build unix

package host

import (
	"os/exec"
	"syscall"
)

// ownGroup starts cmd in a process group of its own, whose id is its pid.
// A terminal's Ctrl-C then reaches only kvx, which stops its plugins itself.
func ownGroup(cmd *exec.Cmd) {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Setpgid = true
}

// killGroup sends SIGKILL to the process group pid leads.
func killGroup(pid int) error {
	err := syscall.Kill(-pid, syscall.SIGKILL)
	if err == syscall.ESRCH {
		return nil
	}
	return err
}
