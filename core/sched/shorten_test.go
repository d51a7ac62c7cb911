package sched

import (
	"testing"

	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
)

// TestShorten: a stop condition lowers a request's output length before the
// Complete of the step that generated its last token, which then finishes
// it; a longer length, or an unknown id, changes nothing.
func TestShorten(t *testing.T) {
	s, err := New(Config{MaxBatchSize: 4, MaxResident: 8, MaxNumTokens: 256, MaxSeqLen: 1024, MaxSeqTokens: 2048,
		ChunkedPrefill: true, TokensPerBlock: 16, Policy: MaxUtilization})
	if err != nil {
		t.Fatal(err)
	}
	c := &grantAll{}
	s.Add(Request{ID: 1, Prompt: 8, MaxNew: 100})
	s.Add(Request{ID: 2, Prompt: 8, MaxNew: 100})
	s.Shorten(9, 1) // unknown: nothing
	step := 0
	done := map[kvcache.SeqID]int{}
	for st := s.Schedule(c); len(st.Items) > 0; st = s.Schedule(c) {
		step++
		for _, it := range st.Items {
			if it.ID == 1 && step == 3 {
				s.Shorten(1, 200) // longer: nothing
				s.Shorten(1, 3)   // this step's token is its third
			}
			if s.Complete(it.ID, it.Tokens, 1) {
				done[it.ID] = step
			}
		}
		if step > 200 {
			t.Fatal("no end")
		}
	}
	if done[1] != 3 || done[2] != 100 {
		t.Errorf("finished at steps %v, want request 1 at 3 (shortened to 3 tokens), 2 at 100", done)
	}
}
