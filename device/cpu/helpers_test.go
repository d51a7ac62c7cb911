package cpu_test

import (
	"context"
	"fmt"
	"math"
	"slices"
	"testing"

	cachemgrv1 "github.com/kvx-dev/kvx/cachemgr_v1"
	cachemgrv2 "github.com/kvx-dev/kvx/cachemgr_v2"
	"github.com/kvx-dev/kvx/device"
	"github.com/kvx-dev/kvx/device/cpu"
	"github.com/kvx-dev/kvx/dsa"
	"github.com/kvx-dev/kvx/dsa/mla"
	"github.com/kvx-dev/kvx/gqa"
	"github.com/kvx-dev/kvx/mamba"
	"github.com/kvx-dev/kvx/plugins/model"
	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
	"github.com/kvx-dev/kvx/plugins/v1/spec"
	"github.com/kvx-dev/kvx/plugins/v1/worker"
)

const seed = 7

var (
	backends = map[string]device.Backend{"gqa": gqa.Backend, "mla": mla.Backend, "dsa": dsa.Backend}
	managers = map[string]func() kvcache.Manager{
		"v1":    func() kvcache.Manager { return cachemgrv1.New() },
		"v2":    func() kvcache.Manager { return cachemgrv2.New() },
		"mamba": func() kvcache.Manager { return mamba.New() },
	}
)

// synthModel is the synthetic version of a preset with TP-1 buffers.
func synthModel(t testing.TB, preset string, s model.SyntheticSpec, kv string) spec.Model {
	t.Helper()
	base, err := model.Load(preset)
	if err != nil {
		t.Fatal(err)
	}
	m, err := model.Synthetic(base, s)
	if err != nil {
		t.Fatal(err)
	}
	if err := model.FillBuffers(&m, model.Dtypes{KV: kv}, 1); err != nil {
		t.Fatal(err)
	}
	return m
}

// opts configure a rig.
type opts struct {
	backend string
	manager string
	pp      int
	tpb     int // tokens per block
	drafts  int
	kv      string
	reuse   bool
	snaps   kvcache.SnapshotConfig
	batch   int             // max batch size; 0 = 8
	host    int64           // host tier bytes
	maxSeq  int             // max sequence length; 0 = 160
	open    device.OpenFunc // the cpu device; nil = cpu.Open
	top     int             // top logprobs asked of every sampling item
}

// rig is a pipeline of real managers and cpu workers, driven step by step
// the way the engine does: Reserve on every stage, Forward through the
// stages, Commit with the accepted counts.
type rig struct {
	t       testing.TB
	m       spec.Model
	o       opts
	mgrs    []kvcache.Manager
	ws      []*device.Worker
	layouts []kvcache.Layout
	release []kvcache.SeqID
	// corrupt, when set, edits each stage's batch before its forward.
	corrupt func(stage int, b *worker.Batch)
	steps   int // steps run
	// after, when set, runs after every step (suspend, resume).
	after func(r *rig)
}

func newRig(t testing.TB, m spec.Model, o opts) *rig {
	t.Helper()
	ctx := context.Background()
	if o.pp == 0 {
		o.pp = 1
	}
	if o.tpb == 0 {
		o.tpb = 4
	}
	if o.batch == 0 {
		o.batch = 8
	}
	if o.kv == "" {
		o.kv = "bf16"
	}
	if o.maxSeq == 0 {
		o.maxSeq = 160
	}
	if o.open == nil {
		o.open = cpu.Open
	}
	ranges, err := model.SplitStages(m, o.pp)
	if err != nil {
		t.Fatal(err)
	}
	r := &rig{t: t, m: m, o: o}
	for s, rg := range ranges {
		mgr := managers[o.manager]()
		lay, err := mgr.Configure(ctx, kvcache.Config{
			Stage: s, Stages: o.pp, Layers: m.Layers[rg[0]:rg[1]], TokensPerBlock: o.tpb,
			DeviceBytes: 4 << 20, HostBytes: o.host, MaxBatchSize: o.batch, MaxNumTokens: 256, MaxSeqLen: o.maxSeq, MaxDraftTokens: o.drafts,
			EnableBlockReuse: o.reuse, Snapshots: o.snaps,
		})
		if err != nil {
			t.Fatalf("stage %d: manager %s Configure: %v", s, o.manager, err)
		}
		w := device.NewWorker(backends[o.backend], device.WithDevice("cpu", o.open))
		_, err = w.Configure(ctx, worker.Config{
			Stage: s, Stages: o.pp, Model: m, First: rg[0], Last: rg[1], Backend: o.backend, Device: "cpu",
			TensorParallel: 1, KVDtype: o.kv, Layout: lay, Seed: seed, DraftTokens: o.drafts,
		})
		if err != nil {
			t.Fatalf("stage %d: worker Configure: %v", s, err)
		}
		r.mgrs = append(r.mgrs, mgr)
		r.ws = append(r.ws, w)
		r.layouts = append(r.layouts, lay)
	}
	return r
}

