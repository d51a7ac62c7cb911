//go:build cuda && cgo

package cuda

import (
	"math"

	"gorgonia.org/cu"

	"github.com/kvx-dev/kvx/device/synth"
	"github.com/kvx-dev/kvx/plugins/v1/spec"
)

// stepMemo keeps, for one step's ops, the uploads every layer would
// otherwise repeat: the models call each layer with the same segment
// slice, so the RoPE tables of a rotation, the segment descriptors of a
// pool, the rows' segment map and the fast attention's work lists are made
// once a step. They live in the step's arena, like everything they serve,
// and are forgotten with the ops when the step ends.
type stepMemo struct {
	gen   uint64     // the arena generation the entries live in
	segs  *synth.Seg // the slice the entries are for (its first element)
	nsegs int
	rope  map[ropeKey][2]cu.DevicePtr
	desc  map[descKey]descVal
	rows  cu.DevicePtr // attnRowSegs
	work  map[workKey]workVal
}

type ropeKey struct {
	dim          int
	theta, scale uint64 // float64 bits
	freq         *float64
	nfreq        int
}

type descKey struct {
	pool, window int
	role         spec.Role
}

type descVal struct {
	p cu.DevicePtr
	v pagedView
}

type workKey struct{ grp, warps int }

type workVal struct {
	pre, split   cu.DevicePtr
	npre, nsplit int // work items
	parts        int
}

// memoFor returns the memo of segs, reset when segs is another slice than
// the one it holds or the arena was reset since (a test's ops outlive
// steps).
func (o *ops) memoFor(segs []synth.Seg) *stepMemo {
	m := &o.memo
	var first *synth.Seg
	if len(segs) > 0 {
		first = &segs[0]
	}
	if m.segs != first || m.nsegs != len(segs) || m.gen != o.ar.gen {
		*m = stepMemo{gen: o.ar.gen, segs: first, nsegs: len(segs)}
	}
	return m
}

func ropeKeyOf(r synth.RoPE) ropeKey {
	k := ropeKey{dim: r.Dim, theta: math.Float64bits(r.Theta), scale: math.Float64bits(r.Scale), nfreq: len(r.InvFreq)}
	if len(r.InvFreq) > 0 {
		k.freq = &r.InvFreq[0]
	}
	return k
}
