//go:build cuda && cgo

package cuda

// The attention mixers (GQA, MLA, DSA) on the device's paged pools: each
// call first writes the new tokens' rows into the cache through the block
// tables, then attends every query row against rows read back from the
// cache in logical order, with the cpu reference kernels' arithmetic
// (device/cpu/kernel gqa.go, mla.go, dsa.go; kernels/attn.cu says how).
// A query row's output depends only on its own sequence's positions up to
// its own, never on the call's other rows, the segments' order, block
// placement or chunking. The segments of one call are distinct sequences
// (the model's contract), so writing every segment's rows before attending
// equals the cpu's segment-by-segment order.

import (
	"context"
	"fmt"
	"math"

	"gorgonia.org/cu"

	"github.com/kvx-dev/kvx/device"
	"github.com/kvx-dev/kvx/device/kernelspec"
	"github.com/kvx-dev/kvx/device/paged"
	"github.com/kvx-dev/kvx/device/synth"
	"github.com/kvx-dev/kvx/plugins/v1/spec"
)

// Threads per block of the attention kernels (ATT and TOPK in attn.cu).
const (
	attThreads  = 128
	topkThreads = 256
	// attnMaxShared is the shared memory (static and dynamic) a block may
	// use without opting in.
	attnMaxShared = 48 << 10
	// attStatic is the shared memory the attention kernels declare
	// statically: the tile's row addresses, the max reduction, l.
	attStatic = attThreads*8 + attThreads*4 + 64
)

// attKeep is the longest context whose first-pass scores an attention block
// keeps in shared memory (longer ones are computed again). Tests lower it.
var attKeep = 8192

// attnMixer returns layer's kernel configuration, which must be k.
func (o *ops) attnMixer(layer int, k device.Kernel) (*paged.Mixer, error) {
	x := o.d.ps.Mix[layer]
	if x == nil || x.Kind != k {
		return nil, fmt.Errorf("cuda: layer %d does not run the %v kernel on this stage", layer, k)
	}
	return x, nil
}

// attnRowSegs uploads, for every row of a call over segs, its segment's
// index (the kernels' rowSeg).
func (o *ops) attnRowSegs(segs []synth.Seg) cu.DevicePtr {
	m := o.memoFor(segs)
	if m.rows == 0 {
		var rs []int32
		for i, sg := range segs {
			for range sg.Rows {
				rs = append(rs, int32(i))
			}
		}
		m.rows = put(o, rs)
	}
	return m.rows
}

// attnArgs are a pagedView's kernel arguments: base, block bytes, offset,
// stride, tokens per block.
func (v pagedView) attnArgs() []any {
	return []any{v.base, v.blockBytes, v.offset, v.stride, v.tokensPerBlock}
}

// checkAttnView checks that layer's buffer v holds rows of rowBytes bytes whose
// elements of size bytes are aligned as the kernels load them.
func checkAttnView(layer int, role spec.Role, v pagedView, rowBytes, size int) error {
	s := int64(size)
	switch {
	case v.stride < int64(rowBytes):
		return fmt.Errorf("cuda: layer %d %s: stride %d is below the row width %d", layer, role, v.stride, rowBytes)
	case v.offset+int64(v.tokensPerBlock-1)*v.stride+int64(rowBytes) > v.blockBytes:
		return fmt.Errorf("cuda: layer %d %s: offset %d + %d tokens × stride %d is beyond block bytes %d", layer, role, v.offset, v.tokensPerBlock, v.stride, v.blockBytes)
	case v.blockBytes%s != 0 || v.offset%s != 0 || v.stride%s != 0 || int64(v.base)%s != 0:
		return fmt.Errorf("cuda: layer %d %s: block bytes %d, offset %d, stride %d are not multiples of the %d-byte element", layer, role, v.blockBytes, v.offset, v.stride, size)
	}
	return nil
}

