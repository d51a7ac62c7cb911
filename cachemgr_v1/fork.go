package cachemgrv1

import (
	"context"
	"fmt"
	"slices"

	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
)

var _ kvcache.Forker = (*Manager)(nil)

// Fork implements kvcache.Forker. Per item, in order, the child takes the
// parent's history and hash chain (so it registers the prompt blocks it
// completes as the parent would) and, in every paged pool, the parent's
// full blocks by reference; the last partial block, which the child's next
// step writes, is a fresh block (found as Reserve finds one: evicting a
// cached block, to the host tier when it keeps them) with a copy of the
// parent's into it; a state pool gives the child a slot with a copy of the
// parent's state. A parent whose sliding-window pool has released blocks
// that left its window is denied: the worker would get a table with holes.
// A denial leaves no trace.
func (m *Manager) Fork(ctx context.Context, items []kvcache.ForkItem) ([]kvcache.Grant, error) {
	if err := m.ready(ctx, "Fork"); err != nil {
		return nil, err
	}
	grants := make([]kvcache.Grant, len(items))
	for i, it := range items {
		g := &grants[i]
		g.Seq = it.Child
		if r := m.fork(it, g); r != "" {
			g.Reason = r
			m.c.denials++
			continue
		}
		g.OK = true
	}
	return grants, nil
}

func (m *Manager) fork(it kvcache.ForkItem, g *kvcache.Grant) string {
	p := m.seqs[it.Parent]
	switch {
	case p == nil:
		return fmt.Sprintf("invalid: fork of seq %d into %d: unknown parent", it.Parent, it.Child)
	case m.seqs[it.Child] != nil:
		return fmt.Sprintf("invalid: fork of seq %d into %d: the child exists", it.Parent, it.Child)
	case p.reserved:
		return fmt.Sprintf("invalid: fork of seq %d into %d: the parent has a reservation outstanding: Commit or Unreserve it first", it.Parent, it.Child)
	}
	h := p.history
	nb, full := kvcache.BlocksFor(h, m.tpb), h/m.tpb
	cow := nb - full
	for pi, pool := range m.paged {
		if p.stale[pi] > 0 {
			return fmt.Sprintf("unsupported: fork of seq %d into %d: pool %d (%s) released %d blocks that left its window", it.Parent, it.Child, pool.id, m.names[pool.id], p.stale[pi])
		}
		if cow > pool.available() {
			return fmt.Sprintf("no capacity: fork of seq %d into %d: pool %d (%s) has no block for the copy of the last partial block (%d free + %d evictable)",
				it.Parent, it.Child, pool.id, m.names[pool.id], len(pool.free), pool.cached)
		}
	}
	if m.ssm != nil && len(m.ssm.free) == 0 {
		return fmt.Sprintf("no capacity: fork of seq %d into %d: pool %d (ssm) has no free state slot: all %s are held by resident sequences",
			it.Parent, it.Child, m.ssm.id, commas(m.ssm.n))
	}
	s := m.newSeq(it.Child)
	m.cur = s
	m.copies = m.copies[:0]
	s.history, s.capacity = h, h
	s.prio, s.exp = p.prio, p.exp
	s.registered = p.registered
	s.hashes = append(s.hashes[:0], p.hashes...)
	s.sfree = append(s.sfree[:0], p.sfree...)
	s.prompt = append(s.prompt[:0], p.prompt...)
	if m.ssm != nil {
		s.slot = m.ssm.alloc()
		m.copies = append(m.copies, kvcache.Copy{SrcPool: m.ssm.id, SrcBlock: p.slot, DstPool: m.ssm.id, DstBlock: s.slot})
		g.Tables = append(g.Tables, kvcache.TableDelta{Pool: m.ssm.id, Blocks: []kvcache.BlockID{s.slot}})
	}
	for pi, pool := range m.paged {
		t := s.tables[pi]
		for _, b := range p.tables[pi][:full] {
			pool.ref[b]++
			pool.touch(int32(b))
			t = append(t, b)
		}
		if cow > 0 {
			b := m.allocDev(pi)
			m.copies = append(m.copies, kvcache.Copy{SrcPool: pool.id, SrcBlock: p.tables[pi][full], DstPool: pool.id, DstBlock: b})
			t = append(t, b)
		}
		s.tables[pi] = t
		n := int32(len(t))
		s.told[pi], s.keep[pi] = n, n
		g.Tables = append(g.Tables, kvcache.TableDelta{Pool: pool.id, Blocks: slices.Clone(t)})
	}
	g.Copies = slices.Clone(m.copies)
	m.copies = m.copies[:0]
	if len(s.moved) > 0 {
		m.settle(s, true) // the offloads' copies go to the worker with the grant
	}
	s.evicted = s.evicted[:0]
	m.cur = nil
	m.seqs[s.id] = s
	return ""
}
