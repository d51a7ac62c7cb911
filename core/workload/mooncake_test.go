package workload

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"slices"
	"strings"
	"testing"

	"pgregory.net/rapid"
)

const realTrace = "../../../shared/traces/mooncake_conversation.jsonl"

func line(ts float64, in, out int, ids ...int) string {
	b, _ := json.Marshal(map[string]any{"timestamp": ts, "input_length": in, "output_length": out, "hash_ids": ids})
	return string(b)
}

func read(t *testing.T, trace string, opt MooncakeOptions) []Request {
	t.Helper()
	reqs, err := ReadMooncake(strings.NewReader(trace), "test.jsonl", opt)
	if err != nil {
		t.Fatalf("ReadMooncake: %v", err)
	}
	return reqs
}

// block returns tokens [k*bt, (k+1)*bt) of p, clipped to len(p).
func block(p []int32, k, bt int) []int32 { return p[min(k*bt, len(p)):min((k+1)*bt, len(p))] }

func TestReadMooncakeFields(t *testing.T) {
	trace := strings.Join([]string{
		line(0, 1000, 7, 1, 2),
		"",
		"   ",
		line(1500, 512, 1, 3),
		`{"timestamp": 2000.5, "input_length": 1, "output_length": 3, "hash_ids": [9], "extra": {"x": [1, "a"]}}`,
	}, "\n") + "\n"
	reqs := read(t, trace, MooncakeOptions{TimeScale: 2, Vocab: 1000})
	want := []struct {
		arrival int64
		in, out int
	}{{0, 1000, 7}, {750_000_000, 512, 1}, {1_000_250_000, 1, 3}}
	if len(reqs) != len(want) {
		t.Fatalf("ReadMooncake returned %d requests, want %d", len(reqs), len(want))
	}
	for i, w := range want {
		r := reqs[i]
		if r.ID != uint64(i) || r.Arrival != w.arrival || len(r.Prompt) != w.in || cap(r.Prompt) != w.in || r.OutputLen != w.out || r.Group != "" {
			t.Errorf("request %d = {ID %d, Arrival %d, len %d, cap %d, OutputLen %d, Group %q}, want {%d, %d, %d, %d, %d, \"\"}",
				i, r.ID, r.Arrival, len(r.Prompt), cap(r.Prompt), r.OutputLen, r.Group, i, w.arrival, w.in, w.in, w.out)
		}
		for j, tok := range r.Prompt {
			if tok < 0 || tok >= 1000 {
				t.Fatalf("request %d token %d = %d, want in [0, 1000)", i, j, tok)
			}
		}
	}
	if reqs := read(t, trace, MooncakeOptions{Limit: 2}); len(reqs) != 2 || reqs[1].Arrival != 1_500_000_000 {
		t.Errorf("Limit 2: got %d requests, want 2 with the second at 1.5 s", len(reqs))
	}
}

// Equal hash ids give equal blocks wherever they appear; different ids give
// different blocks; a truncated last block is the start of the full one;
// padding beyond the hash ids is unique per line.
func TestReadMooncakeBlocks(t *testing.T) {
	const bt = 512
	trace := strings.Join([]string{
		line(0, 3*bt, 1, 1, 2, 3),
		line(1, 2*bt+100, 1, 4, 2, 5), // id 2 at the same position, 5 truncated
		line(2, 3*bt, 1, 5, 6, 7),     // id 5 full, at another position
		line(3, bt+300, 1, 8),         // padded: 300 tokens beyond the hash ids
		line(4, bt+300, 1, 8),         // same ids, different line: different padding
	}, "\n")
	r := read(t, trace, MooncakeOptions{Seed: 3})
	eq := func(name string, a, b []int32) {
		t.Helper()
		if !slices.Equal(a, b) {
			t.Errorf("%s: blocks differ", name)
		}
	}
	eq("id 2 in requests 0 and 1", block(r[0].Prompt, 1, bt), block(r[1].Prompt, 1, bt))
	eq("truncated id 5 is the start of the full id 5", block(r[1].Prompt, 2, bt), block(r[2].Prompt, 0, bt)[:100])
	eq("id 8 in requests 3 and 4", block(r[3].Prompt, 0, bt), block(r[4].Prompt, 0, bt))
	if slices.Equal(block(r[3].Prompt, 1, bt), block(r[4].Prompt, 1, bt)) {
		t.Error("padding of lines 4 and 5 is identical, want unique per line")
	}
	var all [][]int32
	for _, k := range [][2]int{{0, 0}, {0, 1}, {0, 2}, {1, 0}, {2, 0}, {2, 1}, {2, 2}, {3, 0}} {
		all = append(all, block(r[k[0]].Prompt, k[1], bt))
	}
	for i := range all {
		for j := range i {
			if slices.Equal(all[i], all[j]) {
				t.Errorf("blocks of different hash ids (#%d and #%d) are identical", i, j)
			}
		}
	}
	// Same seed, same prompts; another seed, other prompts.
	again := read(t, trace, MooncakeOptions{Seed: 3})
	other := read(t, trace, MooncakeOptions{Seed: 4})
	for i := range r {
		if !slices.Equal(r[i].Prompt, again[i].Prompt) {
			t.Errorf("request %d: prompts differ between two reads with seed 3", i)
		}
		if slices.Equal(r[i].Prompt, other[i].Prompt) {
			t.Errorf("request %d: seeds 3 and 4 give the same prompt", i)
		}
	}
}

