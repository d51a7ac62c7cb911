//go:build cuda && cgo

package cuda

import (
	"context"
	"fmt"
	"os"
	"slices"
	"sync"
	"time"
	"unsafe"

	"gorgonia.org/cu"

	"github.com/kvx-dev/kvx/device"
	"github.com/kvx-dev/kvx/device/paged"
	"github.com/kvx-dev/kvx/device/synth"
	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
	"github.com/kvx-dev/kvx/plugins/v1/spec"
	"github.com/kvx-dev/kvx/plugins/v1/worker"
)

var _ device.Device = (*Device)(nil)

// The process's one context: every stage a worker process configures (and
// every re-Configure) shares it, so its kernels load once.
var (
	theGPU    *gpu
	theGPUErr error
	gpuOnce   sync.Once
)

func sharedGPU() (*gpu, error) {
	gpuOnce.Do(func() { theGPU, theGPUErr = newGPU(0) })
	return theGPU, theGPUErr
}

// Device is one configured stage on the GPU. Make it with Open. Like every
// device its calls come from one goroutine at a time; they run on the
// context's goroutine.
type Device struct {
	g      *gpu
	cfg    worker.Config // Layout and Model.Layers are not kept
	ps     *paged.Stage
	hidden int

	pools   []pool
	idx     map[int]int // pool id -> index in pools
	weights []cu.DevicePtr
	ar      arena
	tables  map[tableKey]*devTable
	queued  []kvcache.Copy // CopyBlocks since the last Forward
	seqs    map[kvcache.SeqID]*seqState

	forwards int    // Forward calls so far
	fault    *fault // CUDA_KVX_FAULT (fault.go)
}

// pool is one pool of the layout: device memory, or pinned device-mapped
// host memory for the host tier. addr is its address in the context (the
// same for both kinds: unified addressing).
type pool struct {
	kvcache.Pool
	addr cu.DevicePtr
	host unsafe.Pointer // the host tier's allocation; nil on the device tier
}

func (p *pool) bytes() int64 { return int64(p.Blocks) * p.BlockBytes }

// block returns the address of block b.
func (p *pool) block(b kvcache.BlockID) cu.DevicePtr {
	return p.addr + cu.DevicePtr(int64(b)*p.BlockBytes)
}

// tableKey names one sequence's block table in one pool (by pool index).
type tableKey struct {
	seq  kvcache.SeqID
	pool int
}

// devTable is the device's copy of one block table: Forward uploads only
// the entries that changed since the last upload (a decode step that adds
// no block uploads nothing).
type devTable struct {
	p    cu.DevicePtr
	cap  int
	sent []kvcache.BlockID // what p holds
}

// Open makes the cuda device for a stage on GPU 0: the synthetic model or
// the checkpoint (paged.NewStage, with its errors), its weights and pools in
// GPU memory. Errors beyond paged.NewStage's: a Qwen3-Next model
// (paged.ArchGDN: this device has no Gated DeltaNet kernel), no usable GPU
// (the driver's error), pools that do not fit in the GPU's free memory
// (naming both).
func Open(s device.Stage) (device.Device, error) {
	if m := &s.Config.Model; m.Arch == paged.ArchGDN {
		return nil, fmt.Errorf("cuda: model %q arch %s: the cuda device has no Gated DeltaNet kernel; run it on the cpu device (device: cpu)", m.Name, m.Arch)
	}
	f, err := parseFault(os.Getenv(faultEnv))
	if err != nil {
		return nil, err
	}
	g, err := sharedGPU()
	if err != nil {
		return nil, err
	}
	d := &Device{g: g, cfg: *s.Config, hidden: s.Config.Model.Hidden, idx: map[int]int{},
		tables: map[tableKey]*devTable{}, seqs: map[kvcache.SeqID]*seqState{}, fault: f}
	d.cfg.Layout = kvcache.Layout{}
	d.cfg.Model.Layers = nil
	d.ar.g = g
	err = g.do(func() error {
		load := &ops{g: g, ar: &d.ar, weights: &d.weights, fast: d.fast()}
		ps, err := paged.NewStage(Name, s, load)
		load.freeStage()
		if err != nil {
			return err
		}
		if load.err != nil {
			return load.err
		}
		d.ps = ps
		return d.allocPools()
	})
	if err != nil {
		d.Close()
		return nil, err
	}
	return d, nil
}

