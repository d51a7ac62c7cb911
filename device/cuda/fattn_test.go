//go:build cuda && cgo

package cuda

import (
	"context"
	"fmt"
	"math"
	"testing"

	"github.com/kvx-dev/kvx/device"
	"github.com/kvx-dev/kvx/device/cpu/kernel"
	"github.com/kvx-dev/kvx/device/kernelspec"
	"github.com/kvx-dev/kvx/device/synth"
	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
	"github.com/kvx-dev/kvx/plugins/v1/spec"
)

// fastGQACase is a GQA layer of the fast-attention tests.
type fastGQACase struct {
	name                    string
	heads, kvHeads, headDim int
	window, tpb, long       int
}

// fastGQACases cross both head dims, group sizes from 1 to 32 (above 16
// the decode rows of a kv head no longer fit one warp and go to the prefill
// kernel), sliding windows shorter and longer than a partition, block sizes
// that do not divide a tile, and contexts crossing partitions or (the
// last) not.
var fastGQACases = []fastGQACase{
	{"d128-g4", 8, 2, 128, 0, 16, 700},
	{"d64-mha-window", 4, 4, 64, 100, 8, 1100},
	{"d128-g8-window-long", 16, 2, 128, 600, 32, 1300},
	{"d64-g3-tpb5", 6, 2, 64, 0, 5, 300},
	{"d128-mqa-g16", 16, 1, 128, 0, 16, 530},
	{"d128-g32", 32, 1, 128, 0, 64, 200},
	// every context within one partition: the split kernel's calls skip
	// the merge
	{"d128-g4-window-short", 8, 2, 128, 100, 16, 180},
}

// gqaCall runs one GQA call on the rig's device and returns its output.
func (g *attnRig) gqaCall(t *testing.T, segs []synth.Seg, q, k, v []float32, qw, kw int) []float32 {
	t.Helper()
	rows := 0
	for _, sg := range segs {
		rows += sg.Rows
	}
	o := g.o
	var got []float32
	var opErr error
	on(t, o, func() {
		res, err := o.GQA(context.Background(), attnLayer, segs, hostTensor(o, q, rows, qw), hostTensor(o, k, rows, kw), hostTensor(o, v, rows, kw))
		if err != nil {
			opErr = err
			return
		}
		got = o.ToHost(res)
		o.fail(o.g.sync())
		o.fail(o.ar.reset())
	})
	if opErr != nil {
		t.Fatalf("GQA: %v", opErr)
	}
	return got
}

// bf16Vals returns n values uniform in [-a, a), rounded to bf16 (so that
// the fast kernel's rounding of the queries changes nothing).
func (g *attnRig) bf16Vals(n int, a float32) []float32 {
	v := g.rand(n, a)
	for i := range v {
		v[i] = bf16Round(v[i])
	}
	return v
}

// TestFastGQA: the fast attention (dtype bfloat16) of every step of
// attnSteps against the cpu's exact kernel on the same bf16 pool. Queries
// are bf16 values, so the one rounding the fast kernel adds is that of the
// softmax weights to bf16 for P·V (relative 2^-9 each); the tolerance is
// 2^-8 of the largest |V|. Scores span about ±12, so a missed or extra key
// moves an output by far more. The pool must equal the cpu's byte for byte.
func TestFastGQA(t *testing.T) {
	for _, c := range fastGQACases {
		t.Run(c.name, func(t *testing.T) {
			m := &spec.Model{Heads: c.heads, KVHeads: c.kvHeads, HeadDim: c.headDim}
			steps := attnSteps(c.long)
			g := newAttnRig(t, m, spec.Layer{Mixer: spec.MixerGQA, Window: c.window}, device.KernelGQA, kernelspec.BF16, c.tpb, attnSeqs(steps), nil)
			g.o.fast = true
			qw, kw := c.heads*c.headDim, c.kvHeads*c.headDim
			const vmax = 1.5
			tol := vmax * math.Ldexp(1, -8)
			for si, segs := range steps {
				rows := 0
				for _, sg := range segs {
					rows += sg.Rows
				}
				q, k, v := g.bf16Vals(rows*qw, 4), g.rand(rows*kw, 4), g.rand(rows*kw, vmax)
				got := g.gqaCall(t, segs, q, k, v, qw, kw)
				want := make([]float32, rows*qw)
				r := 0
				for _, sg := range segs {
					lo, hi := r, r+sg.Rows
					if err := kernel.GQA(g.x.GQA, g.paged(spec.RoleKV, sg.Seq), sg.Pos, hostRows(q, qw, lo, hi), hostRows(k, kw, lo, hi),
						hostRows(v, kw, lo, hi), hostRows(want, qw, lo, hi)); err != nil {
						t.Fatal(err)
					}
					r = hi
				}
				var dev []byte
				on(t, g.o, func() {
					dev = make([]byte, len(g.host))
					o := g.o
					o.fail(download(dev, o.d.pools[0].addr))
				})
				for i := range dev {
					if dev[i] != g.host[i] {
						t.Fatalf("step %d: pool byte %d = %#02x, cpu %#02x", si, i, dev[i], g.host[i])
					}
				}
				worst, bad := 0.0, 0
				for i := range want {
					d := math.Abs(float64(got[i]) - float64(want[i]))
					worst = max(worst, d)
					if !(d <= tol) {
						if bad++; bad <= 3 {
							t.Errorf("step %d: out[%d] (row %d) = %v, exact %v", si, i, i/qw, got[i], want[i])
						}
					}
				}
				if bad > 0 {
					t.Errorf("step %d: %d of %d values beyond %.3g of the exact kernel", si, bad, len(want), tol)
				}
				t.Logf("step %d: largest difference %.3g (tolerance %.3g)", si, worst, tol)
			}
		})
	}
}

