package engine_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	cachemgrv1 "github.com/kvx-dev/kvx/cachemgr_v1"
	cachemgrv2 "github.com/kvx-dev/kvx/cachemgr_v2"
	"github.com/kvx-dev/kvx/cmd/builtin"
	"github.com/kvx-dev/kvx/core/config"
	"github.com/kvx-dev/kvx/core/engine"
	"github.com/kvx-dev/kvx/core/hw"
	"github.com/kvx-dev/kvx/core/report"
	"github.com/kvx-dev/kvx/core/sched"
	"github.com/kvx-dev/kvx/core/setup"
	"github.com/kvx-dev/kvx/core/workload"
	"github.com/kvx-dev/kvx/device"
	"github.com/kvx-dev/kvx/dsa"
	"github.com/kvx-dev/kvx/plugins/model"
	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
	"github.com/kvx-dev/kvx/plugins/v1/pluginrpc"
	"github.com/kvx-dev/kvx/plugins/v1/worker"
)

// inproc launches fresh in-process managers and workers.
type inproc struct {
	manager func() kvcache.Manager
	worker  func() worker.Worker
}

func (l inproc) Manager(context.Context, int) (kvcache.Manager, error) { return l.manager(), nil }
func (l inproc) Worker(context.Context, int) (worker.Worker, error)    { return l.worker(), nil }

// testSpec is DeepSeek-V3.2 with MTP on PP stages with a small cache budget.
type testSpec struct {
	pp          int
	draft       int
	reuse       bool
	policy      sched.Policy
	cacheTokens int // tokens of cache per stage
	reqs        workload.Workload
	maxSeqLen   int
}

func buildSpec(t testing.TB, ts testSpec) engine.Spec {
	t.Helper()
	m, err := model.Load("deepseek-v3.2")
	if err != nil {
		t.Fatal(err)
	}
	if ts.draft == 0 {
		m.Layers = m.Layers[:len(m.Layers)-m.NumNextN]
		m.NumNextN = 0
	}
	if err := model.FillBuffers(&m, model.Dtypes{KV: "fp8"}, 8); err != nil {
		t.Fatal(err)
	}
	h, err := hw.Lookup("h200")
	if err != nil {
		t.Fatal(err)
	}
	stages, err := model.SplitStages(m, ts.pp)
	if err != nil {
		t.Fatal(err)
	}
	const tpb, maxTokens, batch = 32, 512, 8
	s := engine.Spec{Variant: "test", Hardware: h, Hidden: m.Hidden, CheckEvery: 1, DeepEvery: 8, Workload: ts.reqs}
	for i, st := range stages {
		var perTok int64
		for _, l := range m.Layers[st[0]:st[1]] {
			for _, b := range l.Buffers {
				perTok += b.BytesPerToken
			}
		}
		s.Managers = append(s.Managers, kvcache.Config{
			Stage: i, Stages: ts.pp, Layers: m.Layers[st[0]:st[1]], TokensPerBlock: tpb,
			DeviceBytes: perTok * int64(ts.cacheTokens), MaxBatchSize: batch, MaxNumTokens: maxTokens,
			MaxSeqLen: ts.maxSeqLen, MaxDraftTokens: ts.draft, EnableBlockReuse: ts.reuse,
		})
		s.Workers = append(s.Workers, worker.Config{
			Stage: i, Stages: ts.pp, Model: m, First: st[0], Last: st[1], Backend: "dsa", Device: "sim",
			Hardware: h, TensorParallel: 8, WeightsDtype: "fp8", KVDtype: "fp8", Seed: 7,
			DraftTokens: ts.draft, DraftAcceptance: 0.6,
		})
	}
	s.Sched = sched.Config{
		MaxBatchSize: batch, MaxResident: batch * ts.pp, MaxNumTokens: maxTokens, MaxSeqLen: ts.maxSeqLen,
		ChunkedPrefill: true, TokensPerBlock: tpb, Draft: ts.draft, Reuse: ts.reuse, Policy: ts.policy,
	}
	return s
}

func genWorkload(t *testing.T, n int, shared int) workload.Workload {
	t.Helper()
	w, err := workload.GenerateWorkload(workload.GenOptions{
		Requests: n, PromptMin: 300, PromptMax: 900, OutputMin: 5, OutputMax: 60,
		SharedPrefix: shared, SharedGroups: 2, Seed: 3, Rate: 50,
	})
	if err != nil {
		t.Fatal(err)
	}
	return w
}

