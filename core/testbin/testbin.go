// Package testbin builds kvx and its plugin binaries for tests that run
// them as processes (the kvx command's tests, isolation: plugin runs).
package testbin

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
)

// Main is a TestMain: it builds the binaries into a temporary directory,
// stores it in *dir, runs the tests, removes the directory and exits.
func Main(m *testing.M, dir *string) {
	d, err := Build()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	*dir = d
	code := m.Run()
	os.RemoveAll(d)
	os.Exit(code)
}

// Build compiles every command of the module (./cmd/...) into a fresh
// temporary directory and returns it; the caller removes it. It runs the go
// tool found on PATH, from the module's root.
func Build() (string, error) {
	root, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}").Output()
	if err != nil {
		return "", fmt.Errorf("finding the module root: %w", err)
	}
	dir, err := os.MkdirTemp("", "kvx-bin-")
	if err != nil {
		return "", err
	}
	build := exec.Command("go", "build", "-o", dir+string(os.PathSeparator), "./cmd/...")
	build.Dir = strings.TrimSpace(string(root))
	if out, err := build.CombinedOutput(); err != nil {
		os.RemoveAll(dir)
		return "", fmt.Errorf("building the binaries: %v\n%s", err, out)
	}
	return dir, nil
}
