package cachemgrv1

import (
	"encoding/binary"
	"testing"

	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
	"github.com/zeebo/xxh3"
)

func TestHashChain(t *testing.T) {
	const tpb = 4
	h := newHasher(tpb)
	a := []int32{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, -7}
	b := []int32{1, 2, 3, 4, 5, 6, 7, 9, 9, 10, 11, 12}
	ha := h.chain(nil, "", a, 3)
	hb := h.chain(nil, "", b, 3)
	if ha[0] != hb[0] || ha[1] == hb[1] || ha[2] == hb[2] {
		t.Errorf("chains a %v b %v: want equal first hashes, then different from the first differing block on", ha, hb)
	}
	// A block's hash depends on its parent: block 2 of a and b holds the
	// same tokens, after different parents.
	if h.next(xxh3.Uint128{}, a[8:12]) == ha[2] {
		t.Errorf("block hash ignores its parent")
	}
	// The fast path (memory copy of the tokens) equals the portable encoding.
	buf := make([]byte, 16+4*tpb)
	var parent xxh3.Uint128
	for j := range 3 {
		binary.LittleEndian.PutUint64(buf[0:], parent.Hi)
		binary.LittleEndian.PutUint64(buf[8:], parent.Lo)
		for i, v := range a[j*tpb : (j+1)*tpb] {
			binary.LittleEndian.PutUint32(buf[16+4*i:], uint32(v))
		}
		parent = xxh3.Hash128(buf)
		if parent != ha[j] {
			t.Fatalf("block %d: hash %v, portable encoding gives %v", j, ha[j], parent)
		}
	}
}

// TestHashIndexAgainstMap drives the pool's open-addressing index with
// clustered, wrapping home slots and compares it with a Go map after every
// register and removal.
func TestHashIndexAgainstMap(t *testing.T) {
	const n = 16 // index of 32 slots
	p := newPool(0, 0, 4, n, true)
	model := map[xxh3.Uint128]int32{}
	r := newLCG(42)
	key := func() xxh3.Uint128 {
		// Homes 28..35 mod 32: long runs that wrap around the end.
		return xxh3.Uint128{Hi: uint64(r.n(3)), Lo: uint64(28 + r.n(8))}
	}
	for step := range 20000 {
		b := int32(r.n(n))
		if p.hashed[b] {
			delete(model, p.hash[b])
			p.unindex(b)
			p.hashed[b] = false
		} else {
			h := key()
			_, dup := model[h]
			p.register(kvcache.BlockID(b), h)
			if p.hashed[b] == dup {
				t.Fatalf("step %d: register(%d, %v) registered=%v with duplicate=%v", step, b, h, p.hashed[b], dup)
			}
			if !dup {
				model[h] = b
			}
		}
		if p.nreg != len(model) {
			t.Fatalf("step %d: %d registered, model %d", step, p.nreg, len(model))
		}
		for hi := range 3 {
			for lo := 28; lo < 36; lo++ {
				h := xxh3.Uint128{Hi: uint64(hi), Lo: uint64(lo)}
				want, ok := model[h]
				got, found := p.lookup(h)
				if ok != found || ok && int32(got) != want {
					t.Fatalf("step %d: lookup(%v) = %d, %v; want %d, %v", step, h, got, found, want, ok)
				}
			}
		}
	}
}
