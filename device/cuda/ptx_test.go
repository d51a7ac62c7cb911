package cuda

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io/fs"
	"maps"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestPTXFresh checks that the embedded PTX was made from the kernel sources
// as they are: ptx/SOURCES (written by make ptx) must list the sha256 of
// every .cu, .cuh and .h under kernels/, and nothing else, and every
// kernels/X.cu must have its ptx/X.ptx; likewise ptx/sm90a/SOURCES (make
// ptx-sm90a, on a machine with nvcc 12 or later) for sm90a/ and the headers
// of kernels/. It needs no GPU and no nvcc, and runs without the cuda tag,
// so CI catches a kernel edited without its PTX made again.
func TestPTXFresh(t *testing.T) {
	t.Run("kernels", func(t *testing.T) {
		checkPTX(t, "ptx", "kernels",
			"run make ptx (make cuda-nvcc fetches nvcc 11.8) and commit device/cuda/ptx")
	})
	t.Run("sm90a", func(t *testing.T) {
		checkPTX(t, "ptx/sm90a", "sm90a",
			"run make ptx-sm90a (nvcc 12 or later: on a GPU machine, bash scripts/ptx-sm90a.sh) and commit device/cuda/ptx/sm90a")
	})
}

// checkPTX checks ptxDir/SOURCES against the sources now: every .cu, .cuh
// and .h under dir, plus the headers directly in kernels/ when dir is not
// kernels, and every dir/X.cu's ptxDir/X.ptx.
func checkPTX(t *testing.T, ptxDir, dir, fix string) {
	source := func(name string) bool {
		return strings.HasSuffix(name, ".cu") || strings.HasSuffix(name, ".cuh") || strings.HasSuffix(name, ".h")
	}
	have := map[string]string{} // <file> -> sha256 of its content now
	add := func(p string) error {
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		sum := sha256.Sum256(b)
		have[p] = hex.EncodeToString(sum[:])
		return nil
	}
	err := fs.WalkDir(os.DirFS("."), dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !source(p) {
			return err
		}
		return add(p)
	})
	if errors.Is(err, fs.ErrNotExist) || err == nil && len(have) == 0 {
		t.Skipf("no kernel sources in device/cuda/%s yet: nothing to check", dir)
	}
	if err != nil {
		t.Fatal(err)
	}
	if dir != "kernels" { // the shared headers it may include
		headers, err := filepath.Glob("kernels/*.cuh")
		if err != nil {
			t.Fatal(err)
		}
		for _, h := range headers {
			if err := add(h); err != nil {
				t.Fatal(err)
			}
		}
	}

	b, err := os.ReadFile(ptxDir + "/SOURCES")
	if err != nil {
		t.Fatalf("%v: the PTX has no record of its sources; %s", err, fix)
	}
	recorded := map[string]string{}
	for i, line := range strings.Split(strings.TrimRight(string(b), "\n"), "\n") {
		f := strings.Fields(line)
		if len(f) != 2 || len(f[0]) != 64 {
			t.Fatalf(`%s/SOURCES line %d: %q is not "<sha256>  <file>"; %s`, ptxDir, i+1, line, fix)
		}
		recorded[f[1]] = f[0]
	}

	for _, p := range slices.Sorted(maps.Keys(have)) {
		switch sum, ok := recorded[p]; {
		case !ok:
			t.Errorf("%s is not in %s/SOURCES (a new source); %s", p, ptxDir, fix)
		case sum != have[p]:
			t.Errorf("%s changed since its PTX was made (sha256 %s, %s/SOURCES has %s); %s", p, have[p][:12], ptxDir, sum[:12], fix)
		}
		if path.Dir(p) == dir && strings.HasSuffix(p, ".cu") { // the compiled sources
			ptx := ptxDir + "/" + strings.TrimSuffix(path.Base(p), ".cu") + ".ptx"
			if _, err := os.Stat(ptx); err != nil {
				t.Errorf("%s has no %s (%v); %s", p, ptx, err, fix)
			}
		}
	}
	for p := range recorded {
		if _, ok := have[p]; !ok {
			t.Errorf("%s/SOURCES lists %s, which is gone; %s", ptxDir, p, fix)
		}
	}
}
