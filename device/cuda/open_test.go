//go:build cuda && cgo

package cuda

import (
	"strings"
	"testing"

	"github.com/kvx-dev/kvx/device"
	"github.com/kvx-dev/kvx/device/paged"
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
