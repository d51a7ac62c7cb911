package mamba_test

import (
	"context"
	"fmt"
	"testing"

	"pgregory.net/rapid"

	cachemgrv1 "github.com/kvx-dev/kvx/cachemgr_v1"
	"github.com/kvx-dev/kvx/core/engine"
	"github.com/kvx-dev/kvx/core/hw"
	"github.com/kvx-dev/kvx/core/report"
	"github.com/kvx-dev/kvx/core/sched"
	"github.com/kvx-dev/kvx/core/workload"
	"github.com/kvx-dev/kvx/device"
	"github.com/kvx-dev/kvx/gqa"
	"github.com/kvx-dev/kvx/mamba"
	"github.com/kvx-dev/kvx/plugins/model"
	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
	"github.com/kvx-dev/kvx/plugins/v1/spec"
	"github.com/kvx-dev/kvx/plugins/v1/worker"
)

type inproc struct{ manager func() kvcache.Manager }

func (l inproc) Manager(context.Context, int) (kvcache.Manager, error) { return l.manager(), nil }
func (l inproc) Worker(context.Context, int) (worker.Worker, error) {
	return device.NewWorker(gqa.Backend), nil
}

const (
	propTPB       = 64
	propChunk     = 16384
	propBatch     = 4
	propMaxSeqLen = 270_000
)

var propModel = func() spec.Model {
	m, err := model.Load("nemotron-3-nano-30b-a3b")
	if err != nil {
		panic(err)
	}
	m.Layers = m.Layers[:len(m.Layers)-m.NumNextN]
	m.NumNextN = 0
	if err := model.FillBuffers(&m, model.Dtypes{KV: "fp8", SSM: "float16"}, 1); err != nil {
		panic(err)
	}
	return m
}()

// variant is the part of the configuration the property varies: hints and
// the snapshot policy, which may change hit rates and timings only.
type variant struct {
	avgSeqLen int
	poolRatio []float64
	interval  int
	offsets   []int
	budget    float64 // device bytes as a multiple of the floor
	host      float64 // host bytes as a multiple of the device bytes; 0 = no host tier
}

func (v variant) String() string {
	return fmt.Sprintf("avg_seq_len %d, pool_ratio %v, interval %d, offsets %v, budget ×%.2f, host ×%.2f",
		v.avgSeqLen, v.poolRatio, v.interval, v.offsets, v.budget, v.host)
}

// floorBytes is what one max_seq_len request plus the live states and one
// snapshot slot need on the stage.
func floorBytes() (attn, state int64) {
	var perTok, perSeq int64
	for _, l := range propModel.Layers {
		for _, b := range l.Buffers {
			perTok += b.BytesPerToken
			perSeq += b.BytesPerSeq
		}
	}
	blocks := (propMaxSeqLen + propTPB - 1) / propTPB
	return int64(blocks) * propTPB * perTok, int64(propBatch+1) * perSeq
}

type fataler interface {
	Fatalf(format string, args ...any)
}

func propSpec(t fataler, v variant, wl workload.Workload) engine.Spec {
	h, err := hw.Lookup("h200")
	if err != nil {
		t.Fatalf("%v", err)
	}
	attn, state := floorBytes()
	s := engine.Spec{Variant: v.String(), Hardware: h, Hidden: propModel.Hidden, CheckEvery: 1, DeepEvery: 4, Workload: wl}
	dev := int64(float64(attn+state)*v.budget) + 1
	s.Managers = []kvcache.Config{{
		Stages: 1, Layers: propModel.Layers, TokensPerBlock: propTPB,
		DeviceBytes: dev, HostBytes: int64(float64(dev) * v.host),
		MaxBatchSize: propBatch, MaxNumTokens: propChunk, MaxSeqLen: propMaxSeqLen,
		EnableBlockReuse: true, AvgSeqLen: v.avgSeqLen, PoolRatio: v.poolRatio,
		Snapshots: kvcache.SnapshotConfig{Interval: v.interval, OffsetsFromEnd: v.offsets},
	}}
	s.Workers = []worker.Config{{
		Stages: 1, Model: propModel, First: 0, Last: len(propModel.Layers), Backend: "gqa", Device: "sim",
		Hardware: h, TensorParallel: 1, WeightsDtype: "fp8", KVDtype: "fp8", Seed: 7,
	}}
	s.Sched = sched.Config{
		MaxBatchSize: propBatch, MaxResident: propBatch, MaxNumTokens: propChunk, MaxSeqLen: propMaxSeqLen,
		ChunkedPrefill: true, TokensPerBlock: propTPB, Reuse: true, Policy: sched.GuaranteedNoEvict,
	}
	return s
}

