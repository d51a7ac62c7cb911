package config

import (
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/kvx-dev/kvx/plugins/model"
)

func load(t *testing.T, files, env, sets []string) (*Config, []string) {
	t.Helper()
	c, notices, err := Load(testReg, files, env, sets)
	if err != nil {
		t.Fatalf("Load(%v, %v, %v): %v", files, env, sets, err)
	}
	return c, notices
}

func writeYAML(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "c.yaml")
	if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// The seeds' extra-llm-api-config.yml load with only notices once model: is added.
func TestSeedsLoad(t *testing.T) {
	seedB := []string{
		"key backend has no effect in kvx",
		"key cuda_graph_config has no effect in kvx",
		"key disable_overlap_scheduler has no effect in kvx",
		"key enable_attention_dp has no effect in kvx",
		"key kv_cache_config.mamba_ssm_philox_rounds has no effect in kvx",
		"key kv_cache_config.mamba_ssm_stochastic_rounding has no effect in kvx",
		"key moe_config has no effect in kvx",
		"key trust_remote_code has no effect in kvx",
	}
	seedBFlat := []string{
		"key backend has no effect in kvx",
		"key cuda_graph_config has no effect in kvx",
		"key disable_overlap_scheduler has no effect in kvx",
		"key enable_attention_dp has no effect in kvx",
		"key mamba_ssm_philox_rounds has no effect in kvx",
		"key mamba_ssm_stochastic_rounding has no effect in kvx",
		"key moe_config has no effect in kvx",
		"key trust_remote_code has no effect in kvx",
	}
	seedA := []string{
		"key backend has no effect in kvx",
		"key kv_cache_config.use_kv_cache_manager_v2 has no effect in kvx",
		"max_seq_len 262144 exceeds the model's max_position_embeddings 163840",
	}
	tests := []struct {
		file    string
		sets    []string
		notices []string
		check   func(t *testing.T, c *Config)
	}{
		{"testdata/seed_b_003.yml", nil, seedB, func(t *testing.T, c *Config) { checkSeedB(t, c, 262144) }},
		{"testdata/seed_b_003_flat.yml", nil, seedBFlat, func(t *testing.T, c *Config) { checkSeedB(t, c, 262144) }},
		// The seed's trtllm-serve flags, as --set.
		{"testdata/seed_b_003.yml", []string{"tp_size=4", "ep_size=4", "max_seq_len=1048576"},
			append(slices.Clone(seedB), "max_seq_len 1048576 exceeds the model's max_position_embeddings 262144"),
			func(t *testing.T, c *Config) {
				checkSeedB(t, c, 1048576)
				if c.TensorParallelSize != 4 || c.ExpertParallelSize != 4 || c.MaxSeqLen != 1048576 {
					t.Errorf("tp %d ep %d max_seq_len %d, want 4 4 1048576", c.TensorParallelSize, c.ExpertParallelSize, c.MaxSeqLen)
				}
			}},
		{"testdata/seed_a_000.yml", nil, seedA, func(t *testing.T, c *Config) {
			want := fmt.Sprint(4, 2, 4, 16, 8192, 262144, true, false, "MTP", 1, 1, 0.7, "dsa", "v2", "deepseek-v3.2")
			got := fmt.Sprint(c.TensorParallelSize, c.PipelineParallelSize, c.ExpertParallelSize, c.MaxBatchSize, c.MaxNumTokens,
				c.MaxSeqLen, c.EnableChunkedPrefill, c.KVCache.EnableBlockReuse, c.Speculative.DecodingType,
				c.Speculative.NumNextNPredictLayers, c.Speculative.MaxDraftLen, c.Speculative.AcceptanceRate,
				c.AttentionBackend, c.CacheManager, c.ModelSpec().Name)
			if got != want {
				t.Errorf("seed A = %s, want %s", got, want)
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.file, func(t *testing.T) {
			c, notices := load(t, []string{tt.file}, nil, tt.sets)
			if !slices.Equal(notices, tt.notices) {
				t.Errorf("notices =\n%s\nwant\n%s", strings.Join(notices, "\n"), strings.Join(tt.notices, "\n"))
			}
			tt.check(t, c)
		})
	}
}

func checkSeedB(t *testing.T, c *Config, maxSeqLen int) {
	t.Helper()
	want := fmt.Sprint(8, 16384, true, "fp8", 0.8, true, 64, 0, "float16", 256, []int{0}, maxSeqLen, "mamba", "gqa", false, "nemotron-3-ultra-550b-a55b")
	got := fmt.Sprint(c.MaxBatchSize, c.MaxNumTokens, c.EnableChunkedPrefill, c.KVCache.Dtype, c.KVCache.FreeGPUMemoryFraction,
		c.KVCache.EnableBlockReuse, c.KVCache.TokensPerBlock, c.KVCache.AvgSeqLen, c.KVCache.MambaSSMCacheDtype,
		c.MambaState.PeriodicSnapshotInterval, c.MambaState.AdditionalSnapshotOffsetsFromEnd, c.MaxSeqLen, c.CacheManager,
		c.AttentionBackend, c.Speculative.Enabled(), c.ModelSpec().Name)
	if got != want {
		t.Errorf("seed B = %s, want %s", got, want)
	}
}

func TestDefaultsFlatten(t *testing.T) {
	c, notices := load(t, nil, nil, []string{"model=llama-3.1-8b"})
	if len(notices) != 0 {
		t.Errorf("notices = %v, want none", notices)
	}
	want := map[string]any{
		"model": "llama-3.1-8b", "hardware": "h200", "device": "sim", "cache_manager": "v2", "attention_backend": "gqa",
		"isolation": "plugin", "plugin_transport": "auto", "step_overlap": "auto", "weights_dtype": "bf16", "plugin_dirs": nil, "seed": uint64(0), "served_model_name": nil, "sim_calibration": nil, "check_invariants": "every",
		"deep_check_every": 64, "max_batch_size": 64, "max_num_tokens": 8192, "max_seq_len": 131072,
		"enable_chunked_prefill": false, "tensor_parallel_size": 1, "pipeline_parallel_size": 1, "expert_parallel_size": 1,
		"kv_cache_config.enable_block_reuse": true, "kv_cache_config.tokens_per_block": 32,
		"kv_cache_config.free_gpu_memory_fraction": 0.9, "kv_cache_config.avg_seq_len": nil, "kv_cache_config.max_tokens": nil,
		"kv_cache_config.host_cache_size": nil, "kv_cache_config.dtype": "auto", "kv_cache_config.mamba_ssm_cache_dtype": "auto",
		"kv_cache_config.pool_ratio": nil, "kv_cache_config.enable_partial_reuse": true, "kv_cache_config.copy_on_partial_reuse": true,
		"kv_cache_config.eviction_policy": "lru", "workload.retention_priority": nil, "workload.retention_duration_s": nil,
		"mamba_state_config.periodic_snapshot_interval": 0, "mamba_state_config.additional_snapshot_offsets_from_end": nil,
		"speculative_config.decoding_type": nil, "speculative_config.num_nextn_predict_layers": nil,
		"speculative_config.max_draft_len": nil, "speculative_config.acceptance_rate": nil,
		"scheduler_config.capacity_scheduler_policy": "GUARANTEED_NO_EVICT", "scheduler_config.context_chunking_policy": "FIRST_COME_FIRST_SERVED",
		"workload.trace": nil, "workload.limit": nil, "workload.time_scale": nil, "workload.format": nil, "workload.hash_block_tokens": nil, "workload.requests": nil, "workload.concurrency": 0,
		"workload.rate": nil, "workload.prompt_tokens.min": nil, "workload.prompt_tokens.max": nil, "workload.output_tokens.min": nil,
		"workload.output_tokens.max": nil, "workload.shared_prefix_tokens": nil, "workload.shared_prefix_groups": nil,
		"workload.seed":         uint64(0),
		"plugin_timeouts.start": "1m0s", "plugin_timeouts.configure": "5m0s", "plugin_timeouts.call": "10s",
		"plugin_timeouts.forward": "30s", "plugin_timeouts.forward_factor": 10.0,
		"plugin_restarts.max": 8, "plugin_restarts.backoff": "100ms", "plugin_restarts.max_backoff": "5s",
		"plugin_sha256.cache_manager": nil, "plugin_sha256.attention_backend": nil,
		"kv_events_config.enable_kv_cache_events": false, "kv_events_config.publisher": "zmq",
		"kv_events_config.endpoint": "tcp://*:5557", "kv_events_config.replay_endpoint": "",
		"kv_events_config.buffer_steps": 10000, "kv_events_config.topic": "",
		"dtype": "float32",
	}
	for _, f := range model.SyntheticFields() {
		want["synthetic."+f.Key] = nil // zero = default; only device cpu uses them
	}
	got := c.Flatten()
	if !reflect.DeepEqual(got, want) {
		for k := range want {
			if !reflect.DeepEqual(got[k], want[k]) {
				t.Errorf("Flatten()[%q] = %#v, want %#v", k, got[k], want[k])
			}
		}
		for k := range got {
			if _, ok := want[k]; !ok {
				t.Errorf("Flatten() has unexpected key %q", k)
			}
		}
	}
	keys := make([]string, 0, len(got))
	for k := range got {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	if !slices.Equal(keys, KnownKeys()) {
		t.Errorf("KnownKeys() = %v,\n Flatten keys %v", KnownKeys(), keys)
	}
	if c.Workload.Kind() != WorkloadNone || c.Speculative.Enabled() || c.HardwareSpec().Name != "h200" {
		t.Errorf("kind %q spec %v hw %q", c.Workload.Kind(), c.Speculative.Enabled(), c.HardwareSpec().Name)
	}
}

func TestPrecedence(t *testing.T) {
	f1 := writeYAML(t, "model: llama-3.1-8b\nmax_batch_size: 8\nkv_cache_config:\n  tokens_per_block: 16\n  avg_seq_len: 9000\nmoe_expert_parallel_size: 1\n")
	f2 := writeYAML(t, "max_batch_size: 9\n")
	tests := []struct {
		name      string
		files     []string
		env, sets []string
		key       string
		want      any
	}{
		{"file", []string{f1}, nil, nil, "max_batch_size", 8},
		{"later file", []string{f1, f2}, nil, nil, "max_batch_size", 9},
		{"env over file", []string{f1, f2}, []string{"KVX_MAX_BATCH_SIZE=16", "MAX_BATCH_SIZE=3"}, nil, "max_batch_size", 16},
		{"set over env", []string{f1}, []string{"KVX_MAX_BATCH_SIZE=16"}, []string{"max_batch_size=32"}, "max_batch_size", 32},
		{"last set wins", []string{f1}, nil, []string{"max_batch_size=32", "max_batch_size=33"}, "max_batch_size", 33},
		{"env nesting", []string{f1}, []string{"KVX_KV_CACHE_CONFIG__TOKENS_PER_BLOCK=64"}, nil, "kv_cache_config.tokens_per_block", 64},
		{"env keeps siblings", []string{f1}, []string{"KVX_KV_CACHE_CONFIG__TOKENS_PER_BLOCK=64"}, nil, "kv_cache_config.avg_seq_len", 9000},
		{"set nesting over env", []string{f1}, []string{"KVX_KV_CACHE_CONFIG__TOKENS_PER_BLOCK=64"}, []string{"kv_cache_config.tokens_per_block=128"}, "kv_cache_config.tokens_per_block", 128},
		{"set null unsets", []string{f1}, nil, []string{"kv_cache_config.avg_seq_len=null"}, "kv_cache_config.avg_seq_len", nil},
		{"alias in later source wins", []string{f1}, nil, []string{"model=deepseek-v3", "expert_parallel_size=2", "tensor_parallel_size=2"}, "expert_parallel_size", 2},
		{"env string", nil, []string{"KVX_MODEL=deepseek-v3", "KVX_HARDWARE=B200"}, nil, "hardware", "b200"},
		{"set flow list", []string{f1}, nil, []string{"kv_cache_config.pool_ratio=[0.25, 0.75]"}, "kv_cache_config.pool_ratio", []float64{0.25, 0.75}},
		{"set flow map", []string{f1}, nil, []string{"workload.requests=4", "workload.prompt_tokens={min: 10, max: 20}", "workload.output_tokens=7"},
			"workload.prompt_tokens.max", 20},
		{"shorthand", []string{f1}, nil, []string{"workload.requests=4", "workload.prompt_tokens=10", "workload.output_tokens=7"},
			"workload.output_tokens.min", 7},
		{"eviction policy default", []string{f1}, nil, nil, "kv_cache_config.eviction_policy", "lru"},
		{"eviction policy lfu", []string{f1}, nil, []string{"kv_cache_config.eviction_policy=LFU"}, "kv_cache_config.eviction_policy", "lfu"},
		{"retention priority", []string{f1}, nil, []string{"workload.retention_priority=80", "workload.retention_duration_s=1.5"}, "workload.retention_duration_s", 1.5},
		{"retention unset", []string{f1}, nil, nil, "workload.retention_priority", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, _ := load(t, tt.files, tt.env, tt.sets)
			if got := c.Flatten()[tt.key]; !reflect.DeepEqual(got, tt.want) {
				t.Errorf("%s = %#v, want %#v", tt.key, got, tt.want)
			}
		})
	}
}

// Every error class, with its exact message.
func TestErrors(t *testing.T) {
	trace := filepath.Join(t.TempDir(), "none.jsonl")
	existing, err := filepath.Abs("testdata/seed_a_000.yml")
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		yaml string
		env  []string
		sets []string
		want string
	}{
		{"unknown typo", "kv_cache_config:\n  tokens_per_blok: 64\n", nil, nil,
			`unknown key "kv_cache_config.tokens_per_blok" (file F); did you mean "kv_cache_config.tokens_per_block"?`},
		{"unknown misplaced", "tokens_per_block: 64\n", nil, nil,
			`unknown key "tokens_per_block" (file F); did you mean "kv_cache_config.tokens_per_block"?`},
		{"unknown far", "", nil, []string{"qqqqqqqqqqqqqqqqqqqq=1"},
			`unknown key "qqqqqqqqqqqqqqqqqqqq" (--set); nearest known key: "max_seq_len"`},
		{"unknown env", "", []string{"KVX_MAX_BATCH=3"}, nil,
			`unknown key "max_batch" (env KVX_MAX_BATCH); did you mean "max_batch_size"?`},
		{"unknown under ranged key", "", nil, []string{"workload.prompt_tokens.avg=3"},
			`unknown key "workload.prompt_tokens.avg" (--set); did you mean "workload.prompt_tokens.max"?`},
		{"not an integer", "max_batch_size: lots\n", nil, nil, `max_batch_size: "lots" (file F) is not an integer`},
		{"kv events endpoint", "kv_events_config: {enable_kv_cache_events: true, endpoint: \"udp://x:1\"}\n", nil, nil,
			`kv_events_config.endpoint: "udp://x:1" (file F) has transport "udp"; allowed: tcp://HOST:PORT (HOST * to bind every interface) or ipc://PATH`},
		{"kv events port", "", nil, []string{"kv_events_config.replay_endpoint=tcp://*:70000"},
			`kv_events_config.replay_endpoint: "tcp://*:70000" (--set) has port "70000"; allowed: 0..65535`},
		{"kv events publisher", "", nil, []string{"kv_events_config.publisher=kafka"},
			`kv_events_config.publisher: "kafka" (--set) is not one of zmq, null`},
		{"kv events buffer", "", nil, []string{"kv_events_config.buffer_steps=0"},
			`kv_events_config.buffer_steps: 0 (--set) is out of range; allowed: 1 <= value <= 2147483647`},
		{"kv events same endpoints", "kv_events_config: {enable_kv_cache_events: true, endpoint: \"tcp://*:5557\", replay_endpoint: \"tcp://*:5557\"}\n", nil, nil,
			`kv_events_config.replay_endpoint: "tcp://*:5557" (file F) is kv_events_config.endpoint too (file F); give the replay socket its own endpoint`},
		{"float for integer", "", nil, []string{"max_num_tokens=1.5"}, `max_num_tokens: 1.5 (--set) is not an integer`},
		{"not a bool", "enable_chunked_prefill: maybe\n", nil, nil, `enable_chunked_prefill: "maybe" (file F) is not true or false`},
		{"not a number", "kv_cache_config: {free_gpu_memory_fraction: half}\n", nil, nil,
			`kv_cache_config.free_gpu_memory_fraction: "half" (file F) is not a number`},
		{"fraction range", "", nil, []string{"kv_cache_config.free_gpu_memory_fraction=1.5"},
			`kv_cache_config.free_gpu_memory_fraction: 1.5 (--set) is out of range; allowed: 0 < value <= 1`},
		{"fraction zero", "", nil, []string{"kv_cache_config.free_gpu_memory_fraction=0"},
			`kv_cache_config.free_gpu_memory_fraction: 0 (--set) is out of range; allowed: 0 < value <= 1`},
		{"int range", "max_batch_size: 0\n", nil, nil, `max_batch_size: 0 (file F) is out of range; allowed: 1 <= value <= 2147483647`},
		{"tokens per block", "", nil, []string{"kv_cache_config.tokens_per_block=48"},
			`kv_cache_config.tokens_per_block: 48 (--set) is out of range; allowed: a power of two from 1 to 1048576`},
		{"enum", "", []string{"KVX_DEVICE=tpu"}, nil, `device: "tpu" (env KVX_DEVICE) is not one of sim, cpu, cuda`},
		{"enum hardware", "hardware: a100\n", nil, nil, `hardware: "a100" (file F) is not one of b200, h100, h200`},
		{"enum kv dtype", "kv_cache_config: {dtype: nvfp4}\n", nil, nil, `kv_cache_config.dtype: "nvfp4" (file F) is not one of auto, bf16, fp8`},
		{"eviction policy", "kv_cache_config: {eviction_policy: fifo}\n", nil, nil,
			`kv_cache_config.eviction_policy: "fifo" (file F) is not one of lru, lfu`},
		{"retention priority", "", nil, []string{"workload.retention_priority=101"},
			`workload.retention_priority: 101 (--set) is out of range; allowed: 1 <= value <= 100`},
		{"retention priority zero", "workload: {retention_priority: 0}\n", nil, nil,
			`workload.retention_priority: 0 (file F) is out of range; allowed: 1 <= value <= 100`},
		{"retention duration", "", nil, []string{"workload.retention_priority=80", "workload.retention_duration_s=-3"},
			`workload.retention_duration_s: -3 (--set) is out of range; allowed: 0 < value <= 31536000 seconds`},
		{"retention duration alone", "", nil, []string{"workload.retention_duration_s=30"},
			`workload.retention_duration_s: 30 set without workload.retention_priority: it is how long that priority lasts`},
		{"enum policy", "scheduler_config: {capacity_scheduler_policy: STATIC_BATCH}\n", nil, nil,
			`scheduler_config.capacity_scheduler_policy: "STATIC_BATCH" (file F) is not one of GUARANTEED_NO_EVICT, MAX_UTILIZATION`},
		{"cache manager", "cache_manager: v3\n", nil, nil, `cache_manager: "v3" (file F) is not one of v2, mamba, v1 or a plugin path (containing a path separator)`},
		{"check invariants", "check_invariants: sometimes\n", nil, nil, `check_invariants: "sometimes" (file F) is not "every", "off" or a number of steps`},
		{"bytes", "kv_cache_config: {host_cache_size: 64 parsecs}\n", nil, nil,
			`kv_cache_config.host_cache_size: "64 parsecs" (file F) is not a byte count (an integer or a size such as "64GiB")`},
		{"negative bytes", "", nil, []string{"kv_cache_config.host_cache_size=-1"},
			`kv_cache_config.host_cache_size: -1 (--set) is out of range; allowed: 0 <= bytes < 2^63`},
		{"pool ratio type", "kv_cache_config: {pool_ratio: 0.5}\n", nil, nil, `kv_cache_config.pool_ratio: 0.5 (file F) is not a list of numbers`},
		{"map for value", "max_batch_size: {a: 1}\n", nil, nil, `max_batch_size: a map (file F) is not an integer`},
		{"value for map", "kv_cache_config: 5\n", nil, nil, `kv_cache_config: 5 (file F) is not a map`},
		{"alias conflict", "expert_parallel_size: 2\nmoe_expert_parallel_size: 4\ntensor_parallel_size: 4\n", nil, nil,
			`expert_parallel_size: expert_parallel_size and moe_expert_parallel_size: 2 vs 4 (file F) name the same setting with different values`},
		{"pool ratio sum", "kv_cache_config: {pool_ratio: [0.5, 0.4]}\n", nil, nil,
			`kv_cache_config.pool_ratio: [0.5, 0.4] sums to 0.9; the ratios must sum to 1`},
		{"avg over max", "max_seq_len: 1000\nkv_cache_config: {avg_seq_len: 2000}\n", nil, nil,
			`kv_cache_config.avg_seq_len: 2000 exceeds max_seq_len 1000`},
		{"avg over model default", "kv_cache_config: {avg_seq_len: 200000}\n", nil, nil,
			`kv_cache_config.avg_seq_len: 200000 exceeds max_seq_len 131072`},
		{"num tokens under block", "max_num_tokens: 16\n", nil, nil, `max_num_tokens: 16 is less than kv_cache_config.tokens_per_block 32`},
		{"snapshot interval", "mamba_state_config: {periodic_snapshot_interval: 100}\n", nil, []string{"model=nemotron-3-nano-30b-a3b"},
			`mamba_state_config.periodic_snapshot_interval: 100 is not a multiple of kv_cache_config.tokens_per_block 32 (snapshots sit on block boundaries)`},
		{"pp too large", "pipeline_parallel_size: 33\n", nil, nil,
			`pipeline_parallel_size: pipeline parallel size 33 exceeds the 32 decoder layers of model "llama-3.1-8b"`},
		{"tp heads", "tensor_parallel_size: 3\n", nil, nil,
			`tensor_parallel_size: model "llama-3.1-8b": tensor parallel size 3 does not divide the 32 attention heads`},
		{"ep divides tp", "tensor_parallel_size: 4\nexpert_parallel_size: 3\n", nil, []string{"model=deepseek-v3"},
			"expert_parallel_size: 3 does not divide tensor_parallel_size 4\n" +
				`expert_parallel_size: 3 does not divide the 256 experts of model "deepseek-v3"`},
		{"ep without experts", "tensor_parallel_size: 2\nexpert_parallel_size: 2\n", nil, nil,
			`expert_parallel_size: 2 needs a MoE model; model "llama-3.1-8b" has no experts`},
		{"dsa on gqa", "attention_backend: dsa\n", nil, nil,
			`attention_backend: "dsa" does not fit model "llama-3.1-8b", whose layers need mixer gqa: backend dsa runs dsa; allowed: gqa, or a plugin path`},
		{"gqa on dsa", "attention_backend: gqa\n", nil, []string{"model=glm-5"},
			`attention_backend: "gqa" does not fit model "glm-5", whose layers need mixer dsa: backend gqa runs gqa, mamba, none (ffn only); allowed: dsa or mla, or a plugin path`},
		{"mtp without layers", "speculative_config: {decoding_type: MTP}\n", nil, nil,
			`speculative_config.decoding_type: MTP needs MTP layers; model "llama-3.1-8b" has num_nextn_predict_layers 0`},
		{"spec without type", "speculative_config: {max_draft_len: 2}\n", nil, nil,
			`speculative_config.max_draft_len: set without speculative_config.decoding_type (MTP)`},
		{"spec type", "speculative_config: {decoding_type: Eagle3}\n", nil, nil,
			`speculative_config.decoding_type: "Eagle3" (file F) is not one of MTP`},
		{"model missing", "", nil, []string{"model=null"},
			`model: missing; give a preset (deepseek-v3, deepseek-v3.2, glm-5, glm-5.1, glm-5.2, llama-3.1-8b, llama-3.1-8b-instruct, nemotron-3-nano-30b-a3b, nemotron-3-super-120b-a12b-fp8, nemotron-3-ultra-550b-a55b, nemotron-h-56b-base-8k, qwen3-next-80b-a3b-thinking) or a path to a config.json`},
		{"model unknown", "", nil, []string{"model=llama-4"},
			`model: "llama-4" (--set): unknown model preset "llama-4"; presets: deepseek-v3, deepseek-v3.2, glm-5, glm-5.1, glm-5.2, llama-3.1-8b, llama-3.1-8b-instruct, nemotron-3-nano-30b-a3b, nemotron-3-super-120b-a12b-fp8, nemotron-3-ultra-550b-a55b, nemotron-h-56b-base-8k, qwen3-next-80b-a3b-thinking (or give a path to a config.json)`},
		{"trace and generator", "workload: {trace: x.jsonl, requests: 3}\n", nil, nil,
			`workload: trace "x.jsonl" and requests 3 are exclusive: a workload is a trace or a generator`},
		{"trace with generator key", "workload: {trace: " + existing + ", rate: 2}\n", nil, nil,
			`workload.rate: a generator key, but workload.trace is set`},
		{"trace missing", "workload: {trace: " + trace + "}\n", nil, nil,
			`workload.trace: stat ` + trace + `: no such file or directory`},
		{"generator without prompt", "workload: {requests: 3, output_tokens: 5}\n", nil, nil,
			`workload.prompt_tokens: missing; the generator (workload.requests) needs it, as {min, max} or one number`},
		{"prompt min over max", "workload: {requests: 3, output_tokens: 5, prompt_tokens: {min: 9, max: 3}}\n", nil, nil,
			`workload.prompt_tokens: min 9 exceeds max 3`},
		{"rate with concurrency", "workload: {requests: 3, output_tokens: 5, prompt_tokens: 9, rate: 2, concurrency: 4}\n", nil, nil,
			`workload.rate: 2 must be 0 when workload.concurrency (4) is set: a closed loop has no arrival rate`},
		{"generator key without requests", "workload: {prompt_tokens: 9}\n", nil, nil,
			`workload.prompt_tokens: set without workload.requests, which selects the generator`},
		{"trace key without trace", "workload: {time_scale: 2}\n", nil, nil, `workload.time_scale: set without workload.trace`},
		{"time scale", "workload: {time_scale: 0}\n", nil, nil, `workload.time_scale: 0 (file F) is out of range; allowed: a finite number > 0`},
		{"trace format", "workload: {format: sharegpt}\n", nil, nil, `workload.format: "sharegpt" (file F) is not one of mooncake, azure, burstgpt, bailian`},
		{"hash block tokens", "workload: {hash_block_tokens: 0}\n", nil, nil, `workload.hash_block_tokens: 0 (file F) is out of range; allowed: 1 <= value <= 2147483647`},
		{"format without trace", "workload: {format: azure}\n", nil, nil, `workload.format: set without workload.trace`},
		{"set syntax", "", nil, []string{"max_batch_size"}, `--set "max_batch_size": want key=value`},
		{"set yaml", "", nil, []string{"kv_cache_config.pool_ratio=[0.5,"},
			`--set kv_cache_config.pool_ratio: value "[0.5," is not a YAML scalar or flow list: yaml: line 1: did not find expected node content`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := writeYAML(t, "model: llama-3.1-8b\n"+tt.yaml)
			_, _, err := Load(testReg, []string{f}, tt.env, tt.sets)
			if err == nil {
				t.Fatalf("Load = nil error, want %q", tt.want)
			}
			want := strings.ReplaceAll(tt.want, "(file F)", "(file "+f+")")
			if got := err.Error(); got != want {
				t.Errorf("Load error\n got %q\nwant %q", got, want)
			}
		})
	}
}