// A prompt whose hash ids are a prefix of another's shares its array, and
// an append to it cannot overwrite the other.
func TestReadMooncakeSharing(t *testing.T) {
	trace := line(0, 600, 1, 1, 2) + "\n" + line(1, 1500, 1, 1, 2, 3) + "\n" + line(2, 1000, 1, 1, 2)
	r := read(t, trace, MooncakeOptions{})
	if &r[0].Prompt[0] != &r[1].Prompt[0] || &r[2].Prompt[0] != &r[1].Prompt[0] {
		t.Fatal("prompts 0 and 2 are prefixes of prompt 1 but do not share its array")
	}
	before := r[1].Prompt[600]
	_ = append(r[0].Prompt, -1)
	if r[1].Prompt[600] != before {
		t.Fatal("append to prompt 0 overwrote prompt 1")
	}
}

// Every prompt equals one built naively, block by block, for random traces
// over a small id alphabet (so prefixes and sharing are frequent).
func TestReadMooncakeMatchesNaive(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		bt := rapid.IntRange(1, 8).Draw(t, "blockTokens")
		seed := rapid.Uint64().Draw(t, "seed")
		n := rapid.IntRange(1, 20).Draw(t, "requests")
		var b strings.Builder
		type spec struct {
			in  int
			ids []int
		}
		specs := make([]spec, n)
		for i := range specs {
			ids := rapid.SliceOfN(rapid.IntRange(0, 3), 0, 5).Draw(t, "ids")
			in := rapid.IntRange(1, bt*len(ids)+2*bt).Draw(t, "input_length")
			specs[i] = spec{in, ids}
			fmt.Fprintln(&b, line(float64(i), in, 1, ids...))
		}
		reqs, err := ReadMooncake(strings.NewReader(b.String()), "r", MooncakeOptions{BlockTokens: bt, Vocab: 50, Seed: seed})
		if err != nil {
			t.Fatal(err)
		}
		for i, s := range specs {
			var want []int32
			for _, id := range s.ids {
				blk := make([]int32, bt)
				fillTokens(blk, streamKey(seed, domainBlock, uint64(id)), 50)
				want = append(want, blk...)
			}
			if len(want) < s.in {
				pad := make([]int32, s.in-len(want))
				fillTokens(pad, streamKey(seed, domainPad, uint64(i+1)), 50)
				want = append(want, pad...)
			}
			want = want[:s.in]
			if !slices.Equal(reqs[i].Prompt, want) || cap(reqs[i].Prompt) != s.in {
				t.Fatalf("request %d (ids %v, input %d): prompt %v (cap %d), want %v", i, s.ids, s.in, reqs[i].Prompt, cap(reqs[i].Prompt), want)
			}
		}
	})
}

