// Command kvx-fifo is a kvx cache manager written by a third party: its own
// Go module, built only against kvx's public plugin contract
// (plugins/v1/kvcache, plugins/v1/spec and plugins/sdk).
//
// It keeps one device pool for every paged layer, reuses prompt prefixes in
// full blocks, and evicts cached blocks first in, first out: when a step
// needs a block and none is free, the cached block that entered the cache
// earliest goes, however often it was reused since (kvx's cachemgr-v1
// evicts the least recently used). It has no host tier and no SSM state.
//
// Build it next to kvx and pick it by path:
//
//	go build -o ../../bin/kvx-fifo .
//	bin/kvx run -c scenarios/cpu-llama.yaml --set cache_manager=./bin/kvx-fifo
//
// docs/plugin-authors.md walks through this code.
package main

import (
	"github.com/kvx-dev/kvx/plugins/sdk"
	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
)

func main() {
	sdk.ServeCacheManager(func() kvcache.Manager { return New() })
}