func v1Launcher() engine.Launcher {
	return inproc{
		manager: func() kvcache.Manager { return cachemgrv1.New() },
		worker:  func() worker.Worker { return device.NewWorker(dsa.Backend) },
	}
}

func runSpec(t testing.TB, s engine.Spec, l engine.Launcher) report.Report {
	t.Helper()
	rep, err := engine.Run(context.Background(), s, l)
	if err != nil {
		t.Fatalf("Run: %v\nviolations: %v", err, rep.Invariants.First)
	}
	return rep
}

// TestRunCompletesEveryRequest runs the whole path — scheduler, atomic
// admission over stages, commits with MTP drafts, invariant checks — and
// checks the accounting of the report.
func TestRunCompletesEveryRequest(t *testing.T) {
	for _, tc := range []struct {
		name   string
		pp     int
		draft  int
		reuse  bool
		policy sched.Policy
		cache  int
	}{
		{"pp1", 1, 0, false, sched.GuaranteedNoEvict, 1 << 16},
		{"pp2-mtp-reuse", 2, 1, true, sched.GuaranteedNoEvict, 1 << 16},
		{"pp2-mtp-tight-maxutil", 2, 1, true, sched.MaxUtilization, 2600},
		{"pp3-mtp2-tight-gne", 3, 2, false, sched.GuaranteedNoEvict, 2600},
	} {
		t.Run(tc.name, func(t *testing.T) {
			wl := genWorkload(t, 40, 256)
			s := buildSpec(t, testSpec{pp: tc.pp, draft: tc.draft, reuse: tc.reuse, policy: tc.policy, cacheTokens: tc.cache, reqs: wl, maxSeqLen: 2048})
			rep := runSpec(t, s, v1Launcher())
			if rep.Requests.Completed != len(wl.Requests) || rep.Requests.Failed != 0 || rep.Requests.Rejected != 0 {
				t.Fatalf("requests = %+v, want all %d completed", rep.Requests, len(wl.Requests))
			}
			var want int64
			for _, r := range wl.Requests {
				want += int64(r.OutputLen)
			}
			if rep.Tokens.Generated != want {
				t.Errorf("generated %d tokens, want %d", rep.Tokens.Generated, want)
			}
			if rep.Invariants.Violations != 0 || rep.Invariants.CheckedSteps == 0 || rep.Invariants.DeepChecks == 0 {
				t.Errorf("invariants = %+v, want checks and no violation", rep.Invariants)
			}
			if tc.reuse && rep.Tokens.PrefixReused == 0 {
				t.Errorf("prefix_reused = 0 with block reuse on and shared prefixes")
			}
			if !tc.reuse && rep.Tokens.PrefixReused != 0 {
				t.Errorf("prefix_reused = %d with block reuse off", rep.Tokens.PrefixReused)
			}
			if tc.draft > 0 && (rep.Tokens.DraftProposed == 0 || rep.Tokens.DraftAccepted == 0) {
				t.Errorf("drafts proposed %d accepted %d, want both > 0", rep.Tokens.DraftProposed, rep.Tokens.DraftAccepted)
			}
			if rep.Latency.TTFTP50 <= 0 || rep.Throughput.OutputTokensPerS <= 0 {
				t.Errorf("latency %+v throughput %+v, want > 0", rep.Latency, rep.Throughput)
			}
			if tc.name == "pp2-mtp-tight-maxutil" && rep.Requests.Preemptions == 0 {
				t.Errorf("no preemption in a cache of %d tokens with 16 resident requests", tc.cache)
			}
		})
	}
}

// TestOutputsIndependentOfManagerState: the same workload gives the same
// generated tokens whatever the cache pressure, reuse and pipeline split,
// because the sim worker samples from (seed, request, position).
func TestOutputsIndependentOfManagerState(t *testing.T) {
	wl := genWorkload(t, 30, 256)
	var digests []string
	for _, ts := range []testSpec{
		{pp: 1, draft: 1, reuse: false, policy: sched.GuaranteedNoEvict, cacheTokens: 1 << 16},
		{pp: 2, draft: 1, reuse: true, policy: sched.MaxUtilization, cacheTokens: 2600},
		{pp: 4, draft: 1, reuse: true, policy: sched.GuaranteedNoEvict, cacheTokens: 4096},
	} {
		ts.reqs, ts.maxSeqLen = wl, 2048
		rep := runSpec(t, buildSpec(t, ts), v1Launcher())
		digests = append(digests, rep.Outputs.Digest)
	}
	for i := 1; i < len(digests); i++ {
		if digests[i] != digests[0] {
			t.Fatalf("outputs digest %d = %s, want %s (variant 0)", i, digests[i], digests[0])
		}
	}
}

