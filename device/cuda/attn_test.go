//go:build cuda && cgo

package cuda

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"gorgonia.org/cu"

	"github.com/kvx-dev/kvx/device"
	"github.com/kvx-dev/kvx/device/cpu/kernel"
	"github.com/kvx-dev/kvx/device/kernelspec"
	"github.com/kvx-dev/kvx/device/paged"
	"github.com/kvx-dev/kvx/device/synth"
	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
	"github.com/kvx-dev/kvx/plugins/v1/spec"
)

// attnLayer is the index of the one mixer layer of the attention tests
// (not 0, so nothing may assume it).
const attnLayer = 2

// attnRig is a hand-made Device with one pool holding one attention
// layer, its copy in host memory for the cpu kernels, and one shuffled
// block table per sequence.
type attnRig struct {
	o    *ops
	x    *paged.Mixer
	host []byte // the cpu kernels' pool
	tabs map[kvcache.SeqID][][]kvcache.BlockID
	r    *rand.Rand
}

// newAttnRig configures layer l of m on kernel k at KV dtype dt, in a pool
// of tpb tokens per block with room for seqs tokens per sequence. edit,
// when not nil, adjusts the mixer (a scale) before use.
func newAttnRig(t testing.TB, m *spec.Model, l spec.Layer, k device.Kernel, dt kernelspec.Dtype, tpb int, seqs map[kvcache.SeqID]int, edit func(*paged.Mixer)) *attnRig {
	t.Helper()
	o := newTestOps(t)
	l.Index = attnLayer
	x, err := paged.NewMixer(m, l, k, dt, kernelspec.F32, kernelspec.F32)
	if err != nil {
		t.Fatalf("NewMixer: %v", err)
	}
	if edit != nil {
		edit(x)
	}
	switch k {
	case device.KernelGQA:
		l.Buffers = []spec.Buffer{{Role: spec.RoleKV, BytesPerToken: int64(x.GQA.RowBytes())}}
	case device.KernelMLA:
		l.Buffers = []spec.Buffer{{Role: spec.RoleLatent, BytesPerToken: int64(x.DSA.MLA.RowBytes())}}
	case device.KernelDSA:
		l.Buffers = []spec.Buffer{{Role: spec.RoleLatent, BytesPerToken: int64(x.DSA.MLA.RowBytes())},
			{Role: spec.RoleIndexKey, BytesPerToken: int64(x.DSA.Indexer.RowBytes())}}
	}
	if err := paged.CheckWidths(x, l); err != nil {
		t.Fatalf("CheckWidths: %v", err)
	}
	var rowBytes int64
	for _, b := range l.Buffers {
		rowBytes += b.BytesPerToken
	}
	r := rand.New(rand.NewPCG(uint64(len(t.Name())), 7))
	need := 0
	for _, n := range seqs {
		need += blocks(n, tpb)
	}
	nb := need + 5 // blocks no sequence uses stay zero
	pl := kvcache.Pool{ID: 7, Name: "full", Tier: kvcache.TierDevice, Layers: []int{attnLayer}, TokensPerBlock: tpb,
		BlockBytes: int64(tpb) * rowBytes, Blocks: nb}
	place, err := paged.Place([]spec.Layer{l}, []kvcache.Pool{pl})
	if err != nil {
		t.Fatalf("Place: %v", err)
	}
	perm := r.Perm(nb)
	tabs := map[kvcache.SeqID][][]kvcache.BlockID{}
	for _, seq := range slices.Sorted(maps.Keys(seqs)) { // a fixed order: the same tables every run
		n := seqs[seq]
		var tab []kvcache.BlockID
		for range blocks(n, tpb) {
			tab = append(tab, kvcache.BlockID(perm[0]))
			perm = perm[1:]
		}
		tabs[seq] = [][]kvcache.BlockID{tab}
	}
	d := &Device{g: o.g, ps: &paged.Stage{Mix: map[int]*paged.Mixer{attnLayer: x}, Place: place, Pools: []kvcache.Pool{pl}},
		idx: map[int]int{pl.ID: 0}, tables: map[tableKey]*devTable{}}
	on(t, o, func() {
		a, err := o.g.alloc(int64(nb) * pl.BlockBytes)
		if err == nil {
			err = cu.MemsetD8(a, 0, int64(nb)*pl.BlockBytes)
		}
		o.fail(err)
		d.pools = []pool{{Pool: pl, addr: a}}
	})
	t.Cleanup(func() {
		o.g.do(func() error {
			for _, p := range d.pools {
				cu.MemFree(p.addr)
			}
			for _, dt := range d.tables {
				cu.MemFree(dt.p)
			}
			return nil
		})
	})
	o.d, o.t = d, device.TablesOf(1, tabs)
	return &attnRig{o: o, x: x, host: make([]byte, int64(nb)*pl.BlockBytes), tabs: tabs, r: r}
}

