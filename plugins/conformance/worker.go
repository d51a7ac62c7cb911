package conformance

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
	"github.com/kvx-dev/kvx/plugins/v1/spec"
	"github.com/kvx-dev/kvx/plugins/v1/worker"
)

// WorkerOptions shape the configuration the worker checks use. The zero
// value is a good default: the suite's small model on the sim device with
// 16 tokens per block and 2 draft tokens.
type WorkerOptions struct {
	// Model to run, whole, as one stage. nil: SmallModel of the first of
	// mla, dsa and gqa that Info.Mixers lists.
	Model *spec.Model
	// Backend is Config.Backend; "": Info.Name.
	Backend string
	// Device is Config.Device; "": Info.Device, else "sim".
	Device string
	// Hardware is Config.Hardware; nil: an H200-like accelerator.
	Hardware *spec.Hardware
	// TokensPerBlock of the layout; 0: 16.
	TokensPerBlock int
	// DraftTokens (MTP) proposed per step; 0: 2. DraftAcceptance; 0: 0.5.
	DraftTokens     int
	DraftAcceptance float64
	// Seed of the weights and of sampling on sim; 0: 1.
	Seed uint64
	// Checks runs only the named checks (see WorkerChecks); nil: all.
	Checks []string
	// CheckTimeout bounds each check; 0: none.
	CheckTimeout time.Duration
}

// CheckWorker runs every worker check (WorkerChecks), each on a fresh
// worker from factory, and returns errors.Join of one *Violation per failed
// check (nil when all pass). See the package doc for what the factory may
// return.
func CheckWorker(ctx context.Context, factory func() worker.Worker, opts WorkerOptions) error {
	return runChecks(workerChecks, opts.Checks, func(c check[*wh]) *Violation {
		return runWorkerCheck(ctx, factory, opts, c)
	})
}

// TestWorker runs CheckWorker and reports each violation with t.Error.
func TestWorker(t *testing.T, factory func() worker.Worker, opts WorkerOptions) {
	t.Helper()
	testReport(t, CheckWorker(context.Background(), factory, opts))
}

// WorkerChecks lists the names of the worker checks in the order they run
// (WorkerCheckDocs gives each one's rule).
func WorkerChecks() []string {
	return checkNames(workerChecks)
}

// WorkerCheckDocs returns each worker check's one-line rule by name.
func WorkerCheckDocs() map[string]string {
	return checkDocs(workerChecks)
}

var workerChecks = []check[*wh]{
	{"Info", "Info answers first: a name, a version, Protocols containing 1, a device and the mixers it runs", checkWorkerInfo},
	{"Configure", "Configure accepts a stage of a model whose mixers Info lists, with a layout", checkWorkerConfigure},
	{"Forward", "the last stage returns one Output per item that samples, in item order: the accepted drafts (a prefix of the item's) then one sampled token, and DraftTokens drafts", checkWorkerForward},
	{"BadItemNegativePos", "an item with Pos < 0 is an item-scoped KindInvalidArg error naming it; the worker lives on", badItem(func(it *worker.Item) { it.Pos = -1 })},
	{"BadItemNoTokens", "an item with no Tokens is an item-scoped KindInvalidArg error naming it; the worker lives on", badItem(func(it *worker.Item) { it.Tokens = nil; it.Draft = 0 })},
	{"BadItemDraft", "an item with Draft > len(Tokens)-1 is an item-scoped KindInvalidArg error naming it; the worker lives on", badItem(func(it *worker.Item) { it.Draft = len(it.Tokens) })},
	{"BadItemUnknownPool", "a table delta for a pool that is not in the layout is an item-scoped KindInvalidArg error naming the item; the worker lives on", badItem(func(it *worker.Item) {
		it.Tables = append(it.Tables, kvcache.TableDelta{Pool: 9999, From: 0, Blocks: []kvcache.BlockID{0}})
	})},
	{"CopyBlocks", "CopyBlocks and Batch.Copies with blocks inside the layout's pools succeed, and the worker serves on", checkWorkerCopies},
	{"TwoStages", "a first stage returns Hidden and no Outputs; the last stage, given that Hidden, returns the Outputs", checkWorkerStages},
	{"Health", "Health is nil while the worker serves", checkWorkerHealth},
	{"PromptRows", "where the worker returns prompt rows (Item.PromptLogprobs, feature prompt_logprobs), Result.Prompt has one entry per asking item in item order with Item.PromptRows rows, each a log-probability <= 0 and, with PromptTopLogprobs K, the min(K, vocab) most likely tokens, most likely first; a prompt prefilled in chunks gets the rows one chunk gives, bit for bit", checkWorkerPromptRows},
}

