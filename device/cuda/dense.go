//go:build cuda && cgo

package cuda

// The row-wise ops (hf.RowOps) on the GPU: kernels/dense.cu. Each mirrors
// the cpu's hostOps and the reference kernel it calls operation for
// operation, so outputs equal the cpu's bit for bit (dense_test.go checks
// every one against cpu.RowOps()).

import (
	"errors"
	"fmt"
	"math"
	"sync"

	"gorgonia.org/cu"

	"github.com/kvx-dev/kvx/device/hf"
	"github.com/kvx-dev/kvx/device/synth"
)

// routing is the cuda device's synth.Routing, kept on the host (it is a few
// integers per row): for every expert the rows routed to it, ascending, and
// their weights, as the cpu's.
type routing struct {
	rows int
	of   [][]int
	w    [][]float32
}

func (r *routing) Rows() int { return r.rows }

func cudaRouting(r synth.Routing) *routing {
	cr, ok := r.(*routing)
	if !ok {
		panic(fmt.Sprintf("cuda: routing %T is not the cuda device's", r))
	}
	return cr
}

// flat returns a grid-stride launch shape for n elements.
func flat(n int) (dim, dim) { return dim{min(blocks(n, 256), 1<<16), 1, 1}, dim{256, 1, 1} }

// perRow returns a launch of one block of threads per row (grid-stride
// past 1<<16 rows).
func perRow(rows, threads int) (dim, dim) { return dim{min(rows, 1<<16), 1, 1}, dim{threads, 1, 1} }

// Weight implements synth.Loader: device memory kept as long as the device
// (freed with *o.weights).
func (o *ops) Weight(data []float32, rows, cols int) synth.Tensor {
	if rows < 0 || cols < 0 || len(data) != rows*cols {
		panic(fmt.Sprintf("cuda: %d values for a %d × %d weight", len(data), rows, cols))
	}
	t := &tensor{r: rows, c: cols}
	if o.err != nil {
		return t
	}
	if o.fast && bf16Weights(rows, cols) {
		o.weightBF16(t, data)
		return t
	}
	p, err := o.g.alloc(t.bytes())
	if err != nil {
		o.fail(err)
		return t
	}
	*o.weights = append(*o.weights, p)
	t.p = p
	o.fail(upload(p, data))
	return t
}

func (o *ops) FromHost(data []float32, rows, cols int) synth.Tensor {
	if rows < 0 || cols < 0 || len(data) != rows*cols {
		panic(fmt.Sprintf("cuda: %d values for a %d × %d tensor", len(data), rows, cols))
	}
	t := o.newTensor(rows, cols)
	if o.err == nil {
		o.fail(upload(t.p, data))
	}
	return t
}

// ToHost returns a new slice (zeros after an earlier failure).
func (o *ops) ToHost(t synth.Tensor) []float32 {
	ct := cudaTensor(t)
	out := make([]float32, ct.r*ct.c)
	if o.err == nil {
		o.fail(download(out, ct.p))
	}
	return out
}

func (o *ops) Zeros(rows, cols int) synth.Tensor {
	t := o.newTensor(rows, cols)
	g, b := flat(rows * cols)
	o.run("kvx_fill", g, b, 0, t.p, rows*cols, float32(0))
	return t
}

// gather returns rows idx of src (the caller checked them).
func (o *ops) gather(src *tensor, idx []int32) *tensor {
	out := o.newTensor(len(idx), src.c)
	if len(idx) == 0 || src.c == 0 {
		return out
	}
	p := put(o, idx)
	g, b := perRow(len(idx), 128)
	o.run("kvx_gather_rows", g, b, 0, out.p, src.p, p, len(idx), src.c)
	return out
}

func (o *ops) Embed(table synth.Tensor, tokens []int32) synth.Tensor {
	tb := cudaTensor(table)
	for _, tok := range tokens {
		if tok < 0 || int(tok) >= tb.r {
			panic(fmt.Sprintf("cuda: Embed: token %d of a %d-row table", tok, tb.r))
		}
	}
	if tb.p == 0 && tb.h != 0 {
		out := o.newTensor(len(tokens), tb.c)
		if len(tokens) > 0 && tb.c > 0 {
			g, b := perRow(len(tokens), 128)
			o.run("kvx_gather_bf16", g, b, 0, out.p, tb.h, put(o, tokens), len(tokens), tb.c, tb.ld)
		}
		return out
	}
	return o.gather(tb, tokens)
}