// paged returns the cpu kernels' view of role for seq.
func (g *attnRig) paged(role spec.Role, seq kvcache.SeqID) kernel.Paged {
	at := g.o.d.ps.Place[attnLayer].Paged[role]
	p := g.o.d.ps.Pools[at.Pool]
	return kernel.Paged{Data: g.host, BlockBytes: int(p.BlockBytes), Offset: at.Offset, TokensPerBlock: p.TokensPerBlock,
		Stride: at.Stride, Table: g.tabs[seq][at.Pool]}
}

// rand returns n values uniform in [-a, a).
func (g *attnRig) rand(n int, a float32) []float32 {
	v := make([]float32, n)
	for i := range v {
		v[i] = a * (2*g.r.Float32() - 1)
	}
	return v
}

// step runs one call: op on the device (its inputs uploaded by up, its
// output downloaded), cpu on the host pool; then compares the outputs and
// the pools bit for bit.
func (g *attnRig) step(t *testing.T, name string, segs []synth.Seg, width int, op func(up func([]float32, int, int) synth.Tensor) (synth.Tensor, error), cpu func(out []float32) error) {
	t.Helper()
	rows := 0
	for _, sg := range segs {
		rows += sg.Rows
	}
	o := g.o
	var got []float32
	var opErr error
	dev := make([]byte, len(g.host))
	on(t, o, func() {
		up := func(data []float32, r, c int) synth.Tensor {
			if len(data) != r*c {
				panic(fmt.Sprintf("upload of %d values as %d × %d", len(data), r, c))
			}
			x := o.newTensor(r, c)
			if o.err == nil {
				o.fail(upload(x.p, data))
			}
			return x
		}
		res, err := op(up)
		if err != nil {
			opErr = err
			return
		}
		shape(name, cudaTensor(res), rows, width)
		got = make([]float32, rows*width)
		if o.err == nil {
			o.fail(o.g.sync())
			o.fail(download(got, cudaTensor(res).p))
			o.fail(download(dev, o.d.pools[0].addr))
		}
		o.fail(o.g.sync())
		o.fail(o.ar.reset())
	})
	if opErr != nil {
		t.Fatalf("%s: %v", name, opErr)
	}
	want := make([]float32, rows*width)
	if err := cpu(want); err != nil {
		t.Fatalf("%s: cpu: %v", name, err)
	}
	sameBits(t, name+" output", want, got)
	for i := range dev {
		if dev[i] != g.host[i] {
			t.Errorf("%s: pool byte %d (block %d) = %#02x, cpu %#02x", name, i, i/int(o.d.pools[0].BlockBytes), dev[i], g.host[i])
			break
		}
	}
}

// keepLess lowers attKeep for a test of contexts past it, whose scores are
// computed twice, when name says so.
func keepLess(t *testing.T, name string) {
	if !strings.HasSuffix(name, "beyond-kept") {
		return
	}
	old := attKeep
	attKeep = 1000
	t.Cleanup(func() { attKeep = old })
}

// attnSteps are calls of several sequences: a prefill of different lengths,
// then decode and multi-token (verification) steps in another order.
func attnSteps(long int) [][]synth.Seg {
	return [][]synth.Seg{
		{{Seq: 1, Pos: 0, Rows: 13}, {Seq: 2, Pos: 0, Rows: 5}, {Seq: 3, Pos: 0, Rows: 1}, {Seq: 4, Pos: 0, Rows: long}},
		{{Seq: 1, Pos: 13, Rows: 1}, {Seq: 2, Pos: 5, Rows: 3}, {Seq: 3, Pos: 1, Rows: 1}},
		{{Seq: 4, Pos: long, Rows: 2}, {Seq: 2, Pos: 8, Rows: 1}, {Seq: 1, Pos: 14, Rows: 4}},
		{{Seq: 3, Pos: 2, Rows: 1}, {Seq: 4, Pos: long + 2, Rows: 1}},
	}
}

