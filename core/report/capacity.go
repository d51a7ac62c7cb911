package report

import (
	"cmp"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
)

// Capacity is a compare's capacity KPI (LMCache's headline figure): the
// most load a configuration keeps within a latency SLO. The variants that
// differ only in the load key (workload.concurrency, or any key --vary
// sweeps) form a group, and a group's capacity is the largest load whose
// p95 TTFT is within the SLO with every lighter load of the group within it
// too.
type Capacity struct {
	LoadKey string          `json:"load_key"`
	SLOMs   float64         `json:"slo_ttft_p95_ms"`
	Groups  []CapacityGroup `json:"groups"`
}

// CapacityGroup is one configuration swept over the load key.
type CapacityGroup struct {
	// Name is the group's other --vary values ("cache_manager=v1"), or
	// "all" when the load key is the only one varied.
	Name   string          `json:"name"`
	Points []CapacityPoint `json:"points"` // ascending load
	// Capacity is the largest load of the group kept within the SLO; null
	// when its lightest load misses it.
	Capacity *float64 `json:"capacity"`
}

// CapacityPoint is one variant of a group.
type CapacityPoint struct {
	Load    float64 `json:"load"`
	Variant string  `json:"variant"`
	// TTFTP95Ms is null when no request finished (or the variant failed):
	// such a point misses the SLO.
	TTFTP95Ms *float64 `json:"ttft_p95_ms"`
	Met       bool     `json:"met"`
}

// variantGroup splits a compare's variant name, its --vary values
// "key=value ..." (setup.Variants), at key: group is the other fields in
// order ("all" when there are none), the name of the variant's group in a
// Capacity or a SimPair; value is key's; found is false when the name does
// not set key.
func variantGroup(variant, key string) (group, value string, found bool) {
	var rest []string
	for _, f := range strings.Fields(variant) {
		if v, ok := strings.CutPrefix(f, key+"="); ok {
			value, found = v, true
			continue
		}
		rest = append(rest, f)
	}
	if len(rest) == 0 {
		return "all", value, found
	}
	return strings.Join(rest, " "), value, found
}

// NewCapacity groups rs (a compare's variants, named by their --vary
// values "key=value ...") by every value but loadKey's, and finds each
// group's capacity within a p95 TTFT of sloMs. Every variant must vary
// loadKey with a number; the error names the first that does not.
func NewCapacity(rs []Report, loadKey string, sloMs float64) (*Capacity, error) {
	if !(sloMs > 0) {
		return nil, fmt.Errorf("capacity: the p95 TTFT SLO is %v ms; want a positive number of milliseconds", sloMs)
	}
	c := &Capacity{LoadKey: loadKey, SLOMs: sloMs}
	for _, r := range rs {
		name, v, found := variantGroup(r.Variant, loadKey)
		if !found {
			return nil, fmt.Errorf("capacity: variant %q does not vary %s: sweep it with --vary %s=a,b,c", r.Variant, loadKey, loadKey)
		}
		load, err := strconv.ParseFloat(v, 64)
		if err != nil {
			return nil, fmt.Errorf("capacity: variant %q: %s=%q is not a number", r.Variant, loadKey, v)
		}
		i := slices.IndexFunc(c.Groups, func(g CapacityGroup) bool { return g.Name == name })
		if i < 0 {
			c.Groups = append(c.Groups, CapacityGroup{Name: name})
			i = len(c.Groups) - 1
		}
		p := CapacityPoint{Load: load, Variant: r.Variant}
		if q := r.Latency.Quantiles; r.Status != StatusFailed && r.Error == "" && q != nil {
			if j := slices.Index(q.P, 95); j >= 0 && j < len(q.TTFTMs) {
				v := q.TTFTMs[j]
				p.TTFTP95Ms, p.Met = &v, v <= sloMs
			}
		}
		c.Groups[i].Points = append(c.Groups[i].Points, p)
	}
	for i := range c.Groups {
		g := &c.Groups[i]
		slices.SortStableFunc(g.Points, func(a, b CapacityPoint) int { return cmp.Compare(a.Load, b.Load) })
		for _, p := range g.Points {
			if !p.Met {
				break
			}
			l := p.Load
			g.Capacity = &l
		}
	}
	return c, nil
}

// WriteCapacity prints c as a table: a row per group, its p95 TTFT at each
// load (a * where it misses the SLO) and its capacity.
func WriteCapacity(w io.Writer, c *Capacity) error {
	var loads []float64
	for _, g := range c.Groups {
		for _, p := range g.Points {
			if !slices.Contains(loads, p.Load) {
				loads = append(loads, p.Load)
			}
		}
	}
	slices.Sort(loads)
	fmt.Fprintf(w, "\ncapacity: the most %s kept at p95 TTFT <= %s ms (p95 TTFT in ms at each; * misses the SLO)\n", c.LoadKey, num(c.SLOMs))
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "group\t")
	for _, l := range loads {
		fmt.Fprintf(tw, "%s\t", num(l))
	}
	fmt.Fprintf(tw, "capacity\n")
	for _, g := range c.Groups {
		fmt.Fprintf(tw, "%s\t", g.Name)
		for _, l := range loads {
			cell := "-"
			if i := slices.IndexFunc(g.Points, func(p CapacityPoint) bool { return p.Load == l }); i >= 0 {
				p := g.Points[i]
				cell = "failed"
				if p.TTFTP95Ms != nil {
					cell = num(*p.TTFTP95Ms)
				}
				if !p.Met {
					cell += " *"
				}
			}
			fmt.Fprintf(tw, "%s\t", cell)
		}
		capCell := "none (the lightest load misses)"
		if g.Capacity != nil {
			capCell = num(*g.Capacity)
		}
		fmt.Fprintf(tw, "%s\n", capCell)
	}
	return tw.Flush()
}

// num prints a load or a latency briefly: integers as such, others to 3
// significant digits.
func num(v float64) string {
	if v == float64(int64(v)) {
		return strconv.FormatInt(int64(v), 10)
	}
	return strconv.FormatFloat(v, 'g', 3, 64)
}
