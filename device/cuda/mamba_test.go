//go:build cuda && cgo

package cuda

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"hash/fnv"
	"math"
	"math/rand"
	"testing"
	"unsafe"

	"gorgonia.org/cu"

	"github.com/kvx-dev/kvx/device"
	"github.com/kvx-dev/kvx/device/cpu/kernel"
	"github.com/kvx-dev/kvx/device/kernelspec"
	"github.com/kvx-dev/kvx/device/paged"
	"github.com/kvx-dev/kvx/device/synth"
	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
	"github.com/kvx-dev/kvx/plugins/v1/spec"
	"github.com/kvx-dev/kvx/plugins/v1/worker"
)

// mambaShape is one test configuration of the Mamba2 layers.
type mambaShape struct {
	heads, headDim, state, groups, conv int
	convDtype, ssmDtype                 kernelspec.Dtype
	dtMin                               float32
	blocks                              int // live slots (8 when 0)
}

func (s mambaShape) String() string {
	return fmt.Sprintf("H%d_P%d_N%d_G%d_K%d_conv%v_ssm%v_dtmin%v", s.heads, s.headDim, s.state, s.groups, s.conv, s.convDtype, s.ssmDtype, s.dtMin)
}

// The stage's two Mamba2 layers (not adjacent indices), the pool ids of
// the device state pool (live slots) and the host-tier snapshot pool.
var mambaLayers = []int{0, 2}

const (
	mambaLivePool = 7
	mambaSnapPool = 3
)

// mambaRig is a cuda Device built by hand with the state pools of two
// Mamba2 layers, and the cpu kernel's oracle of what they must hold.
type mambaRig struct {
	t   testing.TB
	o   *ops
	d   *Device
	tab *device.Tables
	mix map[int]*paged.Mixer
	w   map[int]*kernel.Mamba2Weights
	dw  map[int]synth.Mamba2Weights // the same on the device
	// hist[seq][layer][p] is the oracle's state (conv then ssm bytes) after
	// p tokens of seq; promptEnd as the cpu device keeps it.
	hist      map[kvcache.SeqID]map[int][][]byte
	promptEnd map[kvcache.SeqID]int
	live      map[kvcache.SeqID]kvcache.BlockID
}

