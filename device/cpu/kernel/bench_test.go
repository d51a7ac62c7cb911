package kernel

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/kvx-dev/kvx/device/kernelspec"
)

// Benchmarks. Decode = one query at the end of a ctx-token context; prefill
// = a chunk of 64 queries ending at ctx. Layouts: "paged" = 16 tokens per
// block in shuffled physical blocks; "contig" = the same kernel on one block
// holding the whole context; "dense" = the float32 dense reference (K/V
// already rounded). Run the ratio at -cpu 1 (the kernels parallelize over
// heads, the dense reference does not).

var benchCtx = []int{1 << 10, 1 << 14}

func ctxName(n int) string { return fmt.Sprintf("ctx=%dk", n>>10) }

// benchPaged makes a view for ctx tokens: tpb 16 shuffled, or one block.
func benchPaged(r *rand.Rand, rowBytes, ctx int, contiguous bool) Paged {
	if contiguous {
		return newPaged(r, layout{tpb: ctx, perm: []int{0}}, rowBytes)
	}
	nb := (ctx + 15) / 16
	return newPaged(r, layout{tpb: 16, perm: r.Perm(nb)}, rowBytes)
}

var benchGQA = kernelspec.GQA{Heads: 8, KVHeads: 2, HeadDim: 64, Dtype: kernelspec.BF16}

// fillGQA writes rows 0..len(k)/kw-1 without attending.
func fillGQA(g kernelspec.GQA, kv Paged, k, v []float32) {
	kw, rb := g.KVHeads*g.HeadDim, g.RowBytes()
	for t := 0; t < len(k)/kw; t++ {
		row := kv.rowAt(kv.Stride, rb, t)
		encodeRow(g.Dtype, row, k[t*kw:(t+1)*kw])
		encodeRow(g.Dtype, row[kw*g.Dtype.Size():], v[t*kw:(t+1)*kw])
	}
}

func benchGQAForward(b *testing.B, ctx, n int) {
	g := benchGQA
	r := rand.New(rand.NewPCG(1, 2))
	in := newGQAInputs(r, g, ctx)
	qw, kw := g.Heads*g.HeadDim, g.KVHeads*g.HeadDim
	pos := ctx - n
	for _, mode := range []string{"paged", "contig", "dense"} {
		b.Run(mode, func(b *testing.B) {
			out := make([]float32, n*qw)
			q := in.q[pos*qw:]
			if mode == "dense" {
				k := append([]float32(nil), in.k...)
				v := append([]float32(nil), in.v...)
				Round(g.Dtype, k)
				Round(g.Dtype, v)
				b.ResetTimer()
				for range b.N {
					denseGQA(g, pos, q, k, v, out)
				}
			} else {
				kv := benchPaged(r, g.RowBytes(), ctx, mode == "contig")
				fillGQA(g, kv, in.k, in.v)
				b.ResetTimer()
				for range b.N {
					if err := GQA(g, kv, pos, q, in.k[pos*kw:], in.v[pos*kw:], out); err != nil {
						b.Fatal(err)
					}
				}
			}
			b.ReportMetric(float64(n)*float64(b.N)/b.Elapsed().Seconds(), "tok/s")
		})
	}
}

func BenchmarkGQADecode(b *testing.B) {
	for _, ctx := range benchCtx {
		b.Run(ctxName(ctx), func(b *testing.B) { benchGQAForward(b, ctx, 1) })
	}
}

func BenchmarkGQAPrefill(b *testing.B) {
	for _, ctx := range benchCtx {
		b.Run(ctxName(ctx)+"/chunk=64", func(b *testing.B) { benchGQAForward(b, ctx, 64) })
	}
}

var (
	benchMLA = kernelspec.MLA{Heads: 8, KVLoraRank: 64, QKNopeHeadDim: 32, QKRopeHeadDim: 16, VHeadDim: 32, Dtype: kernelspec.BF16}
	benchIdx = kernelspec.Indexer{Heads: 4, HeadDim: 32, TopK: 256}
)