func (o *ops) Rows(x synth.Tensor, idx []int) synth.Tensor {
	xt := cudaTensor(x)
	rows := make([]int32, len(idx))
	for i, r := range idx {
		if r < 0 || r >= xt.r {
			panic(fmt.Sprintf("cuda: Rows: row %d of %d", r, xt.r))
		}
		rows[i] = int32(r)
	}
	return o.gather(xt, rows)
}

// copy2d copies rows × groups runs of w values, run (r, g) from src element
// r*srs + g*sgs + soff to dst element r*drs + g*dgs + doff.
func (o *ops) copy2d(dst *tensor, drs, dgs, doff int, src *tensor, srs, sgs, soff, rows, groups, w int) {
	g, b := flat(rows * groups * w)
	o.run("kvx_copy2d", g, b, 0, dst.p, drs, dgs, doff, src.p, srs, sgs, soff, rows, groups, w)
}

func (o *ops) Split(x synth.Tensor, groups int, widths ...int) []synth.Tensor {
	xt := cudaTensor(x)
	sum := 0
	for _, w := range widths {
		sum += w
	}
	if groups*sum != xt.c {
		panic(fmt.Sprintf("cuda: Split: %d columns are not %d groups of %v", xt.c, groups, widths))
	}
	outs := make([]synth.Tensor, len(widths))
	off := 0
	for i, w := range widths {
		part := o.newTensor(xt.r, groups*w)
		o.copy2d(part, groups*w, w, 0, xt, xt.c, sum, off, xt.r, groups, w)
		outs[i] = part
		off += w
	}
	return outs
}

func (o *ops) Concat(a, b synth.Tensor) synth.Tensor {
	at, bt := cudaTensor(a), cudaTensor(b)
	if at.r != bt.r {
		panic(fmt.Sprintf("cuda: Concat of %d and %d rows", at.r, bt.r))
	}
	c := at.c + bt.c
	out := o.newTensor(at.r, c)
	o.copy2d(out, c, 0, 0, at, at.c, 0, 0, at.r, 1, at.c)
	o.copy2d(out, c, 0, at.c, bt, bt.c, 0, 0, at.r, 1, bt.c)
	return out
}

// skinnyRows is the most rows of x that MatMul gives the skinny kernels
// (one pass over the weights for up to 8 rows: decode and small batches),
// one kernel for each count of rows.
const skinnyRows = 8

var skinnyKernels = [skinnyRows]string{"kvx_matmul_skinny1", "kvx_matmul_skinny2", "kvx_matmul_skinny3",
	"kvx_matmul_skinny4", "kvx_matmul_skinny5", "kvx_matmul_skinny6", "kvx_matmul_skinny7", "kvx_matmul_skinny8"}

// MatMuls implements hf.MatMulser: MatMul(x, w) for every w, the same
// bits. Fast numerics with bf16 weights of one stride round x once and run
// few rows of up to three weights in one launch; anything else is one
// MatMul a weight.
func (o *ops) MatMuls(x synth.Tensor, ws ...synth.Tensor) []synth.Tensor {
	xt := cudaTensor(x)
	fast := make([]*tensor, len(ws))
	for i, w := range ws {
		wt := cudaTensor(w)
		if wt.h == 0 || wt.c != xt.c || wt.ld != cudaTensor(ws[0]).ld {
			fast = nil
			break
		}
		fast[i] = wt
	}
	out := make([]synth.Tensor, len(ws))
	if len(fast) == 0 {
		for i, w := range ws {
			out[i] = o.MatMul(x, w)
		}
		return out
	}
	for i, t := range o.fastMatMuls(xt, fast) {
		out[i] = t
	}
	return out
}