func newMambaRig(t testing.TB, sh mambaShape) *mambaRig {
	t.Helper()
	o := newTestOps(t)
	m := &spec.Model{MambaHeads: sh.heads, MambaHeadDim: sh.headDim, SSMStateSize: sh.state, NGroups: sh.groups, ConvKernel: sh.conv}
	probe := kernelspec.Mamba2{Heads: sh.heads, HeadDim: sh.headDim, State: sh.state, Groups: sh.groups, ConvKernel: sh.conv,
		ConvDtype: sh.convDtype, SSMDtype: sh.ssmDtype}
	var layers []spec.Layer
	for _, li := range mambaLayers {
		l := spec.Layer{Index: li, Mixer: spec.MixerMamba}
		if c := probe.ConvBytes(); c > 0 {
			l.Buffers = append(l.Buffers, spec.Buffer{Role: spec.RoleConvState, BytesPerSeq: int64(c)})
		}
		l.Buffers = append(l.Buffers, spec.Buffer{Role: spec.RoleSSMState, BytesPerSeq: int64(probe.SSMBytes())})
		layers = append(layers, l)
	}
	slot := int64(len(mambaLayers) * (probe.ConvBytes() + probe.SSMBytes()))
	pools := []kvcache.Pool{
		{ID: mambaLivePool, Name: "ssm", Tier: kvcache.TierDevice, Layers: mambaLayers, BlockBytes: slot, Blocks: max(sh.blocks, 8)},
		{ID: mambaSnapPool, Name: "ssm-host", Tier: kvcache.TierHost, Layers: mambaLayers, BlockBytes: slot, Blocks: 4},
	}
	place, err := paged.Place(layers, pools)
	if err != nil {
		t.Fatal(err)
	}
	r := &mambaRig{t: t, o: o, mix: map[int]*paged.Mixer{}, w: map[int]*kernel.Mamba2Weights{}, dw: map[int]synth.Mamba2Weights{},
		hist: map[kvcache.SeqID]map[int][][]byte{}, promptEnd: map[kvcache.SeqID]int{}, live: map[kvcache.SeqID]kvcache.BlockID{}}
	for _, l := range layers {
		x, err := paged.NewMixer(m, l, device.KernelMamba2, kernelspec.BF16, sh.convDtype, sh.ssmDtype)
		if err != nil {
			t.Fatal(err)
		}
		if err := paged.CheckWidths(x, l); err != nil {
			t.Fatal(err)
		}
		x.Mamba.DtMin = sh.dtMin
		r.mix[l.Index] = x
	}
	d := &Device{g: o.g, ps: &paged.Stage{Mix: r.mix, Place: place, Mambas: mambaLayers, Pools: pools},
		idx: map[int]int{}, tables: map[tableKey]*devTable{}, seqs: map[kvcache.SeqID]*seqState{}}
	r.d = d
	o.d = d
	on(t, o, func() {
		for i, p := range pools {
			q := pool{Pool: p}
			if p.Tier == kvcache.TierHost {
				h, a, err := o.g.allocHost(q.bytes())
				if err != nil {
					t.Error(err)
					return
				}
				q.host, q.addr = h, a
			} else {
				a, err := o.g.alloc(q.bytes())
				if err != nil {
					t.Error(err)
					return
				}
				q.addr = a
			}
			d.pools = append(d.pools, q)
			d.idx[p.ID] = i
			// Garbage everywhere: a state the step does not set shows.
			junk := make([]byte, q.bytes())
			rand.New(rand.NewSource(int64(i))).Read(junk)
			if q.host != nil {
				copy(unsafe.Slice((*byte)(q.host), q.bytes()), junk)
			} else {
				o.fail(upload(q.addr, junk))
			}
		}
	})
	t.Cleanup(func() {
		o.g.do(func() error {
			for _, s := range d.seqs {
				s.free()
			}
			for _, p := range d.pools {
				if p.host != nil {
					o.g.freeHost(p.host)
				} else {
					cu.MemFree(p.addr)
				}
			}
			return nil
		})
	})
	rng := rand.New(rand.NewSource(42))
	uni := func(n int, lo, hi float32) []float32 {
		v := make([]float32, n)
		for i := range v {
			v[i] = lo + (hi-lo)*rng.Float32()
		}
		return v
	}
	for _, li := range mambaLayers {
		mb := r.mix[li].Mamba
		cd, H := mb.ConvDim(), mb.Heads
		w := &kernel.Mamba2Weights{ConvW: uni(cd*mb.ConvKernel, -0.6, 0.6), ConvB: uni(cd, -0.3, 0.3), DtBias: uni(H, -1, 1),
			A: uni(H, -1.1, -0.2), D: uni(H, -1, 1), NormW: uni(mb.Inner(), 0.5, 1.5)}
		r.w[li] = w
		on(t, o, func() {
			r.dw[li] = synth.Mamba2Weights{ConvW: r.tensor(w.ConvW, cd, mb.ConvKernel), ConvB: r.tensor(w.ConvB, 1, cd),
				DtBias: r.tensor(w.DtBias, 1, H), A: r.tensor(w.A, 1, H), D: r.tensor(w.D, 1, H), NormW: r.tensor(w.NormW, 1, mb.Inner())}
		})
	}
	return r
}

// tensor puts host values in device memory kept until the test ends (the
// arena may be reset between steps); call it inside on.
func (r *mambaRig) tensor(v []float32, rows, cols int) *tensor {
	p, err := r.o.g.alloc(int64(len(v)) * 4)
	r.o.fail(err)
	if err == nil {
		*r.o.weights = append(*r.o.weights, p)
		r.o.fail(upload(p, v))
	}
	return &tensor{p: p, r: rows, c: cols}
}

