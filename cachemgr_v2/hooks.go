package cachemgrv2

import "github.com/kvx-dev/kvx/plugins/v1/kvcache"

// Hooks is what a manager built on Core adds to the sequence life cycle: the
// mamba manager's SSM state slots and snapshots. Core calls them from inside
// its own calls, item by item in the order of the batch, at the points named
// below; the hooks keep their per-sequence state in Seq.Ext. A Core without
// Hooks (cachemgr_v2) manages attention blocks only.
//
// Hooks never deny after the core granted (a denial must leave no trace, so
// every reason to refuse is asked for first, by Reusable and Admit), never
// allocate or evict attention blocks, and never change the tree: they only
// read nodes and sequences.
type Hooks interface {
	// Reusable reports whether a new sequence may take its first tokens
	// prompt tokens from the cache, the tree holding all their attention
	// pages; end is the node of the last full block among them (the root
	// when there is none). Lookup returns the largest such length, and
	// Reserve denies a Reuse for which it is false. It changes nothing.
	Reusable(end *Node, tokens int) bool
	// Admit says why a new sequence cannot start now ("" when it can). It is
	// asked before the core takes anything and must change nothing.
	Admit(it *kvcache.ReserveItem) string
	// Reserved is told of a granted item, after the core took its blocks and
	// recorded the reservation (s.New() says whether it created s). It may
	// take the hooks' own resources, best-effort, and add Copies and
	// Snapshots to g; it cannot deny.
	Reserved(s *Seq, it *kvcache.ReserveItem, g *kvcache.Grant)
	// Tables appends to dst the table deltas of the hooks' own pools for the
	// grant of s (after the core's, one per device pool group) and returns
	// it. With Hooks, every grant carries table deltas.
	Tables(s *Seq, dst []kvcache.TableDelta) []kvcache.TableDelta
	// Unreserved undoes Reserved for a sequence that existed before the
	// reservation (a sequence the reservation created is Dropped instead).
	Unreserved(s *Seq)
	// Committed is told of a committed item, after history advanced, the
	// rejected drafts' blocks were freed and the prompt blocks that history
	// passed were registered in s's path. It must not allocate.
	Committed(s *Seq)
	// Dropped is told that s ends, before the core frees its blocks and
	// unpins its path: released (touch true) or its creating reservation
	// undone (touch false, which must leave no trace in LRU orders).
	Dropped(s *Seq, touch bool)
	// Evicted is told that node n just lost its block's content on every
	// tier (an eviction without room on the host tier, a host-tier eviction,
	// or an Unreserve that drops an offload whose copy never ran). A node
	// the device evicts to the host tier keeps its content and is not
	// Evicted. n stays attached until a prune at a safe point. An
	// Unreserve may give n its pages back (undo.go) without telling the
	// Hooks: what they dropped for n stays dropped.
	Evicted(n *Node)
	// CanSuspend reports whether s's own state fits the host tier; Suspended
	// then moves it and appends its copies (device to host) to copies.
	CanSuspend(s *Seq) bool
	Suspended(s *Seq, copies []kvcache.Copy) []kvcache.Copy
	// CanResume reports whether s's own state fits the device again; Resumed
	// then moves it back and appends its copies (host to device). The new
	// places reach the worker through Tables in s's next grant.
	CanResume(s *Seq) bool
	Resumed(s *Seq, copies []kvcache.Copy) []kvcache.Copy
	// CanFork says why parent cannot fork into a child now ("" when it
	// can); it is asked before the core takes anything and must change
	// nothing. Forked is told of the granted fork, after the core built
	// child's tables and path: it takes the child's own state (a copy of
	// the parent's, whose copies it appends to g) and cannot deny.
	CanFork(parent *Seq, child kvcache.SeqID) string
	Forked(parent, child *Seq, g *kvcache.Grant)
}
