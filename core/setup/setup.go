// Package setup turns a validated configuration into a runnable engine.Spec:
// it loads the model, splits it over pipeline stages, sizes every stage's
// cache budget from the hardware, and launches each stage's manager and
// worker, as plugins or in-process.
package setup

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"

	"github.com/hashicorp/go-hclog"

	"github.com/kvx-dev/kvx/core/config"
	"github.com/kvx-dev/kvx/core/engine"
	"github.com/kvx-dev/kvx/core/gpumem"
	"github.com/kvx-dev/kvx/core/host"
	"github.com/kvx-dev/kvx/core/registry"
	"github.com/kvx-dev/kvx/core/report"
	"github.com/kvx-dev/kvx/core/sched"
	"github.com/kvx-dev/kvx/core/workload"
	"github.com/kvx-dev/kvx/plugins/model"
	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
	"github.com/kvx-dev/kvx/plugins/v1/spec"
	"github.com/kvx-dev/kvx/plugins/v1/worker"
)

// Budget is one stage's device memory split, per GPU.
type Budget struct {
	Memory      int64 // the device's memory
	Weights     int64 // this stage's weights on one GPU
	Activations int64 // workspace estimate
	Reserved    int64 // runtime overhead (context, communication buffers)
	Fraction    float64
	Cache       int64 // what the cache manager may use

	// Free is, for device cuda, the stage's share of the GPU memory NVML
	// reported free before any worker started; 0 otherwise (the cache is
	// then sized from Memory).
	Free int64
	// GPU is the index of the stage's GPU with device cuda (0 otherwise).
	GPU int
	// Source says where Memory (and Free) came from: for device cuda
	// "nvml NVIDIA H200 (GPU 0): total 139.8 GiB, free 139.2 GiB"; for cpu
	// the fixed host budget; for sim the hardware preset.
	Source string
	// MaxTokens is set when kv_cache_config.max_tokens, not
	// free_gpu_memory_fraction, set Cache; FromFraction is then what the
	// fraction alone would give.
	MaxTokens    int
	FromFraction int64
}

// Binding names the setting that sized b.Cache, for a message that says
// what to raise.
func (b Budget) Binding() string {
	if b.MaxTokens > 0 {
		return fmt.Sprintf("kv_cache_config.max_tokens (%d)", b.MaxTokens)
	}
	return fmt.Sprintf("kv_cache_config.free_gpu_memory_fraction (%g)", b.Fraction)
}

// CPUMemoryBytes is the memory of one stage on the cpu device: synthetic
// models are small, and their cache pools are allocated for real.
// kv_cache_config.max_tokens and free_gpu_memory_fraction shrink it.
const CPUMemoryBytes = 256 << 20

// runtimeReserve is the fixed per-GPU overhead kept out of the cache budget:
// CUDA context, NCCL buffers and graphs, about 1 GiB on current stacks. With
// device cuda the free memory is measured through NVML before the worker
// plugin starts, so this reserve is what covers the worker's own CUDA
// context (about 0.5 GiB on an H200), its kernel modules and the
// allocator's rounding.
const runtimeReserve = 1 << 30

// activationFactor approximates the live activations of one forward as this
// many hidden-size bf16 vectors per scheduled token (residual, norms, Q/K/V,
// attention output and the MLP's intermediate in flight).
const activationFactor = 12

// queryGPU reads one GPU's name and memory for device cuda; tests replace
// it with a fake.
var queryGPU = gpumem.Query

