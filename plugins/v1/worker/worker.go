// Package worker is version 1 of the worker (attention backend) contract: the
// interface the core holds for each pipeline stage's worker, in-process or as
// a plugin over gRPC.
//
// A worker owns the KV memory of its stage and runs its layers on one device
// (sim, cpu or cuda). It learns block tables from the deltas the cache
// manager granted, writes each new token's KV where its table says, and hands
// activations to the next stage. The last stage samples tokens and MTP drafts.
//
// Calls come from one goroutine at a time. Slices passed in are owned by the
// caller and must not be retained; slices returned are owned by the caller.
package worker

import (
	"context"
	"fmt"
	"math"

	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
	"github.com/kvx-dev/kvx/plugins/v1/spec"
)

// ProtocolVersion is the contract version this package describes.
const ProtocolVersion = 1

// Info describes a worker before it is configured.
type Info struct {
	Name      string
	Version   string
	Protocols []int
	Device    string       // "sim", "cpu" or "cuda"
	Mixers    []spec.Mixer // layer mixers it can run
	// Memory of the device, when it has real memory (NVML on a GPU); 0 otherwise.
	MemoryBytes int64
	FreeBytes   int64
}

// Config tells a worker which part of which model to run.
type Config struct {
	Stage  int
	Stages int
	Model  spec.Model
	First  int // this stage runs Model.Layers[First:Last]
	Last   int
	// Backend is the attention backend the host asks for: the config's
	// attention_backend when it names a registered backend ("dsa", "mla",
	// "gqa"), which a worker for another backend refuses; "" when the config
	// gave the plugin binary's path, whose worker is then the backend.
	Backend        string
	Device         string // "sim", "cpu" or "cuda"
	Hardware       spec.Hardware
	TensorParallel int
	WeightsDtype   string // "bf16", "fp8", "fp4", "w4afp8"
	KVDtype        string // "bf16", "fp8"
	// Dtype is the compute dtype of a device with real math (dtype in the
	// config): DtypeFloat32 ("" too, from a host before the field) or
	// DtypeBF16. The sim ignores it.
	Dtype  string
	Layout kvcache.Layout
	Seed   uint64
	// Draft tokens proposed per step by the MTP head (last stage).
	DraftTokens int
	// DraftAcceptance is the probability that a draft is accepted, for
	// devices without real sampling (sim). Real devices verify drafts.
	DraftAcceptance float64
}

// The compute dtypes of Config.Dtype.
const (
	// DtypeFloat32 is the exact numerics: float32 weights and activations
	// in the cpu reference kernels' order of operations, bit for bit on
	// every device (the oracle).
	DtypeFloat32 = "float32"
	// DtypeBF16 is the fast numerics of the cuda device: bf16 weights,
	// activations rounded to bf16 at the matmuls, float32 accumulation on
	// tensor cores; deterministic and batch-invariant, not the cpu's bits.
	DtypeBF16 = "bfloat16"
)

// Setup is a worker's answer to Configure.
type Setup struct {
	DeviceBytes int64 // memory it allocated for pools (0 on sim)
	Notes       []string
}

