package builtin_test

import (
	"os/exec"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/kvx-dev/kvx/cmd/builtin"
)

const mod = "github.com/kvx-dev/kvx/"

// layoutRule is one rule of the layout (DESIGN §7), checked on what each
// package and binary really links.
type layoutRule struct {
	name  string
	pkgs  []string // patterns for go list
	tags  string   // build tags
	deps  bool     // all transitive dependencies, not only the packages' own imports
	tests bool     // the packages' test files' imports too (without deps)
	ban   []string // import path prefixes that must not appear
	allow []string // exceptions to ban (exact paths)
}

// layoutRules are the layout's rules: the engine and the worker wing are two
// programs that meet only through plugins/, and only the cuda worker may
// link the CUDA driver package, whose init exits on a machine without a
// GPU. The managers, the backends and their binaries are the registry's
// (a backend's package is its device.Backend's, a manager's its New's), so
// a backend or manager added to the registry is held to the rules without
// a line here.
func layoutRules() []layoutRule {
	reg := builtin.Registry()
	var backendBins, managerBins, backendPkgs, managerPkgs []string
	add := func(list *[]string, s string) {
		if !slices.Contains(*list, s) {
			*list = append(*list, s)
		}
	}
	for _, b := range reg.Backends {
		add(&backendBins, "./cmd/"+b.Binary)
		add(&backendPkgs, pkgOf(builtin.Backend(b.Name)))
	}
	for _, m := range reg.Managers {
		add(&managerBins, "./cmd/"+m.Binary)
		add(&managerPkgs, pkgOf(m.New()))
	}
	tree := func(pkgs []string) []string { // go list patterns: each package and those below it
		var out []string
		for _, p := range pkgs {
			out = append(out, "./"+strings.TrimPrefix(p, mod)+"/...")
		}
		return out
	}
	core, builtinPkg, device, model := mod+"core/", mod+"cmd/builtin", mod+"device", mod+"plugins/model"
	cpuDev, kernelSpec := mod+"device/cpu", mod+"device/kernelspec"
	return []layoutRule{
		{
			name: "a backend binary links no engine package and no cache manager",
			pkgs: backendBins,
			deps: true,
			ban:  slices.Concat([]string{core, builtinPkg}, managerPkgs),
		},
		{
			name: "a cache manager binary links no engine package, no device and no backend",
			pkgs: managerBins,
			deps: true,
			ban:  slices.Concat([]string{core, device, builtinPkg}, backendPkgs),
		},
		{
			name: "kvx never links the CUDA driver package, with or without the cuda tag",
			pkgs: []string{"./cmd/kvx"},
			deps: true,
			ban:  []string{"gorgonia.org/cu"},
		},
		{
			name: "kvx never links the CUDA driver package, with or without the cuda tag",
			pkgs: []string{"./cmd/kvx"},
			tags: "cuda",
			deps: true,
			ban:  []string{"gorgonia.org/cu"},
		},
		{
			name: "the engine imports no cache manager, no backend and no device",
			pkgs: []string{"./core/..."},
			ban:  slices.Concat([]string{device, mod + "cmd/"}, managerPkgs, backendPkgs),
		},
		{
			name: "the worker wing and the backends import no engine package and no cache manager",
			pkgs: slices.Concat([]string{"./device/..."}, tree(backendPkgs)),
			ban:  slices.Concat([]string{core, mod + "cmd/"}, managerPkgs),
		},
		{
			name: "the managers import no engine package, no device and no backend",
			pkgs: tree(managerPkgs),
			ban:  slices.Concat([]string{core, device, mod + "cmd/"}, backendPkgs),
		},
		{
			name: "the contract imports nothing of the engine, the managers or the devices",
			pkgs: []string{"./plugins/..."},
			ban:  slices.Concat([]string{core, device, mod + "cmd/"}, managerPkgs, backendPkgs),
		},
		{
			name:  "the worker wing's tests import no engine package either: the model's description is plugins/model's",
			pkgs:  []string{"./device/..."},
			tests: true,
			ban:   []string{core, mod + "cmd/"},
		},
		{
			name:  "the worker wing's tests import no engine package either: the model's description is plugins/model's",
			pkgs:  []string{"./device/..."},
			tags:  "cuda",
			tests: true,
			ban:   []string{core, mod + "cmd/"},
		},
		{
			name:  "the model's description, read by host and worker alike, imports neither of them, tests included",
			pkgs:  []string{"./" + strings.TrimPrefix(model, mod) + "/..."},
			tests: true,
			ban:   slices.Concat([]string{core, device, mod + "cmd/"}, managerPkgs, backendPkgs),
		},
		{
			name: "kvx imports no device, manager or backend: its commands open engines through core/setup with cmd/builtin's registry",
			pkgs: []string{"./cmd/kvx"},
			ban:  slices.Concat([]string{device}, managerPkgs, backendPkgs),
		},
		{
			name: "the cuda device links no package of the cpu device: the kernel specs both run are device/kernelspec's (only cuda's tests compare with cpu's reference kernels)",
			pkgs: []string{"./device/cuda/..."},
			tags: "cuda",
			deps: true,
			ban:  []string{cpuDev},
		},
		{
			name: "the cuda device links no package of the cpu device: the kernel specs both run are device/kernelspec's (only cuda's tests compare with cpu's reference kernels)",
			pkgs: []string{"./device/cuda/..."},
			deps: true,
			ban:  []string{cpuDev},
		},
		{
			name: "what the cpu and cuda devices share (the paged mixers, the kernel specs) imports neither device",
			pkgs: []string{"./device/paged/...", "./" + strings.TrimPrefix(kernelSpec, mod) + "/..."},
			ban:  []string{cpuDev, mod + "device/cuda"},
		},
		{
			name:  "the kernel specs compute nothing and import no other package of the worker wing, tests included",
			pkgs:  []string{"./" + strings.TrimPrefix(kernelSpec, mod) + "/..."},
			tests: true,
			ban:   slices.Concat([]string{core, device, mod + "cmd/"}, managerPkgs, backendPkgs),
			allow: []string{kernelSpec},
		},
	}
}