func TestFileErrors(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "nope.yaml")
	bad := writeYAML(t, "model: [unclosed\n")
	_, _, err := Load(testReg, []string{missing, bad}, nil, []string{"model=llama-3.1-8b"})
	want := "config file " + missing + ": open " + missing + ": no such file or directory\n" +
		"config file " + bad + ": yaml: line 2: did not find expected ',' or ']' (while parsing a flow sequence that starts at line 1)"
	if err == nil || err.Error() != want {
		t.Errorf("Load error\n got %v\nwant %s", err, want)
	}
}

// TestYAMLErrorLines: a YAML error names the line where parsing failed
// (not the line before the construct, counted from 0), and is not followed
// by complaints about keys the unreadable file would have set.
func TestYAMLErrorLines(t *testing.T) {
	head := "# a config\n# comments\nmodel: llama-3.1-8b\nmax_batch_size: 4\nworkload:\n  requests: 2\n"
	for _, tc := range []struct {
		tail string
		want string
	}{
		{"kv_cache_config:\n  tokens_per_block: 32\n\tdtype: fp8\n", "line 9: found a tab character"},
		{"kv_cache_config:\n  tokens_per_block: 32\n   dtype: fp8\n", "line 9: mapping values are not allowed"},
		{"seed: 3\nkv_cache_config: {tokens_per_block: 32,\n  dtype: fp8\nhardware: h200\n", "line 10: did not find expected ',' or '}' (while parsing a flow mapping that starts at line 8)"},
	} {
		f := writeYAML(t, head+tc.tail)
		_, _, err := Load(testReg, []string{f}, nil, nil)
		if err == nil || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "missing") {
			t.Errorf("Load(%q) = %v, want an error with %q and nothing about missing keys", tc.tail, err, tc.want)
		}
	}
}

