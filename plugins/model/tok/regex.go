package tok

import (
	"fmt"
	"regexp"
	"slices"
	"strings"
	"unicode/utf8"
)

// Character sets of Oniguruma's Unicode \s, \d and \w, written for Go's
// regexp (whose \s, \d, \w are ASCII only). White_Space is U+0009..U+000D,
// U+0085 and the separators (\p{Z}, which holds U+0020 and U+00A0).
const (
	spaceSet = `\t-\r\x{85}\p{Z}`
	digitSet = `\p{Nd}`
	wordSet  = `\p{L}\p{M}\p{Nd}\p{Pc}`
)

// wsTail ends the GPT-2, GPT-4, Llama-3, Qwen and DeepSeek patterns: a run
// of spaces, less its last one when a non-space follows.
const wsTail = `\s+(?!\S)|\s+`

// splitRegex is a pre-tokenizer pattern compiled for Go.
type splitRegex struct {
	re *regexp.Regexp
	ws int // the subexpression standing for wsTail, or -1
}

// compileSplit translates an Oniguruma pattern of a tokenizer.json to Go.
func compileSplit(pattern string) (*splitRegex, error) {
	body, tail := pattern, false
	if strings.HasSuffix(pattern, "|"+wsTail) {
		body, tail = strings.TrimSuffix(pattern, "|"+wsTail), true
	} else if pattern == wsTail {
		body, tail = "", true
	}
	for _, look := range []string{"(?=", "(?!", "(?<=", "(?<!", "(?>"} {
		if strings.Contains(body, look) {
			return nil, fmt.Errorf("pattern %q: %s... (lookaround or atomic group) is not supported; only a final %s is", pattern, look, wsTail)
		}
	}
	goPat, err := translate(body)
	if err != nil {
		return nil, fmt.Errorf("pattern %q: %w", pattern, err)
	}
	if tail {
		g := `(?P<kvxws>[` + spaceSet + `]+)`
		if goPat == "" {
			goPat = g
		} else {
			goPat += "|" + g
		}
	}
	re, err := regexp.Compile(goPat)
	if err != nil {
		return nil, fmt.Errorf("pattern %q: %w", pattern, err)
	}
	sr := &splitRegex{re: re, ws: -1}
	if tail {
		sr.ws = re.SubexpIndex("kvxws")
	}
	return sr, nil
}

// translate rewrites the Unicode classes \s \S \d \D \w \W for Go.
func translate(p string) (string, error) {
	var b strings.Builder
	depth := 0 // inside a character class when > 0
	for i := 0; i < len(p); i++ {
		c := p[i]
		switch {
		case c == '\\' && i+1 < len(p):
			n := p[i+1]
			i++
			in := depth > 0
			switch n {
			case 's':
				b.WriteString(class(spaceSet, false, in))
			case 'd':
				b.WriteString(class(digitSet, false, in))
			case 'w':
				b.WriteString(class(wordSet, false, in))
			case 'S', 'D', 'W':
				if in {
					return "", fmt.Errorf(`\%c inside a character class is not supported`, n)
				}
				set := map[byte]string{'S': spaceSet, 'D': digitSet, 'W': wordSet}[n]
				b.WriteString(class(set, true, false))
			default:
				b.WriteByte('\\')
				b.WriteByte(n)
			}
		case c == '[' && depth > 0 && strings.HasPrefix(p[i:], "[:"):
			end := strings.Index(p[i:], ":]")
			if end < 0 {
				return "", fmt.Errorf("unterminated [: class at byte %d", i)
			}
			b.WriteString(p[i : i+end+2])
			i += end + 1
		case c == '[':
			if depth > 0 {
				return "", fmt.Errorf("nested character class at byte %d is not supported", i)
			}
			depth++
			b.WriteByte('[')
			// A ']' first in the class (after an optional '^') is literal.
			if i+1 < len(p) && p[i+1] == '^' {
				b.WriteByte('^')
				i++
			}
			if i+1 < len(p) && p[i+1] == ']' {
				b.WriteString(`\]`)
				i++
			}
		case c == ']' && depth > 0:
			depth--
			b.WriteByte(']')
		default:
			b.WriteByte(c)
		}
	}
	return b.String(), nil
}

func class(set string, negate, inClass bool) string {
	switch {
	case inClass:
		return set
	case negate:
		return "[^" + set + "]"
	default:
		return "[" + set + "]"
	}
}

// span is a piece [start, end) of a string, a match of the pattern or not.
type span struct {
	start, end int
	match      bool
}

// find returns the pieces of s, matches and the gaps between them, in order
// and covering s.
func (sr *splitRegex) find(s string) []span {
	var out []span
	prev := 0
	for pos := 0; pos < len(s); {
		m := sr.re.FindStringSubmatchIndex(s[pos:])
		if m == nil {
			break
		}
		start, end := pos+m[0], pos+m[1]
		if end == start { // an empty match splits nothing
			_, w := utf8.DecodeRuneInString(s[start:])
			pos = start + max(w, 1)
			continue
		}
		if sr.ws >= 0 && m[2*sr.ws] >= 0 && end < len(s) {
			// \s+(?!\S): a non-space follows the run; keep its last space
			// for the next piece, unless the run is that one space.
			_, w := utf8.DecodeLastRuneInString(s[start:end])
			if end-w > start {
				end -= w
			}
		}
		if start > prev {
			out = append(out, span{prev, start, false})
		}
		out = append(out, span{start, end, true})
		prev, pos = end, end
	}
	if prev < len(s) {
		out = append(out, span{prev, len(s), false})
	}
	return out
}

// behavior is a SplitDelimiterBehavior of tokenizers.
type behavior int

const (
	removed behavior = iota
	isolated
	mergedWithPrevious
	mergedWithNext
	contiguous
)

func parseBehavior(s string) (behavior, error) {
	switch strings.ToLower(s) {
	case "removed":
		return removed, nil
	case "isolated":
		return isolated, nil
	case "mergedwithprevious":
		return mergedWithPrevious, nil
	case "mergedwithnext":
		return mergedWithNext, nil
	case "contiguous":
		return contiguous, nil
	}
	return 0, fmt.Errorf("behavior %q: want Removed, Isolated, MergedWithPrevious, MergedWithNext or Contiguous", s)
}

// splitBy applies a behavior to the pieces find returned (their match flags
// already inverted where the Split says invert): the non-empty pieces.
func splitBy(spans []span, b behavior) [][2]int {
	var out [][2]int
	switch b {
	case removed:
		for _, sp := range spans {
			if !sp.match {
				out = append(out, [2]int{sp.start, sp.end})
			}
		}
	case isolated:
		for _, sp := range spans {
			out = append(out, [2]int{sp.start, sp.end})
		}
	case contiguous:
		for i, sp := range spans {
			if sp.match && i > 0 && spans[i-1].match {
				out[len(out)-1][1] = sp.end
				continue
			}
			out = append(out, [2]int{sp.start, sp.end})
		}
	case mergedWithPrevious:
		for i, sp := range spans {
			if sp.match && i > 0 && !spans[i-1].match {
				out[len(out)-1][1] = sp.end
				continue
			}
			out = append(out, [2]int{sp.start, sp.end})
		}
	case mergedWithNext:
		// A match joins the piece after it when that one is not a match
		// (tokenizers folds from the end).
		for i := len(spans) - 1; i >= 0; i-- {
			sp := spans[i]
			if sp.match && i+1 < len(spans) && !spans[i+1].match {
				out[len(out)-1][0] = sp.start
				continue
			}
			out = append(out, [2]int{sp.start, sp.end})
		}
		slices.Reverse(out)
	}
	return out
}