// attnRows checks that segs cover n rows (a programmer error otherwise).
func attnRows(name string, segs []synth.Seg, n int) {
	r := 0
	for _, sg := range segs {
		r += sg.Rows
	}
	if r != n {
		panic(fmt.Sprintf("cuda: %s: segments cover %d rows, the tensors have %d", name, r, n))
	}
}

// GQA writes the new tokens' K and V (rows K[KVHeads][HeadDim] then V) and
// returns every query row's attention over its window, as
// kernel.GQA.
func (o *ops) GQA(_ context.Context, layer int, segs []synth.Seg, q, k, v synth.Tensor) (synth.Tensor, error) {
	return o.gqa(layer, segs, q, k, v, nil)
}

// RoPEGQA is RoPE of q and of k (heads stride apart), then GQA (hf's
// RoPEGQAer): q is rotated in place and the rotated k is written into the
// pool with v by one kernel (kvx_rope_write, the roundings of the three
// launches it replaces); k itself is left as it was.
// When q, k and v are the three outputs of one pending split matmul (the
// fast decode's q/k/v projection), the kernel reads them from the parts
// (kvx_rope_write_fold) and no fold is launched: q is written, k and v stay
// pending for any later reader.
func (o *ops) RoPEGQA(_ context.Context, layer int, segs []synth.Seg, q, k, v synth.Tensor, stride int, r synth.RoPE) (synth.Tensor, error) {
	dropBF16(q)
	f := qkvFold(q, k, v)
	qt, kt := unfolded(q), unfolded(k)
	rq, rk := ropeCheck("RoPEGQA q", qt, segs, stride, r), ropeCheck("RoPEGQA k", kt, segs, stride, r)
	if !rq || !rk {
		// Nothing to rotate in one of them (no columns): the ops one
		// by one.
		o.RoPE(q, segs, stride, r)
		o.RoPE(k, segs, stride, r)
		return o.gqa(layer, segs, q, k, v, nil)
	}
	return o.gqa(layer, segs, q, k, v, &gqaRoPE{stride: stride, r: r, fold: f})
}

// qkvFold is the pending fold whose outputs are q, k and v, each of them
// still pending, or nil.
func qkvFold(q, k, v synth.Tensor) *pendingFold {
	qt, kt, vt := unfolded(q), unfolded(k), unfolded(v)
	f := qt.fold
	if f == nil || kt.fold != f || vt.fold != f || len(f.outs) != 3 || f.n != qt.r || qt == kt || kt == vt || qt == vt {
		return nil
	}
	return f
}

// ropeThreads are the threads of a kvx_rope_write block.
const ropeThreads = 256

// gqaRoPE is the rotation RoPEGQA folds into GQA's cache write, and the
// pending matmul q, k and v are read from when fold is not nil.
type gqaRoPE struct {
	stride int
	r      synth.RoPE
	fold   *pendingFold
}

