package main

import (
	"context"
	"encoding/binary"
	"fmt"
	"slices"

	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
	"github.com/kvx-dev/kvx/plugins/v1/spec"
	"github.com/kvx-dev/kvx/plugins/v1/worker"
)

// Name and Version are what Info says.
const (
	Name    = "gqalite"
	Version = "0.1.0"
)

// mixers are the layer mixers it runs: GQA, and no mixer at all (a pure FFN
// layer). A stage with any other mixer is refused at Configure.
var mixers = []spec.Mixer{spec.MixerGQA, spec.MixerNone}

// hiddenBytes is the placeholder activation a stage hands the next one per
// item: a tag naming the item (sequence, position, token count), so that
// the next stage can tell that it got the same items in the same order.
const hiddenBytes = 8

var _ worker.Worker = (*Worker)(nil)

// Worker is one pipeline stage of the backend. Like every worker, its calls
// come from one goroutine at a time.
type Worker struct {
	ok     bool // a Configure succeeded
	cfg    worker.Config
	layers []spec.Layer // this stage's
	last   bool
	ph     worker.Placeholder
	pools  map[int]kvcache.Pool // by pool id
	// cover are the full-attention device pools: their tables must hold
	// every token an item writes (a window pool may drop old blocks, a
	// state pool holds one block per sequence).
	cover  []int
	tables map[kvcache.SeqID]map[int][]kvcache.BlockID // seq -> pool id -> table
	copyNs int64                                       // block copies, charged to the next forward
}

// New returns an unconfigured worker.
func New() *Worker { return &Worker{} }

// Info implements worker.Worker.
func (w *Worker) Info(ctx context.Context) (worker.Info, error) {
	if err := ctx.Err(); err != nil {
		return worker.Info{}, err
	}
	return worker.Info{Name: Name, Version: Version, Protocols: []int{worker.ProtocolVersion}, Device: "sim", Mixers: slices.Clone(mixers)}, nil
}

func invalid(format string, args ...any) error {
	return kvcache.Errorf(kvcache.KindInvalidConfig, format, args...)
}

// Configure implements worker.Worker. It refuses, naming the field, the
// value and the limit: a device other than sim (KindUnsupported), a backend
// name other than its own, a layer whose mixer it does not run
// (KindUnsupported), and a malformed stage or layout (KindInvalidConfig). A
// successful Configure forgets every table of a previous one.
func (w *Worker) Configure(ctx context.Context, cfg worker.Config) (worker.Setup, error) {
	if err := ctx.Err(); err != nil {
		return worker.Setup{}, err
	}
	w.ok = false
	m := &cfg.Model
	switch {
	case cfg.Device != "sim":
		return worker.Setup{}, kvcache.Errorf(kvcache.KindUnsupported, "%s: device %q: this backend has only the sim device", Name, cfg.Device)
	case cfg.Backend != "" && cfg.Backend != Name:
		// "" is what kvx sends a backend it started by path.
		return worker.Setup{}, invalid("%s: backend %q was asked of the %s backend", Name, cfg.Backend, Name)
	case m.Validate() != nil:
		return worker.Setup{}, invalid("%s: %v", Name, m.Validate())
	case cfg.Stages < 1 || cfg.Stage < 0 || cfg.Stage >= cfg.Stages:
		return worker.Setup{}, invalid("%s: stage %d of %d: need 0 <= stage < stages", Name, cfg.Stage, cfg.Stages)
	case cfg.First < 0 || cfg.First >= cfg.Last || cfg.Last > len(m.Layers):
		return worker.Setup{}, invalid("%s: layers [%d, %d) of model %q: need 0 <= first < last <= %d", Name, cfg.First, cfg.Last, m.Name, len(m.Layers))
	case cfg.DraftTokens < 0 || !(cfg.DraftAcceptance >= 0 && cfg.DraftAcceptance <= 1):
		return worker.Setup{}, invalid("%s: draft tokens %d (>= 0) and acceptance %g (in [0, 1])", Name, cfg.DraftTokens, cfg.DraftAcceptance)
	case cfg.Stage == cfg.Stages-1 && m.Vocab <= 0:
		return worker.Setup{}, invalid("%s: model %q: vocab %d must be > 0 on the last stage, which samples", Name, m.Name, m.Vocab)
	}
	layers := m.Layers[cfg.First:cfg.Last]
	for _, l := range layers {
		if !slices.Contains(mixers, l.Mixer) {
			return worker.Setup{}, kvcache.Errorf(kvcache.KindUnsupported, "%s: layer %d of model %q: mixer %q; this backend runs gqa and ffn-only layers",
				Name, l.Index, m.Name, l.Mixer)
		}
		if l.Mixer == spec.MixerGQA && (m.Heads <= 0 || m.KVHeads <= 0 || m.HeadDim <= 0) {
			return worker.Setup{}, invalid("%s: model %q: heads %d, kv heads %d and head dim %d must be > 0 for gqa layers", Name, m.Name, m.Heads, m.KVHeads, m.HeadDim)
		}
	}
	pools := make(map[int]kvcache.Pool, len(cfg.Layout.Pools))
	var cover []int
	for i, p := range cfg.Layout.Pools {
		if _, dup := pools[p.ID]; dup || p.ID < 0 {
			return worker.Setup{}, invalid("%s: layout pool %d (%s): id %d is negative or used twice", Name, i, p.Name, p.ID)
		}
		if p.Blocks < 0 || p.TokensPerBlock < 0 || p.BlockBytes < 0 {
			return worker.Setup{}, invalid("%s: layout pool %d (%s): blocks %d, tokens per block %d and block bytes %d must be >= 0",
				Name, i, p.Name, p.Blocks, p.TokensPerBlock, p.BlockBytes)
		}
		p.Layers = nil
		pools[p.ID] = p
		if p.Tier == kvcache.TierDevice && p.Window == 0 && p.TokensPerBlock > 0 {
			cover = append(cover, p.ID)
		}
	}
	cfg.Layout.Pools = nil // kept in pools
	w.cfg, w.layers, w.pools, w.cover = cfg, slices.Clone(layers), pools, cover
	w.last = cfg.Stage == cfg.Stages-1
	w.ph = worker.NewPlaceholder(cfg.Seed, m.Vocab, cfg.DraftAcceptance)
	w.tables = map[kvcache.SeqID]map[int][]kvcache.BlockID{}
	w.copyNs = 0
	w.ok = true
	return worker.Setup{Notes: []string{fmt.Sprintf("%s: time is modelled on hardware %q by its own roofline", Name, cfg.Hardware.Name)}}, nil
}