// attnSeqs returns every sequence's tokens over steps.
func attnSeqs(steps [][]synth.Seg) map[kvcache.SeqID]int {
	n := map[kvcache.SeqID]int{}
	for _, st := range steps {
		for _, sg := range st {
			n[sg.Seq] = max(n[sg.Seq], sg.Pos+sg.Rows)
		}
	}
	return n
}

// hostRows returns rows [lo, hi) of a row-major matrix of width w.
func hostRows(v []float32, w, lo, hi int) []float32 { return v[lo*w : hi*w] }

func TestGQA(t *testing.T) {
	cases := []struct {
		name                    string
		heads, kvHeads, headDim int
		window, tpb, long       int
		dt                      kernelspec.Dtype
		scale                   float32
	}{
		{"bf16", 6, 2, 10, 0, 4, 9, kernelspec.BF16, 0},
		{"fp8-mha-window", 4, 4, 14, 5, 3, 11, kernelspec.FP8, 0},
		{"f32-mqa-wide", 8, 1, 136, 0, 16, 150, kernelspec.F32, 0.07},
		{"bf16-window-long", 3, 1, 64, 37, 8, 150, kernelspec.BF16, 0},
		{"bf16-odd-groups", 6, 2, 32, 0, 5, 140, kernelspec.BF16, 0},    // 3 heads per kv head
		{"bf16-beyond-kept", 2, 1, 16, 0, 32, 2100, kernelspec.BF16, 0}, // scores computed twice
		{"fp8-window-beyond-kept", 2, 2, 12, 2070, 32, 2100, kernelspec.FP8, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			keepLess(t, c.name)
			m := &spec.Model{Heads: c.heads, KVHeads: c.kvHeads, HeadDim: c.headDim}
			steps := attnSteps(c.long)
			g := newAttnRig(t, m, spec.Layer{Mixer: spec.MixerGQA, Window: c.window}, device.KernelGQA, c.dt, c.tpb, attnSeqs(steps),
				func(x *paged.Mixer) { x.GQA.Scale = c.scale })
			qw, kw := c.heads*c.headDim, c.kvHeads*c.headDim
			for si, segs := range steps {
				rows := 0
				for _, sg := range segs {
					rows += sg.Rows
				}
				q, k, v := g.rand(rows*qw, 2), g.rand(rows*kw, 2), g.rand(rows*kw, 1.5)
				g.step(t, fmt.Sprintf("step %d", si), segs, qw,
					func(up func([]float32, int, int) synth.Tensor) (synth.Tensor, error) {
						return g.o.GQA(context.Background(), attnLayer, segs, up(q, rows, qw), up(k, rows, kw), up(v, rows, kw))
					},
					func(out []float32) error {
						r := 0
						for _, sg := range segs {
							lo, hi := r, r+sg.Rows
							if err := kernel.GQA(g.x.GQA, g.paged(spec.RoleKV, sg.Seq), sg.Pos, hostRows(q, qw, lo, hi), hostRows(k, kw, lo, hi),
								hostRows(v, kw, lo, hi), hostRows(out, qw, lo, hi)); err != nil {
								return err
							}
							r = hi
						}
						return nil
					})
			}
		})
	}
}

// mlaCase is an MLA or DSA layer's dimensions.
type mlaCase struct {
	name                 string
	heads, r, n, pe, vd  int
	tpb, long            int
	dt                   kernelspec.Dtype
	scale                float32 // MLAIn.Scale
	ixHeads, ixDim, topK int     // DSA only
	plain                bool    // DSA: unquantized indexer keys (a checkpoint's)
	ixScale              float32 // IndexIn.Scale
	zeroW                bool    // DSA: zero index weights, every score ties
}

