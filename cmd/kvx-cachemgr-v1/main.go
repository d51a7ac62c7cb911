// Command kvx-cachemgr-v1 serves the TensorRT-LLM V1 style cache manager
// (package cachemgrv1) as a kvx plugin over go-plugin/gRPC. The kvx host
// starts it; run by hand it prints go-plugin's notice and exits.
package main

import (
	cachemgrv1 "github.com/kvx-dev/kvx/cachemgr_v1"
	"github.com/kvx-dev/kvx/plugins/sdk"
	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
)

func main() {
	sdk.ServeCacheManager(func() kvcache.Manager { return cachemgrv1.New() })
}
