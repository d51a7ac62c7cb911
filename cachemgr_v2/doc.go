// Package cachemgrv2 is a KV cache manager in the style of TensorRT-LLM's
// "KV cache manager V2", built so that the two founding failures (DESIGN.md,
// seeds A and B) cannot happen by construction. It implements
// plugins/v1/kvcache.Manager; cmd/kvx-cachemgr-v2 serves it as a plugin.
//
// # Parts
//
// The manager is assembled from parts that a hybrid (Mamba) manager can reuse:
//
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
// pinned. The tree therefore never points at the host tier, and suspending
// one sequence never changes what another one sees. Resume allocates device
// blocks (evicting cached blocks when needed) and the next grant carries the
// new table tail.
//
// # Reuse
//
// Lookup walks the tree over full blocks (the v1 contract: a multiple of
// TokensPerBlock, at most len(Prompt)-1). The partial-block primitive
// (Tree.MatchPartial, with a copy-on-write of the matched block into a
// private block returned in Grant.Copies) is implemented and tested behind an
// internal switch, pending a contract change that lets Lookup return any
// length.
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
