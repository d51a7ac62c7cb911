package main

import (
	"github.com/kvx-dev/kvx/plugins/v1/spec"
	"github.com/kvx-dev/kvx/plugins/v1/worker"
)

// stepNanos models one forward of a stage on cfg.Hardware: what makes this
// backend a variant of kvx's gqa. Each layer is one fused kernel, timed by
// a roofline, max(FLOPs / peak, bytes / bandwidth), plus the hardware's
// launch latency:
//
//   - GQA: the QKV and output projections (their weights read once, FLOPs
//     for every new token), and attention in which each new token sees its
//     context up to the layer's window: 4 * heads * head_dim FLOPs per
//     query-key pair, each sequence's visible K and V read once and the new
//     tokens' written (the layer's per-rank bytes per token);
//   - the FFN: a gated MLP (three matrices), or for MoE the routed and
//     shared experts each token activates, weights read once per expert
//     touched;
//   - the last stage adds the LM head for the rows it samples.
//
// Tensor parallelism divides FLOPs and weights by the ranks; nothing is
// charged for the all-reduce. It is pure: the same batch costs the same.
func stepNanos(cfg *worker.Config, layers []spec.Layer, items []worker.Item) int64 {
	m, hw := &cfg.Model, &cfg.Hardware
	tp := float64(max(cfg.TensorParallel, 1))
	wb, peak := 2.0, hw.FLOPSBF16
	switch cfg.WeightsDtype {
	case "fp8":
		wb, peak = 1, hw.FLOPSFP8
	case "fp4", "w4afp8":
		wb, peak = 0.5, hw.FLOPSFP8
		if hw.FLOPSFP4 > 0 {
			peak = hw.FLOPSFP4
		}
	}
	tokens, sampled := 0.0, 0.0
	for i := range items {
		tokens += float64(len(items[i].Tokens))
		if items[i].Sample {
			sampled += float64(items[i].Draft + 1)
		}
	}
	h := float64(m.Hidden)
	var s float64
	kernel := func(flops, bytes float64) {
		t := bytes / hw.MemBandwidth
		if peak > 0 {
			t = max(t, flops/peak)
		}
		s += t + hw.LaunchLatency
	}
	for _, l := range layers {
		var flops, bytes float64
		if l.Mixer == spec.MixerGQA {
			hd := float64(m.HeadDim)
			proj := h*float64(m.Heads+2*m.KVHeads)*hd + float64(m.Heads)*hd*h // QKV + output
			flops += 2 * tokens * proj / tp
			bytes += proj * wb / tp
			var kv float64
			for _, b := range l.Buffers {
				kv += float64(b.BytesPerToken)
			}
			for i := range items {
				it := &items[i]
				pairs, visible := attention(it.Pos, len(it.Tokens), l.Window)
				flops += 4 * float64(m.Heads) * hd * pairs / tp
				bytes += (visible + float64(len(it.Tokens))) * kv
			}
		}
		switch l.FFN {
		case spec.FFNDense:
			w := 3 * h * float64(m.Intermediate)
			flops += 2 * tokens * w / tp
			bytes += w * wb / tp
		case spec.FFNMoE:
			expert := 3 * h * float64(m.MoEIntermediate)
			shared := 3 * h * float64(max(m.SharedIntermediate, m.MoEIntermediate)) * float64(m.SharedExperts)
			flops += 2 * tokens * (float64(m.ExpertsPerToken)*expert + shared) / tp
			touched := min(float64(m.Experts), tokens*float64(m.ExpertsPerToken))
			bytes += (touched*expert + shared) * wb / tp
		}
		kernel(flops, bytes)
	}
	if cfg.Stage == cfg.Stages-1 && sampled > 0 {
		head := h * float64(m.Vocab)
		kernel(2*sampled*head/tp, head*wb/tp)
	}
	return int64(s * 1e9)
}

// attention returns, for n new tokens at positions pos.. of one sequence
// in a layer of window tokens (0: the whole context), the query-key pairs
// (each token sees itself and the tokens before it, at most window of
// them) and the cached tokens the kernel reads (those the last token sees,
// less the new ones).
func attention(pos, n, window int) (pairs, visible float64) {
	for j := range n {
		seen := pos + j + 1
		if window > 0 {
			seen = min(seen, window)
		}
		pairs += float64(seen)
	}
	last := pos + n
	if window > 0 {
		last = min(last, window)
	}
	return pairs, float64(max(last-n, 0))
}
