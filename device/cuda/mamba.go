//go:build cuda && cgo

package cuda

import (
	"context"
	"fmt"

	"gorgonia.org/cu"

	"github.com/kvx-dev/kvx/device"
	"github.com/kvx-dev/kvx/device/kernelspec"
	"github.com/kvx-dev/kvx/device/paged"
	"github.com/kvx-dev/kvx/device/synth"
	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
	"github.com/kvx-dev/kvx/plugins/v1/worker"
)

// The Mamba2 state follows the cpu device's rules (see package cpu's doc):
// a sequence's live state is entry 0 of its table in the device state pool;
// a step at Pos 0 starts from zeroed state, a sequence first seen at Pos > 0
// from whatever its slot holds; the states after each row of the last
// step's draft tail are kept (in device memory) and put back when the next
// Pos says drafts were rejected; Item.Snapshots save the live state after
// their Pos tokens; the dt floor (kernelspec.Mamba2.DtMin) applies to the
// tokens before the sequence's first sampled one only.
//
// One Mamba2 call runs every segment in one pass of five kernels
// (kernels/mamba.cu) rather than the cpu's chunk per stop: the state bytes
// after any token do not depend on where a pass stops, so the kernels write
// the snapshot and draft-tail states at their positions on the way.

// seqState is what the device remembers of a sequence with Mamba layers.
type seqState struct {
	// seen: a Forward finished with the sequence, so covered, tailBase
	// and promptEnd hold (the cpu device's seqState exists).
	seen     bool
	covered  int // tokens the live state covers
	tailBase int // tokens covered by the first kept tail state
	// promptEnd is the position of the sequence's first sampled token (its
	// prompt's length), 0 until it first samples.
	promptEnd int
	// tailN[l] is how many tail states layer l keeps: entry i is the state
	// (conv then ssm bytes) after tailBase+i tokens, at tails[l].p +
	// i*(conv+ssm bytes). pendN is what this Forward's Mamba2 calls wrote
	// there, which finishStates commits.
	tailN, pendN map[int]int
	tails        map[int]*tailBuf
}

// tailBuf is device memory for one layer's draft-tail states.
type tailBuf struct {
	p   cu.DevicePtr
	cap int64
}

// free releases the sequence's device memory (on the context's goroutine).
// device.go's forget must call it for released sequences, and Close for
// every sequence left.
func (s *seqState) free() {
	for _, b := range s.tails {
		cu.MemFree(b.p)
	}
	s.tails, s.tailN, s.pendN = nil, nil, nil
}

// tail returns layer l's tail buffer with room for n bytes, growing it
// (its old contents are not kept).
func (s *seqState) tail(g *gpu, l int, n int64) (cu.DevicePtr, error) {
	if s.tails == nil {
		s.tails = map[int]*tailBuf{}
	}
	b := s.tails[l]
	if b == nil {
		b = &tailBuf{}
		s.tails[l] = b
	}
	if b.cap < n {
		p, err := g.alloc(n)
		if err != nil {
			return 0, err
		}
		if b.cap > 0 {
			cu.MemFree(b.p) // synchronizes: an earlier copy out of it has run
		}
		b.p, b.cap = p, n
	}
	return b.p, nil
}

// stateCopies batches the state moves of prepareStates: zeroed slots and
// slot copies (grouped by size, for kvx_copy_blocks).
type stateCopies struct {
	zero  []uint64 // (dst, bytes) pairs
	pairs map[int64][]uint64
	sizes []int64 // pairs' keys in first-use order
}

func (c *stateCopies) clear(dst cu.DevicePtr, n int) {
	if n > 0 {
		c.zero = append(c.zero, uint64(dst), uint64(n))
	}
}

func (c *stateCopies) copy(dst, src cu.DevicePtr, n int) {
	if n <= 0 {
		return
	}
	if c.pairs == nil {
		c.pairs = map[int64][]uint64{}
	}
	k := int64(n)
	if _, ok := c.pairs[k]; !ok {
		c.sizes = append(c.sizes, k)
	}
	c.pairs[k] = append(c.pairs[k], uint64(src), uint64(dst))
}

