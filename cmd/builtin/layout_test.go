package builtin_test

import (
	"os/exec"
	"strings"
	"testing"
)

const mod = "github.com/kvx-dev/kvx/"

// The layout's rules (DESIGN §7), checked on what each package and binary
// really links: the engine and the worker wing are two programs that meet
// only through plugins/, and only the cuda worker may link the CUDA driver
// package, whose init exits on a machine without a GPU.
var layoutRules = []struct {
	name  string
	pkgs  []string // patterns for go list
	tags  string   // build tags
	deps  bool     // all transitive dependencies, not only the packages' own imports
	ban   []string // import path prefixes that must not appear
	allow []string // exceptions to ban (exact paths)
}{
	{
		name: "a backend binary links no engine package and no cache manager",
		pkgs: []string{"./cmd/kvx-backend-dsa", "./cmd/kvx-backend-mla", "./cmd/kvx-backend-gqa"},
		deps: true,
		ban:  []string{mod + "core/", mod + "cachemgr_v1", mod + "cachemgr_v2", mod + "mamba", mod + "cmd/builtin"},
	},
	{
		name: "a cache manager binary links no engine package, no device and no backend",
		pkgs: []string{"./cmd/kvx-cachemgr-v1", "./cmd/kvx-cachemgr-v2", "./cmd/kvx-mamba"},
		deps: true,
		ban:  []string{mod + "core/", mod + "device", mod + "dsa", mod + "gqa", mod + "cmd/builtin"},
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
		ban:  []string{mod + "cachemgr_v1", mod + "cachemgr_v2", mod + "mamba", mod + "device", mod + "dsa", mod + "gqa", mod + "cmd/"},
	},
	{
		name: "the worker wing and the backends import no engine package and no cache manager",
		pkgs: []string{"./device/...", "./dsa/...", "./gqa/..."},
		ban:  []string{mod + "core/", mod + "cachemgr_v1", mod + "cachemgr_v2", mod + "mamba", mod + "cmd/"},
	},
	{
		name: "the managers import no engine package, no device and no backend",
		pkgs: []string{"./cachemgr_v1/...", "./cachemgr_v2/...", "./mamba/..."},
		ban:  []string{mod + "core/", mod + "device", mod + "dsa", mod + "gqa", mod + "cmd/"},
	},
	{
		name: "the contract imports nothing of the engine, the managers or the devices",
		pkgs: []string{"./plugins/..."},
		ban:  []string{mod + "core/", mod + "cachemgr_v1", mod + "cachemgr_v2", mod + "mamba", mod + "device", mod + "dsa", mod + "gqa", mod + "cmd/"},
	},
}

// TestLayout checks every rule on the module's non-test code and reports
// every offending import at once.
func TestLayout(t *testing.T) {
	if _, err := exec.LookPath("go"); err != nil {
		t.Skip("no go tool on PATH")
	}
	for _, r := range layoutRules {
		format := `{{.ImportPath}}{{range .Imports}} {{.}}{{end}}`
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