func notConfigured(call string) error {
	return kvcache.Errorf(kvcache.KindInvalidConfig, "%s: %s before a successful Configure", Name, call)
}

func itemErr(seq kvcache.SeqID, format string, args ...any) error {
	return kvcache.ItemErrorf([]kvcache.SeqID{seq}, Name+": "+format, args...)
}

// Forward implements worker.Worker. In order it drops the Released
// sequences' tables, checks every item, the hidden state and the copies,
// applies the items' table deltas, models the step's time and returns the
// next stage's hidden state or, on the last stage, one Output per item that
// samples. An item that breaks the contract is an item-scoped
// KindInvalidArg error naming it, and then nothing of the batch is applied
// (but Released).
func (w *Worker) Forward(ctx context.Context, b worker.Batch) (worker.Result, error) {
	if err := ctx.Err(); err != nil {
		return worker.Result{}, err
	}
	if !w.ok {
		return worker.Result{}, notConfigured("Forward")
	}
	for _, s := range b.Released {
		delete(w.tables, s)
	}
	if err := w.checkItems(b.Items); err != nil {
		return worker.Result{}, err
	}
	if err := w.checkHidden(b); err != nil {
		return worker.Result{}, err
	}
	if err := w.checkCopies(b.Copies); err != nil {
		return worker.Result{}, err
	}
	for _, it := range b.Items {
		for _, d := range it.Tables {
			t := w.tables[it.Seq]
			if t == nil {
				t = map[int][]kvcache.BlockID{}
				w.tables[it.Seq] = t
			}
			t[d.Pool] = append(t[d.Pool][:d.From], d.Blocks...)
		}
	}
	res := worker.Result{Modelled: true, Nanos: w.copyNs + w.copyCost(b.Copies) + stepNanos(&w.cfg, w.layers, b.Items)}
	w.copyNs = 0
	if !w.last {
		res.Hidden = make([]byte, hiddenBytes*len(b.Items))
		for i := range b.Items {
			binary.LittleEndian.PutUint64(res.Hidden[hiddenBytes*i:], tag(&b.Items[i]))
		}
		return res, nil
	}
	for i := range b.Items {
		it := &b.Items[i]
		if !it.Sample {
			continue
		}
		// The accepted drafts (the item's own ids), then one sampled token,
		// then the MTP proposals for the positions after it.
		a := w.ph.Accepted(it)
		first := len(it.Tokens) - it.Draft
		pos := it.Pos + first
		out := worker.Output{Seq: it.Seq, Tokens: append(slices.Clone(it.Tokens[first:first+a]), w.ph.Token(it.Seq, pos+a))}
		if n := w.cfg.DraftTokens; n > 0 {
			out.Drafts = make([]int32, n)
			for k := range out.Drafts {
				out.Drafts[k] = w.ph.Token(it.Seq, pos+a+1+k)
			}
		}
		res.Outputs = append(res.Outputs, out)
	}
	return res, nil
}

