// Package cpu is the cpu device of the worker runtime: real attention on
// real KV. It runs the synthetic model of package synth, written once over
// synth.Ops, and the Hugging Face checkpoints of package hf (when
// Model.Checkpoint is set: Llama, Mistral, Qwen3, DeepSeek-V3 and V3.2,
// Nemotron-H, Qwen3-Next, written once over hf.Ops; a checkpoint's DSA
// indexer keys are unquantized), by implementing those ops with the pure-Go reference
// kernels of package kernel:
//
//   - hostOps (ops.go): the row-wise ops (matmul, norms, activations, MoE
//     routing, embedding, argmax; hf's bias add and per-head norm), each a
//     loop over the kernel function it wraps, pinned to it bit for bit by
//     ops_test.go, so a faster loop cannot change a token;
//   - pagedOps (this file): the mixer kernels the backend chose
//     (device.Backend.Kernel, paged.Mixer in mixers.go) on pools the device
//     allocates from the manager's layout, addressed through the block
//     tables the runtime keeps, so a wrong table shows in the tokens;
//   - Reference (reference.go): the same model over the same hostOps with
//     the kernels' dense no-cache references, the oracle the paged device
//     must equal.
//
// Plug it in with device.WithDevice("cpu", cpu.Open).
//
// Because every kernel reads the cache in logical token order with one fixed
// summation order, the tokens and logits it produces are bit-identical to
// Reference, a dense no-cache recomputation: that equality is the oracle of
// every cache manager (a wrong block table or a stale state slot changes
// them).
//
// # In-block layout
//
// Every pool of the layout (device and host tier) is Blocks × BlockBytes
// bytes. A paged pool's block holds, for each layer of Pool.Layers in order
// and each of that layer's paged buffers in order, TokensPerBlock ×
// BytesPerToken bytes (token row stride BytesPerToken); a state pool's block
// (TokensPerBlock 0) holds, for each layer in order, its conv then its ssm
// state. Row formats are the kernels' (kernelspec.GQA, kernelspec.MLA,
// kernelspec.Indexer, kernelspec.Mamba2, kernelspec.GDN).
//
// # Mamba2 and Gated DeltaNet state
//
// A sequence's live state is entry 0 of its table in the state pool (the
// other entries are snapshot blocks). A step at Pos 0 starts from zeroed
// state; a sequence first seen at Pos > 0 starts from whatever its slot
// holds (prefix reuse copies a snapshot there before the forward). The
// device keeps, per sequence, the states after each row of the last step's
// draft tail and, when the next step's Pos says drafts were rejected, puts
// the matching one back into the live slot. Item.Snapshots save the live
// state after their Pos tokens into their block. A checkpoint's Mamba2
// layers (Nemotron-H) run with its numerics (paged.CheckpointMamba) and floor dt
// at kernelspec.Mamba2.DtMin on the tokens before the sequence's first sampled
// one (its prompt) only, as transformers' prefill does and its decode step
// does not. A Qwen3-Next checkpoint's Gated DeltaNet layers (kernelspec.GDN)
// keep their conv and recurrent state in the same slots and walk them the
// same way (pagedOps.walkState): snapshots, restores and draft rollback
// are the Mamba2 path's.
package cpu

import (
	"context"
	"fmt"
	"github.com/kvx-dev/kvx/device/paged"
	"slices"
	"time"

	"github.com/kvx-dev/kvx/device"
	"github.com/kvx-dev/kvx/device/cpu/kernel"
	"github.com/kvx-dev/kvx/device/hf"
	"github.com/kvx-dev/kvx/device/synth"
	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
	"github.com/kvx-dev/kvx/plugins/v1/spec"
	"github.com/kvx-dev/kvx/plugins/v1/worker"
)

// MaxPoolBytes is the most pool memory (all pools, both tiers) one stage may
// allocate on the cpu device.
const MaxPoolBytes int64 = 2 << 30

var _ device.Device = (*Device)(nil)

