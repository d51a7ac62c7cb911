package cpu_test

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/kvx-dev/kvx/device/hf/hftest"
)

// TestFP8Checkpoint runs the DeepSeek-V3 golden's prompts on two
// checkpoints written here: one in fp8 (every projection F8_E4M3 with
// 16 × 24 block scales, dequantized by the loader) and one holding the same
// dequantized weights as float32. Tokens and every step's logits must be
// bit-identical, through manager v2 with reuse and a chunked prefill. A
// numerical check of the loader: the race pass leaves it to the plain pass.
func TestFP8Checkpoint(t *testing.T) {
	skipUnderRace(t)
	fp8, f32 := filepath.Join(t.TempDir(), "fp8"), filepath.Join(t.TempDir(), "f32")
	for _, d := range []string{fp8, f32} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if n, err := hftest.WriteFP8(goldenDir("deepseek_v3"), fp8, f32, [2]int{16, 24}); err != nil || n == 0 {
		t.Fatalf("WriteFP8 = %d, %v; want some tensors quantized", n, err)
	}
	ps, _, err := hftest.ReadGolden(goldenDir("deepseek_v3"))
	if err != nil {
		t.Fatal(err)
	}
	if len(ps) > 4 {
		ps = ps[:4]
	}
	o := opts{manager: "v2", reuse: true}
	a := goldenRun(t, checkpointModel(t, fp8, "float32"), ps, o, 5)
	b := goldenRun(t, checkpointModel(t, f32, "float32"), ps, o, 5)
	for i := range a {
		if len(a[i].out) == 0 || !slices.Equal(a[i].out, b[i].out) {
			t.Errorf("prompt %d: fp8 tokens %v, dequantized float32 tokens %v", i, a[i].out, b[i].out)
		}
		if len(a[i].steps) != len(b[i].steps) {
			t.Fatalf("prompt %d: %d and %d sampled steps", i, len(a[i].steps), len(b[i].steps))
		}
		for j := range a[i].steps {
			if !sameBits(a[i].steps[j], b[i].steps[j]) {
				t.Errorf("prompt %d step %d: fp8 logits differ from the dequantized float32 checkpoint's", i, j)
			}
		}
	}
}
