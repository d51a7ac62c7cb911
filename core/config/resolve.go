package config

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/kvx-dev/kvx/core/hw"
	"github.com/kvx-dev/kvx/core/registry"
	"github.com/kvx-dev/kvx/core/workload"
	"github.com/kvx-dev/kvx/plugins/model"
	"github.com/kvx-dev/kvx/plugins/v1/spec"
)

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
		if !ld.bad["hardware"] {
			ld.resolveCalibration(c)
		}
	}

	// Model.
	haveModel := false
	switch {
	case ld.bad["model"]:
	case c.Model == "":
		ld.crossErr("model: missing; give a preset (%s) or a path to a config.json", strings.Join(model.Presets(), ", "))
	default:
		// A relative path in a YAML file is relative to that file, as
		// workload.trace is; a preset name has no path separator.
		if o := ld.originOf("model"); o.file != "" && strings.ContainsRune(c.Model, filepath.Separator) && !filepath.IsAbs(c.Model) {
			c.Model = filepath.Join(filepath.Dir(o.file), c.Model)
		}
		m, err := model.Load(c.Model)
		if err != nil {
			ld.crossErr("model: %q (%s): %v", c.Model, ld.originOf("model").where, err)
		} else {
			c.model, haveModel = m, true
		}
	}
	ld.resolveDtype(c)
	if haveModel && c.model.Checkpoint != "" && c.KVCache.Dtype == "auto" && c.Dtype == "float32" {
		// auto is the checkpoint's own dtype where the kernels keep it:
		// with the exact numerics a float32 checkpoint keeps float32 KV
		// (bf16 and fp16 ones, and the fast numerics, run bf16).
		if dt, err := model.CheckpointDtype(c.model.Checkpoint); err != nil {
			ld.crossErr("model: %q: %v", c.Model, err)
		} else if dt == "float32" {
			c.KVCache.Dtype = "float32"
		}
	}
	haveModel = ld.resolveSynthetic(c, haveModel)
	if ev := c.KVEvents; ev.EnableKVCacheEvents && ev.ReplayEndpoint != "" && ev.ReplayEndpoint == ev.Endpoint &&
		!ld.anyBad("kv_events_config.endpoint", "kv_events_config.replay_endpoint") {
		ld.crossErr("kv_events_config.replay_endpoint: %q (%s) is kv_events_config.endpoint too (%s); give the replay socket its own endpoint",
			ev.ReplayEndpoint, ld.where("kv_events_config.replay_endpoint"), ld.where("kv_events_config.endpoint"))
	}
	if c.Device == "cuda" && c.Isolation == "inprocess" && !ld.anyBad("device", "isolation") {
		// kvx itself never links the CUDA driver package (its init exits
		// on a machine without a GPU), so no in-process worker has it.
		ld.crossErr("isolation: inprocess (%s) with device cuda (%s): device cuda runs in the backend plugin binaries built with make cuda-build; set isolation: plugin",
			ld.where("isolation"), ld.where("device"))
	}

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

// resolveDtype resolves dtype auto (bfloat16 on cuda, float32 elsewhere)
// and refuses bfloat16 on the cpu device, whose kernels are the float32
// reference.
func (ld *loader) resolveDtype(c *Config) {
	if ld.anyBad("dtype", "device") {
		return
	}
	if c.Dtype == "auto" {
		c.Dtype = "float32"
		if c.Device == "cuda" {
			c.Dtype = "bfloat16"
		}
		return
	}
	if c.Dtype == "bfloat16" && c.Device == "cpu" {
		ld.crossErr("dtype: bfloat16 (%s) with device cpu (%s): the cpu device computes in float32 only (its kernels are the exact reference); use dtype: float32 or auto, or device: cuda",
			ld.where("dtype"), ld.where("device"))
	}
}

// resolveSynthetic checks the synthetic keys against device and, with a
// computing device (Computing: cpu, cuda), replaces the model by its
// synthetic version. It returns whether a model is still at hand.
func (ld *loader) resolveSynthetic(c *Config, haveModel bool) bool {
	var given []string
	for _, f := range model.SyntheticFields() {
		if k := "synthetic." + f.Key; ld.given[k] {
			given = append(given, k)
		}
	}
	if !Computing(c.Device) {
		if len(given) > 0 && !ld.bad["device"] {
			ld.crossErr("%s: set with device %q (%s); synthetic models run only on a computing device (device: cpu or cuda)",
				strings.Join(given, ", "), c.Device, ld.where("device"))
		}
		return haveModel
	}
	if c.TensorParallelSize > 1 && !ld.bad["tensor_parallel_size"] {
		ld.crossErr("tensor_parallel_size: %d with device %s (%s): the %s device runs one rank per stage; set 1",
			c.TensorParallelSize, c.Device, ld.originOf("tensor_parallel_size").where, c.Device)
	}
	if !haveModel {
		return false
	}
	if c.model.Checkpoint != "" {
		// A checkpoint runs its own weights and shapes.
		if len(given) > 0 {
			ld.crossErr("%s: set with model %q, a checkpoint directory: synthetic models come from presets", strings.Join(given, ", "), c.Model)
		}
		return true
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
			ld.crossErr("%v (synthetic model of %q for device %s)", e, c.Model, c.Device)
		}
		return false
	}
	c.model = m
	return true
}

