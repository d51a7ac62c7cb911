package setup

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/kvx-dev/kvx/core/config"
	"github.com/kvx-dev/kvx/core/registry"
	"github.com/kvx-dev/kvx/core/workload"
)

// DefaultVary is what kvx compare varies without --vary: the cache
// managers.
const DefaultVary = "cache_manager=v1,v2"

// Variant is one configuration of a comparison: the base plus some sets
// (key=value, as --vary gives them).
type Variant struct {
	// Name is its sets joined by spaces; "" for a run of the base alone,
	// which PrepareAll names after its cache manager.
	Name string
	Sets []string
}

// Variants expands --vary values (key=a,b[,c]) into their cartesian
// product, in order; none varies DefaultVary. An empty or repeated value is
// refused, naming the flag and the value's place.
func Variants(varies []string) ([]Variant, error) {
	if len(varies) == 0 {
		varies = []string{DefaultVary}
	}
	out := []Variant{{}}
	for _, v := range varies {
		key, vals, ok := strings.Cut(v, "=")
		key = strings.TrimSpace(key)
		if !ok || key == "" || vals == "" {
			return nil, fmt.Errorf("--vary %q: want key=a,b[,c]", v)
		}
		values := strings.Split(vals, ",")
		for i, val := range values {
			val = strings.TrimSpace(val)
			if val == "" {
				return nil, fmt.Errorf("--vary %q: value %d of %d is empty", v, i+1, len(values))
			}
			if j := slices.IndexFunc(values[:i], func(w string) bool { return strings.TrimSpace(w) == val }); j >= 0 {
				return nil, fmt.Errorf("--vary %q: value %q is given twice (values %d and %d)", v, val, j+1, i+1)
			}
			values[i] = val
		}
		var next []Variant
		for _, base := range out {
			for _, val := range values {
				nv := Variant{Sets: append(slices.Clone(base.Sets), key+"="+val)}
				nv.Name = strings.TrimPrefix(base.Name+" "+key+"="+val, " ")
				next = append(next, nv)
			}
		}
		out = next
	}
	return out, nil
}

// PrepareAll prepares every variant before any runs (kvx run and compare's
// pre-flight): load(v.Sets) loads its configuration, Prepare resolves it
// and checks its plugins, its workload is loaded (variants with the same
// workload share one copy of its requests), and check, when not nil, checks
// the prepared variant further. The problems of every variant are joined,
// each named "variant NAME: " when there are several. A Prepared's Spec
// carries its workload and, as Variant, its name.
func PrepareAll(vs []Variant, reg *registry.Registry, load func(sets []string) (*config.Config, error), check func(*Prepared) error) ([]*Prepared, error) {
	var errs []error
	fail := func(v Variant, err error) {
		if len(vs) > 1 {
			err = fmt.Errorf("variant %s: %w", v.Name, err)
		}
		errs = append(errs, err)
	}
	workloads := map[string]workload.Workload{}
	var ps []*Prepared
	for _, v := range vs {
		cfg, err := load(v.Sets)
		if err != nil {
			fail(v, err)
			continue
		}
		name := v.Name
		if name == "" {
			name = cfg.CacheManager
		}
		p, err := Prepare(cfg, name, reg)
		if err != nil {
			fail(v, err)
			continue
		}
		key := fmt.Sprintf("%+v vocab %d max_seq_len %d", cfg.Workload, p.Model.Vocab, cfg.MaxSeqLen)
		wl, ok := workloads[key]
		if !ok {
			if wl, err = Workload(cfg, p.Model.Vocab); err != nil {
				fail(v, err)
				continue
			}
			workloads[key] = wl
		}
		p.Spec.Workload = wl
		if check != nil {
			if err := check(p); err != nil {
				fail(v, err)
				continue
			}
		}
		ps = append(ps, p)
	}
	return ps, errors.Join(errs...)
}

// ExplainIDs parses --explain values (request ids, repeatable or comma
// lists) into request ids of wl, without repeats; a value that is not a
// number or not a request of wl is an error naming it and the range of
// ids, all of them joined.
func ExplainIDs(vals []string, wl workload.Workload) ([]uint64, error) {
	var ids []uint64
	if len(vals) == 0 {
		return nil, nil
	}
	known := make(map[uint64]bool, len(wl.Requests))
	var lo, hi uint64
	for i, r := range wl.Requests {
		known[r.ID] = true
		if i == 0 || r.ID < lo {
			lo = r.ID
		}
		hi = max(hi, r.ID)
	}
	span := "the workload has no requests"
	if len(wl.Requests) > 0 {
		span = fmt.Sprintf("the workload's %d requests have ids %d..%d", len(wl.Requests), lo, hi)
	}
	var errs []error
	for _, v := range vals {
		for _, f := range strings.Split(v, ",") {
			f = strings.TrimSpace(f)
			id, err := strconv.ParseUint(f, 10, 64)
			switch {
			case err != nil:
				errs = append(errs, fmt.Errorf("--explain %q: not a request id (a number): %s", f, span))
			case !known[id]:
				errs = append(errs, fmt.Errorf("--explain %d: no such request: %s", id, span))
			case !slices.Contains(ids, id):
				ids = append(ids, id)
			}
		}
	}
	return ids, errors.Join(errs...)
}
