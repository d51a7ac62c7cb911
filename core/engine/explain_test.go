package engine_test

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"sync"
	"testing"

	"github.com/hashicorp/go-hclog"
	"github.com/santhosh-tekuri/jsonschema/v6"

	cachemgrv1 "github.com/kvx-dev/kvx/cachemgr_v1"
	cachemgrv2 "github.com/kvx-dev/kvx/cachemgr_v2"
	"github.com/kvx-dev/kvx/core/engine"
	"github.com/kvx-dev/kvx/core/report"
	"github.com/kvx-dev/kvx/core/sched"
	"github.com/kvx-dev/kvx/core/workload"
	"github.com/kvx-dev/kvx/device"
	"github.com/kvx-dev/kvx/dsa"
	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
	"github.com/kvx-dev/kvx/plugins/v1/worker"
)

// explainer is v1 made an Explainer by script: its lookups stop at
// multiples of every blocks (as a Mamba stage's snapshot boundaries), each
// explained by miss (partial_block when the match reaches the prompt's last
// full block, as a real manager says), its grants say host of every reuse
// came from the host tier, and it records the clock and the priorities it
// is given.
type explainer struct {
	kvcache.Manager
	every    int // blocks; 1 = any block
	miss     kvcache.Explanation
	host     int                 // HostReused of a grant: min(host, Reuse)
	policies []string            // Info's EvictionPolicies
	caps     func(*kvcache.Info) // edits Info; nil for none
	tpb      int
	rec      *calls
}

// calls is what the explainers of a run saw, in call order.
type calls struct {
	mu       sync.Mutex
	nows     []int64 // every LookupItem.Now and ReserveItem.Now
	admitted map[kvcache.SeqID]kvcache.ReserveItem
}

func (c *calls) saw(now int64) {
	c.mu.Lock()
	c.nows = append(c.nows, now)
	c.mu.Unlock()
}

func (x *explainer) Info(ctx context.Context) (kvcache.Info, error) {
	info, err := x.Manager.Info(ctx)
	info.Capabilities.Explain, info.Capabilities.Retention = true, true
	info.Capabilities.EvictionPolicies = x.policies
	if x.caps != nil {
		x.caps(&info)
	}
	return info, err
}

func (x *explainer) Configure(ctx context.Context, cfg kvcache.Config) (kvcache.Layout, error) {
	x.tpb = cfg.TokensPerBlock
	cfg.EvictionPolicy = "" // v1 knows lru alone; the engine checked the value
	return x.Manager.Configure(ctx, cfg)
}

func (x *explainer) Explain(ctx context.Context, items []kvcache.LookupItem) ([]kvcache.Explanation, error) {
	got, err := x.Manager.Lookup(ctx, items)
	if err != nil {
		return nil, err
	}
	out := make([]kvcache.Explanation, len(got))
	for i, n := range got {
		x.rec.saw(items[i].Now)
		n -= n % (x.every * x.tpb)
		out[i] = x.miss
		out[i].Tokens = n
		if n == (len(items[i].Prompt)-1)/x.tpb*x.tpb {
			out[i] = kvcache.Explanation{Tokens: n, Miss: kvcache.MissPartialBlock}
		}
		out[i].HostTokens = min(n, x.host)
	}
	return out, nil
}

func (x *explainer) Lookup(context.Context, []kvcache.LookupItem) ([]int, error) {
	panic("Lookup called on a manager whose Info says Explain")
}

func (x *explainer) Reserve(ctx context.Context, items []kvcache.ReserveItem) ([]kvcache.Grant, error) {
	x.rec.mu.Lock()
	for _, it := range items {
		x.rec.nows = append(x.rec.nows, it.Now)
		if it.New {
			x.rec.admitted[it.Seq] = it
		}
	}
	x.rec.mu.Unlock()
	g, err := x.Manager.Reserve(ctx, items)
	for i := range g {
		if g[i].OK && items[i].New {
			g[i].HostReused = min(x.host, items[i].Reuse)
		}
	}
	return g, err
}