// MatMul is x · wᵀ. Exact numerics: each element kernel.Dot(w row, x row),
// the tiled kernel (64 × 64 outputs a block) for many rows, the skinny one
// for few. A bf16 weight (fast numerics) runs fastMatMul instead.
func (o *ops) MatMul(x, w synth.Tensor) synth.Tensor {
	xt, wt := cudaTensor(x), cudaTensor(w)
	if xt.c != wt.c {
		panic(fmt.Sprintf("cuda: MatMul of %d × %d by (%d × %d)ᵀ", xt.r, xt.c, wt.r, wt.c))
	}
	if wt.h != 0 {
		return o.fastMatMul(xt, wt)
	}
	n, m, k := xt.r, wt.r, xt.c
	out := o.newTensor(n, m)
	if n == 0 || m == 0 {
		return out
	}
	if n <= skinnyRows {
		o.run(skinnyKernels[n-1], dim{blocks(m, 32), 1, 1}, dim{128, 1, 1}, 0, out.p, xt.p, wt.p, m, k)
		return out
	}
	const chunk = 65535 * 64 // rows of x per launch (grid.y ≤ 65535)
	for r0 := 0; r0 < n; r0 += chunk {
		rows := min(chunk, n-r0)
		xp := xt.p + cu.DevicePtr(int64(r0)*int64(k)*4)
		op := out.p + cu.DevicePtr(int64(r0)*int64(m)*4)
		o.run("kvx_matmul", dim{blocks(m, 64), blocks(rows, 64), 1}, dim{256, 1, 1}, 0, op, xp, wt.p, rows, m, k)
	}
	return out
}

// rmsNorm runs kernel.RMSNorm over rows of cols values with gains w.
func (o *ops) rmsNorm(x, w *tensor, rows, cols int, eps float32) *tensor {
	return o.addRMSNorm(x, nil, w, rows, cols, eps)
}

// addRMSNorm is rmsNorm after x += y when y is not nil: in one launch where
// the fast RMSNorm runs (kvx_frmsnorm adds y first, kvx_add's sum), else
// Add's launch first. A pending y alone in its matmul (o_proj's, down's)
// is folded there too.
func (o *ops) addRMSNorm(x, y, w *tensor, rows, cols int, eps float32) *tensor {
	fast := o.fast && cols >= fastNormCols
	if y != nil && !fast {
		o.Add(x, y)
		y = nil
	}
	var f *pendingFold // y's parts, read by kvx_frmsnorm_fold
	if y != nil && y.fold != nil {
		if f = y.fold; len(f.outs) != 1 || cols != x.c {
			f.run()
			f = nil
		}
	}
	out := o.newTensor(x.r, x.c)
	switch {
	case rows == 0 || cols == 0:
	case fast:
		var ob cu.DevicePtr
		ld := padK(cols)
		if cols == x.c { // whole rows (not RMSNormGroups' groups): the matmul's input
			ob = o.scratch(int64(rows) * int64(ld) * 2)
			out.b = ob
		}
		var yp cu.DevicePtr
		if y != nil {
			dropBF16(x)
			yp = y.p
		}
		if f != nil {
			o.foldNorm(rows <= fnSliceRows && cols <= fnSliceCols, out.p, ob, x.p, f.p, f.parts, w.p, rows, cols, ld, eps)
			break
		}
		o.run("kvx_frmsnorm", dim{min(rows, 65535), 1, 1}, dim{256, 1, 1}, 0, out.p, ob, x.p, yp, w.p, rows, cols, ld, eps)
	default:
		o.run("kvx_rmsnorm", dim{blocks(rows, 4), 1, 1}, dim{128, 1, 1}, 0, out.p, x.p, w.p, rows, cols, eps)
	}
	return out
}

// foldNorm launches x += the fold of P's parts, then out = RMSNorm(x)
// (and ob, its bf16 copy, when not 0): kvx_frmsnorm_fold8 when sliced,
// else kvx_frmsnorm_fold. The same bits either way.
func (o *ops) foldNorm(sliced bool, out, ob, x, p cu.DevicePtr, parts int, w cu.DevicePtr, rows, cols, ld int, eps float32) {
	if sliced {
		o.run("kvx_frmsnorm_fold8", dim{8, min(rows, 65535), 1}, dim{512, 1, 1}, 0, out, ob, x, p, parts, w, rows, cols, ld, eps)
		return
	}
	o.run("kvx_frmsnorm_fold", dim{min(rows, 65535), 1, 1}, dim{1024, 1, 1}, 0, out, ob, x, p, parts, w, rows, cols, ld, eps)
}

