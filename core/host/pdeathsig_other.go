//go:build !linux

package host

import "os/exec"

// setParentDeathSignal does nothing where the kernel has no parent-death
// signal; Close or HandleSignals must end children.
func setParentDeathSignal(*exec.Cmd) {}
