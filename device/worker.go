package device

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"math"
	"slices"
	"strings"

	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
	"github.com/kvx-dev/kvx/plugins/v1/spec"
	"github.com/kvx-dev/kvx/plugins/v1/worker"
)

var _ worker.Worker = (*Worker)(nil)

// maxPoolID bounds pool ids so that the id-to-index table stays small.
const maxPoolID = 1 << 16

// HiddenBytesPerItem is the size of the placeholder activations a stage hands
// to the next one on the sim device: one 8-byte tag per item that names the
// item (sequence, position, token count), so the next stage can check that it
// got the same items in the same order.
const HiddenBytesPerItem = 8

// Worker is the worker runtime around one backend. Make it with NewWorker.
// It implements worker.Worker; like every worker its calls must come from one
// goroutine at a time.
type Worker struct {
	b       Backend
	devices map[string]OpenFunc

	// Set by Configure; ok is false until a Configure succeeds.
	ok      bool
	stage   int
	last    bool
	drafts  int
	ph      worker.Placeholder // the sim's tokens and draft acceptance
	pools   []kvcache.Pool     // layout order; Layers dropped
	poolIdx []int32            // pool id -> index in pools, -1 when none
	cover   []int              // indexes of full-attention device pools: their tables must cover every token written
	tables  Tables
	dev     Device
	step    uint64 // Forward calls since Configure; stamps sequences

	// Scratch reused between calls.
	lens  []int
	fresh []kvcache.SeqID
	batch worker.Batch
	// hint[i] is the tables entry of the i-th item of the last batch: the
	// core sends mostly the same sequences in the same order, so checking
	// the hint saves a map lookup per item.
	hint []*seqTables
}

// NewWorker returns the runtime for backend b with the built-in sim device,
// plus any devices the options add. The worker is unconfigured: Info works,
// everything else needs Configure first.
func NewWorker(b Backend, opts ...Option) *Worker {
	w := &Worker{b: b, devices: map[string]OpenFunc{"sim": openSim}}
	for _, o := range opts {
		o(w)
	}
	return w
}

// Tables returns the block tables the worker keeps (for tests and devices).
// They are the worker's; read them between calls and do not modify them.
func (w *Worker) Tables() *Tables { return &w.tables }

// Info describes the backend on the sim device. Devices with real memory will
// report it here.
func (w *Worker) Info(ctx context.Context) (worker.Info, error) {
	if err := ctx.Err(); err != nil {
		return worker.Info{}, err
	}
	return worker.Info{
		Name:      w.b.Name(),
		Version:   Version,
		Protocols: []int{worker.ProtocolVersion},
		Device:    "sim",
		Mixers:    slices.Clone(w.b.Mixers()),
	}, nil
}

