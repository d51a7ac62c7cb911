package pluginrpc

import (
	"context"
	"fmt"
	"reflect"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
	"github.com/kvx-dev/kvx/plugins/v1/spec"
	"github.com/kvx-dev/kvx/plugins/v1/worker"
)

// normalize returns a deep copy of v with every empty slice made nil, the
// form in which values come back from the wire.
func normalize[T any](v T) T {
	out := reflect.New(reflect.TypeOf(&v).Elem()).Elem()
	normalizeInto(out, reflect.ValueOf(&v).Elem())
	r, _ := out.Interface().(T) // a nil interface stays nil
	return r
}

func normalizeInto(dst, src reflect.Value) {
	switch src.Kind() {
	case reflect.Slice:
		if src.Len() == 0 {
			return // dst stays nil
		}
		s := reflect.MakeSlice(src.Type(), src.Len(), src.Len())
		for i := range src.Len() {
			normalizeInto(s.Index(i), src.Index(i))
		}
		dst.Set(s)
	case reflect.Struct:
		for i := range src.NumField() {
			normalizeInto(dst.Field(i), src.Field(i))
		}
	case reflect.Pointer:
		if !src.IsNil() {
			v := reflect.New(src.Elem().Type())
			normalizeInto(v.Elem(), src.Elem())
			dst.Set(v)
		}
	case reflect.Interface:
		if !src.IsNil() {
			v := reflect.New(src.Elem().Type()).Elem()
			normalizeInto(v, src.Elem())
			dst.Set(v)
		}
	default:
		dst.Set(src)
	}
}

// unsetFields lists the fields of v (by path) that hold a zero value; slices
// must be non-empty and are checked element by element. A "full" test value
// passes only if a round trip exercises every field of its type, so a field
// added to the contract without a converter update fails the tests.
func unsetFields(v any) []string {
	var out []string
	var walk func(path string, v reflect.Value)
	walk = func(path string, v reflect.Value) {
		switch v.Kind() {
		case reflect.Struct:
			for i := range v.NumField() {
				walk(path+"."+v.Type().Field(i).Name, v.Field(i))
			}
		case reflect.Slice:
			if v.Len() == 0 {
				out = append(out, path)
			}
			if k := v.Type().Elem().Kind(); k == reflect.Struct || k == reflect.Slice {
				for i := range v.Len() {
					walk(fmt.Sprintf("%s[%d]", path, i), v.Index(i))
				}
			}
		default:
			if v.IsZero() {
				out = append(out, path)
			}
		}
	}
	walk(reflect.TypeOf(v).Name(), reflect.ValueOf(v))
	return out
}

// Full values: every field set (checked by TestFullValuesAreFull).

var fullLayers = []spec.Layer{
	{Index: 3, Mixer: spec.MixerDSA, FFN: spec.FFNMoE, Window: 4096, MTP: true,
		Buffers: []spec.Buffer{{Role: spec.RoleLatent, BytesPerToken: 1152, BytesPerSeq: 1}}},
	{Index: 4, Mixer: spec.MixerMamba, FFN: spec.FFNDense, Window: 1, MTP: true,
		Buffers: []spec.Buffer{{Role: spec.RoleSSMState, BytesPerToken: 2, BytesPerSeq: 1 << 20}}},
}

var fullModel = spec.Model{
	Name: "toy", Arch: "DeepseekV32ForCausalLM", Hidden: 64, Vocab: 1000, MaxPosition: 4096,
	Heads: 4, KVHeads: 2, HeadDim: 16,
	QLoraRank: 8, KVLoraRank: 16, QKNopeHeadDim: 8, QKRopeHeadDim: 4, VHeadDim: 8,
	IndexHeads: 2, IndexHeadDim: 8, IndexTopK: 32,
	MambaHeads: 2, MambaHeadDim: 8, SSMStateSize: 16, NGroups: 1, ConvKernel: 4,
	Intermediate: 128, MoEIntermediate: 32, Experts: 8, ExpertsPerToken: 2, SharedExperts: 1,
	SharedIntermediate: 64, MoELatent: 16, NumNextN: 1, Checkpoint: "/ckpt/tiny",
	Layers: fullLayers,
}

