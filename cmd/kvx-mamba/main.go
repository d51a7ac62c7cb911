// Command kvx-mamba serves the mamba cache manager (cache_manager: mamba:
// the V2 parts plus an SSM life cycle with snapshot-based prefix reuse for
// hybrid Mamba models) as a kvx cache-manager plugin. The kvx core starts it;
// it is not meant to be run by hand.
package main

import (
	"github.com/kvx-dev/kvx/mamba"
	"github.com/kvx-dev/kvx/plugins/sdk"
	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
)

func main() {
	sdk.ServeCacheManager(func() kvcache.Manager { return mamba.New() })
}
