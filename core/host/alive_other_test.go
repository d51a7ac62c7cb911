//go:build unix && !linux

package host

import "syscall"

// alive reports whether pid exists (zombies included: no /proc here).
func alive(pid int) bool {
	return syscall.Kill(pid, 0) == nil
}
