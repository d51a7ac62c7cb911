package cachemgrv2

import (
	"context"
	"fmt"
	"slices"

	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
)

// Fork implements kvcache.Forker. Per item, in order, the child takes the
// parent's ledger at its history and the parent's tables: every full block
// by reference (pool.Ref, so a block's reference count says how many
// sequences share it) and the path's tree nodes pinned once more, so the
// child registers and reuses as the parent would. The last partial block,
// which the child's next step writes, is copied on write: a fresh block,
// found like a Reserve's (evicting cached nodes, offloaded to the host tier
// when it keeps them, with their copies first), and a copy of the parent's
// into it. The Hooks add the sequence's own state (mamba: a live slot with a
// copy of the parent's). A denial leaves no trace.
func (c *Core) Fork(ctx context.Context, items []kvcache.ForkItem) ([]kvcache.Grant, error) {
	if err := c.ready(ctx, "Fork"); err != nil {
		return nil, err
	}
	c.tree.Prune() // safe point
	grants := make([]kvcache.Grant, len(items))
	for i, it := range items {
		g := &grants[i]
		g.Seq = it.Child
		if r := c.fork(it, g); r != "" {
			g.Reason = r
			c.stats.ReserveDenials++
			continue
		}
		g.OK = true
	}
	c.tree.Prune()
	return grants, nil
}

func (c *Core) fork(it kvcache.ForkItem, g *kvcache.Grant) string {
	p := c.seqs[it.Parent]
	switch {
	case p == nil:
		return fmt.Sprintf("invalid: fork of seq %d into %d: unknown parent", it.Parent, it.Child)
	case c.seqs[it.Child] != nil:
		return fmt.Sprintf("invalid: fork of seq %d into %d: the child exists", it.Parent, it.Child)
	case p.led.Reserved:
		return fmt.Sprintf("invalid: fork of seq %d into %d: the parent has a reservation outstanding: Commit or Unreserve it first", it.Parent, it.Child)
	case p.suspended:
		return fmt.Sprintf("invalid: fork of seq %d into %d: the parent is on the host tier: Resume it first", it.Parent, it.Child)
	}
	h := p.led.History
	full, nb := h/max(c.tpb, 1), c.blocks(h)
	cow := nb - full // 1 when the history ends inside a block
	if len(c.dev) == 0 {
		full, cow = 0, 0
	}
	if r := c.roomFor(cow); r != "" {
		return fmt.Sprintf("no capacity: fork of seq %d into %d: the last partial block's copy needs %s", it.Parent, it.Child, r)
	}
	if c.hooks != nil {
		if r := c.hooks.CanFork(p, it.Child); r != "" {
			return r
		}
	}
	c.copies, c.resuming = c.copies[:0], true
	c.makeRoom(cow)
	c.resuming = false
	s := c.newSeq(it.Child)
	for gi, pool := range c.dev {
		for _, b := range p.tables[gi][:full] {
			pool.Ref(b)
			s.tables[gi] = append(s.tables[gi], b)
		}
		if cow > 0 {
			s.tables[gi] = pool.Take(s.tables[gi], 1)
			c.copies = append(c.copies, kvcache.Copy{SrcPool: pool.id, SrcBlock: p.tables[gi][full], DstPool: pool.id, DstBlock: s.tables[gi][full]})
		}
	}
	for _, n := range p.path {
		c.tree.Pin(n)
	}
	s.path = append(s.path, p.path...)
	s.headSum, s.tail, s.split, s.nblk = p.headSum, p.tail, p.split, p.nblk // never written: shared
	s.plen, s.salt, s.regStop = p.plen, p.salt, p.regStop
	s.prio, s.until = p.prio, p.until
	s.led = Ledger{History: h, Capacity: h}
	c.seqs[s.id] = s
	c.touch(s)
	c.touch(p)
	g.Copies = slices.Clone(c.copies)
	c.copies = c.copies[:0]
	if c.hooks != nil {
		c.hooks.Forked(p, s, g)
	}
	for gi, pool := range c.dev {
		g.Tables = append(g.Tables, kvcache.TableDelta{Pool: pool.id, Blocks: slices.Clone(s.tables[gi])})
	}
	if c.hooks != nil {
		g.Tables = c.hooks.Tables(s, g.Tables)
	}
	s.sent, s.told = c.held(s), c.held(s)
	return ""
}
