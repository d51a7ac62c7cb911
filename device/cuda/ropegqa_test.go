//go:build cuda && cgo

package cuda

import (
	"context"
	"fmt"
	"testing"

	"github.com/kvx-dev/kvx/device"
	"github.com/kvx-dev/kvx/device/kernelspec"
	"github.com/kvx-dev/kvx/device/synth"
	"github.com/kvx-dev/kvx/plugins/v1/spec"
)

// TestRoPEGQA: RoPEGQA (q rotated and the rotated k written into the pool
// with v by one kernel) gives the bits of RoPE, RoPE and GQA one by one:
// the attention output, q afterwards and every pool byte, over attnSteps'
// prefills, decodes and verification rows. Pools of bf16, fp8 and float32
// in the exact numerics and bf16 on the fast attention; NeoX and
// interleaved rotations, a rotary dim below the head dim (Qwen3-Next's
// partial rotary), a scaled table (YaRN's attention factor) and positions
// past the kernels' angle reduction (the tables made on the host).
func TestRoPEGQA(t *testing.T) {
	const d = 128
	ropes := []struct {
		name string
		r    synth.RoPE
		long int
	}{
		{"neox", synth.RoPE{Dim: d, Theta: 500000}, 300},
		{"interleaved", synth.RoPE{Dim: d, Theta: 10000, Interleaved: true}, 300},
		{"partial", synth.RoPE{Dim: d / 4, Theta: 10000000}, 300},
		{"scaled", synth.RoPE{Dim: d, Theta: 10000, Scale: 1.25}, 300},
		{"host-table", synth.RoPE{Dim: d, InvFreq: hostFreqs(d / 2)}, 300},
	}
	modes := []struct {
		dt   kernelspec.Dtype
		fast bool
	}{{kernelspec.BF16, false}, {kernelspec.FP8, false}, {kernelspec.F32, false}, {kernelspec.BF16, true}}
	for _, rc := range ropes {
		for _, md := range modes {
			name := fmt.Sprintf("%s/%v", rc.name, md.dt)
			if md.fast {
				name += "-fast"
			}
			t.Run(name, func(t *testing.T) {
				m := &spec.Model{Heads: 8, KVHeads: 2, HeadDim: d}
				steps := attnSteps(rc.long)
				l := spec.Layer{Mixer: spec.MixerGQA}
				// The same test name gives both rigs the same block tables.
				a := newAttnRig(t, m, l, device.KernelGQA, md.dt, 16, attnSeqs(steps), nil)
				b := newAttnRig(t, m, l, device.KernelGQA, md.dt, 16, attnSeqs(steps), nil)
				a.o.fast, b.o.fast = md.fast, md.fast
				qw, kw := m.Heads*d, m.KVHeads*d
				for si, segs := range steps {
					rows := 0
					for _, sg := range segs {
						rows += sg.Rows
					}
					q, k, v := a.bf16Vals(rows*qw, 4), a.rand(rows*kw, 4), a.rand(rows*kw, 1.5)
					wantOut, wantQ, wantPool := a.ropeGQACall(t, segs, q, k, v, qw, kw, d, rc.r, false)
					gotOut, gotQ, gotPool := b.ropeGQACall(t, segs, q, k, v, qw, kw, d, rc.r, true)
					sameBits(t, fmt.Sprintf("step %d output", si), wantOut, gotOut)
					sameBits(t, fmt.Sprintf("step %d q", si), wantQ, gotQ)
					for i := range wantPool {
						if gotPool[i] != wantPool[i] {
							t.Fatalf("step %d: pool byte %d = %#02x, one by one %#02x", si, i, gotPool[i], wantPool[i])
						}
					}
				}
			})
		}
	}
}

// hostFreqs returns n inverse frequencies large enough that a position's
// angles pass ropeReduce, so RoPE's tables come from the host.
func hostFreqs(n int) []float64 {
	f := make([]float64, n)
	for i := range f {
		f[i] = float64(1<<22) / float64(i+1)
	}
	return f
}

// ropeGQACall runs RoPE of q and k then GQA (fused false), or RoPEGQA
// (fused true), heads stride apart, on the rig's device, and returns the output, q afterwards
// and the pool.
func (g *attnRig) ropeGQACall(t *testing.T, segs []synth.Seg, q, k, v []float32, qw, kw, stride int, r synth.RoPE, fused bool) (out, qAfter []float32, pool []byte) {
	t.Helper()
	rows := 0
	for _, sg := range segs {
		rows += sg.Rows
	}
	o := g.o
	var opErr error
	on(t, o, func() {
		qt, kt, vt := hostTensor(o, q, rows, qw), hostTensor(o, k, rows, kw), hostTensor(o, v, rows, kw)
		var res synth.Tensor
		if fused {
			res, opErr = o.RoPEGQA(context.Background(), attnLayer, segs, qt, kt, vt, stride, r)
		} else {
			o.RoPE(qt, segs, stride, r)
			o.RoPE(kt, segs, stride, r)
			res, opErr = o.GQA(context.Background(), attnLayer, segs, qt, kt, vt)
		}
		if opErr != nil {
			return
		}
		out, qAfter = o.ToHost(res), o.ToHost(qt)
		pool = make([]byte, len(g.host))
		o.fail(download(pool, o.d.pools[0].addr))
		o.fail(o.g.sync())
		o.fail(o.ar.reset())
	})
	if opErr != nil {
		t.Fatalf("fused %v: %v", fused, opErr)
	}
	return out, qAfter, pool
}

