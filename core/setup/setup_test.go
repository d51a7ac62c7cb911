package setup

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/kvx-dev/kvx/core/config"
	"github.com/kvx-dev/kvx/core/gpumem"
	"github.com/kvx-dev/kvx/core/registry/registrytest"
)

func load(t *testing.T, sets ...string) *config.Config {
	t.Helper()
	cfg, _, err := config.Load(registrytest.Builtin(), nil, nil, append([]string{"workload.requests=1", "workload.prompt_tokens=100", "workload.output_tokens=10"}, sets...))
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

func TestStageBudget(t *testing.T) {
	cfg := load(t, "model=deepseek-v3.2", "weights_dtype=fp8", "tensor_parallel_size=8", "pipeline_parallel_size=2",
		"kv_cache_config.free_gpu_memory_fraction=0.5")
	r, err := Resolve(cfg, "t", false)
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Budgets) != 2 {
		t.Fatalf("%d budgets, want 2", len(r.Budgets))
	}
	for i, b := range r.Budgets {
		free := b.Memory - b.Weights - b.Activations - b.Reserved
		if b.Weights <= 0 || b.Activations <= 0 || b.Cache != int64(float64(free)*0.5) {
			t.Errorf("stage %d budget %+v: want cache = 0.5 x (memory - weights - activations - reserve)", i, b)
		}
		if r.Spec.Managers[i].DeviceBytes != b.Cache {
			t.Errorf("stage %d: manager gets %d bytes, budget %d", i, r.Spec.Managers[i].DeviceBytes, b.Cache)
		}
	}
	// Without speculative decoding the MTP layer is not loaded.
	last := r.Spec.Managers[1].Layers
	if l := last[len(last)-1]; l.MTP {
		t.Errorf("last layer %d is an MTP layer without speculative_config", l.Index)
	}
	cfg = load(t, "model=deepseek-v3.2", "weights_dtype=fp8", "tensor_parallel_size=8", "pipeline_parallel_size=2",
		"speculative_config.decoding_type=MTP", "kv_cache_config.max_tokens=1000", "max_seq_len=960", "max_num_tokens=512")
	r, err = Resolve(cfg, "t", false)
	if err != nil {
		t.Fatal(err)
	}
	last = r.Spec.Managers[1].Layers
	if !last[len(last)-1].MTP || r.Spec.Sched.Draft != 1 {
		t.Errorf("with MTP: last layer MTP %v, draft %d; want the MTP layer on the last stage and 1 draft", last[len(last)-1].MTP, r.Spec.Sched.Draft)
	}
	var perToken int64
	for _, l := range last {
		for _, b := range l.Buffers {
			perToken += b.BytesPerToken
		}
	}
	if got := r.Budgets[1].Cache; got != 1000*perToken {
		t.Errorf("max_tokens 1000: cache %d bytes, want %d", got, 1000*perToken)
	}
}

func TestStageBudgetTooSmall(t *testing.T) {
	cfg := load(t, "model=deepseek-v3.2", "hardware=h100")
	_, err := Resolve(cfg, "t", false)
	if err == nil {
		t.Fatal("DeepSeek-V3.2 in bf16 on one H100 was accepted")
	}
	for _, w := range []string{"stage 0", "weights", "GiB", "tensor_parallel_size"} {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error %q lacks %q", err, w)
		}
	}
}

func TestWorkerKVDtype(t *testing.T) {
	r, err := Resolve(load(t, "model=llama-3.1-8b"), "t", false)
	if err != nil {
		t.Fatal(err)
	}
	if got := r.Spec.Workers[0].KVDtype; got != "bf16" {
		t.Errorf("kv dtype auto reaches the worker as %q, want bf16", got)
	}
}

