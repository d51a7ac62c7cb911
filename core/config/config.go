// Package config is the kvx engine configuration: typed fields, defaults,
// loading and validation.
//
// # Sources and precedence
//
// Load reads, lowest precedence first:
//
//  1. YAML files, in the order given (a later file overrides an earlier one
//     key by key). A TensorRT-LLM extra-llm-api-config.yml loads unchanged
//     once the kvx keys (model, hardware, ...) are added.
//  2. Environment variables KVX_<KEY>: the rest of the name is lower-cased and
//     a double underscore nests, so KVX_KV_CACHE_CONFIG__TOKENS_PER_BLOCK=64
//     sets kv_cache_config.tokens_per_block (single underscores stay part of
//     the key name). Every KVX_ variable is a config key: an unknown one is an
//     error like any unknown key. The one exception is KVX_REATTACH_*, the
//     variables through which core/host attaches to a plugin running in the
//     SDK's debug mode (plugins/sdk.ReattachEnvPrefix): Load skips them.
//  3. --set key=value pairs, in order: dotted keys; the value is read as a YAML
//     scalar or flow collection ("64", "fp8", "[0.5, 0.5]", "{min: 1, max: 9}",
//     "null" to unset).
//
// Env and --set values are parsed as YAML, so KVX_MAX_BATCH_SIZE=8 is an int.
//
// # Keys
//
// Key names follow TensorRT-LLM's LLM API where one exists; KnownKeys lists
// them. TensorRT-LLM keys that kvx does not model (IgnoredKeys) load with one
// notice each. Every other unknown key, wrong type, out-of-range value and
// failed cross-field rule is an error that names the key, the value, where it
// came from and what is allowed; Load reports all of them at once.
//
// A Config is a plain value: safe for concurrent reads, not for writes.
package config

import (
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"

	"github.com/knadh/koanf/parsers/yaml"
	"github.com/knadh/koanf/providers/confmap"
	kenv "github.com/knadh/koanf/providers/env/v2"
	"github.com/knadh/koanf/providers/file"
	"github.com/knadh/koanf/v2"
	yamlv3 "go.yaml.in/yaml/v3"

	"github.com/kvx-dev/kvx/core/hw"
	"github.com/kvx-dev/kvx/core/model"
	"github.com/kvx-dev/kvx/plugins/v1/spec"
)

// Config is the engine configuration. Load fills every field: defaults,
// then the sources, then values derived from the model (MaxSeqLen,
// AttentionBackend, CacheManager, speculative lengths).
type Config struct {
	// kvx keys.
	Model            string   // model: preset name or path to a config.json (required)
	Hardware         string   // hardware: a core/hw preset name (h200)
	Device           string   // device: sim, cpu or cuda (sim)
	CacheManager     string   // cache_manager: v1, v2, mamba or a plugin path (mamba for hybrid models, else v2)
	AttentionBackend string   // attention_backend: dsa, mla or gqa (from the model)
	Isolation        string   // isolation: plugin or inprocess (plugin)
	PluginTransport  string   // plugin_transport: auto (gRPC plus a framed data plane for per-step calls when the plugin offers one) or grpc (auto)
	WeightsDtype     string   // weights_dtype: bf16, fp8, fp4 or w4afp8 (bf16)
	PluginDirs       []string // plugin_dirs
	Seed             uint64   // seed (0)
	// StepOverlap is step_overlap: auto schedules the next step while the
	// workers run the last one, where that cannot change the result (two
	// pipeline stages); off waits for every forward first (auto).
	StepOverlap string
	// CheckInvariants is check_invariants: inspect the managers every N steps;
	// 0 = off ("off"), 1 = every step ("every", the default).
	CheckInvariants int
	DeepCheckEvery  int // deep_check_every: steps between deep checks; 0 = never (64)

	// TensorRT-LLM keys.
	MaxBatchSize         int  // max_batch_size (64)
	MaxNumTokens         int  // max_num_tokens (8192)
	MaxSeqLen            int  // max_seq_len (the model's max_position_embeddings)
	EnableChunkedPrefill bool // enable_chunked_prefill (false)
	TensorParallelSize   int  // tensor_parallel_size (1)
	PipelineParallelSize int  // pipeline_parallel_size (1)
	ExpertParallelSize   int  // expert_parallel_size, alias moe_expert_parallel_size (1); divides tensor_parallel_size

	KVCache     KVCacheConfig     // kv_cache_config
	MambaState  MambaStateConfig  // mamba_state_config (also accepted as kv_cache_config.mamba_state_config)
	Speculative SpeculativeConfig // speculative_config
	Scheduler   SchedulerConfig   // scheduler_config
	Workload    WorkloadConfig    // workload
	// Synthetic is synthetic: overrides for the small synthetic model that
	// device cpu runs instead of the full model (keys synthetic.<field> in
	// snake_case, see model.SyntheticFields; 0 = default). Accepted only
	// with device: cpu. With speculative decoding on and synthetic.mtp_layers
	// unset, the synthetic model gets max(base MTP layers, max_draft_len,
	// num_nextn_predict_layers) MTP layers: one per draft depth.
	Synthetic model.SyntheticSpec

	model    spec.Model
	hardware spec.Hardware
}

