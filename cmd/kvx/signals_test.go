package main

import (
	"os"
	"syscall"
	"testing"
	"time"
)

// A stop signal repeated at once (timeout, a process-group kill) is the
// same request and still drains; a later one, or another signal, exits now.
func TestExitsNow(t *testing.T) {
	for _, tc := range []struct {
		next  os.Signal
		since time.Duration
		want  bool
	}{
		{syscall.SIGTERM, time.Millisecond, false},
		{syscall.SIGTERM, 2 * time.Second, true},
		{syscall.SIGINT, time.Millisecond, true},
	} {
		if got := exitsNow(syscall.SIGTERM, tc.next, tc.since); got != tc.want {
			t.Errorf("exitsNow(SIGTERM, %v, %v) = %v, want %v", tc.next, tc.since, got, tc.want)
		}
	}
}