// Device is one configured stage on the cpu. Make it with Open. Like every
// device its calls come from one goroutine at a time.
type Device struct {
	cfg worker.Config // Layout and Model.Layers are not kept
	ps  *paged.Stage  // what paged.NewStage checked and loaded
	// run is the model's forward over the step's ops: the synthetic
	// model's (synth.Stage) or a checkpoint's (hf.Stage).
	run    func(ctx context.Context, pm *pagedOps, st synth.Step) (synth.Result, error)
	first  bool // stage 0: embeds tokens, takes no hidden
	last   bool
	hidden int

	pools  []pool
	byID   []kernel.Pool // indexed by pool id, for kernel.CopyBlocks
	idx    map[int]int   // pool id -> index in pools
	place  map[int]*paged.Placement
	mix    map[int]*paged.Mixer // mixer layers of the stage by layer index
	mambas []int                // Mamba layers of the stage, ascending

	queued []kvcache.Copy // CopyBlocks since the last Forward
	seqs   map[kvcache.SeqID]*seqState
}

// seqState is what the device remembers of a sequence with Mamba layers.
type seqState struct {
	covered  int // tokens the live state covers
	tailBase int // tokens covered by tail[l][0]
	// tail[l][i] is layer l's state (conv then ssm) after tailBase+i tokens:
	// the states through the last step's draft rows, but the last.
	tail map[int][][]byte
	// promptEnd is the position of the sequence's first sampled token (its
	// prompt's length), 0 until it first samples: the Mamba2 dt floor
	// (kernelspec.Mamba2.DtMin) applies to the tokens before it only.
	promptEnd int
}

// Options configure OpenWith.
type Options struct {
	// WrapHF, when set, wraps the ops a checkpoint model (package hf) runs
	// over at every Forward: a test seam for a deliberately wrong kernel.
	WrapHF func(hf.Ops) hf.Ops
}

// OpenWith returns Open with options o.
func OpenWith(o Options) device.OpenFunc {
	return func(s device.Stage) (device.Device, error) { return open(s, o) }
}

// Open makes the cpu device for a stage: the synthetic model of package
// synth with the config's seed, or, when Model.Checkpoint is set, that
// checkpoint's weights and architecture (package hf). It fails, naming the
// field, the value and the limit, on tensor parallelism > 1, a synthetic
// GDN model (Qwen3-Next without a checkpoint), a KV dtype other than bf16, fp8 or float32, more draft
// tokens than the model's MTP layers, buffer widths the kernels do not
// produce, a pool whose BlockBytes differs from the in-block layout (see
// the package doc), pools above MaxPoolBytes in all, or a checkpoint that
// does not load (hf.New's errors), or a dtype other than float32.
func Open(s device.Stage) (device.Device, error) { return open(s, Options{}) }

func open(s device.Stage, o Options) (device.Device, error) {
	cfg := s.Config
	if cfg.Dtype != "" && cfg.Dtype != worker.DtypeFloat32 {
		return nil, fmt.Errorf("cpu: dtype %q: the cpu device computes in %s only (its kernels are the exact reference)", cfg.Dtype, worker.DtypeFloat32)
	}
	ps, err := paged.NewStage("cpu", s, hostOps{})
	if err != nil {
		return nil, err
	}
	run := func(ctx context.Context, pm *pagedOps, st synth.Step) (synth.Result, error) {
		var ops hf.Ops = pm
		if o.WrapHF != nil && ps.HF != nil {
			ops = o.WrapHF(ops)
		}
		return ps.Model(ctx, ops, st)
	}
	d := &Device{cfg: *cfg, ps: ps, run: run, first: ps.First, last: ps.Last, hidden: cfg.Model.Hidden,
		idx: map[int]int{}, mix: ps.Mix, mambas: ps.Mambas, place: ps.Place, seqs: map[kvcache.SeqID]*seqState{}}
	d.cfg.Layout = kvcache.Layout{}
	d.cfg.Model.Layers = nil
	pools := ps.Pools
	var total int64
	maxID := -1
	for _, p := range pools {
		total += int64(p.Blocks) * p.BlockBytes
		maxID = max(maxID, p.ID)
	}
	if total > MaxPoolBytes {
		return nil, fmt.Errorf("pools take %d bytes in all (%d pools), above the cpu device's limit of %d per stage: lower kv_cache_config.max_tokens or free_gpu_memory_fraction",
			total, len(pools), MaxPoolBytes)
	}
	d.byID = make([]kernel.Pool, maxID+1)
	for i, p := range pools {
		mem := kernel.Pool{Data: make([]byte, int64(p.Blocks)*p.BlockBytes), BlockBytes: int(p.BlockBytes)}
		d.pools = append(d.pools, pool{Pool: p, mem: mem})
		d.byID[p.ID] = mem
		d.idx[p.ID] = i
	}
	return d, nil
}

