package cachemgrv2

import (
	"context"

	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
)

// Suspend implements kvcache.Suspender. Only a sequence's private blocks move
// to the host tier (Copies device -> host, in Layout pool ids), and what the
// Hooks move of their own (CanSuspend, Suspended); its shared
// blocks (pages of tree nodes: reused or registered prompt blocks) stay on
// device, referenced and pinned, so no other sequence is affected. Suspended
// sequences come first on the host tier: cached host nodes are evicted to
// make room when free host blocks are short (package doc, Tiers). The ledger
// is kept.
//
// A sequence with an outstanding reservation is refused (false, and an item
// error): the forward it was reserved for may still write its blocks; Commit
// or Unreserve it first. A sequence whose private blocks do not fit on the
// host (free plus evictable cached host blocks), or whose Hooks state does
// not (CanSuspend false), stays resident
// (false). Suspending a suspended sequence is a no-op
// (true). Without a host tier the call fails with ErrUnsupported.
func (c *Core) Suspend(ctx context.Context, seqs []kvcache.SeqID) ([]bool, []kvcache.Copy, error) {
	if err := c.ready(ctx, "Suspend"); err != nil {
		return nil, nil, err
	}
	if !c.hostTier {
		return nil, nil, kvcache.Errorf(kvcache.KindUnsupported, "%s: Suspend: no host tier (host_bytes 0)", c.name)
	}
	ok := make([]bool, len(seqs))
	var copies []kvcache.Copy
	var bad itemErrors
	for i, id := range seqs {
		s := c.seqs[id]
		switch {
		case s == nil:
			bad.add(id, "seq %d: unknown sequence", id)
			continue
		case s.led.Reserved:
			bad.add(id, "seq %d: reservation of tokens %d + draft %d outstanding: Commit or Unreserve it before Suspend",
				id, s.led.Tokens, s.led.Draft)
			continue
		case s.suspended:
			ok[i] = true
			continue
		}
		nPriv, fits := c.hostFits(s)
		if !fits || c.hooks != nil && !c.hooks.CanSuspend(s) {
			continue
		}
		c.touch(s)
		if c.hostReuse() {
			c.hostMakeRoom(nPriv) // suspended sequences come first
		}
		first := c.held(s)
		for g, pool := range c.dev {
			hp := c.host[g]
			for j, b := range s.tables[g] {
				h := NoBlock
				if pool.Owner(b) == nil {
					h = hp.Take(c.pages[:0], 1)[0]
					copies = append(copies, kvcache.Copy{SrcPool: pool.id, SrcBlock: b, DstPool: hp.id, DstBlock: h})
					pool.Unref(b)
					s.tables[g][j] = NoBlock
					first = min(first, j)
				}
				s.host[g] = append(s.host[g], h)
			}
		}
		if c.hooks != nil {
			copies = c.hooks.Suspended(s, copies)
		}
		s.suspended = true
		s.sent = min(s.sent, first)
		ok[i] = true
	}
	c.tree.Prune()
	return ok, copies, bad.err(c.name, "Suspend")
}

// hostFits reports whether s's private blocks (most per group) fit in the
// host pools: their free blocks plus the cached host nodes a Suspend may
// evict.
func (c *Core) hostFits(s *Seq) (most int, fits bool) {
	ev := c.hostEvictableNow()
	fits = true
	for g, pool := range c.dev {
		n := 0
		for _, b := range s.tables[g] {
			if pool.Owner(b) == nil {
				n++
			}
		}
		most = max(most, n)
		if c.host[g].Free()+ev < n {
			fits = false
		}
	}
	return most, fits
}

// Resume implements kvcache.Suspender: it allocates device blocks for a
// suspended sequence's moved blocks (evicting cached unpinned blocks when
// needed), and the Hooks bring their own state back (CanResume, Resumed);
// it returns Copies host -> device; false when they do not fit yet (nothing
// changes). Resuming a resident sequence is a no-op (true). The new
// block ids reach the worker in the sequence's next grant, whose Tables
// replace its table from the first moved block; the worker must not run the
// sequence before that grant (a suspended sequence cannot be granted before
// Resume, so this holds by construction).
func (c *Core) Resume(ctx context.Context, seqs []kvcache.SeqID) ([]bool, []kvcache.Copy, error) {
	if err := c.ready(ctx, "Resume"); err != nil {
		return nil, nil, err
	}
	ok := make([]bool, len(seqs))
	var copies []kvcache.Copy
	var bad itemErrors
	for i, id := range seqs {
		s := c.seqs[id]
		switch {
		case s == nil:
			bad.add(id, "seq %d: unknown sequence", id)
			continue
		case !s.suspended:
			ok[i] = true
			continue
		}
		moved := 0
		if len(s.host) > 0 {
			moved = countPresent(s.host[0])
		}
		if c.roomFor(moved) != "" || c.hooks != nil && !c.hooks.CanResume(s) {
			continue
		}
		c.touch(s)
		// Room: evicted cached nodes move to the host tier when it keeps
		// them (evictOne), their copies first, before the copies that
		// refill those device blocks.
		c.copies, c.resuming = c.copies[:0], true
		c.makeRoom(moved)
		c.resuming = false
		copies = append(copies, c.copies...)
		c.copies = c.copies[:0]
		for g, pool := range c.dev {
			hp := c.host[g]
			for j, h := range s.host[g] {
				if h == NoBlock {
					continue
				}
				b := pool.Take(c.pages[:0], 1)[0]
				copies = append(copies, kvcache.Copy{SrcPool: hp.id, SrcBlock: h, DstPool: pool.id, DstBlock: b})
				hp.Unref(h)
				s.tables[g][j] = b
			}
			s.host[g] = s.host[g][:0]
		}
		if c.hooks != nil {
			copies = c.hooks.Resumed(s, copies)
		}
		s.suspended = false
		ok[i] = true
	}
	c.tree.Prune()
	return ok, copies, bad.err(c.name, "Resume")
}
