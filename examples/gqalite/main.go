// Command kvx-backend-gqalite is a kvx attention backend written by a third
// party: its own Go module, built only against kvx's public plugin contract
// (plugins/v1/worker, plugins/v1/kvcache, plugins/v1/spec and plugins/sdk),
// without kvx's worker runtime (device/).
//
// It runs grouped-query attention layers (full and sliding-window, MHA and
// MQA included) and pure FFN layers on the sim device: it keeps each
// sequence's block tables as the cache manager grants them, checks every
// item against them, models a step's time with a roofline of its own (one
// fused attention kernel per layer) and samples the contract's placeholder
// tokens (worker.Placeholder), so its outputs are kvx's gqa backend's, bit
// for bit, and only its times differ. It has no Mamba2 mixer and no cpu or
// cuda device.
//
// Build it next to kvx and pick it by path:
//
//	go build -o ../../bin/kvx-backend-gqalite .
//	bin/kvx conformance bin/kvx-backend-gqalite
//	bin/kvx run -c examples/gqalite/testdata/llama-sim.yaml --set attention_backend=./bin/kvx-backend-gqalite
//
// docs/plugin-authors.md walks through this code.
package main

import (
	"github.com/kvx-dev/kvx/plugins/sdk"
	"github.com/kvx-dev/kvx/plugins/v1/worker"
)

func main() {
	sdk.ServeWorker(func() worker.Worker { return New() })
}