// StageBudget sizes one stage's cache as TensorRT-LLM does: the free memory
// after weights and activations, times free_gpu_memory_fraction, capped by
// kv_cache_config.max_tokens when set (plus, for hybrid models, a state slot
// per resident sequence and one for a snapshot).
//
// Where the memory comes from depends on the device:
//   - sim: the hardware preset's memory per GPU (hardware: h200);
//   - cpu: CPUMemoryBytes of host memory per stage (its pools are real
//     allocations) with no runtime reserve;
//   - cuda: the GPU's memory as NVML reports it now (stage i on GPU i when
//     there is one, else on GPU 0, whose free memory the stages placed there
//     share evenly): cache = (free - weights - activations - reserve) x
//     fraction. Without NVML (no NVIDIA driver, or a kvx built without cgo)
//     it fails rather than guess from a preset.
func StageBudget(cfg *config.Config, m *spec.Model, hw spec.Hardware, stage int, first, last int) (Budget, error) {
	tp := cfg.TensorParallelSize
	b := Budget{Memory: hw.MemoryBytes, Fraction: cfg.KVCache.FreeGPUMemoryFraction, Reserved: runtimeReserve,
		Source: "hardware preset " + hw.Name}
	b.Weights = model.WeightBytes(*m, first, last, cfg.WeightsDtype, tp)
	b.Activations = int64(cfg.MaxNumTokens) * int64(m.Hidden) * 2 * activationFactor
	if last == len(m.Layers) { // logits of the last stage, fp32
		b.Activations += int64(cfg.MaxBatchSize) * int64(cfg.Speculative.MaxDraftLen+1) * int64(m.Vocab) * 4
	}
	var free int64
	switch cfg.Device {
	case "cpu":
		b.Memory, b.Reserved = CPUMemoryBytes, 0
		b.Source = fmt.Sprintf("cpu: %s of host memory per stage", gib(CPUMemoryBytes))
		hw.Name = "cpu stage"
		free = b.Memory - b.Weights - b.Activations - b.Reserved
	case "cuda":
		gpu, share, info, err := stageGPU(stage, cfg.PipelineParallelSize)
		if err != nil {
			return b, fmt.Errorf("stage %d: device cuda sizes its cache from the GPU's free memory, read through NVML (GPU %d): %w; "+
				"run kvx on the machine with the NVIDIA GPU and its driver, or use device cpu", stage, gpu, err)
		}
		b.GPU, b.Memory, b.Free = gpu, info.Total, info.Free/int64(share)
		b.Source = fmt.Sprintf("nvml %s (GPU %d): total %s, free %s", info.Name, gpu, gib(info.Total), gib(info.Free))
		if share > 1 {
			b.Source += fmt.Sprintf(", shared by %d stages", share)
		}
		free = b.Free - b.Weights - b.Activations - b.Reserved
		if free <= 0 {
			return b, fmt.Errorf("stage %d: weights %s + activations %s + runtime reserve %s exceed the %s free on GPU %d (%s, total %s%s); "+
				"free memory on that GPU, lower max_num_tokens (%d), raise pipeline_parallel_size (%d), or use a smaller weights_dtype (%s)",
				stage, gib(b.Weights), gib(b.Activations), gib(b.Reserved), gib(b.Free), gpu, info.Name, gib(info.Total),
				shareNote(share), cfg.MaxNumTokens, cfg.PipelineParallelSize, cfg.WeightsDtype)
		}
	default:
		free = b.Memory - b.Weights - b.Activations - b.Reserved
	}
	if free <= 0 {
		return b, fmt.Errorf("stage %d: weights %s + activations %s + runtime %s exceed the %s of one %s; raise tensor_parallel_size (%d) or pipeline_parallel_size (%d), or use a smaller weights_dtype (%s)",
			stage, gib(b.Weights), gib(b.Activations), gib(b.Reserved), gib(b.Memory), hw.Name, tp, cfg.PipelineParallelSize, cfg.WeightsDtype)
	}
	b.Cache = int64(float64(free) * b.Fraction)
	if mt := cfg.KVCache.MaxTokens; mt > 0 {
		// max_tokens counts tokens of paged cache. The state buffers of a
		// hybrid model come on top: a live state for every resident
		// sequence and one more (the least a snapshot policy needs).
		var perToken, perSeq int64
		for _, l := range m.Layers[first:last] {
			for _, buf := range l.Buffers {
				perToken += buf.BytesPerToken
				perSeq += buf.BytesPerSeq
			}
		}
		resident := int64(cfg.MaxBatchSize) * int64(cfg.PipelineParallelSize)
		if capped := int64(mt)*perToken + (resident+1)*perSeq; capped < b.Cache {
			b.MaxTokens, b.FromFraction, b.Cache = mt, b.Cache, capped
			if err := maxTokensFit(cfg, m.Layers[first:last]); err != nil {
				return b, fmt.Errorf("stage %d: %w", stage, err)
			}
		}
	}
	return b, nil
}

