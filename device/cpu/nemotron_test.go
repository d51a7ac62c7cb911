package cpu_test

import (
	"fmt"
	"slices"
	"testing"

	"github.com/kvx-dev/kvx/device/hf/hftest"
	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
)

// hybridGoldens are the transformers goldens of hybrid models: managers
// v1 (fixed state slots, no SSM reuse) and mamba (snapshots) serve them.
var hybridGoldens = []string{"nemotron_h"}

// TestHybridGoldens runs the hybrid goldens (Nemotron-H: Mamba2, attention
// without RoPE, relu² MLP) on the cpu device through managers v1 and mamba,
// reuse on and off, chunked prefill: every prompt passes the vLLM rule, the
// logprobs of transformers' top-5 ids are within lpTol at every compared
// step, every variant gives the same tokens and logits bit for bit, and
// with the mamba manager's reuse on, the shared-prefix pairs reuse a
// snapshot.
func TestHybridGoldens(t *testing.T) {
	for _, fam := range hybridGoldens {
		t.Run(fam, func(t *testing.T) {
			dir := goldenDir(fam)
			ps, es, err := hftest.ReadGolden(dir)
			if err != nil {
				t.Fatal(err)
			}
			m := checkpointModel(t, dir, "float32")
			snaps := kvcache.SnapshotConfig{Interval: 16}
			var first []*req
			for _, v := range []struct {
				mgr   string
				reuse bool
				chunk int
			}{{"v1", false, 0}, {"v1", false, 5}, {"mamba", false, 0}, {"mamba", true, 0}, {"mamba", true, 7}, {"mamba", false, 1}} {
				name := fmt.Sprintf("%s/reuse=%v/chunk=%d", v.mgr, v.reuse, v.chunk)
				o := opts{manager: v.mgr, reuse: v.reuse, batch: len(ps)}
				if v.reuse {
					o.snaps = snaps
				}
				reqs := goldenRun(t, m, ps, o, v.chunk)
				exact, worst := checkAll(t, name, compareGolden(reqs, es))
				t.Logf("%s %s: %d of %d prompts token-exact, largest logprob difference %.2e", fam, name, exact, len(ps), worst)
				reused := 0
				for _, q := range reqs {
					reused += q.reused
				}
				if v.reuse && reused == 0 {
					t.Errorf("%s: no prompt reused a prefix (the goldens pair prompts sharing 56 tokens)", name)
				}
				if first == nil {
					first = reqs
					continue
				}
				for i, q := range reqs {
					if !slices.Equal(q.out, first[i].out) || !sameBits(q.logits, first[i].logits) {
						t.Errorf("%s prompt %d: tokens %v differ from the first variant's %v (or their logits' bits)", name, i, q.out, first[i].out)
					}
				}
			}
			checkTopLogprobsWith(t, "mamba", m, ps, es)
		})
	}
}
