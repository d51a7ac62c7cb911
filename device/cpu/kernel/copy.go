package kernel

import (
	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
)

// Pool is one pool's memory as the device owns it: Blocks × BlockBytes bytes.
type Pool struct {
	Data       []byte
	BlockBytes int
}

// Blocks returns the number of whole blocks in Data.
func (p Pool) Blocks() int {
	if p.BlockBytes <= 0 {
		return 0
	}
	return len(p.Data) / p.BlockBytes
}

// Block returns block b's bytes (a sub-slice of Data, not a copy). It panics
// if b is out of range.
func (p Pool) Block(b kvcache.BlockID) []byte {
	at := int(b) * p.BlockBytes
	return p.Data[at : at+p.BlockBytes : at+p.BlockBytes]
}

// CopyBlocks copies whole blocks, pools indexed by kvcache.Copy's SrcPool and
// DstPool: tier moves, SSM snapshots and restores, copy-on-write. Copies run
// in order, so a later copy sees an earlier one's result (A→B then B→C
// copies A's bytes to C). Source and destination pools must have the same
// BlockBytes. Everything is validated first: on error (wrapping kernelspec.ErrInvalid,
// naming the copy index, the field, the value and the limit) nothing is
// copied.
func CopyBlocks(pools []Pool, copies []kvcache.Copy) error {
	for i, c := range copies {
		if c.SrcPool < 0 || c.SrcPool >= len(pools) {
			return invalidf("copy %d: src pool %d, have %d pools", i, c.SrcPool, len(pools))
		}
		if c.DstPool < 0 || c.DstPool >= len(pools) {
			return invalidf("copy %d: dst pool %d, have %d pools", i, c.DstPool, len(pools))
		}
		sp, dp := pools[c.SrcPool], pools[c.DstPool]
		if sp.BlockBytes <= 0 || sp.BlockBytes != dp.BlockBytes {
			return invalidf("copy %d: src pool %d block bytes %d, dst pool %d block bytes %d: must be equal and > 0",
				i, c.SrcPool, sp.BlockBytes, c.DstPool, dp.BlockBytes)
		}
		if c.SrcBlock < 0 || int(c.SrcBlock) >= sp.Blocks() {
			return invalidf("copy %d: src block %d, pool %d has %d blocks", i, c.SrcBlock, c.SrcPool, sp.Blocks())
		}
		if c.DstBlock < 0 || int(c.DstBlock) >= dp.Blocks() {
			return invalidf("copy %d: dst block %d, pool %d has %d blocks", i, c.DstBlock, c.DstPool, dp.Blocks())
		}
	}
	for _, c := range copies {
		copy(pools[c.DstPool].Block(c.DstBlock), pools[c.SrcPool].Block(c.SrcBlock))
	}
	return nil
}

// StateSlot returns the bytes of one layer's state buffer in a state pool's
// block (one block = one sequence's state over all the pool's layers): size
// bytes at offset inside block b. It is a sub-slice of p.Data, not a copy.
func StateSlot(p Pool, b kvcache.BlockID, offset, size int) ([]byte, error) {
	if b < 0 || int(b) >= p.Blocks() {
		return nil, invalidf("state slot: block %d, pool has %d blocks", b, p.Blocks())
	}
	if offset < 0 || size < 0 || offset+size > p.BlockBytes {
		return nil, invalidf("state slot: offset %d + size %d exceeds block bytes %d", offset, size, p.BlockBytes)
	}
	at := int(b)*p.BlockBytes + offset
	return p.Data[at : at+size : at+size], nil
}
