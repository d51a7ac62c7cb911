package cuda

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestPTXEntriesUnique checks that no two embedded PTX modules define a
// kernel of the same name: the device looks kernels up by name across all
// modules and refuses to start on a duplicate. Like TestPTXFresh it needs no
// GPU and runs without the cuda tag, so CI catches the clash.
func TestPTXEntriesUnique(t *testing.T) {
	files, err := filepath.Glob("ptx/*.ptx")
	if err != nil {
		t.Fatal(err)
	}
	sm90a, err := filepath.Glob("ptx/sm90a/*.ptx") // loaded beside them on compute capability 9.0
	if err != nil {
		t.Fatal(err)
	}
	files = append(files, sm90a...)
	if len(files) == 0 {
		t.Skip("no embedded PTX yet")
	}
	where := map[string]string{}
	for _, f := range files {
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(string(src), "\n") {
			rest, ok := strings.CutPrefix(strings.TrimSpace(line), ".visible .entry ")
			if !ok {
				continue
			}
			name, _, _ := strings.Cut(rest, "(")
			if prev, dup := where[name]; dup {
				t.Errorf("kernel %s is defined in %s and in %s", name, prev, f)
			}
			where[name] = f
		}
	}
}
