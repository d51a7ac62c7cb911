// Package builtin is the one registry that names every cache manager and
// attention backend shipped with kvx (DESIGN §7): its name in the config,
// its plugin binary (cmd/<binary>), what it serves and its in-process
// factory. Config validation, setup, `kvx plugins` and the engine's
// compatibility checks all ask the core/registry.Registry it returns; no
// other package names a manager or a backend. It is the only package that
// imports both wings (the managers and the worker runtime with its
// backends), so it lives above core, which imports neither.
//
// Adding a built-in backend is its own folder (a device.Backend, and
// cmd/kvx-backend-<name> serving it) and one line in backends; a manager,
// its folder and one line in managers. With isolation: plugin the same code
// runs in the kvx-* binaries, which build their workers as Worker does.
package builtin

import (
	"context"
	"fmt"
	"slices"

	cachemgrv1 "github.com/kvx-dev/kvx/cachemgr_v1"
	cachemgrv2 "github.com/kvx-dev/kvx/cachemgr_v2"
	"github.com/kvx-dev/kvx/core/registry"
	"github.com/kvx-dev/kvx/device"
	"github.com/kvx-dev/kvx/device/cpu"
	"github.com/kvx-dev/kvx/dsa"
	"github.com/kvx-dev/kvx/dsa/mla"
	"github.com/kvx-dev/kvx/gqa"
	"github.com/kvx-dev/kvx/mamba"
	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
	"github.com/kvx-dev/kvx/plugins/v1/worker"
)

// managers are the built-in cache managers in the order a default is
// picked: the first that manages every mixer of the model (v2, or mamba for
// a hybrid; v1 only by name).
var managers = []struct {
	name, binary string
	new          func() kvcache.Manager
}{
	{"v2", "kvx-cachemgr-v2", func() kvcache.Manager { return cachemgrv2.New() }},
	{"mamba", "kvx-mamba", func() kvcache.Manager { return mamba.New() }},
	{"v1", "kvx-cachemgr-v1", func() kvcache.Manager { return cachemgrv1.New() }},
}

// backends are the built-in attention backends in the order a default is
// picked: the first that runs every mixer of the model (dsa for DSA models,
// mla for MLA ones, gqa for the rest). Each is named by its own Name, served
// by the binary kvx-backend-<name>, and runs what its own Mixers says.
var backends = []device.Backend{dsa.Backend, mla.Backend, gqa.Backend}

// BackendBinary is the plugin binary of a built-in backend named name.
func BackendBinary(name string) string { return "kvx-backend-" + name }

// Registry returns the built-in managers and backends; every call returns a
// fresh registry, whose factories make fresh instances. A manager's
// capabilities are what its Info says.
func Registry() *registry.Registry {
	r := &registry.Registry{}
	for _, m := range managers {
		info, err := m.new().Info(context.Background())
		if err != nil { // an unconfigured manager describes itself without failing
			panic(fmt.Sprintf("builtin: cache manager %s: Info: %v", m.name, err))
		}
		r.Managers = append(r.Managers, registry.Manager{Name: m.name, Binary: m.binary, Capabilities: info.Capabilities, New: m.new})
	}
	for _, b := range backends {
		r.Backends = append(r.Backends, registry.Backend{
			Name: b.Name(), Binary: BackendBinary(b.Name()), Mixers: slices.Clone(b.Mixers()),
			New: func() worker.Worker { return Worker(b) },
		})
	}
	return r
}

// Backend returns the built-in attention backend named name (its config
// name, Backend.Name), or nil when there is none.
func Backend(name string) device.Backend {
	for _, b := range backends {
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
