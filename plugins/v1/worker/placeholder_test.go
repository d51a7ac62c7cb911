package worker

import (
	"slices"
	"testing"
)

// TestPlaceholderPinned pins the placeholder rule's values: they are the
// contract's, so every sim worker built against any revision of this
// package gives the same tokens; a change here changes every outputs
// digest on the sim device.
func TestPlaceholderPinned(t *testing.T) {
	p := NewPlaceholder(11, 129280, 0.5)
	if got, want := []int32{p.Token(0, 0), p.Token(7, 1000), p.Token(1<<40, 3)}, []int32{48295, 39295, 17682}; !slices.Equal(got, want) {
		t.Errorf("tokens %v, want %v", got, want)
	}
	var got []int
	it := Item{Seq: 5, Tokens: make([]int32, 4), Draft: 3}
	for pos := 100; pos < 108; pos++ {
		it.Pos = pos
		got = append(got, p.Accepted(&it))
	}
	if want := []int{1, 0, 1, 0, 1, 0, 0, 2}; !slices.Equal(got, want) {
		t.Errorf("accepted drafts %v, want %v", got, want)
	}
	for _, a := range []float64{0, 1} {
		it.Pos = 100
		if n := NewPlaceholder(11, 100, a).Accepted(&it); n != int(a)*it.Draft {
			t.Errorf("acceptance %g: %d of %d drafts accepted", a, n, it.Draft)
		}
	}
	for pos := range 1000 {
		if tok := NewPlaceholder(3, 7, 0).Token(9, pos); tok < 0 || tok >= 7 {
			t.Fatalf("Token(9, %d) = %d, outside a vocabulary of 7", pos, tok)
		}
	}
}
