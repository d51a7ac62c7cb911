package cpu_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/kvx-dev/kvx/device/hf"
	"github.com/kvx-dev/kvx/device/hf/hftest"
	"github.com/kvx-dev/kvx/device/synth"
	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
)

// hybridGoldens are the transformers goldens of hybrid models: managers
// v1 (fixed state slots, no SSM reuse) and mamba (snapshots) serve them.
// Nemotron-H runs Mamba2 layers, Qwen3-Next Gated DeltaNet ones (both in
// the state slots of the Mamba mapping).
var hybridGoldens = []string{"nemotron_h", "qwen3_next"}

// TestHybridGoldens runs the hybrid goldens (Nemotron-H: Mamba2, attention
// without RoPE, relu² MLP; Qwen3-Next: Gated DeltaNet, gated attention
// with partial RoPE, MoE with a gated shared expert) on the cpu device through managers v1 and mamba,
// reuse on and off, chunked prefill: every prompt passes the vLLM rule, the
// logprobs of transformers' top-5 ids are within lpTol at every compared
// step, every variant gives the same tokens and logits bit for bit, and
// with the mamba manager's reuse on, the shared-prefix pairs reuse a
// snapshot.
func TestHybridGoldens(t *testing.T) {
	skipUnderRace(t)
	for _, fam := range hybridGoldens {
		t.Run(fam, func(t *testing.T) {
			dir := goldenDir(fam)
			ps, es, err := hftest.ReadGolden(dir)
			if err != nil {
				t.Fatal(err)
			}
			m := checkpointModel(t, dir, "float32")
			snaps := kvcache.SnapshotConfig{Interval: 16}
			n := len(ps)
			goldenVariants(t, fam, m, ps, es, []goldenVariant{
				{opts{manager: "v1", batch: n}, 0}, {opts{manager: "v1", batch: n}, 5},
				{opts{manager: "mamba", batch: n}, 0}, {opts{manager: "mamba", reuse: true, snaps: snaps, batch: n}, 0},
				{opts{manager: "mamba", reuse: true, snaps: snaps, batch: n}, 7}, {opts{manager: "mamba", batch: n}, 1},
			})
			checkTopLogprobsWith(t, "mamba", m, ps, es)
		})
	}
}

// mambaEdit is a deliberately wrong Mamba2: edit changes the layer's
// weights before the device's kernel sees them.
type mambaEdit struct {
	hf.Ops
	edit func(o hf.Ops, w *synth.Mamba2Weights)
}

func (o mambaEdit) Mamba2(ctx context.Context, layer int, segs []synth.Seg, in synth.Mamba2In, w synth.Mamba2Weights) (synth.Tensor, error) {
	o.edit(o.Ops, &w)
	return o.Ops.Mamba2(ctx, layer, segs, in, w)
}

// withConfig copies golden dir fam to a temporary directory with
// config.json's key set to value.
func withConfig(t *testing.T, fam, key string, value any) string {
	t.Helper()
	src := goldenDir(fam)
	dst := filepath.Join(t.TempDir(), filepath.Base(fam))
	if err := os.Mkdir(dst, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"model.safetensors", "prompts.jsonl", "expected.json", "config.json"} {
		data, err := os.ReadFile(filepath.Join(src, f))
		if err != nil {
			t.Fatal(err)
		}
		if f == "config.json" {
			var c map[string]any
			if err := json.Unmarshal(data, &c); err != nil {
				t.Fatal(err)
			}
			c[key] = value
			if data, err = json.Marshal(c); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.WriteFile(filepath.Join(dst, f), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dst
}

// TestHybridGoldenCheckCatchesWrongKernels shows the hybrid golden check
// has teeth: a Nemotron-H run with the Mamba2 D skip dropped, the gated
// norm's gains dropped, or no dt floor on prompt tokens (time_step_min 0)
// fails the rule or the logprob tolerance on some prompt.
func TestHybridGoldenCheckCatchesWrongKernels(t *testing.T) {
	skipUnderRace(t)
	for _, c := range []struct {
		name string
		dir  func(t *testing.T) string
		wrap func(hf.Ops) hf.Ops
	}{
		{"D skip dropped", nil, func(o hf.Ops) hf.Ops {
			return mambaEdit{o, func(o hf.Ops, w *synth.Mamba2Weights) { w.D = o.Zeros(1, w.D.Cols()) }}
		}},
		{"gated norm gains dropped", nil, func(o hf.Ops) hf.Ops {
			return mambaEdit{o, func(o hf.Ops, w *synth.Mamba2Weights) {
				ones := make([]float32, w.NormW.Cols())
				for i := range ones {
					ones[i] = 1
				}
				w.NormW = o.FromHost(ones, 1, len(ones))
			}}
		}},
		{"no dt floor on prompt tokens", func(t *testing.T) string { return withConfig(t, "nemotron_h", "time_step_min", 0) }, nil},
	} {
		dir := goldenDir("nemotron_h")
		if c.dir != nil {
			dir = c.dir(t)
		}
		expectCaught(t, c.name, dir, nil, opts{manager: "mamba", batch: allPrompts}, c.wrap)
	}
}

// BenchmarkHybridGoldenDecode is BenchmarkGoldenDecode on the hybrid
// goldens through the mamba manager: Nemotron-H (5 blocks: 2 Mamba2, 1
// attention, 2 MLP; hidden 64) and Qwen3-Next (4 layers: 3 Gated DeltaNet,
// 1 gated attention, each with an MoE of 8 experts and a shared one;
// hidden 64). Run with -cpu 1 and -cpu N.
func BenchmarkHybridGoldenDecode(b *testing.B) {
	for _, fam := range hybridGoldens {
		b.Run(fam, func(b *testing.B) { goldenDecode(b, fam, "mamba") })
	}
}
