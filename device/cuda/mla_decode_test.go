//go:build cuda && cgo

package cuda

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"gorgonia.org/cu"

	"github.com/kvx-dev/kvx/device/cpu/kernel"
)

// pagedRig is a paged pool of rows (rowBytes of bf16 values at offset in a
// row of stride bytes) for sequences of the given lengths, their blocks in a
// shuffled order, filled on the device with values in [-1, 1).
type pagedRig struct {
	v            pagedView
	tables, ctxs cu.DevicePtr
	table        [][]int32
	ctx          []int
	maxBlocks    int
}

func newPagedRig(t testing.TB, o *ops, ctx []int, tpb int, stride, offset int64, seed uint64) *pagedRig {
	t.Helper()
	r := &pagedRig{ctx: ctx, maxBlocks: blocks(slices.Max(ctx), tpb)}
	nblocks := len(ctx) * r.maxBlocks
	r.v = pagedView{blockBytes: int64(tpb) * stride, stride: stride, offset: offset, tokensPerBlock: tpb}
	perm := rand.New(rand.NewPCG(seed, 2)).Perm(nblocks)
	flat := make([]int32, 0, nblocks)
	for b := range ctx {
		row := make([]int32, r.maxBlocks)
		for i := range row {
			row[i] = int32(perm[b*r.maxBlocks+i])
		}
		r.table = append(r.table, row)
		flat = append(flat, row...)
	}
	lens := make([]int64, len(ctx))
	for i, c := range ctx {
		lens[i] = int64(c)
	}
	on(t, o, func() {
		p, err := o.g.alloc(int64(nblocks) * r.v.blockBytes)
		if err != nil {
			o.fail(err)
			return
		}
		*o.weights = append(*o.weights, p)
		r.v.base = p
		o.run("kvx_fill_bf16", dim{4096, 1, 1}, dim{256, 1, 1}, 0, p, int64(nblocks)*r.v.blockBytes/2, int64(seed))
		r.tables = o.weightInts(flat)
		r.ctxs = o.weightInt64s(lens)
	})
	return r
}

// rows reads back sequence b's first n rows of width values as float32.
func (r *pagedRig) rows(pool []byte, b, n, width int) [][]float32 {
	out := make([][]float32, n)
	for j := range n {
		at := int64(r.table[b][j/r.v.tokensPerBlock])*r.v.blockBytes + int64(j%r.v.tokensPerBlock)*r.v.stride + r.v.offset
		row := make([]float32, width)
		for i := range row {
			row[i] = kernel.Float32FromBF16(uint16(pool[at+2*int64(i)]) | uint16(pool[at+2*int64(i)+1])<<8)
		}
		out[j] = row
	}
	return out
}

func (r *pagedRig) download(t testing.TB, o *ops) []byte {
	pool := make([]byte, int64(len(r.ctx)*r.maxBlocks)*r.v.blockBytes)
	on(t, o, func() { o.fail(download(pool, r.v.base)) })
	return pool
}

// bf16Vals returns n normal values (times scale) rounded to bf16: the bits
// to upload and the float32 values they stand for.
func bf16Vals(rng *rand.Rand, n int, scale float64) ([]uint16, []float32) {
	bits, vals := make([]uint16, n), make([]float32, n)
	for i := range bits {
		bits[i] = kernel.BF16FromFloat32(float32(rng.NormFloat64() * scale))
		vals[i] = kernel.Float32FromBF16(bits[i])
	}
	return bits, vals
}

func (o *ops) weightU16s(v []uint16) cu.DevicePtr {
	p, err := o.g.alloc(int64(len(v)) * 2)
	o.fail(err)
	if err == nil {
		*o.weights = append(*o.weights, p)
		o.fail(upload(p, v))
	}
	return p
}