// slotBytes returns the state (conv then ssm) of layer l in block b of the
// pool at index pi, read from the device.
func (r *mambaRig) slotBytes(l, pi int, b kvcache.BlockID) []byte {
	var out []byte
	on(r.t, r.o, func() {
		conv, ssm, at, err := r.d.slot(l, pi, b)
		if err != nil {
			r.t.Error(err)
			return
		}
		c, s := make([]byte, at.ConvLen), make([]byte, at.SSMLen)
		if p := &r.d.pools[pi]; p.host != nil { // the kernels wrote it through its mapping
			mem := unsafe.Slice((*byte)(p.host), p.bytes())
			copy(c, mem[conv-p.addr:])
			copy(s, mem[ssm-p.addr:])
		} else {
			r.o.fail(download(c, conv))
			r.o.fail(download(s, ssm))
		}
		out = append(c, s...)
	})
	return out
}

// setSlot writes a random valid state into seq's live slot (what prefix
// reuse would have copied there) and makes it the oracle's state after pos
// tokens.
func (r *mambaRig) setSlot(seq kvcache.SeqID, pos int, seed int64) {
	rng := rand.New(rand.NewSource(seed))
	for _, l := range mambaLayers {
		mb := r.mix[l].Mamba
		enc := func(dt kernelspec.Dtype, n int, scale float32) []byte {
			var b []byte
			for i := 0; i < n; i++ {
				v := scale * (2*rng.Float32() - 1)
				if dt == kernelspec.BF16 {
					b = binary.LittleEndian.AppendUint16(b, kernel.BF16FromFloat32(v))
				} else {
					b = binary.LittleEndian.AppendUint32(b, math.Float32bits(v))
				}
			}
			return b
		}
		conv := enc(mb.ConvDtype, mb.ConvBytes()/mb.ConvDtype.Size(), 1)
		ssm := enc(mb.SSMDtype, mb.SSMBytes()/mb.SSMDtype.Size(), 2)
		on(r.t, r.o, func() {
			c, s, _, err := r.d.slot(l, 0, r.live[seq])
			if err != nil {
				r.t.Error(err)
				return
			}
			r.o.fail(upload(c, conv))
			r.o.fail(upload(s, ssm))
		})
		h := r.hist[seq]
		if h == nil {
			h = map[int][][]byte{}
			r.hist[seq] = h
		}
		h[l] = make([][]byte, pos+1)
		h[l][pos] = append(conv, ssm...)
	}
}

// mambaItem is one item of a test step; key names its input stream (items
// of equal key get equal inputs at equal positions) and gen its version
// (drafts rewritten after a rollback get new inputs).
type mambaItem struct {
	worker.Item
	key, gen int
}

// input returns the inputs of one row: z, xBC, dt.
func (r *mambaRig) input(l, key, gen, pos int) (z, xbc, dt []float32) {
	h := fnv.New64a()
	fmt.Fprint(h, l, key, gen, pos)
	rng := rand.New(rand.NewSource(int64(h.Sum64())))
	mb := r.mix[l].Mamba
	f := func(n int, lo, hi float32) []float32 {
		v := make([]float32, n)
		for i := range v {
			v[i] = lo + (hi-lo)*rng.Float32()
		}
		return v
	}
	z, xbc, dt = f(mb.Inner(), -3, 3), f(mb.ConvDim(), -2, 2), f(mb.Heads, -4, 3)
	if pos%5 == 0 {
		dt[0] = 25 // Softplus's x > 20 branch
	}
	return z, xbc, dt
}