func runWorkerCheck(ctx context.Context, factory func() worker.Worker, opts WorkerOptions, c check[*wh]) *Violation {
	ctx, cancel := checkCtx(ctx, opts.CheckTimeout)
	defer cancel()
	var w worker.Worker
	defer func() { closeIfCloser(w) }()
	return runOne(c.name, func() {
		w = factory()
		if w == nil {
			panic(failure{&Violation{Call: "factory()", Got: "nil", Want: "a worker.Worker"}})
		}
		c.run(&wh{ctx: ctx, w: w, o: opts, factory: factory})
	})
}

// wh is the harness of one check on one worker.
type wh struct {
	ctx     context.Context
	w       worker.Worker
	factory func() worker.Worker // for checks that need a second worker
	o       WorkerOptions
	info    worker.Info
	cfg     worker.Config
	tpb     int

	// The suite plays the cache manager: block tables it told the worker.
	tables map[kvcache.SeqID][][]kvcache.BlockID
	next   []kvcache.BlockID // next free block per pool
	hist   map[kvcache.SeqID]int
	last   map[kvcache.SeqID]wlast // the last output per sequence
	step   uint64
	hidden []byte // Batch.Hidden of the next forward (a later stage)
}

type wlast struct {
	sampled int32
	drafts  []int32
}

func (h *wh) failf(call, want, format string, args ...any) {
	panic(failure{&Violation{Call: call, Got: fmt.Sprintf(format, args...), Want: want}})
}

func (h *wh) callInfo() worker.Info {
	info, err := h.w.Info(h.ctx)
	if err != nil {
		h.failf("Info()", "Info answers first, before Configure, without error", "error %v", err)
	}
	h.info = info
	return info
}

// stageConfig is config for stage `stage` of two: the model's layers split
// after the first half (MTP layers stay on the last stage).
func (h *wh) stageConfig(stage int) worker.Config {
	cfg := h.config()
	m := cfg.Model
	split := len(m.Layers) / 2
	cfg.Stage, cfg.Stages = stage, 2
	cfg.First, cfg.Last = 0, split
	if stage == 1 {
		cfg.First, cfg.Last = split, len(m.Layers)
	}
	var pools []kvcache.Pool
	for _, p := range cfg.Layout.Pools {
		p.Layers = slices.DeleteFunc(slices.Clone(p.Layers), func(i int) bool { return i < cfg.First || i >= cfg.Last })
		if len(p.Layers) > 0 {
			var bytes int64
			for _, i := range p.Layers {
				for _, b := range m.Layers[i].Buffers {
					if p.TokensPerBlock > 0 {
						bytes += b.BytesPerToken * int64(p.TokensPerBlock)
					} else {
						bytes += b.BytesPerSeq
					}
				}
			}
			p.BlockBytes = bytes
			pools = append(pools, p)
		}
	}
	cfg.Layout.Pools = pools
	return cfg
}