func TestReadMooncakeErrors(t *testing.T) {
	good := line(5, 10, 1, 1)
	type want struct {
		line         int
		field, value string
		problem      string
	}
	tests := []struct {
		name  string
		trace string
		want  []want
	}{
		{"empty file", "", []want{{0, "", "", "no requests"}}},
		{"blank lines only", "\n  \n\t\n", []want{{0, "", "", "no requests"}}},
		{"missing field", `{"timestamp": 0, "input_length": 10, "hash_ids": [1]}`, []want{{1, "output_length", "", "missing"}}},
		{"missing everything", `{}`, []want{
			{1, "timestamp", "", "missing"}, {1, "input_length", "", "missing"},
			{1, "output_length", "", "missing"}, {1, "hash_ids", "", "missing"}}},
		{"negative length", line(0, -3, 1, 1), []want{{1, "input_length", "-3", "must be >= 1"}}},
		{"input_length 0", line(0, 0, 1, 1), []want{{1, "input_length", "0", "must be >= 1"}}},
		{"output_length 0", line(0, 5, 0, 1), []want{{1, "output_length", "0", "must be >= 1"}}},
		{"fractional length", `{"timestamp": 0, "input_length": 10.5, "output_length": 1, "hash_ids": [1]}`,
			[]want{{1, "input_length", "10.5", "must be an integer"}}},
		{"huge length", `{"timestamp": 0, "input_length": 3000000000, "output_length": 1, "hash_ids": [1]}`,
			[]want{{1, "input_length", "3000000000", "must be <= 2147483647"}}},
		{"string length", `{"timestamp": 0, "input_length": "10", "output_length": 1, "hash_ids": [1]}`,
			[]want{{1, "input_length", `"10"`, "must be a number"}}},
		{"null timestamp", `{"timestamp": null, "input_length": 10, "output_length": 1, "hash_ids": [1]}`,
			[]want{{1, "timestamp", "null", "must be a number"}}},
		{"negative timestamp", line(-1, 10, 1, 1), []want{{1, "timestamp", "-1", "must be >= 0"}}},
		{"hash_ids not a list", `{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": 7}`,
			[]want{{1, "hash_ids", "7", "must be a list"}}},
		{"hash_ids object", `{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": {"a": 1}}`,
			[]want{{1, "hash_ids", `{"a": 1}`, "must be a list"}}},
		{"hash_ids string element", `{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [1, "x"]}`,
			[]want{{1, "hash_ids[1]", `"x"`, "must be an integer >= 0"}}},
		{"hash_ids negative element", `{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [1, 2, -4]}`,
			[]want{{1, "hash_ids[2]", "-4", "must be an integer >= 0"}}},
		{"hash_ids fractional element", `{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [1.5]}`,
			[]want{{1, "hash_ids[0]", "1.5", "must be an integer >= 0"}}},
		{"hash_ids nested list", `{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [[1]]}`,
			[]want{{1, "hash_ids[0]", "[1]", "must be an integer >= 0"}}},
		{"decreasing timestamp", line(10, 5, 1, 1) + "\n" + line(20, 5, 1, 1) + "\n\n" + line(15, 5, 1, 1),
			[]want{{4, "timestamp", "15", "earlier than line 2's"}}},
		{"timestamp overflow", line(1e13, 5, 1, 1), []want{{1, "timestamp", "10000000000000", "beyond int64 nanoseconds"}}},
		{"trailing garbage", good + ` xyz`, []want{{1, "", "", "trailing data after the JSON object: xyz"}}},
		{"two objects on a line", good + good, []want{{1, "", "", "trailing data"}}},
		{"invalid JSON", `{"timestamp": 0, "input_length": 10,`, []want{{1, "", "", "invalid JSON"}}},
		{"not an object", `[1, 2, 3]`, []want{{1, "", "", "not a JSON object"}}},
		{"errors on several lines", good + "\n\n" + line(6, 0, 1, 1) + "\n" + good + "\n" + `{"timestamp": 7}`,
			[]want{{3, "input_length", "0", "must be >= 1"}, {5, "input_length", "", "missing"},
				{5, "output_length", "", "missing"}, {5, "hash_ids", "", "missing"}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			reqs, err := ReadMooncake(strings.NewReader(tc.trace), "bad.jsonl", MooncakeOptions{})
			var te *TraceError
			if !errors.As(err, &te) {
				t.Fatalf("ReadMooncake = %d requests, %v; want a *TraceError", len(reqs), err)
			}
			if reqs != nil {
				t.Errorf("ReadMooncake returned %d requests with an error", len(reqs))
			}
			if len(te.Errs) != len(tc.want) {
				t.Fatalf("got %d errors, want %d:\n%v", len(te.Errs), len(tc.want), err)
			}
			for i, w := range tc.want {
				e := te.Errs[i]
				if e.File != "bad.jsonl" || e.Line != w.line || e.Field != w.field || e.Value != w.value || !strings.Contains(e.Problem, w.problem) {
					t.Errorf("error %d = %+v, want line %d field %q value %q problem containing %q", i, *e, w.line, w.field, w.value, w.problem)
				}
				msg := err.Error()
				loc := "bad.jsonl"
				if w.line > 0 {
					loc = fmt.Sprintf("bad.jsonl:%d: ", w.line)
				}
				if !strings.Contains(msg, loc) || !strings.Contains(msg, w.field+" = "+w.value) && w.value != "" {
					t.Errorf("message %q does not name %q and %q = %q", msg, loc, w.field, w.value)
				}
				if !errors.Is(err, e) {
					t.Errorf("errors.Is(err, Errs[%d]) = false", i)
				}
			}
		})
	}
}

