package pluginrpc

import (
	"encoding/binary"
	"unsafe"
)

// Prompts travel as raw tokens with FeatureRawTokens: little-endian int32s,
// 4 bytes a token. A prompt is the longest column of the calls that carry
// it (a Lookup of a waiting request is sent again at every admission
// round), and protobuf's packed varints cost an encode and a decode a
// token; raw bytes cost a copy each way.

// littleEndian reports whether this machine lays int32s out as the wire
// does, so that a token slice is its own raw form.
var littleEndian = binary.NativeEndian.Uint16([]byte{1, 0}) == 1

// rawTokens is tokens' raw form: on a little-endian machine a view of
// their memory (the caller keeps them unchanged until the message is
// marshalled, as it must a shared column), elsewhere a copy; nil when
// empty.
func rawTokens(tokens []int32) []byte {
	if len(tokens) == 0 {
		return nil
	}
	if littleEndian {
		return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(tokens))), 4*len(tokens))
	}
	b := make([]byte, 4*len(tokens))
	for i, t := range tokens {
		binary.LittleEndian.PutUint32(b[4*i:], uint32(t))
	}
	return b
}

// fromRawTokens decodes field of msg, b, into tokens of their own (nil when
// empty); a length that is no multiple of 4 is an error naming the field.
func fromRawTokens(msg, field string, b []byte) ([]int32, error) {
	if len(b)%4 != 0 {
		return nil, colError("%s: %s has %d bytes, want a multiple of 4 (little-endian int32 tokens)", msg, field, len(b))
	}
	if len(b) == 0 {
		return nil, nil
	}
	t := make([]int32, len(b)/4)
	if littleEndian {
		copy(unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(t))), len(b)), b)
		return t, nil
	}
	for i := range t {
		t[i] = int32(binary.LittleEndian.Uint32(b[4*i:]))
	}
	return t, nil
}

// promptColumn is the prompt of a message that has both forms: the raw
// one when set (setting both is an error), else the packed one.
func promptColumn(msg, field string, packed []int32, raw []byte) ([]int32, error) {
	if len(raw) == 0 {
		return share(packed), nil
	}
	if len(packed) > 0 {
		return nil, colError("%s: both %s (%d tokens) and %s_raw (%d bytes) are set, want one", msg, field, len(packed), field, len(raw))
	}
	return fromRawTokens(msg, field+"_raw", raw)
}
