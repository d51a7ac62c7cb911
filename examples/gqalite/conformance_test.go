package main

import (
	"testing"

	"github.com/kvx-dev/kvx/plugins/conformance"
	"github.com/kvx-dev/kvx/plugins/v1/pluginrpc"
	"github.com/kvx-dev/kvx/plugins/v1/worker"
)

// TestConformance runs kvx's worker contract suite on the backend twice:
// called directly, and through a real gRPC connection with the same server
// and converters a plugin process uses (pluginrpc.TestWorkerPair). Every
// violation is reported, not only the first.
func TestConformance(t *testing.T) {
	opts := conformance.WorkerOptions{}
	t.Run("inprocess", func(t *testing.T) {
		conformance.TestWorker(t, func() worker.Worker { return New() }, opts)
	})
	t.Run("grpc", func(t *testing.T) {
		conformance.TestWorker(t, func() worker.Worker { return pluginrpc.TestWorkerPair(t, New()) }, opts)
	})
}