// config builds the single-stage config: the whole model, a layout with one
// pool per attention window (full first) plus a state pool when the model
// has state buffers.
func (h *wh) config() worker.Config {
	o := &h.o
	if o.TokensPerBlock == 0 {
		o.TokensPerBlock = 16
	}
	if o.DraftTokens == 0 {
		o.DraftTokens = 2
	}
	if o.DraftAcceptance == 0 {
		o.DraftAcceptance = 0.5
	}
	if o.Seed == 0 {
		o.Seed = 1
	}
	var m spec.Model
	if o.Model != nil {
		m = *o.Model
	} else {
		mx := pickMixer(h.info.Mixers, spec.MixerMLA, spec.MixerDSA, spec.MixerGQA)
		if mx == "" {
			h.failf("Info()", "WorkerOptions.Model set, or Info.Mixers listing one of mla, dsa, gqa (the built-in models)", "Mixers %v", h.info.Mixers)
		}
		m, _ = SmallModel(mx)
	}
	hw := simHardware
	if o.Hardware != nil {
		hw = *o.Hardware
	}
	backend, device := o.Backend, o.Device
	if backend == "" {
		backend = h.info.Name
	}
	if device == "" {
		device = h.info.Device
	}
	if device == "" {
		device = "sim"
	}
	tpb := o.TokensPerBlock
	var pools []kvcache.Pool
	windows := map[int]int{} // window -> pool index
	var stateBytes int64
	var stateLayers []int
	for _, l := range m.Layers {
		var bpt, bps int64
		for _, b := range l.Buffers {
			bpt += b.BytesPerToken
			bps += b.BytesPerSeq
		}
		if bps > 0 {
			stateBytes += bps
			stateLayers = append(stateLayers, l.Index)
		}
		if bpt == 0 {
			continue
		}
		i, ok := windows[l.Window]
		if !ok {
			i = len(pools)
			windows[l.Window] = i
			name := "full"
			if l.Window > 0 {
				name = fmt.Sprintf("window-%d", l.Window)
			}
			pools = append(pools, kvcache.Pool{ID: i, Name: name, Tier: kvcache.TierDevice, Window: l.Window, TokensPerBlock: tpb, Blocks: 1024})
		}
		pools[i].Layers = append(pools[i].Layers, l.Index)
		pools[i].BlockBytes += bpt * int64(tpb)
	}
	slices.SortStableFunc(pools, func(a, b kvcache.Pool) int { return a.Window - b.Window })
	for i := range pools {
		pools[i].ID = i
	}
	if stateBytes > 0 {
		pools = append(pools, kvcache.Pool{ID: len(pools), Name: "ssm", Tier: kvcache.TierDevice, Layers: stateLayers, BlockBytes: stateBytes, Blocks: 64})
	}
	return worker.Config{
		Stage: 0, Stages: 1, Model: m, First: 0, Last: len(m.Layers),
		Backend: backend, Device: device, Hardware: hw, TensorParallel: 1,
		WeightsDtype: "bf16", KVDtype: "bf16",
		Layout:      kvcache.Layout{Pools: pools, MaxSeqTokens: 1024 * tpb},
		Seed:        o.Seed,
		DraftTokens: o.DraftTokens, DraftAcceptance: o.DraftAcceptance,
	}
}

// setup calls Info and Configure.
func (h *wh) setup() {
	h.callInfo()
	h.cfg = h.config()
	h.tpb = h.cfg.Layout.Pools[0].TokensPerBlock
	if _, err := h.w.Configure(h.ctx, h.cfg); err != nil {
		h.failf("Configure("+fmtWorkerConfig(h.cfg)+")", "a single-stage config of a model whose mixers Info lists configures", "error %v", err)
	}
	h.tables = map[kvcache.SeqID][][]kvcache.BlockID{}
	h.next = make([]kvcache.BlockID, len(h.cfg.Layout.Pools))
	h.hist = map[kvcache.SeqID]int{}
	h.last = map[kvcache.SeqID]wlast{}
}

func fmtWorkerConfig(c worker.Config) string {
	return fmt.Sprintf("{model %q, layers [%d, %d) of %d, backend %q, device %q, stage %d of %d, draft tokens %d, pools %s}",
		c.Model.Name, c.First, c.Last, len(c.Model.Layers), c.Backend, c.Device, c.Stage, c.Stages, c.DraftTokens, fmtPools(c.Layout.Pools))
}

// item builds seq's item at pos writing toks (the last draft of them are
// drafts), with the table deltas that cover it. The deltas are recorded
// only when commit is called after a successful Forward.
func (h *wh) item(seq kvcache.SeqID, pos int, toks []int32, draft int, sample bool) worker.Item {
	it := worker.Item{Seq: seq, Pos: pos, Tokens: toks, Draft: draft, Sample: sample}
	if sample && seq%2 == 1 {
		it.TopLogprobs = confTopLogprobs // odd sequences ask for top logprobs too
		it.Logprobs = true               // and for their tokens' own (FeatureSampling)
	}
	t := h.tables[seq]
	for i, p := range h.cfg.Layout.Pools {
		have := 0
		if t != nil {
			have = len(t[i])
		}
		need := 1
		if p.TokensPerBlock > 0 {
			need = kvcache.BlocksFor(pos+len(toks), p.TokensPerBlock)
		}
		if need <= have {
			continue
		}
		d := kvcache.TableDelta{Pool: p.ID, From: have}
		for range need - have {
			d.Blocks = append(d.Blocks, h.next[i]%kvcache.BlockID(p.Blocks))
			h.next[i]++
		}
		it.Tables = append(it.Tables, d)
	}
	return it
}