// req is one request being generated.
type req struct {
	seq    kvcache.SeqID
	prompt []int32
	chunk  int // prefill chunk; 0 = whole prompt
	want   int // tokens to generate

	pos      int // history
	out      []int32
	drafts   []int32
	logits   []float32
	steps    [][]float32             // every sampled token's logits, in order
	tops     [][]worker.TokenLogprob // Output.TopLogprobs of every sampled token, with opts.top
	reused   int
	begun    bool // reserved at least once
	paused   bool // suspended to the host tier
	accepted int  // drafts accepted in all
	done     bool
}

// run drives reqs to completion, all in the same batches.
func (r *rig) run(reqs []*req) {
	r.t.Helper()
	for steps := 0; ; steps++ {
		if steps > 1000 {
			r.t.Fatal("no progress after 1000 steps")
		}
		var active []*req
		waiting := false
		for _, q := range reqs {
			switch {
			case q.done:
			case q.paused:
				waiting = true
			default:
				active = append(active, q)
			}
		}
		if len(active) > 0 {
			if err := r.step(active); err != nil {
				r.t.Fatal(err)
			}
		} else if !waiting {
			break
		}
		if r.after != nil {
			r.after(r)
		}
	}
}

// step runs one step of the active requests; it returns forward errors and
// fails the test on manager errors.
func (r *rig) step(active []*req) error {
	t := r.t
	ctx := context.Background()
	items := make([]worker.Item, len(active))
	res := make([]kvcache.ReserveItem, len(active))
	for i, q := range active {
		it := worker.Item{Seq: q.seq, Pos: q.pos, Logits: true} // the checks compare logits
		if q.pos < len(q.prompt) {
			if !q.begun && r.o.reuse {
				got, err := r.mgrs[0].Lookup(ctx, []kvcache.LookupItem{{Seq: q.seq, Prompt: q.prompt}})
				if err != nil {
					t.Fatal(err)
				}
				reuse := got[0]
				for _, m := range r.mgrs[1:] {
					g, err := m.Lookup(ctx, []kvcache.LookupItem{{Seq: q.seq, Prompt: q.prompt}})
					if err != nil {
						t.Fatal(err)
					}
					reuse = min(reuse, g[0])

				}
				q.reused, q.pos = reuse, reuse
				it.Pos = reuse
			}
			n := len(q.prompt) - q.pos
			if q.chunk > 0 {
				n = min(n, q.chunk)
			}
			it.Tokens = q.prompt[q.pos : q.pos+n]
			it.Sample = q.pos+n == len(q.prompt)
			if it.Sample {
				it.TopLogprobs = r.o.top
			}
			res[i] = kvcache.ReserveItem{Seq: q.seq, Tokens: n, New: !q.begun}
			if res[i].New && r.o.reuse {
				res[i].Prompt = q.prompt
				res[i].Reuse = q.reused
			}
		} else {
			it.Tokens = append([]int32{q.out[len(q.out)-1]}, q.drafts...)
			it.Draft = len(q.drafts)
			it.Sample = true
			it.TopLogprobs = r.o.top
			res[i] = kvcache.ReserveItem{Seq: q.seq, Tokens: 1, Draft: it.Draft}
		}
		items[i] = it
	}
	var copies [][]kvcache.Copy
	stageItems := make([][]worker.Item, len(r.mgrs))
	for s, m := range r.mgrs {
		grants, err := m.Reserve(ctx, res)
		if err != nil {
			t.Fatalf("stage %d Reserve: %v", s, err)
		}
		var cp []kvcache.Copy
		its := slices.Clone(items)
		for i, g := range grants {
			if !g.OK {
				t.Fatalf("stage %d Reserve(%+v) denied: %s", s, res[i], g.Reason)
			}
			its[i].Tables = g.Tables
			its[i].Snapshots = g.Snapshots
			cp = append(cp, g.Copies...)
		}
		stageItems[s] = its
		copies = append(copies, cp)
	}
	for _, q := range active {
		q.begun = true
	}
	var hidden []byte
	var outs []worker.Output
	for s, w := range r.ws {
		b := worker.Batch{Items: stageItems[s], Hidden: hidden, Released: r.release, Copies: copies[s]}
		if r.corrupt != nil {
			r.corrupt(s, &b)
		}
		out, err := w.Forward(ctx, b)
		if err != nil {
			return err
		}
		if out.Nanos <= 0 || out.Modelled {
			t.Fatalf("stage %d: Nanos %d, Modelled %v: want measured time", s, out.Nanos, out.Modelled)
		}
		hidden, outs = out.Hidden, out.Outputs
	}
	r.release = nil
	r.steps++
	bySeq := map[kvcache.SeqID]worker.Output{}
	for _, o := range outs {
		bySeq[o.Seq] = o
	}
	commits := make([]kvcache.CommitItem, len(active))
	for i, q := range active {
		it := items[i]
		acc := len(it.Tokens)
		if it.Sample {
			o, ok := bySeq[q.seq]
			if !ok {
				t.Fatalf("no output for seq %d", q.seq)
			}
			acc = len(it.Tokens) - it.Draft + len(o.Tokens) - 1
			q.out = append(q.out, o.Tokens...)
			q.accepted += len(o.Tokens) - 1
			q.drafts = o.Drafts
			q.logits = o.Logits
			q.steps = append(q.steps, o.Logits)
			q.tops = append(q.tops, o.TopLogprobs...)
		}
		q.pos += acc
		commits[i] = kvcache.CommitItem{Seq: q.seq, Accepted: acc}
		if len(q.out) >= q.want {
			q.done = true
			r.release = append(r.release, q.seq)
		}
	}
	for s, m := range r.mgrs {
		cr, err := m.Commit(ctx, commits)
		if err != nil {
			t.Fatalf("stage %d Commit: %v", s, err)
		}
		if len(cr.Copies) > 0 {
			if err := r.ws[s].CopyBlocks(ctx, cr.Copies); err != nil {
				t.Fatalf("stage %d CopyBlocks: %v", s, err)
			}
		}
		// Finished sequences leave the managers now and the workers with
		// the next batch (Released).
		if len(r.release) > 0 {
			if err := m.Release(ctx, r.release); err != nil {
				t.Fatalf("stage %d Release: %v", s, err)
			}
		}
	}
	return nil
}

