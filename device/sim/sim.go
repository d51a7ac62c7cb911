// Package sim is the cost model of the sim device: no memory and no math, a
// roofline per kernel from the model spec and a hardware spec, so that
// production-scale traces replay on a laptop.
//
// The vocabulary is small:
//
//   - an Env fixes what does not change between steps: model, hardware, tensor
//     parallelism and the weights' number format;
//   - a Batch describes one forward: per sequence its context length after the
//     step and the tokens the step writes;
//   - a Kernel is the FLOPs and bytes of one kernel on one rank, and Work adds
//     kernels up, each at max(FLOPs/peak, bytes/bandwidth) seconds;
//   - a Stage (stage.go) sums the layers of one pipeline stage, asking a
//     MixerFunc (the attention backend) for the token-mixing part of each
//     layer and using the shared helpers here for everything else.
//
// Everything is per rank. With tensor parallelism TP a rank does 1/TP of the
// sharded work and reads 1/TP of the sharded weights; cache bytes come from
// the layers' Buffers, which the model loader already sized per rank.
//
// All functions are pure; an Env and a Stage are read-only after they are
// made and safe for concurrent use.
package sim

import (
	"fmt"
	"math"
	"strings"

	"github.com/kvx-dev/kvx/plugins/v1/spec"
)

// Precision is the number format a kernel computes in; it picks the FLOP peak.
type Precision uint8

const (
	BF16 Precision = iota // tensor cores in bf16 (also the fallback of the others)
	FP8                   // fp8 tensor cores; bf16 where the hardware has none
	FP4                   // fp4 tensor cores; fp8 where the hardware has none
)

func (p Precision) String() string {
	switch p {
	case FP8:
		return "fp8"
	case FP4:
		return "fp4"
	}
	return "bf16"
}

// actBytes is the size of one activation element: activations, the embedding
// table and the LM head stay in bf16 whatever the weights' format (quantized
// checkpoints keep embed_tokens and lm_head in bf16).
const actBytes = 2

// Dtype is a weights number format: how many bytes a parameter takes and the
// precision its matmuls run at.
type Dtype struct {
	Name  string
	Bytes float64 // bytes per parameter, block scales included
	Prec  Precision
}

// WeightsDtype returns the format called name ("bf16", "fp8", "fp4",
// "w4afp8"; "" means bf16). Other names are an error that lists these.
func WeightsDtype(name string) (Dtype, error) {
	switch name {
	case "", "bf16":
		return Dtype{Name: "bf16", Bytes: 2, Prec: BF16}, nil
	case "fp8":
		// One fp32 scale per 128x128 block adds 4/16384 B per parameter: ignored.
		return Dtype{Name: "fp8", Bytes: 1, Prec: FP8}, nil
	case "fp4":
		// NVFP4: 4-bit values plus one fp8 scale per 16 values.
		return Dtype{Name: "fp4", Bytes: 0.5 + 1.0/16, Prec: FP4}, nil
	case "w4afp8":
		// 4-bit weights with one bf16 scale per group of 128, fp8 activations:
		// the matmul runs on fp8 tensor cores.
		return Dtype{Name: "w4afp8", Bytes: 0.5 + 2.0/128, Prec: FP8}, nil
	}
	return Dtype{}, fmt.Errorf("weights dtype %q is not one of bf16, fp8, fp4, w4afp8", name)
}

// Env is what every cost function needs besides the batch. Make it with
// NewEnv; it is read-only afterwards.
type Env struct {
	Model   *spec.Model
	HW      spec.Hardware
	TP      int   // tensor-parallel ranks, >= 1
	Weights Dtype // format of the layers' weight matmuls

	// GatedMLP is true when MLPs and experts have gate, up and down
	// projections (SwiGLU: Llama, DeepSeek, Qwen); NemotronH's relu2 MLPs and
	// experts have only up and down.
	GatedMLP bool

	peaks [3]float64   // FLOP/s per Precision, after fallbacks
	cal   *calibration // HW.Calibration checked and indexed; nil: datasheet roofline
}