func (c *stateCopies) run(o *ops) {
	if len(c.zero) > 0 {
		o.run("kvx_mamba_zero", dim{len(c.zero) / 2, 1, 1}, dim{256, 1, 1}, 0, put(o, c.zero))
	}
	for _, n := range c.sizes {
		o.copyPairs(c.pairs[n], n)
	}
}

// liveSlot returns the addresses of layer l's conv and ssm state in seq's
// live slot, and their byte lengths.
func (d *Device) liveSlot(o *ops, l int, seq kvcache.SeqID) (conv, ssm cu.DevicePtr, at paged.StateAt, err error) {
	pl := d.ps.Place[l]
	tab := o.t.Table(seq, pl.Live)
	if len(tab) == 0 {
		return 0, 0, at, kvcache.ItemErrorf([]kvcache.SeqID{seq}, "seq %d: no live state slot in pool %d (%s) for mamba layer %d: its table there is empty",
			seq, d.pools[pl.Live].ID, d.pools[pl.Live].Name, l)
	}
	return d.slot(l, pl.Live, tab[0])
}

// slot returns the addresses of layer l's conv and ssm state in block b of
// the pool at index pi. Errors (wrapping kernelspec.ErrInvalid) as
// kernel.StateSlot's: a block outside the pool, a buffer outside the block.
func (d *Device) slot(l, pi int, b kvcache.BlockID) (conv, ssm cu.DevicePtr, at paged.StateAt, err error) {
	at = d.ps.Place[l].State[pi]
	p := &d.pools[pi]
	if b < 0 || int(b) >= p.Blocks {
		return 0, 0, at, fmt.Errorf("%w: state slot: block %d, pool has %d blocks", kernelspec.ErrInvalid, b, p.Blocks)
	}
	for _, r := range [][2]int{{at.Conv, at.ConvLen}, {at.SSM, at.SSMLen}} {
		if r[0] < 0 || r[1] < 0 || int64(r[0]+r[1]) > p.BlockBytes {
			return 0, 0, at, fmt.Errorf("%w: state slot: offset %d + size %d exceeds block bytes %d", kernelspec.ErrInvalid, r[0], r[1], p.BlockBytes)
		}
	}
	base := p.block(b)
	return base + cu.DevicePtr(at.Conv), base + cu.DevicePtr(at.SSM), at, nil
}

// prepareStates brings every item's live Mamba state to cover exactly Pos
// tokens: zero at Pos 0, the kept draft-tail state after rejected drafts.
// It also validates the items' snapshots. The moves of the items before an
// invalid one still run, as on the cpu device.
func (d *Device) prepareStates(o *ops, items []worker.Item) error {
	var c stateCopies
	defer c.run(o)
	for i := range items {
		it := &items[i]
		bad := func(format string, args ...any) error {
			return kvcache.ItemErrorf([]kvcache.SeqID{it.Seq}, "seq %d at pos %d: "+format, append([]any{it.Seq, it.Pos}, args...)...)
		}
		if err := d.ps.CheckSnapshots(it); err != nil {
			return err
		}
		s := d.seqs[it.Seq]
		if s != nil {
			s.pendN = nil
		}
		switch {
		case it.Pos == 0:
			for _, l := range d.ps.Mambas {
				conv, ssm, at, err := d.liveSlot(o, l, it.Seq)
				if err != nil {
					return err
				}
				c.clear(conv, at.ConvLen)
				c.clear(ssm, at.SSMLen)
			}
		case s == nil || !s.seen || s.covered == it.Pos:
			// Fresh at Pos > 0: prefix reuse copied a snapshot into the slot.
		case it.Pos >= s.tailBase && it.Pos-s.tailBase < s.tailN[d.ps.Mambas[0]]:
			k := it.Pos - s.tailBase
			for _, l := range d.ps.Mambas {
				conv, ssm, at, err := d.liveSlot(o, l, it.Seq)
				if err != nil {
					return err
				}
				if k >= s.tailN[l] {
					return bad("layer %d keeps %d draft states, fewer than layer %d", l, s.tailN[l], d.ps.Mambas[0])
				}
				saved := s.tails[l].p + cu.DevicePtr(int64(k)*int64(at.ConvLen+at.SSMLen))
				c.copy(conv, saved, at.ConvLen)
				c.copy(ssm, saved+cu.DevicePtr(at.ConvLen), at.SSMLen)
			}
		default:
			return bad("its mamba state covers %d tokens and no kept draft state covers %d", s.covered, it.Pos)
		}
	}
	return nil
}