// prompt returns a deterministic prompt of n tokens in [0, vocab).
func prompt(n, salt, vocab int) []int32 {
	p := make([]int32, n)
	x := uint64(salt)*0x9e3779b97f4a7c15 + 1
	for i := range p {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		p[i] = int32(x % uint64(vocab))
	}
	return p
}

// sameBits reports whether a and b are equal bit for bit.
func sameBits(a, b []float32) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if math.Float32bits(a[i]) != math.Float32bits(b[i]) {
			return false
		}
	}
	return true
}

// checkReference compares every request with the dense reference.
func checkReference(t *testing.T, ref *cpu.Reference, reqs []*req) {
	t.Helper()
	for _, msg := range mismatches(t, ref, reqs) {
		t.Error(msg)
	}
}

// mismatches lists how each request differs from the dense reference:
// its tokens, or the bits of its last logits.
func mismatches(t *testing.T, ref *cpu.Reference, reqs []*req) []string {
	t.Helper()
	var msgs []string
	for _, q := range reqs {
		toks, lg, err := ref.Generate(context.Background(), q.prompt, len(q.out))
		if err != nil {
			t.Fatal(err)
		}
		switch {
		case !slices.Equal(toks, q.out):
			msgs = append(msgs, fmt.Sprintf("seq %d (prompt %d, chunk %d, reused %d): tokens %v, reference %v", q.seq, len(q.prompt), q.chunk, q.reused, q.out, toks))
		case !sameBits(lg, q.logits):
			msgs = append(msgs, fmt.Sprintf("seq %d (prompt %d, chunk %d, reused %d): last logits differ from the reference", q.seq, len(q.prompt), q.chunk, q.reused))
		}
	}
	return msgs
}
