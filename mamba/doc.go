// Package mamba is the cache manager for hybrid Mamba models (cache_manager:
// mamba): cachemgr_v2's sequence core (cachemgrv2.Core: pool groups,
// BlockPool, Tree with pins and deferred pruning, Ledger, reserve, commit,
// release, registration and reuse, the host tier) plus an SSM life cycle
// with prefix reuse through state snapshots, added to the core through its
// hooks (cachemgrv2.Hooks, implemented by life): the sequence life cycle is
// written once, so a fix to it is made once. It implements
// plugins/v1/kvcache.Manager; cmd/kvx-mamba serves it as a plugin.
//
// # Pools
//
// Paged buffers (attention KV, MLA latent, DSA indexer key) are grouped by
// attention window as in cachemgr_v2: one block id covers every buffer of a
// group. State buffers (Mamba conv and SSM state) of all the stage's mamba
// layers form one "ssm" pool, listed last, whose block is one sequence state
// (TokensPerBlock 0). It holds MaxBatchSize × Stages live slots (one per
// resident sequence: Layout.MaxSequences) and the snapshot slots. With a
// host tier (host_bytes) the layout is: the attention groups' device pools,
// their host pools, the ssm pool, and a "host-ssm" pool of suspended live
// states and offloaded snapshots.
//
// # SSM life cycle
//
// A new sequence takes a live slot in Reserve and keeps it until Release (a
// suspended sequence gives it up until Resume: Host tier); its
// ssm table entry 0 is that slot. When block reuse is on and the prompt is
// known, snapshots are placed every Snapshots.Interval tokens (rounded up to
// a multiple of TokensPerBlock when it is not one) and at each
// OffsetsFromEnd offset (rounded down to a block boundary), over the prompt's
// full blocks. A step whose tokens cross such boundaries gets, in the same
// Reserve, one snapshot slot per boundary: the grant's ssm TableDelta lists
// them after the live slot (entries 1..k, boundaries ascending), and
// Grant.Snapshots names each slot with its boundary, so that the forward
// writes the state at each boundary there (kvcache.SnapshotSlot; Mamba2's
// chunked scan produces these states). Commit installs each written
// slot on the tree node of the block that ends at its boundary. So the only
// allocation of a snapshot, and the only eviction it causes, happens in
// Reserve, before the forward: Commit never allocates, never evicts and
// never prunes inside its walk (seed B, upstream #17926).
//
// Snapshots are best-effort cache entries. A snapshot slot is taken from the
// free slots, else by evicting an unpinned snapshot (to the host tier when
// there is one: Host tier), else the snapshot is skipped
// (Stats.Snapshots.Skipped). Evicting a snapshot frees its slot only: the
// tree node keeps its pages and its place; no node is detached. A
// snapshot is pinned while a sequence copies it into its live slot (from the
// grant that reuses it until that sequence's next Commit) and while it is
// being written (between Reserve and Commit); pinned snapshots are never
// evicted.
//
// Retention keeps reuse working when one prompt takes more snapshots than
// the pool holds. Victims are chosen first among cold snapshots (on no live
// sequence's path): the lowest retention priority of their node first, then
// the least recently used lineage (a sequence's path snapshots are touched
// together when it is released or reused), then the lowest level. Then
// among hot ones, the lowest node priority, then the lowest level, but only
// when the victim's level is below the new snapshot's, else the new one is
// skipped. The level of a boundary at position b is the number of trailing
// zero bits of b / step. A prompt longer than the pool can hold thus keeps
// an evenly thinned set of snapshots over its whole length (every 2^k-th
// boundary) instead of only its tail, and a later request that shares a long
// prefix with it still hits.
//
// # Reuse
//
// Lookup returns the largest block boundary b <= len(Prompt)-1 such that the
// tree holds every full block up to b with all its pages and a snapshot at
// b, on either tier. Reserve{New, Reuse: b} shares those attention blocks (as
// cachemgr_v2) and copies the snapshot into the new live slot (Grant.Copies,
// from the ssm or the host-ssm pool to the ssm pool). A stage without state
// layers reuses any full-block prefix, and
// with the core's partial-reuse switch any prefix (a copy-on-write of the
// partly matched block); with state layers reuse still ends on a snapshot
// boundary, since no state exists inside a block. Registration goes on past
// a prompt block another request put in the tree first (cachemgr_v2's
// package doc, Reuse), so requests that share a prefix and then diverge
// each cache their own later blocks and snapshots.
//
// # Explain and retention
//
// The manager explains its lookups with the core's Explain (cachemgr_v2's
// package doc, Explain): Tokens is Lookup's, and snapshot_boundary says
// that the tree holds the prompt's attention blocks further than Tokens but
// no SSM snapshot at a later boundary. Retention priorities and the
// eviction policy (lru, lfu) order the eviction of attention blocks as in
// cachemgr_v2; a snapshot goes with its node's pages. Snapshot slots keep
// their own retention (below), after the node's priority: a snapshot on a
// node of a lower priority is evicted first.
//
// # Host tier
//
// Suspend moves a sequence's private attention blocks to the host tier (as
// cachemgr_v2) and its live SSM state to a host-ssm slot (a copy ssm to
// host-ssm in the same answer), freeing its live slot for another resident
// sequence. Resume copies the state back into a free live slot (false while
// every live slot is held by a resident sequence) and the sequence's next
// grant names that slot as its ssm table entry 0.
//
// Cached attention blocks the device evicts go to the host tier through the
// core (cachemgr_v2's package doc, Tiers) and come back on a hit. Snapshots
// move on their own, independently of their node's block: a node holds at
// most one snapshot, in an ssm slot or in a host-ssm slot, whichever tier
// holds its block. The rules:
//
//   - Offload: a cached snapshot that a Reserve evicts from its ssm slot
//     (for a new snapshot slot: Retention) moves to a host-ssm slot: the
//     reserving sequence's grant gets a copy ssm -> host-ssm, appended when
//     the eviction happens and so ahead of the forward that writes the
//     freed slot (the engine applies a grant's copies in order, first).
//   - Pending: the host snapshot is pending until that reservation
//     settles: not reusable (Lookup skips it), not evictable, and its slot
//     held even if the snapshot is dropped meanwhile. Commit and Release
//     make it a cached host snapshot; Unreserve drops it (its copy never
//     ran), as it drops the device snapshots it evicted.
//   - Sharing host-ssm: suspended live states come first. A Suspend that
//     finds no free host-ssm slot evicts the least valuable cached host
//     snapshot (node priority, then least recently used lineage, then
//     level: the device's cold order); an offload that finds none evicts one
//     only if it is less valuable than the snapshot offloaded, else that
//     snapshot vanishes as without a host tier. Pinned or pending host
//     snapshots are never evicted; a Suspend that finds neither a free
//     slot nor an evictable host snapshot stays resident (false, nothing
//     changes), and the scheduler then frees and recomputes the sequence.
//   - Reuse: a host snapshot is a boundary hit like a device one;
//     Reserve{New, Reuse} copies it host-ssm -> the new live slot and pins
//     it until that sequence's next Commit. It stays on the host tier (no
//     promotion), and a device snapshot is not taken where a node holds one
//     on the host.
//   - A node's snapshot, on either tier, goes when its block vanishes from
//     both tiers (Hooks.Evicted); reuse thus still ends exactly at a
//     snapshot boundary whatever tiers hold the blocks and the snapshot.
//
// Stats.Snapshots.Evicted counts evictions from a slot of either tier (an
// offload is one); the host-ssm pool's Cached counts its host snapshots,
// pending ones included.
//
// # Sizing
//
// The split of DeviceBytes between the attention groups and the ssm pool is
// a hint that changes speed only: with avg_seq_len, a typical step of
// MaxBatchSize × Stages sequences of avg_seq_len tokens, each with its
// periodic snapshots; without it, the limits: one max_seq_len request with
// all its snapshots plus one max_num_tokens chunk (with its snapshots) for
// every other resident sequence. pool_ratio (attention groups in window
// order, then ssm) overrides both. The hard floors are checked first:
// every attention group holds one MaxSeqLen+MaxDraftTokens request and one
// MaxNumTokens chunk, and the ssm pool holds every live state plus one
// snapshot slot when snapshots are on; otherwise Configure fails with
// ErrInvalidConfig naming the numbers and the fix.
//
// HostBytes splits as the device pools did: each attention group and the
// ssm pool get host bytes in proportion to their device bytes (the ssm
// pool's live and snapshot slots together, since host-ssm holds suspended
// live states and offloaded snapshots; its live slots alone when snapshots
// are off). A pool whose share is under one block gets none, with a
// warning that names host_bytes and the block size.
//
// # Not supported
//
// Without host bytes there is no host tier: Suspend and Resume fail with
// ErrUnsupported (the scheduler frees and recomputes), and an evicted
// snapshot vanishes. Snapshots cover prompt tokens only. A host snapshot is
// never promoted back to an ssm slot (reuse copies it straight into the live
// slot), and an Unreserve gives back neither the device snapshots its
// reservation evicted nor the host copies it offloaded.
package mamba