// All problems come back at once, not just the first.
func TestErrorsCollected(t *testing.T) {
	f := writeYAML(t, "model: llama-3.1-8b\nmax_batch_size: -1\ndevice: tpu\nkv_cache_config:\n  tokens_per_blok: 3\n  dtype: int4\nfoo: 1\n")
	_, _, err := Load(testReg, []string{f}, []string{"KVX_SEED=abc"}, []string{"workload.rate=-1"})
	if err == nil {
		t.Fatal("Load = nil error")
	}
	for _, key := range []string{"max_batch_size:", "device:", `"kv_cache_config.tokens_per_blok"`, "kv_cache_config.dtype:", `"foo"`,
		"seed: \"abc\" (env KVX_SEED) is not an unsigned integer", "workload.rate: -1 (--set)"} {
		if !strings.Contains(err.Error(), key) {
			t.Errorf("error does not mention %s:\n%v", key, err)
		}
	}
	if n := strings.Count(err.Error(), "\n") + 1; n != 7 {
		t.Errorf("got %d errors, want 7:\n%v", n, err)
	}
}

func TestIgnoredKeysNotices(t *testing.T) {
	for _, ig := range IgnoredKeys() {
		set := ig + "=1"
		_, notices, err := Load(testReg, nil, nil, []string{"model=llama-3.1-8b", set})
		if err != nil {
			t.Errorf("--set %s: %v", set, err)
			continue
		}
		if want := []string{"key " + ig + " has no effect in kvx"}; !slices.Equal(notices, want) {
			t.Errorf("--set %s: notices %v, want %v", set, notices, want)
		}
	}
	// Everything under an ignored map is one notice.
	f := writeYAML(t, "model: llama-3.1-8b\ncuda_graph_config:\n  enable_padding: true\n  batch_sizes: [1, 2]\nmoe_config: {}\n")
	_, notices := load(t, []string{f}, nil, nil)
	if want := []string{"key cuda_graph_config has no effect in kvx", "key moe_config has no effect in kvx"}; !slices.Equal(notices, want) {
		t.Errorf("notices %v, want %v", notices, want)
	}
}

