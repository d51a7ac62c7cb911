package workload

import (
	"errors"
	"runtime"
	"strings"
	"testing"
)

// hugeTrace has three lines of 2·10⁹ prompt tokens among two short ones.
const hugeTrace = `{"timestamp": 0, "input_length": 2000000000, "output_length": 10, "hash_ids": [1, 2, 3]}
{"timestamp": 1, "input_length": 1000, "output_length": 10, "hash_ids": [1, 2]}
{"timestamp": 2, "input_length": 2000000000, "output_length": 10, "hash_ids": [4]}
{"timestamp": 3, "input_length": 2000000000, "output_length": 1, "hash_ids": []}
{"timestamp": 4, "input_length": 600, "output_length": 10, "hash_ids": [1, 2]}
`

// allocated returns the bytes f allocates.
func allocated(f func()) uint64 {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	f()
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

// TestHugeLinesRejectedBeforeSynthesis: with max_seq_len set, lines of 2·10⁹
// tokens come back rejected (no prompt, a reason naming the line and the
// limit) and cost no token memory; the others are synthesized as usual.
func TestHugeLinesRejectedBeforeSynthesis(t *testing.T) {
	var reqs []Request
	var err error
	n := allocated(func() {
		reqs, err = ReadMooncake(strings.NewReader(hugeTrace), "huge.jsonl", MooncakeOptions{MaxSeqLen: 8192})
	})
	if err != nil {
		t.Fatal(err)
	}
	if n > 4<<20 {
		t.Errorf("ReadMooncake allocated %d bytes, want < 4 MiB", n)
	}
	if len(reqs) != 5 {
		t.Fatalf("%d requests, want 5", len(reqs))
	}
	for i, r := range reqs {
		huge := i == 0 || i == 2 || i == 3
		switch {
		case huge && (r.Prompt != nil || !strings.Contains(r.Rejected, "max_seq_len 8192") || !strings.Contains(r.Rejected, "line ")):
			t.Errorf("request %d: %d prompt tokens, rejected %q; want none and a reason", i, len(r.Prompt), r.Rejected)
		case !huge && (r.Rejected != "" || len(r.Prompt) == 0):
			t.Errorf("request %d: %d prompt tokens, rejected %q; want a prompt", i, len(r.Prompt), r.Rejected)
		}
	}
	if reqs[4].Prompt[0] != reqs[1].Prompt[0] || &reqs[4].Prompt[0] != &reqs[1].Prompt[0] {
		t.Errorf("request 4's prompt does not share request 1's backing array")
	}
}

// TestTraceMemoryBound: without max_seq_len, the prompts' total is checked
// against MaxTokens before anything is allocated.
func TestTraceMemoryBound(t *testing.T) {
	var err error
	n := allocated(func() {
		_, err = ReadMooncake(strings.NewReader(hugeTrace), "huge.jsonl", MooncakeOptions{})
	})
	var te *TraceError
	if !errors.As(err, &te) || !strings.Contains(err.Error(), "workload.limit") {
		t.Fatalf("err = %v, want a *TraceError naming workload.limit", err)
	}
	if n > 4<<20 {
		t.Errorf("ReadMooncake allocated %d bytes before failing, want < 4 MiB", n)
	}
	// The short prompts share one backing array of 1000 tokens.
	if _, err := ReadMooncake(strings.NewReader(hugeTrace), "huge.jsonl", MooncakeOptions{MaxSeqLen: 2000, MaxTokens: 999}); err == nil {
		t.Errorf("MaxTokens 999 for 1000 tokens of prompts: no error")
	}
	if _, err := ReadMooncake(strings.NewReader(hugeTrace), "huge.jsonl", MooncakeOptions{MaxSeqLen: 2000, MaxTokens: 1000}); err != nil {
		t.Errorf("MaxTokens 1000 for 1000 tokens of prompts: %v", err)
	}
}
