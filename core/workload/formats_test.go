package workload

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func sample(name string) string { return filepath.Join("testdata", name) }

func TestDetectFormat(t *testing.T) {
	for file, want := range map[string]string{"mooncake_sample.jsonl": FormatMooncake, "bailian_sample.jsonl": FormatBailian,
		"azure_sample.csv": FormatAzure, "burstgpt_sample.csv": FormatBurstGPT} {
		data, err := os.ReadFile(sample(file))
		if err != nil {
			t.Fatal(err)
		}
		first, _, _ := strings.Cut(string(data), "\n")
		if got, err := DetectFormat([]byte(first)); got != want || err != nil {
			t.Errorf("DetectFormat(%s) = %q, %v; want %q", file, got, err, want)
		}
	}
	for _, c := range []struct{ line, want string }{
		{`{"timestamp": 1, "input_length": 5, "output_length": 2}`, "keys [input_length output_length timestamp] is neither Mooncake's"},
		{`{"timestamp": 1, "input_length": 5, "output_length": 2, "hash_ids": [1], "session": 3}`, "is neither Mooncake's"},
		{`{"timestamp": 1,`, "is not a JSON object"},
		{`time,prompt,output`, `the first line "time,prompt,output" is not`},
		{``, "the trace is empty"},
	} {
		if got, err := DetectFormat([]byte(c.line)); err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "set workload.format (one of mooncake, azure, burstgpt, bailian)") {
			t.Errorf("DetectFormat(%q) = %q, %v; want an error containing %q that asks for workload.format", c.line, got, err, c.want)
		}
	}
}

type wantReq struct {
	arrival  int64
	in, out  int
	rejected string
}

func checkReqs(t *testing.T, name string, got []Request, want []wantReq) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d requests, want %d", name, len(got), len(want))
	}
	for i, w := range want {
		r := got[i]
		switch {
		case r.ID != uint64(i) || r.Arrival != w.arrival || r.OutputLen != w.out:
			t.Errorf("%s request %d: ID %d, Arrival %d, OutputLen %d; want %d, %d, %d", name, i, r.ID, r.Arrival, r.OutputLen, i, w.arrival, w.out)
		case w.rejected != "" && (r.Prompt != nil || !strings.Contains(r.Rejected, w.rejected)):
			t.Errorf("%s request %d: Rejected %q with %d prompt tokens, want nil and a reason containing %q", name, i, r.Rejected, len(r.Prompt), w.rejected)
		case w.rejected == "" && (r.Rejected != "" || len(r.Prompt) != w.in):
			t.Errorf("%s request %d: %d prompt tokens (rejected %q), want %d", name, i, len(r.Prompt), r.Rejected, w.in)
		}
	}
}

func TestReadTraceSamples(t *testing.T) {
	for _, c := range []struct {
		file, format string
		scale        float64
		want         []wantReq
	}{
		{"azure_sample.csv", FormatAzure, 1, []wantReq{{0, 374, 44, ""}, {4_314_579_000, 396, 109, ""}, {4_319_410_000, 879, 1, ""},
			{10_544_410_000, 91, 0, "trace line 5: GeneratedTokens 0"}, {13_350_000_000, 1022, 215, ""}}},
		{"burstgpt_sample.csv", FormatBurstGPT, 2, []wantReq{{2_500_000_000, 472, 18, ""}, {22_500_000_000, 1087, 0, "trace line 3: Response tokens 0"},
			{59_000_000_000, 417, 276, ""}, {59_250_000_000, 1360, 7, ""}, {150_500_000_000, 22, 400, ""}}},
		{"bailian_sample.jsonl", FormatBailian, 1, []wantReq{{0, 40, 12, ""}, {250_000_000, 33, 5, ""}, {1_500_000_000, 70, 20, ""}, {2_125_000_000, 16, 1, ""}}},
		{"mooncake_sample.jsonl", FormatMooncake, 1, []wantReq{{0, 1024, 10, ""}, {250_000_000, 700, 3, ""}, {900_000_000, 1500, 7, ""}}},
	} {
		var first []Request
		for _, format := range []string{"", c.format} { // detected, then named
			reqs, err := LoadTrace(sample(c.file), TraceOptions{Format: format, MooncakeOptions: MooncakeOptions{TimeScale: c.scale, Seed: 3}})
			if err != nil {
				t.Fatalf("LoadTrace(%s, format %q): %v", c.file, format, err)
			}
			checkReqs(t, c.file, reqs, c.want)
			if first == nil {
				first = reqs
			} else if !slices.EqualFunc(first, reqs, func(a, b Request) bool { return slices.Equal(a.Prompt, b.Prompt) }) {
				t.Errorf("%s: the detected and the named format give different prompts", c.file)
			}
		}
	}
}

