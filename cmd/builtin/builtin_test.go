package builtin_test

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/kvx-dev/kvx/cmd/builtin"
	"github.com/kvx-dev/kvx/core/host"
	"github.com/kvx-dev/kvx/core/registry"
	"github.com/kvx-dev/kvx/core/registry/registrytest"
)

// TestRegistry: every entry is well formed, a backend's entry says what its
// worker's Info says and a manager's what its Info says, every binary has
// its folder under cmd/, and the factories make fresh instances.
func TestRegistry(t *testing.T) {
	reg := builtin.Registry()
	if err := reg.Check(); err != nil {
		t.Fatal(err)
	}
	if registry.BinaryPrefix != host.NamePrefix {
		t.Errorf("registry.BinaryPrefix %q, host.NamePrefix %q: kvx plugins would not list the registered binaries", registry.BinaryPrefix, host.NamePrefix)
	}
	ctx := context.Background()
	for _, b := range reg.Backends {
		w := b.New()
		info, err := w.Info(ctx)
		if err != nil {
			t.Fatalf("backend %s: Info: %v", b.Name, err)
		}
		if info.Name != b.Name || !slices.Equal(info.Mixers, b.Mixers) {
			t.Errorf("backend %s: Info says %s running %v; the registry says %s running %v", b.Name, info.Name, info.Mixers, b.Name, b.Mixers)
		}
		if b.New() == w {
			t.Errorf("backend %s: New returned the same worker twice", b.Name)
		}
	}
	for _, m := range reg.Managers {
		mgr := m.New()
		info, err := mgr.Info(ctx)
		if err != nil {
			t.Fatalf("manager %s: Info: %v", m.Name, err)
		}
		if !slices.Equal(info.Capabilities.Mixers, m.Capabilities.Mixers) || info.Capabilities.SSMReuse != m.Capabilities.SSMReuse {
			t.Errorf("manager %s: Info says %+v; the registry says %+v", m.Name, info.Capabilities, m.Capabilities)
		}
		if m.New() == mgr {
			t.Errorf("manager %s: New returned the same manager twice", m.Name)
		}
	}
	for _, bin := range append(binaries(reg.ManagerNames(), reg.ManagerBinary), binaries(reg.BackendNames(), reg.BackendBinary)...) {
		if _, err := os.Stat(filepath.Join("..", bin, "main.go")); err != nil {
			t.Errorf("binary %s has no cmd/%s/main.go: %v", bin, bin, err)
		}
	}
}

func binaries(names []string, binary func(string) string) []string {
	var out []string
	for _, n := range names {
		out = append(out, binary(n))
	}
	return out
}

// TestRegistrytestAgrees pins core/registry/registrytest, the copy that
// core's own tests load configurations against, to the real registry:
// the same names in the same order, binaries and mixers.
func TestRegistrytestAgrees(t *testing.T) {
	real, fake := builtin.Registry(), registrytest.Builtin()
	if !slices.Equal(real.ManagerNames(), fake.ManagerNames()) || !slices.Equal(real.BackendNames(), fake.BackendNames()) {
		t.Fatalf("registrytest names %v, %v; builtin %v, %v", fake.ManagerNames(), fake.BackendNames(), real.ManagerNames(), real.BackendNames())
	}
	for i, m := range real.Managers {
		f := fake.Managers[i]
		if f.Binary != m.Binary || !slices.Equal(f.Capabilities.Mixers, m.Capabilities.Mixers) || f.Capabilities.SSMReuse != m.Capabilities.SSMReuse {
			t.Errorf("manager %s: registrytest has %s %v, builtin %s %v", m.Name, f.Binary, f.Capabilities.Mixers, m.Binary, m.Capabilities.Mixers)
		}
	}
	for i, b := range real.Backends {
		f := fake.Backends[i]
		if f.Binary != b.Binary || !slices.Equal(f.Mixers, b.Mixers) {
			t.Errorf("backend %s: registrytest has %s %v, builtin %s %v", b.Name, f.Binary, f.Mixers, b.Binary, b.Mixers)
		}
	}
}
