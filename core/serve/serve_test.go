package serve

import (
	"strings"
	"testing"

	modeltok "github.com/kvx-dev/kvx/plugins/model/tok"
)

type byteTok struct{}

func (byteTok) Encode(s string) []int32   { return modeltok.EncodeBytes(s) }
func (byteTok) Decode(ids []int32) string { return modeltok.DecodeBytes(ids) }

// TestTextStreamNeverSplitsACharacter: streamed one byte token at a time,
// the deltas are whole UTF-8 characters and add up to the decoded text;
// bytes that are not UTF-8 are not held back forever.
func TestTextStreamNeverSplitsACharacter(t *testing.T) {
	for _, s := range []string{"héllo wörld ✓ 😀", "plain", "bad \xff\xfe bytes", "cut at the end \xe2\x9c"} {
		ids := modeltok.EncodeBytes(s)[1:] // without BOS
		ts := textStream{tok: byteTok{}}
		var got strings.Builder
		for i := range ids {
			last := i == len(ids)-1
			d := ts.next(ids[:i+1], last, false)
			if !last && strings.ContainsRune(d, '\uFFFD') && strings.ToValidUTF8(s, "") == s {
				t.Errorf("%q: delta %q after %d bytes splits a character", s, d, i+1)
			}
			got.WriteString(d)
		}
		if got.String() != s {
			t.Errorf("deltas of %q add up to %q", s, got.String())
		}
	}
}

func TestChatPrompt(t *testing.T) {
	got := ChatPrompt([]string{"system", "user"}, []string{"be brief", "hi"})
	if want := "system: be brief\nuser: hi\nassistant:"; got != want {
		t.Errorf("ChatPrompt = %q, want %q", got, want)
	}
}