// pkgOf is the import path of the package that defines v's type.
func pkgOf(v any) string {
	t := reflect.TypeOf(v)
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	return t.PkgPath()
}

// TestLayout checks every rule on the module's code (its test files too
// where a rule says so) and reports every offending import at once.
func TestLayout(t *testing.T) {
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("no go tool on PATH")
	}
	for _, r := range layoutRules() {
		format := `{{.ImportPath}}{{range .Imports}} {{.}}{{end}}`
		if r.tests {
			format += `{{range .TestImports}} {{.}}{{end}}{{range .XTestImports}} {{.}}{{end}}`
		}
		args := []string{"list", "-f", format}
		if r.deps {
			args = []string{"list", "-deps", "-f", "{{.ImportPath}}"}
		}
		if r.tags != "" {
			args = append(args, "-tags", r.tags)
		}
		for _, p := range r.pkgs {
			cmd := exec.Command("go", append(args, p)...)
			cmd.Dir = "../.."
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("go %s %s: %v\n%s", strings.Join(args, " "), p, err, out)
			}
			checked := 0
			for line := range strings.SplitSeq(strings.TrimSpace(string(out)), "\n") {
				f := strings.Fields(line)
				if len(f) == 0 {
					continue
				}
				checked++
				from, imports := p, f
				if !r.deps {
					from, imports = f[0], f[1:]
				}
				for _, imp := range imports {
					if banned(imp, r.ban, r.allow) {
						t.Errorf("%s (tags %q): %s links %s", r.name, r.tags, from, imp)
					}
				}
			}
			if checked == 0 {
				t.Errorf("%s: go list %s listed no package", r.name, p)
			}
		}
	}
}

func banned(imp string, ban, allow []string) bool {
	for _, a := range allow {
		if imp == a {
			return false
		}
	}
	for _, b := range ban {
		if imp == strings.TrimSuffix(b, "/") || strings.HasPrefix(imp, b) {
			return true
		}
	}
	return false
}

// TestBannedMatches pins the prefix rule that TestLayout relies on: a
// banned package matches itself and its subpackages, never a package that
// only shares a name prefix outside a path boundary it names.
func TestBannedMatches(t *testing.T) {
	for _, c := range []struct {
		imp  string
		ban  []string
		want bool
	}{
		{mod + "core/engine", []string{mod + "core/"}, true},
		{mod + "core", []string{mod + "core/"}, true},
		{mod + "device/cpu/kernel", []string{mod + "device"}, true},
		{mod + "plugins/v1/kvcache", []string{mod + "core/", mod + "device"}, false},
		{"gorgonia.org/cu", []string{"gorgonia.org/cu"}, true},
		{"gonum.org/v1/plot", []string{"gorgonia.org/cu"}, false},
	} {
		if got := banned(c.imp, c.ban, nil); got != c.want {
			t.Errorf("banned(%q, %q) = %v, want %v", c.imp, c.ban, got, c.want)
		}
	}
}

// TestLayoutRulesFromRegistry pins what the registry gives the rules: the
// packages of the built-in managers and backends, and their binaries.
func TestLayoutRulesFromRegistry(t *testing.T) {
	rules := layoutRules()
	for _, w := range []string{mod + "cachemgr_v1", mod + "cachemgr_v2", mod + "mamba", mod + "dsa", mod + "dsa/mla", mod + "gqa"} {
		if !slices.Contains(rules[4].ban, w) {
			t.Errorf("the engine's rule bans %v, not %s", rules[4].ban, w)
		}
	}
	if want := []string{"./cmd/kvx-backend-dsa", "./cmd/kvx-backend-mla", "./cmd/kvx-backend-gqa"}; !slices.Equal(rules[0].pkgs, want) {
		t.Errorf("backend binaries %v, want %v", rules[0].pkgs, want)
	}
	if want := []string{"./cmd/kvx-cachemgr-v2", "./cmd/kvx-mamba", "./cmd/kvx-cachemgr-v1"}; !slices.Equal(rules[1].pkgs, want) {
		t.Errorf("manager binaries %v, want %v", rules[1].pkgs, want)
	}
}