func (c mlaCase) model() *spec.Model {
	m := &spec.Model{Heads: c.heads, KVLoraRank: c.r, QKNopeHeadDim: c.n, QKRopeHeadDim: c.pe, VHeadDim: c.vd,
		IndexHeads: c.ixHeads, IndexHeadDim: c.ixDim, IndexTopK: c.topK}
	if c.plain {
		m.Checkpoint = "/checkpoint"
	}
	return m
}

// mlaInputs are one call's MLA (and DSA indexer) inputs on the host.
type mlaInputs struct {
	qn, qp, ckv, kpe []float32
	iq, ik, iw       []float32
}

func (g *attnRig) mlaInputs(c mlaCase, rows int) mlaInputs {
	in := mlaInputs{qn: g.rand(rows*c.heads*c.n, 1), qp: g.rand(rows*c.heads*c.pe, 1), ckv: g.rand(rows*c.r, 2), kpe: g.rand(rows*c.pe, 2)}
	if c.topK > 0 {
		in.iq, in.ik, in.iw = g.rand(rows*c.ixHeads*c.ixDim, 1), g.rand(rows*c.ixDim, 3), g.rand(rows*c.ixHeads, 1)
		if c.zeroW {
			clear(in.iw)
		}
	}
	return in
}

func TestMLA(t *testing.T) {
	cases := []mlaCase{
		{name: "bf16", heads: 3, r: 18, n: 6, pe: 6, vd: 7, tpb: 4, long: 9, dt: kernelspec.BF16},
		{name: "fp8-long", heads: 2, r: 33, n: 5, pe: 4, vd: 9, tpb: 3, long: 140, dt: kernelspec.FP8},
		{name: "f32-wide-scale", heads: 4, r: 160, n: 16, pe: 2, vd: 130, tpb: 16, long: 20, dt: kernelspec.F32, scale: 0.11},
		{name: "bf16-beyond-kept", heads: 2, r: 8, n: 4, pe: 2, vd: 3, tpb: 32, long: 2100, dt: kernelspec.BF16},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) { runMLA(t, c, device.KernelMLA, spec.MixerMLA) })
	}
}

func TestDSA(t *testing.T) {
	cases := []mlaCase{
		{name: "quantized-bf16", heads: 3, r: 18, n: 6, pe: 6, vd: 7, tpb: 4, long: 9, dt: kernelspec.BF16, ixHeads: 3, ixDim: 9, topK: 4},
		{name: "plain-fp8-long", heads: 2, r: 21, n: 5, pe: 4, vd: 6, tpb: 8, long: 300, dt: kernelspec.FP8, scale: 0.2,
			ixHeads: 4, ixDim: 16, topK: 37, plain: true, ixScale: 0.3},
		{name: "plain-f32", heads: 2, r: 12, n: 4, pe: 2, vd: 5, tpb: 5, long: 40, dt: kernelspec.F32, ixHeads: 2, ixDim: 6, topK: 7, plain: true},
		{name: "quantized-ties", heads: 2, r: 10, n: 3, pe: 2, vd: 4, tpb: 4, long: 270, dt: kernelspec.F32, ixHeads: 2, ixDim: 5, topK: 5, zeroW: true},
		{name: "quantized-long", heads: 2, r: 16, n: 8, pe: 4, vd: 8, tpb: 16, long: 290, dt: kernelspec.BF16, ixHeads: 8, ixDim: 32, topK: 64},
		{name: "plain-bf16-beyond-kept", heads: 2, r: 8, n: 4, pe: 2, vd: 3, tpb: 32, long: 2200, dt: kernelspec.BF16, ixHeads: 2, ixDim: 8, topK: 2100, plain: true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) { runMLA(t, c, device.KernelDSA, spec.MixerDSA) })
	}
}