// fnSliceRows is the most rows whose pending-fold norm runs
// kvx_frmsnorm_fold8 (a cluster of 8 blocks a row, each folding an eighth
// of the columns: a decode step's few rows on eight SMs each) rather than
// kvx_frmsnorm_fold (a block a row); fnSliceCols is the widest row it
// takes (its shared memory: FNS_MAXCOLS in kernels/fnorm.cu). Both give the
// same bits, so the choice is speed alone.
const fnSliceRows, fnSliceCols = 16, 16384

// fastNormCols is the narrowest row the fast numerics' RMSNorm
// (kernels/fnorm.cu, a block a row) takes; narrower ones (Qwen3's per-head
// norms) keep the exact kernel's warp a row. The choice depends on the
// width alone, so a row's bits do not depend on its batch.
const fastNormCols = 512

func (o *ops) RMSNorm(x, w synth.Tensor, eps float32) synth.Tensor {
	xt, wt := cudaTensor(x), cudaTensor(w)
	shape("RMSNorm gains", wt, 1, xt.c)
	return o.rmsNorm(xt, wt, xt.r, xt.c, eps)
}

var _ hf.AddNormer = (*ops)(nil)

// AddRMSNorm implements hf.AddNormer: x += y, then RMSNorm(x, w, eps), the
// values Add and RMSNorm give.
func (o *ops) AddRMSNorm(x, y, w synth.Tensor, eps float32) synth.Tensor {
	xt, yt, wt := cudaTensor(x), unfolded(y), cudaTensor(w)
	shape("AddRMSNorm addend", yt, xt.r, xt.c)
	shape("AddRMSNorm gains", wt, 1, xt.c)
	return o.addRMSNorm(xt, yt, wt, xt.r, xt.c, eps)
}

// RMSNormGroups implements hf.Ops: kernel.RMSNorm of every w.Cols()-wide
// group of each row.
func (o *ops) RMSNormGroups(x, w synth.Tensor, eps float32) synth.Tensor {
	xt, wt := cudaTensor(x), cudaTensor(w)
	if wt.r != 1 || wt.c <= 0 || xt.c%wt.c != 0 {
		panic(fmt.Sprintf("cuda: RMSNormGroups: gains %d × %d do not split rows of %d", wt.r, wt.c, xt.c))
	}
	return o.rmsNorm(xt, wt, xt.r*(xt.c/wt.c), wt.c, eps)
}

// LayerNorm implements hf.Ops: kernel.LayerNorm of every row (b may be nil).
func (o *ops) LayerNorm(x, w, b synth.Tensor, eps float32) synth.Tensor {
	xt, wt := cudaTensor(x), cudaTensor(w)
	shape("LayerNorm gains", wt, 1, xt.c)
	var bp cu.DevicePtr
	if b != nil {
		bt := cudaTensor(b)
		shape("LayerNorm biases", bt, 1, xt.c)
		bp = bt.p
	}
	if xt.r > 0 && xt.c == 0 {
		panic("cuda: LayerNorm of empty rows")
	}
	out := o.newTensor(xt.r, xt.c)
	o.run("kvx_layernorm", dim{blocks(xt.r, 4), 1, 1}, dim{128, 1, 1}, 0, out.p, xt.p, wt.p, bp, xt.r, xt.c, eps)
	return out
}

func (o *ops) Add(dst, src synth.Tensor) {
	dropBF16(dst)
	d, s := cudaTensor(dst), cudaTensor(src)
	shape("Add", s, d.r, d.c)
	g, b := flat(d.r * d.c)
	o.run("kvx_add", g, b, 0, d.p, s.p, d.r*d.c)
}

func (o *ops) Scale(x synth.Tensor, s float32) {
	dropBF16(x)
	t := cudaTensor(x)
	g, b := flat(t.r * t.c)
	o.run("kvx_scale", g, b, 0, t.p, t.r*t.c, s)
}