// step runs items through prepareStates, both layers' Mamba2 and
// finishStates, and checks the outputs, the live states and the snapshots
// against the oracle.
func (r *mambaRig) step(name string, items []mambaItem) {
	t := r.t
	t.Helper()
	var wi []worker.Item
	var segs []synth.Seg
	tabs := map[kvcache.SeqID][][]kvcache.BlockID{}
	for seq, b := range r.live {
		tabs[seq] = [][]kvcache.BlockID{{b}, nil}
	}
	for _, it := range items {
		wi = append(wi, it.Item)
		segs = append(segs, synth.Seg{Seq: it.Seq, Pos: it.Pos, Rows: len(it.Tokens), Draft: it.Draft})
	}
	// The oracle: kernelspec.Mamba2 one token at a time from the state
	// after Pos tokens, the dt floor on the tokens before promptEnd.
	want := map[int][]float32{}
	in := map[int][3][]float32{}
	for _, l := range mambaLayers {
		var z, xbc, dt, out []float32
		for _, it := range items {
			h := r.hist[it.Seq]
			if h == nil {
				h = map[int][][]byte{}
				r.hist[it.Seq] = h
			}
			mb := r.mix[l].Mamba
			st := make([]byte, mb.ConvBytes()+mb.SSMBytes())
			if it.Pos > 0 {
				if it.Pos >= len(h[l]) || h[l][it.Pos] == nil {
					t.Fatalf("%s: the oracle has no state of seq %d after %d tokens", name, it.Seq, it.Pos)
				}
				st = bytes.Clone(h[l][it.Pos])
			}
			hl := append(h[l][:min(it.Pos, len(h[l]))], make([][]byte, it.Pos+1-min(it.Pos, len(h[l])))...)
			hl[it.Pos] = bytes.Clone(st)
			n := len(it.Tokens)
			pe := it.Pos + n
			if r.promptEnd[it.Seq] > 0 {
				pe = r.promptEnd[it.Seq]
			}
			for j := 0; j < n; j++ {
				p := it.Pos + j
				zr, xr, dr := r.input(l, it.key, it.gen, p)
				o := make([]float32, mb.Inner())
				k := mb
				if p >= pe {
					k.DtMin = 0
				}
				conv, ssm := st[:mb.ConvBytes()], st[mb.ConvBytes():]
				if err := kernel.Mamba2(k, r.w[l], conv, ssm, zr, xr, dr, o); err != nil {
					t.Fatal(err)
				}
				hl = append(hl, bytes.Clone(st))
				z, xbc, dt, out = append(z, zr...), append(xbc, xr...), append(dt, dr...), append(out, o...)
			}
			h[l] = hl
		}
		want[l] = out
		in[l] = [3][]float32{z, xbc, dt}
	}
	for _, it := range items {
		if it.Sample && r.promptEnd[it.Seq] == 0 {
			r.promptEnd[it.Seq] = it.Pos + len(it.Tokens) - it.Draft
		}
	}

	rows := len(want[mambaLayers[0]]) / r.mix[mambaLayers[0]].Mamba.Inner()
	got := map[int][]float32{}
	o := r.o
	on(t, o, func() {
		o.t = device.TablesOf(2, tabs)
		o.items = map[kvcache.SeqID]*worker.Item{}
		for i := range wi {
			o.items[wi[i].Seq] = &wi[i]
		}
		if err := r.d.prepareStates(o, wi); err != nil {
			t.Errorf("%s: prepareStates: %v", name, err)
			return
		}
		outs := map[int]*tensor{}
		for _, l := range mambaLayers {
			mb := r.mix[l].Mamba
			x := synth.Mamba2In{Z: r.tensor(in[l][0], rows, mb.Inner()), XBC: r.tensor(in[l][1], rows, mb.ConvDim()), DT: r.tensor(in[l][2], rows, mb.Heads)}
			out, err := o.Mamba2(context.Background(), l, segs, x, r.dw[l])
			if err != nil {
				t.Errorf("%s: Mamba2 layer %d: %v", name, l, err)
				return
			}
			outs[l] = cudaTensor(out)
		}
		r.d.finishStates(o, wi)
		o.fail(o.g.sync())
		for l, out := range outs {
			got[l] = make([]float32, out.r*out.c)
			o.fail(download(got[l], out.p))
		}
	})
	for _, l := range mambaLayers {
		mambaSame(t, fmt.Sprintf("%s: layer %d output", name, l), got[l], want[l])
	}
	for _, it := range items {
		end := it.Pos + len(it.Tokens)
		for _, l := range mambaLayers {
			mambaSameBytes(t, fmt.Sprintf("%s: seq %d layer %d live state", name, it.Seq, l), r.slotBytes(l, 0, r.live[it.Seq]), r.hist[it.Seq][l][end])
			for _, sn := range it.Snapshots {
				mambaSameBytes(t, fmt.Sprintf("%s: seq %d layer %d snapshot at %d", name, it.Seq, l, sn.Pos),
					r.slotBytes(l, r.d.idx[sn.Pool], sn.Block), r.hist[it.Seq][l][sn.Pos])
			}
		}
	}
}