// TestRejectsWhatCannotFit: a request longer than max_seq_len is rejected
// with its numbers; the rest complete.
func TestRejectsWhatCannotFit(t *testing.T) {
	wl := genWorkload(t, 6, 0)
	wl.Requests[2].OutputLen = 5000
	s := buildSpec(t, testSpec{pp: 2, draft: 1, policy: sched.GuaranteedNoEvict, cacheTokens: 1 << 15, reqs: wl, maxSeqLen: 2048})
	rep := runSpec(t, s, v1Launcher())
	if rep.Requests.Rejected != 1 || rep.Requests.Completed != 5 {
		t.Fatalf("requests = %+v, want 1 rejected and 5 completed", rep.Requests)
	}
	if rj := rep.Requests.Rejections[0]; rj.ID != wl.Requests[2].ID || rj.Reason == "" {
		t.Errorf("rejection = %+v, want request %d with a reason", rj, wl.Requests[2].ID)
	}
}

// lying wraps a manager and corrupts its Inspect answer: the engine must
// notice a stage whose history disagrees with what was committed.
type lying struct{ kvcache.Manager }

func (l lying) Inspect(ctx context.Context, o kvcache.InspectOptions) (kvcache.Snapshot, error) {
	s, err := l.Manager.Inspect(ctx, o)
	if len(s.Seqs) > 0 {
		s.Seqs[0].History++
		s.Seqs[0].Capacity++
	}
	return s, err
}

func TestInvariantViolationStopsTheRun(t *testing.T) {
	wl := genWorkload(t, 4, 0)
	s := buildSpec(t, testSpec{pp: 2, draft: 1, policy: sched.GuaranteedNoEvict, cacheTokens: 1 << 15, reqs: wl, maxSeqLen: 2048})
	l := inproc{
		manager: func() kvcache.Manager { return lying{cachemgrv1.New()} },
		worker:  func() worker.Worker { return device.NewWorker(dsa.Backend) },
	}
	rep, err := engine.Run(context.Background(), s, l)
	if !errors.Is(err, engine.ErrInvariant) {
		t.Fatalf("Run error = %v, want ErrInvariant", err)
	}
	if rep.Invariants.Violations == 0 || len(rep.Invariants.First) == 0 {
		t.Errorf("report invariants = %+v, want the violation recorded", rep.Invariants)
	}
}

// TestSuspendToHostTier: under MAX_UTILIZATION with a host tier (v2), a
// preemption suspends the victim instead of recomputing it; outputs equal a
// run without the tier and every invariant holds with sequences on the host.
func TestSuspendToHostTier(t *testing.T) {
	wl := genWorkload(t, 40, 0)
	ts := testSpec{pp: 2, draft: 1, policy: sched.MaxUtilization, cacheTokens: 2700, reqs: wl, maxSeqLen: 2048}
	v2 := inproc{
		manager: func() kvcache.Manager { return cachemgrv2.New() },
		worker:  func() worker.Worker { return device.NewWorker(dsa.Backend) },
	}
	plain := runSpec(t, buildSpec(t, ts), v2)
	s := buildSpec(t, ts)
	for i := range s.Managers {
		s.Managers[i].HostBytes = 4 * s.Managers[i].DeviceBytes
	}
	host := runSpec(t, s, v2)
	t.Logf("without a host tier: %d preemptions, %d recomputed; with: %d preemptions, %d suspended, %d recomputed", plain.Requests.Preemptions, plain.Tokens.Recomputed, host.Requests.Preemptions, host.Requests.Suspensions, host.Tokens.Recomputed)
	if host.Requests.Suspensions == 0 || host.Requests.Completed != len(wl.Requests) {
		t.Fatalf("with a host tier: requests %+v; want suspensions and every request completed", host.Requests)
	}
	if host.Tokens.Recomputed >= plain.Tokens.Recomputed {
		t.Errorf("recomputed %d tokens with a host tier, %d without; want fewer", host.Tokens.Recomputed, plain.Tokens.Recomputed)
	}
	if host.Outputs.Digest != plain.Outputs.Digest {
		t.Errorf("outputs digest %s with a host tier, %s without", host.Outputs.Digest, plain.Outputs.Digest)
	}
	if host.Invariants.Violations != 0 || plain.Requests.Suspensions != 0 {
		t.Errorf("violations %d; suspensions without a host tier %d", host.Invariants.Violations, plain.Requests.Suspensions)
	}
}

