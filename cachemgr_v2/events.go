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
//
// Device events (TierDevice) follow a node's device pages: a node the
// device evicts is removed there, one promoted back from the host tier (or
// adopted by a registration) is stored. With a host tier for reuse, host
// events (TierHost) follow its settled host content: an offload is stored
// on the host tier once its copy was handed to the worker (the reservation
// committed or released; at once for Resume's), without tokens or parent
// (the device's BlockStored named them), and removed when that content goes
// (a host eviction, a promotion's copy done, a registration that adopts a
// device copy). A pending offload that is undone records nothing there.
// Stores and removals one after another, on one tier, join one event.
//
// Off (Tree.ev nil), no chain is computed and nothing recorded.
type events struct {
	kvcache.EventLog
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
	e.Stored(n.chain, n.parent.chain, n.parent != t.root, n.tokens, t.tpb)
}

// hostStored records, with events on, that n's host content is settled.
func (t *Tree) hostStored(n *Node) {
	if t.ev != nil && !n.h.told {
		t.touch(n)
		n.h.told = true
		t.ev.StoredHost(n.chain, t.tpb)
	}
}

// hostRemoved records that n's settled host content, which a host
// BlockStored announced, is going.
func (t *Tree) hostRemoved(n *Node) {
	if n.h.told {
		t.touch(n)
		n.h.told = false
		t.ev.Removed(kvcache.TierHost, n.chain)
	}
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
	return c.tree.ev.Take(), nil
}

// ChainHash is n's KV event hash (0 with events off).
func (n *Node) ChainHash() uint64 { return n.chain }
