package cpu_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/kvx-dev/kvx/device"
	"github.com/kvx-dev/kvx/device/cpu"
	"github.com/kvx-dev/kvx/plugins/model"
	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
	"github.com/kvx-dev/kvx/plugins/v1/spec"
	"github.com/kvx-dev/kvx/plugins/v1/worker"
)

// stageFor returns a valid one-stage device.Stage of m with a layout from
// manager mgr.
func stageFor(t *testing.T, m spec.Model, backend, mgr string) device.Stage {
	t.Helper()
	lay, err := managers[mgr]().Configure(context.Background(), kvcache.Config{
		Stages: 1, Layers: m.Layers, TokensPerBlock: 4, DeviceBytes: 1 << 20,
		MaxBatchSize: 4, MaxNumTokens: 64, MaxSeqLen: 64,
	})
	if err != nil {
		t.Fatal(err)
	}
	cfg := &worker.Config{Stages: 1, Model: m, First: 0, Last: len(m.Layers), Backend: backend, Device: "cpu",
		TensorParallel: 1, KVDtype: "bf16", Layout: lay, Seed: seed}
	return device.Stage{Config: cfg, Backend: backends[backend], Layers: m.Layers, Pools: lay.Pools}
}

func TestOpenRefuses(t *testing.T) {
	llama := synthModel(t, "llama-3.1-8b", model.SyntheticSpec{}, "bf16")
	ds := synthModel(t, "deepseek-v3.2", model.SyntheticSpec{}, "bf16")
	if _, err := cpu.Open(stageFor(t, llama, "gqa", "v2")); err != nil {
		t.Fatalf("Open(valid llama stage) = %v", err)
	}
	ck := checkpointModel(t, goldenDir("llama"), "float32")
	ckStage := func() device.Stage {
		s := stageFor(t, ck, "gqa", "v2")
		s.Config.KVDtype = "float32"
		return s
	}
	if _, err := cpu.Open(ckStage()); err != nil {
		t.Fatalf("Open(golden llama checkpoint stage) = %v", err)
	}
	for _, c := range []struct {
		name  string
		stage func() device.Stage
		want  []string // substrings of the error: field, value, limit
	}{
		{"tensor parallel", func() device.Stage {
			s := stageFor(t, llama, "gqa", "v2")
			s.Config.TensorParallel = 2
			return s
		}, []string{"tensor_parallel 2", "limit 1"}},
		{"gdn", func() device.Stage {
			base, err := model.Load("qwen3-next-80b-a3b-thinking")
			if err != nil {
				t.Fatal(err)
			}
			m, err := model.Synthetic(base, model.SyntheticSpec{})
			if err != nil {
				t.Fatal(err)
			}
			if err := model.FillBuffers(&m, model.Dtypes{}, 1); err != nil {
				t.Fatal(err)
			}
			return stageFor(t, m, "gqa", "mamba")
		}, []string{"Qwen3NextForCausalLM", "Gated DeltaNet"}},
		{"kv dtype", func() device.Stage {
			s := stageFor(t, llama, "gqa", "v2")
			s.Config.KVDtype = "int8"
			return s
		}, []string{`"int8"`, "bf16, fp8 and float32"}},
		{"row width", func() device.Stage {
			s := stageFor(t, llama, "gqa", "v2")
			s.Config.KVDtype = "fp8" // buffers were sized for bf16
			return s
		}, []string{"layer 0", "bytes per token", "needs role kv with 32"}},
		{"block bytes", func() device.Stage {
			s := stageFor(t, llama, "gqa", "v2")
			s.Config.Layout.Pools[0].BlockBytes += 64
			s.Pools = s.Config.Layout.Pools
			return s
		}, []string{"block bytes 1088", "take 1024"}},
		{"pool bytes", func() device.Stage {
			s := stageFor(t, llama, "gqa", "v2")
			s.Config.Layout.Pools[0].Blocks = 3 << 20 // 3 GiB of 1 KiB blocks
			return s
		}, []string{"3221225472", "2147483648", "kv_cache_config.max_tokens", "free_gpu_memory_fraction"}},
		{"drafts", func() device.Stage {
			s := stageFor(t, llama, "gqa", "v2")
			s.Config.DraftTokens = 1
			return s
		}, []string{"draft tokens 1", "0 MTP layers"}},
		{"dsa drafts", func() device.Stage {
			s := stageFor(t, ds, "dsa", "v2")
			s.Config.DraftTokens = 2
			return s
		}, []string{"draft tokens 2", "1 MTP layers"}},
		{"checkpoint kv dtype", func() device.Stage {
			s := ckStage()
			s.Config.KVDtype = "bf16" // buffers were sized for float32
			return s
		}, []string{"layer 0", "bytes per token", "needs role kv with 128"}},
		{"checkpoint gone", func() device.Stage {
			s := ckStage()
			s.Config.Model.Checkpoint = t.TempDir()
			return s
		}, []string{"config.json"}},
		{"checkpoint drafts", func() device.Stage {
			s := ckStage()
			s.Config.DraftTokens = 1
			return s
		}, []string{"draft tokens 1", "0 MTP layers"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := cpu.Open(c.stage())
			if err == nil {
				t.Fatalf("Open = nil, want an error with %q", c.want)
			}
			t.Log(err)
			for _, w := range c.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("Open = %q, want it to contain %q", err, w)
				}
			}
		})
	}
}

// A stage that gets hidden activations of the wrong size refuses the batch
// with KindInvalidArg, and so does stage 0 given any.
func TestForwardRefusesBadHidden(t *testing.T) {
	m := synthModel(t, "llama-3.1-8b", model.SyntheticSpec{}, "bf16")
	r := newRig(t, m, opts{backend: "gqa", manager: "v2", pp: 2})
	for _, c := range []struct {
		stage  int
		hidden []byte
	}{{0, make([]byte, 8)}, {1, make([]byte, 12)}} {
		b := worker.Batch{Items: []worker.Item{{Seq: 1, Tokens: []int32{1, 2}}}, Hidden: c.hidden}
		_, err := r.ws[c.stage].Forward(context.Background(), b)
		var ke *kvcache.Error
		if !errors.As(err, &ke) || ke.Kind != kvcache.KindInvalidArg {
			t.Errorf("stage %d Forward(hidden of %d bytes) = %v, want a KindInvalidArg error", c.stage, len(c.hidden), err)
		}
	}
}
