package main

import (
	"github.com/kvx-dev/kvx/cachemgr_v1"
	"github.com/kvx-dev/kvx/cachemgr_v2"
	"github.com/kvx-dev/kvx/core/device"
	"github.com/kvx-dev/kvx/core/setup"
	"github.com/kvx-dev/kvx/dsa"
	"github.com/kvx-dev/kvx/dsa/mla"
	"github.com/kvx-dev/kvx/gqa"
	"github.com/kvx-dev/kvx/mamba"
	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
	"github.com/kvx-dev/kvx/plugins/v1/worker"
)

// registry lists the implementations linked into kvx for isolation: inprocess.
// With isolation: plugin (the default) the same code runs in the kvx-* binaries.
func registry() setup.Registry {
	return setup.Registry{
		Managers: map[string]func() kvcache.Manager{
			"v1":    func() kvcache.Manager { return cachemgrv1.New() },
			"v2":    func() kvcache.Manager { return cachemgrv2.New() },
			"mamba": func() kvcache.Manager { return mamba.New() },
		},
		Workers: map[string]func() worker.Worker{
			"dsa": func() worker.Worker { return device.NewWorker(dsa.Backend) },
			"mla": func() worker.Worker { return device.NewWorker(mla.Backend) },
			"gqa": func() worker.Worker { return device.NewWorker(gqa.Backend) },
		},
	}
}
