package cachemgrv1

import (
	"context"

	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
	"github.com/zeebo/xxh3"
)

var _ kvcache.EventReporter = (*Manager)(nil)

// events records KV events (Config.KVEvents with block reuse on). They
// describe the first paged pool and its host pool: every pool registers the
// same chain hashes for the same prompt blocks, and Lookup needs the first
// pool to hold a block. A block's event hash is the low 64 bits of its
// 128-bit chain hash, so it names the salt and the whole prefix, like the
// chain.
//
// The device tier: BlockStored (with the tokens and the parent) when a
// prompt block becomes cached content, or when a promotion brings it back
// from the host tier; BlockRemoved when its hash leaves the device pool.
//
// The host tier (hostcache.go), Tier kvcache.TierHost: BlockStored when an
// evicted block's content settles on the host, i.e. when the reservation
// whose grant carried the offload copy is committed or released (an
// Unreserve drops the copy: nothing is recorded); it carries the hash and
// BlockSize only (no tokens, no parent: the host keeps single blocks, not
// chains). BlockRemoved when a host block whose BlockStored was recorded
// loses its hash: evicted by an offload, taken by a promotion, or taken
// back by a device commit of the same content. The device's BlockRemoved
// of an offloaded block is recorded as without a host tier, when the
// device evicts it. Configure reports AllBlocksCleared for both tiers.
//
// Events of one kind and tier recorded one after another join one event;
// events of different tiers never do.
//
// Off (the default), nothing is recorded and nothing kept: sequences keep
// their prompt blocks only for the tokens of BlockStored.
type events struct {
	on bool
	kvcache.EventLog
}

// stored records that prompt block j of s became cached content. Blocks
// registered one after another by one commit join one BlockStored.
func (e *events) stored(s *sequence, j, tpb int) {
	var parent uint64
	if j > 0 {
		parent = s.hashes[j-1].Lo
	}
	e.Stored(s.hashes[j].Lo, parent, j > 0, s.prompt[j*tpb:(j+1)*tpb], tpb)
}

// storedHost records that the content of the cached block whose chain hash
// is h settled on the host tier.
func (e *events) storedHost(h xxh3.Uint128, tpb int) { e.StoredHost(h.Lo, tpb) }

// removed records that the cached block whose chain hash is h left tier t.
func (e *events) removed(h xxh3.Uint128, t kvcache.Tier) { e.Removed(t, h.Lo) }

// removedDevice and removedHost are removed for one tier: the pools'
// eviction hooks (pool.evicted).
func (e *events) removedDevice(h xxh3.Uint128) { e.removed(h, kvcache.TierDevice) }
func (e *events) removedHost(h xxh3.Uint128)   { e.removed(h, kvcache.TierHost) }

// unremove takes hash h out of the unread BlockRemoved events of tier t
// (the removal was undone) and reports whether it was there.
func (e *events) unremove(h xxh3.Uint128, t kvcache.Tier) bool { return e.Unremove(t, h.Lo) }

// Events implements kvcache.EventReporter: the events since the last call
// (none unless Configure had KVEvents and block reuse on), oldest first.
func (m *Manager) Events(ctx context.Context) ([]kvcache.Event, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return m.ev.Take(), nil
}