// Modelled is false: Forward's time is measured.
func (d *Device) Modelled() bool { return false }

// CopyBlocks queues copies for the next Forward, which runs them before
// b.Copies. Errors: copies between pools of different BlockBytes (nothing
// is queued then).
func (d *Device) CopyBlocks(_ context.Context, copies []kvcache.Copy) error {
	for i, c := range copies {
		if d.byID[c.SrcPool].BlockBytes != d.byID[c.DstPool].BlockBytes {
			return kvcache.Errorf(kvcache.KindInvalidArg, "copies[%d]: src pool %d block bytes %d, dst pool %d block bytes %d: must be equal",
				i, c.SrcPool, d.byID[c.SrcPool].BlockBytes, c.DstPool, d.byID[c.DstPool].BlockBytes)
		}
	}
	d.queued = append(d.queued, copies...)
	return nil
}

// Forward runs the queued copies and b.Copies, then the stage's layers on
// b's items, reading and writing the KV through t. Pass.Nanos is the
// measured wall time of the whole call. Errors: a hidden state that does not
// fit the items (KindInvalidArg), item problems (*kvcache.Error with Seqs:
// bad snapshots, a Mamba state that cannot be brought to Pos, a table that
// does not cover the tokens), invalid copies (KindInvalidArg).
func (d *Device) Forward(ctx context.Context, b *worker.Batch, t *device.Tables) (device.Pass, error) {
	start := time.Now()
	for _, s := range b.Released {
		delete(d.seqs, s)
	}
	copies := append(d.queued, b.Copies...)
	d.queued = nil
	if err := kernel.CopyBlocks(d.byID, copies); err != nil {
		return device.Pass{}, kvcache.Errorf(kvcache.KindInvalidArg, "%v", err)
	}
	rows := 0
	for i := range b.Items {
		rows += len(b.Items[i].Tokens)
	}
	if d.first && len(b.Hidden) != 0 {
		return device.Pass{}, kvcache.Errorf(kvcache.KindInvalidArg, "stage %d got %d bytes of hidden state; the first stage takes none", d.cfg.Stage, len(b.Hidden))
	}
	if !d.first {
		if _, err := synth.DecodeHidden(b.Hidden, rows, d.hidden); err != nil {
			return device.Pass{}, kvcache.Errorf(kvcache.KindInvalidArg, "stage %d: %v", d.cfg.Stage, err)
		}
	}
	pm := &pagedOps{d: d, t: t, items: make(map[kvcache.SeqID]*worker.Item, len(b.Items))}
	for i := range b.Items {
		pm.items[b.Items[i].Seq] = &b.Items[i]
	}
	if len(d.mambas) > 0 {
		if err := d.prepareStates(b.Items, t); err != nil {
			return device.Pass{}, err
		}
		pm.tails = map[kvcache.SeqID]map[int][][]byte{}
	}
	step := synth.Step{Items: synth.ItemsFrom(b.Items), Hidden: b.Hidden, Logits: worker.WantLogits(b.Items)}
	if d.last {
		step.Drafts = d.cfg.DraftTokens
	}
	res, err := d.run(ctx, pm, step)
	if err != nil {
		return device.Pass{}, err
	}
	for i := range b.Items {
		it := &b.Items[i]
		if len(d.mambas) == 0 {
			break
		}
		s := d.seqs[it.Seq]
		if s == nil {
			s = &seqState{}
			d.seqs[it.Seq] = s
		}
		n := len(it.Tokens)
		s.covered = it.Pos + n
		if it.Sample && s.promptEnd == 0 {
			s.promptEnd = it.Pos + n - it.Draft
		}
		s.tailBase = it.Pos + n - it.Draft
		s.tail = pm.tails[it.Seq]
	}
	return device.Pass{Nanos: time.Since(start).Nanoseconds(), Hidden: res.Hidden, Outputs: res.Outputs, Prompt: res.Prompt}, nil
}