// needleWorkload is n requests of about 256k tokens: a shared filler with a
// distinct block in the middle, then the same prompts again later.
func needleWorkload(rt *rapid.T) workload.Workload {
	n := rapid.IntRange(1, 3).Draw(rt, "prompts")
	var reqs []workload.Request
	for round := range 2 {
		for i := range n {
			size := rapid.IntRange(200_000, 262_144).Draw(rt, fmt.Sprintf("size%d", i))
			if round == 1 {
				size = len(reqs[i].Prompt)
			}
			p := make([]int32, size)
			for j := range p {
				p[j] = int32(j%30011 + 1)
			}
			mid := size / 2
			for j := mid; j < min(mid+64, size); j++ {
				p[j] = int32(40000 + i)
			}
			reqs = append(reqs, workload.Request{
				ID: uint64(len(reqs)), Arrival: int64(round)*3_600_000_000_000 + int64(i),
				Prompt: p, OutputLen: 1 + rapid.IntRange(0, 16).Draw(rt, "out"),
			})
		}
	}
	return workload.Workload{Requests: reqs}
}

func run(t fataler, s engine.Spec, mk func() kvcache.Manager) report.Report {
	rep, err := engine.Run(context.Background(), s, inproc{manager: mk})
	if err != nil {
		t.Fatalf("%s: Run: %v\nviolations: %v", s.Variant, err, rep.Invariants.First)
	}
	if rep.Invariants.Violations != 0 {
		t.Fatalf("%s: %d violations: %v", s.Variant, rep.Invariants.Violations, rep.Invariants.First)
	}
	return rep
}

// TestPropertyHintsChangeSpeedOnly varies avg_seq_len (unset, 1, tiny,
// typical, max_seq_len), pool_ratio (unset, random, a deliberately tiny SSM
// pool), the snapshot interval and offsets, the budget and the host tier
// (none, or one that takes the attention blocks and snapshots the device
// evicts), over 256k-token
// mid-needle prompts with reuse on, and checks against cachemgr_v1 (no SSM
// reuse) on the same workload: no panic, no invariant violation, the same
// request outcomes, outputs and token counts. Only hit rates and timings
// may differ.
func TestPropertyHintsChangeSpeedOnly(t *testing.T) {
	var runs, hit, evicted, skipped, host int
	defer func() {
		t.Logf("%d runs (%d with a host tier): %d reused a prefix, %d evicted snapshots, %d skipped snapshots", runs, host, hit, evicted, skipped)
	}()
	rapid.Check(t, func(rt *rapid.T) {
		wl := needleWorkload(rt)
		v := variant{
			avgSeqLen: rapid.SampledFrom([]int{0, 1, 64, 9000, propMaxSeqLen}).Draw(rt, "avg_seq_len"),
			interval:  rapid.SampledFrom([]int{64, 256, 1000, 16384}).Draw(rt, "interval"),
			offsets:   rapid.SampledFrom([][]int{nil, {0}, {0, 5000}}).Draw(rt, "offsets"),
			budget:    rapid.Float64Range(1.0, 3.0).Draw(rt, "budget"),
			host:      rapid.SampledFrom([]float64{0, 0.25, 1}).Draw(rt, "host"),
		}
		switch rapid.IntRange(0, 2).Draw(rt, "ratio") {
		case 1:
			r := rapid.Float64Range(0.01, 0.99).Draw(rt, "r")
			v.poolRatio = []float64{r, 1 - r}
		case 2:
			v.poolRatio = []float64{1 - 1e-6, 1e-6} // the SSM pool at its floor: one snapshot slot
		}
		got := run(rt, propSpec(rt, v, wl), func() kvcache.Manager { return mamba.New() })
		ref := run(rt, propSpec(rt, variant{interval: 256, budget: v.budget}, wl), func() kvcache.Manager { return cachemgrv1.New() })
		if got.Requests.Failed != 0 || got.Requests.Completed != got.Requests.Total || got.Requests.Rejected != 0 {
			rt.Fatalf("%s: requests %+v", v, got.Requests)
		}
		if a, b := got.Requests, ref.Requests; a.Total != b.Total || a.Completed != b.Completed || a.Rejected != b.Rejected || a.Failed != b.Failed {
			rt.Fatalf("%s: requests %+v, v1 %+v", v, got.Requests, ref.Requests)
		}
		if got.Outputs.Digest != ref.Outputs.Digest || got.Tokens.Generated != ref.Tokens.Generated || got.Tokens.Prompt != ref.Tokens.Prompt {
			rt.Fatalf("%s: outputs %s (%d generated, %d prompt), v1 %s (%d, %d)", v, got.Outputs.Digest, got.Tokens.Generated, got.Tokens.Prompt,
				ref.Outputs.Digest, ref.Tokens.Generated, ref.Tokens.Prompt)
		}
		if got.Snapshots == nil {
			rt.Fatalf("%s: no snapshot statistics in the report", v)
		}
		runs++
		if v.host > 0 {
			host++
		}
		if got.Tokens.PrefixReused > 0 {
			hit++
		}
		if got.Snapshots.Evicted > 0 {
			evicted++
		}
		if got.Snapshots.Skipped > 0 {
			skipped++
		}
	})
}