var fullHardware = spec.Hardware{
	Name: "H200", MemoryBytes: 141 << 30, MemBandwidth: 4.8e12, FLOPSBF16: 989e12, FLOPSFP8: 1979e12,
	FLOPSFP4: 1, NVLinkBW: 450e9, PCIeBW: 64e9, Uncalibrated: true, LaunchLatency: 4e-6,
	Calibration: &fullSimCalibration, CopyLatency: 5e-6,
}

var fullSimCalibration = spec.SimCalibration{
	Name: "embedded:h200.json", LaunchSeconds: 3e-6, StepSeconds: 1e-4,
	Classes: []spec.KernelClassScale{{Class: "gemm", ComputeScale: 40, MemoryScale: 2.5}, {Class: "mixer.gqa", ComputeScale: 7, MemoryScale: 1.5}},
}

var fullCopies = []kvcache.Copy{{SrcPool: 1, SrcBlock: 7, DstPool: 2, DstBlock: 9}, {SrcPool: 3, SrcBlock: -1, DstPool: 4, DstBlock: 1 << 30}}

var fullTables = []kvcache.TableDelta{{Pool: 1, From: 2, Blocks: []kvcache.BlockID{5, 6, 7}}, {Pool: 2, From: 9, Blocks: []kvcache.BlockID{-3}}}

var fullLayout = kvcache.Layout{
	Pools: []kvcache.Pool{
		{ID: 1, Name: "full", Tier: kvcache.TierDevice, Window: 128, Layers: []int{0, 2}, TokensPerBlock: 64, BlockBytes: 1 << 20, Blocks: 900},
		{ID: 2, Name: "ssm", Tier: kvcache.TierHost, Window: 1, Layers: []int{1}, TokensPerBlock: 1, BlockBytes: 1 << 22, Blocks: 16},
	},
	MaxSeqTokens: 1 << 20,
	MaxSequences: 64,
	Warnings:     []string{"avg_seq_len unset", "ünïcode ✓"},
}

var fullInfo = kvcache.Info{
	Name: "cachemgr_v2", Version: "2.1.0", Protocols: []int{1, 2},
	Capabilities: kvcache.Capabilities{Mixers: []spec.Mixer{spec.MixerGQA, spec.MixerMamba},
		PrefixReuse: true, HostTier: true, SSMState: true, SSMReuse: true, CacheSalt: true, KVEvents: true,
		Explain: true, Retention: true, EvictionPolicies: []string{kvcache.EvictionLRU, kvcache.EvictionLFU}, Fork: true},
}

var fullConfig = kvcache.Config{
	Stage: 1, Stages: 2, Layers: fullLayers, TokensPerBlock: 64, DeviceBytes: 80 << 30, HostBytes: 1 << 40,
	MaxBatchSize: 256, MaxNumTokens: 8192, MaxSeqLen: 172000, MaxDraftTokens: 1, EnableBlockReuse: true,
	AvgSeqLen: 150000, PoolRatio: []float64{0.75, 0.25},
	Snapshots: kvcache.SnapshotConfig{Interval: 1024, OffsetsFromEnd: []int{1, 64}},
	KVEvents:  true,

	EvictionPolicy: kvcache.EvictionLFU,
}

var fullLookupItems = []kvcache.LookupItem{{Seq: 1, Prompt: []int32{1, 2, 3}, CacheSalt: "tenant-a", Now: 7}, {Seq: 1 << 63, Prompt: []int32{-1}, CacheSalt: "b", Now: 1 << 62}}

var fullExplanations = []kvcache.Explanation{
	{Tokens: 512, HostTokens: 256, Miss: kvcache.MissEvicted, EvictedTier: kvcache.TierHost, EvictedBy: kvcache.EvictionLRU, EvictedAt: 1 << 40},
	{Tokens: 1 << 40, HostTokens: 1, Miss: kvcache.MissEvicted, EvictedTier: kvcache.TierDevice, EvictedBy: "priority", EvictedAt: 1},
}

