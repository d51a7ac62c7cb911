package cpu

import (
	"fmt"
	"runtime"
	"sync"

	"github.com/kvx-dev/kvx/device/cpu/kernel"
	"github.com/kvx-dev/kvx/device/hf"
	"github.com/kvx-dev/kvx/device/kernelspec"
	"github.com/kvx-dev/kvx/device/synth"
)

// tensor is the cpu device's synth.Tensor: r × c float32 values, row-major,
// in host memory.
type tensor struct {
	d    []float32
	r, c int
}

func (t *tensor) Rows() int { return t.r }
func (t *tensor) Cols() int { return t.c }

func newTensor(r, c int) *tensor { return &tensor{d: make([]float32, r*c), r: r, c: c} }

// cpuTensor returns t as the cpu's tensor. It panics on another device's
// tensor (a programmer error: tensors are valid only on their device).
func cpuTensor(t synth.Tensor) *tensor {
	ct, ok := t.(*tensor)
	if !ok {
		panic(fmt.Sprintf("cpu: tensor %T is not the cpu device's", t))
	}
	return ct
}

// rowsOf returns rows [lo, hi) of t's elements.
func (t *tensor) rowsOf(lo, hi int) []float32 { return t.d[lo*t.c : hi*t.c : hi*t.c] }

// routing is the cpu's synth.Routing: for every expert the rows routed to
// it, ascending, and their weights.
type routing struct {
	rows int
	of   [][]int
	w    [][]float32
}

func (r *routing) Rows() int { return r.rows }

// hostOps are the row-wise operations of synth.Ops on host tensors, each a
// loop over the kernel function it wraps (ops_test.go pins every one to
// that function bit for bit). The paged device (pagedOps) and the dense
// Reference (denseOps) share them and differ only in the mixer kernels.
// hostOps is stateless: safe for concurrent use.
type hostOps struct{}

func shape(name string, t *tensor, r, c int) {
	if t.r != r || t.c != c {
		panic(fmt.Sprintf("cpu: %s: tensor is %d × %d, want %d × %d", name, t.r, t.c, r, c))
	}
}

func (hostOps) Weight(data []float32, rows, cols int) synth.Tensor {
	return hostOps{}.FromHost(data, rows, cols)
}

func (hostOps) FromHost(data []float32, rows, cols int) synth.Tensor {
	if rows < 0 || cols < 0 || len(data) != rows*cols {
		panic(fmt.Sprintf("cpu: %d values for a %d × %d tensor", len(data), rows, cols))
	}
	return &tensor{d: data, r: rows, c: cols}
}

func (hostOps) ToHost(t synth.Tensor) []float32 {
	return append([]float32(nil), cpuTensor(t).d...)
}

func (hostOps) Zeros(rows, cols int) synth.Tensor { return newTensor(rows, cols) }

func (hostOps) Embed(table synth.Tensor, tokens []int32) synth.Tensor {
	tb := cpuTensor(table)
	out := newTensor(len(tokens), tb.c)
	for i, tok := range tokens {
		copy(out.d[i*tb.c:], tb.rowsOf(int(tok), int(tok)+1))
	}
	return out
}

func (hostOps) Rows(x synth.Tensor, idx []int) synth.Tensor {
	xt := cpuTensor(x)
	out := newTensor(len(idx), xt.c)
	for i, r := range idx {
		copy(out.d[i*xt.c:], xt.rowsOf(r, r+1))
	}
	return out
}

func (hostOps) Split(x synth.Tensor, groups int, widths ...int) []synth.Tensor {
	xt := cpuTensor(x)
	g := 0
	for _, w := range widths {
		g += w
	}
	if groups*g != xt.c {
		panic(fmt.Sprintf("cpu: Split: %d columns are not %d groups of %v", xt.c, groups, widths))
	}
	outs := make([]synth.Tensor, len(widths))
	parts := make([]*tensor, len(widths))
	for i, w := range widths {
		parts[i] = newTensor(xt.r, groups*w)
		outs[i] = parts[i]
	}
	for r := range xt.r {
		src := xt.rowsOf(r, r+1)
		for gi := range groups {
			for i, w := range widths {
				copy(parts[i].d[(r*groups+gi)*w:], src[:w])
				src = src[w:]
			}
		}
	}
	return outs
}

