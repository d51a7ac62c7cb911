//go:build cuda && cgo

package cuda

import (
	"strings"
	"testing"

	"github.com/kvx-dev/kvx/device"
	"github.com/kvx-dev/kvx/device/paged"
	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
	"github.com/kvx-dev/kvx/plugins/v1/spec"
	"github.com/kvx-dev/kvx/plugins/v1/worker"
)

// TestOpenRefusesGDN: a Qwen3-Next stage is refused at Open, before any GPU
// work, with an error naming the architecture (the cuda device has no Gated
// DeltaNet kernel; the cpu device runs it).
func TestOpenRefusesGDN(t *testing.T) {
	cfg := &worker.Config{Model: spec.Model{Name: "qwen3_next", Arch: paged.ArchGDN}}
	d, err := Open(device.Stage{Config: cfg})
	if err == nil {
		if c, ok := d.(interface{ Close() error }); ok {
			c.Close()
		}
		t.Fatal("Open(Qwen3-Next stage) = nil error, want a refusal")
	}
	for _, want := range []string{"Qwen3NextForCausalLM", "Gated DeltaNet", "device: cpu"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("Open(Qwen3-Next stage) = %q, want it to name %q", err, want)
		}
	}
}

// TestOpenPoolsAboveFree: a layout whose device pools take more than the
// GPU's free memory is refused before anything is allocated, with an error
// that gives both sizes and the keys to lower (Open makes its pools with
// allocPools, after the weights).
func TestOpenPoolsAboveFree(t *testing.T) {
	g, err := sharedGPU()
	if err != nil {
		t.Fatalf("no GPU: %v", err)
	}
	var free int64
	if err := g.do(func() error {
		var e error
		free, _, e = g.memInfo()
		return e
	}); err != nil {
		t.Fatal(err)
	}
	d := &Device{g: g, idx: map[int]int{}, ps: &paged.Stage{Pools: []kvcache.Pool{
		{ID: 1, Name: "full", Tier: kvcache.TierDevice, TokensPerBlock: 16, BlockBytes: 1 << 20, Blocks: int(free>>20) + 1024}}}}
	err = g.do(d.allocPools)
	if err == nil {
		t.Fatalf("allocPools of %d MiB with %d MiB free: nil error", free>>20+1024, free>>20)
	}
	for _, want := range []string{"above the", "bytes free", "free_gpu_memory_fraction", "kv_cache_config.max_tokens"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("allocPools = %q, want it to contain %q", err, want)
		}
	}
	if len(d.pools) != 0 {
		t.Errorf("allocPools allocated %d pools before refusing", len(d.pools))
	}
}