// Configure checks cfg against the backend and opens the device. It fails
// with a *kvcache.Error of kind KindUnsupported when the device is not built
// or a layer of the stage needs a mixer the backend does not run (the error
// names the layer and the mixer), and KindInvalidConfig for any other bad
// field (named with its value and limit). A failed Configure leaves the worker
// unconfigured; a successful one drops all tables of a previous one. The
// previous device is closed first when it is an io.Closer (cuda frees its
// pools and weights), so a re-Configure does not hold two stages' memory.
func (w *Worker) Configure(ctx context.Context, cfg worker.Config) (worker.Setup, error) {
	if err := ctx.Err(); err != nil {
		return worker.Setup{}, err
	}
	w.ok = false
	if c, ok := w.dev.(io.Closer); ok {
		if err := c.Close(); err != nil {
			return worker.Setup{}, fmt.Errorf("device %s: close the previous configuration: %w", cfg.Device, err)
		}
	}
	w.dev = nil
	open, err := w.checkConfig(&cfg)
	if err != nil {
		return worker.Setup{}, err
	}
	layers := cfg.Model.Layers[cfg.First:cfg.Last]
	w.pools = make([]kvcache.Pool, len(cfg.Layout.Pools))
	w.cover = w.cover[:0]
	maxID := -1
	for i, p := range cfg.Layout.Pools {
		p.Layers = nil
		w.pools[i] = p
		maxID = max(maxID, p.ID)
		if p.Tier == kvcache.TierHost || p.Window > 0 || p.TokensPerBlock == 0 {
			// A host pool holds suspended sequences, a window pool may drop
			// old blocks, and a sequence need not hold a block in every state
			// pool (snapshots): only full-attention device pools must cover
			// every token.
			continue
		}
		w.cover = append(w.cover, i)
	}
	w.poolIdx = make([]int32, maxID+1)
	for i := range w.poolIdx {
		w.poolIdx[i] = -1
	}
	for i, p := range w.pools {
		w.poolIdx[p.ID] = int32(i)
	}
	dev, err := open(Stage{Config: &cfg, Backend: w.b, Layers: layers, Pools: w.pools})
	if err != nil {
		if kvcache.KindOf(err) == kvcache.KindOther {
			err = kvcache.Errorf(kvcache.KindInvalidConfig, "device %s: %v", cfg.Device, err)
		}
		return worker.Setup{}, err
	}
	w.dev = dev
	w.stage = cfg.Stage
	w.last = cfg.Stage == cfg.Stages-1
	w.drafts = cfg.DraftTokens
	w.ph = worker.NewPlaceholder(cfg.Seed, cfg.Model.Vocab, cfg.DraftAcceptance)
	w.tables.reset(len(w.pools))
	w.hint = nil
	w.lens = make([]int, len(w.pools))
	w.step = 0
	w.ok = true

	var notes []string
	if dev.Modelled() {
		n := fmt.Sprintf("device %s: time is modelled on hardware %q, not measured", cfg.Device, cfg.Hardware.Name)
		if cfg.Hardware.Uncalibrated {
			n += " (uncalibrated datasheet figures)"
		}
		notes = append(notes, n)
	}
	var mtp []int
	for _, l := range layers {
		if l.MTP {
			mtp = append(mtp, l.Index)
		}
	}
	switch {
	case len(mtp) > 0 && cfg.DraftTokens == 0:
		notes = append(notes, fmt.Sprintf("MTP layers %v are not run: draft tokens is 0", mtp))
	case len(mtp) == 0 && cfg.DraftTokens > 0 && w.last:
		notes = append(notes, fmt.Sprintf("%d draft tokens per step but no MTP layer on this stage: drafts are proposed at no cost", cfg.DraftTokens))
	}
	return worker.Setup{Notes: notes}, nil
}

func (w *Worker) checkConfig(cfg *worker.Config) (OpenFunc, error) {
	bad := func(format string, args ...any) error {
		return kvcache.Errorf(kvcache.KindInvalidConfig, format, args...)
	}
	open, ok := w.devices[cfg.Device]
	if !ok {
		names := make([]string, 0, len(w.devices))
		for n := range w.devices {
			names = append(names, n)
		}
		slices.Sort(names)
		switch cfg.Device {
		case "cpu", "cuda": // devices kvx has, not linked into this worker
			return nil, kvcache.Errorf(kvcache.KindUnsupported, "device %s is not built into this worker (it has %s)", cfg.Device, strings.Join(names, ", "))
		}
		return nil, bad("device %q is not one of %s", cfg.Device, strings.Join(names, ", "))
	}
	if cfg.Backend != "" && cfg.Backend != w.b.Name() {
		return nil, bad("backend %q was asked of the %q backend's worker", cfg.Backend, w.b.Name())
	}
	m := &cfg.Model
	if err := m.Validate(); err != nil {
		return nil, bad("%v", err)
	}
	if cfg.Stages < 1 || cfg.Stage < 0 || cfg.Stage >= cfg.Stages {
		return nil, bad("stage %d of %d stages: need 0 <= stage < stages", cfg.Stage, cfg.Stages)
	}
	if cfg.First < 0 || cfg.First >= cfg.Last || cfg.Last > len(m.Layers) {
		return nil, bad("stage layers [%d, %d) of model %q: need 0 <= first < last <= %d layers", cfg.First, cfg.Last, m.Name, len(m.Layers))
	}
	if cfg.TensorParallel < 0 {
		return nil, bad("tensor_parallel %d must be >= 1 (0 means 1)", cfg.TensorParallel)
	}
	if cfg.DraftTokens < 0 {
		return nil, bad("draft tokens %d must be >= 0", cfg.DraftTokens)
	}
	if !(cfg.DraftAcceptance >= 0 && cfg.DraftAcceptance <= 1) {
		return nil, bad("draft acceptance %g must be in [0, 1]", cfg.DraftAcceptance)
	}
	if cfg.Stage == cfg.Stages-1 && m.Vocab <= 0 {
		return nil, bad("model %q: vocab %d must be > 0 on the last stage, which samples", m.Name, m.Vocab)
	}
	switch cfg.KVDtype {
	case "", "bf16", "fp8", "float32":
	default:
		return nil, bad("kv dtype %q is not one of bf16, fp8, float32", cfg.KVDtype)
	}
	mixers := w.b.Mixers()
	for _, l := range m.Layers[cfg.First:cfg.Last] {
		if (l.Mixer != spec.MixerNone || l.HasCache()) && !slices.Contains(mixers, l.Mixer) {
			return nil, kvcache.Errorf(kvcache.KindUnsupported, "layer %d of model %q: mixer %q cannot run on backend %q, which runs %v",
				l.Index, m.Name, l.Mixer, w.b.Name(), mixers)
		}
	}
	seen := make(map[int]bool, len(cfg.Layout.Pools))
	for i, p := range cfg.Layout.Pools {
		if p.ID < 0 || p.ID >= maxPoolID {
			return nil, bad("layout pool %d (%s): id %d must be in [0, %d)", i, p.Name, p.ID, maxPoolID)
		}
		if seen[p.ID] {
			return nil, bad("layout pool %d (%s): id %d is used twice", i, p.Name, p.ID)
		}
		seen[p.ID] = true
		if p.Blocks < 0 || p.TokensPerBlock < 0 || p.BlockBytes < 0 {
			return nil, bad("layout pool %d (%s): blocks %d, tokens per block %d and block bytes %d must be >= 0",
				i, p.Name, p.Blocks, p.TokensPerBlock, p.BlockBytes)
		}
	}
	return open, nil
}