// explainers launches one explainer per stage, made by mk, all recording
// into rec.
type explainers struct {
	mk  func(stage int) *explainer
	rec *calls
}

func (l explainers) Manager(_ context.Context, s int) (kvcache.Manager, error) {
	x := l.mk(s)
	x.Manager, x.rec = cachemgrv1.New(), l.rec
	if x.every == 0 {
		x.every = 1
	}
	return x, nil
}

func (explainers) Worker(context.Context, int) (worker.Worker, error) {
	return device.NewWorker(dsa.Backend), nil
}

func newCalls() *calls { return &calls{admitted: map[kvcache.SeqID]kvcache.ReserveItem{}} }

// checkCacheSums checks the report's cache accounting against its records:
// per record reused + computed == prompt, the reason's tokens and the
// partial block's == computed, device + host == reused; in total the tiers
// sum to prefix_reused, and prefix_reused plus the reasons' tokens to the
// prompt tokens of the admitted requests, whose count the reasons'
// requests are.
func checkCacheSums(t *testing.T, rep report.Report) {
	t.Helper()
	var prompt, reused, host int64
	admitted := 0
	for _, rec := range rep.Requests.Records {
		c := rec.Cache
		if c == nil {
			continue
		}
		admitted++
		prompt += int64(rec.PromptTokens)
		reused += int64(rec.ReusedTokens)
		host += int64(c.ReusedHost)
		if c.ReusedDevice+c.ReusedHost != rec.ReusedTokens || rec.ReusedTokens+c.Computed != rec.PromptTokens ||
			c.ReasonTokens+c.PartialBlockTokens != c.Computed {
			t.Errorf("request %d: prompt %d reused %d, cache %+v: want device + host = reused, reused + computed = prompt, reason + partial = computed",
				rec.ID, rec.PromptTokens, rec.ReusedTokens, *c)
		}
	}
	if admitted == 0 {
		t.Fatal("no record says how the cache served its request")
	}
	tk := rep.Tokens
	if tk.PrefixReused != reused || tk.PrefixReusedByTier.Host != host || tk.PrefixReusedByTier.Device+tk.PrefixReusedByTier.Host != reused {
		t.Errorf("prefix_reused %d by tier %+v, records: reused %d, host %d", tk.PrefixReused, tk.PrefixReusedByTier, reused, host)
	}
	var missTokens int64
	requests := 0
	for _, m := range kvcache.MissReasons() {
		c, ok := tk.MissReasons[m.String()]
		if !ok {
			t.Errorf("miss_reasons has no %s", m)
		}
		missTokens += c.Tokens
		requests += c.Requests
	}
	if len(tk.MissReasons) != len(kvcache.MissReasons()) {
		t.Errorf("miss_reasons = %v, want one entry per reason", tk.MissReasons)
	}
	if reused+missTokens != prompt || requests != admitted {
		t.Errorf("prefix_reused %d + miss tokens %d = %d, want the %d prompt tokens of the admitted; reasons count %d requests, want %d",
			reused, missTokens, reused+missTokens, prompt, requests, admitted)
	}
}