// fillMLA writes the latent (and index key) rows 0..T-1 without attending.
func fillMLA(c mlaCase, lat, idx *Paged) {
	m := c.m
	R, P := m.KVLoraRank, m.QKRopeHeadDim
	for t := 0; t < c.tokens(); t++ {
		row := lat.rowAt(lat.Stride, m.RowBytes(), t)
		encodeRow(m.Dtype, row, c.in.CKV[t*R:(t+1)*R])
		encodeRow(m.Dtype, row[R*m.Dtype.Size():], c.in.KPE[t*P:(t+1)*P])
		if idx != nil {
			QuantizeIndexKey(idx.rowAt(idx.Stride, c.x.RowBytes(), t), c.ix.K[t*c.x.HeadDim:(t+1)*c.x.HeadDim])
		}
	}
}

func benchMLAForward(b *testing.B, sparse bool, ctx, n int) {
	r := rand.New(rand.NewPCG(3, 4))
	c := newMLACase(r, benchMLA, benchIdx, ctx)
	m := c.m
	pos := ctx - n
	modes := []string{"paged", "contig", "dense"}
	if sparse {
		modes = modes[:2]
	}
	for _, mode := range modes {
		b.Run(mode, func(b *testing.B) {
			out := make([]float32, n*m.Heads*m.VHeadDim)
			in, ix := c.slice(pos, ctx)
			if mode == "dense" {
				din, _ := c.dense(pos)
				cl, kpe := mlaDenseLatents(m, din)
				all := make([]int32, ctx)
				for j := range all {
					all[j] = int32(j)
				}
				b.ResetTimer()
				for range b.N {
					for i := 0; i < n; i++ {
						for h := 0; h < m.Heads; h++ {
							mlaDenseOne(m, c.w, cl, kpe, h, in.QNope[(i*m.Heads+h)*m.QKNopeHeadDim:][:m.QKNopeHeadDim],
								in.QPE[(i*m.Heads+h)*m.QKRopeHeadDim:][:m.QKRopeHeadDim], all[:pos+i+1], out[(i*m.Heads+h)*m.VHeadDim:][:m.VHeadDim])
						}
					}
				}
			} else {
				lat := benchPaged(r, m.RowBytes(), ctx, mode == "contig")
				idx := benchPaged(r, c.x.RowBytes(), ctx, mode == "contig")
				fillMLA(c, &lat, &idx)
				d := kernelspec.DSA{MLA: m, Indexer: c.x}
				b.ResetTimer()
				for range b.N {
					var err error
					if sparse {
						err = DSA(d, lat, idx, c.w, in, ix, out, nil)
					} else {
						err = MLA(m, lat, c.w, in, out)
					}
					if err != nil {
						b.Fatal(err)
					}
				}
			}
			b.ReportMetric(float64(n)*float64(b.N)/b.Elapsed().Seconds(), "tok/s")
		})
	}
}

func BenchmarkMLADecode(b *testing.B) {
	for _, ctx := range benchCtx {
		b.Run(ctxName(ctx), func(b *testing.B) { benchMLAForward(b, false, ctx, 1) })
	}
}

func BenchmarkMLAPrefill(b *testing.B) {
	for _, ctx := range benchCtx {
		b.Run(ctxName(ctx)+"/chunk=64", func(b *testing.B) { benchMLAForward(b, false, ctx, 64) })
	}
}

func BenchmarkDSADecode(b *testing.B) {
	for _, ctx := range benchCtx {
		b.Run(ctxName(ctx), func(b *testing.B) { benchMLAForward(b, true, ctx, 1) })
	}
}

func BenchmarkDSAPrefill(b *testing.B) {
	for _, ctx := range benchCtx {
		b.Run(ctxName(ctx)+"/chunk=64", func(b *testing.B) { benchMLAForward(b, true, ctx, 64) })
	}
}

func BenchmarkMamba2(b *testing.B) {
	m := kernelspec.Mamba2{Heads: 16, HeadDim: 32, State: 64, Groups: 2, ConvKernel: 4, ConvDtype: kernelspec.F32, SSMDtype: kernelspec.F32, Eps: 1e-5}
	r := rand.New(rand.NewPCG(5, 6))
	for _, n := range []int{1, 64} {
		b.Run(fmt.Sprintf("tokens=%d", n), func(b *testing.B) {
			c := newMambaCase(r, m, n)
			conv, ssm := make([]byte, m.ConvBytes()), make([]byte, m.SSMBytes())
			out := make([]float32, n*m.Inner())
			for range b.N {
				c.run(b, conv, ssm, 0, n, out)
			}
			b.ReportMetric(float64(n)*float64(b.N)/b.Elapsed().Seconds(), "tok/s")
		})
	}
}