func notConfigured(call string) error {
	return kvcache.Errorf(kvcache.KindInvalidConfig, "%s before a successful Configure", call)
}

// Forward runs one micro-batch on the stage. In order it drops the Released
// sequences' tables, validates every item, the hidden state and the copies,
// applies the items' table deltas, runs the device, and returns the next
// stage's hidden state or, on the last stage, one Output per item that
// samples.
//
// Errors: an item that breaks the contract (Pos < 0, no tokens, Draft not in
// [0, len(Tokens)-1], TopLogprobs < 0, a Sampling out of its ranges (Sampling.Check), a table delta naming an unknown pool, starting beyond
// the table or holding a block outside its pool, a full-attention device
// pool's table too short for the tokens written, a sequence twice in the
// batch) is a *kvcache.Error of kind KindInvalidArg with Seqs naming it; the
// first such item is reported. Hidden states that do not match the items,
// and bad copies, are KindInvalidArg errors without Seqs: the caller mixed up
// batches. On any error no table delta of the batch is applied (Released
// is) and nothing runs.
//
// Sampling on sim is the contract's (worker.Placeholder): each draft of an
// item is accepted with probability DraftAcceptance, drawn from a hash of
// (Seed, Seq, draft position), and acceptance stops at the first rejection.
// Output.Tokens are the accepted drafts (the item's own draft ids) and one
// token sampled after them; Output.Drafts are DraftTokens proposals for the
// positions after that. Every sampled or proposed id is a hash of (Seed,
// Seq, position) mapped into [0, Vocab): the same position always gets the
// same token, whatever the batch, the process, the backend or the
// acceptance so far.
// Placeholder tokens have no distribution: the sim returns no
// Output.TopLogprobs (computing devices do, see synth.TopLogprobs).
func (w *Worker) Forward(ctx context.Context, b worker.Batch) (worker.Result, error) {
	if err := ctx.Err(); err != nil {
		return worker.Result{}, err
	}
	if !w.ok {
		return worker.Result{}, notConfigured("Forward")
	}
	w.step++
	for _, s := range b.Released {
		w.tables.release(s)
	}
	if err := w.checkItems(b.Items); err != nil {
		return worker.Result{}, err
	}
	if w.dev.Modelled() {
		if err := w.checkHidden(&b); err != nil {
			return worker.Result{}, err
		}
	}
	if err := w.checkCopies(b.Copies); err != nil {
		return worker.Result{}, err
	}
	for i := range b.Items {
		it := &b.Items[i]
		if len(it.Tables) == 0 {
			continue
		}
		st := w.hint[i] // set by checkItems: the sequence's entry, or nil when new
		if st == nil {
			st = w.tables.getOrAdd(it.Seq)
			st.stamp = w.step
			w.hint[i] = st
		}
		for _, d := range it.Tables {
			st.apply(int(w.poolIdx[d.Pool]), d)
		}
	}
	w.batch = b // a field, so that handing the device a pointer allocates nothing
	pass, err := w.dev.Forward(ctx, &w.batch, &w.tables)
	w.batch = worker.Batch{} // retain none of the caller's slices
	if err != nil {
		return worker.Result{}, err
	}
	res := worker.Result{Nanos: pass.Nanos, Modelled: w.dev.Modelled()}
	switch {
	case !res.Modelled && w.last:
		res.Outputs, res.Prompt = pass.Outputs, pass.Prompt
	case !res.Modelled:
		res.Hidden = pass.Hidden
	case w.last:
		res.Outputs = w.sample(b.Items)
	default:
		res.Hidden = hiddenFor(b.Items)
	}
	return res, nil
}