// gqa is GQA, with q and k rotated by rope first when it is not nil.
func (o *ops) gqa(layer int, segs []synth.Seg, q, k, v synth.Tensor, rope *gqaRoPE) (synth.Tensor, error) {
	x, err := o.attnMixer(layer, device.KernelGQA)
	if err != nil {
		return nil, err
	}
	g := x.GQA
	var qt, kt, vt *tensor
	if rope != nil && rope.fold != nil {
		qt, kt, vt = unfolded(q), unfolded(k), unfolded(v)
	} else {
		qt, kt, vt = cudaTensor(q), cudaTensor(k), cudaTensor(v)
	}
	n, kw := qt.r, g.KVHeads*g.HeadDim
	shape("gqa q", qt, n, g.Heads*g.HeadDim)
	shape("gqa k", kt, n, kw)
	shape("gqa v", vt, n, kw)
	attnRows("gqa", segs, n)
	out := o.newTensor(n, x.OutWidth())
	if n == 0 {
		return out, nil
	}
	desc, pv, err := o.segments(layer, spec.RoleKV, segs)
	if err != nil {
		return nil, err
	}
	if err := checkAttnView(layer, spec.RoleKV, pv, g.RowBytes(), g.Dtype.Size()); err != nil {
		return nil, err
	}
	shm := (2*g.HeadDim + attThreads) * 4
	if shm+attStatic > attnMaxShared {
		return nil, fmt.Errorf("cuda: layer %d: gqa head dim %d needs %d bytes of shared memory, above %d", layer, g.HeadDim, shm+attStatic, attnMaxShared)
	}
	most := 0 // the longest context of a query row
	for _, sg := range segs {
		c := sg.Pos + sg.Rows
		if g.Window > 0 {
			c = min(c, g.Window)
		}
		most = max(most, c)
	}
	keep := attKeepOf(most, shm)
	shm += 4 * keep
	scale := g.Scale
	if scale == 0 {
		scale = float32(1 / math.Sqrt(float64(g.HeadDim)))
	}
	rs := o.attnRowSegs(segs)
	dt := int(g.Dtype)
	if rope != nil {
		cs, sn := o.ropeTable(segs, rope.r)
		il := 0
		if rope.r.Interleaved {
			il = 1
		}
		// One unit (a q pair, or a k or v value) a thread, over blocks of
		// ropeThreads: a decode row spreads over many SMs.
		if f := rope.fold; f != nil {
			// One unit a q, k or v value: q's values past the rotary
			// dims are written too (the fold's).
			units := qt.c + 2*kw
			o.run("kvx_rope_write_fold", dim{n, min(blocks(units, ropeThreads), 1<<16-1), 1}, dim{ropeThreads, 1, 1}, 0,
				append([]any{desc, rs, qt.p, qt.c, f.p, f.parts, f.m, f.col(qt), f.col(kt), f.col(vt), kw, cs, sn, rope.stride, rope.r.Dim, il},
					append(pv.attnArgs(), dt)...)...)
			f.drop(qt)
		} else {
			units := blocks(qt.c, rope.stride)*(rope.r.Dim/2) + 2*kw
			o.run("kvx_rope_write", dim{n, min(blocks(units, ropeThreads), 1<<16-1), 1}, dim{ropeThreads, 1, 1}, 0,
				append([]any{desc, rs, qt.p, qt.c, kt.p, vt.p, kw, cs, sn, rope.stride, rope.r.Dim, il}, append(pv.attnArgs(), dt)...)...)
		}
	} else {
		o.run("kvx_attn_write", dim{n, 1, 1}, dim{attThreads, 1, 1}, 0,
			append([]any{desc, rs, kt.p, kw, vt.p, kw}, append(pv.attnArgs(), dt)...)...)
	}
	if o.fast && fastGQA(g, pv) {
		o.fastAttend(g, segs, desc, pv, qt, out, scale)
		return out, nil
	}
	o.run("kvx_gqa_attend", dim{n, g.Heads, 1}, dim{attThreads, 1, 1}, shm,
		append([]any{desc, rs, qt.p, out.p}, append(pv.attnArgs(), g.Heads, g.KVHeads, g.HeadDim, g.Window, scale, dt, keep)...)...)
	return out, nil
}

// MLA writes the new tokens' latent rows (c_kv then k_pe) and returns every
// query row's absorbed attention over positions 0..p, as
// kernel.MLA with the call's scale.
func (o *ops) MLA(_ context.Context, layer int, segs []synth.Seg, in synth.MLAIn, w synth.MLAWeights) (synth.Tensor, error) {
	x, err := o.attnMixer(layer, device.KernelMLA)
	if err != nil {
		return nil, err
	}
	m := x.WithScales(in, nil).MLA
	n := o.attnCheckMLA(m, segs, in, w)
	out := o.newTensor(n, x.OutWidth())
	if n == 0 {
		return out, nil
	}
	desc, lv, err := o.segments(layer, spec.RoleLatent, segs)
	if err != nil {
		return nil, err
	}
	rs := o.attnRowSegs(segs)
	if err := o.mlaWrite(layer, m, desc, rs, lv, in, n); err != nil {
		return nil, err
	}
	if err := o.mlaAttend(layer, m, segs, desc, rs, lv, in, w, out, 0, 0); err != nil {
		return nil, err
	}
	return out, nil
}

