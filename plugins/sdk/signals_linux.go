package sdk

import (
	"os/signal"
	"syscall"
)

// ignoreStopSignals makes a served plugin ignore SIGTERM and SIGHUP (go-plugin
// already ignores SIGINT). The host owns shutdown: kvx drains its requests
// and then kills and reaps its plugins, so a signal that reaches every
// process at once (systemd's KillMode=control-group, a kill of the process
// group, `timeout`) must not end a plugin in the middle of the drain, where
// its exit would look like a fault and be restarted. A plugin whose host
// died still ends: the host starts it with the parent-death signal SIGKILL
// (core/host), which cannot be ignored.
func ignoreStopSignals() { signal.Ignore(syscall.SIGTERM, syscall.SIGHUP) }
