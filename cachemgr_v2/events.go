package cachemgrv2

import (
	"context"
	"slices"
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
		if last.Kind == kvcache.BlockStored && last.Tier == kvcache.TierDevice && last.Hashes[len(last.Hashes)-1] == n.parent.chain {
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

// storedHost records that the host tier settled the content of the node
// whose hash is h.
func (e *events) storedHost(h uint64, tpb int) {
	if k := len(e.list) - 1; k >= 0 && e.list[k].Kind == kvcache.BlockStored && e.list[k].Tier == kvcache.TierHost {
		e.list[k].Hashes = append(e.list[k].Hashes, h)
		return
	}
	e.list = append(e.list, kvcache.Event{Kind: kvcache.BlockStored, Hashes: []uint64{h}, BlockSize: tpb, Tier: kvcache.TierHost})
}

// removed records that the node whose hash is h lost its content on tier.
func (e *events) removed(h uint64, tier kvcache.Tier) {
	if k := len(e.list) - 1; k >= 0 && e.list[k].Kind == kvcache.BlockRemoved && e.list[k].Tier == tier {
		e.list[k].Hashes = append(e.list[k].Hashes, h)
		return
	}
	e.list = append(e.list, kvcache.Event{Kind: kvcache.BlockRemoved, Hashes: []uint64{h}, Tier: tier})
}

// unremove takes hash h out of the unread BlockRemoved events of tier (the
// removal was undone) and reports whether it was there.
func (e *events) unremove(h uint64, tier kvcache.Tier) bool {
	for k := len(e.list) - 1; k >= 0; k-- {
		ev := &e.list[k]
		if ev.Kind != kvcache.BlockRemoved || ev.Tier != tier {
			continue
		}
		if i := slices.Index(ev.Hashes, h); i >= 0 {
			ev.Hashes = slices.Delete(ev.Hashes, i, i+1)
			if len(ev.Hashes) == 0 {
				e.list = slices.Delete(e.list, k, k+1)
			}
			return true
		}
	}
	return false
}

// hostStored records, with events on, that n's host content is settled.
func (t *Tree) hostStored(n *Node) {
	if t.ev != nil && !n.h.told {
		t.touch(n)
		n.h.told = true
		t.ev.storedHost(n.chain, t.tpb)
	}
}

// hostRemoved records that n's settled host content, which a host
// BlockStored announced, is going.
func (t *Tree) hostRemoved(n *Node) {
	if n.h.told {
		t.touch(n)
		n.h.told = false
		t.ev.removed(n.chain, kvcache.TierHost)
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
	out := c.tree.ev.list
	c.tree.ev.list = nil
	return out, nil
}

// ChainHash is n's KV event hash (0 with events off).
func (n *Node) ChainHash() uint64 { return n.chain }