// fakeGPUs makes queryGPU answer for the GPUs given (or fail with err) for
// the rest of the test.
func fakeGPUs(t *testing.T, err error, gpus ...gpumem.Info) {
	t.Helper()
	saved := queryGPU
	t.Cleanup(func() { queryGPU = saved })
	queryGPU = func(i int) (gpumem.Info, error) {
		switch {
		case err != nil:
			return gpumem.Info{}, err
		case i < 0 || i >= len(gpus):
			return gpumem.Info{}, fmt.Errorf("GPU %d: NVML sees %d GPUs: %w", i, len(gpus), gpumem.ErrNoGPU)
		}
		return gpus[i], nil
	}
}

var h200 = gpumem.Info{Name: "NVIDIA H200", Total: 143771 << 20, Free: 143000 << 20}

// With device cuda the cache is the fraction of NVML's free memory after
// weights, activations and the runtime reserve, and Source says so.
func TestStageBudgetCUDA(t *testing.T) {
	fakeGPUs(t, nil, h200)
	cfg := load(t, "model=llama-3.1-8b", "device=cuda", "kv_cache_config.free_gpu_memory_fraction=0.5")
	r, err := Resolve(cfg, "t", false)
	if err != nil {
		t.Fatal(err)
	}
	b := r.Budgets[0]
	want := int64(float64(h200.Free-b.Weights-b.Activations-runtimeReserve) * 0.5)
	if b.Memory != h200.Total || b.Free != h200.Free || b.Reserved != runtimeReserve || b.Cache != want || b.Weights <= 0 {
		t.Errorf("budget %+v: want memory %d, free %d, reserve %d, cache %d", b, h200.Total, h200.Free, runtimeReserve, want)
	}
	if got, wantSrc := b.Source, "nvml NVIDIA H200 (GPU 0): total 140.4 GiB, free 139.6 GiB"; got != wantSrc {
		t.Errorf("Source = %q, want %q", got, wantSrc)
	}
	if r.Spec.Managers[0].DeviceBytes != b.Cache {
		t.Errorf("manager gets %d bytes, budget %d", r.Spec.Managers[0].DeviceBytes, b.Cache)
	}
}

// Two stages on two GPUs take one each; on one GPU they split its free
// memory evenly.
func TestStageBudgetCUDAStages(t *testing.T) {
	small := h200
	small.Free = 80 << 30
	for _, tt := range []struct {
		name      string
		gpus      []gpumem.Info
		wantGPU   []int
		wantFree  []int64
		wantShare string
	}{
		{"two GPUs", []gpumem.Info{h200, small}, []int{0, 1}, []int64{h200.Free, small.Free}, ""},
		{"one GPU", []gpumem.Info{h200}, []int{0, 0}, []int64{h200.Free / 2, h200.Free / 2}, ", shared by 2 stages"},
	} {
		fakeGPUs(t, nil, tt.gpus...)
		r, err := Resolve(load(t, "model=llama-3.1-8b", "device=cuda", "pipeline_parallel_size=2"), "t", false)
		if err != nil {
			t.Fatalf("%s: %v", tt.name, err)
		}
		for i, b := range r.Budgets {
			if b.GPU != tt.wantGPU[i] || b.Free != tt.wantFree[i] || !strings.HasSuffix(b.Source, tt.wantShare) {
				t.Errorf("%s: stage %d on GPU %d with %d free (%q), want GPU %d with %d free (ending %q)",
					tt.name, i, b.GPU, b.Free, b.Source, tt.wantGPU[i], tt.wantFree[i], tt.wantShare)
			}
		}
	}
}

// A GPU without room for weights, activations and the reserve is an error
// that names each of them, the free memory and the GPU.
func TestStageBudgetCUDATooSmall(t *testing.T) {
	full := h200
	full.Free = 512 << 20
	fakeGPUs(t, nil, full)
	_, err := Resolve(load(t, "model=llama-3.1-8b", "device=cuda"), "t", false)
	if err == nil {
		t.Fatal("a GPU with 0.5 GiB free was accepted")
	}
	for _, w := range []string{"stage 0", "weights", "activations", "runtime reserve 1.0 GiB", "exceed the 0.5 GiB free on GPU 0", "NVIDIA H200", "total 140.4 GiB", "max_num_tokens"} {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error %q lacks %q", err, w)
		}
	}
}