var fullForkItems = []kvcache.ForkItem{{Parent: 42, Child: 1 << 40}, {Parent: 1, Child: 2}}

var fullReserveItems = []kvcache.ReserveItem{
	{Seq: 42, Tokens: 8192, Draft: 1, Hold: 180000, New: true, Prompt: []int32{9, 8, 7}, Reuse: 512, CacheSalt: "tenant-a", Priority: 90, PriorityDuration: 30e9, Now: 5e9},
	{Seq: 43, Tokens: 1, Draft: 3, Hold: 1, New: true, Prompt: []int32{1}, Reuse: 1, CacheSalt: "\x00", Priority: 1, PriorityDuration: 1, Now: 1},
}

var fullEvents = []kvcache.Event{
	{Kind: kvcache.BlockStored, Hashes: []uint64{1, 1<<64 - 1}, Parent: 7, HasParent: true, Tokens: []int32{1, 2, 3, 4}, BlockSize: 2, Tier: kvcache.TierDevice},
	{Kind: kvcache.BlockRemoved, Hashes: []uint64{1}, Parent: 1, HasParent: true, Tokens: []int32{5}, BlockSize: 1, Tier: kvcache.TierHost},
}

var fullSnapshots = []kvcache.SnapshotSlot{{Pos: 256, Pool: 3, Block: 9}, {Pos: 512, Pool: 3, Block: 11}}

var fullGrants = []kvcache.Grant{
	{Seq: 42, OK: true, Reason: "granted", Tables: fullTables, Copies: fullCopies, Snapshots: fullSnapshots, HostReused: 256},
	{Seq: 43, OK: true, Reason: "device pool full: need 3 blocks, 1 free", Tables: fullTables[1:], Copies: fullCopies[:1], Snapshots: fullSnapshots[1:], HostReused: 1},
}

var fullStats = kvcache.Stats{
	Pools:     []kvcache.PoolStats{{Pool: 1, Total: 10, Free: 2, Cached: 3, InUse: 5}},
	Sequences: 7, LookupTokens: 1 << 40, ReusedTokens: 12, Evictions: 13,
	Snapshots:     kvcache.SnapshotStats{Taken: 1, Skipped: 2, Evicted: 3, ReusedTokens: 4},
	SuspendedSeqs: 2, ReserveDenials: 9,
}

var fullSnapshot = kvcache.Snapshot{
	Pools: fullStats.Pools,
	Seqs: []kvcache.SeqState{{Seq: 5, History: 100, Capacity: 128, Reserved: 2, Draft: 1, Hold: 4096, Suspended: true,
		Blocks: []int{2, 1}, Tables: [][]kvcache.BlockID{{1, 2}, {3}}}},
	RefCounts:     [][]int32{{0, 1, 2}, {1}},
	Violations:    []string{"seq 5: history 100 > capacity 96"},
	TablesChecked: true,
}

var fullWorkerInfo = worker.Info{
	Name: "dsa", Version: "0.1.0", Protocols: []int{1}, Device: "cuda",
	Mixers: []spec.Mixer{spec.MixerDSA, spec.MixerMLA}, MemoryBytes: 141 << 30, FreeBytes: 100 << 30,
}

var fullWorkerConfig = worker.Config{
	Stage: 1, Stages: 2, Model: fullModel, First: 30, Last: 62, Backend: "dsa", Device: "sim",
	Hardware: fullHardware, TensorParallel: 8, WeightsDtype: "fp8", KVDtype: "fp8", Dtype: "bfloat16", Layout: fullLayout,
	Seed: 1 << 60, DraftTokens: 1, DraftAcceptance: 0.7,
}