func TestValueForms(t *testing.T) {
	tests := []struct {
		set  string
		key  string
		want any
	}{
		{"kv_cache_config.host_cache_size=64GiB", "kv_cache_config.host_cache_size", int64(64 << 30)},
		{"kv_cache_config.host_cache_size=1.5 TB", "kv_cache_config.host_cache_size", int64(1.5e12)},
		{"kv_cache_config.host_cache_size=4096", "kv_cache_config.host_cache_size", int64(4096)},
		{"kv_cache_config.host_cache_size=0", "kv_cache_config.host_cache_size", int64(0)},
		{"check_invariants=off", "check_invariants", "off"},
		{"check_invariants=8", "check_invariants", 8},
		{"check_invariants=every", "check_invariants", "every"},
		{"max_batch_size=\"12\"", "max_batch_size", 12},
		{"enable_chunked_prefill=TRUE", "enable_chunked_prefill", true},
		{"weights_dtype=nvfp4", "weights_dtype", "fp4"},
		{"kv_cache_config.dtype=FP8", "kv_cache_config.dtype", "fp8"},
		{"kv_cache_config.mamba_ssm_cache_dtype=bf16", "kv_cache_config.mamba_ssm_cache_dtype", "bfloat16"},
		{"plugin_dirs=/opt/kvx", "plugin_dirs", []string{"/opt/kvx"}},
		{"plugin_dirs=[a, b]", "plugin_dirs", []string{"a", "b"}},
		{"seed=18446744073709551615", "seed", uint64(18446744073709551615)},
		{"cache_manager=./bin/mymgr", "cache_manager", "./bin/mymgr"},
		{"plugin_timeouts.call=1.5", "plugin_timeouts.call", "1.5s"},
		{"plugin_timeouts.start=500ms", "plugin_timeouts.start", "500ms"},
		{"plugin_timeouts.forward=2m", "plugin_timeouts.forward", "2m0s"},
		{"plugin_timeouts.forward_factor=4", "plugin_timeouts.forward_factor", 4.0},
	}
	for _, tt := range tests {
		c, _ := load(t, nil, nil, []string{"model=llama-3.1-8b", tt.set})
		if got := c.Flatten()[tt.key]; !reflect.DeepEqual(got, tt.want) {
			t.Errorf("--set %s: %s = %#v, want %#v", tt.set, tt.key, got, tt.want)
		}
	}
}

