// Package registrytest gives tests of core packages that cannot import
// cmd/builtin (it imports them) a registry shaped like kvx's: the built-in
// names, binaries and mixers, without factories. cmd/builtin's
// TestRegistrytestAgrees pins it to the real one.
package registrytest

import (
	"github.com/kvx-dev/kvx/core/registry"
	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
	"github.com/kvx-dev/kvx/plugins/v1/spec"
)

// Builtin returns a fresh copy of the built-in registry's names, binaries,
// order and mixers (manager capabilities: mixers and SSM reuse only; no New).
func Builtin() *registry.Registry {
	paged := []spec.Mixer{spec.MixerGQA, spec.MixerMLA, spec.MixerDSA}
	hybrid := append(paged[:3:3], spec.MixerMamba)
	return &registry.Registry{
		Managers: []registry.Manager{
			{Name: "v2", Binary: "kvx-cachemgr-v2", Capabilities: kvcache.Capabilities{Mixers: paged, PrefixReuse: true}},
			{Name: "mamba", Binary: "kvx-mamba", Capabilities: kvcache.Capabilities{Mixers: hybrid, PrefixReuse: true, SSMState: true, SSMReuse: true}},
			{Name: "v1", Binary: "kvx-cachemgr-v1", Capabilities: kvcache.Capabilities{Mixers: hybrid, PrefixReuse: true, SSMState: true}},
		},
		Backends: []registry.Backend{
			{Name: "dsa", Binary: "kvx-backend-dsa", Mixers: []spec.Mixer{spec.MixerDSA}},
			{Name: "mla", Binary: "kvx-backend-mla", Mixers: []spec.Mixer{spec.MixerMLA, spec.MixerDSA}},
			{Name: "gqa", Binary: "kvx-backend-gqa", Mixers: []spec.Mixer{spec.MixerGQA, spec.MixerMamba, spec.MixerNone}},
		},
	}
}