// fast reports whether the stage runs the fast numerics (dtype bfloat16):
// bf16 linear weights on tensor cores, deterministic and batch-invariant
// but not the cpu's order; float32 (and a host older than the dtype field)
// runs the exact kernels.
func (d *Device) fast() bool { return d.cfg.Dtype == worker.DtypeBF16 }

// allocPools allocates the layout's pools, zeroed, after checking they fit.
func (d *Device) allocPools() error {
	var devBytes int64
	for _, p := range d.ps.Pools {
		if p.Tier != kvcache.TierHost {
			devBytes += int64(p.Blocks) * p.BlockBytes
		}
	}
	free, total, err := d.g.memInfo()
	if err != nil {
		return fmt.Errorf("cuda: memory info: %w", err)
	}
	if devBytes > free {
		return fmt.Errorf("cuda: the layout's device pools take %d bytes, above the %d bytes free on %s (total %d) after the weights: lower free_gpu_memory_fraction or kv_cache_config.max_tokens",
			devBytes, free, d.g.name, total)
	}
	for i, p := range d.ps.Pools {
		q := pool{Pool: p}
		n := q.bytes()
		if p.Tier == kvcache.TierHost {
			h, a, err := d.g.allocHost(n)
			if err != nil {
				return fmt.Errorf("pool %d (%s): %w", p.ID, p.Name, err)
			}
			clear(unsafe.Slice((*byte)(h), n))
			q.host, q.addr = h, a
		} else {
			a, err := d.g.alloc(n)
			if err != nil {
				return fmt.Errorf("pool %d (%s): %w", p.ID, p.Name, err)
			}
			if err := cu.MemsetD8(a, 0, n); err != nil {
				return fmt.Errorf("pool %d (%s): zero: %w", p.ID, p.Name, err)
			}
			q.addr = a
		}
		d.pools = append(d.pools, q)
		d.idx[p.ID] = i
	}
	return nil
}

// Close frees the stage's GPU memory (the worker calls it before a
// re-Configure opens the next device). The device is unusable afterwards.
func (d *Device) Close() error {
	return d.g.do(func() error {
		for _, p := range d.pools {
			if p.host != nil {
				d.g.freeHost(p.host)
			} else {
				cu.MemFree(p.addr)
			}
		}
		for _, w := range d.weights {
			cu.MemFree(w)
		}
		for _, t := range d.tables {
			cu.MemFree(t.p)
		}
		for _, s := range d.seqs {
			s.free()
		}
		d.ar.free()
		if d.g.prof != nil {
			d.g.prof.write()
		}
		d.pools, d.weights, d.tables = nil, nil, nil
		return nil
	})
}

// Modelled is false: Forward's time is measured.
func (d *Device) Modelled() bool { return false }

// CopyBlocks queues copies for the next Forward, which runs them before
// b.Copies. Errors: copies between pools of different BlockBytes (nothing
// is queued then).
func (d *Device) CopyBlocks(_ context.Context, copies []kvcache.Copy) error {
	if err := d.checkCopies(copies); err != nil {
		return err
	}
	d.queued = append(d.queued, copies...)
	return nil
}

