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
//     SDK's debug mode (plugins/v1/pluginrpc.ReattachEnvPrefix): Load skips them.
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
//
// Its files, by idea: config.go (the types, their defaults and their keys),
// load.go (reading and merging the sources, setting the fields), resolve.go
// (model-derived defaults and cross-field rules), schema.go (the table of
// keys) and suggest.go (the nearest key for a typo).
package config

import (
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/kvx-dev/kvx/core/registry"
	"github.com/kvx-dev/kvx/plugins/model"
	"github.com/kvx-dev/kvx/plugins/v1/spec"
)

// Config is the engine configuration. Load fills every field: defaults,
// then the sources, then values derived from the model (MaxSeqLen,
// AttentionBackend, CacheManager, speculative lengths).
type Config struct {
	// kvx keys.
	Model            string   // model: preset name, or path to a config.json or a checkpoint directory; relative to the YAML file that sets it, else to the working directory (required)
	Hardware         string   // hardware: a core/hw preset name (h200)
	Device           string   // device: sim, cpu or cuda (sim)
	CacheManager     string   // cache_manager: a manager of the registry or a plugin path (default: the first registered that manages the model's mixers)
	AttentionBackend string   // attention_backend: a backend of the registry or a plugin path (default: the first registered that runs the model's mixers)
	Isolation        string   // isolation: plugin or inprocess (plugin)
	PluginTransport  string   // plugin_transport: auto (gRPC plus a framed data plane for per-step calls when the plugin offers one) or grpc (auto)
	WeightsDtype     string   // weights_dtype: bf16, fp8, fp4 or w4afp8 (bf16)
	Dtype            string   // dtype: the compute dtype of a computing device, float32 (the exact numerics, the cpu's order bit for bit) or bfloat16 (cuda's fast numerics, deterministic and batch-invariant); auto resolves to bfloat16 on cuda, float32 elsewhere (auto)
	PluginDirs       []string // plugin_dirs
	Seed             uint64   // seed (0)
	// SimCalibration is sim_calibration: the calibration file (kvx
	// calibrate) of the sim device's cost model, relative to the YAML file
	// that sets it; "none" for the datasheet roofline; empty for the one
	// that ships with kvx for the hardware preset, if any (else the
	// datasheet roofline). HardwareSpec carries the loaded parameters.
	SimCalibration string
	// ServedModelName is served_model_name (vLLM's key): the model id kvx
	// serve lists and answers to; empty means the model key's value.
	ServedModelName string
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
	// PluginSHA256 is plugin_sha256: the SHA-256 a plugin binary must have
	// to be run (empty: not pinned).
	PluginSHA256 PluginSHA256
	// PluginTimeouts is plugin_timeouts: how long kvx waits on a plugin
	// before it treats it as dead (isolation: plugin only).
	PluginTimeouts PluginTimeouts
	// PluginRestarts is plugin_restarts: how often, and how fast, a plugin
	// that died is restarted.
	PluginRestarts PluginRestarts
	Workload       WorkloadConfig // workload
	// KVEvents is kv_events_config (vLLM's keys): KV cache events that
	// kvx serve publishes for KV-aware routers; off by default.
	KVEvents KVEventsConfig
	// Synthetic is synthetic: overrides for the small synthetic model that
	// a computing device (cpu, cuda) runs instead of the full model (keys
	// synthetic.<field> in snake_case, see model.SyntheticFields; 0 =
	// default). Accepted only with device: cpu or cuda. With speculative
	// decoding on and synthetic.mtp_layers unset, the synthetic model gets
	// max(base MTP layers, max_draft_len, num_nextn_predict_layers) MTP
	// layers: one per draft depth.
	Synthetic model.SyntheticSpec

	model    spec.Model
	hardware spec.Hardware
	reg      *registry.Registry // what cache_manager and attention_backend may name
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
	// eviction_policy: lru or lfu (lru), the order in which every tier
	// evicts cached blocks of equal retention priority
	// (kvcache.Config.EvictionPolicy); a manager that does not list it in
	// its Info is refused at the start.
	EvictionPolicy string
}