func (hostOps) Concat(a, b synth.Tensor) synth.Tensor {
	at, bt := cpuTensor(a), cpuTensor(b)
	if at.r != bt.r {
		panic(fmt.Sprintf("cpu: Concat of %d and %d rows", at.r, bt.r))
	}
	out := newTensor(at.r, at.c+bt.c)
	for r := range at.r {
		row := out.rowsOf(r, r+1)
		copy(row, at.rowsOf(r, r+1))
		copy(row[at.c:], bt.rowsOf(r, r+1))
	}
	return out
}

func (hostOps) MatMul(x, w synth.Tensor) synth.Tensor {
	xt, wt := cpuTensor(x), cpuTensor(w)
	if xt.c != wt.c {
		panic(fmt.Sprintf("cpu: MatMul of %d × %d by (%d × %d)ᵀ", xt.r, xt.c, wt.r, wt.c))
	}
	out := newTensor(xt.r, wt.r)
	matMul(out.d, xt.d, wt.d, xt.r, wt.r, xt.c)
	return out
}

// matMulMin is the multiply-adds below which matMul stays on the calling
// goroutine (kernel.MatMul's own threshold).
const matMulMin = 1 << 16

// matMul is kernel.MatMul (out = x · wᵀ, n × m from n × k and m × k), but
// when x has fewer rows than there are goroutines to use (a decode step, an
// expert's few rows) it splits the output columns instead: each element is
// still one kernel.Dot of a weight row and an input row, so the split cannot
// change a bit (ops_test.go checks against kernel.MatMul).
func matMul(out, x, w []float32, n, m, k int) {
	workers := min(runtime.GOMAXPROCS(0), m)
	if n >= workers || workers <= 1 || n*m*k < matMulMin || k == 0 {
		if n > 0 && m > 0 && k > 0 {
			kernel.MatMul(out, x, w, k)
		}
		return
	}
	var wg sync.WaitGroup
	for g := range workers {
		lo, hi := g*m/workers, (g+1)*m/workers
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range n {
				kernel.MatVec(out[i*m+lo:i*m+hi], w[lo*k:hi*k], x[i*k:(i+1)*k])
			}
		}()
	}
	wg.Wait()
}

func (hostOps) RMSNorm(x, w synth.Tensor, eps float32) synth.Tensor {
	xt, wt := cpuTensor(x), cpuTensor(w)
	shape("RMSNorm gains", wt, 1, xt.c)
	out := newTensor(xt.r, xt.c)
	for r := range xt.r {
		kernel.RMSNorm(out.rowsOf(r, r+1), xt.rowsOf(r, r+1), wt.d, eps)
	}
	return out
}

func (hostOps) Add(dst, src synth.Tensor) {
	d, s := cpuTensor(dst), cpuTensor(src)
	shape("Add", s, d.r, d.c)
	for i := range d.d {
		d.d[i] += s.d[i]
	}
}

func (hostOps) Scale(x synth.Tensor, s float32) {
	t := cpuTensor(x)
	for i := range t.d {
		t.d[i] *= s
	}
}

func (hostOps) SwiGLU(gate, up synth.Tensor) synth.Tensor {
	g, u := cpuTensor(gate), cpuTensor(up)
	shape("SwiGLU", u, g.r, g.c)
	out := newTensor(g.r, g.c)
	for i, v := range g.d {
		out.d[i] = kernel.SiLU(v) * u.d[i]
	}
	return out
}

func (hostOps) ReLU2(x synth.Tensor) synth.Tensor {
	xt := cpuTensor(x)
	out := newTensor(xt.r, xt.c)
	for i, v := range xt.d {
		r := max(v, 0)
		out.d[i] = r * r
	}
	return out
}

func (hostOps) RoPE(x synth.Tensor, segs []synth.Seg, stride int, r synth.RoPE) {
	xt := cpuTensor(x)
	kr := kernelspec.RoPE{Dim: r.Dim, Theta: r.Theta, Interleaved: r.Interleaved, InvFreq: r.InvFreq, Scale: r.Scale}
	row := 0
	for _, sg := range segs {
		for j := range sg.Rows {
			kernel.RoPE(kr, xt.rowsOf(row, row+1), stride, sg.Pos+j)
			row++
		}
	}
	if row != xt.r {
		panic(fmt.Sprintf("cpu: RoPE: segments cover %d rows of %d", row, xt.r))
	}
}

