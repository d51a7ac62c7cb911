package main

import (
	"testing"

	"github.com/kvx-dev/kvx/plugins/conformance"
	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
	"github.com/kvx-dev/kvx/plugins/v1/pluginrpc"
)

// TestConformance runs kvx's contract suite on the manager twice: called
// directly, and through a real gRPC connection with the same server and
// converters a plugin process uses (pluginrpc.TestManagerPair). Every
// violation is reported, not only the first.
func TestConformance(t *testing.T) {
	opts := conformance.ManagerOptions{Reuse: true}
	t.Run("inprocess", func(t *testing.T) {
		conformance.TestManager(t, func() kvcache.Manager { return New() }, opts)
	})
	t.Run("grpc", func(t *testing.T) {
		conformance.TestManager(t, func() kvcache.Manager { return pluginrpc.TestManagerPair(t, New()) }, opts)
	})
}