func (d *Device) checkCopies(copies []kvcache.Copy) error {
	for i, c := range copies {
		si, ok1 := d.idx[c.SrcPool]
		di, ok2 := d.idx[c.DstPool]
		if !ok1 || !ok2 {
			return kvcache.Errorf(kvcache.KindInvalidArg, "copies[%d]: pool %d or %d is not in the layout", i, c.SrcPool, c.DstPool)
		}
		s, t := &d.pools[si], &d.pools[di]
		if s.BlockBytes != t.BlockBytes {
			return kvcache.Errorf(kvcache.KindInvalidArg, "copies[%d]: src pool %d block bytes %d, dst pool %d block bytes %d: must be equal",
				i, c.SrcPool, s.BlockBytes, c.DstPool, t.BlockBytes)
		}
		if c.SrcBlock < 0 || int(c.SrcBlock) >= s.Blocks || c.DstBlock < 0 || int(c.DstBlock) >= t.Blocks {
			return kvcache.Errorf(kvcache.KindInvalidArg, "copies[%d]: block %d of pool %d (%d blocks) to block %d of pool %d (%d blocks): out of range",
				i, c.SrcBlock, c.SrcPool, s.Blocks, c.DstBlock, c.DstPool, t.Blocks)
		}
	}
	return nil
}

// copyBlocks runs copies in order with one kernel launch per run of copies
// of the same block size: every thread block moves one block, device↔device,
// device↔host (pinned, mapped) alike. Copies that write a block another
// copy of the same launch reads or writes are split into separate launches,
// so the order of copies holds.
func (d *Device) copyBlocks(o *ops, copies []kvcache.Copy) {
	for len(copies) > 0 {
		n := 0
		var size int64
		read, written := map[cu.DevicePtr]bool{}, map[cu.DevicePtr]bool{}
		var pairs []uint64
		for _, c := range copies {
			s, t := &d.pools[d.idx[c.SrcPool]], &d.pools[d.idx[c.DstPool]]
			src, dst := s.block(c.SrcBlock), t.block(c.DstBlock)
			if n > 0 && (s.BlockBytes != size || written[src] || written[dst] || read[dst]) {
				break
			}
			size = s.BlockBytes
			read[src], written[dst] = true, true
			pairs = append(pairs, uint64(src), uint64(dst))
			n++
		}
		o.copyPairs(pairs, size)
		copies = copies[n:]
	}
}

// copyPairs launches kvx_copy_blocks over (src, dst) address pairs of size
// bytes each.
func (o *ops) copyPairs(pairs []uint64, size int64) {
	if len(pairs) == 0 {
		return
	}
	p := put(o, pairs)
	o.run("kvx_copy_blocks", dim{len(pairs) / 2, 1, 1}, dim{256, 1, 1}, 0, p, size)
}

// table returns the device address of seq's table in the pool at index pi,
// uploading what changed since the last call, and its length.
func (d *Device) table(o *ops, seq kvcache.SeqID, pi int) (cu.DevicePtr, int) {
	host := o.t.Table(seq, pi)
	k := tableKey{seq, pi}
	dt := d.tables[k]
	if dt == nil {
		dt = &devTable{}
		d.tables[k] = dt
	}
	if len(host) > dt.cap {
		c := max(2*dt.cap, len(host), 64)
		p, err := d.g.alloc(int64(c) * 4)
		if err != nil {
			o.fail(err)
			return 0, 0
		}
		if dt.cap > 0 {
			cu.MemFree(dt.p)
		}
		dt.p, dt.cap, dt.sent = p, c, dt.sent[:0]
	}
	i := 0
	for i < len(host) && i < len(dt.sent) && host[i] == dt.sent[i] {
		i++
	}
	if i < len(host) && o.err == nil {
		o.fail(upload(dt.p+cu.DevicePtr(4*i), host[i:]))
	}
	dt.sent = append(dt.sent[:i], host[i:]...)
	return dt.p, len(host)
}

// forget drops the device tables of released sequences.
func (d *Device) forget(seqs []kvcache.SeqID) {
	if len(seqs) == 0 {
		return
	}
	gone := map[kvcache.SeqID]bool{}
	for _, s := range seqs {
		gone[s] = true
		if st := d.seqs[s]; st != nil {
			st.free()
		}
		delete(d.seqs, s)
	}
	for k, t := range d.tables {
		if gone[k.seq] {
			cu.MemFree(t.p)
			delete(d.tables, k)
		}
	}
}

