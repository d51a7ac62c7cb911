//go:build cuda && cgo

package cuda

import (
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	"gorgonia.org/cu"
)

// profileEnv names the file where a worker writes its kernel profile.
// With CUDA_KVX_PROFILE=/path set (kvx passes CUDA_* variables on to its
// plugins; KVX_* ones are its own config keys), every launch is bracketed
// by two CUDA events, and each Forward adds its kernels' GPU times, its GPU
// span (first kernel's start to last kernel's end) and its wall time to
// totals written there every 8 steps and at Close. Nsight Systems does the
// same with less overhead where it is installed; this needs only the
// driver. The events cost about a microsecond of host time a launch, so
// wall times read a little high.
const profileEnv = "CUDA_KVX_PROFILE"

// kernelProf is one context's profile.
type kernelProf struct {
	path    string
	free    []cu.Event
	pending []profMark
	start   time.Time
	steps   int
	wall    time.Duration
	span    float64 // ms
	kernels map[string]*profStat
}

type profMark struct {
	name       string
	start, end cu.Event
}

type profStat struct {
	launches int
	ms       float64
}

func newKernelProf() *kernelProf {
	p := os.Getenv(profileEnv)
	if p == "" {
		return nil
	}
	return &kernelProf{path: p, kernels: map[string]*profStat{}}
}

func (p *kernelProf) event() (cu.Event, error) {
	if n := len(p.free); n > 0 {
		e := p.free[n-1]
		p.free = p.free[:n-1]
		return e, nil
	}
	return cu.MakeEvent(cu.DefaultEvent)
}

// around records events before and after launch, which it calls.
func (p *kernelProf) around(name string, s cu.Stream, launch func() error) error {
	a, err := p.event()
	if err != nil {
		return launch()
	}
	b, err := p.event()
	if err != nil {
		p.free = append(p.free, a)
		return launch()
	}
	_ = a.Record(s)
	err = launch()
	_ = b.Record(s)
	p.pending = append(p.pending, profMark{name, a, b})
	return err
}

// begin marks the start of a Forward. Launches made since the last
// Forward's end (loading the weights) are no step's: they are dropped.
func (p *kernelProf) begin() {
	p.start = time.Now()
	for _, m := range p.pending {
		p.free = append(p.free, m.start, m.end)
	}
	p.pending = p.pending[:0]
}

// end adds the Forward's launches (the stream synchronized) to the totals.
func (p *kernelProf) end() {
	if len(p.pending) == 0 {
		return
	}
	p.steps++
	p.wall += time.Since(p.start)
	if ms, err := p.pending[0].start.Elapsed(p.pending[len(p.pending)-1].end); err == nil {
		p.span += ms
	}
	for _, m := range p.pending {
		st := p.kernels[m.name]
		if st == nil {
			st = &profStat{}
			p.kernels[m.name] = st
		}
		st.launches++
		if ms, err := m.start.Elapsed(m.end); err == nil {
			st.ms += ms
		}
		p.free = append(p.free, m.start, m.end)
	}
	p.pending = p.pending[:0]
	if p.steps%8 == 0 {
		p.write()
	}
}

// write replaces the profile file with the totals so far.
func (p *kernelProf) write() {
	if p.steps == 0 {
		return
	}
	var b strings.Builder
	busy := 0.0
	names := make([]string, 0, len(p.kernels))
	for n, st := range p.kernels {
		busy += st.ms
		names = append(names, n)
	}
	slices.SortFunc(names, func(x, y string) int {
		if p.kernels[x].ms > p.kernels[y].ms {
			return -1
		}
		if p.kernels[x].ms < p.kernels[y].ms {
			return 1
		}
		return strings.Compare(x, y)
	})
	n := float64(p.steps)
	fmt.Fprintf(&b, "%d steps: wall %.3f ms a step, GPU span %.3f ms, kernels busy %.3f ms (%.0f%% of the span)\n",
		p.steps, float64(p.wall.Microseconds())/1e3/n, p.span/n, busy/n, 100*busy/max(p.span, 1e-9))
	fmt.Fprintf(&b, "%-44s %10s %12s %9s %6s\n", "kernel", "launches/step", "us/step", "us/launch", "share")
	for _, name := range names {
		st := p.kernels[name]
		fmt.Fprintf(&b, "%-44s %10.1f %12.1f %9.2f %5.1f%%\n", name, float64(st.launches)/n, 1e3*st.ms/n, 1e3*st.ms/float64(st.launches), 100*st.ms/busy)
	}
	_ = os.WriteFile(p.path, []byte(b.String()), 0o644)
}
