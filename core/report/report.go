// Package report holds the result of one engine run (a variant) and renders
// reports as JSON for machines and as side-by-side tables for people.
//
// The JSON is one shape for run and compare: a Document, versioned by its
// "schema" key (Schema) and described by docs/report.schema.json. Units are
// spelled one way, as the key's suffix: _ms, _s, _bytes, _per_s; a
// quantity without a suffix is a count, and rates and usages (hit_rate,
// peak_usage, kv_usage) are fractions in [0, 1]. Besides the totals, a
// variant carries its resolved config, its workload, latency quantiles,
// a Series over engine time (series.go) and, when asked, one record per
// request. A compare of the sim against a device that computes also
// carries the sim's error per figure against the measured runs
// (simpair.go). WriteHTML (html.go) draws the same figures.
package report

import (
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"math"
	"slices"
	"sort"
	"strings"
	"text/tabwriter"
	"unicode/utf8"
)

// Report is the outcome of one run. Times are simulated on the sim device and
// measured on real devices (Engine.Modelled says which).
type Report struct {
	Variant    string     `json:"variant"`
	Config     Setup      `json:"config"`
	Requests   Requests   `json:"requests"`
	Tokens     Tokens     `json:"tokens"`
	KV         KV         `json:"kv"`
	Latency    Latency    `json:"latency"`
	Throughput Throughput `json:"throughput"`
	Invariants Invariants `json:"invariants"`
	Engine     Engine     `json:"engine"`
	Snapshots  *Snapshots `json:"snapshots,omitempty"`
	Outputs    Outputs    `json:"outputs"`
	// ResolvedConfig is every configuration key (config.KnownKeys) with
	// the value the run used, after defaults, files, KVX_* env and --set:
	// config.Config.Flatten, null for a key that is unset or not used by
	// this workload's mode. Written back with --set, the values reproduce
	// the run's configuration.
	ResolvedConfig map[string]any `json:"resolved_config,omitempty"`
	// Workload describes the requests the run was given.
	Workload *Workload `json:"workload,omitempty"`
	// Series are the run's figures over engine time, at most MaxPoints.
	Series *Series `json:"series,omitempty"`
	// Bench is set for what kvx bench measured of a server (see Bench).
	Bench *Bench `json:"bench,omitempty"`
	// Status is StatusFinished, or StatusFailed when the run stopped early;
	// WriteJSON fills it in from Error when it is empty.
	Status string `json:"status"`
	// Error is set when the run stopped early (engine failure, invariant
	// broken, a plugin that did not start).
	Error string `json:"error,omitempty"`
}

// Values of Report.Status.
const (
	StatusFinished    = "finished"
	StatusFailed      = "failed"
	StatusInterrupted = "interrupted"
)

// Setup records what ran.
type Setup struct {
	Model        string `json:"model"`
	CacheManager string `json:"cache_manager"`
	Backend      string `json:"attention_backend"`
	Device       string `json:"device"`
	Hardware     string `json:"hardware"`
	// Calibration names the sim calibration the times come from (a file,
	// or "embedded:<hardware>.json"); "none" when the sim used the
	// datasheet roofline or the device measured its own times.
	Calibration string `json:"calibration"`
	Isolation   string `json:"isolation"`
	Policy      string `json:"capacity_scheduler_policy"`
	PP          int    `json:"pipeline_parallel_size"`
	TP          int    `json:"tensor_parallel_size"`
	Draft       int    `json:"draft_tokens"`
	BlockReuse  bool   `json:"enable_block_reuse"`
}

type Requests struct {
	Total       int         `json:"total"`
	Completed   int         `json:"completed"`
	Rejected    int         `json:"rejected"`
	Failed      int         `json:"failed"`
	Preemptions int         `json:"preemptions"`
	Suspensions int         `json:"suspensions"` // preemptions that suspended to the host tier instead of recomputing
	Rejections  []Rejection `json:"rejections"`
	Failures    []Rejection `json:"failures"`
	// Records has one entry per request, in request order, when the run
	// kept them (engine.Spec.KeepRequests: kvx run --requests).
	Records []RequestRecord `json:"records,omitempty"`
}

// Values of RequestRecord.Status.
const (
	RequestFinished = "finished"
	RequestRejected = "rejected"
	RequestFailed   = "failed"
	// RequestUnfinished: the run stopped (failed or interrupted) first.
	RequestUnfinished = "unfinished"
)

// RequestRecord is one request's life, in milliseconds of engine time from
// the start of the run. FirstTokenMs, FinishMs, TTFTMs, TPOTMs and E2EMs
// are absent where the request did not get that far (TPOTMs also for a
// request of one generated token).
type RequestRecord struct {
	ID           uint64   `json:"id"`
	Status       string   `json:"status"`
	ArrivalMs    float64  `json:"arrival_ms"`
	FirstTokenMs *float64 `json:"first_token_ms,omitempty"`
	FinishMs     *float64 `json:"finish_ms,omitempty"`
	TTFTMs       *float64 `json:"ttft_ms,omitempty"`
	TPOTMs       *float64 `json:"tpot_ms,omitempty"`
	E2EMs        *float64 `json:"e2e_ms,omitempty"`
	PromptTokens int      `json:"prompt_tokens"`
	Generated    int      `json:"generated_tokens"`
	// ReusedTokens are the prompt tokens the prefix cache supplied at its
	// first admission, from any tier (Cache splits them).
	ReusedTokens int `json:"reused_tokens"`
	// RecomputedTokens are the prefill tokens computed again after a
	// preemption that freed the request's cache.
	RecomputedTokens int `json:"recomputed_tokens"`
	// Preemptions freed the request's cache (to be recomputed);
	// Suspensions kept it on the host tier.
	Preemptions int `json:"preemptions"`
	Suspensions int `json:"suspensions"`
	// Cache explains the prefix cache's part in the first admission; nil
	// when the request was never admitted, or was preempted (or its plugin
	// restarted) before its first prefill chunk completed: that prefill
	// then counts as recomputed, and its reuse in no total, as before.
	Cache *CacheUse `json:"cache,omitempty"`
}