// liveSlot returns layer l's conv and ssm bytes in seq's live state slot.
func (d *Device) liveSlot(l int, seq kvcache.SeqID, t *device.Tables) (conv, ssm []byte, err error) {
	pl := d.place[l]
	tab := t.Table(seq, pl.Live)
	if len(tab) == 0 {
		return nil, nil, kvcache.ItemErrorf([]kvcache.SeqID{seq}, "seq %d: no live state slot in pool %d (%s) for mamba layer %d: its table there is empty",
			seq, d.pools[pl.Live].ID, d.pools[pl.Live].Name, l)
	}
	return d.slot(l, pl.Live, tab[0])
}

// slot returns layer l's conv and ssm bytes in block b of the pool at index pi.
func (d *Device) slot(l, pi int, b kvcache.BlockID) (conv, ssm []byte, err error) {
	at := d.place[l].State[pi]
	mem := d.pools[pi].mem
	if conv, err = kernel.StateSlot(mem, b, at.Conv, at.ConvLen); err != nil {
		return nil, nil, err
	}
	if ssm, err = kernel.StateSlot(mem, b, at.SSM, at.SSMLen); err != nil {
		return nil, nil, err
	}
	return conv, ssm, nil
}

// prepareStates brings every item's live Mamba state to cover exactly Pos
// tokens: zero at Pos 0, the saved draft-tail state after rejected drafts.
// It also validates the items' snapshots.
func (d *Device) prepareStates(items []worker.Item, t *device.Tables) error {
	for i := range items {
		it := &items[i]
		bad := func(format string, args ...any) error {
			return kvcache.ItemErrorf([]kvcache.SeqID{it.Seq}, "seq %d at pos %d: "+format, append([]any{it.Seq, it.Pos}, args...)...)
		}
		if err := d.ps.CheckSnapshots(it); err != nil {
			return err
		}
		s := d.seqs[it.Seq]
		switch {
		case it.Pos == 0:
			for _, l := range d.mambas {
				conv, ssm, err := d.liveSlot(l, it.Seq, t)
				if err != nil {
					return err
				}
				clear(conv)
				clear(ssm)
			}
		case s == nil || s.covered == it.Pos:
			// Fresh at Pos > 0: prefix reuse copied a snapshot into the slot.
		case it.Pos >= s.tailBase && it.Pos-s.tailBase < len(s.tail[d.mambas[0]]):
			for _, l := range d.mambas {
				conv, ssm, err := d.liveSlot(l, it.Seq, t)
				if err != nil {
					return err
				}
				saved := s.tail[l][it.Pos-s.tailBase]
				copy(conv, saved)
				copy(ssm, saved[len(conv):])
			}
		default:
			return bad("its mamba state covers %d tokens and no kept draft state covers %d", s.covered, it.Pos)
		}
	}
	return nil
}

// pagedOps is synth.Ops over the paged kernels, for one Forward: hostOps'
// row-wise ops, and the mixer kernels on the device's pools through the
// runtime's block tables.
type pagedOps struct {
	hostOps
	d     *Device
	t     *device.Tables
	items map[kvcache.SeqID]*worker.Item
	tails map[kvcache.SeqID]map[int][][]byte // states through the draft rows, by seq and layer
}

var (
	_ synth.Ops = (*pagedOps)(nil)
	_ hf.Ops    = (*pagedOps)(nil)
	_ hf.GDNOps = (*pagedOps)(nil)
)

func itemErr(seq kvcache.SeqID, layer int, err error) error {
	return kvcache.ItemErrorf([]kvcache.SeqID{seq}, "seq %d layer %d: %v", seq, layer, err)
}