// TestFastGQAInvariant: a sequence's attention rows are the same bits
// whatever else is in the call, however its prompt is chunked, and whichever
// kernel runs them: the whole prompt in one call; chunks of 37, 200, 1 and
// 500 rows; a prefill then one decode row a call (the split kernel); the
// same decode rows on the prefill kernel; and the decode rows batched with
// another sequence's prefill and decodes; and prefill blocks of 4 and of 8
// warps.
func TestFastGQAInvariant(t *testing.T) {
	for _, c := range fastGQACases {
		t.Run(c.name, func(t *testing.T) {
			n := c.long + 20
			m := &spec.Model{Heads: c.heads, KVHeads: c.kvHeads, HeadDim: c.headDim}
			g := newAttnRig(t, m, spec.Layer{Mixer: spec.MixerGQA, Window: c.window}, device.KernelGQA, kernelspec.BF16, c.tpb,
				map[kvcache.SeqID]int{1: n, 2: n}, nil)
			g.o.fast = true
			qw, kw := c.heads*c.headDim, c.kvHeads*c.headDim
			q, k, v := g.rand(n*qw, 4), g.rand(n*kw, 4), g.rand(n*kw, 1.5)
			other := func(rows int) ([]float32, []float32, []float32) {
				return g.rand(rows*qw, 4), g.rand(rows*kw, 4), g.rand(rows*kw, 1.5)
			}
			whole := g.gqaCall(t, []synth.Seg{{Seq: 1, Pos: 0, Rows: n}}, q, k, v, qw, kw)
			// chunked runs seq 1 in calls of the given sizes (the last
			// repeated), with an extra segment of seq 2 first when mix.
			chunked := func(sizes []int, mix bool) []float32 {
				var out []float32
				p2 := 0
				for at, i := 0, 0; at < n; i++ {
					rows := min(sizes[min(i, len(sizes)-1)], n-at)
					segs := []synth.Seg{{Seq: 1, Pos: at, Rows: rows}}
					cq, ck, cv := hostRows(q, qw, at, at+rows), hostRows(k, kw, at, at+rows), hostRows(v, kw, at, at+rows)
					skip := 0
					if mix && p2 < n {
						r2 := min(1+(i%3)*40, n-p2) // decodes and short prefills of seq 2
						oq, ok, ov := other(r2)
						segs = append([]synth.Seg{{Seq: 2, Pos: p2, Rows: r2}}, segs...)
						cq, ck, cv = append(oq, cq...), append(ok, ck...), append(ov, cv...)
						skip, p2 = r2, p2+r2
					}
					got := g.gqaCall(t, segs, cq, ck, cv, qw, kw)
					out = append(out, got[skip*qw:]...)
					at += rows
				}
				return out
			}
			decodes := append([]int{n - 20}, 1)
			sameBits(t, "chunks of 37, 200, 1, 500", whole, chunked([]int{37, 200, 1, 500}, false))
			sameBits(t, "prefill then decodes (split kernel)", whole, chunked(decodes, false))
			sameBits(t, "decodes batched with another sequence", whole, chunked(decodes, true))
			defer func() { faForcePrefill, faForceWarps = false, 0 }()
			for _, w := range []int{4, 8} {
				faForceWarps = w
				sameBits(t, fmt.Sprintf("chunks of 37, 200, 1, 500 (%d-warp prefill blocks)", w), whole, chunked([]int{37, 200, 1, 500}, false))
			}
			faForcePrefill, faForceWarps = true, 0
			sameBits(t, "prefill then decodes (prefill kernel)", whole, chunked(decodes, false))
		})
	}
}

