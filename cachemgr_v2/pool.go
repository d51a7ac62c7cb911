package cachemgrv2

import "github.com/kvx-dev/kvx/plugins/v1/kvcache"

// NoBlock marks an absent block: a page a tree node does not hold, or a table
// entry that lives on the host tier while its sequence is suspended.
const NoBlock kvcache.BlockID = -1

// BlockPool allocates the fixed-size blocks of one pool on one tier. It keeps
// metadata only: the worker owns the memory behind the ids.
//
// Every block is in exactly one state:
//
//	free    refs == 0, no owner: on the free stack
//	cached  refs == 0, owned by a tree node: evictable through the Tree
//	in use  refs > 0: private to one sequence, or a node's page shared by all
//	        sequences whose path pins that node
//
// Methods assume correct use (the Manager validates first); the Manager's
// self-check recomputes the states. Not safe for concurrent use.
type BlockPool struct {
	id     int
	tier   kvcache.Tier
	free   []kvcache.BlockID // stack; the top is the next block handed out
	refs   []int32
	owner  []*Node
	cached int
	// holds counts, per block, the pending host moves that hold it (host
	// pools with a host tier for reuse; nil otherwise): see hostreuse.go.
	holds []int32
	ck    poolCheck // the incremental deep check's marks, shadows and recounts (dirty.go)
	gen   []uint32  // allocations of each block (Take): undo.go's proof that nothing wrote it since
}

// NewBlockPool returns a pool of n free blocks with ids 0..n-1 (handed out in
// that order) that reports itself as pool id on tier.
func NewBlockPool(id int, tier kvcache.Tier, n int) *BlockPool {
	p := &BlockPool{
		id:    id,
		tier:  tier,
		free:  make([]kvcache.BlockID, n),
		refs:  make([]int32, n),
		owner: make([]*Node, n),
		// Each block is on the dirty list at most once: room for all of
		// them up front, not a doubling at each growth.
		ck:  poolCheck{mark: make([]bool, n), dirty: make([]kvcache.BlockID, 0, n)},
		gen: make([]uint32, n),
	}
	for i := range p.free {
		p.free[i] = kvcache.BlockID(n - 1 - i)
	}
	return p
}

// ID is the pool's id in the Layout.
func (p *BlockPool) ID() int { return p.id }

// Tier is where the pool's blocks live.
func (p *BlockPool) Tier() kvcache.Tier { return p.tier }

// Total is the number of blocks.
func (p *BlockPool) Total() int { return len(p.refs) }

// Free is the number of free blocks.
func (p *BlockPool) Free() int { return len(p.free) }

// Cached is the number of unreferenced blocks that hold a tree node's content.
func (p *BlockPool) Cached() int { return p.cached }

// Refs is the number of sequences referencing b.
func (p *BlockPool) Refs(b kvcache.BlockID) int32 { return p.refs[b] }

// Owner is the tree node holding b as a page; nil for private and free blocks.
func (p *BlockPool) Owner(b kvcache.BlockID) *Node { return p.owner[b] }

// Stats counts the pool's blocks by state.
func (p *BlockPool) Stats() kvcache.PoolStats {
	free := len(p.free)
	return kvcache.PoolStats{
		Pool:   p.id,
		Total:  len(p.refs),
		Free:   free,
		Cached: p.cached,
		InUse:  len(p.refs) - free - p.cached,
	}
}

// Take pops n free blocks, each with one reference, and appends them to dst.
// The caller checks Free() >= n first; Take panics otherwise.
func (p *BlockPool) Take(dst []kvcache.BlockID, n int) []kvcache.BlockID {
	k := len(p.free) - n
	for i := len(p.free) - 1; i >= k; i-- {
		b := p.free[i]
		p.refs[b] = 1
		p.touch(b)
		p.gen[b]++
		dst = append(dst, b)
	}
	p.free = p.free[:k]
	p.lowFree(k)
	return dst
}

// lowFree notes that the free stack's entries from k up were popped or
// rewritten, for the deep check (poolCheck.low): the one call wherever the
// stack changes below its top.
func (p *BlockPool) lowFree(k int) {
	if k < p.ck.low {
		p.ck.low = k
	}
}

// Ref adds a reference to a block that is in use or cached (a reused page).
func (p *BlockPool) Ref(b kvcache.BlockID) {
	p.touch(b)
	if p.refs[b] == 0 {
		p.cached--
	}
	p.refs[b]++
}

// Unref drops one reference. The last reference frees a private block and
// turns a node's page into a cached block.
func (p *BlockPool) Unref(b kvcache.BlockID) {
	p.touch(b)
	p.refs[b]--
	if p.refs[b] > 0 {
		return
	}
	if p.owner[b] != nil {
		p.cached++
		return
	}
	p.free = append(p.free, b)
}

// adopt makes an in-use private block the page of node n.
func (p *BlockPool) adopt(b kvcache.BlockID, n *Node) {
	p.touch(b)
	p.owner[b] = n
	if p.refs[b] == 0 {
		p.cached++
	}
}

// drop frees a page that its node gives up (eviction); it must be unreferenced.
func (p *BlockPool) drop(b kvcache.BlockID) {
	p.touch(b)
	p.owner[b] = nil
	if p.refs[b] == 0 {
		p.cached--
		p.free = append(p.free, b)
	}
}