// TestExplanationOfTheLimitingStage: two stages disagree (stage 0 matches
// at any block and says never_stored, stage 1 stops at every other block
// and says evicted): a request that stage 1 limited takes stage 1's
// explanation, and the next round, asked about the prompt cut at stage 1's
// match, whose answers say partial_block, does not replace it. Every
// explanation is asked for with Explain, never Lookup (the explainer panics).
func TestExplanationOfTheLimitingStage(t *testing.T) {
	wl := genWorkload(t, 30, 288) // 9 shared blocks: stage 0 answers 288, stage 1 256
	s := buildSpec(t, testSpec{pp: 2, draft: 1, reuse: true, policy: sched.GuaranteedNoEvict, cacheTokens: 1 << 16, reqs: wl, maxSeqLen: 2048})
	s.KeepRequests = true
	rec := newCalls()
	rep := runSpec(t, s, explainers{rec: rec, mk: func(st int) *explainer {
		if st == 0 {
			return &explainer{every: 1, miss: kvcache.Explanation{Miss: kvcache.MissNeverStored}, host: 64}
		}
		return &explainer{every: 2, miss: kvcache.Explanation{Miss: kvcache.MissEvicted, EvictedTier: kvcache.TierHost, EvictedBy: "lfu", EvictedAt: 2_500_000_000}, host: 32}
	}})
	if rep.Requests.Completed != len(wl.Requests) {
		t.Fatalf("requests = %+v, want all %d completed", rep.Requests, len(wl.Requests))
	}
	limited := 0
	for _, r := range rep.Requests.Records {
		c := r.Cache
		switch r.ReusedTokens {
		case 256: // stage 1 limited the match
			limited++
			if c.Reason != "evicted" || c.EvictedTier != "host" || c.EvictedBy != "lfu" || c.EvictedAtS == nil || *c.EvictedAtS != 2.5 {
				t.Errorf("request %d reused 256 tokens, limited by stage 1: cache %+v, want evicted from host by lfu at 2.5 s", r.ID, *c)
			}
			if c.ReusedHost != 64 {
				t.Errorf("request %d: %d reused tokens from the host tier, want 64 (the larger of the stages' 64 and 32)", r.ID, c.ReusedHost)
			}
			if want := (r.PromptTokens-1)/32*32 - 256; c.ReasonTokens != want {
				t.Errorf("request %d: %d tokens explained by %s, want %d (to the last full block of %d tokens)", r.ID, c.ReasonTokens, c.Reason, want, r.PromptTokens)
			}
		case 0: // nothing cached yet: the stages agree, stage 0 explains
			if c.Reason != "never_stored" || c.ReusedHost != 0 {
				t.Errorf("request %d reused nothing: cache %+v, want never_stored (stage 0's, the stages tie)", r.ID, *c)
			}
		}
	}
	if limited == 0 {
		t.Fatalf("no request reused 256 tokens: records %+v", rep.Requests.Records)
	}
	if got := rep.Tokens.MissReasons["evicted"].Requests; got != limited {
		t.Errorf("miss_reasons.evicted.requests = %d, want %d", got, limited)
	}
	checkCacheSums(t, rep)
	// The report, evictions explained, matches docs/report.schema.json.
	var buf bytes.Buffer
	if err := report.WriteJSON(&buf, report.NewDocument("test", []report.Report{rep})); err != nil {
		t.Fatal(err)
	}
	sch, err := jsonschema.NewCompiler().Compile("../../docs/report.schema.json")
	if err != nil {
		t.Fatal(err)
	}
	doc, err := jsonschema.UnmarshalJSON(&buf)
	if err != nil {
		t.Fatal(err)
	}
	if err := sch.Validate(doc); err != nil {
		t.Errorf("the report does not match docs/report.schema.json: %v", err)
	}
}

// TestEngineClockReachesManagers: every LookupItem.Now and ReserveItem.Now
// is the engine clock: never decreasing, and a request's admission is
// stamped between its arrival and its first token (a wall clock or a
// constant would be neither).
func TestEngineClockReachesManagers(t *testing.T) {
	wl := genWorkload(t, 24, 256)
	s := buildSpec(t, testSpec{pp: 1, reuse: true, policy: sched.GuaranteedNoEvict, cacheTokens: 1 << 16, reqs: wl, maxSeqLen: 2048})
	s.KeepRequests, s.Sequential = true, true
	rec := newCalls()
	rep := runSpec(t, s, explainers{rec: rec, mk: func(int) *explainer { return &explainer{} }})
	for i := 1; i < len(rec.nows); i++ {
		if rec.nows[i] < rec.nows[i-1] {
			t.Fatalf("call %d: Now = %d after %d: the clock went back", i, rec.nows[i], rec.nows[i-1])
		}
	}
	distinct := map[int64]bool{}
	for _, r := range rep.Requests.Records {
		ask, ok := rec.admitted[kvcache.SeqID(r.ID)]
		if !ok {
			t.Fatalf("request %d was never reserved as a new sequence", r.ID)
		}
		at := float64(ask.Now) / 1e6
		if at < r.ArrivalMs || r.FirstTokenMs == nil || at >= *r.FirstTokenMs {
			t.Errorf("request %d admitted at Now = %.3f ms: want in [arrival %.3f, first token %v) ms", r.ID, at, r.ArrivalMs, r.FirstTokenMs)
		}
		distinct[ask.Now] = true
	}
	if len(distinct) < 2 {
		t.Errorf("every admission had the same Now %v", distinct)
	}
}

