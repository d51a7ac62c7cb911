package tok

import (
	"slices"
	"testing"

	"pgregory.net/rapid"
)

func TestBytesRoundTrip(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		s := string(rapid.SliceOf(rapid.Byte()).Draw(t, "bytes"))
		ids := EncodeBytes(s)
		if len(ids) != len(s)+1 || ids[0] != ByteBOS {
			t.Fatalf("EncodeBytes(%q) = %v, want ByteBOS + %d bytes", s, ids, len(s))
		}
		for i, id := range ids[1:] {
			if id != int32(s[i]) {
				t.Fatalf("EncodeBytes(%q)[%d] = %d, want %d", s, i+1, id, s[i])
			}
		}
		// ByteEOS and ids beyond the bytes (a vocab > 258) decode to nothing.
		extra := rapid.SliceOf(rapid.Int32Range(256, 1000)).Draw(t, "extra")
		at := rapid.IntRange(0, len(ids)).Draw(t, "at")
		mixed := slices.Insert(slices.Clone(ids), at, extra...)
		if got := DecodeBytes(mixed); got != s {
			t.Fatalf("DecodeBytes(%v) = %q, want %q", mixed, got, s)
		}
	})
}
