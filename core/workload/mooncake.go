package workload

import (
	"bufio"
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
)

// MooncakeOptions controls how a Mooncake trace becomes requests.
type MooncakeOptions struct {
	// Limit reads at most this many requests (the first ones in the file);
	// 0 reads them all.
	Limit int
	// TimeScale is the replay speed: Arrival = timestamp_ms × 1e6 / TimeScale
	// nanoseconds, so 2 replays twice as fast and 0.5 half as fast. 0 = 1.
	TimeScale float64
	// BlockTokens is the number of tokens one hash id stands for. 0 = 512,
	// the block size Mooncake traces are published with.
	BlockTokens int
	// Vocab is the token id range [0, Vocab). 0 = DefaultVocab.
	Vocab int
	// Seed selects the synthesized tokens; the same seed gives the same prompts.
	Seed uint64
	// MaxSeqLen, when > 0, is checked before anything is synthesized: a line
	// whose input_length + output_length exceeds it becomes a Request with a
	// nil Prompt and Rejected set (it costs no token memory). 0 = no limit.
	MaxSeqLen int
	// MaxTokens bounds the prompt tokens synthesized for the whole trace
	// (their backing arrays, 4 bytes a token), checked before any is
	// allocated; a trace above it is a *TraceError. 0 = MaxTotalTokens.
	MaxTokens int64
}

func (o MooncakeOptions) resolve() (MooncakeOptions, error) {
	if o.Limit < 0 {
		return o, optErr("limit", o.Limit, "must be >= 0 (0 = all requests)")
	}
	switch {
	case o.TimeScale == 0:
		o.TimeScale = 1
	case !(o.TimeScale > 0) || math.IsInf(o.TimeScale, 0):
		return o, optErr("time_scale", o.TimeScale, "must be a finite number > 0 (0 = 1, real time)")
	}
	switch {
	case o.BlockTokens == 0:
		o.BlockTokens = DefaultBlockTokens
	case o.BlockTokens < 0:
		return o, optErr("hash_block_tokens", o.BlockTokens, "must be > 0 (0 = %d)", DefaultBlockTokens)
	}
	if o.MaxSeqLen < 0 {
		return o, optErr("max_seq_len", o.MaxSeqLen, "must be >= 0 (0 = no limit)")
	}
	switch {
	case o.MaxTokens == 0:
		o.MaxTokens = MaxTotalTokens
	case o.MaxTokens < 0:
		return o, optErr("max_tokens", o.MaxTokens, "must be > 0 (0 = %d)", MaxTotalTokens)
	}
	v, err := resolveVocab(o.Vocab)
	o.Vocab = v
	return o, err
}

// MaxLineErrors is how many bad lines ReadMooncake reports before it stops.
const MaxLineErrors = 20

// maxLineBytes bounds one trace line, its newline not counted, in every
// format: a longer line is a *LineError naming the limit (format detection
// reads the first line whole, up to this limit).
const maxLineBytes = 64 << 20

// LineError is one problem in a trace file.
type LineError struct {
	File    string
	Line    int    // 1-based line number; 0 for a problem with the whole file
	Field   string // JSON key at fault; "" when the line as a whole is at fault
	Value   string // the value as written (shortened); "" when missing or not applicable
	Problem string // what is wrong and what is allowed
}

func (e *LineError) Error() string {
	var b strings.Builder
	b.WriteString(e.File)
	if e.Line > 0 {
		fmt.Fprintf(&b, ":%d", e.Line)
	}
	b.WriteString(": ")
	if e.Field != "" {
		b.WriteString(e.Field)
		if e.Value != "" {
			b.WriteString(" = ")
			b.WriteString(e.Value)
		}
		b.WriteString(": ")
	}
	b.WriteString(e.Problem)
	return b.String()
}

// TraceError collects the problems found in one trace file: all of them, up
// to MaxLineErrors.
type TraceError struct {
	File      string
	Errs      []*LineError
	Truncated bool // reading stopped after MaxLineErrors errors; more may follow
}

func (e *TraceError) Error() string {
	if len(e.Errs) == 1 && !e.Truncated {
		return "bad trace: " + e.Errs[0].Error()
	}
	var b strings.Builder
	fmt.Fprintf(&b, "bad trace %s: %d errors", e.File, len(e.Errs))
	if e.Truncated {
		fmt.Fprintf(&b, " (stopped after %d)", MaxLineErrors)
	}
	for _, le := range e.Errs {
		b.WriteString("\n\t")
		b.WriteString(le.Error())
	}
	return b.String()
}

