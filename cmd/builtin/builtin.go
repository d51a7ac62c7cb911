// Package builtin lists the cache managers and attention backends that ship
// with kvx, for the kvx command (isolation: inprocess) and for tests that
// run the engine without plugin processes. With isolation: plugin the same
// code runs in the kvx-* binaries, which build their workers with Worker.
package builtin

import (
	cachemgrv1 "github.com/kvx-dev/kvx/cachemgr_v1"
	cachemgrv2 "github.com/kvx-dev/kvx/cachemgr_v2"
	"github.com/kvx-dev/kvx/core/setup"
	"github.com/kvx-dev/kvx/device"
	"github.com/kvx-dev/kvx/device/cpu"
	"github.com/kvx-dev/kvx/dsa"
	"github.com/kvx-dev/kvx/dsa/mla"
	"github.com/kvx-dev/kvx/gqa"
	"github.com/kvx-dev/kvx/mamba"
	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
	"github.com/kvx-dev/kvx/plugins/v1/worker"
)

// Registry returns the built-in managers (v1, v2, mamba) and workers (dsa,
// mla, gqa); every call returns fresh factories.
func Registry() setup.Registry {
	return setup.Registry{
		Managers: map[string]func() kvcache.Manager{
			"v1":    func() kvcache.Manager { return cachemgrv1.New() },
			"v2":    func() kvcache.Manager { return cachemgrv2.New() },
			"mamba": func() kvcache.Manager { return mamba.New() },
		},
		Workers: map[string]func() worker.Worker{
			"dsa": func() worker.Worker { return Worker(dsa.Backend) },
			"mla": func() worker.Worker { return Worker(mla.Backend) },
			"gqa": func() worker.Worker { return Worker(gqa.Backend) },
		},
	}
}

// Backend returns the built-in attention backend named name (its config
// name, Backend.Name), or nil when there is none.
func Backend(name string) device.Backend {
	for _, b := range []device.Backend{dsa.Backend, mla.Backend, gqa.Backend} {
		if b.Name() == name {
			return b
		}
	}
	return nil
}

// Worker is the worker runtime for backend b with every built-in device:
// sim (built into the runtime) and cpu.
func Worker(b device.Backend) *device.Worker {
	return device.NewWorker(b, device.WithDevice("cpu", cpu.Open))
}