// CacheUse is what the prefix cache did for one request's first admission:
// its reused prompt tokens by tier and its computed ones by reason.
// ReusedDevice + ReusedHost is the record's ReusedTokens, and
// ReusedDevice + ReusedHost + Computed its PromptTokens.
type CacheUse struct {
	ReusedDevice int `json:"reused_device_tokens"`
	ReusedHost   int `json:"reused_host_tokens"`
	Computed     int `json:"computed_tokens"`
	// Reason is why the first computed token was not reused (a
	// kvcache.MissReason name: evicted, never_stored, partial_block, ...);
	// ReasonTokens of Computed are the tokens up to the prompt's last full
	// block it explains, and PartialBlockTokens the rest, which no cache
	// supplies (ReasonTokens is 0 when Reason is partial_block).
	Reason             string `json:"miss_reason"`
	ReasonTokens       int    `json:"miss_reason_tokens"`
	PartialBlockTokens int    `json:"partial_block_tokens"`
	// For Reason evicted: the tier the block was evicted from, the rule
	// that chose it (an eviction policy, or priority), and when (engine
	// seconds; absent when the manager had no clock).
	EvictedTier string   `json:"evicted_tier,omitempty"`
	EvictedBy   string   `json:"evicted_by,omitempty"`
	EvictedAtS  *float64 `json:"evicted_at_s,omitempty"`
}

// Workload describes the requests a run was given (workload.* in
// ResolvedConfig says how they were made).
type Workload struct {
	Requests int `json:"requests"`
	// Concurrency > 0 is a closed loop with that many requests in flight;
	// 0 an open loop by arrival time.
	Concurrency       int     `json:"concurrency"`
	PromptTokens      int64   `json:"prompt_tokens"` // a trace line rejected while read (too long) carries none
	PromptTokensMax   int     `json:"prompt_tokens_max"`
	OutputTokens      int64   `json:"output_tokens"` // asked for
	OutputTokensMax   int     `json:"output_tokens_max"`
	LastArrivalS      float64 `json:"last_arrival_s"`      // open loop: the last request's arrival
	RejectedOnArrival int     `json:"rejected_on_arrival"` // found unrunnable while read
}

// Rejection names a request that was refused or failed, and why.
type Rejection struct {
	ID     uint64 `json:"id"`
	Reason string `json:"reason"`
}

type Tokens struct {
	Prompt       int64 `json:"prompt"`
	Generated    int64 `json:"generated"`
	PrefixReused int64 `json:"prefix_reused"`
	// PrefixReusedByTier splits PrefixReused by the tier that held the
	// blocks (Device + Host == PrefixReused).
	PrefixReusedByTier TierTokens `json:"prefix_reused_by_tier"`
	// MissReasons is, per kvcache.MissReason name, how many admitted
	// requests first missed for that reason and how many of their computed
	// prompt tokens it explains (see CacheUse): PrefixReused plus every
	// reason's Tokens is the prompt tokens of the admitted requests.
	MissReasons map[string]MissCount `json:"miss_reasons"`
	Recomputed  int64                `json:"recomputed"`
	// HitRate is PrefixReused / Prompt.
	HitRate float64 `json:"hit_rate"`
	// DraftAccepted / DraftProposed is the MTP acceptance.
	DraftProposed int64 `json:"draft_proposed"`
	DraftAccepted int64 `json:"draft_accepted"`
	// Ceiling is the prefix reuse the same admissions could have had; nil
	// from an engine that does not record it (kvx serve).
	Ceiling *Ceiling `json:"ceiling,omitempty"`
}

// Ceiling is how much prefix reuse the run's counted admissions (those in
// PrefixReused) could have had, in the order the run admitted them, from
// full blocks before each prompt's last token (core/ceiling says the model
// and why it bounds every manager). Hit rates are over Tokens.Prompt, as
// Tokens.HitRate.
type Ceiling struct {
	// Infinite is the reuse of a cache that never evicts.
	Infinite        int64   `json:"infinite"`
	InfiniteHitRate float64 `json:"infinite_hit_rate"`
	// Device bounds the reuse of the best eviction at the run's device
	// capacity, DeviceHost at device plus host tier capacity (absent
	// without a host tier); both absent when a stage has no full-attention
	// pool to size them by.
	Device     *CeilingAt `json:"device,omitempty"`
	DeviceHost *CeilingAt `json:"device_host,omitempty"`
	// Requests are the counted admissions, Reachable their full blocks
	// before the last prompt token (tokens): no cache reuses more.
	Requests  int   `json:"requests"`
	Reachable int64 `json:"reachable"`
	// PinnedPeakBlocks is the most distinct prompt blocks that running
	// requests held at once.
	PinnedPeakBlocks int `json:"pinned_peak_blocks"`
}

// CeilingAt is the ceiling at one capacity.
type CeilingAt struct {
	// CapacityBlocks is the smallest stage's blocks of the tiers counted
	// (the smallest full-attention pool of each).
	CapacityBlocks int     `json:"capacity_blocks"`
	Reused         int64   `json:"reused"`
	HitRate        float64 `json:"hit_rate"`
}

// Best is the ceiling at the run's whole capacity: device and host tier
// when it has one, else the device; nil when neither is known.
func (c *Ceiling) Best() *CeilingAt {
	switch {
	case c == nil:
		return nil
	case c.DeviceHost != nil:
		return c.DeviceHost
	}
	return c.Device
}

// TierTokens are tokens by cache tier.
type TierTokens struct {
	Device int64 `json:"device"`
	Host   int64 `json:"host"`
}

// MissCount is one miss reason's share.
type MissCount struct {
	Requests int   `json:"requests"`
	Tokens   int64 `json:"tokens"`
}

// TopMisses returns the reasons with tokens, most tokens first (ties by
// name), each with its share of all the reasons' tokens.
func (t Tokens) TopMisses() []MissShare {
	var total int64
	var out []MissShare
	for name, c := range t.MissReasons {
		total += c.Tokens
		if c.Tokens > 0 {
			out = append(out, MissShare{Reason: name, Tokens: c.Tokens})
		}
	}
	for i := range out {
		out[i].Share = float64(out[i].Tokens) / float64(total)
	}
	slices.SortFunc(out, func(a, b MissShare) int {
		if a.Tokens != b.Tokens {
			return int(b.Tokens - a.Tokens)
		}
		return strings.Compare(a.Reason, b.Reason)
	})
	return out
}

// MissShare is a miss reason's computed tokens and their share.
type MissShare struct {
	Reason string
	Tokens int64
	Share  float64 // of every reason's tokens
}

type KV struct {
	PeakUsage float64      `json:"peak_usage"`
	Stages    []StageUsage `json:"stages"`
}

// StageUsage describes one pipeline stage's cache.
type StageUsage struct {
	Stage        int     `json:"stage"`
	PeakUsage    float64 `json:"peak_usage"`
	Pools        []Pool  `json:"pools"`
	MaxSeqTokens int     `json:"max_seq_tokens"`
	Evictions    int64   `json:"evictions"`
	Manager      string  `json:"manager"`
}