// Unwrap returns the individual *LineError values.
func (e *TraceError) Unwrap() []error {
	errs := make([]error, len(e.Errs))
	for i, le := range e.Errs {
		errs[i] = le
	}
	return errs
}

// LoadMooncake reads the Mooncake trace at path; see ReadMooncake.
func LoadMooncake(path string, opt MooncakeOptions) ([]Request, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return ReadMooncake(f, path, opt)
}

// ReadMooncake reads a Mooncake JSONL trace: one JSON object per line with
// timestamp (ms, integer or fraction, >= 0, not decreasing), input_length
// (>= 1), output_length (>= 1) and hash_ids (a list of integers >= 0, one
// per BlockTokens-token block of the prompt). Blank lines are skipped and
// other keys are ignored. name is used in error messages.
//
// Request i (0-based, in file order) gets ID i, Arrival from its timestamp
// and TimeScale, OutputLen = output_length, and a prompt of exactly
// input_length tokens: for each hash id in order, the BlockTokens tokens
// that (Seed, hash id) synthesizes, the last block truncated. If hash_ids
// covers fewer than input_length tokens, the rest is unique tokens derived
// from (Seed, line number); surplus hash ids are ignored.
//
// Lengths are checked before any token is synthesized: with MaxSeqLen set,
// a line longer than it is returned as a rejected Request (nil Prompt,
// Rejected saying why), and the prompts kept must fit in MaxTokens tokens
// in all, so a typo such as input_length 2000000000 costs no memory.
//
// Memory: a prompt whose hash ids are a prefix of another's shares that
// request's backing array; the others have their own. For the published
// 12k-request conversation trace that is 143.7M tokens, about 575 MB (vs
// 579 MB unshared): turns of one conversation rarely extend each other
// exactly, because a turn's partial last block gets a new hash id in the
// next turn.
//
// Errors: an invalid option is an *OptionError. Bad lines are reported
// together as one *TraceError listing up to MaxLineErrors *LineError values,
// each naming the file, line, field and value; no requests are returned
// then. An empty trace, and one whose prompts exceed MaxTokens, is a
// *TraceError too. Read errors are returned
// wrapped.
func ReadMooncake(r io.Reader, name string, opt MooncakeOptions) ([]Request, error) {
	opt, err := opt.resolve()
	if err != nil {
		return nil, err
	}
	p := parser{file: name, opt: opt}
	if err := p.scan(r); err != nil {
		return nil, err
	}
	if len(p.errs) > 0 {
		return nil, &TraceError{File: name, Errs: p.errs, Truncated: p.truncated}
	}
	if len(p.recs) == 0 {
		return nil, &TraceError{File: name, Errs: []*LineError{{File: name, Problem: "no requests (the file is empty or blank)"}}}
	}
	return p.synthesize()
}

// record is one parsed trace line.
type record struct {
	line     int
	arrival  int64
	in, out  int
	off, cnt int    // hash ids: parser.ids[off : off+cnt]
	rejected string // why the request can never run (MaxSeqLen); no tokens then
}

type parser struct {
	file      string
	opt       MooncakeOptions
	recs      []record
	ids       []uint64 // hash ids of all records, back to back
	errs      []*LineError
	truncated bool

	lastLine    int // line of the last good record, for the ordering check
	lastArrival int64
	unitNs      float64 // nanoseconds per JSONL timestamp unit; 0 = 1e6 (Mooncake's milliseconds)
}

func (p *parser) fail(line int, field, value, format string, args ...any) {
	p.errs = append(p.errs, &LineError{File: p.file, Line: line, Field: field, Value: shorten(value), Problem: fmt.Sprintf(format, args...)})
}

func shorten(s string) string {
	const max = 40
	if len(s) > max {
		return s[:max] + "..."
	}
	return s
}

func (p *parser) scan(r io.Reader) error {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), maxLineBytes+1) // +1: the newline
	line, lines := 0, 0
	for sc.Scan() {
		line++
		b := bytes.TrimSpace(sc.Bytes())
		if len(b) == 0 {
			continue
		}
		p.parseLine(line, b)
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
	if err := sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			p.fail(line+1, "", "", "line longer than the %d-byte limit of a trace line", maxLineBytes)
			return nil
		}
		return fmt.Errorf("reading trace %s: %w", p.file, err)
	}
	return nil
}

type rawLine struct {
	Timestamp    json.RawMessage `json:"timestamp"`
	InputLength  json.RawMessage `json:"input_length"`
	OutputLength json.RawMessage `json:"output_length"`
	HashIDs      json.RawMessage `json:"hash_ids"`
}

