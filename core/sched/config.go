package sched

import (
	"strconv"

	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
)

// Policy is the capacity scheduler policy
// (scheduler_config.capacity_scheduler_policy).
type Policy int

const (
	// GuaranteedNoEvict admits a request only when the cache can hold it to
	// completion: the admission asks Hold = Prompt + MaxNew + Draft. It never
	// preempts a request that could still make progress, and may under-admit.
	GuaranteedNoEvict Policy = iota
	// MaxUtilization admits what fits for one step and, when a running
	// request cannot grow, preempts the most recently admitted running
	// requests (free + recompute later).
	MaxUtilization
)

// String returns the TensorRT-LLM spelling of the policy.
func (p Policy) String() string {
	switch p {
	case GuaranteedNoEvict:
		return "GUARANTEED_NO_EVICT"
	case MaxUtilization:
		return "MAX_UTILIZATION"
	}
	return "Policy(" + strconv.Itoa(int(p)) + ")"
}

// ParsePolicy parses "GUARANTEED_NO_EVICT" or "MAX_UTILIZATION". The error is
// of kind kvcache.KindInvalidConfig and names the value and what is allowed.
func ParsePolicy(s string) (Policy, error) {
	switch s {
	case "GUARANTEED_NO_EVICT":
		return GuaranteedNoEvict, nil
	case "MAX_UTILIZATION":
		return MaxUtilization, nil
	case "STATIC_BATCH":
		return 0, kvcache.Errorf(kvcache.KindInvalidConfig,
			"capacity_scheduler_policy %q is not supported by kvx; allowed: GUARANTEED_NO_EVICT, MAX_UTILIZATION", s)
	}
	return 0, kvcache.Errorf(kvcache.KindInvalidConfig,
		"capacity_scheduler_policy %q is unknown; allowed: GUARANTEED_NO_EVICT, MAX_UTILIZATION", s)
}

// Config are the scheduler's limits. All counts are in tokens unless named
// otherwise.
type Config struct {
	MaxBatchSize   int  // items per micro-batch (max_batch_size)
	MaxResident    int  // admitted, unfinished requests (max_batch_size * pipeline_parallel_size)
	MaxNumTokens   int  // tokens per micro-batch (max_num_tokens); a generation item counts 1 + Draft
	MaxSeqLen      int  // prompt + output tokens of one request (max_seq_len)
	MaxSeqTokens   int  // guaranteed capacity of one sequence: min over stages of Layout.MaxSeqTokens
	ChunkedPrefill bool // enable_chunked_prefill
	TokensPerBlock int  // every prefill chunk but a request's last ends on a multiple of it
	Draft          int  // draft tokens per generation step (MTP); 0 = none
	Reuse          bool // ask Capacity.Lookup for requests being admitted (enable_block_reuse)
	Policy         Policy
	// Suspend lets MAX_UTILIZATION pause a request by suspending it to the
	// host tier when the Capacity implements Suspender (every stage has one).
	Suspend bool
}

// validate checks cfg; the error names the field, its value and the limit.
func (cfg Config) validate() error {
	bad := func(format string, args ...any) error {
		return kvcache.Errorf(kvcache.KindInvalidConfig, "sched: "+format, args...)
	}
	switch {
	case cfg.MaxBatchSize < 1:
		return bad("MaxBatchSize (max_batch_size) = %d, must be >= 1", cfg.MaxBatchSize)
	case cfg.MaxResident < cfg.MaxBatchSize:
		return bad("MaxResident = %d is below MaxBatchSize %d (it is max_batch_size * pipeline_parallel_size)",
			cfg.MaxResident, cfg.MaxBatchSize)
	case cfg.TokensPerBlock < 1:
		return bad("TokensPerBlock (tokens_per_block) = %d, must be >= 1", cfg.TokensPerBlock)
	case cfg.Draft < 0:
		return bad("Draft = %d, must be >= 0", cfg.Draft)
	case cfg.MaxNumTokens < 1+cfg.Draft:
		return bad("MaxNumTokens (max_num_tokens) = %d is below 1 + Draft = %d: no generation step fits",
			cfg.MaxNumTokens, 1+cfg.Draft)
	case cfg.MaxNumTokens < cfg.TokensPerBlock:
		return bad("MaxNumTokens (max_num_tokens) = %d is below TokensPerBlock %d: a prefill chunk must hold one block",
			cfg.MaxNumTokens, cfg.TokensPerBlock)
	case cfg.MaxSeqLen < 2:
		return bad("MaxSeqLen (max_seq_len) = %d, must be >= 2 (one prompt and one output token)", cfg.MaxSeqLen)
	case cfg.MaxSeqTokens < 2+cfg.Draft:
		return bad("MaxSeqTokens = %d is below %d, the token slots of the smallest request (prompt 1 + output 1 + Draft %d)",
			cfg.MaxSeqTokens, 2+cfg.Draft, cfg.Draft)
	case cfg.Policy != GuaranteedNoEvict && cfg.Policy != MaxUtilization:
		return bad("Policy = %d, allowed: GuaranteedNoEvict (%d), MaxUtilization (%d)",
			int(cfg.Policy), int(GuaranteedNoEvict), int(MaxUtilization))
	}
	return nil
}
