package report

import (
	"bytes"
	"fmt"
	"strings"
	"testing"
)

// loadReport is a finished variant whose requests all had TTFT ttft ms
// (so its p95 is ttft); a negative ttft makes a failed variant.
func loadReport(name string, ttft float64) Report {
	r := Report{Variant: name, Status: StatusFinished}
	if ttft < 0 {
		r.Status, r.Error = StatusFailed, "worker died"
		return r
	}
	xs := []float64{ttft, ttft, ttft, ttft}
	r.Latency.Quantiles = NewQuantiles(xs, xs, xs)
	return r
}

// capacitySweep: v1 within 100 ms up to 8 (16 misses); v2 misses at 4 but
// meets again at 8 (its capacity stays 2: every lighter load must meet it);
// v3 misses at its lightest load; v4 fails at 4 (a failed point misses).
func capacitySweep() []Report {
	var rs []Report
	for _, g := range []struct {
		name  string
		ttfts []float64
	}{{"v1", []float64{20, 40, 80, 99, 300}}, {"v2", []float64{20, 50, 150, 90, 400}}, {"v3", []float64{120, 130, 140, 150, 160}}, {"v4", []float64{10, 20, -1, 30, 40}}} {
		for i, load := range []int{1, 2, 4, 8, 16} {
			rs = append(rs, loadReport(fmt.Sprintf("cache_manager=%s workload.concurrency=%d", g.name, load), g.ttfts[i]))
		}
	}
	return rs
}

func TestCapacity(t *testing.T) {
	// The variants in a shuffled order: points are sorted by load.
	rs := capacitySweep()
	rs[0], rs[4] = rs[4], rs[0]
	c, err := NewCapacity(rs, "workload.concurrency", 100)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]float64{"cache_manager=v1": 8, "cache_manager=v2": 2, "cache_manager=v3": -1, "cache_manager=v4": 2}
	if len(c.Groups) != len(want) {
		t.Fatalf("%d groups, want %d", len(c.Groups), len(want))
	}
	for _, g := range c.Groups {
		w, ok := want[g.Name]
		switch {
		case !ok:
			t.Errorf("group %q, want one of %v", g.Name, want)
		case w < 0 && g.Capacity != nil:
			t.Errorf("%s: capacity %v, want none", g.Name, *g.Capacity)
		case w >= 0 && (g.Capacity == nil || *g.Capacity != w):
			t.Errorf("%s: capacity %v, want %v", g.Name, g.Capacity, w)
		}
		for i, p := range g.Points {
			if p.Load != []float64{1, 2, 4, 8, 16}[i] {
				t.Errorf("%s point %d: load %v, want ascending 1..16", g.Name, i, p.Load)
			}
		}
	}
	if p := c.Groups[3].Points[2]; p.TTFTP95Ms != nil || p.Met {
		t.Errorf("the failed variant: p95 %v, met %v; want none and missed", p.TTFTP95Ms, p.Met)
	}

	var buf bytes.Buffer
	if err := WriteCapacity(&buf, c); err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	for _, s := range []string{"p95 TTFT <= 100 ms", "capacity", "300 *", "failed *", "none (the lightest load misses)"} {
		if !strings.Contains(out, s) {
			t.Errorf("the capacity table lacks %q:\n%s", s, out)
		}
	}

	d := NewDocument("kvx test", rs)
	d.Capacity = c
	var js bytes.Buffer
	if err := WriteJSON(&js, d); err != nil {
		t.Fatal(err)
	}
	validate(t, "a compare with a capacity", js.Bytes())
	if !strings.Contains(js.String(), `"capacity": null`) || !strings.Contains(js.String(), `"ttft_p95_ms": null`) {
		t.Errorf("the JSON lacks the null capacity of v3 or the null p95 of v4's failed point")
	}
}

func TestCapacityRefuses(t *testing.T) {
	rs := capacitySweep()
	for _, c := range []struct {
		rs   []Report
		key  string
		slo  float64
		want string
	}{
		{rs, "workload.concurrency", 0, "want a positive number"},
		{rs, "workload.rate", 100, `does not vary workload.rate`},
		{[]Report{loadReport("workload.concurrency=lots", 10)}, "workload.concurrency", 100, `"lots" is not a number`},
	} {
		_, err := NewCapacity(c.rs, c.key, c.slo)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("NewCapacity(%s, %v): %v; want an error with %q", c.key, c.slo, err, c.want)
		}
	}
}

// TestVariantGroup: a variant name splits at a key wherever the key is,
// the other fields keep their order, "all" when none is left, and a key
// is matched whole (device= is not sim_device=).
func TestVariantGroup(t *testing.T) {
	for _, c := range []struct {
		variant, key, group, value string
		found                      bool
	}{
		{"cache_manager=v1 device=sim", "device", "cache_manager=v1", "sim", true},
		{"device=cpu cache_manager=v1 block_size=16", "device", "cache_manager=v1 block_size=16", "cpu", true},
		{"cache_manager=v1 device=cuda block_size=16", "device", "cache_manager=v1 block_size=16", "cuda", true},
		{"device=sim", "device", "all", "sim", true},
		{"sim_device=x cache_manager=v2", "device", "sim_device=x cache_manager=v2", "", false},
		{"", "workload.concurrency", "all", "", false},
	} {
		group, value, found := variantGroup(c.variant, c.key)
		if group != c.group || value != c.value || found != c.found {
			t.Errorf("variantGroup(%q, %q) = %q, %q, %v; want %q, %q, %v", c.variant, c.key, group, value, found, c.group, c.value, c.found)
		}
	}
}
