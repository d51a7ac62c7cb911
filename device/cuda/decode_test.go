//go:build cuda && cgo

package cuda

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"gorgonia.org/cu"

	"github.com/kvx-dev/kvx/device/cpu/kernel"
	"github.com/kvx-dev/kvx/device/kernelspec"
)

// decodeRig is a paged bf16 GQA pool (head dim 128) of batch sequences of
// ctx positions each, its blocks in a shuffled order, filled on the device.
type decodeRig struct {
	o                      *ops
	v                      pagedView
	tables, ctxs           cu.DevicePtr
	batch, heads, kvh, ctx int
	maxBlocks              int
	table                  [][]int32
}

func newDecodeRig(t testing.TB, o *ops, batch, heads, kvh, ctx, tpb int, seed uint64) *decodeRig {
	t.Helper()
	r := &decodeRig{o: o, batch: batch, heads: heads, kvh: kvh, ctx: ctx}
	stride := int64(2 * kvh * 128 * 2)
	r.maxBlocks = blocks(ctx, tpb)
	nblocks := batch * r.maxBlocks
	r.v = pagedView{blockBytes: int64(tpb) * stride, stride: stride, tokensPerBlock: tpb}
	rng := rand.New(rand.NewPCG(seed, 1))
	perm := rng.Perm(nblocks)
	flat := make([]int32, 0, nblocks)
	for b := range batch {
		row := make([]int32, r.maxBlocks)
		for i := range row {
			row[i] = int32(perm[b*r.maxBlocks+i])
		}
		r.table = append(r.table, row)
		flat = append(flat, row...)
	}
	ctxs := make([]int64, batch)
	for i := range ctxs {
		ctxs[i] = int64(ctx)
	}
	on(t, o, func() {
		p, err := o.g.alloc(int64(nblocks) * r.v.blockBytes)
		if err != nil {
			o.fail(err)
			return
		}
		*o.weights = append(*o.weights, p)
		r.v.base = p
		n := int64(nblocks) * r.v.blockBytes / 2
		o.run("kvx_fill_bf16", dim{4096, 1, 1}, dim{256, 1, 1}, 0, p, n, int64(seed))
		r.tables = o.weightInts(flat)
		r.ctxs = o.weightInt64s(ctxs)
	})
	return r
}

// weightInts keeps int32 values in device memory as long as the ops'
// weights (the step arena is not reset in these tests, but a rig outlives
// several steps).
func (o *ops) weightInts(v []int32) cu.DevicePtr {
	p, err := o.g.alloc(int64(len(v)) * 4)
	o.fail(err)
	if err == nil {
		*o.weights = append(*o.weights, p)
		o.fail(upload(p, v))
	}
	return p
}

func (o *ops) weightInt64s(v []int64) cu.DevicePtr {
	p, err := o.g.alloc(int64(len(v)) * 8)
	o.fail(err)
	if err == nil {
		*o.weights = append(*o.weights, p)
		o.fail(upload(p, v))
	}
	return p
}