// maxTokensFit checks, before any manager sees it, that a cache of
// kv_cache_config.max_tokens tokens holds one request end to end where a
// layer attends to the whole sequence: max_seq_len plus the draft tokens,
// and one max_num_tokens chunk, each in whole blocks.
func maxTokensFit(cfg *config.Config, layers []spec.Layer) error {
	full := false
	for _, l := range layers {
		full = full || (l.HasCache() && l.Window == 0 && l.Mixer != spec.MixerMamba)
	}
	if !full {
		return nil
	}
	tpb := cfg.KVCache.TokensPerBlock
	draft := 0
	if cfg.Speculative.Enabled() {
		draft = cfg.Speculative.MaxDraftLen
	}
	seq, chunk := kvcache.BlocksFor(cfg.MaxSeqLen+draft, tpb)*tpb, kvcache.BlocksFor(cfg.MaxNumTokens, tpb)*tpb
	mt := cfg.KVCache.MaxTokens
	if mt >= max(seq, chunk) {
		return nil
	}
	fit := mt / tpb * tpb // whole blocks
	what, key, at, least := fmt.Sprintf("one max_seq_len request (%d + %d draft tokens = %d in blocks of %d)", cfg.MaxSeqLen, draft, seq, tpb),
		"max_seq_len", fit-draft, 2
	if chunk > seq {
		what, key, at, least = fmt.Sprintf("one max_num_tokens chunk (%d tokens in blocks of %d)", chunk, tpb), "max_num_tokens", fit, 1
	}
	msg := fmt.Sprintf("kv_cache_config.max_tokens = %d caps the cache below %s: raise kv_cache_config.max_tokens to at least %d",
		mt, what, max(seq, chunk))
	if at >= least {
		msg += fmt.Sprintf(", or lower %s to at most %d", key, at)
	}
	return errors.New(msg)
}

// stageGPU places pipeline stage stage of stages on a GPU, as the cuda
// worker does: stage i on GPU i when NVML sees one, else on GPU 0. It
// returns the GPU, how many stages share it and what NVML says of it.
func stageGPU(stage, stages int) (gpu, share int, info gpumem.Info, err error) {
	// n is the number of GPUs, as far as the stages reach.
	n := stages
	for i := range stages {
		if _, err := queryGPU(i); errors.Is(err, gpumem.ErrNoGPU) {
			n = i
			break
		} else if err != nil {
			return i, 0, gpumem.Info{}, err
		}
	}
	if n == 0 {
		_, err := queryGPU(0)
		return 0, 0, gpumem.Info{}, err
	}
	share = 1
	if stage >= n {
		stage = 0
	}
	if stage == 0 {
		share += stages - min(stages, n)
	}
	info, err = queryGPU(stage)
	return stage, share, info, err
}

func shareNote(share int) string {
	if share > 1 {
		return fmt.Sprintf(", its free memory split among %d stages", share)
	}
	return ""
}

// kvDtype resolves kv_cache_config.dtype for the worker: "auto" is bf16, as
// model.FillBuffers sizes it (no supported checkpoint quantizes its KV).
func kvDtype(d string) string {
	if d == "" || d == "auto" {
		return "bf16"
	}
	return d
}

func gib(n int64) string { return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30)) }

// Resolved is a configuration made concrete: the engine spec plus what was
// decided on the way, for `kvx plan` and the logs.
type Resolved struct {
	Spec    engine.Spec
	Model   spec.Model
	Stages  [][2]int
	Budgets []Budget
}

