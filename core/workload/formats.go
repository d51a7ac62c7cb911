package workload

import (
	"bufio"
	"bytes"
	"encoding/csv"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Trace formats, the values of TraceOptions.Format (workload.format).
const (
	// FormatMooncake is Mooncake's JSONL: timestamp in milliseconds,
	// input_length, output_length, hash_ids of 512-token blocks.
	FormatMooncake = "mooncake"
	// FormatBailian is the Qwen-Bailian JSONL traces: Mooncake's fields
	// with timestamp in seconds, hash_ids of 16-token blocks, and chat_id,
	// parent_chat_id, turn (read, not used).
	FormatBailian = "bailian"
	// FormatAzure is the Azure LLM inference trace CSV:
	// TIMESTAMP,ContextTokens,GeneratedTokens, the timestamp a date and
	// time such as 2023-11-16 18:15:46.6805900.
	FormatAzure = "azure"
	// FormatBurstGPT is BurstGPT's CSV: Timestamp (seconds),Model,Request
	// tokens,Response tokens,Total tokens,Log Type.
	FormatBurstGPT = "burstgpt"
)

// Formats lists the trace formats ReadTrace reads.
var Formats = []string{FormatMooncake, FormatAzure, FormatBurstGPT, FormatBailian}

// BailianBlockTokens is the block size the Qwen-Bailian traces' hash_ids
// are published with.
const BailianBlockTokens = 16

// TraceOptions controls how a trace of any format becomes requests.
type TraceOptions struct {
	// Format is one of Formats; "" detects it from the first non-blank
	// line (see DetectFormat).
	Format string
	// MooncakeOptions apply to every format. BlockTokens (the tokens one
	// hash id stands for) defaults to 512 for mooncake and 16 for bailian;
	// the CSV formats have no hash ids and must leave it 0.
	MooncakeOptions
}

// LoadTrace reads the trace at path; see ReadTrace.
func LoadTrace(path string, opt TraceOptions) ([]Request, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return ReadTrace(f, path, opt)
}

// ReadTrace reads a trace in opt.Format (detected when empty) and returns
// its requests, as ReadMooncake does for every format: ID the request's
// place in the file, Arrival from the timestamp and TimeScale, lines
// checked against MaxSeqLen and the prompts against MaxTokens before any
// token is synthesized, and errors as *OptionError (an option, Format
// included) or *TraceError (lines, each naming file, line and field).
//
//   - mooncake, bailian: JSONL as ReadMooncake reads it (bailian's
//     timestamps in seconds, its hash ids of BlockTokens = 16 tokens by
//     default). Prompts share tokens exactly where their hash ids are
//     equal, block by block.
//   - azure: a CSV header naming TIMESTAMP, ContextTokens and
//     GeneratedTokens; Arrival is the time since the first line's
//     timestamp, which must be "2006-01-02 15:04:05" with up to 9
//     fractional digits, never decreasing.
//   - burstgpt: a CSV header naming Timestamp, Model, Request tokens,
//     Response tokens, Total tokens and Log Type; Timestamp is seconds
//     (>= 0, never decreasing); Total tokens must be their sum.
//
// A line may be up to 64 MiB (maxLineBytes, its newline not counted) in
// every format, the first one (read whole to detect the format) included;
// a longer line is a *TraceError naming the line and the limit.
//
// The CSV formats carry no hash ids, so every prompt is its own unique
// tokens. Their prompt length must be >= 1; an output length of 0 (a
// request that failed when the trace was recorded, as BurstGPT logs them)
// becomes a Rejected request that says so. Other columns are ignored.
func ReadTrace(r io.Reader, name string, opt TraceOptions) ([]Request, error) {
	var br io.Reader = r
	format := opt.Format
	if format == "" {
		first, rest, err := firstLine(bufio.NewReaderSize(r, 1<<20))
		if le, ok := err.(*LineError); ok {
			le.File = name
			return nil, &TraceError{File: name, Errs: []*LineError{le}}
		}
		if err != nil {
			return nil, fmt.Errorf("reading trace %s: %w", name, err)
		}
		br = rest
		if format, err = DetectFormat(first); err != nil {
			return nil, &TraceError{File: name, Errs: []*LineError{{File: name, Line: 1, Problem: err.Error()}}}
		}
	}
	mo := opt.MooncakeOptions
	switch format {
	case FormatMooncake:
		return ReadMooncake(br, name, mo)
	case FormatBailian:
		if mo.BlockTokens == 0 {
			mo.BlockTokens = BailianBlockTokens
		}
		return readJSONL(br, name, mo, 1e9)
	case FormatAzure, FormatBurstGPT:
		if mo.BlockTokens != 0 {
			return nil, optErr("hash_block_tokens", mo.BlockTokens, "must be unset (0) for workload.format %s, whose lines have no hash_ids", format)
		}
		mo, err := mo.resolve()
		if err != nil {
			return nil, err
		}
		p := parser{file: name, opt: mo}
		if err := p.scanCSV(br, format); err != nil {
			return nil, err
		}
		return p.finish()
	}
	return nil, optErr("format", format, "is not one of %s", strings.Join(Formats, ", "))
}

// readJSONL is ReadMooncake with timestamps of unitNs nanoseconds.
func readJSONL(r io.Reader, name string, opt MooncakeOptions, unitNs float64) ([]Request, error) {
	opt, err := opt.resolve()
	if err != nil {
		return nil, err
	}
	p := parser{file: name, opt: opt, unitNs: unitNs}
	if err := p.scan(r); err != nil {
		return nil, err
	}
	return p.finish()
}

// finish reports the parse errors or synthesizes the prompts.
func (p *parser) finish() ([]Request, error) {
	if len(p.errs) > 0 {
		return nil, &TraceError{File: p.file, Errs: p.errs, Truncated: p.truncated}
	}
	if len(p.recs) == 0 {
		return nil, &TraceError{File: p.file, Errs: []*LineError{{File: p.file, Problem: "no requests (the file is empty or blank)"}}}
	}
	return p.synthesize()
}

// firstLine reads br up to the end of its first non-blank line, which may
// be up to maxLineBytes long (the limit the JSONL reader also enforces),
// and returns that line trimmed (nil when br holds only blank lines) and a
// reader that yields all of br again, the bytes read included. A line
// longer than maxLineBytes is an error naming its number and the limit.
func firstLine(br *bufio.Reader) ([]byte, io.Reader, error) {
	var read []byte // everything taken from br so far
	start, line := 0, 1
	for {
		chunk, err := br.ReadSlice('\n')
		read = append(read, chunk...)
		if n := len(bytes.TrimSuffix(read[start:], []byte("\n"))); n > maxLineBytes {
			return nil, nil, &LineError{Line: line, Problem: fmt.Sprintf("line longer than the %d-byte limit of a trace line", maxLineBytes)}
		}
		switch {
		case errors.Is(err, bufio.ErrBufferFull):
			continue // the line goes on
		case err != nil && !errors.Is(err, io.EOF):
			return nil, nil, err
		}
		if t := bytes.TrimSpace(read[start:]); len(t) > 0 {
			return t, io.MultiReader(bytes.NewReader(read), br), nil
		}
		if err != nil { // io.EOF: all blank
			return nil, bytes.NewReader(read), nil
		}
		start, line = len(read), line+1
	}
}

// DetectFormat names the format of a trace from its first non-blank line:
// a JSON object with chat_id, parent_chat_id or turn is bailian, one with
// exactly Mooncake's four keys is mooncake; a CSV header is azure when it
// names TIMESTAMP, ContextTokens and GeneratedTokens, burstgpt when it
// names Request tokens and Response tokens. Anything else is an error
// asking for workload.format.
func DetectFormat(first []byte) (string, error) {
	ask := "set workload.format (one of " + strings.Join(Formats, ", ") + ")"
	if len(first) == 0 {
		return "", fmt.Errorf("the trace is empty: no line to detect its format from; %s", ask)
	}
	if first[0] == '{' {
		var keys map[string]json.RawMessage
		if err := json.Unmarshal(first, &keys); err != nil {
			return "", fmt.Errorf("the first line starts like JSON but is not a JSON object (%v); %s", err, ask)
		}
		for _, k := range []string{"chat_id", "parent_chat_id", "turn"} {
			if _, ok := keys[k]; ok {
				return FormatBailian, nil
			}
		}
		mooncake := []string{"hash_ids", "input_length", "output_length", "timestamp"}
		var got []string
		for k := range keys {
			got = append(got, k)
		}
		slices.Sort(got)
		if slices.Equal(got, mooncake) {
			return FormatMooncake, nil
		}
		return "", fmt.Errorf("a JSON line with keys %v is neither Mooncake's (%v) nor Bailian's (with chat_id); its timestamp unit and block size are unknown: %s", got, mooncake, ask)
	}
	cols, err := csv.NewReader(bytes.NewReader(first)).Read()
	if err == nil {
		h := newHeader(cols)
		if h.has("TIMESTAMP", "ContextTokens", "GeneratedTokens") {
			return FormatAzure, nil
		}
		if h.has("Request tokens", "Response tokens") {
			return FormatBurstGPT, nil
		}
	}
	return "", fmt.Errorf("the first line %q is not a JSON object nor a CSV header of the Azure (TIMESTAMP,ContextTokens,GeneratedTokens) or BurstGPT (Timestamp,Model,Request tokens,...) trace; %s", shorten(string(first)), ask)
}

// lineLimit passes r through until a line runs past maxLineBytes (its
// newline not counted), then fails with a *LineError naming the line and
// the limit, on that read and every later one: encoding/csv has no line
// limit of its own and would buffer a line of any length.
type lineLimit struct {
	r    io.Reader
	run  int // bytes of the current line so far
	line int // 1-based number of the current line
	err  error
}

func (l *lineLimit) Read(b []byte) (int, error) {
	if l.err != nil {
		return 0, l.err
	}
	n, err := l.r.Read(b)
	for rest := b[:n]; ; {
		i := bytes.IndexByte(rest, '\n')
		if i < 0 {
			l.run += len(rest)
		} else {
			l.run += i
		}
		if l.run > maxLineBytes {
			l.err = &LineError{Line: l.line, Problem: fmt.Sprintf("line longer than the %d-byte limit of a trace line", maxLineBytes)}
			return 0, l.err
		}
		if i < 0 {
			break
		}
		l.run, l.line, rest = 0, l.line+1, rest[i+1:]
	}
	return n, err
}

// header maps a CSV header's column names (trimmed, a UTF-8 byte order
// mark dropped) to their index; of a name given twice, the first.
type header map[string]int

func newHeader(cols []string) header {
	h := header{}
	for i, c := range cols {
		c = strings.TrimSpace(strings.TrimPrefix(c, "\ufeff"))
		if _, dup := h[c]; !dup {
			h[c] = i
		}
	}
	return h
}

func (h header) has(names ...string) bool {
	for _, n := range names {
		if _, ok := h[n]; !ok {
			return false
		}
	}
	return true
}

// csvColumns are the columns each CSV format needs.
var csvColumns = map[string][]string{
	FormatAzure:    {"TIMESTAMP", "ContextTokens", "GeneratedTokens"},
	FormatBurstGPT: {"Timestamp", "Model", "Request tokens", "Response tokens", "Total tokens", "Log Type"},
}

// azureTime is the Azure trace's timestamp layout; time.Parse accepts up
// to 9 fractional digits after the seconds without a layout for them.
const azureTime = "2006-01-02 15:04:05"

// scanCSV reads the header and the lines of a CSV trace into p.recs.
func (p *parser) scanCSV(r io.Reader, format string) error {
	cr := csv.NewReader(&lineLimit{r: r, line: 1})
	cr.ReuseRecord = true
	cr.FieldsPerRecord = -1 // counted here, with a message naming the line
	cols, err := cr.Read()
	if err != nil {
		if errors.Is(err, io.EOF) {
			return nil // finish reports the empty trace
		}
		return p.csvErr(err)
	}
	h := newHeader(cols)
	for _, c := range csvColumns[format] {
		if !h.has(c) {
			p.fail(1, c, "", "missing from the header %q: a %s trace has the columns %s", shorten(strings.Join(cols, ",")), format, strings.Join(csvColumns[format], ","))
		}
	}
	if len(p.errs) > 0 {
		return nil
	}
	width := len(cols)
	var t0 time.Time
	lines := 0
	for {
		rec, err := cr.Read()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			if e := p.csvErr(err); e != nil {
				return e
			}
		} else {
			line, _ := cr.FieldPos(0)
			if len(rec) != width {
				p.fail(line, "", "", "%d fields, the header has %d", len(rec), width)
			} else {
				field := func(name string) string { return strings.TrimSpace(rec[h[name]]) }
				if format == FormatAzure {
					p.azureLine(line, field, &t0)
				} else {
					p.burstLine(line, field)
				}
			}
		}
		lines++
		if len(p.errs) >= MaxLineErrors {
			p.errs = p.errs[:MaxLineErrors]
			p.truncated = true
			return nil
		}
		if p.opt.Limit > 0 && lines >= p.opt.Limit {
			return nil
		}
	}
}