func (w *Worker) pool(id int) int {
	if id < 0 || id >= len(w.poolIdx) {
		return -1
	}
	return int(w.poolIdx[id])
}

// checkItems validates every item against the tables as they are before the
// batch's deltas. It changes nothing but sequence stamps.
func (w *Worker) checkItems(items []worker.Item) error {
	w.fresh = w.fresh[:0]
	if cap(w.hint) < len(items) {
		w.hint = append(w.hint[:cap(w.hint)], make([]*seqTables, len(items)-cap(w.hint))...)
	}
	w.hint = w.hint[:len(items)]
	for i := range items {
		it := &items[i]
		if it.Pos < 0 {
			return itemErr(it.Seq, "seq %d: pos %d must be >= 0", it.Seq, it.Pos)
		}
		n := len(it.Tokens)
		if n == 0 {
			return itemErr(it.Seq, "seq %d at pos %d: tokens is empty; an item writes at least one token", it.Seq, it.Pos)
		}
		if it.Draft < 0 || it.Draft > n-1 {
			return itemErr(it.Seq, "seq %d at pos %d: draft %d must be in [0, %d] (len(tokens)-1)", it.Seq, it.Pos, it.Draft, n-1)
		}
		if it.TopLogprobs < 0 {
			return itemErr(it.Seq, "seq %d at pos %d: top logprobs %d must be >= 0", it.Seq, it.Pos, it.TopLogprobs)
		}
		if it.PromptTopLogprobs < 0 {
			return itemErr(it.Seq, "seq %d at pos %d: prompt top logprobs %d must be >= 0", it.Seq, it.Pos, it.PromptTopLogprobs)
		}
		if err := it.Sampling.Check(it.Pos, n); err != nil {
			return itemErr(it.Seq, "seq %d at pos %d: %v", it.Seq, it.Pos, err)
		}
		for k, ss := range it.Snapshots {
			p := w.pool(ss.Pool)
			switch {
			case p < 0:
				return itemErr(it.Seq, "seq %d: snapshots[%d]: pool %d does not exist (the layout has %d pools)", it.Seq, k, ss.Pool, len(w.pools))
			case ss.Block < 0 || (w.pools[p].Blocks > 0 && int(ss.Block) >= w.pools[p].Blocks):
				return itemErr(it.Seq, "seq %d: snapshots[%d]: block %d is outside pool %d (%s) of %d blocks", it.Seq, k, ss.Block, ss.Pool, w.pools[p].Name, w.pools[p].Blocks)
			case ss.Pos <= it.Pos || ss.Pos > it.Pos+n-it.Draft:
				return itemErr(it.Seq, "seq %d: snapshots[%d]: pos %d must be in (%d, %d], the positions this step's tokens reach", it.Seq, k, ss.Pos, it.Pos, it.Pos+n-it.Draft)
			case k > 0 && ss.Pos <= it.Snapshots[k-1].Pos:
				return itemErr(it.Seq, "seq %d: snapshots[%d]: pos %d after pos %d: want increasing", it.Seq, k, ss.Pos, it.Snapshots[k-1].Pos)
			}
		}
		st := w.hint[i]
		if st == nil || !st.live || st.seq != it.Seq {
			st = w.tables.get(it.Seq)
			w.hint[i] = st
		}
		if st != nil {
			if st.stamp == w.step {
				return itemErr(it.Seq, "seq %d: appears more than once in the batch", it.Seq)
			}
			st.stamp = w.step
		} else {
			w.fresh = append(w.fresh, it.Seq)
		}
		if len(it.Tables) == 0 && len(w.cover) == 0 {
			continue
		}
		for p := range w.lens {
			w.lens[p] = 0
			if st != nil {
				w.lens[p] = len(st.blocks[p])
			}
		}
		for k, d := range it.Tables {
			p := w.pool(d.Pool)
			if p < 0 {
				return itemErr(it.Seq, "seq %d: tables[%d]: pool %d does not exist (the layout has %d pools)", it.Seq, k, d.Pool, len(w.pools))
			}
			if d.From < 0 || d.From > w.lens[p] {
				return itemErr(it.Seq, "seq %d: tables[%d]: from %d must be in [0, %d], the length of its table in pool %d (%s)",
					it.Seq, k, d.From, w.lens[p], d.Pool, w.pools[p].Name)
			}
			if lim := kvcache.BlockID(w.pools[p].Blocks); lim > 0 {
				for _, blk := range d.Blocks {
					if blk < 0 || blk >= lim {
						return itemErr(it.Seq, "seq %d: tables[%d]: block %d is outside pool %d (%s) of %d blocks",
							it.Seq, k, blk, d.Pool, w.pools[p].Name, lim)
					}
				}
			}
			w.lens[p] = d.From + len(d.Blocks)
		}
		end := it.Pos + n // tokens the table must hold after this step
		for _, p := range w.cover {
			pl := &w.pools[p]
			if have := w.lens[p] * pl.TokensPerBlock; have < end {
				return itemErr(it.Seq, "seq %d: tables: %d blocks in pool %d (%s) hold %d tokens, but pos %d + %d tokens needs %d",
					it.Seq, w.lens[p], pl.ID, pl.Name, have, it.Pos, n, end)
			}
		}
	}
	if len(w.fresh) > 1 {
		slices.Sort(w.fresh)
		for i := 1; i < len(w.fresh); i++ {
			if w.fresh[i] == w.fresh[i-1] {
				return kvcache.ItemErrorf([]kvcache.SeqID{w.fresh[i]}, "seq %d: appears more than once in the batch", w.fresh[i])
			}
		}
	}
	return nil
}