// Pool is one pool of a stage's layout.
type Pool struct {
	Name       string `json:"name"`
	Tier       string `json:"tier"`
	Blocks     int    `json:"blocks"`
	BlockBytes int64  `json:"block_bytes"`
	Tokens     int    `json:"tokens_per_block"`
}

// Latency holds percentiles in milliseconds of engine time.
type Latency struct {
	TTFTP50 float64 `json:"ttft_p50_ms"`
	TTFTP99 float64 `json:"ttft_p99_ms"`
	TPOTP50 float64 `json:"tpot_p50_ms"`
	TPOTP99 float64 `json:"tpot_p99_ms"`
	E2EP50  float64 `json:"e2e_p50_ms"`
	E2EP99  float64 `json:"e2e_p99_ms"`
	// Quantiles are the distributions behind the percentiles (nil when no
	// request finished).
	Quantiles *Quantiles `json:"quantiles,omitempty"`
}

// Quantiles hold latency distributions: element i of each list is the
// P[i]-th percentile (nearest rank) over the finished requests.
type Quantiles struct {
	P      []float64 `json:"p"`
	TTFTMs []float64 `json:"ttft_ms"`
	TPOTMs []float64 `json:"tpot_ms"` // empty when no request generated two tokens
	E2EMs  []float64 `json:"e2e_ms"`
}

// QuantilePoints are the percentiles Quantiles holds: 0 to 100 by 1, and
// the tail at 99.5 and 99.9.
var QuantilePoints = func() []float64 {
	var p []float64
	for i := range 100 {
		p = append(p, float64(i))
		if i == 99 {
			p = append(p, 99.5, 99.9)
		}
	}
	return append(p, 100)
}()

// NewQuantiles returns the distributions of ttft, tpot and e2e (in ms;
// sorted in place) at QuantilePoints; nil when e2e is empty.
func NewQuantiles(ttft, tpot, e2e []float64) *Quantiles {
	if len(e2e) == 0 {
		return nil
	}
	at := func(xs []float64) []float64 {
		out := make([]float64, 0, len(QuantilePoints))
		if len(xs) == 0 {
			return out
		}
		for _, p := range QuantilePoints {
			out = append(out, Percentile(xs, p))
		}
		return out
	}
	return &Quantiles{P: slices.Clone(QuantilePoints), TTFTMs: at(ttft), TPOTMs: at(tpot), E2EMs: at(e2e)}
}

type Throughput struct {
	OutputTokensPerS float64 `json:"output_tokens_per_s"`
	RequestsPerS     float64 `json:"requests_per_s"`
	// EngineS is the engine time of the last completion: simulated on
	// device sim, measured otherwise (Engine.Modelled says which).
	EngineS float64 `json:"engine_s"`
	// SimulatedS is EngineS under its first name, kept for the scripts
	// that read it; it is not simulated on a real device.
	SimulatedS float64 `json:"simulated_s"`
}

type Invariants struct {
	CheckedSteps int64    `json:"checked_steps"`
	DeepChecks   int64    `json:"deep_checks"`
	Violations   int      `json:"violations"`
	First        []string `json:"first,omitempty"`
}

type Engine struct {
	Steps int64 `json:"steps"`
	// OverlappedSteps were scheduled while the forward of the step before
	// them ran (step_overlap).
	OverlappedSteps int64   `json:"overlapped_steps"`
	WallS           float64 `json:"wall_s"`
	PluginRestarts  int     `json:"plugin_restarts"`
	Modelled        bool    `json:"modelled"`
	Uncalibrated    bool    `json:"uncalibrated"`
}

// Snapshots are SSM snapshot counters (Mamba managers), summed over stages.
type Snapshots struct {
	Taken        int64 `json:"taken"`
	Skipped      int64 `json:"skipped"`
	Evicted      int64 `json:"evicted"`
	ReusedTokens int64 `json:"reused_tokens"`
}

// Outputs summarises generated tokens: Digest is a hash of every request's
// generated tokens in request order, equal across variants when outputs are.
type Outputs struct {
	Digest string `json:"digest"`
	// Requests are every request's outputs, in request order, when the run
	// kept them (engine.Spec.KeepOutputs).
	Requests []RequestOutput `json:"requests,omitempty"`
}

// RequestOutput is what one request generated.
type RequestOutput struct {
	ID     uint64  `json:"id"`
	Tokens []int32 `json:"tokens"`
	// Logits are those of the last sampled position, which sampled
	// generated token LogitsAt (past len(Tokens) when the output was cut at
	// its length); nil on devices without real math.
	Logits   []float32 `json:"logits,omitempty"`
	LogitsAt int       `json:"logits_at,omitempty"`
	// TopLogprobs has one list per token of Tokens, the most likely tokens
	// of the position that produced it, most likely first (the first is
	// the token itself), when the request asked for them on a device that
	// computes them; nil otherwise.
	TopLogprobs [][]TokenLogprob `json:"top_logprobs,omitempty"`
	// Logprobs has the log-probability of every token of Tokens when the
	// request asked for them (workload.Decoding.Logprobs) on a device that
	// computes them.
	Logprobs []float64 `json:"logprobs,omitempty"`
	// FinishReason is "stop" when a stop condition (a stop id, a stop
	// string) ended the request, "length" when it ran to its length; ""
	// for a request that did not finish.
	FinishReason string `json:"finish_reason,omitempty"`
}

// TokenLogprob is a candidate token of a generated position and its
// log-probability. Its JSON is the pair [id, logprob].
type TokenLogprob struct {
	ID      int32
	Logprob float64
}

func (t TokenLogprob) MarshalJSON() ([]byte, error) {
	return json.Marshal([2]any{t.ID, t.Logprob})
}

func (t *TokenLogprob) UnmarshalJSON(b []byte) error {
	var pair [2]json.Number
	if err := json.Unmarshal(b, &pair); err != nil {
		return fmt.Errorf("token logprob: want [id, logprob]: %w", err)
	}
	id, err := pair[0].Int64()
	if err != nil || id < math.MinInt32 || id > math.MaxInt32 {
		return fmt.Errorf("token logprob: id %s is not an int32", pair[0])
	}
	lp, err := pair[1].Float64()
	if err != nil {
		return fmt.Errorf("token logprob: logprob %s: %w", pair[1], err)
	}
	t.ID, t.Logprob = int32(id), lp
	return nil
}

// Percentile returns the p-th percentile (0..100) of xs by nearest rank; 0 for none.
// xs is sorted in place.
func Percentile(xs []float64, p float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	sort.Float64s(xs)
	rank := int(math.Ceil(p/100*float64(len(xs)))) - 1
	rank = max(0, min(rank, len(xs)-1))
	return xs[rank]
}

