package engine

import (
	"slices"
	"testing"
)

// TestTokenLog holds tokenLog to the slice it replaces, prompt then
// generated tokens in one array, for every span as tokens are appended
// before and after a view across both; and it never writes the caller's
// array, even where that array has room past the prompt.
func TestTokenLog(t *testing.T) {
	backing := []int32{10, 11, 12, 13, 99, 99, 99, 99}
	l := newTokenLog(backing[:4])
	want := slices.Clone(backing[:4])
	check := func(when string) {
		t.Helper()
		if l.Len() != len(want) {
			t.Fatalf("%s: Len %d, want %d", when, l.Len(), len(want))
		}
		for i := range want {
			if l.At(i) != want[i] {
				t.Fatalf("%s: At(%d) = %d, want %d", when, i, l.At(i), want[i])
			}
		}
		for a := 0; a <= len(want); a++ {
			for b := a; b <= len(want); b++ {
				if got := l.Span(a, b); !slices.Equal(got, want[a:b]) || cap(got) != b-a {
					t.Fatalf("%s: Span(%d, %d) = %v (cap %d), want %v capped", when, a, b, got, cap(got), want[a:b])
				}
			}
		}
		if !slices.Equal(l.Generated(), want[4:]) || !slices.Equal(l.Prompt(), want[:4]) {
			t.Fatalf("%s: Prompt %v, Generated %v, want %v then %v", when, l.Prompt(), l.Generated(), want[:4], want[4:])
		}
	}
	check("new")
	l.Append(20)
	want = append(want, 20)
	check("one generated") // Span(3, 5) joins them
	l.Append(21, 22)
	want = append(want, 21, 22)
	check("after the join")
	if !slices.Equal(backing, []int32{10, 11, 12, 13, 99, 99, 99, 99}) {
		t.Errorf("the caller's array became %v", backing)
	}
	// A view taken before more tokens came keeps its tokens.
	old := l.All()
	l.Append(23)
	if !slices.Equal(old, want) {
		t.Errorf("an earlier view became %v, want %v", old, want)
	}
}