// mlaRef is absorbed MLA attention in float64: q heads × 576 over rows
// (each 576 values, the value its first 512); heads × 512.
func mlaRef(q []float32, rows [][]float32, heads int, scale float64) []float64 {
	out := make([]float64, heads*mlaDV)
	s := make([]float64, len(rows))
	for h := range heads {
		qh := q[h*mlaDK : (h+1)*mlaDK]
		m := math.Inf(-1)
		for j, row := range rows {
			var d float64
			for i, x := range qh {
				d += float64(x) * float64(row[i])
			}
			s[j] = d * scale
			m = max(m, s[j])
		}
		var l float64
		for j := range rows {
			s[j] = math.Exp(s[j] - m)
			l += s[j]
		}
		o := out[h*mlaDV : (h+1)*mlaDV]
		for j, row := range rows {
			for i := range o {
				o[i] += s[j] / l * float64(row[i])
			}
		}
	}
	return out
}

// mlaTol is how far the fast MLA kernel may be from the float64 reference,
// with values in [-1, 1): it rounds the probabilities to bf16 (relative
// error 2^-9 each, and its sum l is of the rounded ones), so an output
// moves by at most about 2 · 2^-9 of the values' largest magnitude; the
// float32 sums add far less.
const mlaTol = 5e-3

// TestMLADecode: the fast MLA decode kernel, dense and sparse, agrees with
// absorbed attention in float64 on the same bf16 rows to mlaTol, for 64 and
// 128 heads, ragged lengths (not multiples of the tile, the split or the
// block), one split and many, rows at an offset inside a wider row.
func TestMLADecode(t *testing.T) {
	o := newTestOps(t)
	type tc struct {
		heads, tpb, split, topk int
		ctx                     []int
	}
	for _, c := range []tc{
		{heads: 64, tpb: 64, split: 64, ctx: []int{1}},
		{heads: 128, tpb: 64, split: 64, ctx: []int{100, 1000}},
		{heads: 128, tpb: 16, split: 256, ctx: []int{777, 33, 2049}},
		{heads: 128, tpb: 64, split: 4096, ctx: []int{3000}},
		{heads: 128, tpb: 64, split: 64, topk: 256, ctx: []int{1500, 300, 100}},
		{heads: 64, tpb: 32, split: 128, topk: 2048, ctx: []int{5000}},
	} {
		t.Run(fmt.Sprintf("h%d_tpb%d_split%d_topk%d_ctx%v", c.heads, c.tpb, c.split, c.topk, c.ctx), func(t *testing.T) {
			batch := len(c.ctx)
			const stride, offset = 1152 + 64, 32 // the latent at an offset inside a wider row
			r := newPagedRig(t, o, c.ctx, c.tpb, stride, offset, 7)
			rng := rand.New(rand.NewPCG(11, uint64(c.heads)))
			qbits, q := bf16Vals(rng, batch*c.heads*mlaDK, 1)
			scale := float32(1 / math.Sqrt(192))
			// sel: for each sequence min(ctx, topk) ascending positions drawn at random
			var sel [][]int
			var selFlat []int32
			for _, n := range c.ctx {
				k := min(n, c.topk)
				s := rand.New(rand.NewPCG(uint64(n), 3)).Perm(n)[:k]
				slices.Sort(s)
				sel = append(sel, s)
				row := make([]int32, c.topk)
				for i := range row {
					row[i] = -1 // never read
				}
				for i, p := range s {
					row[i] = int32(p)
				}
				selFlat = append(selFlat, row...)
			}
			maxN := slices.Max(c.ctx)
			if c.topk > 0 {
				maxN = min(maxN, c.topk)
			}
			var got []float32
			on(t, o, func() {
				qd := o.weightU16s(qbits)
				var seld cu.DevicePtr
				if c.topk > 0 {
					seld = o.weightInts(selFlat)
				}
				out := o.mlaDecode(qd, r.v, r.tables, r.ctxs, seld, c.topk, batch, c.heads, r.maxBlocks, maxN, c.split, scale)
				got = make([]float32, batch*c.heads*mlaDV)
				o.fail(download(got, out.p))
			})
			pool := r.download(t, o)
			worst := 0.0
			for b, n := range c.ctx {
				rows := r.rows(pool, b, n, mlaDK)
				if c.topk > 0 {
					picked := make([][]float32, len(sel[b]))
					for i, p := range sel[b] {
						picked[i] = rows[p]
					}
					rows = picked
				}
				want := mlaRef(q[b*c.heads*mlaDK:(b+1)*c.heads*mlaDK], rows, c.heads, float64(scale))
				for i, w := range want {
					worst = max(worst, math.Abs(float64(got[b*c.heads*mlaDV+i])-w))
				}
			}
			if !(worst <= mlaTol) {
				t.Errorf("largest difference %.3g from float64 attention, want <= %g", worst, mlaTol)
			}
			t.Logf("largest difference from float64 attention: %.3g", worst)
		})
	}
}