// Schema names the shape of the JSON report (docs/report.schema.json). It
// changes only when a key is renamed or removed or changes meaning; keys
// are added without a new version.
const Schema = "kvx.report/v1"

// Document is the JSON report of run and compare alike: one variant per
// run, in the order they ran.
type Document struct {
	Schema string `json:"schema"`
	// Generator names the program and version that wrote it ("kvx 0.3.0").
	Generator string `json:"generator,omitempty"`
	// Created is when the document was written (RFC 3339, UTC).
	Created string `json:"created,omitempty"`
	// Scenario names what ran: the configuration files, or the bundled
	// demo scenario.
	Scenario string `json:"scenario,omitempty"`
	// Command is the command line that wrote it.
	Command  []string `json:"command,omitempty"`
	Variants []Report `json:"variants"`
	// Capacity is the capacity KPI of a compare that swept a load key
	// (kvx compare --capacity); nil otherwise.
	Capacity *Capacity `json:"capacity,omitempty"`
	// SimAgainstMeasured is the sim's error against the measured runs of
	// a compare that varies device over the sim and a device that computes
	// (NewSimPairs); nil when it has no such pair.
	SimAgainstMeasured []SimPair `json:"sim_against_measured,omitempty"`
}

// NewDocument returns the document of reports rs, written by generator.
func NewDocument(generator string, rs []Report) Document {
	return Document{Schema: Schema, Generator: generator, Variants: rs}
}

// WriteJSON writes d, indented. Empty lists are written as [], never null,
// and a variant's Status is filled in from its Error when unset; d itself
// is not modified.
func WriteJSON(w io.Writer, d Document) error {
	d.Schema = Schema
	vs := make([]Report, len(d.Variants))
	for i, r := range d.Variants {
		if r.Status == "" {
			r.Status = StatusFinished
			if r.Error != "" {
				r.Status = StatusFailed
			}
		}
		if r.Tokens.MissReasons == nil {
			r.Tokens.MissReasons = map[string]MissCount{}
		}
		r.Requests.Rejections = nonNil(r.Requests.Rejections)
		r.Requests.Failures = nonNil(r.Requests.Failures)
		if r.Throughput.EngineS == 0 {
			r.Throughput.EngineS = r.Throughput.SimulatedS
		}
		r.KV.Stages = nonNil(r.KV.Stages)
		for j := range r.KV.Stages {
			if r.KV.Stages[j].Pools == nil {
				r.KV.Stages = slices.Clone(r.KV.Stages)
				for k := range r.KV.Stages {
					r.KV.Stages[k].Pools = nonNil(r.KV.Stages[k].Pools)
				}
				break
			}
		}
		vs[i] = r
	}
	d.Variants = vs
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(d)
}

func nonNil[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}

// ReadJSON reads a document that WriteJSON wrote; a document of another
// schema is an error naming both.
func ReadJSON(r io.Reader) (Document, error) {
	var d Document
	if err := json.NewDecoder(r).Decode(&d); err != nil {
		return d, fmt.Errorf("report: %w", err)
	}
	if d.Schema != Schema {
		return d, fmt.Errorf("report: schema %q, want %q", d.Schema, Schema)
	}
	return d, nil
}

// row is one line of the side-by-side table. A row of only engine runs
// (only == onlyEngine) shows "-" for a bench variant, and one of only
// bench runs the other way round; a row none of whose variants it is for
// is left out.
type row struct {
	name string
	val  func(r *Report) string
	only int
}

// Values of row.only.
const (
	onlyEngine = 1 + iota
	onlyBench
)