// pagedView is where layer's buffer role lives for the paged kernels: the
// device pool's base address, block bytes and tokens per block, and the
// buffer's byte offset inside a block and its row stride.
type pagedView struct {
	pool                       int // index in the layout
	base                       cu.DevicePtr
	blockBytes, offset, stride int64
	tokensPerBlock             int
}

func (d *Device) pagedView(layer int, role spec.Role) (pagedView, bool) {
	pl := d.ps.Place[layer]
	if pl == nil {
		return pagedView{}, false
	}
	at, ok := pl.Paged[role]
	if !ok {
		return pagedView{}, false
	}
	p := &d.pools[at.Pool]
	return pagedView{pool: at.Pool, base: p.addr, blockBytes: p.BlockBytes, offset: int64(at.Offset), stride: int64(at.Stride),
		tokensPerBlock: p.TokensPerBlock}, true
}

// Segment descriptors, what the mixer kernels read per segment of a call:
// segWords int64 values per segment.
const (
	segTable = iota // device address of the block table (int32 entries)
	segPos          // tokens before this call (Seg.Pos)
	segRows         // rows of this call
	segRow0         // the segment's first row in the call's tensors
	segWords
)

// segments uploads the descriptors of segs for layer's buffer role: each
// table covers the segment's last position with blocks of the pool.
// Errors: a segment whose table does not (an item error).
func (o *ops) segments(layer int, role spec.Role, segs []synth.Seg) (cu.DevicePtr, pagedView, error) {
	v, ok := o.d.pagedView(layer, role)
	if !ok {
		return 0, v, fmt.Errorf("cuda: layer %d has no %s buffer in a device pool", layer, role)
	}
	// Every layer of a pool (and window) uploads the same descriptors.
	window := 0
	if x := o.d.ps.Mix[layer]; x != nil && x.Kind == device.KernelGQA {
		window = x.GQA.Window
	}
	m, key := o.memoFor(segs), descKey{pool: v.pool, window: window, role: role}
	if d, ok := m.desc[key]; ok && d.v == v {
		return d.p, v, o.err
	}
	desc := make([]int64, 0, segWords*len(segs))
	row := 0
	for _, sg := range segs {
		tab, n := o.d.table(o, sg.Seq, v.pool)
		if need := sg.Pos + sg.Rows; n*v.tokensPerBlock < need {
			return 0, v, kvcache.ItemErrorf([]kvcache.SeqID{sg.Seq}, "seq %d layer %d: its table in pool %d has %d blocks of %d tokens, fewer than the %d positions this step writes",
				sg.Seq, layer, o.d.pools[v.pool].ID, n, v.tokensPerBlock, need)
		}
		// Blocks before the first position the call reads (a sliding
		// window's) may be freed (-1): only the rest must be valid.
		first := 0
		if x := o.d.ps.Mix[layer]; x != nil && x.Kind == device.KernelGQA && x.GQA.Window > 0 {
			first = max(0, sg.Pos-x.GQA.Window+1)
		}
		host := o.t.Table(sg.Seq, v.pool)
		for _, b := range host[first/v.tokensPerBlock : blocks(sg.Pos+sg.Rows, v.tokensPerBlock)] {
			if b < 0 || int(b) >= o.d.pools[v.pool].Blocks {
				return 0, v, kvcache.ItemErrorf([]kvcache.SeqID{sg.Seq}, "seq %d layer %d: block %d is outside pool %d (%d blocks)",
					sg.Seq, layer, b, o.d.pools[v.pool].ID, o.d.pools[v.pool].Blocks)
			}
		}
		desc = append(desc, int64(tab), int64(sg.Pos), int64(sg.Rows), int64(row))
		row += sg.Rows
	}
	p := put(o, desc)
	if o.err == nil {
		if m.desc == nil {
			m.desc = map[descKey]descVal{}
		}
		m.desc[key] = descVal{p, v}
	}
	return p, v, o.err
}