// TestDSAIndexScores: the indexer scan on tensor cores equals the ReLU-
// weighted sum of dot products in float64 on the same bf16 values to float32
// rounding (relative to the sum of the terms' magnitudes).
func TestDSAIndexScores(t *testing.T) {
	o := newTestOps(t)
	ctx := []int{1, 1000, 3000, 17}
	const stride, offset = 256 + 32, 16
	r := newPagedRig(t, o, ctx, 64, stride, offset, 9)
	batch, maxCtx := len(ctx), slices.Max(ctx)
	rng := rand.New(rand.NewPCG(13, 1))
	qbits, q := bf16Vals(rng, batch*dsaIndexHeads*dsaIndexDim, 1)
	w := randVals(rng, batch*dsaIndexHeads, 0.1)
	got := make([]float32, batch*maxCtx)
	on(t, o, func() {
		s := o.dsaScores(o.weightU16s(qbits), put(o, w), r.v, r.tables, r.ctxs, batch, r.maxBlocks, maxCtx)
		o.fail(download(got, s))
	})
	pool := r.download(t, o)
	worst := 0.0
	for b, n := range ctx {
		rows := r.rows(pool, b, n, dsaIndexDim)
		for j, k := range rows {
			var want, mag float64
			for h := range dsaIndexHeads {
				var d float64
				for i, x := range k {
					d += float64(q[(b*dsaIndexHeads+h)*dsaIndexDim+i]) * float64(x)
				}
				want += float64(w[b*dsaIndexHeads+h]) * max(d, 0)
				mag += math.Abs(float64(w[b*dsaIndexHeads+h])) * math.Abs(d)
			}
			worst = max(worst, math.Abs(float64(got[b*maxCtx+j])-want)/(mag+1e-30))
		}
	}
	if !(worst <= 1e-5) {
		t.Errorf("largest relative difference %.3g from float64, want <= 1e-5", worst)
	}
	t.Logf("largest relative difference from float64: %.3g", worst)
}

// topKRef is the top-k by score, ties to the lower position, in ascending
// position order.
func topKRef(s []float32, k int) []int32 {
	idx := make([]int32, len(s))
	for i := range idx {
		idx[i] = int32(i)
	}
	slices.SortStableFunc(idx, func(a, b int32) int {
		switch {
		case s[a] > s[b]:
			return -1
		case s[a] < s[b]:
			return 1
		}
		return 0
	})
	idx = idx[:min(k, len(idx))]
	slices.Sort(idx)
	return idx
}

// TestDSATopK: the radix-select top-k picks exactly topKRef's positions:
// fewer positions than k, exactly k, many ties at the threshold (scores on
// a coarse grid), negative scores, and a long row.
func TestDSATopK(t *testing.T) {
	o := newTestOps(t)
	const k = 2048
	rng := rand.New(rand.NewPCG(17, 1))
	lens := []int{100, k, k + 1, 5000, 3000, 131072}
	stride := slices.Max(lens)
	scores := make([]float32, len(lens)*stride)
	for b, n := range lens {
		for j := range n {
			x := rng.NormFloat64()
			switch b % 3 {
			case 1: // ties: a grid of 41 values
				x = math.Round(x*10) / 10
			case 2: // all negative
				x = -math.Abs(x) - 1
			}
			scores[b*stride+j] = float32(x)
		}
	}
	ctx := make([]int64, len(lens))
	for i, n := range lens {
		ctx[i] = int64(n)
	}
	got := make([]int32, len(lens)*k)
	on(t, o, func() {
		sel := o.dsaTopK(put(o, scores), put(o, ctx), len(lens), stride, k)
		o.fail(download(got, sel))
	})
	for b, n := range lens {
		want := topKRef(scores[b*stride:b*stride+n], k)
		if g := got[b*k : b*k+len(want)]; !slices.Equal(g, want) {
			i := 0
			for i < len(want) && g[i] == want[i] {
				i++
			}
			t.Errorf("len %d: top-%d differs first at %d: got %d, want %d", n, k, i, g[i], want[i])
		}
	}
}

