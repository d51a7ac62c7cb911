package config

import (
	"strings"
	"testing"

	"github.com/kvx-dev/kvx/core/registry"
	"github.com/kvx-dev/kvx/core/registry/registrytest"
	"github.com/kvx-dev/kvx/plugins/v1/spec"
)

// testReg is the built-in registry's shape (this package's tests cannot
// import cmd/builtin, which imports it).
var testReg = registrytest.Builtin()

// TestPluginKeysAskTheRegistry: cache_manager and attention_backend take a
// registered name (any case) or a path, their defaults are the first
// registered entry that serves the model, and a backend's fit is its
// registered mixers; a registry with another backend is obeyed without a
// line of this package changing.
func TestPluginKeysAskTheRegistry(t *testing.T) {
	for _, tc := range []struct {
		sets         []string
		manager, bkd string
	}{
		{[]string{"model=llama-3.1-8b"}, "v2", "gqa"},
		{[]string{"model=deepseek-v3"}, "v2", "mla"},
		{[]string{"model=deepseek-v3.2"}, "v2", "dsa"},
		{[]string{"model=deepseek-v3.2", "attention_backend=MLA"}, "v2", "mla"},
		{[]string{"model=nemotron-3-nano-30b-a3b"}, "mamba", "gqa"},
		{[]string{"model=nemotron-3-nano-30b-a3b", "cache_manager=v1"}, "v1", "gqa"},
		{[]string{"model=llama-3.1-8b", "attention_backend=./bin/kvx-backend-mine", "cache_manager=/opt/kvx-fifo"}, "/opt/kvx-fifo", "./bin/kvx-backend-mine"},
		// A path is not checked against the model here: its worker's Info
		// says what it runs when it is configured.
		{[]string{"model=deepseek-v3.2", "attention_backend=./kvx-backend-x"}, "v2", "./kvx-backend-x"},
	} {
		c, _, err := Load(testReg, nil, nil, tc.sets)
		if err != nil {
			t.Errorf("Load(%v): %v", tc.sets, err)
			continue
		}
		if c.CacheManager != tc.manager || c.AttentionBackend != tc.bkd {
			t.Errorf("Load(%v): cache_manager %q, attention_backend %q; want %q, %q", tc.sets, c.CacheManager, c.AttentionBackend, tc.manager, tc.bkd)
		}
		if c.Registry() != testReg {
			t.Errorf("Load(%v).Registry() is not the registry it was loaded against", tc.sets)
		}
	}

	reg := registrytest.Builtin()
	reg.Backends = append([]registry.Backend{{Name: "gqa2", Binary: "kvx-backend-gqa2", Mixers: []spec.Mixer{spec.MixerGQA}}}, reg.Backends...)
	if c, _, err := Load(reg, nil, nil, []string{"model=llama-3.1-8b"}); err != nil || c.AttentionBackend != "gqa2" {
		t.Errorf("with gqa2 registered first: attention_backend %v, %v; want gqa2", c, err)
	}

	for _, tc := range []struct {
		reg  *registry.Registry
		sets []string
		want []string
	}{
		{testReg, []string{"model=llama-3.1-8b", "attention_backend=gqa3"},
			[]string{`attention_backend: "gqa3" (--set) is not one of dsa, mla, gqa or a plugin path (containing a path separator)`}},
		{testReg, []string{"model=llama-3.1-8b", "cache_manager=v3"},
			[]string{`cache_manager: "v3" (--set) is not one of v2, mamba, v1 or a plugin path (containing a path separator)`}},
		{testReg, []string{"model=nemotron-3-nano-30b-a3b", "attention_backend=mla"},
			[]string{`attention_backend: "mla" does not fit model "nemotron-3-nano-30b-a3b", whose layers need mixers mamba, gqa: backend mla runs mla, dsa; allowed: gqa, or a plugin path`}},
		{nil, []string{"model=llama-3.1-8b"}, []string{
			`attention_backend: not set, and no built-in backend (none) runs every mixer of model "llama-3.1-8b" (gqa); set attention_backend to a plugin path`,
			`cache_manager: not set, and no built-in cache manager (none) manages every mixer of model "llama-3.1-8b" (gqa); set cache_manager to a plugin path`}},
		{nil, []string{"model=llama-3.1-8b", "attention_backend=gqa"}, []string{
			`attention_backend: "gqa" (--set) is not a plugin path (containing a path separator); this kvx has no built-in one`}},
	} {
		_, _, err := Load(tc.reg, nil, nil, tc.sets)
		for _, w := range tc.want {
			if err == nil || !strings.Contains(err.Error(), w) {
				t.Errorf("Load(%v) = %v; want an error containing\n%s", tc.sets, err, w)
			}
		}
	}
}