// KVCacheConfig is kv_cache_config.
type KVCacheConfig struct {
	EnableBlockReuse      bool      // enable_block_reuse (true)
	TokensPerBlock        int       // tokens_per_block: a power of two (32)
	FreeGPUMemoryFraction float64   // free_gpu_memory_fraction in (0, 1] (0.9)
	AvgSeqLen             int       // avg_seq_len: sizing hint; 0 = unset; <= max_seq_len
	MaxTokens             int       // max_tokens: cap on cached tokens; 0 = unset
	HostCacheSize         *int64    // host_cache_size in bytes; nil = unset (the manager decides), 0 = no host tier
	Dtype                 string    // dtype: auto, bf16 or fp8 (auto)
	MambaSSMCacheDtype    string    // mamba_ssm_cache_dtype: auto, float32, float16 or bfloat16 (auto)
	PoolRatio             []float64 // pool_ratio: initial split per pool group, sums to 1; nil = unset
	EnablePartialReuse    bool      // enable_partial_reuse (true)
	CopyOnPartialReuse    bool      // copy_on_partial_reuse (true)
}

// MambaStateConfig is mamba_state_config: where SSM snapshots are taken.
type MambaStateConfig struct {
	// PeriodicSnapshotInterval takes a snapshot every N tokens; 0 = off.
	// A multiple of kv_cache_config.tokens_per_block.
	PeriodicSnapshotInterval int
	// AdditionalSnapshotOffsetsFromEnd takes snapshots this many tokens
	// before the end of each prompt (0 = at the end).
	AdditionalSnapshotOffsetsFromEnd []int
}

// SpeculativeConfig is speculative_config. Only MTP is modelled.
type SpeculativeConfig struct {
	DecodingType          string  // decoding_type: "" (off) or MTP
	NumNextNPredictLayers int     // num_nextn_predict_layers (default max_draft_len, else 1)
	MaxDraftLen           int     // max_draft_len (default num_nextn_predict_layers)
	AcceptanceRate        float64 // acceptance_rate in [0, 1]: kvx, sim only (0.7)
}

// Enabled reports whether speculative decoding is on.
func (s SpeculativeConfig) Enabled() bool { return s.DecodingType != "" }

// SchedulerConfig is scheduler_config.
type SchedulerConfig struct {
	CapacitySchedulerPolicy string // GUARANTEED_NO_EVICT (default) or MAX_UTILIZATION
	ContextChunkingPolicy   string // FIRST_COME_FIRST_SERVED (default) or EQUAL_PROGRESS
}

// Range is an inclusive [Min, Max] token count; zero = unset.
type Range struct{ Min, Max int }

// WorkloadConfig is workload: a Mooncake trace or a generator, not both.
type WorkloadConfig struct {
	// Trace mode.
	Trace     string  // trace: path to a Mooncake JSONL file; relative to the YAML file that sets it, else to the working directory
	Limit     int     // limit: replay the first N lines; 0 = all
	TimeScale float64 // time_scale > 0 multiplies trace timestamps (1)

	// Generator mode.
	Requests           int     // requests >= 1 selects the generator
	Rate               float64 // rate in req/s; 0 = all at t=0. Must be 0 when concurrency > 0
	PromptTokens       Range   // prompt_tokens: {min, max} or one int
	OutputTokens       Range   // output_tokens: {min, max} or one int
	SharedPrefixTokens int     // shared_prefix_tokens <= prompt_tokens.min (0)
	SharedPrefixGroups int     // shared_prefix_groups >= 1 (1)

	// Both.
	Concurrency int    // concurrency: closed loop with N in flight; 0 = open loop
	Seed        uint64 // seed (default: the top-level seed)
}

// Workload kinds returned by WorkloadConfig.Kind.
const (
	WorkloadNone      = ""
	WorkloadTrace     = "trace"
	WorkloadGenerator = "generator"
)

// Kind reports which workload is configured: WorkloadTrace, WorkloadGenerator
// or WorkloadNone (serve mode, or a workload given on the command line).
func (w WorkloadConfig) Kind() string {
	switch {
	case w.Trace != "":
		return WorkloadTrace
	case w.Requests > 0:
		return WorkloadGenerator
	}
	return WorkloadNone
}