// apply records the deltas of items the worker accepted.
func (h *wh) apply(items []worker.Item) {
	for _, it := range items {
		t := h.tables[it.Seq]
		if t == nil {
			t = make([][]kvcache.BlockID, len(h.cfg.Layout.Pools))
			h.tables[it.Seq] = t
		}
		for _, d := range it.Tables {
			i := slices.IndexFunc(h.cfg.Layout.Pools, func(p kvcache.Pool) bool { return p.ID == d.Pool })
			t[i] = append(t[i][:d.From], d.Blocks...)
		}
	}
}

func fmtItems(items []worker.Item) string {
	parts := make([]string, len(items))
	for i, it := range items {
		parts[i] = fmt.Sprintf("{Seq %d Pos %d Tokens [%d] Draft %d Sample %v Tables %s}", it.Seq, it.Pos, len(it.Tokens), it.Draft, it.Sample, fmtDeltas(it.Tables))
	}
	return strings.Join(parts, ", ")
}

// forward runs a batch that must succeed and checks the outputs of the last
// stage against the contract; it advances the suite's model of each item.
func (h *wh) forward(items ...worker.Item) worker.Result {
	h.step++
	call := fmt.Sprintf("Forward(step %d: %s)", h.step, fmtItems(items))
	res, err := h.w.Forward(h.ctx, worker.Batch{Step: h.step, Items: items, Hidden: h.hidden})
	if err != nil {
		h.failf(call, "a valid batch runs", "error %v", err)
	}
	h.apply(items)
	var sampling []worker.Item
	for _, it := range items {
		if it.Sample {
			sampling = append(sampling, it)
		}
	}
	if res.Hidden != nil {
		h.failf(call, "the last stage returns no Hidden", "%d bytes of Hidden", len(res.Hidden))
	}
	if len(res.Outputs) != len(sampling) {
		h.failf(call, "the last stage returns one Output per item that samples, in item order", "%d outputs for %d sampling items", len(res.Outputs), len(sampling))
	}
	if res.Nanos < 0 || (h.cfg.Device == "sim" && !res.Modelled) {
		h.failf(call, "Nanos >= 0, Modelled on sim", "Nanos %d, Modelled %v on device %q", res.Nanos, res.Modelled, h.cfg.Device)
	}
	vocab := int32(h.cfg.Model.Vocab)
	for i, out := range res.Outputs {
		it := sampling[i]
		if out.Seq != it.Seq {
			h.failf(call, "Outputs come in the order of the items that sampled", "output %d is seq %d, want seq %d", i, out.Seq, it.Seq)
		}
		if n := len(out.Tokens); n < 1 || n > it.Draft+1 {
			h.failf(call, "Output.Tokens are the accepted drafts followed by one sampled token: 1..Draft+1 tokens",
				"seq %d with Draft %d: %d tokens %v", it.Seq, it.Draft, n, out.Tokens)
		}
		acc := len(out.Tokens) - 1
		drafts := it.Tokens[len(it.Tokens)-it.Draft:]
		if !slices.Equal(out.Tokens[:acc], drafts[:acc]) {
			h.failf(call, "Output.Tokens begin with the accepted drafts: a prefix of the item's draft tokens",
				"seq %d: tokens %v, the item's drafts %v", it.Seq, out.Tokens, drafts)
		}
		if len(out.Drafts) != h.cfg.DraftTokens {
			h.failf(call, "Output.Drafts are the MTP head's proposals for the next step: DraftTokens of them",
				"seq %d: %d drafts %v, DraftTokens %d", it.Seq, len(out.Drafts), out.Drafts, h.cfg.DraftTokens)
		}
		for _, tok := range append(slices.Clone(out.Tokens), out.Drafts...) {
			if tok < 0 || tok >= vocab {
				h.failf(call, "sampled and proposed tokens are ids of the model's vocabulary", "seq %d: token %d, vocab %d", it.Seq, tok, vocab)
			}
		}
		h.checkTopLogprobs(call, it, out)
		h.checkLogprobs(call, it, out)
		h.hist[it.Seq] = it.Pos + len(it.Tokens) - it.Draft + acc
		h.last[it.Seq] = wlast{sampled: out.Tokens[acc], drafts: slices.Clone(out.Drafts)}
	}
	for _, it := range items {
		if !it.Sample {
			h.hist[it.Seq] = it.Pos + len(it.Tokens)
		}
	}
	return res
}

