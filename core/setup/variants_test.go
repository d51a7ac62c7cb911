package setup

import (
	"slices"
	"strings"
	"testing"

	"github.com/kvx-dev/kvx/core/config"
	"github.com/kvx-dev/kvx/core/registry/registrytest"
)

// TestVariants: --vary flags expand to their cartesian product; an empty or
// repeated value is refused, naming the flag and the value's place.
func TestVariants(t *testing.T) {
	vs, err := Variants([]string{"cache_manager=v1, v2", "max_num_tokens=32,64"})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, v := range vs {
		names = append(names, v.Name)
	}
	want := []string{"cache_manager=v1 max_num_tokens=32", "cache_manager=v1 max_num_tokens=64",
		"cache_manager=v2 max_num_tokens=32", "cache_manager=v2 max_num_tokens=64"}
	if !slices.Equal(names, want) {
		t.Errorf("Variants = %q, want %q", names, want)
	}
	for _, tc := range []struct{ vary, want string }{
		{"cache_manager=v1,,v2", `--vary "cache_manager=v1,,v2": value 2 of 3 is empty`},
		{"cache_manager=v1,", `value 2 of 2 is empty`},
		{"cache_manager=v1,v2, v1", `value "v1" is given twice (values 1 and 3)`},
		{"=v1,v2", `want key=a,b[,c]`},
	} {
		if _, err := Variants([]string{tc.vary}); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Variants(%q) = %v, want an error containing %q", tc.vary, err, tc.want)
		}
	}
}

// A bad --vary value is reported as --vary's, not --set's.
func TestVaryOrigin(t *testing.T) {
	_, _, err := config.LoadVaried(registrytest.Builtin(), nil, nil, []string{"model=llama-3.1-8b"}, []string{"max_num_tokens=-3"})
	if err == nil || !strings.Contains(err.Error(), "(--vary)") || strings.Contains(err.Error(), "(--set)") {
		t.Errorf("LoadVaried with a bad --vary value: %v, want it named (--vary)", err)
	}
}