// unsuspendable hides the kvcache.Suspender of the manager it wraps; its
// Info still says HostTier and its layout has host pools.
type unsuspendable struct{ kvcache.Manager }

// TestManagerWithoutSuspenderRecomputes: a manager that is no
// kvcache.Suspender is never asked to suspend, even with a host tier in its
// layout and HostTier in its Info: a preempted request is released and
// recomputed, as without a host tier. The same holds over gRPC, where the
// client always has Suspend: the run matches the in-process one exactly,
// and a Suspender served over gRPC suspends as it does in-process.
func TestManagerWithoutSuspenderRecomputes(t *testing.T) {
	wl := genWorkload(t, 40, 0)
	ts := testSpec{pp: 2, draft: 1, policy: sched.MaxUtilization, cacheTokens: 2700, reqs: wl, maxSeqLen: 2048}
	run := func(wrap, plugin bool) report.Report {
		s := buildSpec(t, ts)
		for i := range s.Managers {
			s.Managers[i].HostBytes = 4 * s.Managers[i].DeviceBytes
		}
		return runSpec(t, s, inproc{
			manager: func() kvcache.Manager {
				var m kvcache.Manager = cachemgrv2.New()
				if wrap {
					m = unsuspendable{m}
				}
				if plugin {
					m = pluginrpc.TestManagerPair(t, m)
				}
				return m
			},
			worker: func() worker.Worker { return device.NewWorker(dsa.Backend) },
		})
	}
	plain := runSpec(t, buildSpec(t, ts), inproc{
		manager: func() kvcache.Manager { return cachemgrv2.New() },
		worker:  func() worker.Worker { return device.NewWorker(dsa.Backend) },
	})
	for _, plugin := range []bool{false, true} {
		none, host := run(true, plugin), run(false, plugin)
		if none.Requests.Suspensions != 0 || none.Requests.Preemptions != plain.Requests.Preemptions ||
			none.Tokens.Recomputed != plain.Tokens.Recomputed || none.Outputs.Digest != plain.Outputs.Digest {
			t.Errorf("plugin %v: without a Suspender: %d suspensions, %d preemptions, %d recomputed, digest %s; "+
				"want none suspended and the run without a host tier (%d preemptions, %d recomputed, digest %s)",
				plugin, none.Requests.Suspensions, none.Requests.Preemptions, none.Tokens.Recomputed, none.Outputs.Digest,
				plain.Requests.Preemptions, plain.Tokens.Recomputed, plain.Outputs.Digest)
		}
		if host.Requests.Suspensions == 0 || host.Outputs.Digest != plain.Outputs.Digest {
			t.Errorf("plugin %v: a Suspender with a host tier: %d suspensions, digest %s; want suspensions, digest %s",
				plugin, host.Requests.Suspensions, host.Outputs.Digest, plain.Outputs.Digest)
		}
	}
}

// TestSuspendWithReuseUnderPressure: with block reuse on, a suspended
// sequence keeps its registered prompt blocks pinned on the device. In a
// cache that holds two requests this once rejected a request "in an empty
// cache" and then suspended and resumed the others millions of times; the
// scheduler now drops suspended requests to recompute before it rejects
// anyone or lets the last running request fail to grow.
func TestSuspendWithReuseUnderPressure(t *testing.T) {
	sets := []string{
		"model=llama-3.1-8b", "attention_backend=gqa", "device=sim", "isolation=inprocess", "cache_manager=v2",
		"max_batch_size=4", "max_num_tokens=64", "max_seq_len=320", "enable_chunked_prefill=true",
		"kv_cache_config.enable_block_reuse=true", "kv_cache_config.tokens_per_block=16", "kv_cache_config.max_tokens=640",
		"kv_cache_config.host_cache_size=20000000000", "scheduler_config.capacity_scheduler_policy=MAX_UTILIZATION",
		"workload.requests=16", "workload.concurrency=6", "workload.prompt_tokens={min: 120, max: 260}",
		"workload.output_tokens={min: 16, max: 48}", "workload.shared_prefix_tokens=96", "workload.shared_prefix_groups=3", "workload.seed=7",
	}
	cfg, _, err := config.Load(builtin.Registry(), nil, nil, sets)
	if err != nil {
		t.Fatal(err)
	}
	res, err := setup.Resolve(cfg, "pressure", true)
	if err != nil {
		t.Fatal(err)
	}
	l := setup.NewLauncher(cfg, builtin.Registry(), nil)
	defer l.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	rep, err := engine.Run(ctx, res.Spec, l)
	if err != nil {
		t.Fatalf("run: %v (requests %+v)", err, rep.Requests)
	}
	t.Logf("preemptions %d, suspended %d, recomputed %d", rep.Requests.Preemptions, rep.Requests.Suspensions, rep.Tokens.Recomputed)
	if rep.Requests.Completed != rep.Requests.Total || rep.Requests.Rejected != 0 || rep.Invariants.Violations != 0 {
		t.Fatalf("requests %+v, violations %d: want every request completed", rep.Requests, rep.Invariants.Violations)
	}
	if rep.Requests.Suspensions == 0 || rep.Requests.Preemptions > 20*rep.Requests.Total {
		t.Errorf("%d preemptions, %d suspended for %d requests: want some suspensions, and no circles", rep.Requests.Preemptions, rep.Requests.Suspensions, rep.Requests.Total)
	}
}