// parseLine parses one non-blank line; it records either a request or errors.
func (p *parser) parseLine(line int, b []byte) {
	var raw rawLine
	off := len(p.ids)
	fast := p.fastLine(b, &raw)
	if !fast {
		p.ids = p.ids[:off]
		if !p.decodeLine(line, b, &raw) {
			return
		}
	}
	nerr := len(p.errs)
	ts, tsOK := p.number(line, "timestamp", raw.Timestamp, false)
	in, _ := p.number(line, "input_length", raw.InputLength, true)
	out, _ := p.number(line, "output_length", raw.OutputLength, true)
	if !fast {
		p.hashIDs(line, raw.HashIDs)
	}

	var arrival int64
	if tsOK {
		unit := p.unitNs
		if unit == 0 {
			unit = 1e6
		}
		ns := ts * unit / p.opt.TimeScale
		if ns >= math.MaxInt64 {
			p.fail(line, "timestamp", string(raw.Timestamp), "is %.4g ns at time_scale %g, beyond int64 nanoseconds", ns, p.opt.TimeScale)
		} else {
			arrival = int64(math.Round(ns))
			if p.lastLine > 0 && arrival < p.lastArrival {
				p.fail(line, "timestamp", string(raw.Timestamp), "earlier than line %d's; timestamps must not decrease (sort the file by timestamp)", p.lastLine)
			}
		}
	}
	if len(p.errs) > nerr {
		p.ids = p.ids[:off]
		return
	}
	p.lastLine, p.lastArrival = line, arrival
	rec := record{line: line, arrival: arrival, in: int(in), out: int(out), off: off, cnt: len(p.ids) - off}
	if msl := p.opt.MaxSeqLen; msl > 0 && rec.in+rec.out > msl {
		rec.rejected = fmt.Sprintf("trace line %d: input_length %d + output_length %d = %d tokens exceeds max_seq_len %d",
			line, rec.in, rec.out, rec.in+rec.out, msl)
		p.ids = p.ids[:off]
		rec.cnt = 0
	}
	p.recs = append(p.recs, rec)
}

// decodeLine is the general path: encoding/json, with precise messages for
// lines that are not one JSON object.
func (p *parser) decodeLine(line int, b []byte, raw *rawLine) bool {
	if b[0] != '{' {
		p.fail(line, "", "", "not a JSON object: %s", shorten(string(b)))
		return false
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	if err := dec.Decode(raw); err != nil {
		p.fail(line, "", "", "invalid JSON: %v", err)
		return false
	}
	if rest := bytes.TrimSpace(b[dec.InputOffset():]); len(rest) > 0 {
		p.fail(line, "", "", "trailing data after the JSON object: %s", shorten(string(rest)))
		return false
	}
	return true
}

// fastLine parses the common shape of a line without reflection: one
// object holding exactly the four keys (lower case, each once) with number
// values and a flat list of plain non-negative integers for hash_ids. It
// appends the hash ids to p.ids. On anything else it returns false (leaving
// p.ids to be truncated by the caller) and decodeLine decides, so the fast
// path never accepts what encoding/json would reject or read differently.
func (p *parser) fastLine(b []byte, raw *rawLine) bool {
	i := 0
	ws := func() {
		for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\r' || b[i] == '\n') {
			i++
		}
	}
	if b[0] != '{' {
		return false
	}
	i++
	ws()
	var seen [4]bool
	for k := 0; ; k++ {
		if i < len(b) && b[i] == '}' && k == 0 {
			i++
			break
		}
		if i >= len(b) || b[i] != '"' {
			return false
		}
		j := bytes.IndexByte(b[i+1:], '"')
		if j < 0 {
			return false
		}
		key := b[i+1 : i+1+j]
		i += j + 2
		ws()
		if i >= len(b) || b[i] != ':' {
			return false
		}
		i++
		ws()
		var field int
		switch string(key) {
		case "timestamp":
			field = 0
		case "input_length":
			field = 1
		case "output_length":
			field = 2
		case "hash_ids":
			field = 3
		default:
			return false
		}
		if seen[field] {
			return false
		}
		seen[field] = true
		if field == 3 {
			n, ok := p.fastIDs(b[i:])
			if !ok {
				return false
			}
			raw.HashIDs = b[i : i+n]
			i += n
		} else {
			n := jsonNumber(b[i:])
			if n == 0 {
				return false
			}
			v := json.RawMessage(b[i : i+n])
			switch field {
			case 0:
				raw.Timestamp = v
			case 1:
				raw.InputLength = v
			case 2:
				raw.OutputLength = v
			}
			i += n
		}
		ws()
		if i < len(b) && b[i] == ',' {
			i++
			ws()
			continue
		}
		if i < len(b) && b[i] == '}' {
			i++
			break
		}
		return false
	}
	return i == len(b) && seen == [4]bool{true, true, true, true}
}