func mambaSame(t testing.TB, what string, got, want []float32) {
	t.Helper()
	if len(got) != len(want) {
		t.Errorf("%s: %d values, want %d", what, len(got), len(want))
		return
	}
	for i := range got {
		if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
			t.Errorf("%s: [%d] = %v (%#x), want %v (%#x)", what, i, got[i], math.Float32bits(got[i]), want[i], math.Float32bits(want[i]))
			return
		}
	}
}

func mambaSameBytes(t testing.TB, what string, got, want []byte) {
	t.Helper()
	if len(got) != len(want) {
		t.Errorf("%s: %d bytes, want %d", what, len(got), len(want))
		return
	}
	for i := range got {
		if got[i] != want[i] {
			t.Errorf("%s: byte %d = %#x, want %#x (of %d)", what, i, got[i], want[i], len(got))
			return
		}
	}
}

func toks(n int) []int32 { return make([]int32, n) }

// TestMamba2States runs a scripted trace per shape through the cuda
// device's Mamba2 state machine and kernels and checks every output, live
// state and snapshot bit for bit against kernelspec.Mamba2: prefill from
// zero (over a dirty slot), one-row steps, a sequence first seen at Pos > 0
// (prefix reuse), chunked prefill against one-shot, snapshots into a
// host-tier pool, draft tails with partial, full and no acceptance, the dt
// floor on prompt tokens only, and a restart at Pos 0.
func TestMamba2States(t *testing.T) {
	shapes := []mambaShape{
		{heads: 4, headDim: 6, state: 5, groups: 2, conv: 4, convDtype: kernelspec.F32, ssmDtype: kernelspec.F32},
		{heads: 6, headDim: 16, state: 16, groups: 3, conv: 4, convDtype: kernelspec.BF16, ssmDtype: kernelspec.BF16, dtMin: 0.3},
		{heads: 2, headDim: 3, state: 130, groups: 1, conv: 1, convDtype: kernelspec.F32, ssmDtype: kernelspec.BF16, dtMin: 0.3},
		{heads: 3, headDim: 5, state: 7, groups: 3, conv: 3, convDtype: kernelspec.BF16, ssmDtype: kernelspec.F32, dtMin: 0.2},
		{heads: 8, headDim: 64, state: 128, groups: 2, conv: 4, convDtype: kernelspec.BF16, ssmDtype: kernelspec.F32, dtMin: 0.1},
		{heads: 2, headDim: 40, state: 64, groups: 1, conv: 2, convDtype: kernelspec.F32, ssmDtype: kernelspec.BF16},  // a partial tile
		{heads: 1, headDim: 3, state: 1024, groups: 1, conv: 4, convDtype: kernelspec.BF16, ssmDtype: kernelspec.F32}, // the largest state
	}
	for _, sh := range shapes {
		t.Run(sh.String(), func(t *testing.T) {
			r := newMambaRig(t, sh)
			const A, B, C, D, E = 1, 2, 3, 4, 5
			for i, s := range []kvcache.SeqID{A, B, C, D, E} {
				r.live[s] = kvcache.BlockID(i + 1)
			}
			r.setSlot(C, 5, 7)
			r.step("step 1", []mambaItem{
				{Item: worker.Item{Seq: A, Pos: 0, Tokens: toks(7), Sample: true, Snapshots: []kvcache.SnapshotSlot{
					{Pos: 4, Pool: mambaSnapPool, Block: 1}, {Pos: 7, Pool: mambaSnapPool, Block: 2}}}, key: A},
				{Item: worker.Item{Seq: B, Pos: 0, Tokens: toks(1), Sample: true}, key: B},
				{Item: worker.Item{Seq: C, Pos: 5, Tokens: toks(3)}, key: C},
				{Item: worker.Item{Seq: D, Pos: 0, Tokens: toks(33), Snapshots: []kvcache.SnapshotSlot{{Pos: 1, Pool: mambaSnapPool, Block: 3}}}, key: D},
			})
			r.step("step 2", []mambaItem{
				{Item: worker.Item{Seq: A, Pos: 7, Tokens: toks(3), Draft: 2, Sample: true}, key: A, gen: 2},
				{Item: worker.Item{Seq: B, Pos: 1, Tokens: toks(3), Draft: 2, Sample: true}, key: B, gen: 2},
				{Item: worker.Item{Seq: C, Pos: 8, Tokens: toks(4), Sample: true}, key: C},
				{Item: worker.Item{Seq: D, Pos: 33, Tokens: toks(30), Sample: true}, key: D},
				{Item: worker.Item{Seq: E, Pos: 0, Tokens: toks(63)}, key: D},
			})
			// Chunked prefill (D) against one shot (E), on the device.
			for _, l := range mambaLayers {
				mambaSameBytes(t, fmt.Sprintf("layer %d: chunked D against one-shot E", l), r.slotBytes(l, 0, r.live[D]), r.slotBytes(l, 0, r.live[E]))
			}
			r.step("step 3", []mambaItem{
				{Item: worker.Item{Seq: A, Pos: 9, Tokens: toks(2), Draft: 1, Sample: true}, key: A, gen: 3}, // one draft kept
				{Item: worker.Item{Seq: B, Pos: 4, Tokens: toks(1), Sample: true}, key: B, gen: 3},           // both kept
				{Item: worker.Item{Seq: C, Pos: 12, Tokens: toks(1), Sample: true}, key: C},
				{Item: worker.Item{Seq: D, Pos: 63, Tokens: toks(1), Sample: true}, key: D},
			})
			r.step("step 4", []mambaItem{
				{Item: worker.Item{Seq: A, Pos: 10, Tokens: toks(4), Draft: 3, Sample: true}, key: A, gen: 4}, // the draft rejected
				{Item: worker.Item{Seq: B, Pos: 0, Tokens: toks(2), Sample: true}, key: B, gen: 4},            // restart
			})
			r.step("step 5", []mambaItem{
				{Item: worker.Item{Seq: A, Pos: 11, Tokens: toks(1), Sample: true}, key: A, gen: 5}, // tail[0] of step 4
			})
		})
	}
}