// AddBias implements hf.Ops: x += b on every row.
func (o *ops) AddBias(x, b synth.Tensor) {
	dropBF16(x)
	xt, bt := cudaTensor(x), cudaTensor(b)
	shape("AddBias", bt, 1, xt.c)
	g, bl := flat(xt.r * xt.c)
	o.run("kvx_add_bias", g, bl, 0, xt.p, bt.p, xt.r*xt.c, xt.c)
}

// SwiGLU is kernel.SiLU(gate) · up: with its float64 exponential (the
// cpu's bits) in the exact numerics, with float32's (fsilu_mul,
// kernels/fsilu.cuh) in the fast ones. Gate and up pending from one matmul
// (MatMuls of the gate and up weights) are folded in the same launch; lazy
// from one tiled matmul, they are that matmul's epilogue
// (pendingTiled.swiGLU).
func (o *ops) SwiGLU(gate, up synth.Tensor) synth.Tensor {
	if l := asTensor(gate).lazy; l != nil && o.fast {
		if out := l.swiGLU(asTensor(gate), asTensor(up)); out != nil {
			return out
		}
	}
	gt, ut := unfolded(gate), unfolded(up)
	shape("SwiGLU", ut, gt.r, gt.c)
	if f := gt.fold; f == nil || f != ut.fold || !o.fast {
		gt, ut = cudaTensor(gate), cudaTensor(up)
	}
	out := o.newTensor(gt.r, gt.c)
	if o.fast && gt.r > 0 {
		ld := padK(gt.c)
		out.b = o.scratch(int64(gt.r) * int64(ld) * 2)
		g, b := flat(gt.r * ld)
		if f := gt.fold; f != nil {
			o.run("kvx_fswiglu_fold", g, b, 0, out.p, out.b, f.p, f.parts, f.m, f.col(gt), f.col(ut), gt.r, gt.c, ld)
			return out
		}
		o.run("kvx_fswiglu", g, b, 0, out.p, out.b, gt.p, ut.p, gt.r, gt.c, ld)
		return out
	}
	g, b := flat(gt.r * gt.c)
	o.run("kvx_swiglu", g, b, 0, out.p, gt.p, ut.p, gt.r*gt.c, o.expFMA())
	return out
}

func (o *ops) ReLU2(x synth.Tensor) synth.Tensor {
	xt := cudaTensor(x)
	out := o.newTensor(xt.r, xt.c)
	g, b := flat(xt.r * xt.c)
	o.run("kvx_relu2", g, b, 0, out.p, xt.p, xt.r*xt.c)
	return out
}

// ropeReduce is the angle from which Go's math.Sincos reduces its argument
// with Payne-Hanek (math's reduceThreshold); the kernels port only the
// reduction below it, and RoPE computes larger angles' tables on the host.
const ropeReduce = 1 << 29

// RoPE is kernel.RoPE of every row at its segment's position: the
// frequencies come from the host (math.Pow, or InvFreq), the cosines and
// sines of a row's angles from go_sincos (Go's math.Sincos) in one table
// per call, then the rotation.
func (o *ops) RoPE(x synth.Tensor, segs []synth.Seg, stride int, r synth.RoPE) {
	dropBF16(x)
	xt := cudaTensor(x)
	if !ropeCheck("RoPE", xt, segs, stride, r) {
		return
	}
	cs, sn := o.ropeTable(segs, r)
	o.ropeApply(xt, cs, sn, xt.r, stride, r)
}

