// Command kvx-cachemgr-v2 serves cachemgr_v2 (TensorRT-LLM "KV cache manager
// V2" style: pool groups by life cycle, device and host tiers, radix-tree
// reuse with pins and deferred pruning) as a kvx cache-manager plugin. The
// kvx core starts it; it is not meant to be run by hand.
package main

import (
	cachemgrv2 "github.com/kvx-dev/kvx/cachemgr_v2"
	"github.com/kvx-dev/kvx/plugins/sdk"
	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
)

func main() {
	sdk.ServeCacheManager(func() kvcache.Manager { return cachemgrv2.New() })
}