// timeOps runs f n times on the context's goroutine between two
// synchronizations and returns the time. The arena is reset after every
// call (its memory is reused in launch order, all on the null stream), so
// after a warm-up nothing is allocated inside the loop.
func timeOps(b *testing.B, o *ops, n int, f func()) time.Duration {
	var d time.Duration
	on(b, o, func() {
		o.fail(o.g.sync())
		start := time.Now()
		for range n {
			f()
			o.fail(o.ar.reset())
		}
		o.fail(o.g.sync())
		d = time.Since(start)
	})
	return d
}

// mlaBench is one DeepSeek-V3 MLA decode batch: 128 heads, a bf16 latent
// cache of 64-token blocks in a shuffled order, the absorbed bf16 query.
type mlaBench struct {
	r     *pagedRig
	q     cu.DevicePtr
	batch int
	ctx   int
}

const mlaBenchHeads = 128

var mlaScale = float32(1 / math.Sqrt(192))

func newMLABench(b *testing.B, o *ops, batch, ctx int) *mlaBench {
	lens := make([]int, batch)
	for i := range lens {
		lens[i] = ctx
	}
	m := &mlaBench{r: newPagedRig(b, o, lens, 64, mlaDK*2, 0, 1), batch: batch, ctx: ctx}
	on(b, o, func() {
		n := int64(batch) * mlaBenchHeads * mlaDK
		p, err := o.g.alloc(n * 2)
		if err != nil {
			o.fail(err)
			return
		}
		*o.weights = append(*o.weights, p)
		o.run("kvx_fill_bf16", dim{1024, 1, 1}, dim{256, 1, 1}, 0, p, n, int64(5))
		m.q = p
	})
	return m
}

func (m *mlaBench) dense(o *ops) {
	o.mlaDecode(m.q, m.r.v, m.r.tables, m.r.ctxs, 0, 0, m.batch, mlaBenchHeads, m.r.maxBlocks, m.ctx,
		mlaSplitFor(m.batch, mlaBenchHeads, m.ctx), mlaScale)
}

// mlaFlops is the multiply-adds (× 2) of absorbed MLA decode over n
// positions: Q·K^T over 576 dims and P·V over 512, for every head.
func mlaFlops(batch, n int) float64 {
	return 2 * float64(batch) * float64(n) * mlaBenchHeads * (mlaDK + mlaDV)
}

// BenchmarkMLADecode measures the fast MLA decode kernel at DeepSeek-V3's
// shape (128 heads, latent 512 + rope 64, absorbed, bf16 paged latent cache
// of 64-token blocks) and reports the latent bytes read per second and the
// tensor-core rate. scripts/cuda-bench.py sets it against PyTorch's
// absorbed MLA on contiguous latent and the copy bandwidth of the same run.
func BenchmarkMLADecode(b *testing.B) {
	for _, ctx := range []int{4 << 10, 32 << 10, 128 << 10} {
		for _, batch := range []int{1, 16, 64} {
			b.Run(fmt.Sprintf("ctx=%d/batch=%d", ctx, batch), func(b *testing.B) {
				o := newTestOps(b)
				m := newMLABench(b, o, batch, ctx)
				timeOps(b, o, 3, func() { m.dense(o) })
				b.ResetTimer()
				d := timeOps(b, o, b.N, func() { m.dense(o) })
				b.ReportMetric(float64(batch)*float64(ctx)*mlaDK*2*float64(b.N)/d.Seconds()/1e9, "GB/s")
				b.ReportMetric(mlaFlops(batch, ctx)*float64(b.N)/d.Seconds()/1e12, "TFLOP/s")
			})
		}
	}
}

// dsaTopKCount is DeepSeek-V3.2's index_topk.
const dsaTopKCount = 2048