// Item is one sequence's part of a step.
type Item struct {
	Seq kvcache.SeqID
	// Pos is the sequence's history before this step: Tokens[0] sits at Pos.
	Pos int
	// Tokens are the token ids whose KV this step writes: a prefill chunk, or
	// the last sampled token followed by Draft draft tokens.
	Tokens []int32
	Draft  int
	// Sample asks the last stage to sample after the last non-draft token
	// (the final prefill chunk, and every generation step).
	Sample bool
	// Tables are the block-table changes the manager granted for this step.
	Tables []kvcache.TableDelta
	// Snapshots are the state saves the manager granted for this step: each
	// Pos is in (Pos, Pos+len(Tokens)-Draft] and the slots are in increasing
	// Pos.
	Snapshots []kvcache.SnapshotSlot
	// TopLogprobs asks the last stage of a device with real math (cpu, cuda)
	// for the TopLogprobs most likely tokens of every token it samples for
	// this item (Output.TopLogprobs); 0 asks for none, and must be >= 0.
	// Devices without real math (sim) return none.
	TopLogprobs int
	// Logits asks the last stage for the logits of this item's last sampled
	// position (Output.Logits): a row of the vocabulary's size, so the
	// engine asks only when it keeps them (kvx generate). Feature
	// item_logits; a worker without it returns them for every item.
	Logits bool
	// Logprobs asks the last stage of a device with real math for the
	// log-probability of every token it samples for this item
	// (Output.Logprobs). Devices without real math (sim) return none.
	Logprobs bool
	// Sampling says how the last stage picks this item's tokens; nil is
	// greedy, as every item was before it (the largest logit, the lower
	// token id among equals: Ops.Argmax, bit for bit).
	Sampling *Sampling
	// PromptLogprobs asks the last stage of a device with real math for
	// the rows of this prefill item's positions (Result.Prompt, feature
	// prompt_logprobs): position Pos+i's row is the log-probability of the
	// token that follows it, Tokens[i+1], or Next for the last position
	// of a chunk that does not sample; a sampling item has no row at its
	// last position (that one samples). So a prompt prefilled in chunks,
	// each asking, gets one row per position 0..len(prompt)-2, each once.
	// Devices without real math (sim) return none.
	PromptLogprobs bool
	// PromptTopLogprobs > 0 asks each of those rows for its
	// min(PromptTopLogprobs, vocab) most likely tokens too, in
	// Output.TopLogprobs' order; must be >= 0.
	PromptTopLogprobs int
	// Next is the token after Tokens (the next chunk's first prompt
	// token), read only when PromptLogprobs is set and Sample is not.
	Next int32
}

// PromptRows is the number of rows Result.Prompt has for it (0 unless it
// asks, Item.PromptLogprobs).
func (it *Item) PromptRows() int {
	switch {
	case !it.PromptLogprobs:
		return 0
	case it.Sample:
		return len(it.Tokens) - it.Draft - 1
	}
	return len(it.Tokens)
}

// PromptTarget is the token whose log-probability the item's row i gives
// (Item.PromptLogprobs): Tokens[i+1], or Next past the last token.
func (it *Item) PromptTarget(i int) int32 {
	if i+1 < len(it.Tokens) {
		return it.Tokens[i+1]
	}
	return it.Next
}

// Sampling is how the last stage picks one sequence's tokens, with vLLM's
// SamplingParams semantics. For the token at position p of the sequence
// (the position it will take: Item.Pos+r+1 after row r), in this order:
//
//  1. the logits are the position's final logits, as float64;
//  2. while fewer than MinTokens tokens follow the prompt (p-Prompt <
//     MinTokens), every id of StopIDs gets -Inf (vLLM's min_tokens);
//  3. RepetitionPenalty r != 1 divides a positive logit by r and multiplies
//     a negative one by r, for every token among the sequence's tokens
//     before p (prompt and generated); FrequencyPenalty and PresencePenalty
//     subtract f·count and pr·(count > 0), count being the token's
//     occurrences among the generated tokens before p;
//  4. Temperature 0 picks the largest of those logits (the lower id among
//     equals): greedy. Otherwise the logits are divided by Temperature and
//     turned into probabilities (softmax); MinP drops the tokens whose
//     probability is below MinP times the largest; TopK keeps the TopK
//     most likely; TopP keeps the most likely tokens whose probabilities
//     sum to at least TopP (always the first); the token is then drawn
//     from what is left, renormalized, with the uniform number
//     synth.Uniform(Seed, p), walking the tokens from the most likely (ties
//     by the lower id).
//
// So a token depends only on the position's logits, the sequence's tokens
// before it and (Seed, p): never on the batch, the chunking, a preemption
// and recompute, the manager or the process. Drafts are verified by the
// same rule: a draft is accepted when it is the token this rule picks at
// its position, so drafts change how many tokens a step keeps, never which.
type Sampling struct {
	Temperature float64 // >= 0; 0 is greedy
	TopP        float64 // in (0, 1]; 0 stands for 1 (every token)
	TopK        int     // >= 0; 0 keeps every token
	MinP        float64 // in [0, 1]
	Seed        uint64
	// PresencePenalty and FrequencyPenalty are in [-2, 2];
	// RepetitionPenalty is > 0, and 0 stands for 1 (none).
	PresencePenalty   float64
	FrequencyPenalty  float64
	RepetitionPenalty float64
	// MinTokens and StopIDs: see rule 2.
	MinTokens int
	StopIDs   []int32
	// Prompt is the length of the sequence's prompt: the tokens at
	// positions >= Prompt were generated.
	Prompt int
	// Context is the sequence's tokens at positions 0..Item.Pos-1 when a
	// penalty is set (Penalized), which rule 3 reads with Item.Tokens; nil
	// otherwise.
	Context []int32
}