// ropeCheck panics unless x's rows are segs' and every head of r.Dim
// (stride apart) fits x's columns, as kernel.RoPE's slicing demands; it
// reports whether there is anything to rotate.
func ropeCheck(name string, xt *tensor, segs []synth.Seg, stride int, r synth.RoPE) bool {
	rows := 0
	for _, sg := range segs {
		rows += sg.Rows
	}
	if rows != xt.r {
		panic(fmt.Sprintf("cuda: %s: segments cover %d rows of %d", name, rows, xt.r))
	}
	if (r.Theta == 0 && len(r.InvFreq) == 0) || r.Dim <= 0 || xt.r == 0 {
		return false
	}
	if stride <= 0 {
		panic(fmt.Sprintf("cuda: %s: stride must be > 0", name))
	}
	half := r.Dim / 2
	if len(r.InvFreq) > 0 && len(r.InvFreq) < half {
		panic(fmt.Sprintf("cuda: %s: %d frequencies for dim %d", name, len(r.InvFreq), r.Dim))
	}
	// Every head must fit (as kernel.RoPE's slicing demands), which
	// also means stride >= Dim: heads never overlap.
	if xt.c > 0 && (xt.c-1)/stride*stride+r.Dim > xt.c {
		panic(fmt.Sprintf("cuda: %s: heads of %d (stride %d) run past %d columns", name, r.Dim, stride, xt.c))
	}
	return xt.c > 0 && half > 0
}

// ropeTable returns the cosine and sine tables (rows × Dim/2 float32) of
// segs' positions under r, made once a step.
func (o *ops) ropeTable(segs []synth.Seg, r synth.RoPE) (cs, sn cu.DevicePtr) {
	m, key := o.memoFor(segs), ropeKeyOf(r)
	if t, ok := m.rope[key]; ok {
		return t[0], t[1]
	}
	half := r.Dim / 2
	freq := make([]float64, half)
	maxFreq, finite := 0.0, true
	for i := range freq {
		if len(r.InvFreq) > 0 {
			freq[i] = r.InvFreq[i]
		} else {
			freq[i] = math.Pow(r.Theta, -float64(2*i)/float64(r.Dim))
		}
		finite = finite && !math.IsNaN(freq[i]) && !math.IsInf(freq[i], 0)
		maxFreq = max(maxFreq, math.Abs(freq[i]))
	}
	var pos []int64
	maxPos := 0
	for _, sg := range segs {
		for j := range sg.Rows {
			pos = append(pos, int64(sg.Pos+j))
			maxPos = max(maxPos, sg.Pos+j)
		}
	}
	rows := len(pos)
	if !finite || float64(maxPos)*maxFreq >= ropeReduce {
		cs, sn = o.ropeHost(pos, freq, r.Scale)
	} else {
		cs, sn = o.scratch(int64(rows*half)*4), o.scratch(int64(rows*half)*4)
		g, b := flat(rows * half)
		has := 0
		if r.Scale != 0 {
			has = 1
		}
		o.run("kvx_rope_table", g, b, 0, cs, sn, put(o, pos), put(o, freq), rows, half,
			int64(math.Float64bits(r.Scale)), has)
	}
	if m.rope == nil {
		m.rope = map[ropeKey][2]cu.DevicePtr{}
	}
	m.rope[key] = [2]cu.DevicePtr{cs, sn}
	return cs, sn
}

// ropeApply rotates every row of x by the tables cs, sn.
func (o *ops) ropeApply(xt *tensor, cs, sn cu.DevicePtr, rows, stride int, r synth.RoPE) {
	il := 0
	if r.Interleaved {
		il = 1
	}
	g, b := perRow(rows, 128)
	o.run("kvx_rope_apply", g, b, 0, xt.p, cs, sn, rows, xt.c, stride, r.Dim, il)
}

// ropeHost computes the cosine and sine tables on the host, as
// kernel.RoPE does, and uploads them.
func (o *ops) ropeHost(pos []int64, freq []float64, scale float64) (cs, sn cu.DevicePtr) {
	c := make([]float32, len(pos)*len(freq))
	s := make([]float32, len(c))
	for r, p := range pos {
		for i, f := range freq {
			si, co := math.Sincos(float64(p) * f)
			if scale != 0 {
				si, co = si*scale, co*scale
			}
			c[r*len(freq)+i], s[r*len(freq)+i] = float32(co), float32(si)
		}
	}
	return put(o, c), put(o, s)
}