var rows = []row{
	{"cache manager", func(r *Report) string { return r.Config.CacheManager }, onlyEngine},
	{"backend / device", func(r *Report) string { return r.Config.Backend + " / " + r.Config.Device }, onlyEngine},
	{"sim calibration", func(r *Report) string { return r.Config.Calibration }, onlyEngine},
	{"policy", func(r *Report) string { return r.Config.Policy }, onlyEngine},
	{"server", func(r *Report) string { return benchServer(r.Bench) }, onlyBench},
	{"load", func(r *Report) string { return benchLoad(r.Bench) }, onlyBench},
	{"warm-up / flush / prime", func(r *Report) string {
		p := r.Bench.Phases
		return fmt.Sprintf("%d / %s / %d", p.Warmup, p.Flush, p.Prime)
	}, onlyBench},
	{"requests total", func(r *Report) string { return itoa(r.Requests.Total) }, 0},
	{"  completed", func(r *Report) string { return itoa(r.Requests.Completed) }, 0},
	{"  rejected", func(r *Report) string { return itoa(r.Requests.Rejected) }, 0},
	{"  failed", func(r *Report) string { return itoa(r.Requests.Failed) }, 0},
	{"    by kind", func(r *Report) string { return benchErrors(r.Bench) }, onlyBench},
	{"  preemptions", func(r *Report) string { return itoa(r.Requests.Preemptions) }, onlyEngine},
	{"    suspended to host", func(r *Report) string { return itoa(r.Requests.Suspensions) }, onlyEngine},
	{"prompt tokens", func(r *Report) string { return i64(r.Tokens.Prompt) }, 0},
	{"  prefix reused", func(r *Report) string {
		return fmt.Sprintf("%s (%.1f%%)", i64(r.Tokens.PrefixReused), 100*r.Tokens.HitRate)
	}, 0},
	{"  server hit rate", func(r *Report) string { return benchMetrics(r.Bench) }, onlyBench},
	{"    from host tier", func(r *Report) string { return i64(r.Tokens.PrefixReusedByTier.Host) }, onlyEngine},
	{"  ceiling: best, device", func(r *Report) string { return ceilingCell(r, func(c *Ceiling) *CeilingAt { return c.Device }) }, onlyEngine},
	{"    device + host tier", func(r *Report) string { return ceilingCell(r, func(c *Ceiling) *CeilingAt { return c.DeviceHost }) }, onlyEngine},
	{"    infinite cache", func(r *Report) string {
		return ceilingCell(r, func(c *Ceiling) *CeilingAt { return &CeilingAt{Reused: c.Infinite, HitRate: c.InfiniteHitRate} })
	}, onlyEngine},
	{"  reused / ceiling", func(r *Report) string {
		b := r.Tokens.Ceiling.Best()
		if b == nil || b.Reused == 0 {
			return "-"
		}
		return fmt.Sprintf("%.1f%%", 100*float64(r.Tokens.PrefixReused)/float64(b.Reused))
	}, onlyEngine},
	{missReasonsRow, nil, onlyEngine}, // a row per reason (missRows)
	{"  recomputed", func(r *Report) string { return i64(r.Tokens.Recomputed) }, onlyEngine},
	{"generated tokens", func(r *Report) string { return i64(r.Tokens.Generated) }, 0},
	{"  streamed / usage", func(r *Report) string {
		b := r.Bench
		s := fmt.Sprintf("%s / %s", i64(b.StreamedTokens), i64(b.UsageTokens))
		if b.TokenMismatches > 0 {
			s += fmt.Sprintf(" (%d requests differ)", b.TokenMismatches)
		}
		return s
	}, onlyBench},
	{"draft acceptance", func(r *Report) string {
		if r.Tokens.DraftProposed == 0 {
			return "-"
		}
		return fmt.Sprintf("%.1f%%", 100*float64(r.Tokens.DraftAccepted)/float64(r.Tokens.DraftProposed))
	}, onlyEngine},
	{"kv peak usage", func(r *Report) string {
		parts := make([]string, len(r.KV.Stages))
		for i, s := range r.KV.Stages {
			parts[i] = fmt.Sprintf("%.0f%%", 100*s.PeakUsage)
		}
		return strings.Join(parts, " / ")
	}, onlyEngine},
	{"kv tokens per seq (max)", func(r *Report) string {
		parts := make([]string, len(r.KV.Stages))
		for i, s := range r.KV.Stages {
			parts[i] = itoa(s.MaxSeqTokens)
		}
		return strings.Join(parts, " / ")
	}, onlyEngine},
	{"ttft p50 / p99 ms", func(r *Report) string { return fmt.Sprintf("%.0f / %.0f", r.Latency.TTFTP50, r.Latency.TTFTP99) }, 0},
	{"tpot p50 / p99 ms", func(r *Report) string { return fmt.Sprintf("%.2f / %.2f", r.Latency.TPOTP50, r.Latency.TPOTP99) }, 0},
	{"ttft p50 / p90 / p99 ms", func(r *Report) string { return dist3(r.Bench.Latency.TTFT, "%.1f") }, onlyBench},
	{"tpot p50 / p90 / p99 ms", func(r *Report) string { return dist3(r.Bench.Latency.TPOT, "%.2f") }, onlyBench},
	{"itl p50 / p90 / p99 ms", func(r *Report) string { return dist3(r.Bench.Latency.ITL, "%.2f") }, onlyBench},
	{"e2e p50 / p90 / p99 ms", func(r *Report) string { return dist3(r.Bench.Latency.E2E, "%.1f") }, onlyBench},
	{"output tok/s", func(r *Report) string { return fmt.Sprintf("%.0f", r.Throughput.OutputTokensPerS) }, 0},
	{"requests/s", func(r *Report) string { return fmt.Sprintf("%.2f", r.Throughput.RequestsPerS) }, onlyBench},
	{"goodput req/s", func(r *Report) string { return benchGoodput(r.Bench) }, onlyBench},
	{"engine time s", func(r *Report) string { return fmt.Sprintf("%.1f", r.Throughput.SimulatedS) }, onlyEngine},
	{"snapshots taken/skipped", func(r *Report) string {
		if r.Snapshots == nil {
			return "-"
		}
		return fmt.Sprintf("%d / %d", r.Snapshots.Taken, r.Snapshots.Skipped)
	}, onlyEngine},
	{"  evicted / reused tok", func(r *Report) string {
		if r.Snapshots == nil {
			return "-"
		}
		return fmt.Sprintf("%d / %s", r.Snapshots.Evicted, i64(r.Snapshots.ReusedTokens))
	}, onlyEngine},
	{"invariant checks", func(r *Report) string { return i64(r.Invariants.CheckedSteps) }, onlyEngine},
	{"violations", func(r *Report) string { return itoa(r.Invariants.Violations) }, onlyEngine},
	{"engine steps", func(r *Report) string { return i64(r.Engine.Steps) }, onlyEngine},
	{"  overlapped", func(r *Report) string { return i64(r.Engine.OverlappedSteps) }, onlyEngine},
	{"plugin restarts", func(r *Report) string { return itoa(r.Engine.PluginRestarts) }, onlyEngine},
	{"wall time s", func(r *Report) string { return fmt.Sprintf("%.2f", r.Engine.WallS) }, 0},
	{"outputs digest", func(r *Report) string { return r.Outputs.Digest }, 0},
	{"error", func(r *Report) string {
		const width = 32 // a column that fits beside the names in tableWidth
		switch {
		case r.Error == "":
			return "-"
		case len(r.Error) > width:
			return r.Error[:width] + "... (see below)"
		}
		return r.Error
	}, 0},
}

// shownRows are the rows of rs's table: those for some variant of rs.
func shownRows(rs []Report) []row {
	var engine, bench bool
	for i := range rs {
		engine = engine || rs[i].Bench == nil
		bench = bench || rs[i].Bench != nil
	}
	var out []row
	for _, rw := range rows {
		if (rw.only == onlyEngine && !engine) || (rw.only == onlyBench && !bench) {
			continue
		}
		if rw.name == missReasonsRow {
			out = append(out, missRows(rs)...)
			continue
		}
		out = append(out, rw)
	}
	return out
}

// missReasonsRow stands in rows for the rows missRows makes, each named
// missedPrefix + a reason.
const (
	missReasonsRow = "  miss reasons"
	missedPrefix   = "  missed: "
)

// missRows are a row for each miss reason among the top three (by computed
// tokens) of any variant, the largest share first, each cell the reason's
// share of that variant's computed tokens: "  missed: evicted   61%". One
// row of "-" when no variant has a miss.
func missRows(rs []Report) []row {
	best := map[string]float64{} // reason -> its largest share in any variant
	for i := range rs {
		for j, m := range rs[i].Tokens.TopMisses() {
			if j == 3 {
				break
			}
			best[m.Reason] = max(best[m.Reason], m.Share)
		}
	}
	if len(best) == 0 {
		return []row{{missReasonsRow, func(*Report) string { return "-" }, onlyEngine}}
	}
	reasons := slices.SortedFunc(maps.Keys(best), func(a, b string) int {
		if c := cmp.Compare(best[b], best[a]); c != 0 {
			return c
		}
		return strings.Compare(a, b)
	})
	out := make([]row, 0, len(reasons))
	for _, reason := range reasons {
		name := reason
		if name == "partial_block" {
			name = "partial"
		}
		out = append(out, row{missedPrefix + name, func(r *Report) string {
			for _, m := range r.Tokens.TopMisses() {
				if m.Reason == reason {
					return shareCell(m.Share)
				}
			}
			return "0%"
		}, onlyEngine})
	}
	return out
}