// Without hash ids, the CSV formats' prompts share nothing.
func TestCSVPromptsUnique(t *testing.T) {
	reqs, err := LoadTrace(sample("burstgpt_sample.csv"), TraceOptions{})
	if err != nil {
		t.Fatal(err)
	}
	a, b := reqs[0].Prompt, reqs[2].Prompt
	if slices.Equal(a[:16], b[:16]) {
		t.Errorf("requests 0 and 2 share their first 16 tokens: %v", a[:16])
	}
}

// Bailian prompts share tokens exactly where their hash ids are equal, at
// the block size given (16 by default).
func TestBailianBlocks(t *testing.T) {
	for _, bt := range []int{0, 8} {
		reqs, err := LoadTrace(sample("bailian_sample.jsonl"), TraceOptions{MooncakeOptions: MooncakeOptions{BlockTokens: bt}})
		if err != nil {
			t.Fatal(err)
		}
		size := bt
		if size == 0 {
			size = BailianBlockTokens
		}
		// hash ids: r0 [1 2 3], r1 [1 4 5], r2 [1 2 6 7 8].
		p0, p1, p2 := reqs[0].Prompt, reqs[1].Prompt, reqs[2].Prompt
		for _, c := range []struct {
			name   string
			a, b   []int32
			shared int // blocks with equal ids, then one that differs
		}{{"0/1", p0, p1, 1}, {"0/2", p0, p2, 2}, {"1/2", p1, p2, 1}} {
			k := c.shared * size
			if !slices.Equal(c.a[:k], c.b[:k]) {
				t.Errorf("block %d: requests %s differ in their first %d tokens (equal hash ids)", size, c.name, k)
			}
			if e := min(k+size, len(c.a), len(c.b)); slices.Equal(c.a[k:e], c.b[k:e]) {
				t.Errorf("block %d: requests %s share tokens [%d, %d) (different hash ids)", size, c.name, k, e)
			}
		}
	}
}

func TestReadTraceBadLines(t *testing.T) {
	const az = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
	const bg = "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
	const ok = `{"chat_id": 1, "parent_chat_id": -1, "turn": 1, "timestamp": 1.5, "input_length": 20, "output_length": 2, "hash_ids": [1, 2]}`
	for _, c := range []struct {
		name, format, trace, want string
	}{
		{"azure timestamp", "", az + "2023-11-16 18:15:46.68,5,1\n16/11/2023 18:15,5,1\n", `t.csv:3: TIMESTAMP = 16/11/2023 18:15: must be a date and time like 2023-11-16 18:15:46.6805900`},
		{"azure context 0", "", az + "2023-11-16 18:15:46,0,4\n", `t.csv:2: ContextTokens = 0: must be >= 1`},
		{"azure generated", "azure", az + "2023-11-16 18:15:46,3,x\n", `t.csv:2: GeneratedTokens = x: must be an integer`},
		{"azure order", "", az + "2023-11-16 18:15:46,3,1\n2023-11-16 18:15:45.9,3,1\n", `t.csv:3: TIMESTAMP = 2023-11-16 18:15:45.9: earlier than line 2's`},
		{"azure fields", "", az + "2023-11-16 18:15:46,3\n", `t.csv:2: 2 fields, the header has 3`},
		{"azure quote", "", az + "2023-11-16 18:15:46,\"3,1\n", `t.csv:2: not a CSV line`},
		{"azure header", "azure", "TIMESTAMP,ContextTokens,Generated\n2023-11-16 18:15:46,3,1\n", `t.csv:1: GeneratedTokens: missing from the header`},
		{"burstgpt total", "", bg + "1,ChatGPT,10,5,16,API log\n", `t.csv:2: Total tokens = 16: must be Request tokens 10 + Response tokens 5 = 15`},
		{"burstgpt time", "", bg + "-1,ChatGPT,10,5,15,API log\n", `t.csv:2: Timestamp = -1: must be >= 0`},
		{"burstgpt request", "", bg + "1,ChatGPT,-3,5,2,API log\n", `t.csv:2: Request tokens = -3: must be >= 1`},
		{"burstgpt huge", "", bg + "1,ChatGPT,3000000000,5,3000000005,API log\n", `t.csv:2: Request tokens = 3000000000: must be <= 2147483647`},
		{"burstgpt header", "burstgpt", "Timestamp,Model,Request tokens,Response tokens,Total tokens\n1,a,1,1,2\n", `t.csv:1: Log Type: missing from the header`},
		{"bailian length", "", ok + "\n" + strings.Replace(ok, `"input_length": 20`, `"input_length": 0`, 1) + "\n", `t.csv:2: input_length = 0: must be >= 1`},
		{"bailian ids", "bailian", strings.Replace(ok, `[1, 2]`, `[1, -2]`, 1) + "\n", `t.csv:1: hash_ids[1] = -2: must be an integer >= 0`},
		{"bailian order", "", ok + "\n" + strings.Replace(ok, `"timestamp": 1.5`, `"timestamp": 1.25`, 1) + "\n", `t.csv:2: timestamp = 1.25: earlier than line 1's`},
		{"empty", "", "\n  \n", "the trace is empty"},
		{"csv header only", "azure", az, "no requests"},
	} {
		_, err := ReadTrace(strings.NewReader(c.trace), "t.csv", TraceOptions{Format: c.format})
		var te *TraceError
		if !errors.As(err, &te) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: ReadTrace = %v, want a *TraceError containing %q", c.name, err, c.want)
		}
	}
	for _, c := range []struct {
		opt  TraceOptions
		want string
	}{
		{TraceOptions{Format: "sharegpt"}, "workload: format = sharegpt: is not one of mooncake, azure, burstgpt, bailian"},
		{TraceOptions{Format: "azure", MooncakeOptions: MooncakeOptions{BlockTokens: 16}}, "workload: hash_block_tokens = 16: must be unset (0) for workload.format azure"},
		{TraceOptions{Format: "bailian", MooncakeOptions: MooncakeOptions{BlockTokens: -1}}, "workload: hash_block_tokens = -1: must be > 0"},
	} {
		_, err := ReadTrace(strings.NewReader(az), "t.csv", c.opt)
		var oe *OptionError
		if !errors.As(err, &oe) || err.Error() != c.want && !strings.HasPrefix(err.Error(), c.want) {
			t.Errorf("ReadTrace(%+v) = %v, want an *OptionError %q", c.opt, err, c.want)
		}
	}
}