// finishStates records, after the model's forward, what the items' live
// states cover and which draft-tail states this step kept.
func (d *Device) finishStates(o *ops, items []worker.Item) {
	for i := range items {
		it := &items[i]
		s := d.seqs[it.Seq]
		if s == nil {
			s = &seqState{}
			d.seqs[it.Seq] = s
		}
		n := len(it.Tokens)
		s.seen = true
		s.covered = it.Pos + n
		if it.Sample && s.promptEnd == 0 {
			s.promptEnd = it.Pos + n - it.Draft
		}
		s.tailBase = it.Pos + n - it.Draft
		s.tailN, s.pendN = s.pendN, nil
	}
}

// Mamba2 runs layer's Mamba2 kernel on every segment's live state slot:
// out = the gated, normed scan of segs' rows (z: d_inner, xBC: conv dim, dt:
// heads per row), the snapshots of an item whose segment is its whole step
// saved at their positions, and the states after the draft-tail rows kept
// for a rollback. Errors: a layer that is not Mamba2 here, inputs or weights
// of the wrong shapes, and item errors (no live slot, a slot outside its
// pool, a snapshot before the segment's position).
func (o *ops) Mamba2(_ context.Context, layer int, segs []synth.Seg, in synth.Mamba2In, w synth.Mamba2Weights) (synth.Tensor, error) {
	d := o.d
	if d == nil {
		return nil, fmt.Errorf("cuda: Mamba2 layer %d: ops without a device have no state pools", layer)
	}
	x := d.ps.Mix[layer]
	if x == nil || x.Kind != device.KernelMamba2 {
		return nil, fmt.Errorf("cuda: layer %d does not run the %v kernel on this stage", layer, device.KernelMamba2)
	}
	mb := x.Mamba
	di, cd, H, K := mb.Inner(), mb.ConvDim(), mb.Heads, mb.ConvKernel
	z, xbc, dt := cudaTensor(in.Z), cudaTensor(in.XBC), cudaTensor(in.DT)
	rows := z.r
	if z.c != di || xbc.r != rows || xbc.c != cd || dt.r != rows || dt.c != H {
		return nil, fmt.Errorf("cuda: mamba2 layer %d: z %d × %d, xBC %d × %d, dt %d × %d, want %d rows of %d, %d and %d",
			layer, z.r, z.c, xbc.r, xbc.c, dt.r, dt.c, rows, di, cd, H)
	}
	ws := []struct {
		name string
		t    synth.Tensor
		n    int
	}{{"conv weight", w.ConvW, cd * K}, {"conv bias", w.ConvB, cd}, {"dt bias", w.DtBias, H}, {"A", w.A, H}, {"D", w.D, H}, {"norm weight", w.NormW, di}}
	for _, v := range ws {
		if t := cudaTensor(v.t); t.r*t.c != v.n {
			return nil, fmt.Errorf("cuda: mamba2 layer %d: %s has %d values, want %d", layer, v.name, t.r*t.c, v.n)
		}
	}
	total := 0
	for _, sg := range segs {
		total += sg.Rows
	}
	if total != rows {
		return nil, fmt.Errorf("cuda: mamba2 layer %d: segments cover %d rows, the inputs have %d", layer, total, rows)
	}
	// A tile of pt rows of a head's state, pt*State <= 2048 (8 elements per
	// updater thread), one reducer per row in one warp.
	pt := max(1, min(mb.HeadDim, 2048/mb.State, 32))
	shmem := (2*pt*(mb.State+1) + 3*(pt+2*mb.State+2)) * 4
	if mb.State > 1024 {
		return nil, fmt.Errorf("cuda: mamba2 layer %d: ssm state size %d: the scan kernel takes at most 1024", layer, mb.State)
	}
	if H > 65535 || mb.Groups > 65535 {
		return nil, fmt.Errorf("cuda: mamba2 layer %d: %d heads, %d groups: at most 65535", layer, H, mb.Groups)
	}

	floors := make([]float32, rows)
	rowSeg := make([]int32, rows)
	var desc, saves []int64
	r := 0
	for _, sg := range segs {
		conv, ssm, sv, err := o.planMamba(x, sg, r, floors)
		if err != nil {
			return nil, err
		}
		if sg.Rows > 0 {
			for i := r; i < r+sg.Rows; i++ {
				rowSeg[i] = int32(len(desc) / segWordsMamba)
			}
			desc = append(desc, int64(conv), int64(ssm), int64(r), int64(sg.Rows), int64(len(saves)/saveWords), int64(len(sv)/saveWords))
			saves = append(saves, sv...)
		}
		r += sg.Rows
	}
	out := o.newTensor(rows, di)
	if rows == 0 || o.err != nil {
		return out, o.err
	}
	nseg := len(desc) / segWordsMamba
	segp, savep := put(o, desc), put(o, append(saves, 0, 0, 0))
	dts, dAs := o.scratch(int64(rows)*int64(H)*4), o.scratch(int64(rows)*int64(H)*4)
	xc, ys := o.scratch(int64(rows)*int64(cd)*4), o.scratch(int64(rows)*int64(di)*4)
	convBF16, ssmBF16 := dtypeFlag(mb.ConvDtype), dtypeFlag(mb.SSMDtype)
	wt := func(t synth.Tensor) cu.DevicePtr { return cudaTensor(t).p }

	o.run("kvx_mamba_dt", dim{blocks(rows*H, 256), 1, 1}, dim{256, 1, 1}, 0,
		dt.p, wt(w.DtBias), wt(w.A), put(o, floors), dts, dAs, rows, H)
	o.run("kvx_mamba_conv", dim{rows, blocks(cd, 256), 1}, dim{256, 1, 1}, 0,
		xbc.p, segp, put(o, rowSeg), wt(w.ConvW), wt(w.ConvB), xc, rows, cd, K, convBF16)
	if K > 1 {
		o.run("kvx_mamba_conv_state", dim{nseg, blocks(cd, 256), 1}, dim{256, 1, 1}, 0,
			xbc.p, segp, savep, cd, K, convBF16)
	}
	o.run("kvx_mamba_scan", dim{nseg, H, blocks(mb.HeadDim, pt)}, dim{scanUpdaters + 32, 1, 1}, shmem,
		xc, dts, dAs, segp, savep, wt(w.D), ys, H, mb.HeadDim, mb.State, mb.Groups, pt, ssmBF16)
	o.run("kvx_mamba_norm", dim{rows, mb.Groups, 1}, dim{128, 1, 1}, 0,
		ys, z.p, wt(w.NormW), out.p, di, mb.Groups, mb.Eps)
	return out, o.err
}

