package tok

// Token ids of the byte-level tokenizer of the synthetic models. Ids 0..255
// are the bytes; a synthetic vocabulary larger than 258 has ids that
// DecodeBytes skips.
const (
	ByteBOS int32 = 256 // begin of sequence, first token of every EncodeBytes
	ByteEOS int32 = 257 // end of sequence
	// ByteVocab is the smallest vocabulary the byte tokenizer needs.
	ByteVocab = 258
)

// EncodeBytes returns ByteBOS followed by the bytes of s, one token per byte. The
// slice is the caller's.
func EncodeBytes(s string) []int32 {
	out := make([]int32, 0, len(s)+1)
	out = append(out, ByteBOS)
	for i := 0; i < len(s); i++ {
		out = append(out, int32(s[i]))
	}
	return out
}

// DecodeBytes returns the bytes of the byte tokens of ids in order; ByteBOS,
// ByteEOS and any id outside 0..255 are skipped. DecodeBytes(EncodeBytes(s))
// == s for every s.
func DecodeBytes(ids []int32) string {
	b := make([]byte, 0, len(ids))
	for _, id := range ids {
		if id >= 0 && id < 256 {
			b = append(b, byte(id))
		}
	}
	return string(b)
}