// ModelSpec returns the loaded model (buffers not filled): with device cpu,
// the synthetic model built from the configured one and Synthetic. The
// Layers slice is a copy the caller owns.
func (c *Config) ModelSpec() spec.Model {
	m := c.model
	m.Layers = slices.Clone(m.Layers)
	return m
}

// HardwareSpec returns the hardware preset named by Hardware.
func (c *Config) HardwareSpec() spec.Hardware { return c.hardware }

// Dtypes returns the cache dtypes for model.FillBuffers (conv state: auto).
func (c *Config) Dtypes() model.Dtypes {
	return model.Dtypes{KV: c.KVCache.Dtype, SSM: c.KVCache.MambaSSMCacheDtype, Conv: "auto"}
}

func defaults() *Config {
	return &Config{
		Hardware:             "h200",
		Device:               "sim",
		Isolation:            "plugin",
		PluginTransport:      "auto",
		StepOverlap:          "auto",
		WeightsDtype:         "bf16",
		CheckInvariants:      1,
		DeepCheckEvery:       64,
		MaxBatchSize:         64,
		MaxNumTokens:         8192,
		TensorParallelSize:   1,
		PipelineParallelSize: 1,
		ExpertParallelSize:   1,
		KVCache: KVCacheConfig{
			EnableBlockReuse:      true,
			TokensPerBlock:        32,
			FreeGPUMemoryFraction: 0.9,
			Dtype:                 "auto",
			MambaSSMCacheDtype:    "auto",
			EnablePartialReuse:    true,
			CopyOnPartialReuse:    true,
		},
		Speculative: SpeculativeConfig{AcceptanceRate: 0.7},
		Scheduler: SchedulerConfig{
			CapacitySchedulerPolicy: "GUARANTEED_NO_EVICT",
			ContextChunkingPolicy:   "FIRST_COME_FIRST_SERVED",
		},
		Workload: WorkloadConfig{TimeScale: 1, SharedPrefixGroups: 1},
	}
}

// EnvPrefix starts every environment variable that Load reads.
const EnvPrefix = "KVX_"

// ReattachEnvPrefix starts the variables Load skips: plugins/sdk's
// reattach variables (sdk.ReattachEnvPrefix; a test keeps them equal).
const ReattachEnvPrefix = EnvPrefix + "REATTACH_"

// origin says where a value came from, for messages.
type origin struct {
	where string // "file a.yaml", "env KVX_X", "--set"
	rank  int    // source order: later sources override earlier ones
	file  string // the YAML file, when the value came from one
}

// Load builds the configuration from YAML files, then env (a list of
// "NAME=value" strings, e.g. os.Environ(); only KVX_ names are read), then
// sets ("key=value"), each overriding the previous. It returns the config,
// the notices (ignored keys, values beyond the model's limits) and nil; or
// nil, the notices found so far and every error found, joined.
func Load(files []string, env []string, sets []string) (*Config, []string, error) {
	ld := &loader{origins: map[string]origin{}}
	merged := koanf.New(".")
	rank := 0
	for _, f := range files {
		k := koanf.New(".")
		if err := k.Load(file.Provider(f), yaml.Parser()); err != nil {
			ld.errs = append(ld.errs, fmt.Errorf("config file %s: %w", f, err))
			continue
		}
		ld.merge(merged, k, func(string) string { return "file " + f }, rank)
		for key := range k.All() {
			o := ld.origins[key]
			o.file = f
			ld.origins[key] = o
		}
		rank++
	}

	envNames := map[string]string{}
	k := koanf.New(".")
	err := k.Load(kenv.Provider(".", kenv.Opt{
		Prefix:      EnvPrefix,
		EnvironFunc: func() []string { return env },
		TransformFunc: func(name, value string) (string, any) {
			if strings.HasPrefix(name, ReattachEnvPrefix) {
				return "", nil // read by core/host, not a config key
			}
			key := strings.ToLower(strings.ReplaceAll(strings.TrimPrefix(name, EnvPrefix), "__", "."))
			if key == "" {
				return "", nil
			}
			envNames[key] = name
			return key, parseScalar(value)
		},
	}), nil)
	if err != nil { // the env provider does not fail, but the contract allows it
		ld.errs = append(ld.errs, fmt.Errorf("environment: %w", err))
	} else {
		ld.merge(merged, k, func(key string) string { return "env " + envNameFor(envNames, key) }, rank)
	}
	rank++

	for _, s := range sets {
		key, value, ok := strings.Cut(s, "=")
		key = strings.TrimSpace(key)
		if !ok || key == "" {
			ld.errs = append(ld.errs, fmt.Errorf("--set %q: want key=value", s))
			continue
		}
		var v any
		if err := yamlv3.Unmarshal([]byte(value), &v); err != nil {
			ld.errs = append(ld.errs, fmt.Errorf("--set %s: value %q is not a YAML scalar or flow list: %v", key, value, err))
			continue
		}
		k := koanf.New(".")
		_ = k.Load(confmap.Provider(map[string]any{key: v}, "."), nil) // confmap cannot fail
		ld.merge(merged, k, func(string) string { return "--set" }, rank)
		rank++
	}

	c := defaults()
	ld.apply(c, merged.All())
	ld.resolve(c)
	if len(ld.errs) > 0 {
		return nil, ld.notices, errors.Join(ld.errs...)
	}
	return c, ld.notices, nil
}

