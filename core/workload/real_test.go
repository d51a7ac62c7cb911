package workload

import (
	"bufio"
	"encoding/json"
	"math"
	"os"
	"slices"
	"strconv"
	"testing"
)

func openRealTrace(tb testing.TB) {
	tb.Helper()
	if testing.Short() {
		tb.Skip("loads the 575 MB real trace")
	}
	if _, err := os.Stat(realTrace); err != nil {
		tb.Skipf("real trace not available: %v", err)
	}
}

// idChainHits is the infinite-cache hit count computed from the trace's
// hash ids alone (no tokens): a full block hits when the chain of hash ids
// up to it appeared in an earlier request.
func idChainHits(tb testing.TB) (hitBlocks, fullBlocks, input int64) {
	f, err := os.Open(realTrace)
	if err != nil {
		tb.Fatal(err)
	}
	defer f.Close()
	seen := map[string]bool{}
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var l struct {
			InputLength int   `json:"input_length"`
			HashIDs     []int `json:"hash_ids"`
		}
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			tb.Fatal(err)
		}
		input += int64(l.InputLength)
		var key []byte
		var mine []string
		for k := 0; k < l.InputLength/512; k++ {
			key = strconv.AppendInt(append(key, ','), int64(l.HashIDs[k]), 10)
			fullBlocks++
			if seen[string(key)] {
				hitBlocks++
			}
			mine = append(mine, string(key))
		}
		for _, k := range mine {
			seen[k] = true
		}
	}
	return hitBlocks, fullBlocks, input
}

// The published conversation trace: every request loads with its exact
// length, and its infinite-cache prefix hit ratio, computed by hashing the
// synthesized tokens, is DESIGN.md's 37.4% and equals the ratio computed
// from the hash ids alone.
func TestRealTraceHitRatio(t *testing.T) {
	openRealTrace(t)
	reqs, err := LoadMooncake(realTrace, MooncakeOptions{Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	st := Analyze(reqs, 512)
	hits, full, input := idChainHits(t)
	if st.Requests != 12031 || st.InputTokens != input || st.FullBlocks != full {
		t.Errorf("Analyze = %d requests, %d input tokens, %d full blocks; the file has 12031, %d, %d", st.Requests, st.InputTokens, st.FullBlocks, input, full)
	}
	if st.HitBlocks != hits {
		t.Errorf("hit blocks from token hashing = %d, from hash id chains = %d", st.HitBlocks, hits)
	}
	if r := st.HitRatio(); math.Abs(r-0.374) > 0.005 {
		t.Errorf("HitRatio() = %.4f, want 0.374 ± 0.005 (DESIGN.md)", r)
	}
	// Prompts that are prefixes of others share their arrays.
	arrays := map[*int32]int{}
	for _, r := range reqs {
		arrays[&r.Prompt[0]] = max(arrays[&r.Prompt[0]], len(r.Prompt))
	}
	var held int64
	for _, n := range arrays {
		held += int64(n)
	}
	if held >= st.InputTokens || len(arrays) >= len(reqs) {
		t.Errorf("%d arrays hold %d tokens for %d prompts of %d tokens: no sharing", len(arrays), held, len(reqs), st.InputTokens)
	}
	t.Logf("%d requests, %d input tokens, hit ratio %.4f; %d arrays, %d tokens (%.0f MB)",
		st.Requests, st.InputTokens, st.HitRatio(), len(arrays), held, float64(held)*4/1e6)
}

func TestRealTraceLimitIsPrefix(t *testing.T) {
	openRealTrace(t)
	all, err := LoadMooncake(realTrace, MooncakeOptions{Limit: 300, Seed: 9})
	if err != nil {
		t.Fatal(err)
	}
	some, err := LoadMooncake(realTrace, MooncakeOptions{Limit: 100, Seed: 9})
	if err != nil {
		t.Fatal(err)
	}
	if len(all) != 300 || len(some) != 100 {
		t.Fatalf("Limit 300, 100: got %d, %d requests", len(all), len(some))
	}
	for i := range some {
		if !slices.Equal(some[i].Prompt, all[i].Prompt) || some[i].Arrival != all[i].Arrival {
			t.Fatalf("request %d differs between Limit 100 and Limit 300", i)
		}
	}
}