func (hostOps) Route(logits synth.Tensor, k int) synth.Routing {
	lt := cpuTensor(logits)
	r := &routing{rows: lt.r, of: make([][]int, lt.c), w: make([][]float32, lt.c)}
	for row := range lt.r {
		experts, weights := kernel.Route(lt.rowsOf(row, row+1), k)
		for i, e := range experts {
			r.of[e] = append(r.of[e], row)
			r.w[e] = append(r.w[e], weights[i])
		}
	}
	return r
}

func cpuRouting(r synth.Routing) *routing {
	cr, ok := r.(*routing)
	if !ok {
		panic(fmt.Sprintf("cpu: routing %T is not the cpu device's", r))
	}
	return cr
}

func (o hostOps) Gather(x synth.Tensor, r synth.Routing, e int) synth.Tensor {
	rows := cpuRouting(r).of[e]
	if len(rows) == 0 {
		return nil
	}
	return o.Rows(x, rows)
}

func (hostOps) AddRouted(acc, y synth.Tensor, r synth.Routing, e int) {
	at, yt, rt := cpuTensor(acc), cpuTensor(y), cpuRouting(r)
	rows := rt.of[e]
	shape("AddRouted", yt, len(rows), at.c)
	for i, row := range rows {
		kernel.Axpy(at.rowsOf(row, row+1), rt.w[e][i], yt.rowsOf(i, i+1))
	}
}

func (hostOps) Argmax(x synth.Tensor) []int32 {
	xt := cpuTensor(x)
	out := make([]int32, xt.r)
	for r := range xt.r {
		out[r] = int32(kernel.Argmax(xt.rowsOf(r, r+1)))
	}
	return out
}

// AddBias implements hf.Ops: x += b on every row.
func (hostOps) AddBias(x, b synth.Tensor) {
	xt, bt := cpuTensor(x), cpuTensor(b)
	shape("AddBias", bt, 1, xt.c)
	for r := range xt.r {
		row := xt.rowsOf(r, r+1)
		for i, v := range bt.d {
			row[i] += v
		}
	}
}

// RMSNormGroups implements hf.Ops: kernel.RMSNorm of every w.Cols()-wide
// group of each row, with the gains w.
func (hostOps) RMSNormGroups(x, w synth.Tensor, eps float32) synth.Tensor {
	xt, wt := cpuTensor(x), cpuTensor(w)
	if wt.r != 1 || wt.c <= 0 || xt.c%wt.c != 0 {
		panic(fmt.Sprintf("cpu: RMSNormGroups: gains %d × %d do not split rows of %d", wt.r, wt.c, xt.c))
	}
	out := newTensor(xt.r, xt.c)
	g := wt.c
	for i := 0; i < len(xt.d); i += g {
		kernel.RMSNorm(out.d[i:i+g], xt.d[i:i+g], wt.d, eps)
	}
	return out
}

// SigmoidMul implements hf.GDNOps: x *= kernel.Sigmoid(gate) element-wise,
// gate of x's shape or one column (one gate per row).
func (hostOps) SigmoidMul(x, gate synth.Tensor) {
	xt, gt := cpuTensor(x), cpuTensor(gate)
	if gt.r != xt.r || (gt.c != xt.c && gt.c != 1) {
		panic(fmt.Sprintf("cpu: SigmoidMul: gate %d × %d for x %d × %d", gt.r, gt.c, xt.r, xt.c))
	}
	for r := range xt.r {
		row, g := xt.rowsOf(r, r+1), gt.rowsOf(r, r+1)
		for i := range row {
			row[i] = float32(row[i] * kernel.Sigmoid(g[min(i, gt.c-1)]))
		}
	}
}

// RowOps returns the cpu's row-wise ops (hostOps): the oracle another
// device's row-wise ops are checked against, op by op.
func RowOps() hf.RowOps { return hostOps{} }
