//go:build !linux

package sdk

// ignoreStopSignals does nothing where the host cannot give its plugins a
// parent-death signal: there a plugin must still end on SIGTERM when its
// host is gone.
func ignoreStopSignals() {}