// where is the origin of key's value, "default" when no source set it.
func (ld *loader) where(key string) string {
	if !ld.given[key] {
		return "default"
	}
	return ld.originOf(key).where
}

// resolveModel applies the rules that need the model.
func (ld *loader) resolveModel(c *Config) {
	m := c.model
	reg := c.reg
	need := registry.ModelMixers(m)
	mamba := slices.Contains(need, spec.MixerMamba)
	if c.AttentionBackend == "" {
		if fit := reg.BackendsFor(need); len(fit) > 0 {
			c.AttentionBackend = fit[0].Name
		} else {
			ld.crossErr("attention_backend: not set, and no built-in backend (%s) runs every mixer of model %q (%s); set attention_backend to a plugin path",
				registry.Or(reg.BackendNames()), m.Name, registry.MixerList(need))
		}
	} else if b, ok := reg.Backend(c.AttentionBackend); ok && !ld.bad["attention_backend"] {
		// A plugin path says what it runs in its worker's Info, which the
		// worker checks against the stage's layers when it is configured.
		if miss := b.Missing(need); miss != nil {
			noun := "mixer"
			if len(miss) > 1 {
				noun = "mixers"
			}
			ld.crossErr("attention_backend: %q does not fit model %q, whose layers need %s %s: backend %s runs %s; allowed: %s",
				c.AttentionBackend, m.Name, noun, registry.MixerList(miss), b.Name, registry.MixerList(b.Mixers), fitting(reg.BackendsFor(need), func(b registry.Backend) string { return b.Name }))
		}
	}
	if c.CacheManager == "" {
		if fit := reg.ManagersFor(need); len(fit) > 0 {
			c.CacheManager = fit[0].Name
		} else {
			ld.crossErr("cache_manager: not set, and no built-in cache manager (%s) manages every mixer of model %q (%s); set cache_manager to a plugin path",
				registry.Or(reg.ManagerNames()), m.Name, registry.MixerList(need))
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
	traceKeys := []string{"workload.limit", "workload.time_scale", "workload.format", "workload.hash_block_tokens"}
	if ld.given["workload.retention_duration_s"] && !ld.given["workload.retention_priority"] && !ld.bad["workload.retention_duration_s"] {
		ld.crossErr("workload.retention_duration_s: %s set without workload.retention_priority: it is how long that priority lasts", fmtFloat(w.RetentionDurationS))
	}
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
				ld.crossErr("workload.trace: %q is a directory, not a trace file", w.Trace)
			}
		}
		if (w.Format == workload.FormatAzure || w.Format == workload.FormatBurstGPT) && ld.given["workload.hash_block_tokens"] {
			ld.crossErr("workload.hash_block_tokens: %d, but workload.format %s traces have no hash_ids", w.HashBlockTokens, w.Format)
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

// resolveCalibration loads sim_calibration (or the hardware preset's
// default) into c.hardware.Calibration.
func (ld *loader) resolveCalibration(c *Config) {
	const key = "sim_calibration"
	v := strings.TrimSpace(c.SimCalibration)
	if ld.bad[key] || v == "none" {
		return
	}
	var cal *hw.Calibration
	if v == "" {
		var err error
		if cal, err = hw.DefaultCalibration(c.Hardware); err != nil {
			ld.crossErr("hardware: %q: its default sim calibration: %v", c.Hardware, err)
			return
		}
		if cal == nil {
			return
		}
	} else {
		path := v
		if o := ld.originOf(key); o.file != "" && !filepath.IsAbs(path) {
			path = filepath.Join(filepath.Dir(o.file), path)
		}
		var err error
		if cal, err = hw.LoadCalibration(path); err != nil {
			ld.valueErr(key, v, "is not a usable calibration file (kvx calibrate writes them; \"none\" for the datasheet roofline): "+err.Error())
			ld.bad[key] = true
			return
		}
		if !strings.EqualFold(cal.Hardware, c.Hardware) {
			ld.valueErr(key, v, fmt.Sprintf("was measured for hardware %q, but hardware is %q (%s); use a calibration of %q or sim_calibration: none",
				cal.Hardware, c.Hardware, ld.where("hardware"), c.Hardware))
			ld.bad[key] = true
			return
		}
	}
	p := cal.Params
	c.hardware.Calibration = &p
	c.hardware.Uncalibrated = false
}

// fitting lists the names of the registry entries that fit, for an
// "allowed:" clause: "dsa or mla, or a plugin path".
func fitting[E any](fit []E, name func(E) string) string {
	names := make([]string, len(fit))
	for i, e := range fit {
		names[i] = name(e)
	}
	if len(names) == 0 {
		return "a plugin path"
	}
	return registry.Or(names) + ", or a plugin path"
}