// NewEnv checks the hardware figures the cost model divides by and returns an
// Env. m is retained and must not change afterwards. tp 0 means 1. Errors
// name the field, the value and what is needed.
func NewEnv(m *spec.Model, hw spec.Hardware, tp int, weights string) (*Env, error) {
	if tp == 0 {
		tp = 1
	}
	if tp < 0 {
		return nil, fmt.Errorf("tensor_parallel %d must be >= 1", tp)
	}
	if !(hw.MemBandwidth > 0) {
		return nil, fmt.Errorf("hardware %q: mem_bandwidth %g must be > 0 for the sim device", hw.Name, hw.MemBandwidth)
	}
	if !(hw.FLOPSBF16 > 0) {
		return nil, fmt.Errorf("hardware %q: flops_bf16 %g must be > 0 for the sim device", hw.Name, hw.FLOPSBF16)
	}
	if tp > 1 && !(hw.NVLinkBW > 0) {
		return nil, fmt.Errorf("hardware %q: nvlink_bandwidth %g must be > 0 for tensor_parallel %d", hw.Name, hw.NVLinkBW, tp)
	}
	if hw.FLOPSFP8 < 0 || hw.FLOPSFP4 < 0 || hw.LaunchLatency < 0 || hw.PCIeBW < 0 {
		return nil, fmt.Errorf("hardware %q: flops_fp8 %g, flops_fp4 %g, pcie_bandwidth %g and launch_latency %g must be >= 0",
			hw.Name, hw.FLOPSFP8, hw.FLOPSFP4, hw.PCIeBW, hw.LaunchLatency)
	}
	if !(hw.CopyLatency >= 0) || math.IsInf(hw.CopyLatency, 0) {
		return nil, fmt.Errorf("hardware %q: copy_latency %g s must be finite and >= 0", hw.Name, hw.CopyLatency)
	}
	dt, err := WeightsDtype(weights)
	if err != nil {
		return nil, err
	}
	e := &Env{Model: m, HW: hw, TP: tp, Weights: dt, GatedMLP: !isNemotronH(m.Arch)}
	e.peaks[BF16] = hw.FLOPSBF16
	e.peaks[FP8] = hw.FLOPSBF16
	if hw.FLOPSFP8 > 0 {
		e.peaks[FP8] = hw.FLOPSFP8
	}
	e.peaks[FP4] = e.peaks[FP8]
	if hw.FLOPSFP4 > 0 {
		e.peaks[FP4] = hw.FLOPSFP4
	}
	if hw.Calibration != nil {
		c, err := newCalibration(hw.Calibration)
		if err != nil {
			return nil, fmt.Errorf("hardware %q: %w", hw.Name, err)
		}
		e.cal = c
	}
	return e, nil
}

func isNemotronH(arch string) bool {
	a := strings.ToLower(strings.ReplaceAll(arch, "_", ""))
	return strings.HasPrefix(a, "nemotronh")
}

// Peak returns the FLOP/s of precision p on this hardware, after fallbacks
// (fp4 to fp8 to bf16 where the hardware lacks the format).
func (e *Env) Peak(p Precision) float64 { return e.peaks[p] }

// Shard divides a sharded quantity (heads, weights, FLOPs) among the
// tensor-parallel ranks.
func (e *Env) Shard(x float64) float64 { return x / float64(e.TP) }

// Seq is one sequence's part of a forward.
type Seq struct {
	Context int // tokens of context after the step: history + New
	New     int // tokens the step writes (prefill chunk, or 1 + drafts)
}

// Batch is one forward's sequences. Tokens is the sum of Seqs[i].New.
type Batch struct {
	Seqs   []Seq
	Tokens int
}

// Class is what kind of kernel a Kernel is, for a calibration (calib.go):
// kernels of one class share their measured efficiencies.
type Class uint8

const (
	// ClassMixer is a backend's token-mixing kernel (attention, indexer,
	// scan, cache reads and writes): the zero value, so the kernels a
	// MixerFunc adds are mixers unless it says otherwise. Its calibration
	// is per layer mixer ("mixer.gqa", "mixer.dsa", ...).
	ClassMixer  Class = iota
	ClassGEMM         // a weight matmul (Linear: projections, dense FFN, router, LM head)
	ClassMoE          // the routed experts of an MoE FFN
	ClassMemory       // pure memory traffic (the embedding lookup)
)

// Kernel is the work of one kernel (or one fused group) on one rank.
type Kernel struct {
	FLOPs float64 // a multiply-add counts 2
	Prec  Precision
	Bytes float64 // bytes read from and written to device memory
	Class Class
}