// Penalized reports whether s sets a penalty, so that rule 3 needs the
// sequence's earlier tokens (Context).
func (s *Sampling) Penalized() bool {
	return s != nil && (s.PresencePenalty != 0 || s.FrequencyPenalty != 0 || s.RepetitionPenalty != 0 && s.RepetitionPenalty != 1)
}

// Greedy reports whether s picks tokens exactly as a nil Sampling does: the
// largest raw logit, with no penalty and no min_tokens mask.
func (s *Sampling) Greedy() bool {
	return s == nil || s.Temperature == 0 && !s.Penalized() && (s.MinTokens == 0 || len(s.StopIDs) == 0)
}

// Batch is one micro-batch on one stage.
type Batch struct {
	Step  uint64
	Items []Item
	// Hidden holds the previous stage's activations (nil on stage 0); opaque.
	Hidden []byte
	// Released are sequences whose tables the worker may drop before this step.
	Released []kvcache.SeqID
	// Copies run before the forward (tier moves, snapshots, copy-on-write).
	Copies []kvcache.Copy
}

// WantLogits reports whether some item of items asks for its logits
// (Item.Logits): a device that computes a step's logits at once returns
// them for every item of such a step.
func WantLogits(items []Item) bool {
	for i := range items {
		if items[i].Logits {
			return true
		}
	}
	return false
}

// Output is what the last stage produced for one item that asked to sample.
type Output struct {
	Seq kvcache.SeqID
	// Tokens are the accepted drafts followed by one sampled token, so
	// len(Tokens)-1 drafts were accepted.
	Tokens []int32
	// Drafts are the MTP head's proposals for the next step.
	Drafts []int32
	// Logits of the last sampled position, on devices with real math (cpu,
	// cuda) when the item asked for them (Item.Logits); nil on sim.
	Logits []float32
	// TopLogprobs has, when the item asked for them (Item.TopLogprobs = K >
	// 0) on a device with real math, one list per token of Tokens, in
	// order: the min(K, vocab) most likely tokens of the position that
	// produced that token (an accepted draft's own verifying position, then
	// the last sampled one), by the log-softmax of its final logits
	// computed in float64, most likely first, ties broken by the lower
	// token id as greedy sampling breaks them; so a list's first entry is
	// the token sampled there. nil otherwise.
	TopLogprobs [][]TokenLogprob
	// Logprobs has, when the item asked for them (Item.Logprobs) on a
	// device with real math, the log-probability of every token of Tokens
	// by the same float64 log-softmax of the raw logits as TopLogprobs
	// (before penalties, temperature and truncation: vLLM's raw logprobs),
	// whether it was sampled or greedy. nil otherwise.
	Logprobs []float64
}

// TokenLogprob is one candidate token of a sampled position and its
// log-probability (natural log, <= 0).
type TokenLogprob struct {
	ID      int32
	Logprob float64
}