// TestRetentionReachesManagers: a request's retention priority and
// duration (its own from a prompts file, else the workload's default) reach
// the manager in its new sequence's ReserveItem, in ns.
func TestRetentionReachesManagers(t *testing.T) {
	ps := make([]workload.Prompt, 6)
	for i := range ps {
		ps[i] = workload.Prompt{Tokens: make([]int32, 100+40*i), MaxTokens: 3}
	}
	ps[1].RetentionPriority, ps[1].RetentionDuration = 90, 30e9
	ps[4].RetentionPriority = 5
	wl, err := workload.FromPrompts(ps, 0)
	if err != nil {
		t.Fatal(err)
	}
	wl.RetentionPriority, wl.RetentionDuration = 60, 2e9
	s := buildSpec(t, testSpec{pp: 2, reuse: true, policy: sched.GuaranteedNoEvict, cacheTokens: 1 << 16, reqs: wl, maxSeqLen: 2048})
	var logs bytes.Buffer
	s.Log = hclog.New(&hclog.LoggerOptions{Output: &logs, Level: hclog.Warn})
	rec := newCalls()
	runSpec(t, s, explainers{rec: rec, mk: func(int) *explainer { return &explainer{} }})
	want := map[kvcache.SeqID][2]int64{0: {60, 2e9}, 1: {90, 30e9}, 2: {60, 2e9}, 3: {60, 2e9}, 4: {5, 0}, 5: {60, 2e9}}
	for id, w := range want {
		ask := rec.admitted[id]
		if got := [2]int64{int64(ask.Priority), ask.PriorityDuration}; got != w {
			t.Errorf("request %d: Priority, PriorityDuration = %v, want %v", id, got, w)
		}
	}
	if strings.Contains(logs.String(), "ignores") {
		t.Errorf("warned that priorities are ignored by managers that say Retention: %s", logs.String())
	}

	// A priority out of range never reaches a manager.
	bad := s
	bad.Workload.RetentionPriority = 101
	if _, err := engine.Run(context.Background(), bad, v1Launcher()); err == nil || !strings.Contains(err.Error(), "retention priority 101") {
		t.Errorf("Run with a workload priority of 101: %v, want an error naming it", err)
	}

	// The same run on a v1 that does not say Retention: one warning.
	logs.Reset()
	runSpec(t, s, plainV1Launcher())
	if n := strings.Count(logs.String(), "retention priority"); n != 1 {
		t.Errorf("%d warnings about ignored retention priorities, want 1:\n%s", n, logs.String())
	}
}

// TestPlainManagersExplainUnknown: with managers that do not explain the
// run goes through Lookup and its misses say unknown, or partial_block;
// with reuse off, reuse_off. The sums hold either way.
func TestPlainManagersExplainUnknown(t *testing.T) {
	for _, reuse := range []bool{true, false} {
		wl := genWorkload(t, 20, 256)
		s := buildSpec(t, testSpec{pp: 2, draft: 1, reuse: reuse, policy: sched.GuaranteedNoEvict, cacheTokens: 1 << 16, reqs: wl, maxSeqLen: 2048})
		s.KeepRequests = true
		rep := runSpec(t, s, plainV1Launcher())
		checkCacheSums(t, rep)
		want := "unknown"
		if !reuse {
			want = "reuse_off"
		}
		for name, c := range rep.Tokens.MissReasons {
			if name != want && name != "partial_block" && c != (report.MissCount{}) {
				t.Errorf("reuse %v: miss_reasons[%s] = %+v, want only %s and partial_block", reuse, name, c, want)
			}
		}
		if rep.Tokens.MissReasons[want].Requests == 0 || rep.Tokens.PrefixReusedByTier.Host != 0 {
			t.Errorf("reuse %v: miss_reasons %v, by tier %+v: want %s requests and nothing from the host tier", reuse, rep.Tokens.MissReasons, rep.Tokens.PrefixReusedByTier, want)
		}
	}
}

