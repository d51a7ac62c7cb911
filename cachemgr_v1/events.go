package cachemgrv1

import (
	"context"
	"slices"

	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
	"github.com/zeebo/xxh3"
)

var _ kvcache.EventReporter = (*Manager)(nil)

// events records KV events (Config.KVEvents with block reuse on). They
// describe the first paged pool: every pool registers the same chain hashes
// for the same prompt blocks, and Lookup needs the first pool to hold a
// block. A block's event hash is the low 64 bits of its 128-bit chain hash,
// so it names the salt and the whole prefix, like the chain.
//
// Off (the default), nothing is recorded and nothing kept: sequences keep
// their prompt blocks only for the tokens of BlockStored.
type events struct {
	on   bool
	list []kvcache.Event
}

func (e *events) add(ev kvcache.Event) { e.list = append(e.list, ev) }

// stored records that prompt block j of s became cached content. Blocks
// registered one after another by one commit join one BlockStored.
func (e *events) stored(s *sequence, j, tpb int) {
	h := s.hashes[j].Lo
	toks := s.prompt[j*tpb : (j+1)*tpb]
	if k := len(e.list) - 1; k >= 0 {
		last := &e.list[k]
		if last.Kind == kvcache.BlockStored && j > 0 && last.Hashes[len(last.Hashes)-1] == s.hashes[j-1].Lo {
			last.Hashes = append(last.Hashes, h)
			last.Tokens = append(last.Tokens, toks...)
			return
		}
	}
	ev := kvcache.Event{
		Kind: kvcache.BlockStored, Hashes: []uint64{h}, Tokens: append([]int32(nil), toks...),
		BlockSize: tpb, Tier: kvcache.TierDevice,
	}
	if j > 0 {
		ev.Parent, ev.HasParent = s.hashes[j-1].Lo, true
	}
	e.add(ev)
}

// removed records the eviction of the cached block whose chain hash is h;
// evictions one after another join one BlockRemoved.
func (e *events) removed(h xxh3.Uint128) {
	if k := len(e.list) - 1; k >= 0 && e.list[k].Kind == kvcache.BlockRemoved {
		e.list[k].Hashes = append(e.list[k].Hashes, h.Lo)
		return
	}
	e.add(kvcache.Event{Kind: kvcache.BlockRemoved, Hashes: []uint64{h.Lo}, Tier: kvcache.TierDevice})
}

// unremove takes hash h out of the unread BlockRemoved events (the
// eviction was undone) and reports whether it was there.
func (e *events) unremove(h xxh3.Uint128) bool {
	for k := len(e.list) - 1; k >= 0; k-- {
		ev := &e.list[k]
		if ev.Kind != kvcache.BlockRemoved {
			continue
		}
		if i := slices.Index(ev.Hashes, h.Lo); i >= 0 {
			ev.Hashes = slices.Delete(ev.Hashes, i, i+1)
			if len(ev.Hashes) == 0 {
				e.list = slices.Delete(e.list, k, k+1)
			}
			return true
		}
	}
	return false
}

// Events implements kvcache.EventReporter: the events since the last call
// (none unless Configure had KVEvents and block reuse on), oldest first.
func (m *Manager) Events(ctx context.Context) ([]kvcache.Event, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	out := m.ev.list
	m.ev.list = nil
	return out, nil
}