// envNameFor finds the variable that produced key (or the section above it).
func envNameFor(names map[string]string, key string) string {
	for k := key; ; {
		if n, ok := names[k]; ok {
			return n
		}
		i := strings.LastIndexByte(k, '.')
		if i < 0 {
			return EnvPrefix + strings.ToUpper(strings.ReplaceAll(key, ".", "__"))
		}
		k = k[:i]
	}
}

// parseScalar reads an env value as YAML; a value YAML cannot read stays a string.
func parseScalar(s string) any {
	var v any
	if err := yamlv3.Unmarshal([]byte(s), &v); err != nil {
		return s
	}
	return v
}

type loader struct {
	origins map[string]origin // flattened key -> last source that set it
	errs    []error
	notices []string
	bad     map[string]bool // canonical keys whose value was rejected
	given   map[string]bool // canonical keys given a non-null value
}

func (ld *loader) merge(into, from *koanf.Koanf, where func(key string) string, rank int) {
	for key := range from.All() {
		ld.origins[key] = origin{where: where(key), rank: rank}
	}
	_ = into.Merge(from) // the default merge cannot fail
}

func (ld *loader) originOf(key string) origin {
	if o, ok := ld.origins[key]; ok {
		return o
	}
	// A map value reported under its section: find any key below it.
	best := origin{where: "?"}
	for k, o := range ld.origins {
		if strings.HasPrefix(k, key+".") && o.rank >= best.rank {
			best = o
		}
	}
	return best
}

// valueErr formats "<key>: <value> (<origin>) <problem>".
func (ld *loader) valueErr(key string, v any, problem string) {
	ld.errs = append(ld.errs, fmt.Errorf("%s: %s (%s) %s", key, show(v), ld.originOf(key).where, problem))
}

// show renders a value for messages.
func show(v any) string {
	switch x := v.(type) {
	case nil:
		return "null"
	case string:
		return fmt.Sprintf("%q", x)
	case map[string]any:
		return "a map"
	case []any:
		parts := make([]string, len(x))
		for i, e := range x {
			parts[i] = show(e)
		}
		return "[" + strings.Join(parts, ", ") + "]"
	case float64:
		return fmtFloat(x)
	}
	return fmt.Sprint(v)
}

// apply sets every field from the merged flattened map.
func (ld *loader) apply(c *Config, flat map[string]any) {
	ld.bad = map[string]bool{}
	ld.given = map[string]bool{}
	keys := make([]string, 0, len(flat))
	for k := range flat {
		keys = append(keys, k)
	}
	sort.Strings(keys)

	type setBy struct {
		raw string
		v   any
		o   origin
	}
	chosen := map[string]setBy{} // canonical key -> winning raw key
	ignored := map[string]bool{}
	typeReported := map[string]bool{}
	for _, raw := range keys {
		v := flat[raw]
		canon := raw
		if a, ok := aliases[raw]; ok {
			canon = a
		}
		if _, ok := fieldsByKey[canon]; ok {
			if m, isMap := v.(map[string]any); v == nil || (isMap && len(m) == 0) {
				continue // null or {} = unset
			}
			o := ld.originOf(raw)
			if prev, ok := chosen[canon]; ok {
				switch {
				case prev.o.rank > o.rank:
					continue
				case prev.o.rank == o.rank && show(prev.v) != show(v):
					ld.errs = append(ld.errs, fmt.Errorf("%s: %s and %s: %s (%s) name the same setting with different values",
						canon, prev.raw, raw, show(prev.v)+" vs "+show(v), o.where))
					ld.bad[canon] = true
					continue
				}
			}
			chosen[canon] = setBy{raw, v, o}
			continue
		}
		if ig := ignoredFor(raw); ig != "" {
			ignored[ig] = true
			continue
		}
		if leaf, ok := leafAbove(raw); ok { // e.g. max_batch_size.x: a map where a value belongs
			if !typeReported[leaf] {
				typeReported[leaf] = true
				ld.bad[leaf] = true
				f := fieldsByKey[leaf]
				ld.valueErr(leaf, map[string]any{}, "is not "+f.kind)
			}
			continue
		}
		if sections[raw] {
			if m, ok := v.(map[string]any); (ok && len(m) == 0) || v == nil {
				continue // empty or null section
			}
			ld.valueErr(raw, v, "is not a map")
			continue
		}
		ld.errs = append(ld.errs, unknownKeyError(raw, ld.originOf(raw).where))
	}
	canons := make([]string, 0, len(chosen))
	for k := range chosen {
		canons = append(canons, k)
	}
	sort.Strings(canons)
	for _, canon := range canons {
		s := chosen[canon]
		f := fieldsByKey[canon]
		if problem := f.set(c, s.v); problem != "" {
			ld.bad[canon] = true
			ld.errs = append(ld.errs, fmt.Errorf("%s: %s (%s) %s", s.raw, show(s.v), s.o.where, problem))
			continue
		}
		ld.given[f.key] = true
		for _, k := range f.also { // a one-number range sets both bounds
			ld.given[k] = true
		}
	}
	for _, ig := range slices.Sorted(mapKeys(ignored)) {
		ld.notices = append(ld.notices, fmt.Sprintf("key %s has no effect in kvx", ig))
	}
}