// PromptLogprobs is one item's prompt rows (Item.PromptLogprobs): row i
// is position Pos+i's, by the same float64 log-softmax of the raw final
// logits as Output.Logprobs and Output.TopLogprobs.
type PromptLogprobs struct {
	Seq kvcache.SeqID
	// Logprobs[i] is the log-probability of Item.PromptTarget(i) at
	// position Pos+i; len is Item.PromptRows.
	Logprobs []float64
	// TopLogprobs has, when the item asked (PromptTopLogprobs = K > 0),
	// one list per row: the min(K, vocab) most likely tokens there, as
	// Output.TopLogprobs lists them. nil otherwise.
	TopLogprobs [][]TokenLogprob
}

// Result is one stage's answer to Forward.
type Result struct {
	Hidden  []byte   // for the next stage; nil on the last stage
	Outputs []Output // last stage only, in the order of the items that sampled
	// Prompt is, on the last stage of a device with real math, the rows of
	// every item that asked for them (Item.PromptLogprobs), in item order.
	Prompt []PromptLogprobs
	// Nanos is the device time of this forward: modelled on sim, measured on
	// real devices.
	Nanos    int64
	Modelled bool
}

// Worker is one pipeline stage's worker.
//
// Errors: ErrUnavailable (kvcache.ErrUnavailable) when the plugin is gone; a
// per-item problem is a *kvcache.Error with Seqs set.
type Worker interface {
	Info(ctx context.Context) (Info, error)
	Configure(ctx context.Context, cfg Config) (Setup, error)
	Forward(ctx context.Context, b Batch) (Result, error)
	CopyBlocks(ctx context.Context, copies []kvcache.Copy) error
	Health(ctx context.Context) error
}

// Check says which field of s breaks its range, for an item at pos (nil
// when none does): Temperature >= 0, TopP and MinP in [0, 1], TopK >= 0,
// PresencePenalty and FrequencyPenalty in [-2, 2], RepetitionPenalty >= 0,
// every value finite, MinTokens >= 0, Prompt in [0, pos+tokens] (an
// item's sampled tokens follow the prompt; tokens is len(Item.Tokens)), and
// Context holding exactly pos tokens when Penalized. A nil s is greedy and
// always valid.
func (s *Sampling) Check(pos, tokens int) error {
	if s == nil {
		return nil
	}
	finite := func(x float64) bool { return !math.IsNaN(x) && !math.IsInf(x, 0) }
	for _, f := range []struct {
		name     string
		v        float64
		min, max float64
	}{
		{"temperature", s.Temperature, 0, math.MaxFloat64},
		{"top_p", s.TopP, 0, 1},
		{"min_p", s.MinP, 0, 1},
		{"presence_penalty", s.PresencePenalty, -2, 2},
		{"frequency_penalty", s.FrequencyPenalty, -2, 2},
		{"repetition_penalty", s.RepetitionPenalty, 0, math.MaxFloat64},
	} {
		if !finite(f.v) || f.v < f.min || f.v > f.max {
			if f.max == math.MaxFloat64 {
				return fmt.Errorf("sampling %s %v: must be a finite number >= %g", f.name, f.v, f.min)
			}
			return fmt.Errorf("sampling %s %v: must be in [%g, %g]", f.name, f.v, f.min, f.max)
		}
	}
	switch {
	case s.TopK < 0:
		return fmt.Errorf("sampling top_k %d: must be >= 0 (0 keeps every token)", s.TopK)
	case s.MinTokens < 0:
		return fmt.Errorf("sampling min_tokens %d: must be >= 0", s.MinTokens)
	case s.Prompt < 0 || s.Prompt > pos+tokens:
		return fmt.Errorf("sampling prompt %d: must be in [0, %d] (the item's pos + tokens)", s.Prompt, pos+tokens)
	case s.Penalized() && len(s.Context) != pos:
		return fmt.Errorf("sampling context has %d tokens: a penalized item at pos %d needs its %d earlier tokens", len(s.Context), pos, pos)
	}
	return nil
}