// KVEventsConfig is kv_events_config, with vLLM's key names and defaults.
type KVEventsConfig struct {
	EnableKVCacheEvents bool   // enable_kv_cache_events (false)
	Publisher           string // publisher: zmq or null (zmq)
	Endpoint            string // endpoint: the PUB socket, tcp://host:port or ipc://path; a * host binds (tcp://*:5557)
	ReplayEndpoint      string // replay_endpoint: the ROUTER socket for replays; "" = none ("")
	BufferSteps         int    // buffer_steps: batches kept for replay, >= 1 (10000)
	Topic               string // topic: the first frame of every message ("")
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

// PluginSHA256 is plugin_sha256: the binaries of the cache manager and the
// attention backend can be pinned by their SHA-256 (hexadecimal, as
// sha256sum prints it), as Terraform pins providers. kvx hashes the binary
// it found before the run and again right before it starts it, and refuses
// one whose hash differs.
type PluginSHA256 struct {
	CacheManager     string // cache_manager
	AttentionBackend string // attention_backend
}

// PluginTimeouts is plugin_timeouts: every plugin call has a deadline
// derived from what it is, and a plugin that misses one is killed (its
// whole process group), restarted, and its stage's requests recomputed,
// as if it had crashed. Keys take a duration ("10s", "500ms", "5m") or a
// number of seconds.
type PluginTimeouts struct {
	// Start is start: a plugin process's start, up to go-plugin's
	// handshake; a plugin that does not complete it in time (a wrapper
	// script that never execs the plugin) is killed and the run fails (60s).
	Start time.Duration
	// Configure is configure: the Info and Configure calls of a started
	// plugin (a worker's Configure loads weights and allocates its pools) (5m).
	Configure time.Duration
	// Call is call: every manager call and every worker call other than a
	// forward (10s).
	Call time.Duration
	// Forward is forward: the least deadline of a forward over every
	// stage (30s).
	Forward time.Duration
	// ForwardFactor is forward_factor: a forward's deadline is at least
	// this many times the slowest forward seen so far in the run (10).
	ForwardFactor float64
}

// PluginRestarts is plugin_restarts: a plugin that dies (or misses a
// deadline) is restarted and its stage's requests recomputed, at most Max
// times in the engine's life; the restart after that stops the engine with
// an error (kvx serve exits non-zero, for a supervisor to restart it).
type PluginRestarts struct {
	// Max is max: the restart budget (8).
	Max int
	// Backoff is backoff: the wait before a restart; it doubles with each
	// restart that follows another with no step done in between (100ms).
	Backoff time.Duration
	// MaxBackoff is max_backoff: the cap of that wait (5s).
	MaxBackoff time.Duration
}

// Range is an inclusive [Min, Max] token count; zero = unset.
type Range struct{ Min, Max int }

// WorkloadConfig is workload: a trace or a generator, not both.
type WorkloadConfig struct {
	// Trace mode.
	Trace     string  // trace: path to a trace file; relative to the YAML file that sets it, else to the working directory
	Limit     int     // limit: replay the first N lines; 0 = all
	TimeScale float64 // time_scale > 0 multiplies trace timestamps (1)
	// format: mooncake, azure, burstgpt or bailian (workload.Formats); unset =
	// detected from the trace's first line, an error when it is ambiguous.
	Format string
	// hash_block_tokens >= 1: tokens one hash id stands for (mooncake 512,
	// bailian 16 when unset); not allowed with azure and burstgpt, which
	// have no hash_ids.
	HashBlockTokens int

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
	// retention_priority 1..100 (0 = unset) and retention_duration_s > 0
	// (0 = while cached): the retention of the cached blocks of every
	// request without its own (kvx serve's requests and prompts-file lines
	// may carry one).
	RetentionPriority  int
	RetentionDurationS float64
}

// Retention returns the default retention of the workload's requests:
// retention_priority and retention_duration_s in ns (0s when unset), as
// workload.Workload's RetentionPriority and RetentionDuration.
func (w WorkloadConfig) Retention() (priority int, duration int64) {
	return w.RetentionPriority, int64(w.RetentionDurationS * 1e9)
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

// Computing reports whether device computes real tokens from weights (cpu
// and cuda, the devices that run synthetic models and checkpoints) rather
// than modelling time on a hardware preset (sim). What only the host's
// memory bounds (setup.CPUMemoryBytes) stays with device cpu.
func Computing(device string) bool { return device == "cpu" || device == "cuda" }

// ModelSpec returns the loaded model (buffers not filled): with a computing
// device (Computing), the synthetic model built from the configured one and
// Synthetic. The Layers slice is a copy the caller owns.
func (c *Config) ModelSpec() spec.Model {
	m := c.model
	m.Layers = slices.Clone(m.Layers)
	return m
}

// Registry returns the registry the configuration was loaded against: the
// managers and backends that CacheManager and AttentionBackend may name.
func (c *Config) Registry() *registry.Registry { return c.reg }

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
		Dtype:                "auto",
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
			EvictionPolicy:        "lru",
		},
		Speculative: SpeculativeConfig{AcceptanceRate: 0.7},
		Scheduler: SchedulerConfig{
			CapacitySchedulerPolicy: "GUARANTEED_NO_EVICT",
			ContextChunkingPolicy:   "FIRST_COME_FIRST_SERVED",
		},
		Workload: WorkloadConfig{TimeScale: 1, SharedPrefixGroups: 1},
		KVEvents: KVEventsConfig{Publisher: "zmq", Endpoint: "tcp://*:5557", BufferSteps: 10000},
		PluginTimeouts: PluginTimeouts{
			Start: time.Minute, Configure: 5 * time.Minute, Call: 10 * time.Second,
			Forward: 30 * time.Second, ForwardFactor: 10,
		},
		PluginRestarts: PluginRestarts{Max: 8, Backoff: 100 * time.Millisecond, MaxBackoff: 5 * time.Second},
	}
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
		nilKeys("workload.trace", "workload.limit", "workload.time_scale", "workload.format", "workload.hash_block_tokens")
	default:
		nilKeys("workload.trace", "workload.limit", "workload.time_scale", "workload.format", "workload.hash_block_tokens", "workload.requests", "workload.rate",
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