// checkItems checks every item against the tables as they are before the
// batch.
func (w *Worker) checkItems(items []worker.Item) error {
	seen := make(map[kvcache.SeqID]bool, len(items))
	for i := range items {
		it := &items[i]
		n := len(it.Tokens)
		switch {
		case it.Pos < 0:
			return itemErr(it.Seq, "seq %d: pos %d must be >= 0", it.Seq, it.Pos)
		case n == 0:
			return itemErr(it.Seq, "seq %d at pos %d: tokens is empty; an item writes at least one token", it.Seq, it.Pos)
		case it.Draft < 0 || it.Draft > n-1:
			return itemErr(it.Seq, "seq %d at pos %d: draft %d must be in [0, %d] (len(tokens)-1)", it.Seq, it.Pos, it.Draft, n-1)
		case it.TopLogprobs < 0:
			return itemErr(it.Seq, "seq %d: top logprobs %d must be >= 0", it.Seq, it.TopLogprobs)
		case seen[it.Seq]:
			return itemErr(it.Seq, "seq %d: appears more than once in the batch", it.Seq)
		}
		seen[it.Seq] = true
		if err := it.Sampling.Check(it.Pos, n); err != nil {
			return itemErr(it.Seq, "seq %d at pos %d: %v", it.Seq, it.Pos, err)
		}
		lens := map[int]int{}
		for id := range w.pools {
			lens[id] = len(w.tables[it.Seq][id])
		}
		for k, d := range it.Tables {
			p, ok := w.pools[d.Pool]
			switch {
			case !ok:
				return itemErr(it.Seq, "seq %d: tables[%d]: pool %d is not in the layout (%d pools)", it.Seq, k, d.Pool, len(w.pools))
			case d.From < 0 || d.From > lens[d.Pool]:
				return itemErr(it.Seq, "seq %d: tables[%d]: from %d must be in [0, %d], its table's length in pool %d (%s)", it.Seq, k, d.From, lens[d.Pool], p.ID, p.Name)
			}
			for _, blk := range d.Blocks {
				if blk < 0 || (p.Blocks > 0 && int(blk) >= p.Blocks) {
					return itemErr(it.Seq, "seq %d: tables[%d]: block %d is outside pool %d (%s) of %d blocks", it.Seq, k, blk, p.ID, p.Name, p.Blocks)
				}
			}
			lens[d.Pool] = d.From + len(d.Blocks)
		}
		for _, id := range w.cover {
			p := w.pools[id]
			if have := lens[id] * p.TokensPerBlock; have < it.Pos+n {
				return itemErr(it.Seq, "seq %d: %d blocks in pool %d (%s) hold %d tokens, but pos %d + %d tokens needs %d",
					it.Seq, lens[id], id, p.Name, have, it.Pos, n, it.Pos+n)
			}
		}
	}
	return nil
}

// tag names an item in the placeholder hidden state.
func tag(it *worker.Item) uint64 {
	return worker.Mix(worker.Mix(uint64(it.Seq))^uint64(it.Pos)) ^ uint64(len(it.Tokens))
}

func (w *Worker) checkHidden(b worker.Batch) error {
	if w.cfg.Stage == 0 {
		if len(b.Hidden) != 0 {
			return kvcache.Errorf(kvcache.KindInvalidArg, "%s: stage 0 got %d bytes of hidden state; the first stage takes none", Name, len(b.Hidden))
		}
		return nil
	}
	if want := hiddenBytes * len(b.Items); len(b.Hidden) != want {
		return kvcache.Errorf(kvcache.KindInvalidArg, "%s: stage %d: hidden state of %d bytes, want %d for %d items", Name, w.cfg.Stage, len(b.Hidden), want, len(b.Items))
	}
	for i := range b.Items {
		if binary.LittleEndian.Uint64(b.Hidden[hiddenBytes*i:]) != tag(&b.Items[i]) {
			return kvcache.Errorf(kvcache.KindInvalidArg, "%s: stage %d: item %d (seq %d) is not the previous stage's item %d", Name, w.cfg.Stage, i, b.Items[i].Seq, i)
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
			p, ok := w.pools[end.pool]
			if !ok {
				return kvcache.Errorf(kvcache.KindInvalidArg, "%s: copies[%d]: %s pool %d is not in the layout", Name, i, end.name, end.pool)
			}
			if end.block < 0 || (p.Blocks > 0 && int(end.block) >= p.Blocks) {
				return kvcache.Errorf(kvcache.KindInvalidArg, "%s: copies[%d]: %s block %d is outside pool %d (%s) of %d blocks", Name, i, end.name, end.block, p.ID, p.Name, p.Blocks)
			}
		}
	}
	return nil
}

// CopyBlocks implements worker.Worker: the sim moves no memory, so it only
// checks the copies and charges their time to the next Forward.
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
	w.copyNs += w.copyCost(copies)
	return nil
}

// copyCost is the time of block copies: each block's bytes over PCIe when
// one side is on the host, else at HBM speed, plus the copy latency each.
func (w *Worker) copyCost(copies []kvcache.Copy) int64 {
	hw := &w.cfg.Hardware
	var s float64
	for _, c := range copies {
		src, dst := w.pools[c.SrcPool], w.pools[c.DstPool]
		bw := hw.MemBandwidth
		if src.Tier == kvcache.TierHost || dst.Tier == kvcache.TierHost {
			bw = hw.PCIeBW
		}
		if bw > 0 {
			s += float64(src.BlockBytes) / bw
		}
		s += hw.CopyLatency
	}
	return int64(s * 1e9)
}

// Health implements worker.Worker: a worker that answers is alive.
func (w *Worker) Health(ctx context.Context) error { return ctx.Err() }
