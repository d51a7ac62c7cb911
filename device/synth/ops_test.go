package synth

import (
	"context"

	"github.com/kvx-dev/kvx/device"
	"github.com/kvx-dev/kvx/device/cpu/kernel"
	"github.com/kvx-dev/kvx/device/kernelspec"
	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
	"github.com/kvx-dev/kvx/plugins/v1/spec"
)

// testKernels is the kernel choice of the tests: each mixer its own kernel.
func testKernels(m spec.Mixer) device.Kernel {
	switch m {
	case spec.MixerGQA:
		return device.KernelGQA
	case spec.MixerMLA:
		return device.KernelMLA
	case spec.MixerDSA:
		return device.KernelDSA
	case spec.MixerMamba:
		return device.KernelMamba2
	}
	return device.KernelNone
}

// mat is the tensor of meanOps: host rows.
type mat struct {
	d    []float32
	r, c int
}

func (t *mat) Rows() int           { return t.r }
func (t *mat) Cols() int           { return t.c }
func (t *mat) row(i int) []float32 { return t.d[i*t.c : (i+1)*t.c] }
func newMat(r, c int) *mat         { return &mat{d: make([]float32, r*c), r: r, c: c} }
func m_(t Tensor) *mat             { return t.(*mat) }
func (t *mat) each(f func(i int, v float32)) {
	for i, v := range t.d {
		f(i, v)
	}
}

type route struct {
	rows int
	of   [][]int
	w    [][]float32
}

func (r *route) Rows() int { return r.rows }

// meanOps is a test device: plain loops over the kernel package's math,
// and one trivial deterministic mixer for every kernel with a dense
// per-sequence cache: row p's output is the mean of the mixer's first input
// (q, q_nope or z) at positions 0..p, summed in position order, repeated to
// the kernel's output width. Writing at Pos drops whatever was cached from
// Pos on (rejected drafts), as paged attention overwrites those slots.
type meanOps struct {
	h    int
	hist map[[2]uint64][]float32 // by (layer, seq): the cached rows
	cols map[[2]uint64]int       // their width
}

var _ Ops = (*meanOps)(nil)

func newMeanOps(h int) *meanOps {
	return &meanOps{h: h, hist: map[[2]uint64][]float32{}, cols: map[[2]uint64]int{}}
}

func (*meanOps) Weight(d []float32, r, c int) Tensor   { return &mat{d, r, c} }
func (*meanOps) FromHost(d []float32, r, c int) Tensor { return &mat{d, r, c} }
func (*meanOps) ToHost(t Tensor) []float32             { return append([]float32(nil), m_(t).d...) }
func (*meanOps) Zeros(r, c int) Tensor                 { return newMat(r, c) }

func (o *meanOps) Embed(table Tensor, toks []int32) Tensor {
	idx := make([]int, len(toks))
	for i, t := range toks {
		idx[i] = int(t)
	}
	return o.Rows(table, idx)
}

func (*meanOps) Rows(x Tensor, idx []int) Tensor {
	out := newMat(len(idx), x.Cols())
	for i, r := range idx {
		copy(out.row(i), m_(x).row(r))
	}
	return out
}

func (*meanOps) Split(x Tensor, groups int, widths ...int) []Tensor {
	var outs []Tensor
	g := 0
	for _, w := range widths {
		g += w
	}
	at := 0
	for _, w := range widths {
		t := newMat(x.Rows(), groups*w)
		for r := range x.Rows() {
			for gi := range groups {
				copy(t.row(r)[gi*w:(gi+1)*w], m_(x).row(r)[gi*g+at:])
			}
		}
		at += w
		outs = append(outs, t)
	}
	return outs
}

func (*meanOps) Concat(a, b Tensor) Tensor {
	out := newMat(a.Rows(), a.Cols()+b.Cols())
	for r := range a.Rows() {
		copy(out.row(r), m_(a).row(r))
		copy(out.row(r)[a.Cols():], m_(b).row(r))
	}
	return out
}

func (*meanOps) MatMul(x, w Tensor) Tensor {
	out := newMat(x.Rows(), w.Rows())
	kernel.MatMul(out.d, m_(x).d, m_(w).d, x.Cols())
	return out
}

func (*meanOps) RMSNorm(x, w Tensor, eps float32) Tensor {
	out := newMat(x.Rows(), x.Cols())
	for r := range x.Rows() {
		kernel.RMSNorm(out.row(r), m_(x).row(r), m_(w).d, eps)
	}
	return out
}