// fastIDs parses a flat list of plain non-negative integers at the start of
// b, appending them to p.ids; it returns the list's length in bytes.
func (p *parser) fastIDs(b []byte) (int, bool) {
	if len(b) == 0 || b[0] != '[' {
		return 0, false
	}
	i := 1
	ws := func() {
		for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\r' || b[i] == '\n') {
			i++
		}
	}
	ws()
	if i < len(b) && b[i] == ']' {
		return i + 1, true
	}
	for {
		start := i
		var v uint64
		for i < len(b) && b[i] >= '0' && b[i] <= '9' {
			d := uint64(b[i] - '0')
			if v > (math.MaxUint64-d)/10 {
				return 0, false
			}
			v = v*10 + d
			i++
		}
		if i == start || (b[start] == '0' && i-start > 1) {
			return 0, false
		}
		p.ids = append(p.ids, v)
		ws()
		if i >= len(b) {
			return 0, false
		}
		switch b[i] {
		case ',':
			i++
			ws()
		case ']':
			return i + 1, true
		default:
			return 0, false
		}
	}
}

// jsonNumber returns the length of the JSON number at the start of b, or 0.
func jsonNumber(b []byte) int {
	i := 0
	digits := func() int {
		s := i
		for i < len(b) && b[i] >= '0' && b[i] <= '9' {
			i++
		}
		return i - s
	}
	if i < len(b) && b[i] == '-' {
		i++
	}
	switch n := digits(); {
	case n == 0:
		return 0
	case n > 1 && b[i-n] == '0':
		return 0
	}
	if i < len(b) && b[i] == '.' {
		i++
		if digits() == 0 {
			return 0
		}
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		if digits() == 0 {
			return 0
		}
	}
	return i
}

// number parses a required numeric field. Lengths must be integers >= 1
// (and fit an int32, the largest sane prompt); timestamps any finite
// number >= 0.
func (p *parser) number(line int, field string, raw json.RawMessage, length bool) (float64, bool) {
	s := string(raw)
	switch {
	case raw == nil:
		p.fail(line, field, "", "missing")
		return 0, false
	case s == "null":
		p.fail(line, field, s, "must be a number")
		return 0, false
	}
	v, err := strconv.ParseFloat(s, 64)
	if err != nil || (s[0] != '-' && (s[0] < '0' || s[0] > '9')) {
		p.fail(line, field, s, "must be a number")
		return 0, false
	}
	if !length {
		if v < 0 {
			p.fail(line, field, s, "must be >= 0")
			return 0, false
		}
		return v, true
	}
	switch {
	case v != math.Trunc(v):
		p.fail(line, field, s, "must be an integer")
	case v < 1:
		p.fail(line, field, s, "must be >= 1")
	case v > math.MaxInt32:
		p.fail(line, field, s, "must be <= %d", math.MaxInt32)
	default:
		return v, true
	}
	return 0, false
}

// hashIDs appends the line's hash ids to p.ids.
func (p *parser) hashIDs(line int, raw json.RawMessage) {
	if raw == nil {
		p.fail(line, "hash_ids", "", "missing")
		return
	}
	if raw[0] != '[' {
		p.fail(line, "hash_ids", string(raw), "must be a list of integers >= 0")
		return
	}
	// Fast path: a flat list of plain numbers (the JSON is already valid).
	s := raw[1:]
	for i := 0; ; i++ {
		s = bytes.TrimLeft(s, " \t\r\n")
		if len(s) > 0 && s[0] == ']' && i == 0 {
			return
		}
		j := 0
		for j < len(s) && (s[j] == '-' || s[j] == '+' || s[j] == '.' || s[j] == 'e' || s[j] == 'E' || (s[j] >= '0' && s[j] <= '9')) {
			j++
		}
		num := s[:j]
		s = bytes.TrimLeft(s[j:], " \t\r\n")
		if j == 0 || len(s) == 0 || (s[0] != ',' && s[0] != ']') {
			p.hashIDsSlow(line, raw)
			return
		}
		id, err := strconv.ParseUint(string(num), 10, 64)
		if err != nil {
			p.fail(line, fmt.Sprintf("hash_ids[%d]", i), string(num), "must be an integer >= 0")
			return
		}
		p.ids = append(p.ids, id)
		if s[0] == ']' {
			return
		}
		s = s[1:]
	}
}