// itemErr is an item-scoped error about seq. (A helper, so that the
// one-element slice is only made on the error path.)
func itemErr(seq kvcache.SeqID, format string, args ...any) error {
	return kvcache.ItemErrorf([]kvcache.SeqID{seq}, format, args...)
}

func (w *Worker) checkHidden(b *worker.Batch) error {
	if w.stage == 0 {
		if len(b.Hidden) != 0 {
			return kvcache.Errorf(kvcache.KindInvalidArg, "stage 0 got %d bytes of hidden state; the first stage takes none", len(b.Hidden))
		}
		return nil
	}
	if want := HiddenBytesPerItem * len(b.Items); len(b.Hidden) != want {
		return kvcache.Errorf(kvcache.KindInvalidArg, "stage %d: hidden state is %d bytes, want %d (%d per item for %d items): it is not the previous stage's output for this batch",
			w.stage, len(b.Hidden), want, HiddenBytesPerItem, len(b.Items))
	}
	for i := range b.Items {
		it := &b.Items[i]
		if binary.LittleEndian.Uint64(b.Hidden[HiddenBytesPerItem*i:]) != hiddenTag(it) {
			return kvcache.Errorf(kvcache.KindInvalidArg, "stage %d: item %d (seq %d, pos %d, %d tokens) does not match the previous stage's hidden state: batches were reordered or mixed",
				w.stage, i, it.Seq, it.Pos, len(it.Tokens))
		}
	}
	return nil
}