// Resolve builds the engine spec of one configuration. Requests of the
// workload are loaded too (a trace is read here, so its errors surface before
// anything is launched).
func Resolve(cfg *config.Config, variant string, withWorkload bool) (*Resolved, error) {
	m := cfg.ModelSpec()
	if !cfg.Speculative.Enabled() {
		// Without speculative decoding the MTP layers are not loaded.
		m.Layers = slices.DeleteFunc(m.Layers, func(l spec.Layer) bool { return l.MTP })
		m.NumNextN = 0
	}
	if err := model.FillBuffers(&m, cfg.Dtypes(), cfg.TensorParallelSize); err != nil {
		return nil, err
	}
	hw := cfg.HardwareSpec()
	pp := cfg.PipelineParallelSize
	stages, err := model.SplitStages(m, pp)
	if err != nil {
		return nil, err
	}
	draft := 0
	if cfg.Speculative.Enabled() {
		draft = cfg.Speculative.MaxDraftLen
	}
	host := cfg.KVCache.HostCacheSize
	// A worker is asked for the registered backend it serves; a backend
	// given as a path is whatever its binary is ("" asks for no name).
	backend := cfg.AttentionBackend
	if registry.IsPath(backend) {
		backend = ""
	}
	r := &Resolved{Model: m, Stages: stages}
	s := &r.Spec
	s.Variant = variant
	s.Registry = cfg.Registry()
	s.Hardware = hw
	s.Hidden = m.Hidden
	s.Setup = report.Setup{
		Model: m.Name, CacheManager: cfg.CacheManager, Backend: cfg.AttentionBackend, Device: cfg.Device,
		Hardware: hw.Name, Calibration: calibrationName(cfg.Device, hw), Isolation: cfg.Isolation, Policy: cfg.Scheduler.CapacitySchedulerPolicy,
		PP: pp, TP: cfg.TensorParallelSize, Draft: draft, BlockReuse: cfg.KVCache.EnableBlockReuse,
	}
	for i, st := range stages {
		b, err := StageBudget(cfg, &m, hw, i, st[0], st[1])
		if err != nil {
			return nil, err
		}
		r.Budgets = append(r.Budgets, b)
		mc := kvcache.Config{
			Stage: i, Stages: pp,
			Layers:           m.Layers[st[0]:st[1]],
			TokensPerBlock:   cfg.KVCache.TokensPerBlock,
			DeviceBytes:      b.Cache,
			MaxBatchSize:     cfg.MaxBatchSize,
			MaxNumTokens:     cfg.MaxNumTokens,
			MaxSeqLen:        cfg.MaxSeqLen,
			MaxDraftTokens:   draft,
			EnableBlockReuse: cfg.KVCache.EnableBlockReuse,
			EvictionPolicy:   cfg.KVCache.EvictionPolicy,
			AvgSeqLen:        cfg.KVCache.AvgSeqLen,
			PoolRatio:        cfg.KVCache.PoolRatio,
			Snapshots: kvcache.SnapshotConfig{
				Interval:       cfg.MambaState.PeriodicSnapshotInterval,
				OffsetsFromEnd: cfg.MambaState.AdditionalSnapshotOffsetsFromEnd,
			},
		}
		if host != nil {
			mc.HostBytes = *host
		}
		s.Managers = append(s.Managers, mc)
		s.Workers = append(s.Workers, worker.Config{
			Stage: i, Stages: pp, Model: m, First: st[0], Last: st[1],
			Backend: backend, Device: cfg.Device, Hardware: hw,
			TensorParallel: cfg.TensorParallelSize, WeightsDtype: cfg.WeightsDtype,
			KVDtype: kvDtype(cfg.KVCache.Dtype), Dtype: cfg.Dtype, Seed: cfg.Seed,
			DraftTokens: draft, DraftAcceptance: cfg.Speculative.AcceptanceRate,
		})
	}
	policy, err := sched.ParsePolicy(cfg.Scheduler.CapacitySchedulerPolicy)
	if err != nil {
		return nil, err
	}
	s.Sched = sched.Config{
		MaxBatchSize:   cfg.MaxBatchSize,
		MaxResident:    cfg.MaxBatchSize * pp,
		MaxNumTokens:   cfg.MaxNumTokens,
		MaxSeqLen:      cfg.MaxSeqLen,
		ChunkedPrefill: cfg.EnableChunkedPrefill,
		TokensPerBlock: cfg.KVCache.TokensPerBlock,
		Draft:          draft,
		Reuse:          cfg.KVCache.EnableBlockReuse,
		Policy:         policy,
	}
	if cfg.Isolation == "plugin" {
		// Only a plugin process can be killed: in-process calls are not bounded.
		pt := cfg.PluginTimeouts
		s.Liveness = engine.Liveness{Configure: pt.Configure, Call: pt.Call, Forward: pt.Forward, ForwardFactor: pt.ForwardFactor}
	}
	pr := cfg.PluginRestarts
	s.Restarts = engine.RestartPolicy{Max: pr.Max, Backoff: pr.Backoff, MaxBackoff: pr.MaxBackoff}
	s.CheckEvery = cfg.CheckInvariants
	s.Sequential = cfg.StepOverlap == "off"
	s.DeepEvery = cfg.DeepCheckEvery
	if withWorkload {
		wl, err := Workload(cfg, m.Vocab)
		if err != nil {
			return nil, err
		}
		s.Workload = wl
	}
	return r, nil
}