func mapKeys[K comparable, V any](m map[K]V) func(func(K) bool) {
	return func(yield func(K) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// leafAbove returns the known leaf key that is a strict prefix of raw.
func leafAbove(raw string) (string, bool) {
	for i := strings.IndexByte(raw, '.'); i >= 0; {
		p := raw[:i]
		if a, ok := aliases[p]; ok {
			p = a
		}
		if f, ok := fieldsByKey[p]; ok && !f.shorthand {
			return p, true
		}
		j := strings.IndexByte(raw[i+1:], '.')
		if j < 0 {
			break
		}
		i += 1 + j
	}
	return "", false
}

// ignoredFor returns the ignored key that raw is or is under, or "".
func ignoredFor(raw string) string {
	for _, ig := range ignoredKeys {
		if raw == ig || strings.HasPrefix(raw, ig+".") {
			return ig
		}
	}
	return ""
}

func unknownKeyError(raw, where string) error {
	s, close := suggest(raw)
	switch {
	case s == "":
		return fmt.Errorf("unknown key %q (%s)", raw, where)
	case close:
		return fmt.Errorf("unknown key %q (%s); did you mean %q?", raw, where, s)
	}
	return fmt.Errorf("unknown key %q (%s); nearest known key: %q", raw, where, s)
}

// crossErr records a failed rule between fields.
func (ld *loader) crossErr(format string, args ...any) {
	ld.errs = append(ld.errs, fmt.Errorf(format, args...))
}

// anyBad reports whether one of keys had its own error (cross rules on it are skipped).
func (ld *loader) anyBad(keys ...string) bool {
	for _, k := range keys {
		if ld.bad[k] {
			return true
		}
	}
	return false
}

// resolve fills model-derived defaults and checks cross-field rules.
func (ld *loader) resolve(c *Config) {
	// Hardware.
	if !ld.bad["hardware"] {
		h, err := hw.Lookup(c.Hardware)
		if err != nil {
			ld.valueErr("hardware", c.Hardware, "is not one of "+strings.Join(hw.Names(), ", "))
			ld.bad["hardware"] = true
		}
		c.hardware = h
	}

	// Model.
	haveModel := false
	switch {
	case ld.bad["model"]:
	case c.Model == "":
		ld.crossErr("model: missing; give a preset (%s) or a path to a config.json", strings.Join(model.Presets(), ", "))
	default:
		m, err := model.Load(c.Model)
		if err != nil {
			ld.crossErr("model: %q (%s): %v", c.Model, ld.originOf("model").where, err)
		} else {
			c.model, haveModel = m, true
		}
	}
	haveModel = ld.resolveSynthetic(c, haveModel)

	kv := &c.KVCache
	if c.MaxSeqLen == 0 && haveModel {
		c.MaxSeqLen = c.model.MaxPosition
	}
	if haveModel && c.MaxSeqLen > c.model.MaxPosition && !ld.bad["max_seq_len"] {
		ld.notices = append(ld.notices, fmt.Sprintf("max_seq_len %d exceeds the model's max_position_embeddings %d",
			c.MaxSeqLen, c.model.MaxPosition))
	}
	if kv.AvgSeqLen > 0 && c.MaxSeqLen > 0 && kv.AvgSeqLen > c.MaxSeqLen && !ld.anyBad("kv_cache_config.avg_seq_len", "max_seq_len") {
		ld.crossErr("kv_cache_config.avg_seq_len: %d exceeds max_seq_len %d", kv.AvgSeqLen, c.MaxSeqLen)
	}
	if c.MaxNumTokens < kv.TokensPerBlock && !ld.anyBad("max_num_tokens", "kv_cache_config.tokens_per_block") {
		ld.crossErr("max_num_tokens: %d is less than kv_cache_config.tokens_per_block %d", c.MaxNumTokens, kv.TokensPerBlock)
	}
	if kv.MaxTokens > 0 && kv.MaxTokens < kv.TokensPerBlock && !ld.anyBad("kv_cache_config.max_tokens", "kv_cache_config.tokens_per_block") {
		ld.crossErr("kv_cache_config.max_tokens: %d is less than kv_cache_config.tokens_per_block %d", kv.MaxTokens, kv.TokensPerBlock)
	}
	if len(kv.PoolRatio) > 0 && !ld.bad["kv_cache_config.pool_ratio"] {
		sum := 0.0
		for _, r := range kv.PoolRatio {
			sum += r
		}
		if math.Abs(sum-1) > 1e-6 {
			ld.crossErr("kv_cache_config.pool_ratio: %s sums to %s; the ratios must sum to 1", show(anySlice(kv.PoolRatio)), fmtFloat(sum))
		}
	}
	if iv := c.MambaState.PeriodicSnapshotInterval; iv > 0 && iv%kv.TokensPerBlock != 0 &&
		!ld.anyBad("mamba_state_config.periodic_snapshot_interval", "kv_cache_config.tokens_per_block") {
		ld.crossErr("mamba_state_config.periodic_snapshot_interval: %d is not a multiple of kv_cache_config.tokens_per_block %d (snapshots sit on block boundaries)",
			iv, kv.TokensPerBlock)
	}
	tp := c.TensorParallelSize
	if c.ExpertParallelSize > 0 && tp%c.ExpertParallelSize != 0 && !ld.anyBad("expert_parallel_size", "tensor_parallel_size") {
		ld.crossErr("expert_parallel_size: %d does not divide tensor_parallel_size %d", c.ExpertParallelSize, tp)
	}
	if c.Speculative.Enabled() {
		s := &c.Speculative
		switch {
		case s.NumNextNPredictLayers == 0 && s.MaxDraftLen == 0:
			s.NumNextNPredictLayers, s.MaxDraftLen = 1, 1
		case s.NumNextNPredictLayers == 0:
			s.NumNextNPredictLayers = s.MaxDraftLen
		case s.MaxDraftLen == 0:
			s.MaxDraftLen = s.NumNextNPredictLayers
		}
	} else {
		for _, k := range []string{"speculative_config.num_nextn_predict_layers", "speculative_config.max_draft_len", "speculative_config.acceptance_rate"} {
			if ld.given[k] {
				ld.crossErr("%s: set without speculative_config.decoding_type (MTP)", k)
			}
		}
		c.Speculative = SpeculativeConfig{AcceptanceRate: c.Speculative.AcceptanceRate}
	}
	ld.resolveWorkload(c)
	if haveModel {
		ld.resolveModel(c)
	}
}

// resolveSynthetic checks the synthetic keys against device and, with device
// cpu, replaces the model by its synthetic version. It returns whether a
// model is still at hand.
func (ld *loader) resolveSynthetic(c *Config, haveModel bool) bool {
	var given []string
	for _, f := range model.SyntheticFields() {
		if k := "synthetic." + f.Key; ld.given[k] {
			given = append(given, k)
		}
	}
	if c.Device != "cpu" {
		if len(given) > 0 && !ld.bad["device"] {
			where := "default"
			if ld.given["device"] {
				where = ld.originOf("device").where
			}
			ld.crossErr("%s: set with device %q (%s); synthetic models run only with device: cpu",
				strings.Join(given, ", "), c.Device, where)
		}
		return haveModel
	}
	if c.TensorParallelSize > 1 && !ld.bad["tensor_parallel_size"] {
		ld.crossErr("tensor_parallel_size: %d with device cpu (%s): the cpu device runs one rank per stage; set 1",
			c.TensorParallelSize, ld.originOf("tensor_parallel_size").where)
	}
	if !haveModel {
		return false
	}
	for _, f := range model.SyntheticFields() {
		if ld.bad["synthetic."+f.Key] {
			return false
		}
	}
	sp := c.Synthetic
	if s := c.Speculative; sp.MTPLayers == 0 && s.Enabled() && c.model.NumNextN > 0 {
		// The synthetic MTP head runs one MTP layer per draft depth.
		sp.MTPLayers = max(c.model.NumNextN, s.MaxDraftLen, s.NumNextNPredictLayers)
	}
	m, err := model.Synthetic(c.model, sp)
	if err != nil {
		errs := []error{err}
		if j, ok := err.(interface{ Unwrap() []error }); ok {
			errs = j.Unwrap()
		}
		for _, e := range errs {
			ld.crossErr("%v (synthetic model of %q for device cpu)", e, c.Model)
		}
		return false
	}
	c.model = m
	return true
}

// resolveModel applies the rules that need the model.
func (ld *loader) resolveModel(c *Config) {
	m := c.model
	var dsa, mla, mamba bool
	for _, l := range m.Layers {
		switch l.Mixer {
		case spec.MixerDSA:
			dsa = true
		case spec.MixerMLA:
			mla = true
		case spec.MixerMamba:
			mamba = true
		}
	}
	kind := "gqa"
	switch {
	case dsa:
		kind = "dsa"
	case mla:
		kind = "mla"
	}
	if c.AttentionBackend == "" {
		c.AttentionBackend = kind
	} else if !ld.bad["attention_backend"] {
		ok := c.AttentionBackend == kind || (c.AttentionBackend == "mla" && kind == "dsa")
		if !ok {
			allowed := kind
			if kind == "dsa" {
				allowed = "dsa or mla (dense A/B)"
			}
			ld.crossErr("attention_backend: %q does not fit model %q, whose attention is %s; allowed: %s",
				c.AttentionBackend, m.Name, kind, allowed)
		}
	}
	if c.CacheManager == "" {
		c.CacheManager = "v2"
		if mamba {
			c.CacheManager = "mamba"
		}
	}
	if !mamba && (ld.given["mamba_state_config.periodic_snapshot_interval"] || ld.given["mamba_state_config.additional_snapshot_offsets_from_end"]) {
		ld.notices = append(ld.notices, fmt.Sprintf("mamba_state_config has no effect: model %q has no Mamba layers", m.Name))
	}
	if !ld.anyBad("pipeline_parallel_size") {
		if _, err := model.SplitStages(m, c.PipelineParallelSize); err != nil {
			ld.crossErr("pipeline_parallel_size: %v", err)
		}
	}
	if !ld.anyBad("tensor_parallel_size", "kv_cache_config.dtype", "kv_cache_config.mamba_ssm_cache_dtype") {
		probe := c.ModelSpec()
		if err := model.FillBuffers(&probe, c.Dtypes(), c.TensorParallelSize); err != nil {
			ld.crossErr("tensor_parallel_size: %v", err)
		}
	}
	if ep := c.ExpertParallelSize; ep > 1 && !ld.bad["expert_parallel_size"] {
		if m.Experts == 0 {
			ld.crossErr("expert_parallel_size: %d needs a MoE model; model %q has no experts", ep, m.Name)
		} else if m.Experts%ep != 0 {
			ld.crossErr("expert_parallel_size: %d does not divide the %d experts of model %q", ep, m.Experts, m.Name)
		}
	}
	if c.Speculative.Enabled() && m.NumNextN == 0 && !ld.bad["speculative_config.decoding_type"] {
		ld.crossErr("speculative_config.decoding_type: MTP needs MTP layers; model %q has num_nextn_predict_layers 0", m.Name)
	}
	w := c.Workload
	if w.Kind() == WorkloadGenerator && w.PromptTokens.Max > 0 && c.MaxSeqLen > 0 && w.PromptTokens.Max+w.OutputTokens.Max > c.MaxSeqLen {
		ld.notices = append(ld.notices, fmt.Sprintf("workload: prompt_tokens.max %d + output_tokens.max %d exceeds max_seq_len %d; such requests will be rejected",
			w.PromptTokens.Max, w.OutputTokens.Max, c.MaxSeqLen))
	}
}

func (ld *loader) resolveWorkload(c *Config) {
	w := &c.Workload
	if !ld.given["workload.seed"] {
		w.Seed = c.Seed
	}
	genKeys := []string{"workload.requests", "workload.rate", "workload.prompt_tokens", "workload.prompt_tokens.min", "workload.prompt_tokens.max",
		"workload.output_tokens", "workload.output_tokens.min", "workload.output_tokens.max", "workload.shared_prefix_tokens", "workload.shared_prefix_groups"}
	// given reports a key the user wrote: a one-number range hides its .min and .max.
	given := func(k string) bool {
		if p, ok := strings.CutSuffix(k, ".min"); ok && ld.given[p] {
			return false
		}
		if p, ok := strings.CutSuffix(k, ".max"); ok && ld.given[p] {
			return false
		}
		return ld.given[k]
	}
	traceKeys := []string{"workload.limit", "workload.time_scale"}
	switch {
	case ld.given["workload.trace"] && ld.given["workload.requests"]:
		ld.crossErr("workload: trace %q and requests %d are exclusive: a workload is a trace or a generator", w.Trace, w.Requests)
	case ld.given["workload.trace"]:
		for _, k := range genKeys {
			if given(k) {
				ld.crossErr("%s: a generator key, but workload.trace is set", k)
			}
		}
		if !ld.bad["workload.trace"] {
			// A relative path in a YAML file is relative to that file.
			if o := ld.originOf("workload.trace"); o.file != "" && !filepath.IsAbs(w.Trace) {
				w.Trace = filepath.Join(filepath.Dir(o.file), w.Trace)
			}
			if fi, err := os.Stat(w.Trace); err != nil {
				ld.crossErr("workload.trace: %v", err)
			} else if fi.IsDir() {
				ld.crossErr("workload.trace: %q is a directory, not a Mooncake JSONL file", w.Trace)
			}
		}
	case ld.given["workload.requests"]:
		for _, k := range traceKeys {
			if ld.given[k] {
				ld.crossErr("%s: a trace key, but workload.requests selects the generator", k)
			}
		}
		ld.resolveRange("workload.prompt_tokens", &w.PromptTokens)
		ld.resolveRange("workload.output_tokens", &w.OutputTokens)
		if w.SharedPrefixTokens > w.PromptTokens.Min && w.PromptTokens.Min > 0 && !ld.anyBad("workload.shared_prefix_tokens") {
			ld.crossErr("workload.shared_prefix_tokens: %d exceeds workload.prompt_tokens.min %d", w.SharedPrefixTokens, w.PromptTokens.Min)
		}
		if w.Rate > 0 && w.Concurrency > 0 && !ld.anyBad("workload.rate", "workload.concurrency") {
			ld.crossErr("workload.rate: %s must be 0 when workload.concurrency (%d) is set: a closed loop has no arrival rate", fmtFloat(w.Rate), w.Concurrency)
		}
	default:
		for _, k := range genKeys {
			if given(k) {
				ld.crossErr("%s: set without workload.requests, which selects the generator", k)
			}
		}
		for _, k := range traceKeys {
			if ld.given[k] {
				ld.crossErr("%s: set without workload.trace", k)
			}
		}
	}
}

// resolveRange completes a generator range: one bound given means both.
func (ld *loader) resolveRange(key string, r *Range) {
	if ld.anyBad(key+".min", key+".max") {
		return
	}
	switch {
	case r.Min == 0 && r.Max == 0:
		ld.crossErr("%s: missing; the generator (workload.requests) needs it, as {min, max} or one number", key)
	case r.Min == 0:
		r.Min = r.Max
	case r.Max == 0:
		r.Max = r.Min
	case r.Min > r.Max:
		ld.crossErr("%s: min %d exceeds max %d", key, r.Min, r.Max)
	}
}

func anySlice[T any](s []T) []any {
	out := make([]any, len(s))
	for i, v := range s {
		out[i] = v
	}
	return out
}

// Flatten returns every known key (KnownKeys) with its effective value:
// int, uint64, float64, bool, string, []string, []int or []float64, or nil
// for an unset optional value (and for the keys of a workload mode or of
// speculative decoding that is not in use). Any non-nil value, written back
// with --set key=value, reproduces the same config. The map is the caller's.
func (c *Config) Flatten() map[string]any {
	out := make(map[string]any, len(fields))
	for _, f := range fields {
		if f.shorthand {
			continue
		}
		out[f.key] = f.get(c)
	}
	if !c.Speculative.Enabled() {
		for _, f := range fields {
			if strings.HasPrefix(f.key, "speculative_config.") {
				out[f.key] = nil
			}
		}
	}
	nilKeys := func(keys ...string) {
		for _, k := range keys {
			out[k] = nil
		}
	}
	switch c.Workload.Kind() {
	case WorkloadTrace:
		nilKeys("workload.requests", "workload.rate", "workload.prompt_tokens.min", "workload.prompt_tokens.max",
			"workload.output_tokens.min", "workload.output_tokens.max", "workload.shared_prefix_tokens", "workload.shared_prefix_groups")
	case WorkloadGenerator:
		nilKeys("workload.trace", "workload.limit", "workload.time_scale")
	default:
		nilKeys("workload.trace", "workload.limit", "workload.time_scale", "workload.requests", "workload.rate",
			"workload.prompt_tokens.min", "workload.prompt_tokens.max", "workload.output_tokens.min", "workload.output_tokens.max",
			"workload.shared_prefix_tokens", "workload.shared_prefix_groups")
	}
	return out
}

// KnownKeys returns every settable key in its canonical dotted form, sorted.
// (Aliases such as moe_expert_parallel_size and the one-number forms of
// workload.prompt_tokens and workload.output_tokens are accepted too.)
func KnownKeys() []string {
	var keys []string
	for _, f := range fields {
		if !f.shorthand {
			keys = append(keys, f.key)
		}
	}
	sort.Strings(keys)
	return keys
}

// IgnoredKeys returns the TensorRT-LLM keys that load with a "no effect"
// notice (with everything under them), sorted.
func IgnoredKeys() []string {
	return slices.Sorted(slices.Values(ignoredKeys))
}
