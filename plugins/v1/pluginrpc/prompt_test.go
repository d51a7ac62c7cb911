package pluginrpc

import (
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
	"github.com/kvx-dev/kvx/plugins/v1/worker"
)

// TestPromptLogprobsConvert: Item.PromptLogprobs, PromptTopLogprobs and
// Next, and Result.Prompt (FeaturePromptLogprobs) survive the wire; a
// Result whose prompt columns disagree is refused naming the column.
func TestPromptLogprobsConvert(t *testing.T) {
	b := worker.Batch{Items: []worker.Item{
		{Seq: 1, Tokens: []int32{1, 2}},
		{Seq: 2, Tokens: []int32{3, 4, 5}, PromptLogprobs: true, PromptTopLogprobs: 2, Next: 7},
	}}
	got, err := fromProtoBatch(toProtoBatch(&b))
	if err != nil {
		t.Fatal(err)
	}
	for i := range b.Items {
		w, g := b.Items[i], got.Items[i]
		if g.PromptLogprobs != w.PromptLogprobs || g.PromptTopLogprobs != w.PromptTopLogprobs || g.Next != w.Next {
			t.Errorf("item %d: got %+v, want %+v", i, g, w)
		}
	}
	for _, r := range []worker.Result{
		{Prompt: []worker.PromptLogprobs{{Seq: 3, Logprobs: []float64{-1, -2}}, {Seq: 4, Logprobs: []float64{}}}},
		{Outputs: []worker.Output{{Seq: 2, Tokens: []int32{5}}}, Prompt: []worker.PromptLogprobs{
			{Seq: 2, Logprobs: []float64{-0.5, -3}, TopLogprobs: [][]worker.TokenLogprob{{{ID: 4, Logprob: -0.5}}, {{ID: 1, Logprob: -0.1}, {ID: 5, Logprob: -3}}}},
			{Seq: 9, Logprobs: []float64{-4}, TopLogprobs: [][]worker.TokenLogprob{{}}},
		}},
	} {
		got, err := fromProtoResult(toProtoResult(&r))
		if err != nil {
			t.Fatalf("%+v: %v", r, err)
		}
		for i := range r.Prompt {
			w, g := r.Prompt[i], got.Prompt[i]
			if g.Seq != w.Seq || !reflect.DeepEqual(append([]float64{}, g.Logprobs...), append([]float64{}, w.Logprobs...)) ||
				len(g.TopLogprobs) != len(w.TopLogprobs) {
				t.Errorf("prompt %d: got %+v, want %+v", i, g, w)
			}
			for j := range w.TopLogprobs {
				if len(g.TopLogprobs[j]) != len(w.TopLogprobs[j]) || len(w.TopLogprobs[j]) > 0 && !reflect.DeepEqual(g.TopLogprobs[j], w.TopLogprobs[j]) {
					t.Errorf("prompt %d row %d: got %v, want %v", i, j, g.TopLogprobs[j], w.TopLogprobs[j])
				}
			}
		}
	}
	r := worker.Result{Prompt: []worker.PromptLogprobs{{Seq: 3, Logprobs: []float64{-1, -2}}}}
	for name, bad := range map[string]func(){
		"prompt_len": func() {},
	} {
		p := toProtoResult(&r)
		bad()
		p.PromptLen[0] = 5
		if _, err := fromProtoResult(p); err == nil || !strings.Contains(err.Error(), name) {
			t.Errorf("prompt_len beyond the values: error %v, want one naming %s", err, name)
		}
	}
	p := toProtoResult(&r)
	p.PromptTopN = []int64{1}
	if _, err := fromProtoResult(p); err == nil || !strings.Contains(err.Error(), "prompt_top_n") {
		t.Errorf("prompt_top_n for 1 of 2 rows: error %v, want one naming prompt_top_n", err)
	}
}

// TestPromptLogprobsRefusedWithoutFeature: a worker plugin without
// FeaturePromptLogprobs would return no prompt rows: the client refuses a
// batch whose items ask, as a request-scoped error naming those items and
// the feature, and forwards the others.
func TestPromptLogprobsRefusedWithoutFeature(t *testing.T) {
	c := &WorkerClient{fam: &family{negotiated: true, agreed: []Feature{FeatureTopLogprobs, FeatureSampling}}}
	err := c.unsupported(&worker.Batch{Items: []worker.Item{
		{Seq: 1, Tokens: []int32{1}},
		{Seq: 2, Tokens: []int32{1, 2}, PromptLogprobs: true},
	}})
	var ke *kvcache.Error
	if !errors.As(err, &ke) || !reflect.DeepEqual(ke.Seqs, []kvcache.SeqID{2}) || !strings.Contains(err.Error(), string(FeaturePromptLogprobs)) {
		t.Errorf("an item asking without %s: error %v, want an item error for seq 2 naming the feature", FeaturePromptLogprobs, err)
	}
	if err := c.unsupported(&worker.Batch{Items: []worker.Item{{Seq: 1, Tokens: []int32{1}, Sample: true}}}); err != nil {
		t.Errorf("an item not asking: %v, want none", err)
	}
	c.fam.agreed = append(c.fam.agreed, FeaturePromptLogprobs)
	if err := c.unsupported(&worker.Batch{Items: []worker.Item{{Seq: 2, Tokens: []int32{1, 2}, PromptLogprobs: true}}}); err != nil {
		t.Errorf("with %s: %v, want none", FeaturePromptLogprobs, err)
	}
}
