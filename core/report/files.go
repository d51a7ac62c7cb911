package report

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
)

// CheckOutputs is the pre-flight of a command's --json and --html paths
// ("" for none, "-" for standard output): not both on standard output, and
// each writable (CheckWritable). Every problem comes back, each naming its
// flag and path; nothing is written.
func CheckOutputs(jsonOut, htmlOut string) []error {
	var errs []error
	if jsonOut == "-" && htmlOut == "-" {
		errs = append(errs, errors.New("--json - and --html - both write to stdout; give one of them a file"))
	}
	for _, out := range []struct{ flag, path string }{{"--json", jsonOut}, {"--html", htmlOut}} {
		if err := CheckWritable(out.path); err != nil {
			errs = append(errs, fmt.Errorf("%s %s: %w", out.flag, out.path, err))
		}
	}
	return errs
}

// CheckWritable reports why path ("" for none, "-" for stdout) cannot be
// written, without truncating or leaving anything behind: an existing file
// is opened for writing, else a file is created and removed in its
// directory.
func CheckWritable(path string) error {
	if path == "" || path == "-" {
		return nil
	}
	if fi, err := os.Stat(path); err == nil {
		if fi.IsDir() {
			return errors.New("is a directory")
		}
		f, err := os.OpenFile(path, os.O_WRONLY, 0)
		if err != nil {
			return err
		}
		return f.Close()
	}
	f, err := os.CreateTemp(filepath.Dir(path), ".kvx-check-*")
	if err != nil {
		return fmt.Errorf("cannot create files in %s: %w", filepath.Dir(path), errors.Unwrap(err))
	}
	f.Close()
	return os.Remove(f.Name())
}

// WriteFiles writes d as JSON to jsonOut and as the HTML page to htmlOut
// (either "" for none, "-" for standard output).
func WriteFiles(d Document, jsonOut, htmlOut string) error {
	if jsonOut != "" {
		if err := WriteFile(jsonOut, func(w io.Writer) error { return WriteJSON(w, d) }); err != nil {
			return err
		}
	}
	if htmlOut != "" {
		if err := WriteFile(htmlOut, func(w io.Writer) error { return WriteHTML(w, d) }); err != nil {
			return err
		}
	}
	return nil
}

// WriteFile creates path ("-" for standard output) and writes it with
// write; a write or close error comes back.
func WriteFile(path string, write func(io.Writer) error) error {
	if path == "-" {
		return write(os.Stdout)
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := write(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