// confTopLogprobs is what the suite's odd sequences ask for.
const confTopLogprobs = 3

// checkTopLogprobs checks an output's top logprobs, where the device
// returned them (devices without real math return none).
func (h *wh) checkTopLogprobs(call string, it worker.Item, out worker.Output) {
	if out.TopLogprobs == nil {
		return
	}
	if it.TopLogprobs == 0 || len(out.TopLogprobs) != len(out.Tokens) {
		h.failf(call, "Output.TopLogprobs: one list per token of Tokens, when the item asked for them",
			"seq %d asked for %d: %d lists for %d tokens", it.Seq, it.TopLogprobs, len(out.TopLogprobs), len(out.Tokens))
		return
	}
	vocab := int32(h.cfg.Model.Vocab)
	for j, l := range out.TopLogprobs {
		ok := len(l) == min(it.TopLogprobs, int(vocab)) && l[0].ID == out.Tokens[j]
		for k, e := range l {
			ok = ok && e.ID >= 0 && e.ID < vocab && e.Logprob <= 0 &&
				(k == 0 || e.Logprob <= l[k-1].Logprob)
		}
		if !ok {
			h.failf(call, "Output.TopLogprobs[j]: the min(K, vocab) most likely tokens of token j's position, most likely first (ties: lower id), led by token j",
				"seq %d token %d (%d): %v", it.Seq, j, out.Tokens[j], l)
		}
	}
}

// checkLogprobs checks an output's Logprobs: none unless asked for; on a
// device that computes top logprobs, one per token of Tokens, each the
// log-probability that leads its token's top list (the suite's items are
// greedy, so the token leads it).
func (h *wh) checkLogprobs(call string, it worker.Item, out worker.Output) {
	switch {
	case out.Logprobs == nil && (!it.Logprobs || out.TopLogprobs == nil):
		return
	case !it.Logprobs || len(out.Logprobs) != len(out.Tokens):
		h.failf(call, "Output.Logprobs: one per token of Tokens, when the item asked for them (Item.Logprobs) on a device with real math",
			"seq %d asked %t: %d logprobs for %d tokens", it.Seq, it.Logprobs, len(out.Logprobs), len(out.Tokens))
		return
	}
	for j, v := range out.Logprobs {
		if v > 0 || j < len(out.TopLogprobs) && len(out.TopLogprobs[j]) > 0 && out.TopLogprobs[j][0].Logprob != v {
			h.failf(call, "Output.Logprobs[j]: the log-probability of token j by the same log-softmax as its top logprobs",
				"seq %d token %d (%d): logprob %v, top %v", it.Seq, j, out.Tokens[j], v, out.TopLogprobs)
		}
	}
}

// prefillItem is seq's next chunk of n prompt tokens.
func (h *wh) prefillItem(seq kvcache.SeqID, n int, sample bool) worker.Item {
	pos := h.hist[seq]
	return h.item(seq, pos, prompt(n, int(seq)+pos), 0, sample)
}

// genItem is seq's next generation step: the last sampled token and the
// drafts proposed with it.
func (h *wh) genItem(seq kvcache.SeqID) worker.Item {
	l := h.last[seq]
	toks := append([]int32{l.sampled}, l.drafts...)
	return h.item(seq, h.hist[seq], toks, len(l.drafts), true)
}

