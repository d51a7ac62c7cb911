package workload

import (
	"errors"
	"slices"
	"strings"
	"testing"
)

func TestSamplingFields(t *testing.T) {
	f64 := func(v float64) *float64 { return &v }
	i64 := func(v int64) *int64 { return &v }
	yes := true
	seed := func() uint64 { return 99 }
	eos := []int32{2, 3}
	for _, tc := range []struct {
		name string
		f    SamplingFields
		err  string // the field at fault, and the message's text
		msg  string
	}{
		{"temperature high", SamplingFields{Temperature: f64(2.5)}, "temperature", "temperature = 2.5: must be in [0, 2]"},
		{"temperature negative", SamplingFields{Temperature: f64(-0.1)}, "temperature", "[0, 2]"},
		{"top_p zero", SamplingFields{TopP: f64(0)}, "top_p", "top_p = 0: must be in (0, 1]"},
		{"top_p high", SamplingFields{TopP: f64(1.5)}, "top_p", "(0, 1]"},
		{"min_p", SamplingFields{MinP: f64(2)}, "min_p", "[0, 1]"},
		{"presence", SamplingFields{PresencePenalty: f64(-3)}, "presence_penalty", "[-2, 2]"},
		{"frequency", SamplingFields{FrequencyPenalty: f64(2.01)}, "frequency_penalty", "[-2, 2]"},
		{"repetition zero", SamplingFields{RepetitionPenalty: f64(0)}, "repetition_penalty", "(0, 2]"},
		{"top_k", SamplingFields{TopK: i64(-2)}, "top_k", "top_k = -2: must be -1 or 0"},
		{"min_tokens", SamplingFields{MinTokens: i64(20)}, "min_tokens", "min_tokens = 20: must be in [0, 16] (max_tokens)"},
		{"stop id", SamplingFields{StopTokenIDs: []int64{5, 1000}}, "stop_token_ids", "stop_token_ids = 1000: stop_token_ids[1] is outside the vocabulary [0, 1000)"},
	} {
		_, err := tc.f.Decoding(1000, 16, eos, seed)
		var oe *OptionError
		if !errors.As(err, &oe) || oe.Field != tc.err || !strings.Contains(err.Error(), tc.msg) {
			t.Errorf("%s: error %v, want an OptionError for %s saying %q", tc.name, err, tc.err, tc.msg)
		}
	}
	d, err := (&SamplingFields{}).Decoding(1000, 16, eos, seed)
	if err != nil || d.Sampling != nil || !slices.Equal(d.StopIDs, eos) {
		t.Errorf("no fields: %+v, %v; want greedy, stopping at the EOS ids", d, err)
	}
	d, err = (&SamplingFields{Temperature: f64(0.7), TopK: i64(-1), IgnoreEOS: &yes, StopTokenIDs: []int64{7}, MinTokens: i64(3)}).Decoding(1000, 16, eos, seed)
	if err != nil || d.Sampling == nil || d.Sampling.Seed != 99 || d.Sampling.TopK != 0 || d.Sampling.Temperature != 0.7 ||
		!slices.Equal(d.StopIDs, []int32{7}) || d.MinTokens != 3 {
		t.Errorf("sampled, ignore_eos: %+v (sampling %+v), %v; want the random seed 99, top_k 0, stop ids [7], min_tokens 3", d, d.Sampling, err)
	}
	d, _ = (&SamplingFields{Temperature: f64(1), Seed: i64(-1)}).Decoding(1000, 16, nil, seed)
	if d.Sampling.Seed != 1<<64-1 {
		t.Errorf("seed -1: %d, want its two's complement", d.Sampling.Seed)
	}
	d, _ = (&SamplingFields{Temperature: f64(0), RepetitionPenalty: f64(1.3)}).Decoding(1000, 16, nil, seed)
	if d.Sampling == nil || d.Sampling.Seed != 0 || d.Sampling.RepetitionPenalty != 1.3 {
		t.Errorf("greedy with a penalty: %+v, want a Sampling with the penalty and no random seed", d.Sampling)
	}
}
