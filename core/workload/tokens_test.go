package workload

import (
	"testing"

	"pgregory.net/rapid"
)

// A shorter run is a prefix of a longer run from the same key, and every
// token is inside the vocabulary.
func TestFillTokensPrefixAndRange(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		key := rapid.Uint64().Draw(t, "key")
		vocab := rapid.IntRange(2, MaxVocab).Draw(t, "vocab")
		long := rapid.IntRange(0, 700).Draw(t, "long")
		short := rapid.IntRange(0, long).Draw(t, "short")
		a := make([]int32, long)
		b := make([]int32, short)
		fillTokens(a, key, uint64(vocab))
		fillTokens(b, key, uint64(vocab))
		for i, v := range b {
			if v != a[i] {
				t.Fatalf("token %d of a %d-token run = %d, of a %d-token run = %d", i, short, v, long, a[i])
			}
		}
		for i, v := range a {
			if v < 0 || int(v) >= vocab {
				t.Fatalf("token %d = %d, want in [0, %d)", i, v, vocab)
			}
		}
	})
}

// Distinct ids (and domains) give distinct keys and distinct blocks.
func TestStreamKeysDistinct(t *testing.T) {
	seen := make(map[uint64]string)
	blocks := make(map[[8]int32]uint64)
	for _, d := range []uint64{domainBlock, domainPad, domainPrefix, domainUnique, domainShape} {
		for id := range uint64(20000) {
			k := streamKey(7, d, id)
			if prev, ok := seen[k]; ok {
				t.Fatalf("streamKey(7, %#x, %d) = %#x, same as %s", d, id, k, prev)
			}
			seen[k] = "another id"
			if d == domainBlock {
				var blk [8]int32
				fillTokens(blk[:], k, DefaultVocab)
				if prev, ok := blocks[blk]; ok {
					t.Fatalf("blocks of hash ids %d and %d start with the same 8 tokens %v", prev, id, blk)
				}
				blocks[blk] = id
			}
		}
	}
	if streamKey(1, domainBlock, 5) == streamKey(2, domainBlock, 5) {
		t.Fatal("seeds 1 and 2 give the same key for hash id 5")
	}
}

func TestRNGIntnBounds(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		lo := rapid.IntRange(-1000, 1<<40).Draw(t, "lo")
		hi := rapid.IntRange(lo, lo+rapid.IntRange(0, 1<<40).Draw(t, "span")).Draw(t, "hi")
		r := rng{s: rapid.Uint64().Draw(t, "seed")}
		for range 50 {
			if v := r.intn(lo, hi); v < lo || v > hi {
				t.Fatalf("intn(%d, %d) = %d", lo, hi, v)
			}
			if f := r.float(); f < 0 || f >= 1 {
				t.Fatalf("float() = %v, want in [0, 1)", f)
			}
		}
	})
}

// Every value of a small range comes up, about equally often.
func TestRNGIntnUniform(t *testing.T) {
	r := rng{s: 42}
	const n, draws = 7, 70000
	var counts [n]int
	for range draws {
		counts[r.intn(10, 10+n-1)-10]++
	}
	for v, c := range counts {
		if c < draws/n*9/10 || c > draws/n*11/10 {
			t.Errorf("value %d drawn %d times of %d, want about %d", 10+v, c, draws, draws/n)
		}
	}
}
