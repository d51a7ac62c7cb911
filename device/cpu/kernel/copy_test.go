package kernel

import (
	"bytes"
	"errors"
	"testing"

	"github.com/kvx-dev/kvx/device/kernelspec"
	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
)

func TestCopyBlocksInOrderAcrossPools(t *testing.T) {
	mk := func(blocks, bb int, base byte) Pool {
		p := Pool{Data: make([]byte, blocks*bb), BlockBytes: bb}
		for i := range p.Data {
			p.Data[i] = base + byte(i/bb)
		}
		return p
	}
	dev, host, other := mk(4, 6, 0), mk(3, 6, 100), mk(2, 5, 200)
	pools := []Pool{dev, host, other}
	err := CopyBlocks(pools, []kvcache.Copy{
		{SrcPool: 0, SrcBlock: 1, DstPool: 1, DstBlock: 2}, // device -> host
		{SrcPool: 1, SrcBlock: 2, DstPool: 0, DstBlock: 3}, // host -> device: sees the first copy
		{SrcPool: 0, SrcBlock: 0, DstPool: 0, DstBlock: 0}, // self: no-op
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		p    Pool
		b    kvcache.BlockID
		want byte
	}{{host, 2, 1}, {dev, 3, 1}, {dev, 0, 0}, {dev, 2, 2}, {host, 0, 100}} {
		if got := c.p.Block(c.b); !bytes.Equal(got, bytes.Repeat([]byte{c.want}, 6)) {
			t.Errorf("block %d = %v, want all %d", c.b, got, c.want)
		}
	}
	before := append([]byte(nil), dev.Data...)
	for _, bad := range [][]kvcache.Copy{
		{{SrcPool: 0, SrcBlock: 0, DstPool: 0, DstBlock: 1}, {SrcPool: 0, SrcBlock: 4, DstPool: 0, DstBlock: 0}},
		{{SrcPool: 0, SrcBlock: 0, DstPool: 2, DstBlock: 0}},
		{{SrcPool: 3, SrcBlock: 0, DstPool: 0, DstBlock: 0}},
		{{SrcPool: 0, SrcBlock: 0, DstPool: 1, DstBlock: -1}},
	} {
		err := CopyBlocks(pools, bad)
		if !errors.Is(err, kernelspec.ErrInvalid) {
			t.Errorf("CopyBlocks(%v) = %v, want kernelspec.ErrInvalid", bad, err)
		}
		t.Log(err)
	}
	if !bytes.Equal(dev.Data, before) {
		t.Errorf("a refused copy list changed the pool")
	}
	if _, err := StateSlot(dev, 1, 4, 3); !errors.Is(err, kernelspec.ErrInvalid) {
		t.Errorf("StateSlot past the block: %v, want kernelspec.ErrInvalid", err)
	}
}
