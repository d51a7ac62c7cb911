package workload

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// longMooncakeLine returns a well-formed Mooncake line of more than size
// bytes: n distinct hash ids of 16-token blocks, input_length n × 16.
func longMooncakeLine(size int) []byte {
	var b bytes.Buffer
	b.Grow(size + 64)
	n := 0
	b.WriteString(`{"timestamp": 0, "hash_ids": [0`)
	for n = 1; b.Len() < size; n++ {
		b.WriteByte(',')
		b.WriteString(strconv.Itoa(n))
	}
	fmt.Fprintf(&b, `], "input_length": %d, "output_length": 1}`, n*16)
	return b.Bytes()
}

// TestDetectLongLine is the regression test of issue 24: a well-formed
// Mooncake line longer than the detector's 1 MiB buffer was reported "not a
// JSON object (unexpected end of JSON input)" because detection read a
// truncated prefix. Detection now reads the first line whole, after blank
// lines, up to maxLineBytes.
func TestDetectLongLine(t *testing.T) {
	line := longMooncakeLine(17 << 20)
	data := append([]byte("\n  \n"), line...)
	data = append(data, "\n"...)
	data = append(data, `{"timestamp": 5, "hash_ids": [1], "input_length": 16, "output_length": 1}`+"\n"...)
	reqs, err := ReadTrace(bytes.NewReader(data), "long.jsonl", TraceOptions{MooncakeOptions: MooncakeOptions{MaxSeqLen: 4096, BlockTokens: 16}})
	if err != nil {
		t.Fatalf("ReadTrace(a %d-byte Mooncake line) = %v", len(line), err)
	}
	if len(reqs) != 2 || reqs[0].Rejected == "" || reqs[1].Rejected != "" || len(reqs[1].Prompt) != 16 {
		t.Fatalf("ReadTrace = %d requests (first rejected %q), want 2: the long one rejected (max_seq_len), the short one read", len(reqs), reqs[0].Rejected)
	}
}

// TestLineLimit: a line past maxLineBytes is a *TraceError naming the line
// and the limit, in detection, in the JSONL reader and in the CSV reader.
func TestLineLimit(t *testing.T) {
	long := strings.Repeat("x", maxLineBytes+1)
	want := fmt.Sprintf("line longer than the %d-byte limit of a trace line", maxLineBytes)
	for _, c := range []struct {
		name, format, data string
		line               int
	}{
		{"detect", "", "\n" + long + "\n", 2},
		{"mooncake", FormatMooncake, `{"timestamp": 0, "hash_ids": [1], "input_length": 512, "output_length": 1}` + "\n" + long + "\n", 2},
		{"azure", FormatAzure, "TIMESTAMP,ContextTokens,GeneratedTokens\n" + long, 2},
		{"burstgpt", FormatBurstGPT, long, 1},
	} {
		_, err := ReadTrace(strings.NewReader(c.data), c.name, TraceOptions{Format: c.format})
		var te *TraceError
		if !errors.As(err, &te) || len(te.Errs) == 0 {
			t.Errorf("%s: ReadTrace = %v, want a *TraceError", c.name, err)
			continue
		}
		le := te.Errs[len(te.Errs)-1]
		if le.Line != c.line || !strings.Contains(le.Problem, want) || le.File != c.name {
			t.Errorf("%s: ReadTrace error %+v, want line %d, file %s: %s", c.name, le, c.line, c.name, want)
		}
	}
	// A line of exactly maxLineBytes is within the limit.
	exact := longMooncakeLine(maxLineBytes - 100)
	exact = append(exact[:len(exact)-1], bytes.Repeat([]byte(" "), maxLineBytes-len(exact))...)
	exact = append(exact, '}')
	if len(exact) != maxLineBytes {
		t.Fatalf("built a %d-byte line, want %d", len(exact), maxLineBytes)
	}
	if _, err := ReadTrace(bytes.NewReader(exact), "exact", TraceOptions{MooncakeOptions: MooncakeOptions{MaxSeqLen: 1, BlockTokens: 16}}); err != nil {
		t.Errorf("ReadTrace(a line of maxLineBytes) = %v", err)
	}
}

// FuzzReadTrace reads arbitrary bytes as a trace, detected and as each of
// the four formats: no panic; an error is a *TraceError or an *OptionError.
func FuzzReadTrace(f *testing.F) {
	paths, _ := filepath.Glob("testdata/*_sample.*")
	for _, p := range paths {
		if data, err := os.ReadFile(p); err == nil {
			for i := range len(Formats) + 1 {
				f.Add(data, uint8(i))
			}
		}
	}
	f.Fuzz(func(t *testing.T, data []byte, format uint8) {
		opt := TraceOptions{MooncakeOptions: MooncakeOptions{MaxSeqLen: 1 << 16, MaxTokens: 1 << 20}}
		if i := int(format) % (len(Formats) + 1); i > 0 {
			opt.Format = Formats[i-1]
		}
		_, err := ReadTrace(bytes.NewReader(data), "fuzz", opt)
		var te *TraceError
		var oe *OptionError
		if err != nil && !errors.As(err, &te) && !errors.As(err, &oe) {
			t.Fatalf("ReadTrace(format %q) = %v (%T), want a *TraceError or *OptionError", opt.Format, err, err)
		}
	})
}