// leakyRefs wraps a manager and reports one reference too many on block 0
// of its first pool in deep snapshots, as a manager that leaked it would.
type leakyRefs struct{ kvcache.Manager }

func (l leakyRefs) Inspect(ctx context.Context, o kvcache.InspectOptions) (kvcache.Snapshot, error) {
	s, err := l.Manager.Inspect(ctx, o)
	if o.Tables && len(s.RefCounts) > 0 {
		s.RefCounts[0][0]++
	}
	return s, err
}

// TestDeepCheckFindsALeakedBlock: a reference count that disagrees with the
// tables stops the run, whether the engine checks the tables (in-process)
// or the plugin server does where they are and sends only the findings.
func TestDeepCheckFindsALeakedBlock(t *testing.T) {
	for _, plugin := range []bool{false, true} {
		t.Run(fmt.Sprintf("plugin=%v", plugin), func(t *testing.T) {
			wl := genWorkload(t, 4, 0)
			s := buildSpec(t, testSpec{pp: 2, draft: 1, policy: sched.GuaranteedNoEvict, cacheTokens: 1 << 15, reqs: wl, maxSeqLen: 2048})
			s.CheckEvery, s.DeepEvery = 1, 4
			l := inproc{
				manager: func() kvcache.Manager {
					var m kvcache.Manager = leakyRefs{cachemgrv1.New()}
					if plugin {
						m = pluginrpc.TestManagerPair(t, m)
					}
					return m
				},
				worker: func() worker.Worker { return device.NewWorker(dsa.Backend) },
			}
			rep, err := engine.Run(context.Background(), s, l)
			if !errors.Is(err, engine.ErrInvariant) {
				t.Fatalf("Run error = %v, want ErrInvariant", err)
			}
			want := "tables: pool full block 0: reference count"
			if len(rep.Invariants.First) == 0 || !strings.Contains(rep.Invariants.First[0], want) {
				t.Fatalf("first violations %q, want one with %q", rep.Invariants.First, want)
			}
			if rep.Invariants.DeepChecks != 1 {
				t.Errorf("%d deep checks, want the run to stop at the first", rep.Invariants.DeepChecks)
			}
		})
	}
}

// TestManagerRefusalNamesTheRegisteredOnes: a manager that cannot hold a
// stage's layers is refused at start, and the refusal names the managers
// the registry says can (SSM reuse or not), not a list written here.
func TestManagerRefusalNamesTheRegisteredOnes(t *testing.T) {
	cfg, _, err := config.Load(builtin.Registry(), nil, nil, []string{"model=nemotron-3-nano-30b-a3b", "cache_manager=v2", "isolation=inprocess",
		"workload.requests=1", "workload.prompt_tokens=64", "workload.output_tokens=4"})
	if err != nil {
		t.Fatal(err)
	}
	res, err := setup.Resolve(cfg, "refused", true)
	if err != nil {
		t.Fatal(err)
	}
	l := setup.NewLauncher(cfg, builtin.Registry(), nil)
	defer l.Close()
	_, err = engine.Run(context.Background(), res.Spec, l)
	want := `set cache_manager to one that manages mixer "mamba": mamba, v1 (without SSM reuse)`
	if err == nil || !strings.Contains(err.Error(), "cannot serve layer") || !strings.Contains(err.Error(), want) {
		t.Errorf("v2 on a hybrid model: %v; want a refusal containing %q", err, want)
	}
}
