package cpu_test

import (
	"testing"

	"github.com/kvx-dev/kvx/core/model"
	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
)

// BenchmarkGenerate is four requests of a 64-token prompt (chunks of 16)
// and 16 generated tokens each, on the synthetic Llama and DeepSeek-V3.2
// through cachemgr_v2: manager calls included, as the engine sees it.
func BenchmarkGenerate(b *testing.B) {
	for _, c := range []struct{ preset, backend string }{{"llama-3.1-8b", "gqa"}, {"deepseek-v3.2", "dsa"}} {
		b.Run(c.preset, func(b *testing.B) {
			m := synthModel(b, c.preset, model.SyntheticSpec{}, "bf16")
			for b.Loop() {
				r := newRig(b, m, opts{backend: c.backend, manager: "v2", tpb: 16})
				var reqs []*req
				for i := range 4 {
					reqs = append(reqs, &req{seq: kvcache.SeqID(i + 1), prompt: prompt(64, i, m.Vocab), chunk: 16, want: 16})
				}
				r.run(reqs)
			}
		})
	}
}