// paged returns the view of layer's buffer role for seq.
func (pm *pagedOps) paged(layer int, role spec.Role, seq kvcache.SeqID) kernel.Paged {
	at := pm.d.place[layer].Paged[role]
	p := &pm.d.pools[at.Pool]
	return kernel.Paged{Data: p.mem.Data, BlockBytes: int(p.BlockBytes), Offset: at.Offset, TokensPerBlock: p.TokensPerBlock,
		Stride: at.Stride, Table: pm.t.Table(seq, at.Pool)}
}

// kernelOf returns layer's kernel configuration, which must be k.
func kernelOf(mix map[int]*paged.Mixer, layer int, k device.Kernel) (*paged.Mixer, error) {
	x := mix[layer]
	if x == nil || x.Kind != k {
		return nil, fmt.Errorf("cpu: layer %d does not run the %v kernel on this stage", layer, k)
	}
	return x, nil
}

func (pm *pagedOps) GQA(_ context.Context, layer int, segs []synth.Seg, q, k, v synth.Tensor) (synth.Tensor, error) {
	x, err := kernelOf(pm.d.mix, layer, device.KernelGQA)
	if err != nil {
		return nil, err
	}
	core := newTensor(q.Rows(), x.OutWidth())
	err = eachSeg(layer, segs, func(sg synth.Seg, lo, hi int) error {
		return kernel.GQA(x.GQA, pm.paged(layer, spec.RoleKV, sg.Seq), sg.Pos, rowsOf(q, lo, hi), rowsOf(k, lo, hi), rowsOf(v, lo, hi), core.rowsOf(lo, hi))
	})
	if err != nil {
		return nil, err
	}
	return core, nil
}

// eachSeg runs f on every segment with its rows [lo, hi) of the call, in
// order, and stops at the first error, returned as that sequence's item
// error.
func eachSeg(layer int, segs []synth.Seg, f func(sg synth.Seg, lo, hi int) error) error {
	r := 0
	for _, sg := range segs {
		lo, hi := r, r+sg.Rows
		if err := f(sg, lo, hi); err != nil {
			return itemErr(sg.Seq, layer, err)
		}
		r = hi
	}
	return nil
}

func (pm *pagedOps) MLA(_ context.Context, layer int, segs []synth.Seg, in synth.MLAIn, w synth.MLAWeights) (synth.Tensor, error) {
	x, err := kernelOf(pm.d.mix, layer, device.KernelMLA)
	if err != nil {
		return nil, err
	}
	mw := mlaWeights(w)
	core := newTensor(in.QNope.Rows(), x.OutWidth())
	err = eachSeg(layer, segs, func(sg synth.Seg, lo, hi int) error {
		mi, _ := mlaRows(in, nil, sg.Pos, lo, hi)
		return kernel.MLA(x.WithScales(in, nil).MLA, pm.paged(layer, spec.RoleLatent, sg.Seq), &mw, mi, core.rowsOf(lo, hi))
	})
	if err != nil {
		return nil, err
	}
	return core, nil
}

func (pm *pagedOps) DSA(_ context.Context, layer int, segs []synth.Seg, in synth.MLAIn, ix synth.IndexIn, w synth.MLAWeights) (synth.Tensor, error) {
	x, err := kernelOf(pm.d.mix, layer, device.KernelDSA)
	if err != nil {
		return nil, err
	}
	mw := mlaWeights(w)
	core := newTensor(in.QNope.Rows(), x.OutWidth())
	err = eachSeg(layer, segs, func(sg synth.Seg, lo, hi int) error {
		mi, ki := mlaRows(in, &ix, sg.Pos, lo, hi)
		return kernel.DSA(x.WithScales(in, &ix), pm.paged(layer, spec.RoleLatent, sg.Seq), pm.paged(layer, spec.RoleIndexKey, sg.Seq), &mw, mi, ki, core.rowsOf(lo, hi), nil)
	})
	if err != nil {
		return nil, err
	}
	return core, nil
}