// Without NVML, device cuda fails and says what it tried; it never falls
// back to the hardware preset.
func TestStageBudgetCUDANoNVML(t *testing.T) {
	fakeGPUs(t, fmt.Errorf("nvml.Init (libnvidia-ml.so.1, installed with the NVIDIA driver): ERROR_LIBRARY_NOT_FOUND: %w", gpumem.ErrUnavailable))
	_, err := Resolve(load(t, "model=llama-3.1-8b", "device=cuda"), "t", false)
	if err == nil || !errors.Is(err, gpumem.ErrUnavailable) {
		t.Fatalf("Resolve without NVML = %v, want an error wrapping gpumem.ErrUnavailable", err)
	}
	for _, w := range []string{"stage 0", "device cuda", "NVML", "libnvidia-ml.so.1", "ERROR_LIBRARY_NOT_FOUND", "device cpu"} {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error %q lacks %q", err, w)
		}
	}
	// No GPU at all is an error too.
	fakeGPUs(t, nil)
	if _, err := Resolve(load(t, "model=llama-3.1-8b", "device=cuda"), "t", false); !errors.Is(err, gpumem.ErrNoGPU) {
		t.Errorf("Resolve with no GPU = %v, want an error wrapping gpumem.ErrNoGPU", err)
	}
}

// TestMaxTokensBindingHint: when kv_cache_config.max_tokens is what caps
// the cache below one request, the error says so before any manager runs,
// and never says to raise free_gpu_memory_fraction.
func TestMaxTokensBindingHint(t *testing.T) {
	for _, tc := range []struct {
		sets []string
		want []string
	}{
		{[]string{"kv_cache_config.max_tokens=4000", "max_seq_len=8192", "max_num_tokens=2048"},
			[]string{"kv_cache_config.max_tokens = 4000", "at least 8224", "lower max_seq_len to at most 3999"}},
		{[]string{"kv_cache_config.max_tokens=4000", "max_seq_len=2048", "max_num_tokens=8192"},
			[]string{"kv_cache_config.max_tokens = 4000", "at least 8192", "lower max_num_tokens to at most 4000"}},
		{[]string{"kv_cache_config.max_tokens=32", "max_seq_len=8192", "max_num_tokens=2048"},
			[]string{"kv_cache_config.max_tokens = 32", "at least 8224"}},
	} {
		cfg := load(t, append([]string{"model=deepseek-v3.2", "weights_dtype=fp8", "tensor_parallel_size=8", "pipeline_parallel_size=2",
			"speculative_config.decoding_type=MTP", "kv_cache_config.tokens_per_block=32"}, tc.sets...)...)
		b, err := Resolve(cfg, "t", false)
		if err == nil {
			t.Errorf("%v: no error, budgets %+v", tc.sets, b.Budgets)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%v: error %q lacks %q", tc.sets, err, w)
			}
		}
		if strings.Contains(err.Error(), "free_gpu_memory_fraction") || strings.Contains(err.Error(), "at most 0") ||
			strings.Contains(err.Error(), "at most -") {
			t.Errorf("%v: error %q names free_gpu_memory_fraction or a limit below 1", tc.sets, err)
		}
	}
	cfg := load(t, "model=deepseek-v3.2", "weights_dtype=fp8", "tensor_parallel_size=8", "pipeline_parallel_size=2", "kv_cache_config.max_tokens=24000", "max_seq_len=8192", "max_num_tokens=2048")
	r, err := Resolve(cfg, "t", false)
	if err != nil {
		t.Fatal(err)
	}
	if b := r.Budgets[0]; b.MaxTokens != 24000 || b.FromFraction <= b.Cache || !strings.Contains(b.Binding(), "max_tokens") {
		t.Errorf("budget %+v (binding %s): want max_tokens binding", b, b.Binding())
	}
}