// runMLA runs c's steps through the MLA or DSA op and the cpu kernel.
func runMLA(t *testing.T, c mlaCase, k device.Kernel, mix spec.Mixer) {
	keepLess(t, c.name)
	steps := attnSteps(c.long)
	g := newAttnRig(t, c.model(), spec.Layer{Mixer: mix}, k, c.dt, c.tpb, attnSeqs(steps), nil)
	uk, uv := g.rand(c.heads*c.n*c.r, 1), g.rand(c.heads*c.vd*c.r, 1)
	ow := c.heads * c.vd
	for si, segs := range steps {
		rows := 0
		for _, sg := range segs {
			rows += sg.Rows
		}
		in := g.mlaInputs(c, rows)
		g.step(t, fmt.Sprintf("step %d", si), segs, ow,
			func(up func([]float32, int, int) synth.Tensor) (synth.Tensor, error) {
				mi := synth.MLAIn{QNope: up(in.qn, rows, c.heads*c.n), QPE: up(in.qp, rows, c.heads*c.pe), CKV: up(in.ckv, rows, c.r),
					KPE: up(in.kpe, rows, c.pe), Scale: c.scale}
				w := synth.MLAWeights{UK: up(uk, c.heads*c.n, c.r), UV: up(uv, c.heads*c.vd, c.r)}
				if k == device.KernelMLA {
					return g.o.MLA(context.Background(), attnLayer, segs, mi, w)
				}
				ix := synth.IndexIn{Q: up(in.iq, rows, c.ixHeads*c.ixDim), K: up(in.ik, rows, c.ixDim), W: up(in.iw, rows, c.ixHeads), Scale: c.ixScale}
				return g.o.DSA(context.Background(), attnLayer, segs, mi, ix, w)
			},
			func(out []float32) error {
				mw := kernel.MLAWeights{UK: uk, UV: uv}
				d := g.x.WithScales(synth.MLAIn{Scale: c.scale}, &synth.IndexIn{Scale: c.ixScale})
				r := 0
				for _, sg := range segs {
					lo, hi := r, r+sg.Rows
					mi := kernel.MLAInput{Pos: sg.Pos, QNope: hostRows(in.qn, c.heads*c.n, lo, hi), QPE: hostRows(in.qp, c.heads*c.pe, lo, hi),
						CKV: hostRows(in.ckv, c.r, lo, hi), KPE: hostRows(in.kpe, c.pe, lo, hi)}
					o := hostRows(out, ow, lo, hi)
					var err error
					if k == device.KernelMLA {
						err = kernel.MLA(d.MLA, g.paged(spec.RoleLatent, sg.Seq), &mw, mi, o)
					} else {
						ki := kernel.IndexInput{Q: hostRows(in.iq, c.ixHeads*c.ixDim, lo, hi), W: hostRows(in.iw, c.ixHeads, lo, hi), K: hostRows(in.ik, c.ixDim, lo, hi)}
						err = kernel.DSA(d, g.paged(spec.RoleLatent, sg.Seq), g.paged(spec.RoleIndexKey, sg.Seq), &mw, mi, ki, o, nil)
					}
					if err != nil {
						return err
					}
					r = hi
				}
				return nil
			})
	}
}

// TestAttnWrongKernel checks the mixers refuse a layer configured for
// another kernel.
func TestAttnWrongKernel(t *testing.T) {
	m := &spec.Model{Heads: 2, KVHeads: 1, HeadDim: 4}
	g := newAttnRig(t, m, spec.Layer{Mixer: spec.MixerGQA}, device.KernelGQA, kernelspec.BF16, 4, map[kvcache.SeqID]int{1: 1}, nil)
	var err error
	on(t, g.o, func() {
		_, err = g.o.MLA(context.Background(), attnLayer, nil, synth.MLAIn{}, synth.MLAWeights{})
	})
	if err == nil {
		t.Errorf("MLA on a GQA layer: no error")
	}
	on(t, g.o, func() {
		_, err = g.o.GQA(context.Background(), attnLayer+1, nil, nil, nil, nil)
	})
	if err == nil {
		t.Errorf("GQA on a layer without a mixer: no error")
	}
}

