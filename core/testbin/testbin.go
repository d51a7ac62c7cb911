// Package testbin builds kvx and its plugin binaries for tests that run
// them as processes (the kvx command's tests, isolation: plugin runs).
package testbin

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// PrebuiltEnv names a directory that already holds every command of the
// module, built from this tree (make test sets it to bin/ right after
// make build); Build then links those binaries into its directory instead
// of building them again. It is not a KVX_* name: kvx reads every KVX_*
// variable as a config key, and the tests' kvx processes inherit it.
const PrebuiltEnv = "KVXTEST_BIN_DIR"

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

// Build puts every command of the module (./cmd/...) into a fresh
// temporary directory and returns it; the caller removes it. The directory
// holds those binaries and nothing else (tests use it as a plugin
// directory). With $KVXTEST_BIN_DIR set they are hard links to (or copies
// of) the binaries there, and a command missing there is an error;
// otherwise they are compiled with the go tool found on PATH, from the
// module's root.
func Build() (string, error) {
	root, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}").Output()
	if err != nil {
		return "", fmt.Errorf("finding the module root: %w", err)
	}
	dir, err := os.MkdirTemp("", "kvx-bin-")
	if err != nil {
		return "", err
	}
	if pre := os.Getenv(PrebuiltEnv); pre != "" {
		err = linkPrebuilt(strings.TrimSpace(string(root)), pre, dir)
	} else {
		build := exec.Command("go", "build", "-o", dir+string(os.PathSeparator), "./cmd/...")
		build.Dir = strings.TrimSpace(string(root))
		if out, berr := build.CombinedOutput(); berr != nil {
			err = fmt.Errorf("building the binaries: %v\n%s", berr, out)
		}
	}
	if err != nil {
		os.RemoveAll(dir)
		return "", err
	}
	return dir, nil
}

// linkPrebuilt links the binary of every main package under root/cmd from
// pre into dir.
func linkPrebuilt(root, pre, dir string) error {
	list := exec.Command("go", "list", "-f", `{{if eq .Name "main"}}{{.ImportPath}}{{end}}`, "./cmd/...")
	list.Dir = root
	out, err := list.Output()
	if err != nil {
		return fmt.Errorf("listing the commands: %w", err)
	}
	names := strings.Fields(string(out))
	if len(names) == 0 {
		return errors.New("listing the commands: go list found no main package under ./cmd")
	}
	for _, p := range names {
		name := p[strings.LastIndexByte(p, '/')+1:]
		if err := linkOrCopy(filepath.Join(pre, name), filepath.Join(dir, name)); err != nil {
			return fmt.Errorf("%s=%s: %w (run make build, or unset it to build here)", PrebuiltEnv, pre, err)
		}
	}
	return nil
}

func linkOrCopy(src, dst string) error {
	if err := os.Link(src, dst); err == nil {
		return nil
	}
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o755)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}
