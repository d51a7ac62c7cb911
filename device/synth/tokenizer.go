package synth

// Token ids of the byte-level tokenizer. Ids 0..255 are the bytes; a
// synthetic vocabulary larger than 258 has ids that Decode skips.
const (
	BOS int32 = 256 // begin of sequence, first token of every Encode
	EOS int32 = 257 // end of sequence
	// MinVocab is the smallest vocabulary the tokenizer needs.
	MinVocab = 258
)

// Encode returns BOS followed by the bytes of s, one token per byte. The
// slice is the caller's.
func Encode(s string) []int32 {
	out := make([]int32, 0, len(s)+1)
	out = append(out, BOS)
	for i := 0; i < len(s); i++ {
		out = append(out, int32(s[i]))
	}
	return out
}

// Decode returns the bytes of the byte tokens of ids in order; BOS, EOS and
// any id outside 0..255 are skipped. Decode(Encode(s)) == s for every s.
func Decode(ids []int32) string {
	b := make([]byte, 0, len(ids))
	for _, id := range ids {
		if id >= 0 && id < 256 {
			b = append(b, byte(id))
		}
	}
	return string(b)
}