// DSA writes the new tokens' latent and indexer key rows, scores every
// query row's positions with the lightning indexer, keeps its top k and
// returns its sparse MLA over them, as kernel.DSA with the call's
// scales.
func (o *ops) DSA(_ context.Context, layer int, segs []synth.Seg, in synth.MLAIn, ix synth.IndexIn, w synth.MLAWeights) (synth.Tensor, error) {
	x, err := o.attnMixer(layer, device.KernelDSA)
	if err != nil {
		return nil, err
	}
	d := x.WithScales(in, &ix)
	m, xi := d.MLA, d.Indexer
	n := o.attnCheckMLA(m, segs, in, w)
	iq, ik, iw := cudaTensor(ix.Q), cudaTensor(ix.K), cudaTensor(ix.W)
	shape("dsa index q", iq, n, xi.Heads*xi.HeadDim)
	shape("dsa index k", ik, n, xi.HeadDim)
	shape("dsa index w", iw, n, xi.Heads)
	out := o.newTensor(n, x.OutWidth())
	if n == 0 {
		return out, nil
	}
	desc, lv, err := o.segments(layer, spec.RoleLatent, segs)
	if err != nil {
		return nil, err
	}
	idesc, iv, err := o.segments(layer, spec.RoleIndexKey, segs)
	if err != nil {
		return nil, err
	}
	esize := 1 // the quantized row's codes; its scale is read bytewise
	if xi.Plain {
		esize = xi.Keys.Size()
	}
	if err := checkAttnView(layer, spec.RoleIndexKey, iv, xi.RowBytes(), esize); err != nil {
		return nil, err
	}
	rs := o.attnRowSegs(segs)
	if err := o.mlaWrite(layer, m, desc, rs, lv, in, n); err != nil {
		return nil, err
	}
	if xi.Plain {
		o.run("kvx_attn_write", dim{n, 1, 1}, dim{attThreads, 1, 1}, 0,
			append([]any{idesc, rs, ik.p, xi.HeadDim, ik.p, 0}, append(iv.attnArgs(), int(xi.Keys))...)...)
	} else {
		o.run("kvx_dsa_index_write", dim{n, 1, 1}, dim{attThreads, 1, 1}, 0,
			append([]any{idesc, rs, ik.p, xi.HeadDim}, iv.attnArgs()...)...)
	}

	// Rows past their first TopK positions get a score per position.
	offs := make([]int64, 0, n)
	var total int64
	most := 0
	for _, sg := range segs {
		for i := range sg.Rows {
			p := sg.Pos + i
			if p+1 <= xi.TopK {
				offs = append(offs, -1)
				continue
			}
			offs = append(offs, total)
			total += int64(p + 1)
			most = max(most, p+1)
		}
	}
	offp := put(o, offs)
	scores := o.scratch(total * 4)
	sel := o.scratch(int64(n) * int64(xi.TopK) * 4)
	sc := xi.Scale
	if sc == 0 {
		sc = 1
	}
	plain := 0
	if xi.Plain {
		plain = 1
	}
	if most > 0 {
		o.run("kvx_dsa_index_score", dim{n, min(blocks(most, attThreads), 65535), 1}, dim{attThreads, 1, 1}, 0,
			append([]any{idesc, rs, iq.p, iw.p, scores, offp}, append(iv.attnArgs(), xi.Heads, xi.HeadDim, plain, int(xi.Keys), sc)...)...)
	}
	o.run("kvx_dsa_topk", dim{n, 1, 1}, dim{topkThreads, 1, 1}, 0, idesc, rs, scores, offp, sel, xi.TopK)
	if err := o.mlaAttend(layer, m, segs, desc, rs, lv, in, w, out, sel, xi.TopK); err != nil {
		return nil, err
	}
	return out, nil
}