// BenchmarkFastAttn measures the fast attention of Llama-3-8B's layer (32
// heads over 8 kv heads of 128, bf16 KV in 32-token blocks): prefill chunks
// (TFLOP/s of the causal QKᵀ and PV) and decode batches (GB/s of the K and
// V read once); scripts/cuda-bench.py sets them against PyTorch's SDPA.
func BenchmarkFastAttn(b *testing.B) {
	for _, s := range []struct {
		name            string
		batch, pos, new int
	}{
		{"prefill-2048", 1, 0, 2048}, {"prefill-2048-at-6144", 1, 6144, 2048}, {"prefill-8192", 1, 0, 8192},
		{"decode-b1-4k", 1, 4095, 1}, {"decode-b1-32k", 1, 32767, 1}, {"decode-b8-32k", 8, 32767, 1},
		{"decode-b64-4k", 64, 4095, 1}, {"decode-b64-8k", 64, 8191, 1},
	} {
		b.Run(s.name, func(b *testing.B) {
			const heads, kvHeads, d, tpb = 32, 8, 128, 32
			m := &spec.Model{Heads: heads, KVHeads: kvHeads, HeadDim: d}
			seqs := map[kvcache.SeqID]int{}
			var segs []synth.Seg
			for i := range s.batch {
				seqs[kvcache.SeqID(i+1)] = s.pos + s.new
				segs = append(segs, synth.Seg{Seq: kvcache.SeqID(i + 1), Pos: s.pos, Rows: s.new})
			}
			g := newAttnRig(b, m, spec.Layer{Mixer: spec.MixerGQA}, device.KernelGQA, kernelspec.BF16, tpb, seqs, nil)
			g.o.fast = true
			rows := s.batch * s.new
			qw, kw := heads*d, kvHeads*d
			o := g.o
			var q, k, v *tensor
			on(b, o, func() {
				q, k, v = keptTensor(o, g.rand(rows*qw, 2), rows, qw), keptTensor(o, g.rand(rows*kw, 2), rows, kw), keptTensor(o, g.rand(rows*kw, 1), rows, kw)
			})
			f := func() {
				if _, err := o.GQA(context.Background(), attnLayer, segs, q, k, v); err != nil {
					o.fail(err)
				}
			}
			timeOps(b, o, 3, f)
			b.ResetTimer()
			per := timeOps(b, o, b.N, f).Seconds() / float64(b.N)
			if s.new > 1 {
				// causal: each of the new rows sees pos + its index + 1 keys
				keys := float64(s.new)*float64(s.pos) + float64(s.new)*float64(s.new+1)/2
				b.ReportMetric(4*keys*heads*d*float64(s.batch)/per/1e12, "TFLOP/s")
			} else {
				b.ReportMetric(float64(s.batch)*float64(s.pos+1)*float64(2*kvHeads*d*2)/per/1e9, "GB/s")
			}
			b.ReportMetric(per*1e6, "us/call")
		})
	}
}

// TestFastGQABF16Copy: every call (decode rows only: the split kernel and
// its merge; prefill segments, alone or beside decode rows: the prefill
// kernel too) comes back with the bf16 copy of its output that the kernels
// wrote, and MatMul through it (o_proj) gives the bits of MatMul of the
// same values uploaded afresh.
func TestFastGQABF16Copy(t *testing.T) {
	m := &spec.Model{Heads: 8, KVHeads: 2, HeadDim: 128}
	steps := attnSteps(300)
	g := newAttnRig(t, m, spec.Layer{Mixer: spec.MixerGQA}, device.KernelGQA, kernelspec.BF16, 16, attnSeqs(steps), nil)
	g.o.fast = true
	t.Cleanup(func() { g.o.g.do(func() error { g.o.freeStage(); return nil }) })
	qw, kw := m.Heads*m.HeadDim, m.KVHeads*m.HeadDim
	const outs = 96
	wv := g.rand(outs*qw, 1)
	var w synth.Tensor
	on(t, g.o, func() { w = g.o.Weight(wv, outs, qw) })
	decodeOnly := 0
	for si, segs := range steps {
		rows, decode := 0, true
		for _, sg := range segs {
			rows += sg.Rows
			decode = decode && sg.Rows*(m.Heads/m.KVHeads) <= faSplitRows
		}
		if decode {
			decodeOnly++
		}
		q, k, v := g.rand(rows*qw, 4), g.rand(rows*kw, 4), g.rand(rows*kw, 1.5)
		on(t, g.o, func() {
			o := g.o
			res, err := o.GQA(context.Background(), attnLayer, segs, hostTensor(o, q, rows, qw), hostTensor(o, k, rows, kw), hostTensor(o, v, rows, kw))
			if err != nil {
				t.Errorf("step %d: GQA: %v", si, err)
				return
			}
			y := cudaTensor(res)
			if y.b == 0 {
				t.Errorf("step %d (decode rows only: %v): no bf16 copy", si, decode)
			}
			fresh := hostTensor(o, o.ToHost(y), rows, qw)
			sameBits(t, fmt.Sprintf("step %d: MatMul of the attention output", si), o.ToHost(o.MatMul(fresh, w)), o.ToHost(o.MatMul(y, w)))
			o.fail(o.g.sync())
			o.fail(o.ar.reset())
		})
	}
	if decodeOnly == 0 || decodeOnly == len(steps) {
		t.Fatalf("%d of %d steps are decode rows only: the test needs both kinds", decodeOnly, len(steps))
	}
}