// shareCell is a share as a whole percentage, "<1%" for one that rounds to
// zero but is not.
func shareCell(f float64) string {
	s := fmt.Sprintf("%.0f%%", 100*f)
	if s == "0%" && f > 0 {
		return "<1%"
	}
	return s
}

// cell is row rw's value for r: "-" where rw is not for r's kind of run.
func (rw row) cell(r *Report) string {
	if (rw.only == onlyEngine && r.Bench != nil) || (rw.only == onlyBench && r.Bench == nil) {
		return "-"
	}
	return rw.val(r)
}

func benchServer(b *Bench) string {
	if b.Server == "" {
		return b.URL
	}
	return b.Server + " at " + b.URL
}

func benchLoad(b *Bench) string {
	var s string
	switch b.Load {
	case LoadRate:
		s = fmt.Sprintf("%g req/s (%s)", b.RatePerS, b.Arrivals)
	case LoadConcurrency:
		return fmt.Sprintf("%d in flight", b.Concurrency)
	default:
		s = "trace timestamps"
	}
	if b.Concurrency > 0 {
		s += fmt.Sprintf(", at most %d in flight", b.Concurrency)
	}
	return s
}

func benchErrors(b *Bench) string {
	var parts []string
	for _, k := range BenchErrorKinds {
		if n := b.Errors[k]; n > 0 {
			parts = append(parts, fmt.Sprintf("%s %d", k, n))
		}
	}
	if len(parts) == 0 {
		return "-"
	}
	return strings.Join(parts, " · ")
}

func benchMetrics(b *Bench) string {
	m := b.Metrics
	if m == nil {
		return "- (no /metrics counters)"
	}
	if m.PrefixQueries == 0 && m.HitRate > 0 {
		return fmt.Sprintf("%.1f%% (%s gauge)", 100*m.HitRate, m.Names)
	}
	return fmt.Sprintf("%.1f%% (%s: %s of %s)", 100*m.HitRate, m.Names, i64(m.PrefixHits), i64(m.PrefixQueries))
}

func benchGoodput(b *Bench) string {
	var lim []string
	if b.SLO.TTFTMs > 0 {
		lim = append(lim, fmt.Sprintf("ttft <= %g", b.SLO.TTFTMs))
	}
	if b.SLO.TPOTMs > 0 {
		lim = append(lim, fmt.Sprintf("tpot <= %g", b.SLO.TPOTMs))
	}
	if b.SLO.E2EMs > 0 {
		lim = append(lim, fmt.Sprintf("e2e <= %g", b.SLO.E2EMs))
	}
	if len(lim) == 0 {
		return fmt.Sprintf("%.2f (no SLO: every completed request)", b.GoodputPerS)
	}
	return fmt.Sprintf("%.2f (%d met %s ms)", b.GoodputPerS, b.Good, strings.Join(lim, ", "))
}

func dist3(d Dist, f string) string {
	if d.N == 0 {
		return "-"
	}
	return fmt.Sprintf(f+" / "+f+" / "+f, d.P50, d.P90, d.P99)
}

// maxHeader is the longest variant name WriteTable puts above its column;
// longer ones are numbered and named in a legend.
const maxHeader = 24

// resultsFrom is the first row of rows that is a run's result rather than
// its configuration.
var resultsFrom = slices.IndexFunc(rows, func(r row) bool { return r.name == "requests total" })

// isResult reports whether rw is a run's result rather than its
// configuration.
func isResult(rw row) bool {
	name := rw.name
	if strings.HasPrefix(name, missedPrefix) {
		name = missReasonsRow // a row missRows made
	}
	return slices.IndexFunc(rows, func(r row) bool { return r.name == name }) >= resultsFrom
}

// neverRan reports whether r is a variant that stopped before its engine
// took a step (a plugin that did not start, a layout refused): it has no
// figures, only its error.
func neverRan(r *Report) bool {
	if r.Bench != nil { // a bench takes no engine step: it ran when it sent a request
		return r.Status != "" && r.Status != StatusFinished && r.Requests.Total == 0
	}
	return r.Status != "" && r.Status != StatusFinished && r.Engine.Steps == 0
}

// tableWidth is the widest line WriteTable prints (a terminal's 80
// columns) when one variant a block fits in it.
const tableWidth = 80

// WriteTable prints the reports side by side, one column per variant
// (numbered, with a legend, when a name is longer than maxHeader), in as
// many blocks of columns, one under another, as keep each line within
// tableWidth. A variant that never ran shows "-" for every result and its
// error; "wall time vs first" compares with the first variant that ran.
func WriteTable(w io.Writer, rs []Report) error { return writeTable(w, rs, tableWidth) }

// writeTable is WriteTable with lines of up to width runes.
func writeTable(w io.Writer, rs []Report, width int) error {
	// Long variant names (several --vary keys) would make every column as
	// wide as its name: the columns are then numbered, and a legend above
	// the table names them.
	long := false
	for i := range rs {
		long = long || len(rs[i].Variant) > maxHeader
	}
	if long {
		for i := range rs {
			if _, err := fmt.Fprintf(w, "#%d  %s\n", i+1, rs[i].Variant); err != nil {
				return err
			}
		}
	}
	// The table as lines of cells: the row's name, then one a variant.
	head := []string{"variant"}
	for i := range rs {
		if long {
			head = append(head, fmt.Sprintf("#%d", i+1))
		} else {
			head = append(head, rs[i].Variant)
		}
	}
	lines := [][]string{head}
	for _, rw := range shownRows(rs) {
		line := []string{rw.name}
		for i := range rs {
			v := rw.cell(&rs[i])
			if isResult(rw) && rw.name != "error" && neverRan(&rs[i]) {
				v = "-"
			}
			line = append(line, v)
		}
		lines = append(lines, line)
	}
	first := slices.IndexFunc(rs, func(r Report) bool { return !neverRan(&r) && r.Engine.WallS > 0 })
	if len(rs) > 1 && first >= 0 {
		line := []string{"wall time vs first"}
		for i := range rs {
			if neverRan(&rs[i]) {
				line = append(line, "-")
				continue
			}
			line = append(line, fmt.Sprintf("%.2fx", rs[i].Engine.WallS/rs[first].Engine.WallS))
		}
		lines = append(lines, line)
	}
	cols := make([]int, len(head)) // each column's width, in runes
	for _, line := range lines {
		for c, v := range line {
			cols[c] = max(cols[c], utf8.RuneCountInString(v))
		}
	}
	// Blocks of variants: as many as fit beside the names' column.
	for from := 1; from < len(head); {
		to, used := from+1, cols[0]+2+cols[from]
		for to < len(head) && used+2+cols[to] <= width {
			used += 2 + cols[to]
			to++
		}
		if from > 1 {
			if _, err := fmt.Fprintln(w); err != nil {
				return err
			}
		}
		for _, line := range lines {
			var b strings.Builder
			b.WriteString(pad(line[0], cols[0]))
			for c := from; c < to; c++ {
				b.WriteString("  ")
				b.WriteString(pad(line[c], cols[c]))
			}
			if _, err := fmt.Fprintln(w, strings.TrimRight(b.String(), " ")); err != nil {
				return err
			}
		}
		from = to
	}
	for _, note := range timesNotes(rs, head[1:]) {
		if _, err := fmt.Fprintln(w, note); err != nil {
			return err
		}
	}
	return nil
}