// calibrationName is what a report says about the sim's calibration.
func calibrationName(device string, hw spec.Hardware) string {
	if device != "sim" || hw.Calibration == nil {
		return "none"
	}
	return hw.Calibration.Name
}

// Workload loads the configured trace or generates the configured scenario.
func Workload(cfg *config.Config, vocab int) (workload.Workload, error) {
	w := cfg.Workload
	seed := w.Seed
	switch w.Kind() {
	case config.WorkloadTrace:
		reqs, err := workload.LoadTrace(w.Trace, workload.TraceOptions{Format: w.Format, MooncakeOptions: workload.MooncakeOptions{
			Limit: w.Limit, TimeScale: w.TimeScale, Vocab: vocab, Seed: seed, BlockTokens: w.HashBlockTokens,
			// Lines longer than max_seq_len are rejected before their
			// tokens are synthesized; the rest must fit the default bound.
			MaxSeqLen: cfg.MaxSeqLen,
		}})
		if err != nil {
			return workload.Workload{}, err
		}
		wl := workload.Workload{Requests: reqs, Concurrency: w.Concurrency}
		wl.RetentionPriority, wl.RetentionDuration = w.Retention()
		return wl, nil
	case config.WorkloadGenerator:
		wl, err := workload.GenerateWorkload(workload.GenOptions{
			Requests: w.Requests, Concurrency: w.Concurrency, Rate: w.Rate,
			PromptMin: w.PromptTokens.Min, PromptMax: w.PromptTokens.Max,
			OutputMin: w.OutputTokens.Min, OutputMax: w.OutputTokens.Max,
			SharedPrefix: w.SharedPrefixTokens, SharedGroups: w.SharedPrefixGroups,
			Vocab: vocab, Seed: seed,
		})
		wl.RetentionPriority, wl.RetentionDuration = w.Retention()
		return wl, err
	}
	return workload.Workload{}, fmt.Errorf("workload: neither workload.trace nor workload.requests is set")
}

// Launcher starts each stage's manager and worker, as plugin processes
// (isolation: plugin) or in this process (isolation: inprocess). With
// plugins, one process per plugin binary serves every stage (an instance
// each).
type Launcher struct {
	cfg  *config.Config
	reg  *registry.Registry
	host *host.Host
	mu   sync.Mutex
	proc map[any]*host.Process // plugin clients handed out, and their processes
	// shared is, per plugin binary, the process that serves every stage's
	// instance and the first client it gave, from which the others come.
	shared map[string]shared
}

// shared is a plugin process serving several stages.
type shared struct {
	first any
	proc  *host.Process
}