// TestRoPEGQAFold: RoPEGQA of q, k and v pending from one split matmul (the
// fast decode's q/k/v projection: kvx_rope_write_fold reads the parts)
// gives the bits of the fold's launch and then RoPEGQA: the attention
// output, q, k and v read afterwards (k and v folded then, q's columns
// skipped by that fold), q read after them, and every pool byte. Where the
// stream kernel runs (compute capability 9.0, up to 64 rows) RoPEGQA must
// take the fused path: q is no longer pending after it, k and v still are.
// NeoX, interleaved and partial rotary, bf16 and fp8 pools.
func TestRoPEGQAFold(t *testing.T) {
	const d, hidden = 128, 512
	ropes := []struct {
		name string
		r    synth.RoPE
	}{
		{"neox", synth.RoPE{Dim: d, Theta: 500000}},
		{"interleaved", synth.RoPE{Dim: d, Theta: 10000, Interleaved: true}},
		{"partial", synth.RoPE{Dim: d / 4, Theta: 10000000}},
	}
	for _, rc := range ropes {
		for _, dt := range []kernelspec.Dtype{kernelspec.BF16, kernelspec.FP8} {
			t.Run(fmt.Sprintf("%s/%v", rc.name, dt), func(t *testing.T) {
				m := &spec.Model{Heads: 8, KVHeads: 2, HeadDim: d}
				steps := attnSteps(40)
				l := spec.Layer{Mixer: spec.MixerGQA}
				a := newAttnRig(t, m, l, device.KernelGQA, dt, 16, attnSeqs(steps), nil)
				b := newAttnRig(t, m, l, device.KernelGQA, dt, 16, attnSeqs(steps), nil)
				a.o.fast, b.o.fast = true, true
				qw, kw := m.Heads*d, m.KVHeads*d
				wq, wk, wv := a.rand(qw*hidden, 0.1), a.rand(kw*hidden, 0.1), a.rand(kw*hidden, 0.1)
				for si, segs := range steps {
					rows := 0
					for _, sg := range segs {
						rows += sg.Rows
					}
					x := a.rand(rows*hidden, 2)
					want := a.qkvRoPEGQA(t, segs, x, [3][]float32{wq, wk, wv}, hidden, d, rc.r, false)
					got := b.qkvRoPEGQA(t, segs, x, [3][]float32{wq, wk, wv}, hidden, d, rc.r, true)
					for i, name := range []string{"output", "q", "k", "v", "q after k and v"} {
						sameBits(t, fmt.Sprintf("step %d (%d rows) %s", si, rows, name), want.vals[i], got.vals[i])
					}
					for i := range want.pool {
						if got.pool[i] != want.pool[i] {
							t.Fatalf("step %d: pool byte %d = %#02x, folded first %#02x", si, i, got.pool[i], want.pool[i])
						}
					}
				}
			})
		}
	}
}

// qkvRun is what qkvRoPEGQA reads back: the output, q, k, v and q again,
// and the pool.
type qkvRun struct {
	vals [5][]float32
	pool []byte
}

// qkvRoPEGQA runs the q/k/v matmul of x (rows × hidden) by ws in one call,
// then RoPEGQA, the matmul's fold launched first unless pending is true;
// with pending it checks that the stream kernel's q, k and v were pending
// and that RoPEGQA left q folded and k and v pending.
func (g *attnRig) qkvRoPEGQA(t *testing.T, segs []synth.Seg, x []float32, ws [3][]float32, hidden, stride int, r synth.RoPE, pending bool) qkvRun {
	t.Helper()
	rows := len(x) / hidden
	o := g.o
	var res qkvRun
	var opErr error
	on(t, o, func() {
		var w [3]synth.Tensor
		for i, v := range ws {
			w[i] = o.Weight(v, len(v)/hidden, hidden)
		}
		qkv := o.MatMuls(hostTensor(o, x, rows, hidden), w[0], w[1], w[2])
		_, stream := o.g.streamFor(rows, 0)
		if pending && stream && qkvFold(qkv[0], qkv[1], qkv[2]) == nil {
			t.Fatalf("%d rows: the stream matmul's q, k and v are not pending", rows)
		}
		if !pending {
			cudaTensor(qkv[0])
		}
		var out synth.Tensor
		out, opErr = o.RoPEGQA(context.Background(), attnLayer, segs, qkv[0], qkv[1], qkv[2], stride, r)
		if opErr != nil {
			return
		}
		if pending && stream && (unfolded(qkv[0]).fold != nil || unfolded(qkv[1]).fold == nil || unfolded(qkv[2]).fold == nil) {
			t.Errorf("%d rows: RoPEGQA did not read the pending q, k and v from the parts (q pending %v, k %v, v %v)", rows,
				unfolded(qkv[0]).fold != nil, unfolded(qkv[1]).fold != nil, unfolded(qkv[2]).fold != nil)
		}
		res.vals = [5][]float32{o.ToHost(out), o.ToHost(qkv[0]), o.ToHost(qkv[1]), o.ToHost(qkv[2]), o.ToHost(qkv[0])}
		res.pool = make([]byte, len(g.host))
		o.fail(download(res.pool, o.d.pools[0].addr))
		o.fail(o.g.sync())
		o.fail(o.ar.reset())
	})
	if opErr != nil {
		t.Fatalf("pending %v: %v", pending, opErr)
	}
	return res
}