var fullBatch = worker.Batch{
	Step: 99,
	Items: []worker.Item{
		{Seq: 42, Pos: 100, Tokens: []int32{5, 6}, Draft: 1, Sample: true, Tables: fullTables, Snapshots: fullSnapshots[:1], TopLogprobs: 5, Logprobs: true, Logits: true,
			Sampling: &worker.Sampling{Temperature: 0.8, TopP: 0.95, TopK: 50, MinP: 0.1, Seed: 77, PresencePenalty: 0.5, FrequencyPenalty: 0.25,
				RepetitionPenalty: 1.1, MinTokens: 2, StopIDs: []int32{2}, Prompt: 90, Context: []int32{1, 2, 3}},
			PromptLogprobs: true, PromptTopLogprobs: 3, Next: 9},
		{Seq: 43, Pos: 1, Tokens: []int32{7}, Draft: 2, Sample: true, Tables: fullTables[:1], Snapshots: fullSnapshots[1:], TopLogprobs: 20, Logprobs: true, Logits: true,
			Sampling: &worker.Sampling{Temperature: 1, Seed: 1}, PromptLogprobs: true, PromptTopLogprobs: 1, Next: 4},
	},
	Hidden:   []byte{1, 2, 3, 0, 255},
	Released: []kvcache.SeqID{7, 8},
	Copies:   fullCopies,
}

var fullResult = worker.Result{
	Hidden: []byte{9, 8},
	Outputs: []worker.Output{{Seq: 42, Tokens: []int32{6, 11}, Drafts: []int32{12}, Logits: []float32{0.5, -1, 3e38},
		TopLogprobs: [][]worker.TokenLogprob{{{ID: 6, Logprob: -0.25}, {ID: 9, Logprob: -1.5}}, {{ID: 11, Logprob: -1e-300}, {ID: 1, Logprob: -700}}}, Logprobs: []float64{-0.25, -2}}},
	Prompt: []worker.PromptLogprobs{{Seq: 42, Logprobs: []float64{-0.5, -1e-300},
		TopLogprobs: [][]worker.TokenLogprob{{{ID: 6, Logprob: -0.5}}, {{ID: 1, Logprob: -1e-300}, {ID: 2, Logprob: -3}}}}},
	Nanos:    123456,
	Modelled: true,
}

// fakeManager is a scripted kvcache.Manager: each method records its
// arguments and returns the canned answer and err. With block set, every
// method waits for its ctx to end and returns ctx.Err().
type fakeManager struct {
	mu    sync.Mutex
	calls []call

	info       kvcache.Info
	layout     kvcache.Layout
	lookup     []int
	explain    []kvcache.Explanation
	grants     []kvcache.Grant
	commit     kvcache.CommitResult
	moveOK     []bool
	moveCopies []kvcache.Copy
	stats      kvcache.Stats
	snap       kvcache.Snapshot
	events     []kvcache.Event
	err        error

	block       bool
	inflight    atomic.Int32
	maxInflight atomic.Int32
}

type call struct {
	method   string
	arg      any
	deadline bool
}

var _ kvcache.Manager = (*fakeManager)(nil)

func (f *fakeManager) enter(ctx context.Context, method string, arg any) error {
	n := f.inflight.Add(1)
	for {
		m := f.maxInflight.Load()
		if n <= m || f.maxInflight.CompareAndSwap(m, n) {
			break
		}
	}
	defer f.inflight.Add(-1)
	_, dl := ctx.Deadline()
	f.mu.Lock()
	f.calls = append(f.calls, call{method, arg, dl})
	f.mu.Unlock()
	if f.block {
		<-ctx.Done()
		return ctx.Err()
	}
	return f.err
}

func (f *fakeManager) last() call {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.calls) == 0 {
		return call{}
	}
	return f.calls[len(f.calls)-1]
}