// timesNotes are the table's footnotes on where its times come from, by
// each variant's Engine.Modelled (not its device's name): a line for the
// variants whose times the sim modelled, one for each cost model (its
// calibration), and one for those whose times were measured. Each line
// names its variants (labels[i] is rs[i]'s column) unless it is the only
// line, which says "times are ..." of every variant. A variant that never
// ran has no times and is in no line; a table without modelled times has
// no footnote.
func timesNotes(rs []Report, labels []string) []string {
	type clock struct {
		what     string // "simulated by ...", "measured on the device"
		variants []string
	}
	var clocks []clock
	modelled := false
	for i := range rs {
		r := &rs[i]
		if neverRan(r) {
			continue
		}
		what := "measured on the device"
		if r.Engine.Modelled {
			what, modelled = "simulated by "+costModel(r), true
		}
		j := slices.IndexFunc(clocks, func(c clock) bool { return c.what == what })
		if j < 0 {
			clocks = append(clocks, clock{what: what})
			j = len(clocks) - 1
		}
		clocks[j].variants = append(clocks[j].variants, labels[i])
	}
	if !modelled {
		return nil
	}
	if len(clocks) == 1 {
		return []string{"times are " + clocks[0].what}
	}
	out := make([]string, len(clocks))
	for i, c := range clocks {
		out[i] = "times of " + strings.Join(c.variants, ", ") + " are " + c.what
	}
	return out
}

// costModel names the cost model that simulated r's times: the roofline,
// calibrated by r's sim calibration when it has one.
func costModel(r *Report) string {
	if c := r.Config.Calibration; c != "" && c != "none" {
		return "a roofline cost model calibrated by " + c
	}
	return "an uncalibrated roofline cost model"
}

// pad is s followed by spaces to n runes.
func pad(s string, n int) string {
	return s + strings.Repeat(" ", max(0, n-utf8.RuneCountInString(s)))
}

// ceilingCell is one of r's ceilings as "1,234 (28.9%)", "-" when r has
// none.
func ceilingCell(r *Report, at func(*Ceiling) *CeilingAt) string {
	if r.Tokens.Ceiling == nil {
		return "-"
	}
	a := at(r.Tokens.Ceiling)
	if a == nil {
		return "-"
	}
	return fmt.Sprintf("%s (%.1f%%)", i64(a.Reused), 100*a.HitRate)
}

func itoa(n int) string { return i64(int64(n)) }

// i64 formats with thousands separators.
func i64(n int64) string {
	s := fmt.Sprint(n)
	neg := strings.HasPrefix(s, "-")
	if neg {
		s = s[1:]
	}
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}

// Why says why the first computed token was not reused, with the detail
// of an eviction: "evicted from the device tier by lru at 12.41 s".
func (c CacheUse) Why() string {
	if c.Reason != "evicted" {
		if w, ok := missWords[c.Reason]; ok {
			return w
		}
		return strings.ReplaceAll(c.Reason, "_", " ")
	}
	s := "evicted"
	if c.EvictedTier != "" {
		s += " from the " + c.EvictedTier + " tier"
	}
	if c.EvictedBy != "" {
		s += " by " + c.EvictedBy
	}
	if c.EvictedAtS != nil {
		s += fmt.Sprintf(" at %.2f s", *c.EvictedAtS)
	}
	return s
}

// missWords say the miss reasons other than evicted in words.
var missWords = map[string]string{
	"unknown":           "unknown (the cache manager does not explain its lookups)",
	"partial_block":     "partial block (past the last full block before the last token)",
	"never_stored":      "never stored",
	"snapshot_boundary": "past the last SSM snapshot boundary",
	"cache_salt":        "cached under another cache_salt",
	"in_flight":         "in flight (a running request is computing it)",
	"reuse_off":         "block reuse is off",
}

// WriteExplains prints, for each request id of ids and each report, its
// record among that report's records (kvx run --explain; records[i] are
// reports[i]'s); a request the run did not reach says so.
func WriteExplains(w io.Writer, ids []uint64, reports []Report, records [][]RequestRecord) error {
	for _, id := range ids {
		for i, rep := range reports {
			fmt.Fprintln(w)
			j := slices.IndexFunc(records[i], func(r RequestRecord) bool { return r.ID == id })
			if j < 0 {
				fmt.Fprintf(w, "request %d (%s): the run stopped before it\n", id, rep.Variant)
				continue
			}
			if err := WriteExplain(w, rep.Variant, records[i][j]); err != nil {
				return err
			}
		}
	}
	return nil
}

// WriteExplain prints how the prefix cache served request rec of variant
// (kvx run --explain): its prompt tokens, those reused from each tier,
// those computed and why, and its preemptions.
func WriteExplain(w io.Writer, variant string, rec RequestRecord) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "request %d (%s): %s\n", rec.ID, variant, rec.Status)
	fmt.Fprintf(tw, "  prompt tokens\t%s\n", itoa(rec.PromptTokens))
	if c := rec.Cache; c == nil {
		fmt.Fprintf(tw, "  prefix cache\tnever admitted: no lookup was taken\n")
	} else {
		fmt.Fprintf(tw, "  reused\t%s from the device tier, %s from the host tier\n", itoa(c.ReusedDevice), itoa(c.ReusedHost))
		comp := itoa(c.Computed)
		switch {
		case c.ReasonTokens > 0 && c.PartialBlockTokens > 0:
			comp += fmt.Sprintf(": %s %s, %s past the last full block", itoa(c.ReasonTokens), c.Why(), itoa(c.PartialBlockTokens))
		case c.ReasonTokens > 0:
			comp += ": " + c.Why()
		case c.Computed > 0:
			comp += ": past the last full block (partial block, or the last token)"
		}
		fmt.Fprintf(tw, "  computed\t%s\n", comp)
		fmt.Fprintf(tw, "  miss reason\t%s\n", c.Why())
	}
	fmt.Fprintf(tw, "  preemptions\t%d (recomputed %s tokens), %d suspended to the host tier\n", rec.Preemptions, itoa(rec.RecomputedTokens), rec.Suspensions)
	return tw.Flush()
}