// BenchmarkAttn times one call of each mixer at model-like sizes: a decode
// step of several sequences over a long context, and a prefill chunk.
func BenchmarkAttn(b *testing.B) {
	decode := func(seqs, ctx int) []synth.Seg {
		var segs []synth.Seg
		for i := range seqs {
			segs = append(segs, synth.Seg{Seq: kvcache.SeqID(i + 1), Pos: ctx - 1, Rows: 1})
		}
		return segs
	}
	prefill := []synth.Seg{{Seq: 1, Pos: 2048, Rows: 2048}} // positions before 2048 read as zeros
	for _, bc := range []struct {
		name string
		segs []synth.Seg
	}{{"decode-32x4096", decode(32, 4096)}, {"prefill-2048", prefill}} {
		b.Run("gqa-"+bc.name, func(b *testing.B) {
			m := &spec.Model{Heads: 32, KVHeads: 8, HeadDim: 128}
			g := newAttnRig(b, m, spec.Layer{Mixer: spec.MixerGQA}, device.KernelGQA, kernelspec.BF16, 16, attnSeqs([][]synth.Seg{bc.segs}), nil)
			rows := len(bc.segs) * bc.segs[0].Rows
			q, kv := g.rand(rows*32*128, 1), g.rand(rows*8*128, 1)
			benchAttn(b, g, func(up func([]float32, int, int) synth.Tensor) (synth.Tensor, error) {
				return g.o.GQA(context.Background(), attnLayer, bc.segs, up(q, rows, 32*128), up(kv, rows, 8*128), up(kv, rows, 8*128))
			})
		})
		for _, k := range []device.Kernel{device.KernelMLA, device.KernelDSA} {
			c := mlaCase{heads: 16, r: 512, n: 128, pe: 64, vd: 128, dt: kernelspec.BF16, ixHeads: 64, ixDim: 128, topK: 2048}
			mix := spec.MixerMLA
			if k == device.KernelDSA {
				mix = spec.MixerDSA
			}
			b.Run(string(mix)+"-"+bc.name, func(b *testing.B) {
				g := newAttnRig(b, c.model(), spec.Layer{Mixer: mix}, k, c.dt, 16, attnSeqs([][]synth.Seg{bc.segs}), nil)
				rows := len(bc.segs) * bc.segs[0].Rows
				in := g.mlaInputs(c, rows)
				uk, uv := g.rand(c.heads*c.n*c.r, 1), g.rand(c.heads*c.vd*c.r, 1)
				benchAttn(b, g, func(up func([]float32, int, int) synth.Tensor) (synth.Tensor, error) {
					mi := synth.MLAIn{QNope: up(in.qn, rows, c.heads*c.n), QPE: up(in.qp, rows, c.heads*c.pe), CKV: up(in.ckv, rows, c.r), KPE: up(in.kpe, rows, c.pe)}
					w := synth.MLAWeights{UK: up(uk, c.heads*c.n, c.r), UV: up(uv, c.heads*c.vd, c.r)}
					if k == device.KernelMLA {
						return g.o.MLA(context.Background(), attnLayer, bc.segs, mi, w)
					}
					ix := synth.IndexIn{Q: up(in.iq, rows, c.ixHeads*c.ixDim), K: up(in.ik, rows, c.ixDim), W: up(in.iw, rows, c.ixHeads)}
					return g.o.DSA(context.Background(), attnLayer, bc.segs, mi, ix, w)
				})
			})
		}
	}
}

// benchAttn times op (inputs uploaded once, outside the timing, into
// memory the step arena's resets leave alone).
func benchAttn(b *testing.B, g *attnRig, op func(up func([]float32, int, int) synth.Tensor) (synth.Tensor, error)) {
	o := g.o
	inputs := &arena{g: o.g}
	b.Cleanup(func() { o.g.do(func() error { inputs.free(); return nil }) })
	var err error
	var call func() (synth.Tensor, error)
	on(b, o, func() {
		up := func(data []float32, r, c int) synth.Tensor {
			x := &tensor{r: r, c: c}
			p, aerr := inputs.alloc(x.bytes())
			o.fail(aerr)
			x.p = p
			if o.err == nil {
				o.fail(upload(x.p, data))
			}
			return x
		}
		// Upload once; later calls reuse the same tensors.
		var ts []synth.Tensor
		_, err = op(func(data []float32, r, c int) synth.Tensor {
			x := up(data, r, c)
			ts = append(ts, x)
			return x
		})
		call = func() (synth.Tensor, error) {
			i := 0
			return op(func([]float32, int, int) synth.Tensor { i++; return ts[i-1] })
		}
	})
	if err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for range b.N {
		on(b, o, func() {
			_, err = call()
			o.fail(o.g.sync())
			o.fail(o.ar.reset())
		})
		if err != nil {
			b.Fatal(err)
		}
	}
}