// Forward runs the queued copies and b.Copies, then the stage's layers on
// b's items, reading and writing the KV through t. Pass.Nanos is the wall
// time of the whole call, the GPU synchronized at its end. Errors as the
// cpu device's: a hidden state that does not fit the items
// (KindInvalidArg), item problems (*kvcache.Error with Seqs), invalid copies
// (KindInvalidArg); and a CUDA failure.
func (d *Device) Forward(ctx context.Context, b *worker.Batch, t *device.Tables) (device.Pass, error) {
	start := time.Now()
	var pass device.Pass
	err := d.g.do(func() error {
		if d.g.prof != nil {
			d.g.prof.begin()
		}
		var err error
		pass, err = d.forward(ctx, b, t)
		if serr := d.g.sync(); err == nil {
			err = serr
		}
		if d.g.prof != nil {
			d.g.prof.end()
		}
		if rerr := d.ar.reset(); err == nil {
			err = rerr
		}
		return err
	})
	if err != nil {
		if why := lostContext(err); why != "" {
			exitLost(why, err)
		}
		return device.Pass{}, err
	}
	pass.Nanos = time.Since(start).Nanoseconds()
	return pass, nil
}

func (d *Device) forward(ctx context.Context, b *worker.Batch, t *device.Tables) (device.Pass, error) {
	d.forget(b.Released)
	if err := d.checkCopies(b.Copies); err != nil {
		return device.Pass{}, err
	}
	o := &ops{g: d.g, ar: &d.ar, weights: &d.weights, fast: d.fast(), d: d, t: t, items: make(map[kvcache.SeqID]*worker.Item, len(b.Items))}
	d.forwards++
	d.fault.inject(o, d.forwards)
	copies := append(d.queued, b.Copies...)
	d.queued = nil
	d.copyBlocks(o, copies)
	rows := 0
	for i := range b.Items {
		rows += len(b.Items[i].Tokens)
		o.items[b.Items[i].Seq] = &b.Items[i]
	}
	if d.ps.First && len(b.Hidden) != 0 {
		return device.Pass{}, kvcache.Errorf(kvcache.KindInvalidArg, "stage %d got %d bytes of hidden state; the first stage takes none", d.cfg.Stage, len(b.Hidden))
	}
	if !d.ps.First {
		if _, err := synth.DecodeHidden(b.Hidden, rows, d.hidden); err != nil {
			return device.Pass{}, kvcache.Errorf(kvcache.KindInvalidArg, "stage %d: %v", d.cfg.Stage, err)
		}
	}
	if len(d.ps.Mambas) > 0 {
		if err := d.prepareStates(o, b.Items); err != nil {
			return device.Pass{}, err
		}
	}
	step := synth.Step{Items: synth.ItemsFrom(b.Items), Hidden: b.Hidden, Logits: worker.WantLogits(b.Items)}
	if d.ps.Last {
		step.Drafts = d.cfg.DraftTokens
	}
	res, err := d.ps.Model(ctx, o, step)
	if err == nil {
		err = o.err
	}
	if err != nil {
		return device.Pass{}, err
	}
	if len(d.ps.Mambas) > 0 {
		d.finishStates(o, b.Items)
	}
	return device.Pass{Hidden: slices.Clip(res.Hidden), Outputs: res.Outputs, Prompt: res.Prompt}, o.err
}

// inject makes forward number n fail as f says, when it is f's.
func (f *fault) inject(o *ops, n int) {
	if f == nil || n != f.forward {
		return
	}
	if f.once != "" {
		fd, err := os.OpenFile(f.once, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
		if err != nil {
			return // fired in an earlier process (or cannot be marked: do not fire)
		}
		fd.Close()
	}
	fmt.Fprintf(os.Stderr, "cuda: %s: injecting %s at forward %d\n", faultEnv, f.kind, n)
	switch f.kind {
	case "illegal":
		o.run("kvx_fault_store", dim{1, 1, 1}, dim{1, 1, 1}, 0, int64(16))
	case "oom":
		_, err := o.g.alloc(1 << 62)
		o.fail(err)
	}
}
