package setup

import (
	"strings"
	"testing"

	"github.com/kvx-dev/kvx/core/config"
)

func load(t *testing.T, sets ...string) *config.Config {
	t.Helper()
	cfg, _, err := config.Load(nil, nil, append([]string{"workload.requests=1", "workload.prompt_tokens=100", "workload.output_tokens=10"}, sets...))
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
		"speculative_config.decoding_type=MTP", "kv_cache_config.max_tokens=1000")
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