func (pm *pagedOps) Mamba2(_ context.Context, layer int, segs []synth.Seg, in synth.Mamba2In, w synth.Mamba2Weights) (synth.Tensor, error) {
	x, err := kernelOf(pm.d.mix, layer, device.KernelMamba2)
	if err != nil {
		return nil, err
	}
	mw := mamba2Weights(w)
	di := x.OutWidth()
	core := newTensor(in.Z.Rows(), di)
	r := 0
	for _, sg := range segs {
		promptEnd := sg.Pos + sg.Rows // the dt floor's end (seqState.promptEnd)
		if s := pm.d.seqs[sg.Seq]; s != nil && s.promptEnd > 0 {
			promptEnd = s.promptEnd
		}
		err := pm.walkState(layer, sg, promptEnd, func(conv, ssm []byte, lo, hi int, floor bool) error {
			mb := x.Mamba
			if !floor {
				mb.DtMin = 0
			}
			lo, hi = r+lo, r+hi
			return kernel.Mamba2(mb, &mw, conv, ssm, rowsOf(in.Z, lo, hi), rowsOf(in.XBC, lo, hi), rowsOf(in.DT, lo, hi), core.d[lo*di:hi*di:hi*di])
		})
		if err != nil {
			return nil, err
		}
		r += sg.Rows
	}
	return core, nil
}

// GatedDeltaNet implements hf.GDNOps: layer's GDN kernel on the sequences'
// live state slots, with the snapshots and draft-tail states of the Mamba2
// path (walkState; no dt floor).
func (pm *pagedOps) GatedDeltaNet(_ context.Context, layer int, segs []synth.Seg, in hf.GDNIn, w hf.GDNWeights) (synth.Tensor, error) {
	x, err := kernelOf(pm.d.mix, layer, device.KernelGDN)
	if err != nil {
		return nil, err
	}
	gw := gdnWeights(w)
	di := x.OutWidth()
	core := newTensor(in.Z.Rows(), di)
	r := 0
	for _, sg := range segs {
		err := pm.walkState(layer, sg, 0, func(conv, ssm []byte, lo, hi int, _ bool) error {
			lo, hi = r+lo, r+hi
			return kernel.GDN(x.GDN, &gw, conv, ssm, rowsOf(in.QKV, lo, hi), rowsOf(in.Z, lo, hi), rowsOf(in.B, lo, hi), rowsOf(in.A, lo, hi),
				core.d[lo*di:hi*di:hi*di])
		})
		if err != nil {
			return nil, err
		}
		r += sg.Rows
	}
	return core, nil
}

// walkState runs one sequence's rows of a state-space layer (Mamba2, GDN)
// on its live slot through run, pass by pass (paged.MambaPasses: rows
// [lo, hi) of the segment, with the dt floor when floor; promptEnd is the
// floor's end, 0 for none), stopping at every snapshot position (to save
// the state there) and after every row of the draft tail (to keep the
// state for a rollback).
func (pm *pagedOps) walkState(layer int, sg synth.Seg, promptEnd int, run func(conv, ssm []byte, lo, hi int, floor bool) error) error {
	d := pm.d
	conv, ssm, err := d.liveSlot(layer, sg.Seq, pm.t)
	if err != nil {
		return err
	}
	var snaps []kvcache.SnapshotSlot
	if it := pm.items[sg.Seq]; it != nil && it.Pos == sg.Pos && len(it.Tokens) == sg.Rows {
		snaps = it.Snapshots
	}
	var tail [][]byte
	passes, err := paged.MambaPasses(sg.Pos, sg.Rows, sg.Draft, promptEnd, snaps)
	if err != nil {
		return itemErr(sg.Seq, layer, err)
	}
	for _, ps := range passes {
		if err := run(conv, ssm, ps.From-sg.Pos, ps.To-sg.Pos, ps.Floor); err != nil {
			return itemErr(sg.Seq, layer, err)
		}
		for _, sn := range ps.Snaps {
			sc, ss, err := d.slot(layer, d.idx[sn.Pool], sn.Block)
			if err != nil {
				return itemErr(sg.Seq, layer, err)
			}
			copy(sc, conv)
			copy(ss, ssm)
		}
		if ps.Tail {
			tail = append(tail, append(slices.Clip(slices.Clone(conv)), ssm...))
		}
	}
	if sg.Draft > 0 {
		byLayer := pm.tails[sg.Seq]
		if byLayer == nil {
			byLayer = map[int][][]byte{}
			pm.tails[sg.Seq] = byLayer
		}
		byLayer[layer] = tail
	}
	return nil
}