// TestDecodeGQA: the fast decode kernel agrees with the exact dense
// reference (kernel.DenseGQA on the same bf16 rows) to float32 rounding,
// for every group size and context lengths that are not multiples of the
// split or the block.
func TestDecodeGQA(t *testing.T) {
	o := newTestOps(t)
	for _, c := range []struct{ batch, heads, kvh, ctx, tpb, split int }{
		{1, 8, 8, 1, 16, 256}, {2, 16, 8, 300, 16, 256}, {3, 32, 8, 1000, 64, 256}, {2, 32, 4, 777, 32, 512}, {1, 8, 1, 4099, 16, 256},
	} {
		t.Run(fmt.Sprintf("b%d_h%d_kv%d_ctx%d", c.batch, c.heads, c.kvh, c.ctx), func(t *testing.T) {
			r := newDecodeRig(t, o, c.batch, c.heads, c.kvh, c.ctx, c.tpb, 3)
			rng := rand.New(rand.NewPCG(5, 6))
			q := make([]float32, c.batch*c.heads*128)
			for i := range q {
				q[i] = float32(rng.NormFloat64())
			}
			var got []float32
			var pool []byte
			on(t, o, func() {
				qt := hostTensor(o, q, c.batch, c.heads*128)
				out := r.o.decodeGQA(qt, r.v, r.tables, r.ctxs, c.batch, c.heads, c.kvh, r.maxBlocks, c.ctx, c.split)
				got = make([]float32, c.batch*c.heads*128)
				o.fail(download(got, out.p))
				pool = make([]byte, int64(c.batch*r.maxBlocks)*r.v.blockBytes)
				o.fail(download(pool, r.v.base))
			})
			g := kernelspec.GQA{Heads: c.heads, KVHeads: c.kvh, HeadDim: 128, Dtype: kernelspec.BF16}
			kw := c.kvh * 128
			worst := 0.0
			for b := range c.batch {
				k := make([]float32, c.ctx*kw)
				v := make([]float32, c.ctx*kw)
				for j := range c.ctx {
					blk, off := r.table[b][j/c.tpb], j%c.tpb
					row := pool[int64(blk)*r.v.blockBytes+int64(off)*r.v.stride:]
					for i := range kw {
						k[j*kw+i] = kernel.Float32FromBF16(uint16(row[2*i]) | uint16(row[2*i+1])<<8)
						v[j*kw+i] = kernel.Float32FromBF16(uint16(row[2*(kw+i)]) | uint16(row[2*(kw+i)+1])<<8)
					}
				}
				want := make([]float32, c.heads*128)
				qb := q[b*c.heads*128 : (b+1)*c.heads*128]
				// The last position is the query's own; DenseGQA reads the
				// query at pos ctx-1 over positions 0..ctx-1.
				if err := kernel.DenseGQA(g, c.ctx-1, qb, k, v, want); err != nil {
					t.Fatal(err)
				}
				for i, w := range want {
					d := math.Abs(float64(got[b*c.heads*128+i] - w))
					worst = max(worst, d/(1+math.Abs(float64(w))))
				}
			}
			if worst > 2e-5 {
				t.Errorf("largest relative difference %.3g from the exact kernel, want <= 2e-5", worst)
			}
			t.Logf("largest relative difference from the exact kernel: %.3g", worst)
		})
	}
}

// BenchmarkDecodeGQA measures the fast decode kernel on Llama-3-8B's
// attention shape (32 query heads, 8 kv heads, head dim 128, bf16 KV,
// 64-token blocks in a shuffled order) and reports the KV bytes it reads
// per second. scripts/cuda-bench.py sets these against PyTorch's SDPA and
// the device copy bandwidth, measured in the same run.
func BenchmarkDecodeGQA(b *testing.B) {
	for _, ctx := range []int{4 << 10, 32 << 10, 128 << 10} {
		for _, batch := range []int{1, 16, 64} {
			b.Run(fmt.Sprintf("ctx=%d/batch=%d", ctx, batch), func(b *testing.B) {
				o := newTestOps(b)
				r := newDecodeRig(b, o, batch, 32, 8, ctx, 64, 1)
				q := make([]float32, batch*32*128)
				for i := range q {
					q[i] = float32(i%7) * 0.1
				}
				split := splitFor(batch, 8, ctx)
				var qt *tensor
				on(b, o, func() { qt = keptTensor(o, q, batch, 32*128) })
				run := func(n int) time.Duration {
					var d time.Duration
					on(b, o, func() {
						o.fail(o.g.sync())
						start := time.Now()
						for range n {
							r.o.decodeGQA(qt, r.v, r.tables, r.ctxs, batch, 32, 8, r.maxBlocks, ctx, split)
						}
						o.fail(o.g.sync())
						d = time.Since(start)
						o.fail(o.ar.reset())
					})
					return d
				}
				run(3) // warm up
				b.ResetTimer()
				d := run(b.N)
				bytes := float64(batch) * float64(ctx) * 8 * 128 * 2 * 2
				b.ReportMetric(bytes*float64(b.N)/d.Seconds()/1e9, "GB/s")
			})
		}
	}
}

// BenchmarkCopy is the device-to-device copy bandwidth (bytes read plus
// written per second) of a 4 GiB cuMemcpyDtoD: the ceiling the decode
// kernel is held against.
func BenchmarkCopy(b *testing.B) {
	o := newTestOps(b)
	const n = 4 << 30
	var src, dst cu.DevicePtr
	on(b, o, func() {
		var err error
		if src, err = o.g.alloc(n); err != nil {
			o.fail(err)
			return
		}
		if dst, err = o.g.alloc(n); err != nil {
			o.fail(err)
			return
		}
		*o.weights = append(*o.weights, src, dst)
	})
	var d time.Duration
	b.ResetTimer()
	on(b, o, func() {
		start := time.Now()
		for range b.N {
			o.fail(cu.MemcpyDtoD(dst, src, n))
		}
		o.fail(o.g.sync())
		d = time.Since(start)
	})
	b.ReportMetric(2*n*float64(b.N)/d.Seconds()/1e9, "GB/s")
}