// Work adds up kernels on one rank. Seconds is the sum over kernels of
// max(FLOPs/peak, Bytes/bandwidth), plus whatever the helpers add for
// communication and launches; with a calibration (Env.Calibrated) each
// kernel's two sides are scaled by its class's measured factors and it pays
// the calibrated launch cost. The zero value is empty work.
type Work struct {
	FLOPs     float64
	Bytes     float64 // device memory traffic
	LinkBytes float64 // NVLink traffic (all-reduce)
	Seconds   float64

	// Set by Stage around the calls it makes: the layer mixer whose kernels
	// are being added (for ClassMixer), and, when recording, where the
	// kernels go and how many identical layers each one stands for.
	mixer  spec.Mixer
	rec    *[]Feature
	weight float64
}

// Add adds one kernel at its roofline time.
func (w *Work) Add(e *Env, k Kernel) {
	w.FLOPs += k.FLOPs
	w.Bytes += k.Bytes
	tc, tm := k.FLOPs/e.peaks[k.Prec], k.Bytes/e.HW.MemBandwidth
	if w.rec != nil {
		w.record(k, tc, tm)
	}
	if c := e.cal; c != nil {
		sc := c.scale(k.Class, w.mixer)
		w.Seconds += max(tc*sc.compute, tm*sc.memory) + c.launch
		return
	}
	w.Seconds += max(tc, tm)
}

// AddScaled adds n copies of o (n identical layers).
func (w *Work) AddScaled(o Work, n float64) {
	w.FLOPs += n * o.FLOPs
	w.Bytes += n * o.Bytes
	w.LinkBytes += n * o.LinkBytes
	w.Seconds += n * o.Seconds
}

// Pairs returns the query-key pairs of s's new tokens under causal attention
// that sees at most horizon tokens (0 = the whole context): new token j
// (0-based) sits at context position Context-New+j and sees min(horizon,
// Context-New+j+1) tokens, itself included.
func Pairs(s Seq, horizon int) float64 {
	n, c := float64(s.New), float64(s.Context)
	if n <= 0 {
		return 0
	}
	a := c - n + 1 // tokens the first new token sees
	if horizon <= 0 || float64(horizon) >= c {
		return (a + c) * n / 2
	}
	h := float64(horizon)
	if h <= a {
		return n * h
	}
	// Tokens seeing a..h grow; the rest are capped at h.
	return (a+h)*(h-a+1)/2 + (c-h)*h
}

// Visible returns the cached tokens s reads under a horizon (0 = all): the
// cache is read once per sequence per layer.
func Visible(s Seq, horizon int) float64 {
	if horizon > 0 && horizon < s.Context {
		return float64(horizon)
	}
	return float64(s.Context)
}

// TokenBytes returns the per-token bytes of l's buffers with role r on one
// rank (0 when l has none).
func TokenBytes(l *spec.Layer, r spec.Role) float64 {
	var b int64
	for _, x := range l.Buffers {
		if x.Role == r {
			b += x.BytesPerToken
		}
	}
	return float64(b)
}

// SeqBytes returns the per-sequence (state) bytes of all l's buffers on one rank.
func SeqBytes(l *spec.Layer) float64 {
	var b int64
	for _, x := range l.Buffers {
		b += x.BytesPerSeq
	}
	return float64(b)
}

// HeadDim returns the attention head size: Model.HeadDim, or Hidden/Heads
// when the config gives none.
func HeadDim(m *spec.Model) int {
	if m.HeadDim > 0 {
		return m.HeadDim
	}
	if m.Heads > 0 {
		return m.Hidden / m.Heads
	}
	return 0
}

// Linear adds a weight matmul of in x out parameters over tokens rows in the
// weights' format. sharded: tensor parallelism splits the matrix (column- or
// row-parallel) so each rank holds and multiplies 1/TP of it; otherwise every
// rank holds and runs all of it (replicated). Bytes are the weights read once
// plus bf16 activations in and out (not split: an upper bound that matters
// only where the matmul is compute bound anyway).
func Linear(e *Env, w *Work, in, out, tokens int, sharded bool) {
	linear(e, w, float64(in), float64(out), float64(tokens), sharded, e.Weights)
}

var bf16 = Dtype{Name: "bf16", Bytes: 2, Prec: BF16}

func linear(e *Env, w *Work, in, out, tokens float64, sharded bool, dt Dtype) {
	params := in * out
	if sharded {
		params = e.Shard(params)
	}
	w.Add(e, Kernel{
		FLOPs: 2 * params * tokens,
		Prec:  dt.Prec,
		Bytes: params*dt.Bytes + tokens*(in+out)*actBytes,
		Class: ClassGEMM,
	})
}

