package cachemgrv1

import (
	"encoding/binary"
	"unsafe"

	"github.com/zeebo/xxh3"
)

// littleEndian is true when int32 tokens are laid out in memory as their
// little-endian encoding, so they can be copied into the hash input at once.
var littleEndian = binary.NativeEndian.Uint16([]byte{1, 0}) == 1

// hasher computes the hash chain over a prompt's full blocks:
//
//	h[0] = xxh3-128(root(salt) || tokens[0:tpb])
//	h[j] = xxh3-128(h[j-1]     || tokens[j*tpb:(j+1)*tpb])
//
// with hashes and tokens little-endian, where root("") is zero (the chain of
// an unsalted prompt is what it always was) and root(salt) is saltRoot's
// hash of the request's cache_salt, so the chains of two salts share no
// block. A block's hash therefore names the
// whole prefix up to its end. 128 bits make accidental collisions (which
// would hand a request another prompt's KV) negligible; xxh3 is not meant to
// resist crafted collisions.
type hasher struct {
	tpb int
	buf []byte // 16 + 4*tpb bytes, reused
}

func newHasher(tpb int) hasher {
	return hasher{tpb: tpb, buf: make([]byte, 16+4*tpb)}
}

// next returns the hash of the full block toks (len tpb) after parent.
func (h *hasher) next(parent xxh3.Uint128, toks []int32) xxh3.Uint128 {
	b := h.buf[:16+4*len(toks)]
	binary.LittleEndian.PutUint64(b[0:], parent.Hi)
	binary.LittleEndian.PutUint64(b[8:], parent.Lo)
	t := b[16:]
	if littleEndian && len(toks) > 0 {
		copy(t, unsafe.Slice((*byte)(unsafe.Pointer(&toks[0])), 4*len(toks)))
	} else {
		for i, v := range toks {
			binary.LittleEndian.PutUint32(t[4*i:], uint32(v))
		}
	}
	return xxh3.Hash128(b)
}

// saltRoot is the parent of a prompt's first block under cache salt salt:
// zero for "", else a domain-separated xxh3-128 of the salt (never zero in
// practice, so no salt shares the unsalted chain).
func saltRoot(salt string) xxh3.Uint128 {
	if salt == "" {
		return xxh3.Uint128{}
	}
	return xxh3.HashString128("kvx/cache_salt\x00" + salt)
}

// chain appends the hashes of the first nblocks full blocks of prompt under
// salt to dst.
func (h *hasher) chain(dst []xxh3.Uint128, salt string, prompt []int32, nblocks int) []xxh3.Uint128 {
	parent := saltRoot(salt)
	for j := 0; j < nblocks; j++ {
		parent = h.next(parent, prompt[j*h.tpb:(j+1)*h.tpb])
		dst = append(dst, parent)
	}
	return dst
}