// csvErr records a CSV syntax error as a line error; a read error is
// returned.
func (p *parser) csvErr(err error) error {
	var pe *csv.ParseError
	if errors.As(err, &pe) {
		p.fail(pe.StartLine, "", "", "not a CSV line: %v", pe.Err)
		return nil
	}
	var le *LineError
	if errors.As(err, &le) { // lineLimit: reading stops here
		le.File = p.file
		return &TraceError{File: p.file, Errs: append(p.errs, le)}
	}
	return fmt.Errorf("reading trace %s: %w", p.file, err)
}

// count parses a token count: an integer >= lo (and <= MaxInt32).
func (p *parser) count(line int, field, s string, lo int) (int, bool) {
	v, err := strconv.ParseInt(s, 10, 64)
	switch {
	case s == "":
		p.fail(line, field, "", "missing")
	case err != nil:
		p.fail(line, field, s, "must be an integer")
	case v < int64(lo):
		p.fail(line, field, s, "must be >= %d", lo)
	case v > math.MaxInt32:
		p.fail(line, field, s, "must be <= %d", math.MaxInt32)
	default:
		return int(v), true
	}
	return 0, false
}

func (p *parser) azureLine(line int, field func(string) string, t0 *time.Time) {
	nerr := len(p.errs)
	ts := field("TIMESTAMP")
	t, err := time.Parse(azureTime, ts)
	if err != nil {
		p.fail(line, "TIMESTAMP", ts, "must be a date and time like 2023-11-16 18:15:46.6805900")
	}
	in, _ := p.count(line, "ContextTokens", field("ContextTokens"), 1)
	out, _ := p.count(line, "GeneratedTokens", field("GeneratedTokens"), 0)
	if len(p.errs) > nerr {
		return
	}
	if t0.IsZero() {
		*t0 = t
	}
	p.addCSV(line, "TIMESTAMP", ts, float64(t.Sub(*t0)), in, out, "GeneratedTokens")
}

