package cpu_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/kvx-dev/kvx/plugins/model"
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

// BenchmarkGoldenDecode is decode on the golden checkpoints llama,
// deepseek_v3 and deepseek_v32 (device/hf/testdata: 3 layers, hidden 64,
// float32 weights and KV) through cachemgr_v2: batches of 1 and 4
// sequences, prompts of 32 tokens prefilled outside the measurement, then
// one token per sequence per step up to position 240 (or 8 short of the
// model's max_position). tok/s counts decoded tokens over the decode
// steps' time (manager calls included). Run with -cpu 1 and -cpu N.
func BenchmarkGoldenDecode(b *testing.B) {
	for _, fam := range []string{"llama", "deepseek_v3", "deepseek_v32"} {
		b.Run(fam, func(b *testing.B) { goldenDecode(b, fam, "v2") })
	}
}

// goldenDecode is BenchmarkGoldenDecode on golden family fam through
// manager mgr.
func goldenDecode(b *testing.B, fam, mgr string) {
	m := checkpointModel(b, goldenDir(fam), "float32")
	limit := min(240, m.MaxPosition-8)
	for _, batch := range []int{1, 4} {
		b.Run(fmt.Sprintf("batch=%d", batch), func(b *testing.B) {
			var r *rig
			var reqs []*req
			fresh := func() {
				r = newRig(b, m, opts{backend: backendOf(m), manager: mgr, tpb: 16, kv: "float32", maxSeq: 256})
				reqs = nil
				for i := range batch {
					reqs = append(reqs, &req{seq: kvcache.SeqID(i + 1), prompt: prompt(32, i, m.Vocab), want: 1 << 20})
				}
				if err := r.step(reqs); err != nil {
					b.Fatal(err)
				}
			}
			var decode time.Duration
			tokens := 0
			for b.Loop() {
				if reqs == nil || reqs[0].pos >= limit {
					fresh()
				}
				start := time.Now()
				if err := r.step(reqs); err != nil {
					b.Fatal(err)
				}
				decode += time.Since(start)
				tokens += batch
			}
			b.ReportMetric(float64(tokens)/decode.Seconds(), "tok/s")
		})
	}
}
