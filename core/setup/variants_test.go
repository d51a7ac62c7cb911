package setup

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/kvx-dev/kvx/core/config"
	"github.com/kvx-dev/kvx/core/registry/registrytest"
	"github.com/kvx-dev/kvx/core/workload"
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

// TestPrepareAll: every variant is loaded, resolved and checked before any
// runs; the problems of all of them come back at once, each named after
// its variant; variants with one workload share its requests.
func TestPrepareAll(t *testing.T) {
	vs, err := Variants([]string{"cache_manager=v1,v2,/nonexistent/kvx-x", "max_num_tokens=256,-3"})
	if err != nil {
		t.Fatal(err)
	}
	base := []string{"model=llama-3.1-8b", "isolation=inprocess", "workload.requests=2", "workload.prompt_tokens=100", "workload.output_tokens=10"}
	load := func(sets []string) (*config.Config, error) {
		cfg, _, err := config.LoadVaried(registrytest.Builtin(), nil, nil, base, sets)
		return cfg, err
	}
	var checked []string
	ps, err := PrepareAll(vs, registrytest.Builtin(), load, func(p *Prepared) error {
		checked = append(checked, p.Spec.Variant)
		return nil
	})
	msg := fmt.Sprint(err)
	for _, want := range []string{"variant cache_manager=v1 max_num_tokens=-3: ", "variant cache_manager=/nonexistent/kvx-x max_num_tokens=256: cache_manager"} {
		if !strings.Contains(msg, want) {
			t.Errorf("PrepareAll: %v\nwant it to name %q", err, want)
		}
	}
	if want := []string{"cache_manager=v1 max_num_tokens=256", "cache_manager=v2 max_num_tokens=256"}; !slices.Equal(checked, want) {
		t.Errorf("checked %q, want %q", checked, want)
	}
	if len(ps) != 2 || len(ps[0].Spec.Workload.Requests) != 2 || &ps[0].Spec.Workload.Requests[0] != &ps[1].Spec.Workload.Requests[0] {
		t.Errorf("PrepareAll = %d prepared; want 2 sharing one workload of 2 requests", len(ps))
	}
	run, err := PrepareAll([]Variant{{}}, registrytest.Builtin(), load, nil)
	if err != nil || len(run) != 1 || run[0].Spec.Variant != "v2" {
		t.Errorf("PrepareAll of the base alone: %v, %v; want one variant named after its cache manager", run, err)
	}
}

// TestExplainIDs: ids of the workload, repeatable and comma lists, each
// once; a bad value names itself and the workload's range, all at once.
func TestExplainIDs(t *testing.T) {
	wl := workload.Workload{Requests: []workload.Request{{ID: 4}, {ID: 2}, {ID: 9}}}
	ids, err := ExplainIDs([]string{"9", " 2,9 ", "4"}, wl)
	if err != nil || !slices.Equal(ids, []uint64{9, 2, 4}) {
		t.Errorf("ExplainIDs = %v, %v; want [9 2 4]", ids, err)
	}
	_, err = ExplainIDs([]string{"x,5"}, wl)
	for _, w := range []string{`--explain "x": not a request id (a number): the workload's 3 requests have ids 2..9`, "--explain 5: no such request"} {
		if err == nil || !strings.Contains(err.Error(), w) {
			t.Errorf("ExplainIDs(x,5) = %v, want %q", err, w)
		}
	}
	if _, err := ExplainIDs([]string{"0"}, workload.Workload{}); err == nil || !strings.Contains(err.Error(), "the workload has no requests") {
		t.Errorf("ExplainIDs on an empty workload = %v", err)
	}
	if ids, err := ExplainIDs(nil, wl); ids != nil || err != nil {
		t.Errorf("ExplainIDs(nil) = %v, %v", ids, err)
	}
}