// TestMamba2Errors: a sequence whose state covers neither Pos nor a kept
// draft state, and a snapshot pool outside the layout, are item errors.
func TestMamba2Errors(t *testing.T) {
	r := newMambaRig(t, mambaShape{heads: 2, headDim: 4, state: 4, groups: 1, conv: 2, convDtype: kernelspec.F32, ssmDtype: kernelspec.F32})
	r.live[1] = 0
	r.step("prefill", []mambaItem{{Item: worker.Item{Seq: 1, Pos: 0, Tokens: toks(3), Sample: true}, key: 1}})
	o := r.o
	for _, it := range []worker.Item{
		{Seq: 1, Pos: 2, Tokens: toks(1)},
		{Seq: 1, Pos: 3, Tokens: toks(1), Snapshots: []kvcache.SnapshotSlot{{Pos: 4, Pool: 99, Block: 0}}},
	} {
		var err error
		on(t, o, func() {
			o.t = device.TablesOf(2, map[kvcache.SeqID][][]kvcache.BlockID{1: {{0}, nil}})
			err = r.d.prepareStates(o, []worker.Item{it})
		})
		if kvcache.KindOf(err) != kvcache.KindInvalidArg {
			t.Errorf("prepareStates(pos %d, snapshots %v) = %v, want an item error", it.Pos, it.Snapshots, err)
		}
	}
}

