package kvxpb

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// Pinned generator versions: go.mod's (the tool block builds them), as in
// mk/proto.mk; keep the three in sync.
const (
	protocGenGoVersion     = "v1.36.12"
	protocGenGoGRPCVersion = "v1.5.1"
	goModule               = "github.com/kvx-dev/kvx"
)

// TestGeneratedCodeIsFresh regenerates the Go code into a temporary directory
// with the pinned generators and fails when the committed files differ. The
// protoc version line of the header is ignored: it names the compiler that
// ran, not a difference in the code. Without protoc or the pinned generators
// the test skips, except under CI=true where it fails.
func TestGeneratedCodeIsFresh(t *testing.T) {
	missing := func(format string, args ...any) {
		t.Helper()
		if os.Getenv("CI") == "true" {
			t.Fatalf(format, args...)
		}
		t.Skipf(format, args...)
	}
	protoc, err := exec.LookPath("protoc")
	if err != nil {
		missing("protoc not found (Debian: apt-get install -y protobuf-compiler): %v", err)
	}
	root := repoRoot(t)
	genGo := findGenerator(t, root, "protoc-gen-go", protocGenGoVersion)
	genGRPC := findGenerator(t, root, "protoc-gen-go-grpc", protocGenGoGRPCVersion)
	if genGo == "" || genGRPC == "" {
		missing("pinned generators protoc-gen-go %s and protoc-gen-go-grpc %s not found; run `make proto-tools`",
			protocGenGoVersion, protocGenGoGRPCVersion)
	}

	out := t.TempDir()
	// The same command line as the proto target of mk/proto.mk.
	cmd := exec.Command(protoc, "-I", "plugins/proto",
		"--plugin=protoc-gen-go="+genGo,
		"--plugin=protoc-gen-go-grpc="+genGRPC,
		"--go_out="+out, "--go_opt=module="+goModule,
		"--go-grpc_out="+out, "--go-grpc_opt=module="+goModule,
		"plugins/proto/kvx/v1/kvx.proto")
	cmd.Dir = root
	if msg, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%v: %v\n%s", cmd.Args, err, msg)
	}

	genDir := filepath.Join(out, "plugins", "internal", "kvxpb")
	fresh, _ := filepath.Glob(filepath.Join(genDir, "*.pb.go"))
	committed, _ := filepath.Glob("*.pb.go")
	if len(fresh) == 0 {
		t.Fatalf("protoc wrote no *.pb.go under %s", genDir)
	}
	names := map[string]bool{}
	for _, f := range fresh {
		names[filepath.Base(f)] = true
	}
	for _, f := range committed {
		if !names[f] {
			t.Errorf("%s is committed but no longer generated; delete it (make proto)", f)
		}
	}
	for _, f := range fresh {
		name := filepath.Base(f)
		want, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(name)
		if err != nil {
			t.Errorf("%s is generated but not committed; run make proto", name)
			continue
		}
		if line, ok := firstDiff(normalize(got), normalize(want)); ok {
			t.Errorf("%s is stale (first difference at line %d); run make proto", name, line)
		}
	}
}

// normalize drops the header lines naming the protoc version.
func normalize(b []byte) []string {
	var lines []string
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "// \tprotoc ") || strings.HasPrefix(l, "// - protoc ") {
			continue
		}
		lines = append(lines, l)
	}
	return lines
}

// firstDiff returns the 1-based index of the first differing line.
func firstDiff(a, b []string) (int, bool) {
	for i := 0; i < len(a) || i < len(b); i++ {
		if i >= len(a) || i >= len(b) || a[i] != b[i] {
			return i + 1, true
		}
	}
	return 0, false
}

func repoRoot(t *testing.T) string {
	t.Helper()
	// go test runs a package's tests in its directory; runtime.Caller
	// would name no directory under -trimpath (make test's build flags).
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Join(wd, "..", "..", "..")
}

// findGenerator looks for name at the pinned version: first where
// mk/proto.mk installs it, then on PATH, then in $(go env GOPATH)/bin. It
// returns "" when no binary reports the pinned version.
func findGenerator(t *testing.T, root, name, version string) string {
	t.Helper()
	candidates := []string{filepath.Join(root, "bin", "tools", name+"@"+version, name)}
	if p, err := exec.LookPath(name); err == nil {
		candidates = append(candidates, p)
	}
	if gopath, err := exec.Command("go", "env", "GOPATH").Output(); err == nil {
		for _, dir := range filepath.SplitList(strings.TrimSpace(string(gopath))) {
			candidates = append(candidates, filepath.Join(dir, "bin", name))
		}
	}
	for _, c := range candidates {
		out, err := exec.Command(c, "--version").Output()
		if err != nil {
			continue
		}
		fields := strings.Fields(string(bytes.TrimSpace(out)))
		if len(fields) > 0 && strings.TrimPrefix(fields[len(fields)-1], "v") == strings.TrimPrefix(version, "v") {
			abs, err := filepath.Abs(c)
			if err != nil {
				t.Fatal(err)
			}
			return abs
		}
		t.Logf("%s reports %q, want %s", c, bytes.TrimSpace(out), version)
	}
	return ""
}