func (w *Worker) checkCopies(copies []kvcache.Copy) error {
	for i, c := range copies {
		for _, end := range [2]struct {
			name  string
			pool  int
			block kvcache.BlockID
		}{{"src", c.SrcPool, c.SrcBlock}, {"dst", c.DstPool, c.DstBlock}} {
			p := w.pool(end.pool)
			if p < 0 {
				return kvcache.Errorf(kvcache.KindInvalidArg, "copies[%d]: %s pool %d does not exist (the layout has %d pools)", i, end.name, end.pool, len(w.pools))
			}
			if lim := kvcache.BlockID(w.pools[p].Blocks); end.block < 0 || (lim > 0 && end.block >= lim) {
				return kvcache.Errorf(kvcache.KindInvalidArg, "copies[%d]: %s block %d is outside pool %d (%s) of %d blocks",
					i, end.name, end.block, end.pool, w.pools[p].Name, lim)
			}
		}
	}
	return nil
}

// CopyBlocks validates the copies and hands them to the device; the sim
// device charges their time to the next Forward. Errors: KindInvalidArg for
// a copy naming an unknown pool or a block outside its pool (nothing is
// copied then).
func (w *Worker) CopyBlocks(ctx context.Context, copies []kvcache.Copy) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if !w.ok {
		return notConfigured("CopyBlocks")
	}
	if err := w.checkCopies(copies); err != nil {
		return err
	}
	return w.dev.CopyBlocks(ctx, copies)
}

// Health reports nil: an in-process worker is alive when it answers.
func (w *Worker) Health(ctx context.Context) error { return ctx.Err() }

// saltHidden keeps the placeholder hidden state's hash stream apart from
// the placeholder sampling's (worker.Placeholder).
const saltHidden = 0x68696464656e

// Mix is the splitmix64 finalizer (worker.Mix, one definition): the
// samplers' uniform numbers (synth.Uniform) are made of it.
func Mix(x uint64) uint64 { return worker.Mix(x) }

// streamKey names one hash stream: a seed and a use.
func streamKey(seed, salt uint64) uint64 { return Mix(seed ^ salt) }

// hash is the stream's value at (seq, pos).
func hash(key uint64, seq kvcache.SeqID, pos int) uint64 {
	return Mix(Mix(key^uint64(seq)) ^ uint64(pos))
}

// sample builds the outputs of the items that sample. All token slices share
// one fresh backing array, each capped to its own length.
func (w *Worker) sample(items []worker.Item) []worker.Output {
	n, size := 0, 0
	for i := range items {
		if items[i].Sample {
			n++
			size += items[i].Draft + 1 + w.drafts // at most; fewer drafts may be accepted
		}
	}
	if n == 0 {
		return nil
	}
	outs := make([]worker.Output, n)
	buf := make([]int32, size)
	j := 0
	for i := range items {
		it := &items[i]
		if !it.Sample {
			continue
		}
		o := &outs[j]
		j++
		a := w.ph.Accepted(it)
		first := len(it.Tokens) - it.Draft
		pos := it.Pos + first // position of the first sampled token
		toks := buf[: a+1 : a+1]
		buf = buf[a+1:]
		copy(toks, it.Tokens[first:first+a])
		toks[a] = w.ph.Token(it.Seq, pos+a)
		o.Seq, o.Tokens = it.Seq, toks
		if w.drafts > 0 {
			d := buf[:w.drafts:w.drafts]
			buf = buf[w.drafts:]
			for k := range d {
				d[k] = w.ph.Token(it.Seq, pos+a+1+k)
			}
			o.Drafts = d
		}
	}
	return outs
}

var hiddenKey = streamKey(0, saltHidden)

// hiddenTag names an item in the placeholder hidden state.
func hiddenTag(it *worker.Item) uint64 {
	return hash(hiddenKey, it.Seq, it.Pos) ^ uint64(len(it.Tokens))
}

func hiddenFor(items []worker.Item) []byte {
	h := make([]byte, HiddenBytesPerItem*len(items))
	for i := range items {
		binary.LittleEndian.PutUint64(h[HiddenBytesPerItem*i:], hiddenTag(&items[i]))
	}
	return h
}

// nanos converts modelled seconds to whole nanoseconds.
func nanos(seconds float64) int64 { return int64(math.Round(seconds * 1e9)) }
