package cachemgrv2

import (
	"context"
	"unsafe"

	"github.com/zeebo/xxh3"

	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
)

var _ kvcache.EventReporter = (*Core)(nil)

// events records the tree's KV events (Config.KVEvents with prefix reuse
// on): a node that adopts pages is stored, a node that loses them is
// removed. A node's event hash chains xxh3 over the blocks from the root,
// seeded at the root with the cache salt's hash (0 for no salt), so equal
// hashes mean the same salt and the same tokens from the prompt's start.
// Events describe the device tier (every event is of TierDevice): a node
// the device evicts to the host tier is removed, one promoted back (or
// adopted by a registration) is stored.
//
// Off (Tree.ev nil), no chain is computed and nothing recorded.
type events struct {
	list []kvcache.Event
}

// chain is the event hash of node n, child of parent, under salt.
func (e *events) chain(parent, n *Node, salt string) uint64 {
	seed := parent.chain
	if parent.parent == nil { // the root
		seed = 0
		if salt != "" {
			seed = xxh3.HashString("kvx/cache_salt\x00" + salt)
		}
	}
	if len(n.tokens) == 0 {
		return xxh3.HashSeed(nil, seed)
	}
	return xxh3.HashSeed(unsafe.Slice((*byte)(unsafe.Pointer(&n.tokens[0])), 4*len(n.tokens)), seed)
}

// stored records that n adopted pages; a child of the node stored just
// before joins its event.
func (e *events) stored(t *Tree, n *Node) {
	hasParent := n.parent != t.root
	if k := len(e.list) - 1; k >= 0 && hasParent {
		last := &e.list[k]
		if last.Kind == kvcache.BlockStored && last.Hashes[len(last.Hashes)-1] == n.parent.chain {
			last.Hashes = append(last.Hashes, n.chain)
			last.Tokens = append(last.Tokens, n.tokens...)
			return
		}
	}
	ev := kvcache.Event{
		Kind: kvcache.BlockStored, Hashes: []uint64{n.chain}, Tokens: append([]int32(nil), n.tokens...),
		BlockSize: t.tpb, Tier: kvcache.TierDevice,
	}
	if hasParent {
		ev.Parent, ev.HasParent = n.parent.chain, true
	}
	e.list = append(e.list, ev)
}

// removed records that n lost its pages; evictions one after another join
// one BlockRemoved.
func (e *events) removed(n *Node) {
	if k := len(e.list) - 1; k >= 0 && e.list[k].Kind == kvcache.BlockRemoved {
		e.list[k].Hashes = append(e.list[k].Hashes, n.chain)
		return
	}
	e.list = append(e.list, kvcache.Event{Kind: kvcache.BlockRemoved, Hashes: []uint64{n.chain}, Tier: kvcache.TierDevice})
}

// Events implements kvcache.EventReporter: the events recorded since the
// last call (none unless Configure had KVEvents and prefix reuse on), oldest
// first.
func (c *Core) Events(ctx context.Context) ([]kvcache.Event, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if c.tree == nil || c.tree.ev == nil {
		return nil, nil
	}
	out := c.tree.ev.list
	c.tree.ev.list = nil
	return out, nil
}

// ChainHash is n's KV event hash (0 with events off).
func (n *Node) ChainHash() uint64 { return n.chain }