func checkWorkerInfo(h *wh) {
	info := h.callInfo()
	if info.Name == "" || info.Version == "" || !slices.Contains(info.Protocols, worker.ProtocolVersion) || info.Device == "" || len(info.Mixers) == 0 {
		h.failf("Info()", "Info describes the worker: Name, Version, Protocols containing 1, Device, Mixers", "%+v", info)
	}
	if info.MemoryBytes < 0 || info.FreeBytes < 0 || info.FreeBytes > info.MemoryBytes {
		h.failf("Info()", "0 <= FreeBytes <= MemoryBytes (0 without real memory)", "MemoryBytes %d, FreeBytes %d", info.MemoryBytes, info.FreeBytes)
	}
}

func checkWorkerConfigure(h *wh) {
	h.callInfo()
	h.cfg = h.config()
	call := "Configure(" + fmtWorkerConfig(h.cfg) + ")"
	setup, err := h.w.Configure(h.ctx, h.cfg)
	if err != nil {
		h.failf(call, "a single-stage config of a model whose mixers Info lists configures", "error %v", err)
	}
	if setup.DeviceBytes < 0 {
		h.failf(call, "Setup.DeviceBytes >= 0", "%+v", setup)
	}
}

func checkWorkerForward(h *wh) {
	h.setup()
	a, b, c := kvcache.SeqID(1), kvcache.SeqID(2), kvcache.SeqID(3)
	// A whole prompt that samples; a first chunk that does not.
	h.forward(h.prefillItem(a, 20, true), h.prefillItem(b, 2*h.tpb, false))
	// Generation with drafts, a final chunk and a new prompt.
	h.forward(h.genItem(a), h.prefillItem(b, 5, true), h.prefillItem(c, 3, true))
	for range 8 {
		h.forward(h.genItem(a), h.genItem(b), h.genItem(c))
	}
	// A finished sequence is released; the others go on.
	h.step++
	items := []worker.Item{h.genItem(a), h.genItem(c)}
	call := fmt.Sprintf("Forward(step %d: Released [%d], %s)", h.step, b, fmtItems(items))
	res, err := h.w.Forward(h.ctx, worker.Batch{Step: h.step, Items: items, Released: []kvcache.SeqID{b}})
	if err != nil || len(res.Outputs) != 2 {
		h.failf(call, "a batch with Released sequences runs", "%d outputs, error %v", len(res.Outputs), err)
	}
}

// badItem returns a check: a batch with a valid item of a running sequence
// and an item of a new one broken by mutate is an item-scoped
// KindInvalidArg error that names the broken item only; Health is still nil
// and the next valid batch runs.
func badItem(mutate func(*worker.Item)) func(h *wh) {
	return func(h *wh) {
		h.setup()
		a, b := kvcache.SeqID(1), kvcache.SeqID(2)
		h.forward(h.prefillItem(a, 20, true))
		good := h.genItem(a)
		bad := h.prefillItem(b, 5, true)
		mutate(&bad)
		h.step++
		call := fmt.Sprintf("Forward(step %d: %s)", h.step, fmtItems([]worker.Item{good, bad}))
		_, err := h.w.Forward(h.ctx, worker.Batch{Step: h.step, Items: []worker.Item{good, bad}})
		want := "a per-item problem is a *kvcache.Error of kind KindInvalidArg whose Seqs name the bad item (and not the good one)"
		var e *kvcache.Error
		switch {
		case err == nil:
			h.failf(call, want, "nil error")
		case !errors.As(err, &e) || e.Kind != kvcache.KindInvalidArg:
			h.failf(call, want, "error %v (kind %v)", err, kvcache.KindOf(err))
		case !slices.Contains(e.Seqs, b) || slices.Contains(e.Seqs, a):
			h.failf(call, want, "Seqs %v (bad seq %d, good seq %d); error %q", e.Seqs, b, a, err.Error())
		}
		if err := h.w.Health(h.ctx); err != nil {
			h.failf("Health() after "+call, "an item-scoped error does not kill the worker", "error %v", err)
		}
		// The good item again, with a fresh sequence: the worker serves on.
		// (Its deltas are re-sent from the tables the suite knows, which is
		// right whether or not the failed batch applied them.)
		h.forward(h.genItem(a), h.prefillItem(kvcache.SeqID(3), 5, true))
		h.forward(h.genItem(a), h.genItem(kvcache.SeqID(3)))
	}
}