// BenchmarkMamba2 times one Nemotron-H-sized Mamba2 layer call (128 heads
// of 64, state 128, 8 groups, float32 state), host work and a sync
// included: a 1024-token prefill chunk of one sequence (the scan's token
// loop dominates), and a decode step of 64 sequences (reading and writing
// their 4 MiB ssm states dominates).
func BenchmarkMamba2(b *testing.B) {
	sh := mambaShape{heads: 128, headDim: 64, state: 128, groups: 8, conv: 4, convDtype: kernelspec.F32, ssmDtype: kernelspec.F32}
	for _, c := range []struct {
		name       string
		seqs, rows int
	}{{"prefill1024", 1, 1024}, {"decode64", 64, 1}} {
		b.Run(c.name, func(b *testing.B) {
			sh.blocks = c.seqs
			r := newMambaRig(b, sh)
			l := mambaLayers[0]
			mb := r.mix[l].Mamba
			o := r.o
			var items []worker.Item
			var segs []synth.Seg
			tabs := map[kvcache.SeqID][][]kvcache.BlockID{}
			var x synth.Mamba2In
			on(b, o, func() {
				for i := 0; i < c.seqs; i++ {
					seq := kvcache.SeqID(i + 1)
					// At Pos 1 and never finished: a fresh sequence each time,
					// whose slot prepareStates leaves alone.
					items = append(items, worker.Item{Seq: seq, Pos: 1, Tokens: toks(c.rows)})
					segs = append(segs, synth.Seg{Seq: seq, Pos: 1, Rows: c.rows})
					tabs[seq] = [][]kvcache.BlockID{{kvcache.BlockID(i)}, nil}
				}
				n := c.seqs * c.rows
				rng := rand.New(rand.NewSource(1))
				f := func(k int) []float32 {
					v := make([]float32, k)
					for i := range v {
						v[i] = 2*rng.Float32() - 1
					}
					return v
				}
				x = synth.Mamba2In{Z: r.tensor(f(n*mb.Inner()), n, mb.Inner()), XBC: r.tensor(f(n*mb.ConvDim()), n, mb.ConvDim()), DT: r.tensor(f(n*mb.Heads), n, mb.Heads)}
				o.t = device.TablesOf(2, tabs)
			})
			run := func() {
				on(b, o, func() {
					if err := r.d.prepareStates(o, items); err != nil {
						b.Error(err)
						return
					}
					if _, err := o.Mamba2(context.Background(), l, segs, x, r.dw[l]); err != nil {
						b.Error(err)
					}
				})
				o.g.do(o.ar.reset)
			}
			run()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				run()
			}
		})
	}
}

// TestMamba2Dt pins kvx_mamba_dt to the cpu kernel's step on many values:
// Softplus (Go's math.Exp and math.Log1p), the floor and exp(dt*A).
func TestMamba2Dt(t *testing.T) {
	o := newTestOps(t)
	const rows, heads = 1 << 12, 64
	rng := rand.New(rand.NewSource(3))
	dt, bias, a := make([]float32, rows*heads), make([]float32, heads), make([]float32, heads)
	floors := make([]float32, rows)
	for i := range dt {
		dt[i] = float32(rng.NormFloat64() * 8)
		if i%97 == 0 {
			dt[i] = float32(rng.NormFloat64() * 1e-9) // log1p's small arguments
		}
	}
	for h := range bias {
		bias[h], a[h] = float32(rng.NormFloat64()), -float32(math.Exp(rng.NormFloat64()))
	}
	for r := range floors {
		if r%2 == 1 {
			floors[r] = 0.05
		}
	}
	gotDt, gotDA := make([]float32, rows*heads), make([]float32, rows*heads)
	on(t, o, func() {
		dts, dAs := o.scratch(rows*heads*4), o.scratch(rows*heads*4)
		o.run("kvx_mamba_dt", dim{blocks(rows*heads, 256), 1, 1}, dim{256, 1, 1}, 0,
			put(o, dt), put(o, bias), put(o, a), put(o, floors), dts, dAs, rows, heads)
		o.fail(o.g.sync())
		o.fail(download(gotDt, dts))
		o.fail(download(gotDA, dAs))
	})
	wantDt, wantDA := make([]float32, rows*heads), make([]float32, rows*heads)
	for i := range dt {
		r, h := i/heads, i%heads
		m := kernelspec.Mamba2{DtMin: floors[r]}
		v := kernel.Softplus(dt[i] + bias[h])
		if m.DtMin > 0 {
			v = max(v, m.DtMin)
		}
		wantDt[i], wantDA[i] = v, float32(math.Exp(float64(v*a[h])))
	}
	mambaSame(t, "dt", gotDt, wantDt)
	mambaSame(t, "dA", gotDA, wantDA)
}
