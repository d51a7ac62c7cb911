// Command kvx-backend-dsa is the DeepSeek Sparse Attention attention backend as a worker plugin.
// The kvx host starts it (plugins/sdk serves it over go-plugin gRPC).
package main

import (
	"github.com/kvx-dev/kvx/cmd/builtin"
	"github.com/kvx-dev/kvx/dsa"
	"github.com/kvx-dev/kvx/plugins/sdk"
	"github.com/kvx-dev/kvx/plugins/v1/worker"
)

func main() {
	sdk.ServeWorker(func() worker.Worker { return builtin.Worker(dsa.Backend) })
}