// attnCheckMLA checks an MLA call's shapes and returns its rows.
func (o *ops) attnCheckMLA(m kernelspec.MLA, segs []synth.Seg, in synth.MLAIn, w synth.MLAWeights) int {
	qn, qp, ckv, kpe := cudaTensor(in.QNope), cudaTensor(in.QPE), cudaTensor(in.CKV), cudaTensor(in.KPE)
	n := qn.r
	shape("mla q_nope", qn, n, m.Heads*m.QKNopeHeadDim)
	shape("mla q_pe", qp, n, m.Heads*m.QKRopeHeadDim)
	shape("mla c_kv", ckv, n, m.KVLoraRank)
	shape("mla k_pe", kpe, n, m.QKRopeHeadDim)
	shape("mla uk", cudaTensor(w.UK), m.Heads*m.QKNopeHeadDim, m.KVLoraRank)
	shape("mla uv", cudaTensor(w.UV), m.Heads*m.VHeadDim, m.KVLoraRank)
	attnRows("mla", segs, n)
	return n
}

// mlaWrite stores the n new tokens' latent rows.
func (o *ops) mlaWrite(layer int, m kernelspec.MLA, desc, rs cu.DevicePtr, lv pagedView, in synth.MLAIn, n int) error {
	if err := checkAttnView(layer, spec.RoleLatent, lv, m.RowBytes(), m.Dtype.Size()); err != nil {
		return err
	}
	o.run("kvx_attn_write", dim{n, 1, 1}, dim{attThreads, 1, 1}, 0,
		append([]any{desc, rs, cudaTensor(in.CKV).p, m.KVLoraRank, cudaTensor(in.KPE).p, m.QKRopeHeadDim},
			append(lv.attnArgs(), int(m.Dtype))...)...)
	return nil
}

// mlaAttend launches the absorbed attention of every query row into out:
// dense, or over the topk positions per row at sel when sel is not 0.
func (o *ops) mlaAttend(layer int, m kernelspec.MLA, segs []synth.Seg, desc, rs cu.DevicePtr, lv pagedView, in synth.MLAIn, w synth.MLAWeights, out *tensor, sel cu.DevicePtr, topk int) error {
	shm := (m.QKNopeHeadDim + 2*m.KVLoraRank + m.QKRopeHeadDim + attThreads) * 4
	if shm+attStatic > attnMaxShared {
		return fmt.Errorf("cuda: layer %d: mla dimensions need %d bytes of shared memory, above %d", layer, shm+attStatic, attnMaxShared)
	}
	most := 0 // the longest context of a query row
	for _, sg := range segs {
		c := sg.Pos + sg.Rows
		if sel != 0 {
			c = min(c, topk)
		}
		most = max(most, c)
	}
	keep := attKeepOf(most, shm)
	shm += 4 * keep
	scale := m.Scale
	if scale == 0 {
		scale = float32(1 / math.Sqrt(float64(m.QKNopeHeadDim+m.QKRopeHeadDim)))
	}
	o.run("kvx_mla_attend", dim{out.r, m.Heads, 1}, dim{attThreads, 1, 1}, shm,
		append([]any{desc, rs, cudaTensor(in.QNope).p, cudaTensor(in.QPE).p, o.f32(cudaTensor(w.UK)), o.f32(cudaTensor(w.UV)), out.p},
			append(lv.attnArgs(), m.Heads, m.KVLoraRank, m.QKNopeHeadDim, m.QKRopeHeadDim, m.VHeadDim, scale, int(m.Dtype), sel, topk, keep)...)...)
	return nil
}

// attKeepOf returns how many first-pass scores an attention block keeps
// for a call whose longest context is most, its other dynamic shared
// memory shm bytes: all of them when they fit, else none.
func attKeepOf(most, shm int) int {
	if most <= attKeep && attStatic+shm+4*most <= attnMaxShared {
		return most
	}
	return 0
}