// hashIDsSlow finds the first bad element of a list that is not a flat
// list of numbers.
func (p *parser) hashIDsSlow(line int, raw json.RawMessage) {
	var elems []json.RawMessage
	if err := json.Unmarshal(raw, &elems); err != nil {
		p.fail(line, "hash_ids", string(raw), "must be a list of integers >= 0")
		return
	}
	for i, e := range elems {
		if _, err := strconv.ParseUint(string(e), 10, 64); err != nil {
			p.fail(line, fmt.Sprintf("hash_ids[%d]", i), string(e), "must be an integer >= 0")
			return
		}
	}
	// Unreachable for valid JSON: every element parsed on the slow path.
	p.fail(line, "hash_ids", string(raw), "must be a list of integers >= 0")
}

// synthesize builds the prompts. Requests whose hash ids are a prefix of a
// later request in (hash ids, input_length) order share its backing array.
// Rejected records get no prompt; the others' backing arrays must fit in
// MaxTokens, which is checked before any is allocated.
func (p *parser) synthesize() ([]Request, error) {
	idsOf := func(i int) []uint64 { r := &p.recs[i]; return p.ids[r.off : r.off+r.cnt] }
	var order []int
	for i := range p.recs {
		if p.recs[i].rejected == "" {
			order = append(order, i)
		}
	}
	n := len(order)
	slices.SortFunc(order, func(a, b int) int {
		if c := slices.Compare(idsOf(a), idsOf(b)); c != 0 {
			return c
		}
		return cmp.Compare(p.recs[a].in, p.recs[b].in)
	})
	bt := p.opt.BlockTokens
	owner := make([]int, len(p.recs)) // the request whose backing array holds this prompt
	var leaves []int
	for k := n - 1; k >= 0; k-- {
		i := order[k]
		owner[i] = i
		if k+1 < n {
			j := order[k+1]
			ri, rj := &p.recs[i], &p.recs[j]
			a, b := idsOf(i), idsOf(j)
			// Tokens [0, in_i) of j equal i's prompt when i's ids are a
			// prefix of j's, j is at least as long, and i has no padding.
			if len(a) <= len(b) && slices.Equal(a, b[:len(a)]) && ri.in <= rj.in && ri.in <= bt*len(a) {
				owner[i] = owner[j]
			}
		}
		if owner[i] == i {
			leaves = append(leaves, i)
		}
	}

	var total int64
	for _, i := range leaves {
		total += int64(p.recs[i].in)
	}
	if total > p.opt.MaxTokens {
		return nil, &TraceError{File: p.file, Errs: []*LineError{{File: p.file, Problem: fmt.Sprintf(
			"the prompts need %d tokens (%.1f GiB), more than the limit of %d tokens; read fewer requests (workload.limit) or lower max_seq_len",
			total, float64(total)*4/(1<<30), p.opt.MaxTokens)}}}
	}
	backing := make([][]int32, len(p.recs))
	vocab := uint64(p.opt.Vocab)
	fill := func(i int) {
		r := &p.recs[i]
		buf := make([]int32, r.in)
		for b, id := range idsOf(i) {
			lo := b * bt
			if lo >= r.in {
				break
			}
			fillTokens(buf[lo:min(lo+bt, r.in)], streamKey(p.opt.Seed, domainBlock, id), vocab)
		}
		if pad := bt * r.cnt; pad < r.in {
			fillTokens(buf[pad:], streamKey(p.opt.Seed, domainPad, uint64(r.line)), vocab)
		}
		backing[i] = buf
	}
	parallel(len(leaves), func(k int) { fill(leaves[k]) })

	reqs := make([]Request, len(p.recs))
	for i := range reqs {
		r := &p.recs[i]
		reqs[i] = Request{ID: uint64(i), Arrival: r.arrival, OutputLen: r.out}
		if r.rejected != "" {
			reqs[i].Rejected = r.rejected
			continue
		}
		reqs[i].Prompt = backing[owner[i]][:r.in:r.in]
	}
	return reqs, nil
}

// parallel calls f(0..n-1) on up to GOMAXPROCS goroutines.
func parallel(n int, f func(int)) {
	workers := min(runtime.GOMAXPROCS(0), n)
	if workers <= 1 {
		for i := range n {
			f(i)
		}
		return
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				f(i)
			}
		})
	}
	wg.Wait()
}
