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
//     token content, with pins, leaf-first eviction (priority, then LRU) and a
//     prune queue drained only at safe points (seed B).
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
// Resume allocates device blocks (evicting cached blocks when needed, whose
// content is then dropped: Resume's copies only bring blocks back) and the
// next grant carries the new table tail.
//
// With block reuse on, the host tier also keeps cached blocks (hostreuse.go
// has the rules): a tree node that Reserve evicts from the device to
// allocate is copied to the host tier (a Copy in the grant of the item that
// caused it) and stays in the tree there, evictable by its own leaf-first
// LRU; Lookup walks through host nodes, and a new sequence that reuses them
// gets fresh device blocks with a host-to-device copy each, counted in its
// need before anything is touched (Grant.HostReused). Until the reservation
// that made a copy is committed or released, the node it fills is pending:
// no other Lookup or Reserve sees it and nothing evicts it; Unreserve drops
// an offload's content and sends a promoted node back to its host copy. A
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
package cachemgrv2