// BenchmarkPagedVsDenseDecode times, alternately in the same loop, one
// decode step of the paged kernel (16-token blocks, shuffled) and of the
// dense float32 reference, and reports paged/dense (1.00 = same speed) plus
// paged/contig (the same kernel on one contiguous block: the cost of paging
// alone). Alternation keeps machine noise out of the ratios.
func BenchmarkPagedVsDenseDecode(b *testing.B) {
	for _, ctx := range benchCtx {
		b.Run("gqa/"+ctxName(ctx), func(b *testing.B) {
			g := benchGQA
			r := rand.New(rand.NewPCG(1, 2))
			in := newGQAInputs(r, g, ctx)
			qw, kw := g.Heads*g.HeadDim, g.KVHeads*g.HeadDim
			pos := ctx - 1
			paged := benchPaged(r, g.RowBytes(), ctx, false)
			contig := benchPaged(r, g.RowBytes(), ctx, true)
			fillGQA(g, paged, in.k, in.v)
			fillGQA(g, contig, in.k, in.v)
			k := append([]float32(nil), in.k...)
			v := append([]float32(nil), in.v...)
			Round(g.Dtype, k)
			Round(g.Dtype, v)
			out := make([]float32, qw)
			q := in.q[pos*qw:]
			runs := []func(){
				func() { _ = GQA(g, paged, pos, q, in.k[pos*kw:], in.v[pos*kw:], out) },
				func() { _ = GQA(g, contig, pos, q, in.k[pos*kw:], in.v[pos*kw:], out) },
				func() { denseGQA(g, pos, q, k, v, out) },
			}
			reportRatios(b, runs)
		})
		b.Run("mla/"+ctxName(ctx), func(b *testing.B) {
			r := rand.New(rand.NewPCG(3, 4))
			c := newMLACase(r, benchMLA, benchIdx, ctx)
			m := c.m
			pos := ctx - 1
			paged := benchPaged(r, m.RowBytes(), ctx, false)
			contig := benchPaged(r, m.RowBytes(), ctx, true)
			fillMLA(c, &paged, nil)
			fillMLA(c, &contig, nil)
			in, _ := c.slice(pos, ctx)
			din, _ := c.dense(pos)
			cl, kpe := mlaDenseLatents(m, din)
			all := make([]int32, ctx)
			for j := range all {
				all[j] = int32(j)
			}
			out := make([]float32, m.Heads*m.VHeadDim)
			runs := []func(){
				func() { _ = MLA(m, paged, c.w, in, out) },
				func() { _ = MLA(m, contig, c.w, in, out) },
				func() {
					for h := 0; h < m.Heads; h++ {
						mlaDenseOne(m, c.w, cl, kpe, h, in.QNope[h*m.QKNopeHeadDim:][:m.QKNopeHeadDim],
							in.QPE[h*m.QKRopeHeadDim:][:m.QKRopeHeadDim], all, out[h*m.VHeadDim:][:m.VHeadDim])
					}
				},
			}
			reportRatios(b, runs)
		})
	}
}

// reportRatios runs paged, contig, dense alternately b.N times each.
func reportRatios(b *testing.B, runs []func()) {
	var ns [3]time.Duration
	b.ResetTimer()
	for range b.N {
		for i, f := range runs {
			t0 := time.Now()
			f()
			ns[i] += time.Since(t0)
		}
	}
	b.ReportMetric(float64(ns[0])/float64(b.N), "paged-ns/op")
	b.ReportMetric(float64(ns[2])/float64(b.N), "dense-ns/op")
	b.ReportMetric(float64(ns[0])/float64(ns[2]), "paged/dense")
	b.ReportMetric(float64(ns[0])/float64(ns[1]), "paged/contig")
}