func (f *fakeManager) Info(ctx context.Context) (kvcache.Info, error) {
	return f.info, f.enter(ctx, "Info", nil)
}
func (f *fakeManager) Configure(ctx context.Context, cfg kvcache.Config) (kvcache.Layout, error) {
	return f.layout, f.enter(ctx, "Configure", cfg)
}
func (f *fakeManager) Lookup(ctx context.Context, items []kvcache.LookupItem) ([]int, error) {
	return f.lookup, f.enter(ctx, "Lookup", items)
}
func (f *fakeManager) Explain(ctx context.Context, items []kvcache.LookupItem) ([]kvcache.Explanation, error) {
	return f.explain, f.enter(ctx, "Explain", items)
}
func (f *fakeManager) Reserve(ctx context.Context, items []kvcache.ReserveItem) ([]kvcache.Grant, error) {
	return f.grants, f.enter(ctx, "Reserve", items)
}
func (f *fakeManager) Fork(ctx context.Context, items []kvcache.ForkItem) ([]kvcache.Grant, error) {
	return f.grants, f.enter(ctx, "Fork", items)
}
func (f *fakeManager) Unreserve(ctx context.Context, seqs []kvcache.SeqID) error {
	return f.enter(ctx, "Unreserve", seqs)
}
func (f *fakeManager) Commit(ctx context.Context, items []kvcache.CommitItem) (kvcache.CommitResult, error) {
	f.mu.Lock() // a test may change it between calls
	res := f.commit
	f.mu.Unlock()
	return res, f.enter(ctx, "Commit", items)
}
func (f *fakeManager) Suspend(ctx context.Context, seqs []kvcache.SeqID) ([]bool, []kvcache.Copy, error) {
	return f.moveOK, f.moveCopies, f.enter(ctx, "Suspend", seqs)
}
func (f *fakeManager) Resume(ctx context.Context, seqs []kvcache.SeqID) ([]bool, []kvcache.Copy, error) {
	return f.moveOK, f.moveCopies, f.enter(ctx, "Resume", seqs)
}
func (f *fakeManager) Release(ctx context.Context, seqs []kvcache.SeqID) error {
	return f.enter(ctx, "Release", seqs)
}
func (f *fakeManager) Stats(ctx context.Context) (kvcache.Stats, error) {
	return f.stats, f.enter(ctx, "Stats", nil)
}
func (f *fakeManager) Inspect(ctx context.Context, opts kvcache.InspectOptions) (kvcache.Snapshot, error) {
	return f.snap, f.enter(ctx, "Inspect", opts)
}
func (f *fakeManager) Events(ctx context.Context) ([]kvcache.Event, error) {
	return f.events, f.enter(ctx, "Events", nil)
}

// fakeWorker is the worker counterpart of fakeManager.
type fakeWorker struct {
	fakeManager // for enter/last and the call log
	winfo       worker.Info
	setup       worker.Setup
	result      worker.Result
}

var _ worker.Worker = (*fakeWorker)(nil)

func (f *fakeWorker) Info(ctx context.Context) (worker.Info, error) {
	return f.winfo, f.enter(ctx, "Info", nil)
}
func (f *fakeWorker) Configure(ctx context.Context, cfg worker.Config) (worker.Setup, error) {
	return f.setup, f.enter(ctx, "Configure", cfg)
}
func (f *fakeWorker) Forward(ctx context.Context, b worker.Batch) (worker.Result, error) {
	return f.result, f.enter(ctx, "Forward", b)
}
func (f *fakeWorker) CopyBlocks(ctx context.Context, copies []kvcache.Copy) error {
	return f.enter(ctx, "CopyBlocks", copies)
}
func (f *fakeWorker) Health(ctx context.Context) error {
	return f.enter(ctx, "Health", nil)
}

func deepEqual(a, b any) bool { return reflect.DeepEqual(a, b) }

func TestFullValuesAreFull(t *testing.T) {
	for _, v := range []any{
		fullInfo, fullConfig, fullLayout, fullLookupItems[0], fullReserveItems[0], fullGrants[0], fullStats, fullEvents[0],
		fullSnapshot, fullWorkerInfo, fullWorkerConfig, fullBatch, fullResult, fullHardware, fullModel,
		kvcache.CommitItem{Seq: 1, Accepted: 2}, kvcache.InspectOptions{Tables: true, CheckTables: true},
		worker.Setup{DeviceBytes: 1, Notes: []string{"x"}},
		kvcache.Error{Kind: kvcache.KindCorrupt, Msg: "m", Seqs: []kvcache.SeqID{1}},
	} {
		if unset := unsetFields(v); len(unset) > 0 {
			t.Errorf("%T test value leaves fields unset: %v", v, unset)
		}
	}
}