// routeDone downloads a routing kernel's kk experts and weights per row and
// groups them by expert.
func (o *ops) routeDone(rows, experts, kk int, ex, wt cu.DevicePtr) *routing {
	r := &routing{rows: rows, of: make([][]int, experts), w: make([][]float32, experts)}
	if o.err != nil {
		return r
	}
	e := make([]int32, rows*kk)
	w := make([]float32, rows*kk)
	o.fail(download(e, ex))
	o.fail(download(w, wt))
	if o.err != nil {
		return r
	}
	for row := range rows {
		for j := range kk {
			x := e[row*kk+j]
			r.of[x] = append(r.of[x], row)
			r.w[x] = append(r.w[x], w[row*kk+j])
		}
	}
	return r
}

// Route is kernel.Route of every row, on the GPU; the choice (a few
// integers per row) comes back to the host.
func (o *ops) Route(logits synth.Tensor, k int) synth.Routing {
	lt := cudaTensor(logits)
	if lt.c == 0 {
		panic("cuda: Route over no experts")
	}
	kk := max(1, min(k, lt.c))
	ex, wt := o.scratch(int64(lt.r*kk)*4), o.scratch(int64(lt.r*kk)*4)
	fma := o.expFMA()
	o.run("kvx_route", dim{lt.r, 1, 1}, dim{128, 1, 1}, lt.c*5, lt.p, lt.r, lt.c, kk, ex, wt, fma)
	return o.routeDone(lt.r, lt.c, kk, ex, wt)
}

// RouteGrouped implements hf.Ops: kernel.GroupedRoute.Route of every row
// with the correction bias (1 × experts, or nil).
func (o *ops) RouteGrouped(logits, bias synth.Tensor, g hf.GroupedRoute) synth.Routing {
	lt := cudaTensor(logits)
	var bp cu.DevicePtr
	if bias != nil {
		bt := cudaTensor(bias)
		shape("RouteGrouped bias", bt, 1, lt.c)
		bp = bt.p
	}
	if g.Groups <= 0 || lt.c%g.Groups != 0 || lt.c/g.Groups < 2 {
		panic(fmt.Sprintf("cuda: RouteGrouped: %d experts in %d groups: want groups of at least 2", lt.c, g.Groups))
	}
	per := lt.c / g.Groups
	kk := max(1, min(g.K, per*min(g.TopKGroup, g.Groups)))
	allow := max(1, min(g.TopKGroup, g.Groups))
	norm := 0
	if g.Norm {
		norm = 1
	}
	ex, wt := o.scratch(int64(lt.r*kk)*4), o.scratch(int64(lt.r*kk)*4)
	fma := o.expFMA()
	shmem := (2*lt.c+g.Groups)*4 + lt.c + g.Groups
	o.run("kvx_route_grouped", dim{lt.r, 1, 1}, dim{128, 1, 1}, shmem, lt.p, bp, lt.r, lt.c, g.Groups, allow, kk, norm,
		g.Scale, ex, wt, fma)
	return o.routeDone(lt.r, lt.c, kk, ex, wt)
}

func (o *ops) Gather(x synth.Tensor, r synth.Routing, e int) synth.Tensor {
	rows := cudaRouting(r).of[e]
	if len(rows) == 0 {
		return nil
	}
	return o.Rows(x, rows)
}

func (o *ops) AddRouted(acc, y synth.Tensor, r synth.Routing, e int) {
	dropBF16(acc)
	at, yt, rt := cudaTensor(acc), cudaTensor(y), cudaRouting(r)
	rows := rt.of[e]
	shape("AddRouted", yt, len(rows), at.c)
	if len(rows) == 0 || at.c == 0 {
		return
	}
	idx := make([]int32, len(rows))
	for i, row := range rows {
		idx[i] = int32(row)
	}
	g, b := perRow(len(rows), 256)
	o.run("kvx_axpy_rows", g, b, 0, at.p, yt.p, put(o, idx), put(o, rt.w[e]), len(rows), at.c)
}

// Argmax is kernel.Argmax of every row (zeros after an earlier failure).
func (o *ops) Argmax(x synth.Tensor) []int32 {
	xt := cudaTensor(x)
	out := make([]int32, xt.r)
	if xt.r == 0 || o.err != nil {
		return out
	}
	const chunk = 256 * 32 // AM_CHUNK of kernels/dense.cu
	chunks := blocks(xt.c, chunk)
	pv, pi := o.scratch(int64(xt.r)*int64(chunks)*4), o.scratch(int64(xt.r)*int64(chunks)*8)
	p := o.scratch(int64(xt.r) * 4)
	o.run("kvx_argmax_part", dim{chunks, xt.r, 1}, dim{256, 1, 1}, 0, xt.p, xt.r, xt.c, pv, pi)
	o.run("kvx_argmax_final", dim{xt.r, 1, 1}, dim{256, 1, 1}, 0, pv, pi, chunks, p)
	if o.err == nil {
		o.fail(download(out, p))
	}
	return out
}