// AllReduce adds the all-reduce that ends a tensor-parallel block (attention
// output or FFN down projection): a ring moves 2*(TP-1)/TP of the tokens'
// bf16 hidden states per rank over NVLink. Nothing with TP 1. Its latency is
// part of HW.LaunchLatency.
func AllReduce(e *Env, w *Work, tokens int) {
	if e.TP <= 1 || tokens == 0 {
		return
	}
	tp := float64(e.TP)
	b := 2 * (tp - 1) / tp * float64(tokens) * float64(e.Model.Hidden) * actBytes
	w.LinkBytes += b
	w.Seconds += b / e.HW.NVLinkBW
}

// FFN adds the feed-forward part of layer l over tokens rows (nothing for
// FFNNone).
//
// Dense: gate, up (when GatedMLP) and down projections, all sharded.
//
// MoE: a replicated router; with MoELatent the tokens are projected to the
// latent size and back and the experts work at that size; each token runs
// ExpertsPerToken routed experts (FLOPs for the active experts only) and the
// shared experts. The routed weights read are those of the distinct experts
// the batch touches: with uniform routing E*(1-(1-k/E)^tokens) in expectation,
// which never exceeds min(E, tokens*k). Experts are sharded by tensor
// parallelism (expert parallelism is not modelled).
func FFN(e *Env, w *Work, l *spec.Layer, tokens int) {
	m := e.Model
	mats := 2.0 // up and down
	if e.GatedMLP {
		mats = 3 // gate, up and down
	}
	h, t := float64(m.Hidden), float64(tokens)
	switch l.FFN {
	case spec.FFNDense:
		inter := float64(m.Intermediate)
		linear(e, w, h, (mats-1)*inter, t, true, e.Weights)
		linear(e, w, inter, h, t, true, e.Weights)
	case spec.FFNMoE:
		linear(e, w, h, float64(m.Experts), t, false, e.Weights) // router
		d := h
		if m.MoELatent > 0 {
			d = float64(m.MoELatent)
			linear(e, w, h, d, t, true, e.Weights)
			linear(e, w, d, h, t, true, e.Weights)
		}
		E, k, inter := float64(m.Experts), float64(m.ExpertsPerToken), float64(m.MoEIntermediate)
		expert := e.Shard(mats * d * inter) // one expert's parameters on one rank
		var touched float64
		if E > 0 && k > 0 {
			touched = E * (1 - math.Pow(1-min(k, E)/E, t))
		}
		w.Add(e, Kernel{
			FLOPs: 2 * expert * t * k,
			Prec:  e.Weights.Prec,
			Bytes: touched*expert*e.Weights.Bytes + t*k*2*d*actBytes,
			Class: ClassMoE,
		})
		if m.SharedExperts > 0 {
			si := float64(m.SharedIntermediate)
			if si == 0 {
				si = inter
			}
			si *= float64(m.SharedExperts)
			linear(e, w, h, (mats-1)*si, t, true, e.Weights)
			linear(e, w, si, h, t, true, e.Weights)
		}
	}
}

// Embed adds the embedding lookup of the first stage: one bf16 row per token.
func Embed(e *Env, w *Work, tokens int) {
	w.Add(e, Kernel{Bytes: float64(tokens) * float64(e.Model.Hidden) * actBytes, Class: ClassMemory})
}

// LMHead adds the bf16 LM head (vocab-parallel, so sharded) over the
// positions that need logits. Nothing for 0 positions: the head is skipped.
func LMHead(e *Env, w *Work, positions int) {
	if positions == 0 {
		return
	}
	linear(e, w, float64(e.Model.Hidden), float64(e.Model.Vocab), float64(positions), true, bf16)
}

// CopySeconds is the time of one block-copy transfer of bytes (a run of
// blocks the worker moves with one cudaMemcpyAsync): HW.CopyLatency, the
// call's fixed cost, plus the bytes over PCIe when the transfer crosses host
// and device (or stays on the host), or a device-memory read plus write when
// both ends are on the device. The bytes cost nothing over PCIe when the
// hardware has no PCIe figure. Splitting a transfer in two costs one more
// latency, so callers group what the worker would move at once.
func (e *Env) CopySeconds(bytes float64, device2device bool) float64 {
	s := e.HW.CopyLatency
	switch {
	case device2device:
		s += 2 * bytes / e.HW.MemBandwidth
	case e.HW.PCIeBW > 0:
		s += bytes / e.HW.PCIeBW
	}
	return s
}