var (
	_ engine.Launcher = (*Launcher)(nil)
	_ engine.Stopper  = (*Launcher)(nil)
)

// NewLauncher returns a launcher that starts what cfg's cache_manager and
// attention_backend name: reg's binaries (isolation: plugin) or factories
// (inprocess), or the plugin binary at a path. reg is usually the registry
// cfg was loaded against (cfg.Registry()); tests pass one with other
// factories. With plugin isolation it owns a plugin host that Close shuts
// down.
func NewLauncher(cfg *config.Config, reg *registry.Registry, log hclog.Logger) *Launcher {
	l := &Launcher{cfg: cfg, reg: reg}
	if cfg.Isolation == "plugin" {
		l.host = host.New(log, cfg.PluginDirs)
		l.host.GRPCOnly = cfg.PluginTransport == "grpc"
		l.host.StartTimeout = cfg.PluginTimeouts.Start
		// Managers answer one call at a time, and so does a worker that
		// only models its device (sim); a worker whose device computes
		// runs its kernels on every core.
		l.host.ManagerThreads, l.host.WorkerThreads = 1, 1
		if config.Computing(cfg.Device) {
			l.host.WorkerThreads = runtime.NumCPU()
		}
	}
	return l
}

// Manager implements engine.Launcher.
func (l *Launcher) Manager(ctx context.Context, stage int) (kvcache.Manager, error) {
	name := l.cfg.CacheManager
	if l.host == nil {
		m, ok := l.reg.Manager(name)
		if !ok {
			return nil, inProcessErr("cache_manager", name, l.reg.ManagerNames(), "; use isolation: plugin")
		}
		return m.New(), nil
	}
	path, err := l.host.Find(l.reg.ManagerBinary(name))
	if err != nil {
		return nil, err
	}
	// Hashed again right before it starts: the file may have changed since
	// CheckPlugins (or since the last restart).
	if err := checkPinned(path, "plugin_sha256.cache_manager", l.cfg.PluginSHA256.CacheManager); err != nil {
		return nil, err
	}
	return startHint(launchShared(ctx, l, path, l.host.ManagerInstance, l.host.LaunchManager))
}

// Worker implements engine.Launcher.
func (l *Launcher) Worker(ctx context.Context, stage int) (worker.Worker, error) {
	name := l.cfg.AttentionBackend
	if l.host == nil {
		b, ok := l.reg.Backend(name)
		if !ok {
			return nil, inProcessErr("attention_backend", name, l.reg.BackendNames(), "; use isolation: plugin")
		}
		return b.New(), nil
	}
	path, err := l.host.Find(l.reg.BackendBinary(name))
	if err != nil {
		return nil, err
	}
	if err := checkPinned(path, "plugin_sha256.attention_backend", l.cfg.PluginSHA256.AttentionBackend); err != nil {
		return nil, err
	}
	return startHint(launchShared(ctx, l, path, l.host.WorkerInstance, l.host.LaunchWorker))
}

// inProcessErr is the refusal of a key's value that has no in-process
// implementation (a plugin path, or a name the launcher's registry lacks).
func inProcessErr(key, value string, known []string, fix string) error {
	k := "none"
	if len(known) > 0 {
		k = strings.Join(known, ", ")
	}
	return fmt.Errorf("%s %q has no in-process implementation (isolation: inprocess runs only the built-in ones: %s)%s", key, value, k, fix)
}

// startHint adds the config key to a start that timed out.
func startHint[C any](c C, err error) (C, error) {
	if errors.Is(err, host.ErrStartTimeout) {
		err = fmt.Errorf("%w; a plugin must write go-plugin's handshake line on its standard output within plugin_timeouts.start "+
			"(a wrapper script must exec the plugin binary)", err)
	}
	return c, err
}