// Lengths are checked before tokens are synthesized: max_seq_len rejects
// a line, the token budget refuses the trace, and neither allocates.
func TestTraceBounded(t *testing.T) {
	const bl = `{"chat_id": 1, "parent_chat_id": -1, "turn": 1, "timestamp": 2, "input_length": 2000000000, "output_length": 2, "hash_ids": [1]}` + "\n" +
		`{"chat_id": 2, "parent_chat_id": -1, "turn": 1, "timestamp": 3, "input_length": 20, "output_length": 2, "hash_ids": [1, 2]}` + "\n"
	reqs, err := ReadTrace(strings.NewReader(bl), "b.jsonl", TraceOptions{MooncakeOptions: MooncakeOptions{MaxSeqLen: 4096}})
	if err != nil {
		t.Fatal(err)
	}
	checkReqs(t, "bailian max_seq_len", reqs, []wantReq{{2e9, 2000000000, 2, "trace line 1: input_length 2000000000 + output_length 2"}, {3e9, 20, 2, ""}})
	if _, err := ReadTrace(strings.NewReader(bl), "b.jsonl", TraceOptions{}); err == nil || !strings.Contains(err.Error(), "the prompts need 2000000020 tokens") {
		t.Errorf("bailian over the token budget: ReadTrace = %v, want an error naming the tokens needed", err)
	}

	const az = "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,100,10\n2023-11-16 18:15:47,2000000000,10\n"
	reqs, err = ReadTrace(strings.NewReader(az), "t.csv", TraceOptions{MooncakeOptions: MooncakeOptions{MaxSeqLen: 4096}})
	if err != nil {
		t.Fatal(err)
	}
	checkReqs(t, "max_seq_len", reqs, []wantReq{{0, 100, 10, ""}, {1e9, 2000000000, 10, "trace line 3: 2000000000 prompt + 10 output = 2000000010 tokens exceeds max_seq_len 4096"}})
	_, err = ReadTrace(strings.NewReader(az), "t.csv", TraceOptions{MooncakeOptions: MooncakeOptions{MaxTokens: 1000}})
	if err == nil || !strings.Contains(err.Error(), "the prompts need 2000000100 tokens") {
		t.Errorf("ReadTrace over the token budget = %v, want an error naming the tokens needed", err)
	}
	reqs, err = ReadTrace(strings.NewReader(az), "t.csv", TraceOptions{MooncakeOptions: MooncakeOptions{Limit: 1}})
	if err != nil || len(reqs) != 1 {
		t.Errorf("ReadTrace(limit 1) = %d requests, %v; want 1", len(reqs), err)
	}
}