func (*meanOps) Add(dst, src Tensor)       { m_(src).each(func(i int, v float32) { m_(dst).d[i] += v }) }
func (*meanOps) Scale(x Tensor, s float32) { m_(x).each(func(i int, v float32) { m_(x).d[i] = v * s }) }

func (*meanOps) SwiGLU(gate, up Tensor) Tensor {
	out := newMat(gate.Rows(), gate.Cols())
	m_(gate).each(func(i int, v float32) { out.d[i] = kernel.SiLU(v) * m_(up).d[i] })
	return out
}

func (*meanOps) ReLU2(x Tensor) Tensor {
	out := newMat(x.Rows(), x.Cols())
	m_(x).each(func(i int, v float32) { r := max(v, 0); out.d[i] = r * r })
	return out
}

func (*meanOps) RoPE(x Tensor, segs []Seg, stride int, r RoPE) {
	row := 0
	for _, sg := range segs {
		for j := range sg.Rows {
			kernel.RoPE(kernelspec.RoPE{Dim: r.Dim, Theta: r.Theta, Interleaved: r.Interleaved}, m_(x).row(row), stride, sg.Pos+j)
			row++
		}
	}
}

func (*meanOps) Route(logits Tensor, k int) Routing {
	r := &route{rows: logits.Rows(), of: make([][]int, logits.Cols()), w: make([][]float32, logits.Cols())}
	for row := range logits.Rows() {
		es, ws := kernel.Route(m_(logits).row(row), k)
		for i, e := range es {
			r.of[e] = append(r.of[e], row)
			r.w[e] = append(r.w[e], ws[i])
		}
	}
	return r
}

func (o *meanOps) Gather(x Tensor, r Routing, e int) Tensor {
	if len(r.(*route).of[e]) == 0 {
		return nil
	}
	return o.Rows(x, r.(*route).of[e])
}

func (*meanOps) AddRouted(acc, y Tensor, r Routing, e int) {
	rt := r.(*route)
	for i, row := range rt.of[e] {
		kernel.Axpy(m_(acc).row(row), rt.w[e][i], m_(y).row(i))
	}
}

func (*meanOps) Argmax(x Tensor) []int32 {
	out := make([]int32, x.Rows())
	for r := range out {
		out[r] = int32(kernel.Argmax(m_(x).row(r)))
	}
	return out
}

func (o *meanOps) GQA(_ context.Context, layer int, segs []Seg, q, _, _ Tensor) (Tensor, error) {
	return o.mean(layer, segs, q, q.Cols())
}

func (o *meanOps) MLA(_ context.Context, layer int, segs []Seg, in MLAIn, w MLAWeights) (Tensor, error) {
	return o.mean(layer, segs, in.QNope, w.UV.Rows())
}

func (o *meanOps) DSA(_ context.Context, layer int, segs []Seg, in MLAIn, _ IndexIn, w MLAWeights) (Tensor, error) {
	return o.mean(layer, segs, in.QNope, w.UV.Rows())
}

func (o *meanOps) Mamba2(_ context.Context, layer int, segs []Seg, in Mamba2In, _ Mamba2Weights) (Tensor, error) {
	return o.mean(layer, segs, in.Z, in.Z.Cols())
}

func (o *meanOps) mean(layer int, segs []Seg, in Tensor, width int) (Tensor, error) {
	c := in.Cols()
	out := newMat(in.Rows(), width)
	acc := make([]float32, c)
	r := 0
	for _, sg := range segs {
		k := [2]uint64{uint64(layer), uint64(sg.Seq)}
		buf := o.hist[k]
		if len(buf) < sg.Pos*c {
			return nil, kvcache.ItemErrorf([]kvcache.SeqID{sg.Seq}, "layer %d seq %d: write at %d leaves a hole after %d cached rows", layer, sg.Seq, sg.Pos, len(buf)/c)
		}
		buf = append(buf[:sg.Pos*c], m_(in).d[r*c:(r+sg.Rows)*c]...)
		o.hist[k], o.cols[k] = buf, c
		for j := range sg.Rows {
			pos := sg.Pos + j
			clear(acc)
			for q := 0; q <= pos; q++ {
				kernel.Axpy(acc, 1/float32(pos+1), buf[q*c:(q+1)*c])
			}
			row := out.row(r + j)
			for i := range row {
				row[i] = acc[i%c]
			}
		}
		r += sg.Rows
	}
	return out, nil
}
