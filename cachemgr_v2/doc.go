// Package cachemgrv2 is a KV cache manager in the style of TensorRT-LLM's
// "KV cache manager V2", built so that the two founding failures (DESIGN.md,
// seeds A and B) cannot happen by construction. It implements
// plugins/v1/kvcache.Manager; cmd/kvx-cachemgr-v2 serves it as a plugin.
//
// # Parts
//
// The manager is assembled from parts that a hybrid (Mamba) manager reuses:
//
//   - Core: the sequence life cycle, written once for both managers: per
//     sequence (Seq) a Ledger and one block table per pool group;
//     Reserve/Unreserve/Commit/Release with the undo record stored, never
//     recomputed; registration of committed prompt blocks in the Tree and
//     their reuse, partial reuse with a copy-on-write; the host tier; Stats,
//     Inspect and the deep self-check. Manager is a Core without hooks. A
//     fix to the life cycle is made once (the same bug was once fixed twice,
//     in this manager and in mamba's copy of it).
//   - Hooks: what a manager built on Core adds (the mamba manager's SSM
//     slots and snapshots), called by the Core at reserve, commit, release,
//     lookup, eviction, suspend and resume. Hooks never deny after the core
//     granted and never touch attention blocks or the tree, so the Core's
//     guarantees below hold for every manager built on it.
//   - PoolGroup: the paged buffers of all layers with one life cycle (attention
//     window). A DSA layer's latent and indexer key and the last stage's MTP
//     layer sit in the same group as the main KV, so one block id covers them
//     all and they advance in the same call: no side pool can lag (seed A,
//     upstream #18660).
//   - BlockPool: one pool on one tier (device or host); free / cached / in-use
//     accounting with reference counts.
//   - Tree and Node: a radix tree of committed full prompt blocks keyed by
//     token content, with pins, leaf-first eviction (retention priority,
//     then the eviction policy) and a prune queue drained only at safe
//     points (seed B).
//   - Ledger: one sequence's history, capacity, hold and outstanding
//     reservation; the only place capacity and history move (seed A).
//
// # Sizing
//
// DeviceBytes is split between pool groups in proportion to their demand in
// a typical step (one MaxNumTokens chunk plus MaxBatchSize-1 sequences of
// AvgSeqLen, else MaxSeqLen, tokens), or by PoolRatio when given. These are
// hints: every group then gets at least the blocks of one
// MaxSeqLen+MaxDraftTokens request and of one MaxNumTokens chunk, or Configure
// fails with ErrInvalidConfig naming the numbers and the fix. HostBytes is
// split in the same proportions. Models with state buffers (Mamba) are refused.
//
// # Tiers
//
// Suspend moves only a sequence's private blocks to the host tier; its shared
// blocks (tree pages it reused or registered) stay on device, referenced and
// pinned, so suspending one sequence never changes what another one sees.
// Resume allocates device blocks (evicting cached blocks when needed, for
// good: their content is dropped, since Resume's copies only bring blocks
// back, and no Unreserve undoes a Resume) and the next grant carries the new
// table tail.
//
// With block reuse on, the host tier also keeps cached blocks (hostreuse.go
// has the rules): a tree node that Reserve evicts from the device to
// allocate is copied to the host tier (a Copy in the grant of the item that
// caused it) and stays in the tree there, evictable by its own leaf-first
// LRU; Lookup walks through host nodes, and a new sequence that reuses them
// gets fresh device blocks with a host-to-device copy each, counted in its
// need before anything is touched (Grant.HostReused). Until the reservation
// that made a copy is committed or released, the node it fills is pending:
// no other Lookup or Reserve sees it and nothing evicts it. Unreserve undoes
// both (the copies never ran): an offloaded node gets its device pages back
// when the put-back's conditions hold (undo.go; the device pages still hold
// the content), else loses its content, and a promoted node goes back to
// its host copy. A
// node whose block vanishes takes its host subtree with it (nothing could
// reach it any more).
//
// One host budget, one rule: suspended sequences come first. A Suspend
// takes free host blocks and, when they are short, evicts cached host nodes
// (least valuable leaf first); it is refused only when free plus evictable
// host blocks do not cover it. An offload takes a free host block, else
// evicts the least valuable cached host leaf if that leaf is no more
// valuable than the node being offloaded (the tree's eviction order), else
// the node's content vanishes as without a tier: an offload never displaces
// a suspended block. In Stats and Inspect a host pool's suspended blocks are
// InUse, its cached nodes (pending ones included) Cached.
//
// # Reuse
//
// Lookup walks the tree over full blocks (the v1 contract: a multiple of
// TokensPerBlock, at most len(Prompt)-1). The partial-block primitive
// (Tree.MatchPartial, with a copy-on-write of the matched block into a
// private block returned in Grant.Copies) is implemented and tested behind a
// switch (Core.SetPartialReuse, off), pending a contract change that lets
// Lookup return any length.
//
// Commit registers the full prompt blocks that history passed. When the tree
// already holds a block under another copy (two requests computed the same
// prefix side by side), registration goes on past it with the sequence's
// later, unique blocks, and one copy is kept: the sequence takes the node's
// pages when a live sequence uses them (its next grant carries the new table
// tail), else the node takes the sequence's copy; the other copy is freed.
// So the cache holds one block per content, a sequence never holds a
// private copy of a cached block (one max_seq_len request still fits
// alone), and Commit references no block that was unreferenced.
//
// A request's cache salt (LookupItem and ReserveItem CacheSalt) keys the
// root's children: a first block's key mixes in the salt and a match checks
// it, so each salt has its own subtree and two salts never share a node or a
// page; without a salt the keys are what they always were. With
// Config.KVEvents the tree reports a node that adopts pages as BlockStored
// and an evicted one as BlockRemoved (events.go), hashed as a chain from the
// salt; off, it computes and records nothing.
//
// # Explain
//
// The Core is a kvcache.Explainer (explain.go). Explain walks the tree with
// the very walk of Lookup (Core.walk), so its Tokens cannot differ; the
// extras are computed after the walk, on the Explain path only. HostTokens
// counts the matched blocks whose node is on the host tier only
// (Node.OnHost, Core.hostTokens, shared with LookupTiers: a hit there costs a
// host-to-device copy). Miss is decided in this
// order:
//
//   - reuse_off: prefix reuse is off;
//   - snapshot_boundary: the tree holds the blocks further than Tokens, but
//     the Hooks allow no reuse there (mamba: no snapshot at a later
//     boundary);
//   - partial_block: the match reached the last full block Lookup may
//     return (a multiple of TokensPerBlock, at most len(Prompt)-1);
//   - in_flight: a live sequence has the next block among the prompt blocks
//     it has not committed to the tree yet (same salt, same tokens, same
//     position hash, so the same blocks before it); a scan of the live
//     sequences, with each sequence's position hashes computed once;
//   - evicted: the ghost record holds the next block's position (the chain
//     of keys from the root: the salt and every block before it, Node.pos),
//     with the tier, what decided (the policy's name, or "priority" when an
//     eviction candidate of a higher priority was left in the heap) and the
//     manager clock then (the latest Now of a Lookup, Explain or Reserve
//     item). The record keeps the last 2^20 evictions (maxGhosts) and
//     forgets the oldest first; a forgotten eviction reads as never_stored;
//   - cache_salt: only when the match stops at the first block: the tree
//     caches that block, with all its pages, under another salt (the root's
//     children are also listed by their tokens' hash alone);
//   - never_stored: anything else.
//
// # Retention and eviction policies
//
// ReserveItem.Priority (0: kvcache.DefaultPriority; outside 1..100 the item
// is denied as invalid) is the retention priority of the blocks a new
// sequence stores; PriorityDuration (engine ns after the item's Now, 0 for
// ever) bounds it, after which the blocks fall back to the default. A block
// it reuses takes its priority when higher (or equal with a later expiry)
// and counts a hit, both at the sequence's first Commit, so an Unreserve
// leaves no trace. The eviction heap orders evictable leaves by priority,
// then by the policy (Config.EvictionPolicy): lru, the least recently
// used; lfu, the fewest hits since the block was stored, then the least
// recently used. Eviction stays leaf-first under both (the heap holds only
// leaves). The heap keys are stored, never computed from the clock: nodes
// whose priority expires sit in an expiry heap, and Reserve re-keys those
// the clock passed before it evicts anything (O(log n) each). The deep
// self-check verifies the expiry heap, the per-priority counts and that no
// expired priority is left in the eviction heap.
//
// # Safety
//
// Reserve is the only place blocks are allocated and cached blocks evicted;
// it checks that free plus evictable blocks cover the need before touching
// anything, so a denial leaves no trace. Commit never allocates, never evicts
// and cannot run out of memory: it only moves inside what Reserve allocated,
// releasing rejected drafts from the recorded reservation. Tree nodes a live
// sequence relies on are pinned along their whole path; eviction frees pages
// only; pruning happens at the start of Reserve and at the end of Commit,
// Suspend and Resume, never inside an allocation or a commit walk.
//
// An Unreserve leaves no trace either, where it can: the nodes its
// reservation evicted get their pages back as cached content, in their old
// eviction order, when no allocation since can have let anything write the
// pages, the node is the same attached node and holds no pages, and the KV
// events still hold the eviction unread (undo.go); a prune skips a node
// with pages again. Pipeline stages that disagree on a grant therefore do
// not wipe the granting stage's cache at every retry.
package cachemgrv2
