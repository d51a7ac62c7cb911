package hftest

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
)

// Prompt is one line of a golden prompts.jsonl.
type Prompt struct {
	PromptIDs []int32 `json:"prompt_ids"`
	MaxTokens int     `json:"max_tokens"`
}

// Expected is one entry of a golden expected.json, in prompt order:
// transformers' greedy tokens and, per step, its top logprobs as
// [id, logprob] pairs, most probable first.
type Expected struct {
	OutputIDs   []int32        `json:"output_ids"`
	TopLogprobs [][][2]float64 `json:"top_logprobs"`
}

// ReadGolden reads dir/prompts.jsonl and dir/expected.json. Errors name
// the file and the line.
func ReadGolden(dir string) ([]Prompt, []Expected, error) {
	data, err := os.ReadFile(filepath.Join(dir, "prompts.jsonl"))
	if err != nil {
		return nil, nil, err
	}
	var ps []Prompt
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(nil, 1<<24)
	for line := 1; sc.Scan(); line++ {
		if len(bytes.TrimSpace(sc.Bytes())) == 0 {
			continue
		}
		var p Prompt
		if err := json.Unmarshal(sc.Bytes(), &p); err != nil {
			return nil, nil, fmt.Errorf("%s/prompts.jsonl line %d: %w", dir, line, err)
		}
		if len(p.PromptIDs) == 0 || p.MaxTokens < 1 {
			return nil, nil, fmt.Errorf("%s/prompts.jsonl line %d: %d prompt ids, max_tokens %d: want >= 1 each", dir, line, len(p.PromptIDs), p.MaxTokens)
		}
		ps = append(ps, p)
	}
	data, err = os.ReadFile(filepath.Join(dir, "expected.json"))
	if err != nil {
		return nil, nil, err
	}
	var es []Expected
	if err := json.Unmarshal(data, &es); err != nil {
		return nil, nil, fmt.Errorf("%s/expected.json: %w", dir, err)
	}
	if len(es) != len(ps) {
		return nil, nil, fmt.Errorf("%s: %d prompts, %d expected outputs", dir, len(ps), len(es))
	}
	return ps, es, nil
}

// LogSoftmax returns log-softmax of float32 logits, in float64.
func LogSoftmax(logits []float32) []float64 {
	mx := math.Inf(-1)
	for _, v := range logits {
		mx = math.Max(mx, float64(v))
	}
	z := 0.0
	for _, v := range logits {
		z += math.Exp(float64(v) - mx)
	}
	lz := math.Log(z)
	out := make([]float64, len(logits))
	for i, v := range logits {
		out[i] = float64(v) - mx - lz
	}
	return out
}

// TopK returns the k most probable ids of lp, most probable first (the
// lowest id among equals).
func TopK(lp []float64, k int) []int32 {
	ids := make([]int32, len(lp))
	for i := range ids {
		ids[i] = int32(i)
	}
	slices.SortStableFunc(ids, func(a, b int32) int {
		switch {
		case lp[a] > lp[b]:
			return -1
		case lp[a] < lp[b]:
			return 1
		}
		return 0
	})
	return ids[:min(k, len(ids))]
}

// Comparison is one prompt's outcome under vLLM's model-test rule
// (check_logprobs_close): tokens equal, or at the first difference each
// side's token is in the other's top-k, and comparison stops there.
type Comparison struct {
	Exact      bool    // every expected token matched
	DivergedAt int     // step of the first difference; -1 when none
	OK         bool    // the rule holds
	Reason     string  // why not, when !OK
	MaxLPDiff  float64 // largest |logprob difference| over the compared steps' expected top-k ids
	Worst      string  // where MaxLPDiff is
	Steps      int     // steps compared
}

// Compare applies the rule to transformers' exp and kvx's tokens got with
// got's full log-softmax per step (lps[i] for got[i]), with top-k k (5),
// and measures the logprob differences on the expected top-k ids of every
// compared step (up to and including the first difference, whose context
// is still shared).
func Compare(exp Expected, got []int32, lps [][]float64, k int) Comparison {
	c := Comparison{DivergedAt: -1, OK: true}
	n := min(len(exp.OutputIDs), len(got))
	if len(got) < len(exp.OutputIDs) {
		c.OK, c.Reason = false, fmt.Sprintf("%d tokens, transformers %d", len(got), len(exp.OutputIDs))
	}
	for i := range n {
		c.Steps++
		if i < len(exp.TopLogprobs) && i < len(lps) {
			for _, p := range exp.TopLogprobs[i] {
				id := int(p[0])
				if id < 0 || id >= len(lps[i]) {
					c.OK, c.Reason = false, fmt.Sprintf("step %d: expected top id %d outside the vocabulary %d", i, id, len(lps[i]))
					return c
				}
				if d := math.Abs(lps[i][id] - p[1]); d > c.MaxLPDiff {
					c.MaxLPDiff = d
					c.Worst = fmt.Sprintf("step %d id %d: %.6f, transformers %.6f", i, id, lps[i][id], p[1])
				}
			}
		}
		if got[i] == exp.OutputIDs[i] {
			continue
		}
		c.DivergedAt = i
		var expTop []int32
		if i < len(exp.TopLogprobs) {
			for _, p := range exp.TopLogprobs[i] {
				expTop = append(expTop, int32(p[0]))
			}
		}
		var gotTop []int32
		if i < len(lps) {
			gotTop = TopK(lps[i], k)
		}
		if !slices.Contains(expTop[:min(k, len(expTop))], got[i]) || !slices.Contains(gotTop, exp.OutputIDs[i]) {
			c.OK = false
			c.Reason = fmt.Sprintf("step %d: token %d (kvx top-%d %v), transformers %d (top-%d %v): not in each other's top-%d",
				i, got[i], k, gotTop, exp.OutputIDs[i], k, expTop, k)
		}
		return c
	}
	c.Exact = c.OK && n == len(exp.OutputIDs)
	return c
}
