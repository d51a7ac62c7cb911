package workload

import "math/bits"

// Token synthesis. Every run of tokens is a splitmix64 stream started from a
// key; a key is derived from (seed, domain, id) by a bijection in id, so
// distinct ids of one domain never share a key. A shorter run is a prefix of
// a longer run from the same key, which is what lets a truncated last block
// equal the start of the full block with the same hash id.
//
// The algorithm is fixed (no math/rand), so tokens are identical across Go
// versions and platforms: changing it changes every replay's prompts.

const golden = 0x9E3779B97F4A7C15 // splitmix64 increment (odd)

// Key domains: one per kind of token run.
const (
	domainBlock  uint64 = 0x6d6f6f6e63616b65 // Mooncake block, id = hash id
	domainPad    uint64 = 0x70616464696e6721 // Mooncake padding, id = line number
	domainPrefix uint64 = 0x7368617265642d70 // generated shared prefix, id = group
	domainUnique uint64 = 0x756e697175652d74 // generated unique tail, id = request index
	domainShape  uint64 = 0x73686170652d6c65 // generated lengths and arrivals
)

// mix64 is the splitmix64 finalizer, a bijection on uint64.
func mix64(z uint64) uint64 {
	z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9
	z = (z ^ (z >> 27)) * 0x94D049BB133111EB
	return z ^ (z >> 31)
}

// streamKey returns the starting state of the run (seed, domain, id).
func streamKey(seed, domain, id uint64) uint64 {
	return mix64(mix64(seed^domain) + id*golden)
}

// fillTokens writes the first len(dst) tokens of the run that starts at key,
// each in [0, vocab). vocab must be in [1, 1<<31].
func fillTokens(dst []int32, key uint64, vocab uint64) {
	s := key
	i := 0
	for ; i+1 < len(dst); i += 2 {
		s += golden
		z := mix64(s)
		dst[i] = int32((uint64(uint32(z)) * vocab) >> 32)
		dst[i+1] = int32(((z >> 32) * vocab) >> 32)
	}
	if i < len(dst) {
		s += golden
		dst[i] = int32((uint64(uint32(mix64(s))) * vocab) >> 32)
	}
}

// rng is a splitmix64 generator for lengths and arrival gaps.
type rng struct{ s uint64 }

func (r *rng) next() uint64 {
	r.s += golden
	return mix64(r.s)
}

// intn returns a uniform integer in [lo, hi] (unbiased: Lemire's method with
// rejection).
func (r *rng) intn(lo, hi int) int {
	n := uint64(hi-lo) + 1
	for {
		x := r.next()
		hiMul, loMul := bits.Mul64(x, n)
		if loMul >= n || loMul >= (-n)%n {
			return lo + int(hiMul)
		}
	}
}

// float returns a uniform float64 in [0, 1).
func (r *rng) float() float64 {
	return float64(r.next()>>11) / (1 << 53)
}
