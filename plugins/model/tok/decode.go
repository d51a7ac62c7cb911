package tok

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"
)

// byteChar and charByte are GPT-2's bytes_to_unicode: the printable bytes
// stand for themselves, the others for U+0100 onwards, in byte order.
var byteChar [256]rune
var charByte = map[rune]byte{}

func init() {
	n := 0
	for b := 0; b < 256; b++ {
		if b >= '!' && b <= '~' || b >= 0xA1 && b <= 0xAC || b >= 0xAE {
			byteChar[b] = rune(b)
		} else {
			byteChar[b] = rune(256 + n)
			n++
		}
		charByte[byteChar[b]] = byte(b)
	}
}

// byteLevel writes each byte of s as its bytes_to_unicode character.
func byteLevel(s string) string {
	var b strings.Builder
	b.Grow(2 * len(s))
	for i := 0; i < len(s); i++ {
		b.WriteRune(byteChar[s[i]])
	}
	return b.String()
}

type decoder func([]string) []string

func newDecoder(raw json.RawMessage) ([]decoder, error) {
	c, err := component(raw)
	if err != nil || c == nil {
		if err != nil {
			err = fmt.Errorf("decoder: %w", err)
		}
		return nil, err
	}
	ds, err := decoders(*c)
	if err != nil {
		return nil, fmt.Errorf("decoder: %w", err)
	}
	return ds, nil
}

func decoders(c compJSON) ([]decoder, error) {
	switch c.Type {
	case "Sequence":
		var out []decoder
		for i, d := range c.Decoders {
			ds, err := decoders(d)
			if err != nil {
				return nil, fmt.Errorf("decoders[%d]: %w", i, err)
			}
			out = append(out, ds...)
		}
		return out, nil
	case "ByteLevel":
		return []decoder{decodeByteLevel}, nil
	case "Metaspace":
		rep, scheme, err := metaspaceOpts(c)
		if err != nil {
			return nil, err
		}
		r, _ := utf8.DecodeRuneInString(rep)
		return []decoder{func(toks []string) []string {
			for i, t := range toks {
				toks[i] = strings.Map(func(c rune) rune {
					switch {
					case c != r:
						return c
					case i == 0 && scheme != "never":
						return -1
					}
					return ' '
				}, t)
			}
			return toks
		}}, nil
	case "Replace":
		f, err := replacer(c)
		if err != nil {
			return nil, err
		}
		return []decoder{func(toks []string) []string {
			for i, t := range toks {
				toks[i] = f(t)
			}
			return toks
		}}, nil
	case "ByteFallback":
		return []decoder{decodeByteFallback}, nil
	case "Fuse":
		return []decoder{func(toks []string) []string { return []string{strings.Join(toks, "")} }}, nil
	case "Strip":
		if c.Content == nil || utf8.RuneCountInString(*c.Content) != 1 {
			return nil, fmt.Errorf("Strip content %v: want one character", c.Content)
		}
		r, _ := utf8.DecodeRuneInString(*c.Content)
		start, stop := c.Start, c.Stop
		return []decoder{func(toks []string) []string {
			for i, t := range toks {
				rs := []rune(t)
				a, b := 0, len(rs)
				for a < start && a < len(rs) && rs[a] == r {
					a++
				}
				for k := 0; k < stop && b > a && rs[b-1] == r; k++ {
					b--
				}
				toks[i] = string(rs[a:b])
			}
			return toks
		}}, nil
	}
	return nil, fmt.Errorf("type %q: not supported (supported: Sequence, ByteLevel, Metaspace, Replace, ByteFallback, Fuse, Strip)", c.Type)
}

// decodeByteLevel maps each token's characters back to bytes (a token with a
// character outside the table, such as an added token's, stays as it is)
// and reads the whole as UTF-8, lossily.
func decodeByteLevel(toks []string) []string {
	var b []byte
	for _, t := range toks {
		start := len(b)
		for _, c := range t {
			x, ok := charByte[c]
			if !ok {
				b = append(b[:start], t...)
				break
			}
			b = append(b, x)
		}
	}
	return []string{lossy(b)}
}

// decodeByteFallback turns runs of <0xXX> tokens into their text; a run that
// is not UTF-8 becomes one U+FFFD per byte, as tokenizers does.
func decodeByteFallback(toks []string) []string {
	var out []string
	var run []byte
	flush := func() {
		if len(run) == 0 {
			return
		}
		if utf8.Valid(run) {
			out = append(out, string(run))
		} else {
			for range run {
				out = append(out, "\uFFFD")
			}
		}
		run = run[:0]
	}
	for _, t := range toks {
		if len(t) == 6 && strings.HasPrefix(t, "<0x") && t[5] == '>' {
			if v, err := strconv.ParseUint(t[3:5], 16, 8); err == nil {
				run = append(run, byte(v))
				continue
			}
		}
		flush()
		out = append(out, t)
	}
	flush()
	return out
}

// lossy is Rust's String::from_utf8_lossy: each maximal prefix of a valid
// UTF-8 sequence that is cut short, and each other invalid byte, becomes one
// U+FFFD.
func lossy(b []byte) string {
	if utf8.Valid(b) {
		return string(b)
	}
	var s strings.Builder
	for i := 0; i < len(b); {
		r, n := utf8.DecodeRune(b[i:])
		if r != utf8.RuneError || n > 1 {
			s.WriteRune(r)
			i += n
			continue
		}
		s.WriteRune(utf8.RuneError)
		i += invalidLen(b[i:])
	}
	return s.String()
}

// invalidLen is the length of the maximal subpart of a UTF-8 sequence at
// the start of b (which does not begin a valid character): at least 1.
func invalidLen(b []byte) int {
	c := b[0]
	var need int
	lo, hi := byte(0x80), byte(0xBF) // the second byte's range
	switch {
	case c >= 0xC2 && c <= 0xDF:
		need = 1
	case c == 0xE0:
		need, lo = 2, 0xA0
	case c >= 0xE1 && c <= 0xEC || c == 0xEE || c == 0xEF:
		need = 2
	case c == 0xED:
		need, hi = 2, 0x9F
	case c == 0xF0:
		need, lo = 3, 0x90
	case c >= 0xF1 && c <= 0xF3:
		need = 3
	case c == 0xF4:
		need, hi = 3, 0x8F
	default:
		return 1
	}
	n := 1
	for k := 0; k < need && n < len(b); k++ {
		x := b[n]
		if k == 0 && (x < lo || x > hi) || k > 0 && (x < 0x80 || x > 0xBF) {
			break
		}
		n++
	}
	return n
}