func TestReadMooncakeErrorLimit(t *testing.T) {
	var b strings.Builder
	for range 50 {
		fmt.Fprintln(&b, line(0, 0, 1, 1))
	}
	_, err := ReadMooncake(strings.NewReader(b.String()), "many.jsonl", MooncakeOptions{})
	var te *TraceError
	if !errors.As(err, &te) || len(te.Errs) != MaxLineErrors || !te.Truncated {
		t.Fatalf("50 bad lines: %v; want a truncated *TraceError with %d errors", err, MaxLineErrors)
	}
	if te.Errs[MaxLineErrors-1].Line != MaxLineErrors || !strings.Contains(err.Error(), "stopped after 20") {
		t.Errorf("last error on line %d, message %q; want line %d and a note that reading stopped", te.Errs[MaxLineErrors-1].Line, err, MaxLineErrors)
	}
}

func TestMooncakeOptionErrors(t *testing.T) {
	tests := []struct {
		opt   MooncakeOptions
		field string
	}{
		{MooncakeOptions{Limit: -1}, "limit"},
		{MooncakeOptions{TimeScale: -2}, "time_scale"},
		{MooncakeOptions{TimeScale: math.NaN()}, "time_scale"},
		{MooncakeOptions{TimeScale: math.Inf(1)}, "time_scale"},
		{MooncakeOptions{BlockTokens: -512}, "hash_block_tokens"},
		{MooncakeOptions{Vocab: 1}, "vocab"},
		{MooncakeOptions{Vocab: -5}, "vocab"},
		{MooncakeOptions{Vocab: MaxVocab + 1}, "vocab"},
	}
	for _, tc := range tests {
		_, err := ReadMooncake(strings.NewReader(line(0, 5, 1, 1)), "x", tc.opt)
		var oe *OptionError
		if !errors.As(err, &oe) || oe.Field != tc.field || oe.Limit == "" || !strings.Contains(err.Error(), tc.field+" = ") {
			t.Errorf("ReadMooncake(%+v) = %v, want an *OptionError for %s", tc.opt, err, tc.field)
		}
	}
}

// The fast line parser agrees with encoding/json on every line it accepts.
func TestFastLineAgreesWithDecoder(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		parts := []string{
			`"timestamp"` + rapid.SampledFrom([]string{":", " : "}).Draw(t, "c1") + rapid.SampledFrom([]string{"0", "12", "1.5", "1e3", "-0", "01", "1.", "\"3\""}).Draw(t, "ts"),
			`"input_length":` + rapid.SampledFrom([]string{"5", "512", "0", "-1", "2.0"}).Draw(t, "in"),
			`"output_length":` + rapid.SampledFrom([]string{"1", "7", "1E2"}).Draw(t, "out"),
			`"hash_ids":` + rapid.SampledFrom([]string{"[]", "[ ]", "[1,2]", "[ 0 , 3 ]", "[01]", "[1,]", "[18446744073709551616]", "[1 2]"}).Draw(t, "ids"),
			`"other": 1`,
			`"Timestamp": 4`,
			`"hash_ids": [9]`,
		}
		k := rapid.IntRange(0, len(parts)).Draw(t, "keys")
		perm := rapid.Permutation(parts).Draw(t, "order")[:k]
		text := "{" + strings.Join(perm, ", ") + "}"
		var p parser
		var fast rawLine
		if !p.fastLine([]byte(text), &fast) {
			return
		}
		var slow rawLine
		if err := json.Unmarshal([]byte(text), &slow); err != nil {
			t.Fatalf("fastLine accepted %s, encoding/json rejects it: %v", text, err)
		}
		var ids []uint64
		if err := json.Unmarshal(slow.HashIDs, &ids); err != nil {
			t.Fatalf("fastLine accepted hash_ids of %s, encoding/json rejects them: %v", text, err)
		}
		if string(fast.Timestamp) != string(slow.Timestamp) || string(fast.InputLength) != string(slow.InputLength) ||
			string(fast.OutputLength) != string(slow.OutputLength) || !slices.Equal(p.ids, ids) {
			t.Fatalf("%s: fastLine read %s %s %s %v, encoding/json %s %s %s %v", text,
				fast.Timestamp, fast.InputLength, fast.OutputLength, p.ids, slow.Timestamp, slow.InputLength, slow.OutputLength, ids)
		}
	})
}

func TestLoadMooncakeMissingFile(t *testing.T) {
	if _, err := LoadMooncake("testdata/does-not-exist.jsonl", MooncakeOptions{}); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("LoadMooncake(missing) = %v, want os.ErrNotExist", err)
	}
}