// Bench is what kvx bench measured of a server over HTTP (core/bench); nil
// for engine runs. Its variant's other figures are the client's too:
// requests and tokens counted from the answers (tokens.prefix_reused is
// the sum of usage's prompt_tokens_details.cached_tokens), latencies in
// wall-clock ms from sending a request, throughput over the measured
// phase.
type Bench struct {
	URL string `json:"url"`
	// Server is the engine the /metrics names say it is (kvx, vllm,
	// sglang), "" when they say none.
	Server string `json:"server"`
	// Load is how requests were sent: LoadTimestamps (the workload's
	// arrival times, scaled), LoadRate (RatePerS, Poisson or constant) or
	// LoadConcurrency (a closed loop); Concurrency > 0 also caps the open
	// loops.
	Load        string  `json:"load"`
	RatePerS    float64 `json:"rate_per_s"`
	Arrivals    string  `json:"arrivals,omitempty"` // poisson or constant, for LoadRate
	Concurrency int     `json:"concurrency"`
	// DurationS is the measured phase, from its first request sent to its
	// last answer.
	DurationS float64 `json:"duration_s"`
	// Phases say what ran before the measured phase.
	Phases BenchPhases `json:"phases"`
	// Latency adds p90, the mean and the inter-token latency (ITL: the gap
	// between two streamed chunks, split among their tokens) to the
	// variant's latency.
	Latency BenchLatency `json:"latency"`
	// SLO and the requests that met it: goodput is those per second.
	SLO          SLO     `json:"slo"`
	Good         int     `json:"good_requests"`
	GoodputPerS  float64 `json:"goodput_per_s"`
	CachedTokens int64   `json:"cached_tokens"`
	// UsageRequests are the completed requests whose stream ended with a
	// usage chunk; StreamedTokens the tokens counted in the streams (token
	// ids, else one per chunk with text) and UsageTokens the sum of
	// usage.completion_tokens; TokenMismatches the requests where the two
	// differ.
	UsageRequests   int   `json:"usage_requests"`
	StreamedTokens  int64 `json:"streamed_tokens"`
	UsageTokens     int64 `json:"usage_tokens"`
	TokenMismatches int   `json:"token_mismatches"`
	// Errors counts the requests that failed, by kind (BenchErrorKinds).
	Errors map[string]int `json:"errors"`
	// Metrics is what the server's /metrics counted over the measured
	// phase (after minus before); nil when it has none that kvx reads.
	Metrics *ServerMetrics `json:"server_metrics,omitempty"`
	// Notes say what could not be done (a flush the server refused, a
	// /metrics that is not Prometheus text).
	Notes []string `json:"notes"`
}

// Values of Bench.Load.
const (
	LoadTimestamps  = "timestamps"
	LoadRate        = "rate"
	LoadConcurrency = "concurrency"
)

// BenchErrorKinds are the kinds of failed requests Bench.Errors counts:
// connect (refused, reset before an answer, DNS), timeout (the request's or
// the run's deadline), http_4xx and http_5xx (an answer of that status),
// http_other (another status but 200: a redirect, which is never followed),
// content_type (200 but not text/event-stream), bad_sse (a line that is not
// an event, JSON that does not parse, a line or a stream past its bound,
// more events than tokens asked), stream_error (an error event in the
// stream), cut (the stream ended before data: [DONE]).
var BenchErrorKinds = []string{"connect", "timeout", "http_4xx", "http_5xx", "http_other", "content_type", "bad_sse", "stream_error", "cut"}

// BenchPhases are the phases before the measured one.
type BenchPhases struct {
	Warmup int `json:"warmup_requests"`
	// Flush is "ok" when the server dropped its prefix cache, "off" when
	// not asked, else why not.
	Flush string `json:"flush"`
	// FlushEndpoint is the path that answered (/reset_prefix_cache,
	// /flush_cache).
	FlushEndpoint string `json:"flush_endpoint,omitempty"`
	// Prime counts the shared prefixes sent once before measuring.
	Prime int `json:"prime_requests"`
}

// BenchLatency are percentiles and means in ms.
type BenchLatency struct {
	TTFT Dist `json:"ttft_ms"`
	TPOT Dist `json:"tpot_ms"`
	ITL  Dist `json:"itl_ms"`
	E2E  Dist `json:"e2e_ms"`
}

// Dist summarises one latency.
type Dist struct {
	N    int     `json:"n"`
	Mean float64 `json:"mean"`
	P50  float64 `json:"p50"`
	P90  float64 `json:"p90"`
	P99  float64 `json:"p99"`
}

// NewDist summarises xs (sorted in place).
func NewDist(xs []float64) Dist {
	d := Dist{N: len(xs)}
	if len(xs) == 0 {
		return d
	}
	var sum float64
	for _, x := range xs {
		sum += x
	}
	d.Mean = sum / float64(len(xs))
	d.P50, d.P90, d.P99 = Percentile(xs, 50), Percentile(xs, 90), Percentile(xs, 99)
	return d
}

// SLO bounds a good request: each limit in ms, 0 for none.
type SLO struct {
	TTFTMs float64 `json:"ttft_ms"`
	TPOTMs float64 `json:"tpot_ms"`
	E2EMs  float64 `json:"e2e_ms"`
}

// ServerMetrics are a server's Prometheus counters over the measured
// phase. PrefixQueries and PrefixHits are prompt tokens (vLLM's
// prefix_cache_queries and prefix_cache_hits, kvx's the same names);
// HitRate is their ratio, or the server's own gauge where it exports only
// that (sglang:cache_hit_rate, at the end).
type ServerMetrics struct {
	Names            string  `json:"names"` // the metric prefix read: kvx, vllm, sglang
	PrefixQueries    int64   `json:"prefix_queries"`
	PrefixHits       int64   `json:"prefix_hits"`
	HitRate          float64 `json:"hit_rate"`
	PromptTokens     int64   `json:"prompt_tokens"`
	GenerationTokens int64   `json:"generation_tokens"`
	Preemptions      int64   `json:"preemptions"`
}
