package cuda

import (
	"errors"
	"fmt"
	"strings"
	"testing"
)

// TestParseFault: CUDA_KVX_FAULT's forms, and bad values refused naming
// the variable, the value and what is wanted.
func TestParseFault(t *testing.T) {
	for _, c := range []struct {
		in   string
		want *fault
		err  string
	}{
		{"", nil, ""},
		{"illegal:5", &fault{kind: "illegal", forward: 5}, ""},
		{"oom:1:/tmp/x:y", &fault{kind: "oom", forward: 1, once: "/tmp/x:y"}, ""},
		{"illegal", nil, "want KIND:N[:FILE]"},
		{"segv:3", nil, `kind "segv": want illegal or oom`},
		{"oom:0", nil, `forward "0": want an integer >= 1`},
		{"oom:x", nil, `forward "x": want an integer >= 1`},
	} {
		got, err := parseFault(c.in)
		switch {
		case c.err != "":
			if err == nil || !strings.Contains(err.Error(), c.err) || !strings.Contains(err.Error(), faultEnv) {
				t.Errorf("parseFault(%q) = %v, %v: want an error naming %s and containing %q", c.in, got, err, faultEnv, c.err)
			}
		case err != nil:
			t.Errorf("parseFault(%q): %v", c.in, err)
		case (got == nil) != (c.want == nil) || (got != nil && *got != *c.want):
			t.Errorf("parseFault(%q) = %+v, want %+v", c.in, got, c.want)
		}
	}
}

// TestLostContext: the CUresults after which the worker exits, wrapped as
// kvx's calls wrap them or as gorgonia.org/cu prints them, against errors
// that stay errors of the call.
func TestLostContext(t *testing.T) {
	for _, c := range []struct {
		err  error
		lost bool
	}{
		{fmt.Errorf("cuda: launch kvx_add: %w", &resultError{code: 700, name: "CUDA_ERROR_ILLEGAL_ADDRESS"}), true},
		{fmt.Errorf("cuda: sync: %w", &resultError{code: 719}), true},
		{&resultError{code: 2, name: "CUDA_ERROR_OUT_OF_MEMORY"}, true},
		{errors.New("cuda: allocate 4611686018427387904 bytes of device memory: OutOfMemory"), true},
		{errors.New("cuda: IllegalAddress"), true},
		{fmt.Errorf("cuda: launch: %w", &resultError{code: 1, name: "CUDA_ERROR_INVALID_VALUE"}), false},
		{errors.New("hf: sequence 3: token 999 outside the vocabulary [0, 256)"), false},
		{nil, false},
	} {
		if got := lostContext(c.err) != ""; got != c.lost {
			t.Errorf("lostContext(%v) = %q, want lost %v", c.err, lostContext(c.err), c.lost)
		}
	}
}