// launchShared returns a further instance of the live process that serves
// the plugin binary at path, or launches it.
func launchShared[C any](ctx context.Context, l *Launcher, path string,
	instance func(context.Context, C, *host.Process) (C, error),
	launch func(context.Context, string) (C, *host.Process, error)) (C, error) {
	if sh, ok := l.sharedProc(path); ok {
		c, err := instance(ctx, sh.first.(C), sh.proc)
		if err != nil {
			if errors.Is(err, kvcache.ErrUnavailable) {
				// The process is dying (its exit not yet noticed) or gone:
				// the next start must launch a fresh one, not ask it again.
				l.forget(path, sh.proc)
			}
			var none C
			return none, err
		}
		l.track(c, sh.proc)
		return c, nil
	}
	c, proc, err := launch(ctx, path)
	if err != nil {
		var none C
		return none, err
	}
	l.track(c, proc)
	l.share(path, c, proc)
	return c, nil
}

// sharedProc returns the live process that serves the stages' instances of
// the plugin binary at path, if there is one.
func (l *Launcher) sharedProc(path string) (shared, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	sh, ok := l.shared[path]
	if ok && sh.proc.Exited() {
		delete(l.shared, path)
		return shared{}, false
	}
	return sh, ok
}

// forget drops proc as the process that serves path, and kills it (its
// whole group): it failed to serve an instance, and the stages it still
// serves find it unavailable and are restarted, as after Stop.
func (l *Launcher) forget(path string, proc *host.Process) {
	l.mu.Lock()
	if sh, ok := l.shared[path]; ok && sh.proc == proc {
		delete(l.shared, path)
	}
	l.mu.Unlock()
	proc.Abort()
}

// share makes proc, just launched, the process later stages' instances of
// path come from, unless a live one is there already.
func (l *Launcher) share(path string, first any, proc *host.Process) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.shared == nil {
		l.shared = map[string]shared{}
	}
	if sh, ok := l.shared[path]; ok && !sh.proc.Exited() {
		return
	}
	l.shared[path] = shared{first: first, proc: proc}
}

func (l *Launcher) track(client any, proc *host.Process) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.proc == nil {
		l.proc = map[any]*host.Process{}
	}
	l.proc[client] = proc
}

// Stop implements engine.Stopper: it kills the process behind a manager or
// worker this launcher returned, its whole process group and at once (the
// engine replaces a stage's plugins after one of them died, or missed a
// deadline: nothing to wait for). A process that serves several stages
// goes for all of them: their calls fail as unavailable, the engine
// restarts those stages too, and the next launch starts a fresh process.
// In-process values have nothing to stop. Safe for concurrent use (the
// engine's watchdog calls it).
func (l *Launcher) Stop(client any) {
	l.mu.Lock()
	proc := l.proc[client]
	delete(l.proc, client)
	for path, sh := range l.shared {
		if sh.proc == proc {
			delete(l.shared, path) // the next stage gets a fresh process
		}
	}
	l.mu.Unlock()
	if proc != nil {
		proc.Abort()
	}
}

// Close stops every plugin process this launcher started.
func (l *Launcher) Close() {
	if l.host != nil {
		l.host.Close()
	}
}

// Host is the plugin host, nil in-process.
func (l *Launcher) Host() *host.Host { return l.host }

// EOS returns the end-of-sequence ids that end a request of the model cfg
// runs unless it asks to ignore them: a checkpoint directory's
// (model.EOSTokenIDs: generation_config.json, else config.json), the byte
// tokenizer's EOS for a synthetic model on a computing device, and none on
// device sim, whose tokens are placeholders (an id that happened to be an
// EOS would end a request at random).
func EOS(cfg *config.Config, m spec.Model) ([]int32, error) {
	if !config.Computing(cfg.Device) {
		return nil, nil
	}
	if fi, err := os.Stat(cfg.Model); err == nil && fi.IsDir() {
		ids, err := model.EOSTokenIDs(cfg.Model, m.Vocab)
		if err != nil {
			return nil, fmt.Errorf("model: %w", err)
		}
		return ids, nil
	}
	if m.Vocab > int(model.SyntheticEOS) {
		return []int32{model.SyntheticEOS}, nil
	}
	return nil, nil
}