// TestEvictionPolicyRefused: a policy the manager's Info does not list (a
// v1 that lists none: lru alone) is a configuration error naming the manager, the
// value and what it accepts; one it lists runs.
func TestEvictionPolicyRefused(t *testing.T) {
	wl := genWorkload(t, 4, 0)
	s := buildSpec(t, testSpec{pp: 1, policy: sched.GuaranteedNoEvict, cacheTokens: 1 << 15, reqs: wl, maxSeqLen: 2048})
	s.Managers[0].EvictionPolicy = kvcache.EvictionLFU
	_, err := engine.Run(context.Background(), s, plainV1Launcher())
	if kvcache.KindOf(err) != kvcache.KindInvalidConfig || !errors.Is(err, engine.ErrEvictionPolicy) {
		t.Fatalf("Run with eviction_policy lfu on v1: error %v (kind %v), want an invalid config", err, kvcache.KindOf(err))
	}
	for _, w := range []string{"cachemgr-v1", `"lfu"`, "accepts lru", "eviction_policy"} {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error %q does not say %s", err, w)
		}
	}
	rep := runSpec(t, s, explainers{rec: newCalls(), mk: func(int) *explainer {
		return &explainer{policies: []string{kvcache.EvictionLRU, kvcache.EvictionLFU}}
	}})
	if rep.Requests.Completed != len(wl.Requests) {
		t.Errorf("with a manager that lists lfu: requests %+v, want all completed", rep.Requests)
	}
}

// plainV1 is cachemgr_v1 as a manager from before explain and retention:
// its Info says neither, lists no eviction policy, and it is no Explainer.
type plainV1 struct{ kvcache.Manager }

func (p plainV1) Info(ctx context.Context) (kvcache.Info, error) {
	info, err := p.Manager.Info(ctx)
	info.Capabilities.Explain, info.Capabilities.Retention, info.Capabilities.EvictionPolicies = false, false, nil
	return info, err
}

func plainV1Launcher() engine.Launcher {
	return inproc{
		manager: func() kvcache.Manager { return plainV1{cachemgrv1.New()} },
		worker:  func() worker.Worker { return device.NewWorker(dsa.Backend) },
	}
}

// TestManagersExplainThroughTheEngine: the built-in managers explain, so a
// run of requests that share nothing but a system-prompt-like first block
// says never_stored and partial_block, never unknown, and the sums hold.
func TestManagersExplainThroughTheEngine(t *testing.T) {
	for name, mk := range map[string]func() kvcache.Manager{
		"v1": func() kvcache.Manager { return cachemgrv1.New() },
		"v2": func() kvcache.Manager { return cachemgrv2.New() },
	} {
		wl := genWorkload(t, 20, 256)
		s := buildSpec(t, testSpec{pp: 2, draft: 1, reuse: true, policy: sched.GuaranteedNoEvict, cacheTokens: 1 << 16, reqs: wl, maxSeqLen: 2048})
		s.KeepRequests = true
		rep := runSpec(t, s, inproc{manager: mk, worker: func() worker.Worker { return device.NewWorker(dsa.Backend) }})
		checkCacheSums(t, rep)
		if c := rep.Tokens.MissReasons["unknown"]; c != (report.MissCount{}) {
			t.Errorf("%s: %+v unknown misses, want none (the manager explains)", name, c)
		}
		if rep.Tokens.MissReasons["never_stored"].Requests == 0 || rep.Tokens.PrefixReused == 0 {
			t.Errorf("%s: miss reasons %v, %d reused: want never_stored misses and some reuse", name, rep.Tokens.MissReasons, rep.Tokens.PrefixReused)
		}
	}
}