// The descriptors of kernels/mamba.cu: per segment (live conv, live ssm,
// first row, rows, first save, saves) and per save (tokens of the segment
// it follows, conv and ssm destinations).
const (
	segWordsMamba = 6
	saveWords     = 3
	scanUpdaters  = 256 // SCAN_UPDATERS: kvx_mamba_scan's threads but its last warp
)

func dtypeFlag(t kernelspec.Dtype) int {
	if t == kernelspec.BF16 {
		return 1
	}
	return 0
}

// planMamba walks segment sg (rows from r of the call) with the cpu
// device's stops: it sets the rows' dt floors (x.Mamba.DtMin before the
// sequence's promptEnd, 0 from it) and returns the live slot's conv and ssm
// addresses and the saves, in order, the cpu's passes would make: its
// item's snapshots at their positions and, for a draft tail, the state
// after every row of the tail but the last, into the sequence's tail
// buffer for the layer (recorded as pending).
func (o *ops) planMamba(x *paged.Mixer, sg synth.Seg, r int, floors []float32) (conv, ssm cu.DevicePtr, saves []int64, err error) {
	d := o.d
	l := x.Layer
	conv, ssm, live, err := d.liveSlot(o, l, sg.Seq)
	if err != nil {
		return 0, 0, nil, err // unwrapped, as the cpu device's
	}
	mb := x.Mamba
	if live.ConvLen != mb.ConvBytes() || live.SSMLen != mb.SSMBytes() {
		return 0, 0, nil, itemErrMamba(sg.Seq, l, fmt.Errorf("%w: mamba2: state of %d conv and %d ssm bytes, want %d and %d",
			kernelspec.ErrInvalid, live.ConvLen, live.SSMLen, mb.ConvBytes(), mb.SSMBytes()))
	}
	var snaps []kvcache.SnapshotSlot
	if it := o.items[sg.Seq]; it != nil && it.Pos == sg.Pos && len(it.Tokens) == sg.Rows {
		snaps = it.Snapshots
	}
	s := d.seqs[sg.Seq]
	promptEnd := sg.Pos + sg.Rows
	if s != nil && s.seen && s.promptEnd > 0 {
		promptEnd = s.promptEnd
	}
	passes, err := paged.MambaPasses(sg.Pos, sg.Rows, sg.Draft, promptEnd, snaps)
	if err != nil {
		return 0, 0, nil, itemErrMamba(sg.Seq, l, err)
	}
	var tailAt []int // indexes in saves of the tail saves
	for _, ps := range passes {
		floor := float32(0) // a generated token: transformers' decode step has no floor
		if ps.Floor {
			floor = mb.DtMin
		}
		for p := ps.From; p < ps.To; p++ {
			floors[r+p-sg.Pos] = floor
		}
		for _, sn := range ps.Snaps {
			pi, ok := d.idx[sn.Pool]
			if !ok {
				return 0, 0, nil, kvcache.ItemErrorf([]kvcache.SeqID{sg.Seq}, "seq %d layer %d: snapshot pool %d is not in the layout", sg.Seq, l, sn.Pool)
			}
			sc, ss, _, err := d.slot(l, pi, sn.Block)
			if err != nil {
				return 0, 0, nil, itemErrMamba(sg.Seq, l, err)
			}
			if live.ConvLen == 0 {
				sc = 0
			}
			saves = append(saves, int64(ps.To-sg.Pos), int64(sc), int64(ss))
		}
		if ps.Tail {
			tailAt = append(tailAt, len(saves))
			saves = append(saves, int64(ps.To-sg.Pos), 0, 0)
		}
	}
	if sg.Draft == 0 {
		return conv, ssm, saves, nil
	}
	if s == nil {
		s = &seqState{}
		d.seqs[sg.Seq] = s
	}
	if s.pendN == nil {
		s.pendN = map[int]int{}
	}
	s.pendN[l] = len(tailAt)
	if len(tailAt) == 0 {
		return conv, ssm, saves, nil
	}
	stride := int64(live.ConvLen + live.SSMLen)
	buf, err := s.tail(d.g, l, int64(len(tailAt))*stride)
	if err != nil {
		return 0, 0, nil, err
	}
	for i, k := range tailAt {
		tc := buf + cu.DevicePtr(int64(i)*stride)
		if live.ConvLen > 0 {
			saves[k+1] = int64(tc)
		}
		saves[k+2] = int64(tc + cu.DevicePtr(live.ConvLen))
	}
	return conv, ssm, saves, nil
}

func itemErrMamba(seq kvcache.SeqID, layer int, err error) error {
	return kvcache.ItemErrorf([]kvcache.SeqID{seq}, "seq %d layer %d: %v", seq, layer, err)
}
