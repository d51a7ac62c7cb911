package worker

import (
	"math/bits"

	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
)

// Placeholder is how a worker on a device without real math (sim) samples:
// placeholder tokens and draft acceptance that depend only on (Config.Seed,
// the sequence, the position), never on the batch, the chunking, the
// backend, the manager or the process. kvx's worker runtime samples by it,
// and so must any other sim worker, so that every backend and manager gives
// the same outputs (the report's outputs digest) on the same trace: the
// tokens are the contract's, only the modelled time is the backend's.
//
//   - The token at position p of sequence s is a hash of (Seed, s, p)
//     mapped uniformly into [0, Vocab) (Token). A sampled token and an MTP
//     draft proposed for p are the same id.
//   - An item's draft k (at position Pos+len(Tokens)-Draft+k) is accepted
//     when a second hash of (Seed, s, that position), read as a number in
//     [0, 1), is below DraftAcceptance; acceptance stops at the first
//     rejection (Accepted).
//
// The zero value is not useful; make one with NewPlaceholder. It is a small
// value, safe to copy and for concurrent use.
type Placeholder struct {
	tokKey, accKey uint64
	vocab          uint64
	accept         float64
}

// NewPlaceholder returns the sampling of a worker configured with seed, a
// model of vocab tokens and draft acceptance (Config.Seed, Model.Vocab,
// Config.DraftAcceptance).
func NewPlaceholder(seed uint64, vocab int, acceptance float64) Placeholder {
	return Placeholder{tokKey: streamKey(seed, saltToken), accKey: streamKey(seed, saltAccept), vocab: uint64(vocab), accept: acceptance}
}

// Salts keep the hash streams of the two uses apart.
const (
	saltToken  = 0x746f6b656e // "token"
	saltAccept = 0x616363657074
)

// Mix is the splitmix64 finalizer: a bijection on uint64 whose output bits
// all depend on all input bits. The placeholder streams are made of it.
func Mix(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}

// streamKey names one hash stream: a seed and a use.
func streamKey(seed, salt uint64) uint64 { return Mix(seed ^ salt) }

// hash is the stream's value at (seq, pos).
func hash(key uint64, seq kvcache.SeqID, pos int) uint64 {
	return Mix(Mix(key^uint64(seq)) ^ uint64(pos))
}

// Token is the placeholder token at position pos of seq, in [0, vocab).
func (p Placeholder) Token(seq kvcache.SeqID, pos int) int32 {
	hi, _ := bits.Mul64(hash(p.tokKey, seq, pos), p.vocab) // uniform in [0, vocab) without a division
	return int32(hi)
}

// Accepted is how many of it's Draft drafts are accepted, in [0, Draft]:
// draft k sits at position it.Pos+len(it.Tokens)-it.Draft+k and is accepted
// when its hash, as a number in [0, 1) with 53 bits, falls below the
// acceptance, until the first rejection.
func (p Placeholder) Accepted(it *Item) int {
	first := it.Pos + len(it.Tokens) - it.Draft
	for k := range it.Draft {
		if float64(hash(p.accKey, it.Seq, first+k)>>11)*(1.0/(1<<53)) >= p.accept {
			return k
		}
	}
	return it.Draft
}