func (p *parser) burstLine(line int, field func(string) string) {
	nerr := len(p.errs)
	ts := field("Timestamp")
	sec, err := strconv.ParseFloat(ts, 64)
	switch {
	case ts == "":
		p.fail(line, "Timestamp", "", "missing")
	case err != nil || math.IsInf(sec, 0) || math.IsNaN(sec):
		p.fail(line, "Timestamp", ts, "must be a number of seconds")
	case sec < 0:
		p.fail(line, "Timestamp", ts, "must be >= 0")
	}
	in, inOK := p.count(line, "Request tokens", field("Request tokens"), 1)
	out, outOK := p.count(line, "Response tokens", field("Response tokens"), 0)
	if tot, ok := p.count(line, "Total tokens", field("Total tokens"), 0); ok && inOK && outOK && tot != in+out {
		p.fail(line, "Total tokens", field("Total tokens"), "must be Request tokens %d + Response tokens %d = %d", in, out, in+out)
	}
	if len(p.errs) > nerr {
		return
	}
	p.addCSV(line, "Timestamp", ts, sec*1e9, in, out, "Response tokens")
}

// addCSV records one good CSV line: ns nanoseconds after the trace's
// start (before TimeScale), in prompt and out output tokens.
func (p *parser) addCSV(line int, tsField, ts string, ns float64, in, out int, outField string) {
	ns /= p.opt.TimeScale
	if ns >= math.MaxInt64 {
		p.fail(line, tsField, ts, "is %.4g ns at time_scale %g, beyond int64 nanoseconds", ns, p.opt.TimeScale)
		return
	}
	arrival := int64(math.Round(ns))
	if p.lastLine > 0 && arrival < p.lastArrival {
		p.fail(line, tsField, ts, "earlier than line %d's; timestamps must not decrease (sort the file by timestamp)", p.lastLine)
		return
	}
	p.lastLine, p.lastArrival = line, arrival
	rec := record{line: line, arrival: arrival, in: in, out: out, off: len(p.ids)}
	switch msl := p.opt.MaxSeqLen; {
	case out == 0:
		rec.rejected = fmt.Sprintf("trace line %d: %s 0: the request generated nothing when the trace was recorded (a failed request)", line, outField)
	case msl > 0 && in+out > msl:
		rec.rejected = fmt.Sprintf("trace line %d: %d prompt + %d output = %d tokens exceeds max_seq_len %d", line, in, out, in+out, msl)
	}
	p.recs = append(p.recs, rec)
}
