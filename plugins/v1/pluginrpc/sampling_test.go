package pluginrpc

import (
	"errors"
	"strings"
	"testing"

	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
	"github.com/kvx-dev/kvx/plugins/v1/worker"
)

// TestSamplingConvert: Item.Sampling and Item.Logprobs (FeatureSampling)
// survive the Batch's columns, nil Samplings among set ones included, and
// Output.Logprobs survives the Result's.
func TestSamplingConvert(t *testing.T) {
	full := &worker.Sampling{Temperature: 0.7, TopP: 0.9, TopK: 40, MinP: 0.05, Seed: 1<<63 + 5,
		PresencePenalty: 0.5, FrequencyPenalty: -0.25, RepetitionPenalty: 1.2, MinTokens: 3,
		StopIDs: []int32{2, 0}, Prompt: 7, Context: []int32{1, 2, 3, 4, 5}}
	for _, tc := range []struct {
		name  string
		items []worker.Item
	}{
		{"greedy", []worker.Item{{Seq: 1, Tokens: []int32{4}, Sample: true}}},
		{"one sampled", []worker.Item{{Seq: 1, Tokens: []int32{4}, Sample: true, Sampling: full, Logprobs: true}}},
		{"nil among sampled", []worker.Item{{Seq: 1, Tokens: []int32{4}, Sample: true},
			{Seq: 2, Tokens: []int32{5, 6}, Sample: true, Sampling: &worker.Sampling{Temperature: 1}},
			{Seq: 3, Tokens: []int32{7}, Sample: true, Logprobs: true}}},
		{"zero seed and temperature", []worker.Item{{Seq: 1, Tokens: []int32{4}, Sample: true, Sampling: &worker.Sampling{}}}},
	} {
		b := worker.Batch{Step: 3, Items: tc.items}
		got, err := fromProtoBatch(wire(t, toProtoBatch(&b)))
		if err != nil {
			t.Errorf("%s: fromProtoBatch: %v", tc.name, err)
			continue
		}
		if want := normalize(b); !deepEqual(got, want) {
			t.Errorf("%s: round trip = %+v, want %+v", tc.name, got.Items, want.Items)
		}
		for i := range got.Items {
			if (got.Items[i].Sampling == nil) != (tc.items[i].Sampling == nil) {
				t.Errorf("%s: item %d: Sampling nil %t, want %t", tc.name, i, got.Items[i].Sampling == nil, tc.items[i].Sampling == nil)
			}
		}
	}
	r := worker.Result{Outputs: []worker.Output{{Seq: 1, Tokens: []int32{4}}, {Seq: 2, Tokens: []int32{5, 6}, Logprobs: []float64{-0.5, 0}}}}
	got, err := fromProtoResult(wire(t, toProtoResult(&r)))
	if err != nil {
		t.Fatalf("fromProtoResult: %v", err)
	}
	if want := normalize(r); !deepEqual(got, want) {
		t.Errorf("result round trip = %+v, want %+v", got.Outputs, want.Outputs)
	}
	if _, err := fromProtoBatch(toProtoBatch(&worker.Batch{Items: []worker.Item{{Seq: 1, Tokens: []int32{1}}, {Seq: 2, Tokens: []int32{1}}}})); err != nil {
		t.Fatal(err)
	}
	bad := toProtoBatch(&worker.Batch{Items: []worker.Item{{Seq: 1, Tokens: []int32{1}, Sampling: full}, {Seq: 2, Tokens: []int32{1}}}})
	bad.Sampling = bad.Sampling[:1]
	if _, err := fromProtoBatch(bad); err == nil || !strings.Contains(err.Error(), "sampling") {
		t.Errorf("a sampling column of 1 for 2 items: error %v, want one naming the column", err)
	}
}

// TestSamplingRefusedWithoutFeature: a worker plugin that did not agree on
// FeatureSampling gets no sampled item and no logprobs request (it would
// answer greedily, without logprobs): the client refuses the batch with
// KindUnsupported naming the feature, and still forwards greedy ones.
func TestSamplingRefusedWithoutFeature(t *testing.T) {
	c := &WorkerClient{fam: &family{negotiated: true, agreed: []Feature{FeatureTopLogprobs}}}
	for _, it := range []worker.Item{
		{Seq: 1, Tokens: []int32{1}, Sample: true, Sampling: &worker.Sampling{Temperature: 0.5, Seed: 9}},
		{Seq: 2, Tokens: []int32{1}, Sample: true, Logprobs: true},
	} {
		err := c.unsupported(&worker.Batch{Items: []worker.Item{it}})
		if !errors.Is(err, kvcache.ErrUnsupported) || !strings.Contains(err.Error(), string(FeatureSampling)) {
			t.Errorf("item %+v without %s: error %v, want KindUnsupported naming the feature", it, FeatureSampling, err)
		}
	}
	if err := c.unsupported(&worker.Batch{Items: []worker.Item{{Seq: 1, Tokens: []int32{1}, Sample: true, TopLogprobs: 2}}}); err != nil {
		t.Errorf("a greedy item: %v, want none", err)
	}
	c.fam.agreed = append(c.fam.agreed, FeatureSampling)
	if err := c.unsupported(&worker.Batch{Items: []worker.Item{{Seq: 1, Tokens: []int32{1}, Sampling: &worker.Sampling{Temperature: 1}}}}); err != nil {
		t.Errorf("with %s: %v, want none", FeatureSampling, err)
	}
}