// expFMA says which of Go's two amd64 math.Exp paths this process takes
// (1: the FMA one), the one the kernels' go_exp must follow; it fails the
// ops when math.Exp is neither (another architecture's).
func (o *ops) expFMA() int {
	mode, err := goExpMode()
	o.fail(err)
	return mode
}

// goExpMode is detectExp's answer, found once per process.
func goExpMode() (int, error) {
	expOnce.Do(func() { expMode, expErr = detectExp() })
	return expMode, expErr
}

var (
	expOnce sync.Once
	expMode int
	expErr  error
)

// detectExp compares math.Exp with both emulated paths on a sweep of
// arguments.
func detectExp() (int, error) {
	fmaOK, plainOK := true, true
	for i := range 20000 {
		x := -745.5 + float64(i)*0.0745 + float64(i%7)*1e-9
		e := math.Float64bits(math.Exp(x))
		fmaOK = fmaOK && e == math.Float64bits(emulExp(x, true))
		plainOK = plainOK && e == math.Float64bits(emulExp(x, false))
	}
	switch {
	case fmaOK:
		return 1, nil
	case plainOK:
		return 0, nil
	}
	return 0, errors.New("cuda: this build's math.Exp is not amd64's, which the kernels reproduce")
}

// emulExp is math/exp_amd64.s in Go: the FMA path or the plain one.
func emulExp(x float64, fma bool) float64 {
	const (
		log2e    = 1.4426950408889634073599246810018920
		ln2u     = 0.69314718055966295651160180568695068359375
		ln2l     = 0.28235290563031577122588448175013436025525412068e-12
		overflow = 7.09782712893384e+02
	)
	c := [...]float64{2.4801587301587301587e-5, 1.9841269841269841270e-4, 1.3888888888888888889e-3,
		8.3333333333333333333e-3, 4.1666666666666666667e-2, 1.6666666666666666667e-1, 0.5, 1.0}
	if math.Float64bits(x)&^(1<<63) >= 0x7ff0000000000000 {
		if math.IsInf(x, -1) {
			return 0
		}
		return x
	}
	if x > overflow {
		return math.Inf(1)
	}
	e := int32(math.MinInt32) // cvtsd2si's answer out of range
	if t := math.RoundToEven(float64(log2e * x)); t >= math.MinInt32 && t <= math.MaxInt32 {
		e = int32(t)
	}
	y := float64(e)
	var r, p float64
	if fma {
		r = math.FMA(-y, ln2u, x)
		r = math.FMA(-y, ln2l, r)
		r = float64(r * 0.0625)
		p = c[0]
		for _, k := range c[1:] {
			p = math.FMA(p, r, k)
		}
		r = float64(r * p)
		for range 3 {
			p = float64(r + 2)
			r = float64(r * p)
		}
		p = float64(r + 2)
		r = math.FMA(r, p, 1)
	} else {
		r = float64(x - float64(ln2u*y))
		r = float64(r - float64(ln2l*y))
		r = float64(r * 0.0625)
		p = c[0]
		for _, k := range c[1:] {
			p = float64(float64(p*r) + k)
		}
		r = float64(r * p)
		for range 4 {
			p = float64(2 + r)
			r = float64(r * p)
		}
		r = float64(r + 1)
	}
	b := e + 0x3ff
	if b <= 0 {
		if b < -52 {
			return 0
		}
		r = float64(r * math.Float64frombits(uint64(b+0x3fe)<<52))
		return float64(r * math.Float64frombits(1<<52))
	}
	if b >= 0x7ff {
		return math.Inf(1)
	}
	return float64(r * math.Float64frombits(uint64(b)<<52))
}