func checkWorkerCopies(h *wh) {
	h.setup()
	h.forward(h.prefillItem(1, 3*h.tpb, true))
	p := h.cfg.Layout.Pools[0]
	t := h.tables[1][0]
	copies := []kvcache.Copy{
		{SrcPool: p.ID, SrcBlock: t[0], DstPool: p.ID, DstBlock: kvcache.BlockID(p.Blocks - 1)},
		{SrcPool: p.ID, SrcBlock: t[1], DstPool: p.ID, DstBlock: kvcache.BlockID(p.Blocks - 2)},
	}
	for _, cs := range [][]kvcache.Copy{nil, copies} {
		if err := h.w.CopyBlocks(h.ctx, cs); err != nil {
			h.failf(fmt.Sprintf("CopyBlocks(%+v)", cs), "copies between blocks of the layout's pools succeed", "error %v", err)
		}
	}
	h.step++
	item := h.genItem(1)
	call := fmt.Sprintf("Forward(step %d: Copies %+v, %s)", h.step, copies, fmtItems([]worker.Item{item}))
	res, err := h.w.Forward(h.ctx, worker.Batch{Step: h.step, Items: []worker.Item{item}, Copies: copies})
	if err != nil || len(res.Outputs) != 1 {
		h.failf(call, "a batch with copies inside the layout's pools runs", "%d outputs, error %v", len(res.Outputs), err)
	}
	if err := h.w.Health(h.ctx); err != nil {
		h.failf("Health() after "+call, "Health is nil while the worker serves", "error %v", err)
	}
}

func checkWorkerStages(h *wh) {
	h.callInfo()
	if len(h.config().Model.Layers) < 2 {
		return
	}
	second := h.factory()
	if second == nil {
		h.failf("factory()", "a worker.Worker", "nil")
	}
	defer closeIfCloser(second)
	first, last := h, &wh{ctx: h.ctx, w: second, o: h.o, info: h.info}
	first.cfg, last.cfg = first.stageConfig(0), first.stageConfig(1)
	for _, s := range []*wh{first, last} {
		if _, err := s.w.Configure(s.ctx, s.cfg); err != nil {
			h.failf(fmt.Sprintf("Configure(stage %d: %s)", s.cfg.Stage, fmtWorkerConfig(s.cfg)), "each stage of a two-stage split configures", "error %v", err)
		}
		s.tpb = s.cfg.Layout.Pools[0].TokensPerBlock
		s.tables, s.next = map[kvcache.SeqID][][]kvcache.BlockID{}, make([]kvcache.BlockID, len(s.cfg.Layout.Pools))
		s.hist, s.last = map[kvcache.SeqID]int{}, map[kvcache.SeqID]wlast{}
	}
	// run builds one step's items on each stage (the same sequences,
	// positions and tokens; each stage with its own tables) and runs them
	// through both.
	run := func(items func(s *wh) []worker.Item) {
		in := items(first)
		first.step++
		call := fmt.Sprintf("Forward(stage 0 of 2, step %d: %s)", first.step, fmtItems(in))
		res, err := first.w.Forward(first.ctx, worker.Batch{Step: first.step, Items: in})
		if err != nil {
			h.failf(call, "a valid batch runs", "error %v", err)
		}
		if len(res.Hidden) == 0 || len(res.Outputs) != 0 {
			h.failf(call, "a stage before the last returns Hidden for the next stage and no Outputs", "%d bytes of Hidden, %d outputs", len(res.Hidden), len(res.Outputs))
		}
		first.apply(in)
		last.hidden = res.Hidden
		last.forward(items(last)...)
		for _, it := range in { // the first stage follows what the last one sampled
			first.hist[it.Seq], first.last[it.Seq] = last.hist[it.Seq], last.last[it.Seq]
		}
	}
	run(func(s *wh) []worker.Item {
		return []worker.Item{s.prefillItem(1, 20, true), s.prefillItem(2, 2*s.tpb, false)}
	})
	run(func(s *wh) []worker.Item { return []worker.Item{s.genItem(1), s.prefillItem(2, 3, true)} })
	for range 6 {
		run(func(s *wh) []worker.Item { return []worker.Item{s.genItem(1), s.genItem(2)} })
	}
}