// BenchmarkDSA measures one DSA decode step of attention at DeepSeek-V3.2's
// shapes against dense MLA decode (BenchmarkMLADecode's kernel) on the same
// latent cache in the same run: the indexer scan (64 index heads × 128
// dims, bf16 index keys in their own paged pool), the top-2048, and sparse
// MLA over the selected positions. It reports each part's time per call
// (µs) and dense-µs / dsa-µs as speedup.
func BenchmarkDSA(b *testing.B) {
	for _, ctx := range []int{32 << 10, 128 << 10} {
		for _, batch := range []int{1, 16, 64} {
			b.Run(fmt.Sprintf("ctx=%d/batch=%d", ctx, batch), func(b *testing.B) {
				o := newTestOps(b)
				m := newMLABench(b, o, batch, ctx)
				ix := newPagedRig(b, o, m.r.ctx, 64, dsaIndexDim*2, 0, 2)
				rng := rand.New(rand.NewPCG(3, 3))
				qbits, _ := bf16Vals(rng, batch*dsaIndexHeads*dsaIndexDim, 1)
				w := randVals(rng, batch*dsaIndexHeads, 0.1)
				var iq, iw, scores, sel cu.DevicePtr
				on(b, o, func() {
					iq = o.weightU16s(qbits)
					iw = o.weightF32s(w)
				})
				index := func() {
					scores = o.dsaScores(iq, iw, ix.v, ix.tables, ix.ctxs, batch, ix.maxBlocks, ctx)
				}
				topk := func() { sel = o.dsaTopK(scores, ix.ctxs, batch, ctx, dsaTopKCount) }
				split := mlaSplitFor(batch, mlaBenchHeads, dsaTopKCount)
				sparse := func() {
					o.mlaDecode(m.q, m.r.v, m.r.tables, m.r.ctxs, sel, dsaTopKCount, batch, mlaBenchHeads, m.r.maxBlocks,
						dsaTopKCount, split, mlaScale)
				}
				all := func() { index(); topk(); sparse() }
				// The parts timed alone keep their inputs: scores and sel
				// are made once outside the arena's reset.
				var keptScores, keptSel cu.DevicePtr
				on(b, o, func() {
					var err error
					if keptScores, err = o.g.alloc(int64(batch) * int64(ctx) * 4); err != nil {
						o.fail(err)
						return
					}
					if keptSel, err = o.g.alloc(int64(batch) * dsaTopKCount * 4); err != nil {
						o.fail(err)
						return
					}
					*o.weights = append(*o.weights, keptScores, keptSel)
					index()
					o.fail(cu.MemcpyDtoD(keptScores, scores, int64(batch)*int64(ctx)*4))
					sel = o.dsaTopK(keptScores, ix.ctxs, batch, ctx, dsaTopKCount)
					o.fail(cu.MemcpyDtoD(keptSel, sel, int64(batch)*dsaTopKCount*4))
					o.fail(o.ar.reset())
				})
				for _, f := range []func(){all, func() { m.dense(o) }} {
					timeOps(b, o, 2, f)
				}
				b.ResetTimer()
				n := b.N
				us := func(d time.Duration) float64 { return d.Seconds() * 1e6 / float64(n) }
				tDense := us(timeOps(b, o, n, func() { m.dense(o) }))
				tAll := us(timeOps(b, o, n, all))
				tIndex := us(timeOps(b, o, n, index))
				tTopK := us(timeOps(b, o, n, func() { o.dsaTopK(keptScores, ix.ctxs, batch, ctx, dsaTopKCount) }))
				sel = keptSel
				tSparse := us(timeOps(b, o, n, sparse))
				b.ReportMetric(tDense, "dense-us")
				b.ReportMetric(tAll, "dsa-us")
				b.ReportMetric(tIndex, "index-us")
				b.ReportMetric(tTopK, "topk-us")
				b.ReportMetric(tSparse, "sparse-us")
				b.ReportMetric(tDense/tAll, "speedup")
			})
		}
	}
}

func (o *ops) weightF32s(v []float32) cu.DevicePtr {
	p, err := o.g.alloc(int64(len(v)) * 4)
	o.fail(err)
	if err == nil {
		*o.weights = append(*o.weights, p)
		o.fail(upload(p, v))
	}
	return p
}
