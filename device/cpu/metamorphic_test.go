package cpu_test

import (
	"math/rand/v2"
	"testing"

	"github.com/kvx-dev/kvx/device/cpu"
	"github.com/kvx-dev/kvx/internal/race"
	"github.com/kvx-dev/kvx/plugins/model"
	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
	"github.com/kvx-dev/kvx/plugins/v1/spec"
)

// Seeded random traces: block size, chunk sizes, prompt lengths, batch
// composition and manager vary; every request must still equal the dense
// reference bit for bit. The seed is printed on failure. Under -race (make
// test-race) only the first seed of each model runs: what there is to race
// is the device's parallel loops, which every seed of a model reaches
// through the same kernels (see raceCases); the plain pass runs all 16.
func TestMetamorphic(t *testing.T) {
	type modelCase struct {
		m       spec.Model
		backend string
		mgrs    []string
		drafts  int
	}
	llama := synthModel(t, "llama-3.1-8b", model.SyntheticSpec{}, "bf16")
	windowed(&llama)
	hybrid := synthModel(t, "nemotron-3-nano-30b-a3b", model.SyntheticSpec{}, "bf16")
	withMTP(&hybrid)
	models := []modelCase{
		{llama, "gqa", []string{"v1", "v2"}, 0},
		{synthModel(t, "deepseek-v3.2", model.SyntheticSpec{}, "fp8"), "dsa", []string{"v1", "v2"}, 1},
		{hybrid, "gqa", []string{"mamba"}, 1},
	}
	refs := map[int]*cpu.Reference{}
	for i, mm := range models {
		ref, err := cpu.NewReference(mm.m, seed, backends[mm.backend].Kernel)
		if err != nil {
			t.Fatal(err)
		}
		refs[i] = ref
	}
	raced := map[int]bool{} // models with a seed run under -race
	for s := uint64(1); s <= 16; s++ {
		rng := rand.New(rand.NewPCG(s, 99))
		mi := rng.IntN(len(models))
		if race.Enabled && raced[mi] {
			continue
		}
		raced[mi] = true
		mm := models[mi]
		o := opts{backend: mm.backend, manager: mm.mgrs[rng.IntN(len(mm.mgrs))], tpb: []int{1, 2, 4, 8, 16}[rng.IntN(5)],
			drafts: mm.drafts * rng.IntN(2), kv: "bf16"}
		if mm.backend == "dsa" {
			o.kv = "fp8"
		}
		var reqs []*req
		for i := range 1 + rng.IntN(4) {
			reqs = append(reqs, &req{seq: kvcache.SeqID(i + 1), prompt: prompt(1+rng.IntN(40), int(s)*10+i, mm.m.Vocab),
				chunk: rng.IntN(12), want: 1 + rng.IntN(5)})
		}
		r := newRig(t, mm.m, o)
		r.run(reqs)
		for _, msg := range mismatches(t, refs[mi], reqs) {
			t.Errorf("seed %d (%s, %+v): %s", s, mm.m.Name, o, msg)
		}
	}
}
