package config

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/kvx-dev/kvx/core/hw"
	"github.com/kvx-dev/kvx/core/registry"
	"github.com/kvx-dev/kvx/core/workload"
	"github.com/kvx-dev/kvx/plugins/model"
)

// field is one settable key. set parses and range-checks a non-null value
// and returns "" or the problem ("is not an integer", "is out of range;
// allowed: >= 1"); get returns the effective value for Flatten.
type field struct {
	key       string
	kind      string // what a value must be, for type errors: "an integer", ...
	shorthand bool   // an accepted alternative spelling, not in KnownKeys
	also      []string
	set       func(c *Config, v any) string
	get       func(c *Config) any
}

// fields is the schema. Order does not matter; KnownKeys sorts.
var fields = slices.Concat(baseFields, syntheticFields())

var baseFields = []field{
	// kvx keys.
	stringField("model", func(c *Config) *string { return &c.Model }, nil),
	enumField("hardware", func(c *Config) *string { return &c.Hardware }, hw.Names(), nil),
	enumField("device", func(c *Config) *string { return &c.Device }, []string{"sim", "cpu", "cuda"}, nil),
	pluginField("cache_manager", func(c *Config) *string { return &c.CacheManager }, (*registry.Registry).ManagerNames),
	pluginField("attention_backend", func(c *Config) *string { return &c.AttentionBackend }, (*registry.Registry).BackendNames),
	enumField("isolation", func(c *Config) *string { return &c.Isolation }, []string{"plugin", "inprocess"}, nil),
	enumField("plugin_transport", func(c *Config) *string { return &c.PluginTransport }, []string{"auto", "grpc"}, nil),
	enumField("weights_dtype", func(c *Config) *string { return &c.WeightsDtype }, []string{"bf16", "fp8", "fp4", "w4afp8"},
		map[string]string{"bfloat16": "bf16", "nvfp4": "fp4"}),
	enumField("dtype", func(c *Config) *string { return &c.Dtype }, []string{"auto", "float32", "bfloat16"},
		map[string]string{"fp32": "float32", "bf16": "bfloat16"}),
	enumField("step_overlap", func(c *Config) *string { return &c.StepOverlap }, []string{"auto", "off"}, nil),
	stringListField("plugin_dirs", func(c *Config) *[]string { return &c.PluginDirs }),
	uintField("seed", func(c *Config) *uint64 { return &c.Seed }),
	stringField("served_model_name", func(c *Config) *string { return &c.ServedModelName }, nil),
	stringField("sim_calibration", func(c *Config) *string { return &c.SimCalibration }, nil),
	{
		key:  "check_invariants",
		kind: `"every", "off" or a number of steps`,
		set: func(c *Config, v any) string {
			if s, ok := v.(string); ok {
				switch strings.ToLower(strings.TrimSpace(s)) {
				case "every":
					c.CheckInvariants = 1
					return ""
				case "off", "never":
					c.CheckInvariants = 0
					return ""
				}
			}
			if b, ok := v.(bool); ok && !b { // YAML 1.1 readers turn a bare off into false
				c.CheckInvariants = 0
				return ""
			}
			n, ok := asInt(v)
			if !ok {
				return `is not "every", "off" or a number of steps`
			}
			if n < 0 {
				return "is out of range; allowed: every, off, or N >= 1 steps"
			}
			c.CheckInvariants = int(n)
			return ""
		},
		get: func(c *Config) any {
			switch c.CheckInvariants {
			case 0:
				return "off"
			case 1:
				return "every"
			}
			return c.CheckInvariants
		},
	},
	intField("deep_check_every", func(c *Config) *int { return &c.DeepCheckEvery }, 0, false),

	// TensorRT-LLM top level.
	intField("max_batch_size", func(c *Config) *int { return &c.MaxBatchSize }, 1, false),
	intField("max_num_tokens", func(c *Config) *int { return &c.MaxNumTokens }, 1, false),
	intField("max_seq_len", func(c *Config) *int { return &c.MaxSeqLen }, 1, false),
	boolField("enable_chunked_prefill", func(c *Config) *bool { return &c.EnableChunkedPrefill }),
	intField("tensor_parallel_size", func(c *Config) *int { return &c.TensorParallelSize }, 1, false),
	intField("pipeline_parallel_size", func(c *Config) *int { return &c.PipelineParallelSize }, 1, false),
	intField("expert_parallel_size", func(c *Config) *int { return &c.ExpertParallelSize }, 1, false),

	// kv_cache_config.
	boolField("kv_cache_config.enable_block_reuse", func(c *Config) *bool { return &c.KVCache.EnableBlockReuse }),
	{
		key:  "kv_cache_config.tokens_per_block",
		kind: "an integer",
		set: func(c *Config, v any) string {
			n, ok := asInt(v)
			if !ok {
				return "is not an integer"
			}
			if n < 1 || n&(n-1) != 0 || n > 1<<20 {
				return "is out of range; allowed: a power of two from 1 to 1048576"
			}
			c.KVCache.TokensPerBlock = int(n)
			return ""
		},
		get: func(c *Config) any { return c.KVCache.TokensPerBlock },
	},
	floatField("kv_cache_config.free_gpu_memory_fraction", func(c *Config) *float64 { return &c.KVCache.FreeGPUMemoryFraction }, func(f float64) bool { return f > 0 && f <= 1 }, "0 < value <= 1"),
	intField("kv_cache_config.avg_seq_len", func(c *Config) *int { return &c.KVCache.AvgSeqLen }, 1, true),
	intField("kv_cache_config.max_tokens", func(c *Config) *int { return &c.KVCache.MaxTokens }, 1, true),
	{
		key:  "kv_cache_config.host_cache_size",
		kind: `a byte count (an integer or a size such as "64GiB")`,
		set: func(c *Config, v any) string {
			n, problem := asBytes(v)
			if problem != "" {
				return problem
			}
			c.KVCache.HostCacheSize = &n
			return ""
		},
		get: func(c *Config) any {
			if c.KVCache.HostCacheSize == nil {
				return nil
			}
			return *c.KVCache.HostCacheSize
		},
	},
	enumField("kv_cache_config.dtype", func(c *Config) *string { return &c.KVCache.Dtype }, []string{"auto", "bf16", "fp8"},
		map[string]string{"bfloat16": "bf16"}),
	enumField("kv_cache_config.mamba_ssm_cache_dtype", func(c *Config) *string { return &c.KVCache.MambaSSMCacheDtype },
		[]string{"auto", "float32", "float16", "bfloat16"}, map[string]string{"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}),
	{
		key:  "kv_cache_config.pool_ratio",
		kind: "a list of numbers",
		set: func(c *Config, v any) string {
			list, ok := v.([]any)
			if !ok {
				return "is not a list of numbers"
			}
			out := make([]float64, 0, len(list))
			for _, e := range list {
				f, ok := asFloat(e)
				if !ok {
					return "is not a list of numbers"
				}
				if !(f > 0 && f <= 1) {
					return "is out of range; allowed: a list of ratios, each 0 < r <= 1, summing to 1"
				}
				out = append(out, f)
			}
			if len(out) == 0 {
				return "is empty; allowed: a list of ratios summing to 1 (or null to unset)"
			}
			c.KVCache.PoolRatio = out
			return ""
		},
		get: func(c *Config) any {
			if len(c.KVCache.PoolRatio) == 0 {
				return nil
			}
			return slices.Clone(c.KVCache.PoolRatio)
		},
	},
	boolField("kv_cache_config.enable_partial_reuse", func(c *Config) *bool { return &c.KVCache.EnablePartialReuse }),
	boolField("kv_cache_config.copy_on_partial_reuse", func(c *Config) *bool { return &c.KVCache.CopyOnPartialReuse }),
	enumField("kv_cache_config.eviction_policy", func(c *Config) *string { return &c.KVCache.EvictionPolicy }, []string{"lru", "lfu"}, nil),

	// mamba_state_config.
	intField("mamba_state_config.periodic_snapshot_interval", func(c *Config) *int { return &c.MambaState.PeriodicSnapshotInterval }, 0, false),
	{
		key:  "mamba_state_config.additional_snapshot_offsets_from_end",
		kind: "a list of integers",
		set: func(c *Config, v any) string {
			list, ok := v.([]any)
			if !ok {
				list = []any{v} // one offset
			}
			out := make([]int, 0, len(list))
			for _, e := range list {
				n, ok := asInt(e)
				if !ok {
					return "is not a list of integers"
				}
				if n < 0 {
					return "is out of range; allowed: offsets >= 0"
				}
				out = append(out, int(n))
			}
			c.MambaState.AdditionalSnapshotOffsetsFromEnd = out
			return ""
		},
		get: func(c *Config) any {
			if len(c.MambaState.AdditionalSnapshotOffsetsFromEnd) == 0 {
				return nil
			}
			return slices.Clone(c.MambaState.AdditionalSnapshotOffsetsFromEnd)
		},
	},

	// speculative_config.
	enumField("speculative_config.decoding_type", func(c *Config) *string { return &c.Speculative.DecodingType }, []string{"MTP"},
		map[string]string{"mtp": "MTP"}),
	intField("speculative_config.num_nextn_predict_layers", func(c *Config) *int { return &c.Speculative.NumNextNPredictLayers }, 1, false),
	intField("speculative_config.max_draft_len", func(c *Config) *int { return &c.Speculative.MaxDraftLen }, 1, false),
	floatField("speculative_config.acceptance_rate", func(c *Config) *float64 { return &c.Speculative.AcceptanceRate }, func(f float64) bool { return f >= 0 && f <= 1 }, "0 <= value <= 1"),

	// plugin_sha256: pinned plugin binaries.
	stringField("plugin_sha256.cache_manager", func(c *Config) *string { return &c.PluginSHA256.CacheManager }, sha256Hex),
	stringField("plugin_sha256.attention_backend", func(c *Config) *string { return &c.PluginSHA256.AttentionBackend }, sha256Hex),
	// plugin_timeouts.
	durationField("plugin_timeouts.start", func(c *Config) *time.Duration { return &c.PluginTimeouts.Start }),
	durationField("plugin_timeouts.configure", func(c *Config) *time.Duration { return &c.PluginTimeouts.Configure }),
	durationField("plugin_timeouts.call", func(c *Config) *time.Duration { return &c.PluginTimeouts.Call }),
	durationField("plugin_timeouts.forward", func(c *Config) *time.Duration { return &c.PluginTimeouts.Forward }),
	floatField("plugin_timeouts.forward_factor", func(c *Config) *float64 { return &c.PluginTimeouts.ForwardFactor }, func(f float64) bool { return f >= 1 && f <= 1e6 }, "1 <= value <= 1000000"),
	// plugin_restarts.
	intField("plugin_restarts.max", func(c *Config) *int { return &c.PluginRestarts.Max }, 1, false),
	durationField("plugin_restarts.backoff", func(c *Config) *time.Duration { return &c.PluginRestarts.Backoff }),
	durationField("plugin_restarts.max_backoff", func(c *Config) *time.Duration { return &c.PluginRestarts.MaxBackoff }),

	// kv_events_config (vLLM's names).
	boolField("kv_events_config.enable_kv_cache_events", func(c *Config) *bool { return &c.KVEvents.EnableKVCacheEvents }),
	enumField("kv_events_config.publisher", func(c *Config) *string { return &c.KVEvents.Publisher }, []string{"zmq", "null"}, nil),
	stringField("kv_events_config.endpoint", func(c *Config) *string { return &c.KVEvents.Endpoint }, zmqEndpoint),
	optStringField("kv_events_config.replay_endpoint", func(c *Config) *string { return &c.KVEvents.ReplayEndpoint }, zmqEndpoint),
	intField("kv_events_config.buffer_steps", func(c *Config) *int { return &c.KVEvents.BufferSteps }, 1, false),
	optStringField("kv_events_config.topic", func(c *Config) *string { return &c.KVEvents.Topic }, nil),

	// scheduler_config.
	enumField("scheduler_config.capacity_scheduler_policy", func(c *Config) *string { return &c.Scheduler.CapacitySchedulerPolicy },
		[]string{"GUARANTEED_NO_EVICT", "MAX_UTILIZATION"}, nil),
	enumField("scheduler_config.context_chunking_policy", func(c *Config) *string { return &c.Scheduler.ContextChunkingPolicy },
		[]string{"FIRST_COME_FIRST_SERVED", "EQUAL_PROGRESS"}, nil),

	// workload.
	stringField("workload.trace", func(c *Config) *string { return &c.Workload.Trace }, nil),
	intField("workload.limit", func(c *Config) *int { return &c.Workload.Limit }, 0, false),
	enumField("workload.format", func(c *Config) *string { return &c.Workload.Format }, workload.Formats, nil),
	intField("workload.hash_block_tokens", func(c *Config) *int { return &c.Workload.HashBlockTokens }, 1, true),
	floatField("workload.time_scale", func(c *Config) *float64 { return &c.Workload.TimeScale }, func(f float64) bool { return f > 0 && !math.IsInf(f, 0) }, "a finite number > 0"),
	intField("workload.requests", func(c *Config) *int { return &c.Workload.Requests }, 1, true),
	intField("workload.concurrency", func(c *Config) *int { return &c.Workload.Concurrency }, 0, false),
	floatField("workload.rate", func(c *Config) *float64 { return &c.Workload.Rate }, func(f float64) bool { return f >= 0 && !math.IsInf(f, 0) }, "a finite number >= 0 (0 = all requests at t=0)"),
	rangeShorthand("workload.prompt_tokens", func(c *Config) *Range { return &c.Workload.PromptTokens }),
	intField("workload.prompt_tokens.min", func(c *Config) *int { return &c.Workload.PromptTokens.Min }, 1, true),
	intField("workload.prompt_tokens.max", func(c *Config) *int { return &c.Workload.PromptTokens.Max }, 1, true),
	rangeShorthand("workload.output_tokens", func(c *Config) *Range { return &c.Workload.OutputTokens }),
	intField("workload.output_tokens.min", func(c *Config) *int { return &c.Workload.OutputTokens.Min }, 1, true),
	intField("workload.output_tokens.max", func(c *Config) *int { return &c.Workload.OutputTokens.Max }, 1, true),
	intField("workload.shared_prefix_tokens", func(c *Config) *int { return &c.Workload.SharedPrefixTokens }, 0, false),
	intField("workload.shared_prefix_groups", func(c *Config) *int { return &c.Workload.SharedPrefixGroups }, 1, false),
	uintField("workload.seed", func(c *Config) *uint64 { return &c.Workload.Seed }),
	{
		key:  "workload.retention_priority",
		kind: "an integer",
		set: func(c *Config, v any) string {
			n, ok := asInt(v)
			if !ok {
				return "is not an integer"
			}
			if n < workload.MinRetentionPriority || n > workload.MaxRetentionPriority {
				return fmt.Sprintf("is out of range; allowed: %d <= value <= %d", workload.MinRetentionPriority, workload.MaxRetentionPriority)
			}
			c.Workload.RetentionPriority = int(n)
			return ""
		},
		get: func(c *Config) any {
			if c.Workload.RetentionPriority == 0 {
				return nil
			}
			return c.Workload.RetentionPriority
		},
	},
	{
		key:  "workload.retention_duration_s",
		kind: "a number",
		set: func(c *Config, v any) string {
			f, ok := asFloat(v)
			if !ok {
				return "is not a number"
			}
			if !(f > 0) || f > workload.MaxRetentionSeconds {
				return fmt.Sprintf("is out of range; allowed: 0 < value <= %d seconds", workload.MaxRetentionSeconds)
			}
			c.Workload.RetentionDurationS = f
			return ""
		},
		get: func(c *Config) any {
			if c.Workload.RetentionDurationS == 0 {
				return nil
			}
			return c.Workload.RetentionDurationS
		},
	},
}

// syntheticFields are the synthetic.* keys, one per model.SyntheticSpec field.
func syntheticFields() []field {
	var out []field
	for _, sf := range model.SyntheticFields() {
		ptr := sf.Ptr
		out = append(out, intField("synthetic."+sf.Key, func(c *Config) *int { return ptr(&c.Synthetic) }, 0, true))
	}
	return out
}

var fieldsByKey = func() map[string]*field {
	m := make(map[string]*field, len(fields))
	for i := range fields {
		f := &fields[i]
		if _, dup := m[f.key]; dup {
			panic("config: duplicate key " + f.key)
		}
		m[f.key] = f
	}
	return m
}()

// aliases maps accepted spellings to canonical keys.
var aliases = map[string]string{
	"moe_expert_parallel_size": "expert_parallel_size",
	"tp_size":                  "tensor_parallel_size", // trtllm-serve flag names
	"pp_size":                  "pipeline_parallel_size",
	"ep_size":                  "expert_parallel_size",
	// TensorRT-LLM keeps MambaStateConfig inside KvCacheConfig.
	"kv_cache_config.mamba_state_config.periodic_snapshot_interval":           "mamba_state_config.periodic_snapshot_interval",
	"kv_cache_config.mamba_state_config.additional_snapshot_offsets_from_end": "mamba_state_config.additional_snapshot_offsets_from_end",
}

// sections are the maps that hold keys.
var sections = map[string]bool{
	"kv_cache_config": true, "kv_cache_config.mamba_state_config": true, "mamba_state_config": true,
	"speculative_config": true, "scheduler_config": true, "workload": true, "synthetic": true,
}

// ignoredKeys are TensorRT-LLM LLM-API keys (and everything under them) that
// kvx accepts and does not model.
var ignoredKeys = []string{
	// Top level.
	"allreduce_strategy", "attn_backend", "backend", "batch_wait_max_tokens_ratio", "batch_wait_timeout_iters",
	"batch_wait_timeout_ms", "build_config", "cache_transceiver_config", "checkpoint_format", "checkpoint_loader",
	"context_parallel_size", "cp_config", "cuda_graph_config", "disable_overlap_scheduler",
	"enable_attention_dp", "enable_autotuner", "enable_iter_perf_stats", "enable_iter_req_stats",
	"enable_layerwise_nvtx_marker", "enable_lm_head_tp_in_adp", "enable_lora", "enable_min_latency",
	"fail_fast_on_attention_window_too_large", "force_dynamic_quantization", "garbage_collection_gen0_threshold",
	"gpus_per_node", "guided_decoding_backend", "iter_stats_max_iterations", "kv_connector_config", "load_format",
	"lora_config", "mamba_ssm_philox_rounds", "mamba_ssm_stochastic_rounding", "max_beam_width", "max_input_len",
	"max_lora_rank", "mm_encoder_only", "moe_cluster_parallel_size", "moe_config", "moe_load_balancer",
	"moe_tensor_parallel_size", "num_postprocess_workers", "nvfp4_gemm_config", "otlp_traces_endpoint",
	"peft_cache_config", "perf_metrics_max_requests", "postprocess_tokenizer_dir", "pp_partition", "print_iter_log",
	"reasoning_parser", "request_stats_max_iterations", "return_perf_metrics", "revision", "sampler_type",
	"skip_tokenizer_init", "sparse_attention_config", "stream_interval", "tokenizer", "tokenizer_mode",
	"tokenizer_revision", "tool_parser", "torch_compile_config", "trust_remote_code", "use_cuda_graph",
	// kv_cache_config.
	"kv_cache_config.attention_dp_events_gather_period_ms", "kv_cache_config.block_reuse_config",
	"kv_cache_config.cross_kv_cache_fraction", "kv_cache_config.enable_kv_pool_rebalance",
	"kv_cache_config.event_buffer_max_size", "kv_cache_config.mamba_ssm_philox_rounds",
	"kv_cache_config.mamba_ssm_stochastic_rounding", "kv_cache_config.max_attention_window",
	"kv_cache_config.max_gpu_total_bytes", "kv_cache_config.max_util_for_resume", "kv_cache_config.onboard_blocks",
	"kv_cache_config.secondary_offload_min_priority", "kv_cache_config.sink_token_length",
	"kv_cache_config.use_kv_cache_manager_v2", "kv_cache_config.use_uvm",
	// speculative_config.
	"speculative_config.allow_advanced_sampling", "speculative_config.load_format",
	"speculative_config.mtp_eagle_one_model", "speculative_config.relaxed_delta", "speculative_config.relaxed_topk",
	"speculative_config.speculative_model_dir", "speculative_config.use_mtp_vanilla",
	"speculative_config.use_relaxed_acceptance_for_thinking",
	// scheduler_config.
	"scheduler_config.dynamic_batch_config", "scheduler_config.use_python_scheduler",
	"scheduler_config.waiting_queue_policy",
}

func intField(key string, acc func(*Config) *int, lo int, zeroIsUnset bool) field {
	return field{
		key:  key,
		kind: "an integer",
		set: func(c *Config, v any) string {
			n, ok := asInt(v)
			if !ok {
				return "is not an integer"
			}
			if n < int64(lo) || n > math.MaxInt32 {
				return fmt.Sprintf("is out of range; allowed: %d <= value <= %d", lo, math.MaxInt32)
			}
			*acc(c) = int(n)
			return ""
		},
		get: func(c *Config) any {
			if zeroIsUnset && *acc(c) == 0 {
				return nil
			}
			return *acc(c)
		},
	}
}

// durationField is a positive duration: a Go duration string ("10s",
// "1m30s", "500ms") or a number of seconds. Flatten gives the string.
func durationField(key string, acc func(*Config) *time.Duration) field {
	const kind = `a duration (such as "10s", "500ms" or "5m") or a number of seconds`
	return field{
		key:  key,
		kind: kind,
		set: func(c *Config, v any) string {
			var d time.Duration
			f, isNum := asFloat(v)
			switch s, isStr := v.(string); {
			case isNum:
				if f > 1e9 {
					return "is out of range; allowed: 1ms <= value <= 1000000000s"
				}
				d = time.Duration(f * float64(time.Second))
			case isStr:
				var err error
				if d, err = time.ParseDuration(strings.TrimSpace(s)); err != nil {
					return "is not " + kind
				}
			default:
				return "is not " + kind
			}
			if d < time.Millisecond {
				return "is out of range; allowed: 1ms <= value"
			}
			*acc(c) = d
			return ""
		},
		get: func(c *Config) any { return acc(c).String() },
	}
}

func uintField(key string, acc func(*Config) *uint64) field {
	return field{
		key:  key,
		kind: "an unsigned integer",
		set: func(c *Config, v any) string {
			switch x := v.(type) {
			case uint64:
				*acc(c) = x
				return ""
			case string:
				if u, err := strconv.ParseUint(strings.TrimSpace(x), 0, 64); err == nil {
					*acc(c) = u
					return ""
				}
			}
			n, ok := asInt(v)
			if !ok {
				return "is not an unsigned integer"
			}
			if n < 0 {
				return "is out of range; allowed: 0 <= value < 2^64"
			}
			*acc(c) = uint64(n)
			return ""
		},
		get: func(c *Config) any { return *acc(c) },
	}
}

func boolField(key string, acc func(*Config) *bool) field {
	return field{
		key:  key,
		kind: "true or false",
		set: func(c *Config, v any) string {
			switch x := v.(type) {
			case bool:
				*acc(c) = x
				return ""
			case string:
				switch strings.ToLower(strings.TrimSpace(x)) {
				case "true":
					*acc(c) = true
					return ""
				case "false":
					*acc(c) = false
					return ""
				}
			}
			return "is not true or false"
		},
		get: func(c *Config) any { return *acc(c) },
	}
}

// stringField accepts any non-empty string; check, if set, vets it.
// sha256Hex checks a pinned SHA-256: 64 hexadecimal digits.
func sha256Hex(s string) string {
	if len(s) != 64 {
		return fmt.Sprintf("has %d characters, a SHA-256 is 64 hexadecimal digits (sha256sum prints it)", len(s))
	}
	for _, r := range s {
		if !strings.ContainsRune("0123456789abcdefABCDEF", r) {
			return fmt.Sprintf("has %q, a SHA-256 is 64 hexadecimal digits (sha256sum prints it)", r)
		}
	}
	return ""
}

// floatField is a number key whose values must satisfy ok; allowed says
// which, in the error.
func floatField(key string, acc func(*Config) *float64, ok func(float64) bool, allowed string) field {
	return field{
		key:  key,
		kind: "a number",
		set: func(c *Config, v any) string {
			f, isNum := asFloat(v)
			if !isNum {
				return "is not a number"
			}
			if !ok(f) {
				return "is out of range; allowed: " + allowed
			}
			*acc(c) = f
			return ""
		},
		get: func(c *Config) any { return *acc(c) },
	}
}

func stringField(key string, acc func(*Config) *string, check func(string) string) field {
	return textField(key, acc, func(_ *Config, s string) (string, string) {
		if check != nil {
			if p := check(s); p != "" {
				return "", p
			}
		}
		return s, ""
	})
}

// pluginField is cache_manager or attention_backend: a name the config's
// registry lists (names, case-insensitive) or a plugin binary's path
// (registry.IsPath: it contains a path separator).
func pluginField(key string, acc func(*Config) *string, names func(*registry.Registry) []string) field {
	return textField(key, acc, func(c *Config, s string) (string, string) {
		if registry.IsPath(s) {
			return s, ""
		}
		known := names(c.reg)
		for _, n := range known {
			if strings.EqualFold(s, n) {
				return n, ""
			}
		}
		if len(known) == 0 {
			return "", "is not a plugin path (containing a path separator); this kvx has no built-in one"
		}
		return "", "is not one of " + strings.Join(known, ", ") + " or a plugin path (containing a path separator)"
	})
}

// textField is a non-empty string, trimmed, that parse turns into the value
// kept (or a problem); unset, it reads as nil.
func textField(key string, acc func(*Config) *string, parse func(c *Config, s string) (value, problem string)) field {
	return field{
		key:  key,
		kind: "a string",
		set: func(c *Config, v any) string {
			s, ok := v.(string)
			if !ok {
				return "is not a string"
			}
			s = strings.TrimSpace(s)
			if s == "" {
				return "is empty"
			}
			val, p := parse(c, s)
			if p != "" {
				return p
			}
			*acc(c) = val
			return ""
		},
		get: func(c *Config) any {
			if *acc(c) == "" {
				return nil
			}
			return *acc(c)
		},
	}
}

// enumField accepts one of allowed, case-insensitively, or a synonym.
func enumField(key string, acc func(*Config) *string, allowed []string, synonyms map[string]string) field {
	problem := "is not one of " + strings.Join(allowed, ", ")
	return field{
		key:  key,
		kind: "one of " + strings.Join(allowed, ", "),
		set: func(c *Config, v any) string {
			s, ok := v.(string)
			if !ok {
				return problem
			}
			s = strings.TrimSpace(s)
			if syn, ok := synonyms[strings.ToLower(s)]; ok {
				s = syn
			}
			for _, a := range allowed {
				if strings.EqualFold(s, a) {
					*acc(c) = a
					return ""
				}
			}
			return problem
		},
		get: func(c *Config) any {
			if *acc(c) == "" {
				return nil
			}
			return *acc(c)
		},
	}
}

func stringListField(key string, acc func(*Config) *[]string) field {
	return field{
		key:  key,
		kind: "a list of strings",
		set: func(c *Config, v any) string {
			list, ok := v.([]any)
			if !ok {
				list = []any{v} // one entry
			}
			out := make([]string, 0, len(list))
			for _, e := range list {
				s, ok := e.(string)
				if !ok || strings.TrimSpace(s) == "" {
					return "is not a list of non-empty strings"
				}
				out = append(out, s)
			}
			*acc(c) = out
			return ""
		},
		get: func(c *Config) any {
			if len(*acc(c)) == 0 {
				return nil
			}
			return slices.Clone(*acc(c))
		},
	}
}

// rangeShorthand is "key: N", meaning min = max = N.
func rangeShorthand(key string, acc func(*Config) *Range) field {
	return field{
		key:       key,
		kind:      "an integer or {min, max}",
		shorthand: true,
		also:      []string{key + ".min", key + ".max"},
		set: func(c *Config, v any) string {
			n, ok := asInt(v)
			if !ok {
				return "is not an integer or {min, max}"
			}
			if n < 1 || n > math.MaxInt32 {
				return fmt.Sprintf("is out of range; allowed: 1 <= value <= %d", math.MaxInt32)
			}
			*acc(c) = Range{Min: int(n), Max: int(n)}
			return ""
		},
		get: func(c *Config) any { return nil },
	}
}

// asInt accepts integers, integral floats and integer strings.
func asInt(v any) (int64, bool) {
	switch x := v.(type) {
	case int:
		return int64(x), true
	case int64:
		return x, true
	case uint64:
		if x <= math.MaxInt64 {
			return int64(x), true
		}
	case float64:
		if x == math.Trunc(x) && math.Abs(x) < 1<<62 {
			return int64(x), true
		}
	case string:
		n, err := strconv.ParseInt(strings.TrimSpace(x), 10, 64)
		return n, err == nil
	}
	return 0, false
}

// asFloat accepts numbers and numeric strings.
func asFloat(v any) (float64, bool) {
	switch x := v.(type) {
	case int:
		return float64(x), true
	case int64:
		return float64(x), true
	case uint64:
		return float64(x), true
	case float64:
		return x, !math.IsNaN(x)
	case string:
		f, err := strconv.ParseFloat(strings.TrimSpace(x), 64)
		return f, err == nil && !math.IsNaN(f)
	}
	return 0, false
}

var byteUnits = []struct {
	suffix string
	mult   float64
}{
	{"kib", 1 << 10}, {"mib", 1 << 20}, {"gib", 1 << 30}, {"tib", 1 << 40},
	{"kb", 1e3}, {"mb", 1e6}, {"gb", 1e9}, {"tb", 1e12}, {"b", 1},
}

// asBytes accepts a non-negative integer or a size with a unit: B, KB/MB/GB/TB
// (powers of 1000) or KiB/MiB/GiB/TiB (powers of 1024), case-insensitive,
// e.g. "64GiB", "1.5 TB".
func asBytes(v any) (int64, string) {
	const kind = `is not a byte count (an integer or a size such as "64GiB")`
	const rng = "is out of range; allowed: 0 <= bytes < 2^63"
	if s, ok := v.(string); ok {
		t := strings.ToLower(strings.TrimSpace(s))
		mult := 1.0
		for _, u := range byteUnits {
			if num, ok := strings.CutSuffix(t, u.suffix); ok {
				t, mult = strings.TrimSpace(num), u.mult
				break
			}
		}
		f, err := strconv.ParseFloat(t, 64)
		if err != nil || math.IsNaN(f) {
			return 0, kind
		}
		b := f * mult
		if b < 0 || b >= math.MaxInt64 {
			return 0, rng
		}
		return int64(math.Round(b)), ""
	}
	n, ok := asInt(v)
	if !ok {
		return 0, kind
	}
	if n < 0 {
		return 0, rng
	}
	return n, ""
}

func fmtFloat(f float64) string { return strconv.FormatFloat(f, 'g', -1, 64) }

// optStringField is stringField for a key whose empty string is a value
// (kv_events_config.topic, replay_endpoint): "" is accepted and Flatten
// reports it as it is.
func optStringField(key string, acc func(*Config) *string, check func(string) string) field {
	return field{
		key:  key,
		kind: "a string",
		set: func(c *Config, v any) string {
			s, ok := v.(string)
			if !ok {
				return "is not a string"
			}
			if s != "" && check != nil {
				if p := check(s); p != "" {
					return p
				}
			}
			*acc(c) = s
			return ""
		},
		get: func(c *Config) any { return *acc(c) },
	}
}

// zmqEndpoint checks a ZeroMQ endpoint kvx can bind or connect:
// tcp://host:port (host * or empty binds every interface; port 0..65535)
// or ipc://path.
func zmqEndpoint(s string) string {
	const allowed = "allowed: tcp://HOST:PORT (HOST * to bind every interface) or ipc://PATH"
	scheme, rest, ok := strings.Cut(s, "://")
	switch {
	case !ok:
		return "is not an endpoint; " + allowed
	case scheme == "ipc":
		if rest == "" {
			return "has no path; " + allowed
		}
		return ""
	case scheme != "tcp":
		return fmt.Sprintf("has transport %q; %s", scheme, allowed)
	}
	i := strings.LastIndexByte(rest, ':')
	if i < 0 {
		return "has no port; " + allowed
	}
	port, err := strconv.Atoi(rest[i+1:])
	if err != nil || port < 0 || port > 65535 {
		return fmt.Sprintf("has port %q; allowed: 0..65535", rest[i+1:])
	}
	return ""
}