func checkWorkerHealth(h *wh) {
	h.setup()
	if err := h.w.Health(h.ctx); err != nil {
		h.failf("Health() after Configure", "Health is nil while the worker serves", "error %v", err)
	}
	h.forward(h.prefillItem(1, 20, true))
	h.forward(h.genItem(1))
	if err := h.w.Health(h.ctx); err != nil {
		h.failf("Health() after Forward", "Health is nil while the worker serves", "error %v", err)
	}
}

// confPromptTop is what the PromptRows check asks per prompt position.
const confPromptTop = 2

func checkWorkerPromptRows(h *wh) {
	h.setup()
	a, b := kvcache.SeqID(1), kvcache.SeqID(2)
	p := prompt(2*h.tpb+5, 11)
	ask := func(it worker.Item, next int32) worker.Item {
		it.PromptLogprobs, it.PromptTopLogprobs, it.Next = true, confPromptTop, next
		return it
	}
	whole := ask(h.item(a, 0, p, 0, true), 0)
	res := h.forward(whole)
	if len(res.Prompt) == 0 {
		return // a device without real math returns none
	}
	rows := h.checkPromptRows("Forward(whole prompt)", []worker.Item{whole}, res)
	var chunked [][]float64
	for _, c := range [][2]int{{0, h.tpb}, {h.tpb, 2 * h.tpb}, {2 * h.tpb, len(p)}} {
		sample := c[1] == len(p)
		var next int32
		if !sample {
			next = p[c[1]]
		}
		it := ask(h.item(b, c[0], p[c[0]:c[1]], 0, sample), next)
		chunked = append(chunked, h.checkPromptRows(fmt.Sprintf("Forward(chunk [%d, %d))", c[0], c[1]), []worker.Item{it}, h.forward(it))...)
	}
	var flat []float64
	for _, r := range chunked {
		flat = append(flat, r...)
	}
	if len(rows) == 1 && !slices.Equal(flat, rows[0]) {
		h.failf("Forward(the prompt in chunks of "+fmt.Sprint(h.tpb)+")", "a prompt prefilled in chunks gets the rows one chunk gives, bit for bit",
			"chunked %v, whole %v", flat, rows[0])
	}
}

// checkPromptRows checks res.Prompt against the items that asked and
// returns each entry's log-probabilities.
func (h *wh) checkPromptRows(call string, items []worker.Item, res worker.Result) [][]float64 {
	var asked []worker.Item
	for _, it := range items {
		if it.PromptLogprobs {
			asked = append(asked, it)
		}
	}
	if len(res.Prompt) != len(asked) {
		h.failf(call, "Result.Prompt has one entry per item that asks for prompt rows, in item order", "%d entries for %d items", len(res.Prompt), len(asked))
		return nil
	}
	vocab := h.cfg.Model.Vocab
	out := make([][]float64, len(asked))
	for i, it := range asked {
		pr := res.Prompt[i]
		if pr.Seq != it.Seq || len(pr.Logprobs) != it.PromptRows() {
			h.failf(call, "entry i is item i's, with Item.PromptRows rows", "entry %d: seq %d with %d rows, want seq %d with %d", i, pr.Seq, len(pr.Logprobs), it.Seq, it.PromptRows())
			continue
		}
		if len(pr.TopLogprobs) != len(pr.Logprobs) {
			h.failf(call, "with PromptTopLogprobs K, one top list per row", "seq %d: %d lists for %d rows", it.Seq, len(pr.TopLogprobs), len(pr.Logprobs))
			continue
		}
		for j, v := range pr.Logprobs {
			l := pr.TopLogprobs[j]
			sorted := slices.IsSortedFunc(l, func(x, y worker.TokenLogprob) int { return cmp.Compare(y.Logprob, x.Logprob) })
			if !(v <= 0) || len(l) != min(it.PromptTopLogprobs, vocab) || !sorted || len(l) > 0 && v > l[0].Logprob {
				h.failf(call, "each row is a log-probability <= 0 of its target, at most the most likely's, with the min(K, vocab) most likely tokens, most likely first",
					"seq %d row %d (target %d): %v, top %v", it.Seq, j, it.PromptTarget(j), v, l)
			}
		}
		out[i] = slices.Clone(pr.Logprobs)
	}
	return out
}
