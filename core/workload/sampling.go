package workload

import (
	"math"

	"github.com/kvx-dev/kvx/plugins/v1/worker"
)

// SamplingFields are the sampling and stop fields of an OpenAI or vLLM
// request body, and of a kvx generate prompts line, as JSON gives them (nil
// when absent). Decoding checks them.
type SamplingFields struct {
	Temperature       *float64 `json:"temperature"`
	TopP              *float64 `json:"top_p"`
	TopK              *int64   `json:"top_k"`
	MinP              *float64 `json:"min_p"`
	Seed              *int64   `json:"seed"`
	PresencePenalty   *float64 `json:"presence_penalty"`
	FrequencyPenalty  *float64 `json:"frequency_penalty"`
	RepetitionPenalty *float64 `json:"repetition_penalty"`
	StopTokenIDs      []int64  `json:"stop_token_ids"`
	IgnoreEOS         *bool    `json:"ignore_eos"`
	MinTokens         *int64   `json:"min_tokens"`
}

// The ranges of the sampling fields: OpenAI's for temperature and the
// presence and frequency penalties, vLLM's for the others.
const (
	MaxTemperature       = 2.0
	MaxRepetitionPenalty = 2.0
	MaxPenalty           = 2.0 // presence_penalty and frequency_penalty are in [-MaxPenalty, MaxPenalty]
	MaxTopK              = 1 << 20
)

// Decoding checks f and returns the request's decoding: its sampling
// (nil when greedy with no penalty), and its stop ids, eos (the model's
// end-of-sequence ids, unless ignore_eos) then stop_token_ids. maxTokens
// bounds min_tokens; randomSeed gives the seed of a sampled request without
// one (vLLM draws one too). A field out of range is an *OptionError naming
// it, its value and the range.
func (f *SamplingFields) Decoding(vocab, maxTokens int, eos []int32, randomSeed func() uint64) (Decoding, error) {
	var d Decoding
	s := worker.Sampling{}
	type num struct {
		name     string
		v        *float64
		min, max float64
		openMin  bool // min itself is out
		dst      *float64
	}
	for _, n := range []num{
		{"temperature", f.Temperature, 0, MaxTemperature, false, &s.Temperature},
		{"top_p", f.TopP, 0, 1, true, &s.TopP},
		{"min_p", f.MinP, 0, 1, false, &s.MinP},
		{"presence_penalty", f.PresencePenalty, -MaxPenalty, MaxPenalty, false, &s.PresencePenalty},
		{"frequency_penalty", f.FrequencyPenalty, -MaxPenalty, MaxPenalty, false, &s.FrequencyPenalty},
		{"repetition_penalty", f.RepetitionPenalty, 0, MaxRepetitionPenalty, true, &s.RepetitionPenalty},
	} {
		if n.v == nil {
			continue
		}
		v := *n.v
		if math.IsNaN(v) || v < n.min || v > n.max || n.openMin && v == n.min {
			lo := "["
			if n.openMin {
				lo = "("
			}
			return Decoding{}, optErr(n.name, v, "must be in %s%g, %g]", lo, n.min, n.max)
		}
		*n.dst = v
	}
	if f.TopK != nil {
		k := *f.TopK
		if k < -1 || k > MaxTopK {
			return Decoding{}, optErr("top_k", k, "must be -1 or 0 (every token) or in [1, %d]", MaxTopK)
		}
		s.TopK = int(max(k, 0))
	}
	if f.Seed != nil {
		s.Seed = uint64(*f.Seed)
	}
	if f.MinTokens != nil {
		m := *f.MinTokens
		if m < 0 || m > int64(maxTokens) {
			return Decoding{}, optErr("min_tokens", m, "must be in [0, %d] (max_tokens)", maxTokens)
		}
		d.MinTokens = int(m)
	}
	if f.IgnoreEOS == nil || !*f.IgnoreEOS {
		d.StopIDs = append(d.StopIDs, eos...)
	}
	for i, id := range f.StopTokenIDs {
		if id < 0 || id >= int64(vocab) {
			return Decoding{}, optErr("stop_token_ids", id, "stop_token_ids[%d] is outside the vocabulary [0, %d)", i, vocab)
		}
		d.StopIDs = append(d.StopIDs, int32(id))
	}
	if s.Temperature > 0 || s.Penalized() {
		if f.Seed == nil && s.Temperature > 0 {
			s.Seed = randomSeed()
		}
		d.Sampling = &s
	}
	return d, nil
}
