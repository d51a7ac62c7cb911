package workload

import (
	"bytes"
	"os"
	"testing"
)

// BenchmarkLoadMooncake loads the real 12k-request trace end to end (parse,
// synthesize 144.8M prompt tokens, about 575 MB).
func BenchmarkLoadMooncake(b *testing.B) {
	openRealTrace(b)
	var reqs []Request
	for b.Loop() {
		var err error
		if reqs, err = LoadMooncake(realTrace, MooncakeOptions{}); err != nil {
			b.Fatal(err)
		}
	}
	var tokens int
	for _, r := range reqs {
		tokens += len(r.Prompt)
	}
	b.ReportMetric(float64(tokens), "tokens/op")
}

// BenchmarkParseMooncake is the parsing part of BenchmarkLoadMooncake alone.
func BenchmarkParseMooncake(b *testing.B) {
	openRealTrace(b)
	data, err := os.ReadFile(realTrace)
	if err != nil {
		b.Fatal(err)
	}
	opt, _ := MooncakeOptions{}.resolve()
	b.SetBytes(int64(len(data)))
	for b.Loop() {
		p := parser{file: realTrace, opt: opt}
		if err := p.scan(bytes.NewReader(data)); err != nil || len(p.errs) > 0 {
			b.Fatal(err, p.errs)
		}
	}
}

// BenchmarkAnalyzeMooncake hashes every full block of the real trace.
func BenchmarkAnalyzeMooncake(b *testing.B) {
	openRealTrace(b)
	reqs, err := LoadMooncake(realTrace, MooncakeOptions{})
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(Analyze(reqs, 0).InputTokens * 4)
	for b.Loop() {
		Analyze(reqs, 0)
	}
}

// BenchmarkGenerateLongContext generates seed A's shape (about 40M tokens).
func BenchmarkGenerateLongContext(b *testing.B) {
	for b.Loop() {
		if _, err := Generate(LongContext(1)); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkFillTokens is the token synthesis rate into warm memory.
func BenchmarkFillTokens(b *testing.B) {
	buf := make([]int32, 1<<16)
	b.SetBytes(int64(len(buf)) * 4)
	for b.Loop() {
		fillTokens(buf, 12345, DefaultVocab)
	}
}