func TestWorkloadModes(t *testing.T) {
	trace := filepath.Join(t.TempDir(), "t.jsonl")
	if err := os.WriteFile(trace, []byte("{}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	c, _ := load(t, nil, nil, []string{"model=llama-3.1-8b", "seed=7", "workload.trace=" + trace, "workload.limit=10", "workload.time_scale=0.5"})
	if w := c.Workload; w.Kind() != WorkloadTrace || w.Limit != 10 || w.TimeScale != 0.5 || w.Seed != 7 {
		t.Errorf("trace workload = %+v", w)
	}
	c, _ = load(t, nil, nil, []string{"model=llama-3.1-8b", "workload.trace=" + trace, "workload.format=Bailian", "workload.hash_block_tokens=8"})
	if w := c.Workload; w.Format != "bailian" || w.HashBlockTokens != 8 {
		t.Errorf("bailian trace workload = %+v, want format bailian, hash_block_tokens 8", w)
	}
	const noIDs = "workload.hash_block_tokens: 16, but workload.format azure traces have no hash_ids"
	if _, _, err := Load(testReg, nil, nil, []string{"model=llama-3.1-8b", "workload.trace=" + trace, "workload.format=azure", "workload.hash_block_tokens=16"}); err == nil || !strings.Contains(err.Error(), noIDs) {
		t.Errorf("azure with hash_block_tokens: Load = %v, want an error containing %q", err, noIDs)
	}
	c, _ = load(t, nil, nil, []string{"model=llama-3.1-8b", "workload.requests=5", "workload.prompt_tokens.max=100",
		"workload.output_tokens={min: 1, max: 9}", "workload.shared_prefix_tokens=50", "workload.seed=3"})
	w := c.Workload
	if w.Kind() != WorkloadGenerator || w.PromptTokens != (Range{100, 100}) || w.OutputTokens != (Range{1, 9}) || w.Seed != 3 || w.SharedPrefixGroups != 1 {
		t.Errorf("generator workload = %+v", w)
	}
	_, notices := load(t, nil, nil, []string{"model=llama-3.1-8b", "workload.requests=1", "workload.prompt_tokens=131072", "workload.output_tokens=1"})
	if want := "workload: prompt_tokens.max 131072 + output_tokens.max 1 exceeds max_seq_len 131072; such requests will be rejected"; !slices.Contains(notices, want) {
		t.Errorf("notices %v, want %q", notices, want)
	}
}

// formatValue writes a Flatten value the way a user would pass it to --set.
func formatValue(v any) string {
	switch x := v.(type) {
	case []float64:
		return "[" + strings.Trim(strings.Join(strings.Fields(fmt.Sprint(x)), ", "), "[]") + "]"
	case []int:
		return "[" + strings.Trim(strings.Join(strings.Fields(fmt.Sprint(x)), ", "), "[]") + "]"
	case []string:
		return "[" + strings.Join(x, ", ") + "]"
	case float64:
		return fmtFloat(x)
	}
	return fmt.Sprint(v)
}

// Any non-nil Flatten value set back with --set gives the same config (what
// kvx compare --vary relies on).
func TestFlattenRoundTrip(t *testing.T) {
	trace := filepath.Join(t.TempDir(), "t.jsonl")
	if err := os.WriteFile(trace, []byte("{}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	bases := []struct {
		files, sets []string
	}{
		{[]string{"testdata/seed_a_000.yml"}, []string{"kv_cache_config.pool_ratio=[0.25, 0.75]", "kv_cache_config.host_cache_size=1GiB", "workload.trace=" + trace}},
		{[]string{"testdata/seed_b_003.yml"}, []string{"plugin_dirs=[a, b]", "check_invariants=16", "workload.requests=3", "workload.prompt_tokens={min: 5, max: 9}", "workload.output_tokens=4"}},
	}
	for _, b := range bases {
		base, _ := load(t, b.files, nil, b.sets)
		want := base.Flatten()
		for key, v := range want {
			if v == nil {
				continue
			}
			sets := append(slices.Clone(b.sets), key+"="+formatValue(v))
			c, _, err := Load(testReg, b.files, nil, sets)
			if err != nil {
				t.Errorf("%v + --set %s=%s: %v", b.files, key, formatValue(v), err)
				continue
			}
			if got := c.Flatten(); !reflect.DeepEqual(got, want) {
				t.Errorf("%v + --set %s=%s changed the config", b.files, key, formatValue(v))
			}
		}
	}
}

func TestSuggest(t *testing.T) {
	tests := []struct {
		raw, want string
		close     bool
	}{
		{"max_batch_sise", "max_batch_size", true},
		{"kv_cache_config.free_gpu_mem_fraction", "kv_cache_config.free_gpu_memory_fraction", true},
		{"speculative_config.tokens_per_block", "kv_cache_config.tokens_per_block", true},
		{"cuda_graph_conf", "cuda_graph_config", true},
	}
	for _, tt := range tests {
		got, close := suggest(tt.raw)
		if got != tt.want || close != tt.close {
			t.Errorf("suggest(%q) = %q, %v; want %q, %v", tt.raw, got, close, tt.want, tt.close)
		}
	}
	for _, p := range [][3]any{{"", "", 0}, {"kitten", "sitting", 3}, {"abc", "abc", 0}, {"abc", "", 3}} {
		if d := levenshtein(p[0].(string), p[1].(string)); d != p[2].(int) {
			t.Errorf("levenshtein(%q, %q) = %d, want %d", p[0], p[1], d, p[2])
		}
	}
}

func BenchmarkLoadSeedB(b *testing.B) {
	for b.Loop() {
		if _, _, err := Load(testReg, []string{"testdata/seed_b_003.yml"}, []string{"KVX_MAX_BATCH_SIZE=16"}, []string{"tp_size=4"}); err != nil {
			b.Fatal(err)
		}
	}
}

// A relative workload.trace in a YAML file is relative to that file; given
// with --set it is relative to the working directory.
func TestTracePathRelativeToFile(t *testing.T) {
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "traces"), 0o755); err != nil {
		t.Fatal(err)
	}
	trace := filepath.Join(dir, "traces", "t.jsonl")
	if err := os.WriteFile(trace, []byte(`{"timestamp": 0, "input_length": 10, "output_length": 2, "hash_ids": [0]}`+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cfgPath := filepath.Join(dir, "c.yaml")
	if err := os.WriteFile(cfgPath, []byte("model: llama-3.1-8b\nworkload:\n  trace: traces/t.jsonl\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	c, _, err := Load(testReg, []string{cfgPath}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if c.Workload.Trace != trace {
		t.Errorf("workload.trace = %q, want %q", c.Workload.Trace, trace)
	}
	if _, _, err := Load(testReg, []string{cfgPath}, nil, []string{"workload.trace=traces/t.jsonl"}); err == nil {
		t.Errorf("--set workload.trace=traces/t.jsonl resolved against the config file's directory, want the working directory")
	}
}

// A relative model path in a YAML file is relative to that file, as
// workload.trace is; a preset name is never taken for a path.
func TestModelPathRelativeToFile(t *testing.T) {
	dir := t.TempDir()
	src, err := os.ReadFile("../../device/hf/testdata/llama/config.json")
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(dir, "ckpt"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "ckpt", "config.json"), src, 0o644); err != nil {
		t.Fatal(err)
	}
	cfgPath := filepath.Join(dir, "sub", "c.yaml")
	if err := os.MkdirAll(filepath.Dir(cfgPath), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(cfgPath, []byte("model: ../ckpt/config.json\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	c, _, err := Load(testReg, []string{cfgPath}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if want := filepath.Join(dir, "ckpt", "config.json"); c.Model != want {
		t.Errorf("model = %q, want %q", c.Model, want)
	}
	if _, _, err := Load(testReg, []string{cfgPath}, nil, []string{"model=../ckpt/config.json"}); err == nil {
		t.Errorf("--set model=../ckpt/config.json resolved against the config file's directory, want the working directory")
	}
	if err := os.WriteFile(cfgPath, []byte("model: llama-3.1-8b\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if c, _, err := Load(testReg, []string{cfgPath}, nil, nil); err != nil {
		t.Errorf("preset from a file: %v", err)
	} else if c.Model != "llama-3.1-8b" {
		t.Errorf("preset from a file: model %q, want the preset name unchanged", c.Model)
	}
}
