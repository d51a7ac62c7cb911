package report

import (
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestCheckOutputs: not both on stdout, a directory or a missing directory
// is refused naming the flag and the path, and checking leaves nothing
// behind (an existing file keeps its bytes).
func TestCheckOutputs(t *testing.T) {
	dir := t.TempDir()
	kept := filepath.Join(dir, "kept.json")
	if err := os.WriteFile(kept, []byte("old"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		json, html string
		want       []string // one substring per error, in order
	}{
		{"", "", nil},
		{"-", "", nil},
		{kept, filepath.Join(dir, "new.html"), nil},
		{"-", "-", []string{"--json - and --html - both write to stdout"}},
		{dir, "", []string{"--json " + dir + ": is a directory"}},
		{"", filepath.Join(dir, "no", "x.html"), []string{"--html " + filepath.Join(dir, "no", "x.html") + ": cannot create files in"}},
	} {
		errs := CheckOutputs(c.json, c.html)
		if len(errs) != len(c.want) {
			t.Errorf("CheckOutputs(%q, %q) = %v, want %d errors", c.json, c.html, errs, len(c.want))
			continue
		}
		for i, w := range c.want {
			if !strings.Contains(errs[i].Error(), w) {
				t.Errorf("CheckOutputs(%q, %q)[%d] = %v, want %q", c.json, c.html, i, errs[i], w)
			}
		}
	}
	if b, _ := os.ReadFile(kept); string(b) != "old" {
		t.Errorf("checking %s changed it to %q", kept, b)
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 1 {
		t.Errorf("checking left %d entries in %s, want only kept.json", len(ents), dir)
	}
}

// TestWriteFile: the file holds what write wrote; write's error comes back.
func TestWriteFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "out.txt")
	if err := WriteFile(path, func(w io.Writer) error { _, err := io.WriteString(w, "doc"); return err }); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(path); string(b) != "doc" {
		t.Errorf("%s holds %q, want doc", path, b)
	}
	want := io.ErrShortWrite
	if err := WriteFile(path, func(io.Writer) error { return want }); err != want {
		t.Errorf("WriteFile with a failing write = %v, want %v", err, want)
	}
}
