package cuda

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io/fs"
	"maps"
	"os"
	"path"
	"slices"
	"strings"
	"testing"
)

// TestPTXFresh checks that the embedded PTX was made from the kernel sources
// as they are: ptx/SOURCES (written by make ptx) must list the sha256 of
// every .cu, .cuh and .h under kernels/, and nothing else, and every
// kernels/X.cu must have its ptx/X.ptx. It needs no GPU and no nvcc, and
// runs without the cuda tag, so CI catches a kernel edited without make ptx.
func TestPTXFresh(t *testing.T) {
	const fix = "run make ptx (make cuda-nvcc fetches nvcc 11.8) and commit device/cuda/ptx"
	source := func(name string) bool {
		return strings.HasSuffix(name, ".cu") || strings.HasSuffix(name, ".cuh") || strings.HasSuffix(name, ".h")
	}
	have := map[string]string{} // kernels/<file> -> sha256 of its content now
	err := fs.WalkDir(os.DirFS("."), "kernels", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !source(p) {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		sum := sha256.Sum256(b)
		have[p] = hex.EncodeToString(sum[:])
		return nil
	})
	if errors.Is(err, fs.ErrNotExist) || err == nil && len(have) == 0 {
		t.Skip("no kernel sources in device/cuda/kernels yet: nothing to check")
	}
	if err != nil {
		t.Fatal(err)
	}

	b, err := os.ReadFile("ptx/SOURCES")
	if err != nil {
		t.Fatalf("%v: the kernels' PTX has no record of its sources; %s", err, fix)
	}
	recorded := map[string]string{}
	for i, line := range strings.Split(strings.TrimRight(string(b), "\n"), "\n") {
		f := strings.Fields(line)
		if len(f) != 2 || len(f[0]) != 64 {
			t.Fatalf(`ptx/SOURCES line %d: %q is not "<sha256>  kernels/<file>"; %s`, i+1, line, fix)
		}
		recorded[f[1]] = f[0]
	}

	for _, p := range slices.Sorted(maps.Keys(have)) {
		switch sum, ok := recorded[p]; {
		case !ok:
			t.Errorf("%s is not in ptx/SOURCES (a new source); %s", p, fix)
		case sum != have[p]:
			t.Errorf("%s changed since its PTX was made (sha256 %s, ptx/SOURCES has %s); %s", p, have[p][:12], sum[:12], fix)
		}
		if path.Dir(p) == "kernels" && strings.HasSuffix(p, ".cu") { // make ptx compiles kernels/*.cu
			ptx := "ptx/" + strings.TrimSuffix(path.Base(p), ".cu") + ".ptx"
			if _, err := os.Stat(ptx); err != nil {
				t.Errorf("%s has no %s (%v); %s", p, ptx, err, fix)
			}
		}
	}
	for p := range recorded {
		if _, ok := have[p]; !ok {
			t.Errorf("ptx/SOURCES lists %s, which is gone from kernels/; %s", p, fix)
		}
	}
}
