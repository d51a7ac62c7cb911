// Package kvcache is version 1 of the cache-manager contract: the interface
// the core holds for each pipeline stage, whether the manager runs in-process
// or as a plugin over gRPC.
//
// A manager keeps metadata only (pools, block tables, prefix reuse, the
// reservation ledger). KV memory lives in the worker; the manager hands out
// block ids and copy plans.
//
// # The ledger
//
// Every sequence has a history (tokens whose KV is final; it only grows) and a
// capacity (token slots backed by blocks). At every observable point
// 0 <= history <= capacity. One step of a sequence is:
//
//	Reserve{Tokens: n, Draft: d}  capacity >= history + n + d (or a denial)
//	Commit{Accepted: a}           a <= n + d; history += a; rejected drafts are
//	                              released from the ledger, never from a width
//	                              recomputed by the caller
//
// or Unreserve, which restores the state before Reserve exactly. Commit moves
// only inside what Reserve allocated, so it cannot run out of memory.
//
// # Calls
//
// Calls are batch-granular: one call per stage per phase per step. The core
// calls a manager from one goroutine at a time; managers need no locking of
// their own. Slices passed in are owned by the caller and must not be retained;
// slices returned are owned by the caller.
package kvcache

import (
	"context"
	"strconv"

	"github.com/kvx-dev/kvx/plugins/v1/spec"
)

// ProtocolVersion is the contract version this package describes.
const ProtocolVersion = 1

// SeqID identifies one request's sequence; unique within an engine run.
type SeqID uint64

// BlockID is a block index inside one pool.
type BlockID int32

// Tier is where a pool's blocks live.
type Tier string

const (
	TierDevice Tier = "device"
	TierHost   Tier = "host"
)

// Info describes a manager before anything is configured.
type Info struct {
	Name         string
	Version      string
	Protocols    []int
	Capabilities Capabilities
}

// Capabilities say what a manager can serve; a mismatch with the model is a
// configuration error at startup.
type Capabilities struct {
	Mixers      []spec.Mixer // layer mixers whose buffers it can manage
	PrefixReuse bool         // Lookup can return > 0
	HostTier    bool         // Suspend and Resume work (the manager is a Suspender)
	SSMState    bool         // per-sequence state buffers (Mamba)
	SSMReuse    bool         // prefix reuse of SSM state through snapshots
	// CacheSalt: the manager keys every cached block by the CacheSalt of
	// LookupItem and ReserveItem too, so two salts never share a block. The
	// host refuses a salted request on a manager without it (an older
	// manager would ignore the field and share across salts).
	CacheSalt bool
	// KVEvents: the manager is an EventReporter and records KV events when
	// Config.KVEvents is set.
	KVEvents bool
	// Explain: the manager is an Explainer: per lookup it says which tier
	// holds the matched tokens and why the match stopped, and its grants
	// say how many reused tokens came from the host tier (Grant.HostReused).
	Explain bool
	// Retention: eviction in every tier of the manager honours
	// ReserveItem.Priority and PriorityDuration. A manager without it
	// ignores them (they are hints; nothing is shared that should not be).
	Retention bool
	// EvictionPolicies are the values of Config.EvictionPolicy the manager
	// accepts, EvictionLRU first; nil means EvictionLRU only.
	EvictionPolicies []string
	// Fork: the manager is a Forker: a resident sequence forks into
	// children that share its blocks (n > 1 completions prefill the
	// prompt once). A host without it runs each child as its own request.
	Fork bool
}

// Eviction policies (Config.EvictionPolicy). Among cached blocks of equal
// retention priority a manager evicts, under
//
//   - EvictionLRU: the least recently used first;
//   - EvictionLFU: the least often reused first (hits since the block was
//     stored), the least recently used among equals. Frequency-aware: a
//     system prompt reused by every request outlives a burst of one-off
//     documents that LRU would let push it out.
const (
	EvictionLRU = "lru"
	EvictionLFU = "lfu"
)

// Retention priorities (ReserveItem.Priority), TensorRT-LLM's
// KvCacheRetentionConfig scale: cached blocks of a lower priority are
// evicted before any of a higher one, whatever the policy.
const (
	MinPriority     = 1
	MaxPriority     = 100
	DefaultPriority = 35 // what 0 (unset) means
)

// SnapshotConfig places SSM snapshots (mamba_state_config).
type SnapshotConfig struct {
	Interval       int   // periodic_snapshot_interval in tokens; 0 = none
	OffsetsFromEnd []int // additional_snapshot_offsets_from_end
}

// Config is everything a manager needs to lay out one stage's pools.
type Config struct {
	Stage  int // 0-based pipeline stage
	Stages int // pipeline_parallel_size

	Layers         []spec.Layer // this stage's layers with their per-rank buffers
	TokensPerBlock int

	DeviceBytes int64 // bytes of device memory this stage's cache may use (per rank)
	HostBytes   int64 // host tier bytes; 0 = no host tier

	MaxBatchSize   int // per micro-batch
	MaxNumTokens   int // tokens per step
	MaxSeqLen      int // prompt + output tokens of one request
	MaxDraftTokens int // draft tokens reserved per generation step (MTP)

	EnableBlockReuse bool
	AvgSeqLen        int       // sizing hint only; 0 = unset
	PoolRatio        []float64 // sizing hint only; nil = unset
	Snapshots        SnapshotConfig

	// KVEvents asks a manager whose Info says KVEvents to record block
	// stores and removals for EventReporter.Events. Off, it records
	// nothing and costs nothing.
	KVEvents bool

	// EvictionPolicy orders the eviction of cached blocks of equal
	// priority in every tier: EvictionLRU ("" means it) or another value
	// of Info's EvictionPolicies. A manager refuses any other value with
	// ErrInvalidConfig.
	EvictionPolicy string
}

// MaxCacheSaltBytes is the longest CacheSalt a host sends; managers may
// refuse longer ones (a denial or a Lookup of 0, never a shared block).
const MaxCacheSaltBytes = 256

// Pool is one block pool of a layout.
type Pool struct {
	ID             int
	Name           string // e.g. "full", "window-4096", "ssm"
	Tier           Tier
	Window         int   // attention window of its layers; 0 = full attention
	Layers         []int // indexes into Config.Layers' Index values
	TokensPerBlock int   // tokens per block; 0 for state pools (one block = one sequence state)
	BlockBytes     int64 // bytes of one block over all its layers and buffers
	Blocks         int
}

// BlocksFor is the number of blocks of tokensPerBlock tokens that back
// tokens token slots: tokens / tokensPerBlock rounded up. tokens must be >= 0
// and tokensPerBlock > 0. Managers, the host and the conformance suite all
// count a table's blocks by it.
func BlocksFor(tokens, tokensPerBlock int) int {
	return (tokens + tokensPerBlock - 1) / tokensPerBlock
}

// Layout is a manager's answer to Configure.
type Layout struct {
	Pools []Pool
	// MaxSeqTokens is the guaranteed capacity: the most tokens (history plus
	// reservation) one sequence can hold when it is alone in the cache.
	MaxSeqTokens int
	// MaxSequences is the most resident sequences (state slots); 0 = unbounded.
	MaxSequences int
	Warnings     []string
}

// LookupItem asks how much of a prompt the cache already holds.
type LookupItem struct {
	Seq    SeqID
	Prompt []int32
	// CacheSalt isolates the request's cache (vLLM's cache_salt): only blocks
	// stored under the same salt match. "" is the shared, unsalted cache.
	// Managers without Capabilities.CacheSalt never see a non-empty one.
	CacheSalt string
	// Now is the engine time of the step in nanoseconds (simulated time on
	// the sim device), never decreasing from call to call: a manager's
	// clock for the eviction times it explains and the retention durations
	// it honours. 0 from a host that predates it.
	Now int64
}

// ReserveItem asks for the capacity of one step of one sequence.
type ReserveItem struct {
	Seq SeqID
	// Tokens is the number of tokens whose KV this step writes after history:
	// a prefill chunk, or 1 in generation.
	Tokens int
	// Draft is the number of draft tokens written after Tokens (MTP).
	Draft int
	// Hold keeps capacity for this many tokens until Release, whatever
	// Commit does (GUARANTEED_NO_EVICT reserves prompt + output + draft). 0 = none.
	Hold int
	// New marks the first reservation of a sequence.
	New bool
	// Prompt holds the prompt tokens (new sequences, when block reuse is on):
	// full blocks of it are committed for reuse as history passes them.
	Prompt []int32
	// Reuse is the number of leading prompt tokens to take from the cache
	// (new sequences only). It must not exceed what Lookup returned, and the
	// sequence starts with history = Reuse.
	Reuse int
	// CacheSalt (new sequences) keys the blocks this sequence reuses and
	// stores: see LookupItem.CacheSalt. It must be the salt the Lookup had.
	CacheSalt string
	// Priority (new sequences) is the retention priority of the blocks this
	// sequence stores in the cache, MinPriority..MaxPriority; 0 means
	// DefaultPriority. Blocks it reuses take the higher of the two. A
	// manager without Capabilities.Retention ignores it; one with it denies
	// a value out of range ("invalid:").
	Priority int
	// PriorityDuration (new sequences) is how long, in engine nanoseconds
	// from Now, Priority lasts; the blocks then fall back to
	// DefaultPriority. 0 means for as long as they are cached.
	PriorityDuration int64
	// Now is the engine time of the step, as LookupItem.Now.
	Now int64
}

// TableDelta replaces the tail of a block table: table = table[:From] ++ Blocks.
type TableDelta struct {
	Pool   int
	From   int
	Blocks []BlockID
}

// Copy asks the worker to copy one block (tier moves, snapshots, copy-on-write).
type Copy struct {
	SrcPool  int
	SrcBlock BlockID
	DstPool  int
	DstBlock BlockID
}

// SnapshotSlot asks the worker to save a sequence's state (its Mamba conv
// and SSM state) as it stands after the first Pos tokens of the sequence,
// into Block of Pool (a state pool), during the step whose tokens reach
// Pos. Hybrid managers use it for snapshots that later requests reuse.
type SnapshotSlot struct {
	Pos   int
	Pool  int
	Block BlockID
}

// Grant is the answer to one ReserveItem. A denial (OK false) is a normal
// answer, never an error, and leaves no trace in the manager.
type Grant struct {
	Seq    SeqID
	OK     bool
	Reason string // why it was denied, with the numbers
	Tables []TableDelta
	Copies []Copy
	// Snapshots are the state saves this step must make (hybrid managers),
	// in increasing Pos; the core hands them to the worker with the item.
	Snapshots []SnapshotSlot
	// HostReused is how many of the item's Reuse tokens the host tier held
	// (managers whose Info says Explain): their blocks come back through
	// Copies. Reuse - HostReused came from the device tier.
	HostReused int
}

// CommitItem advances one sequence after a forward.
type CommitItem struct {
	Seq SeqID
	// Accepted is the number of reserved tokens whose KV is now final: the
	// step's Tokens plus the accepted drafts. Rejected drafts are released.
	Accepted int
}

// CommitResult carries work the worker must do after a commit.
type CommitResult struct {
	Copies []Copy
}

// PoolStats counts one pool's blocks. Free + Cached + InUse == Total.
type PoolStats struct {
	Pool   int
	Total  int
	Free   int // unused, holding nothing
	Cached int // unused by any sequence but holding reusable content (evictable)
	InUse  int // referenced by at least one sequence
}

// SnapshotStats counts SSM snapshots (Mamba managers).
type SnapshotStats struct {
	Taken, Skipped, Evicted int64
	ReusedTokens            int64
}

// Stats are cumulative counters since Configure; they never decrease (an
// Unreserve does not take back what its Reserve counted).
type Stats struct {
	Pools          []PoolStats
	Sequences      int
	LookupTokens   int64 // prompt tokens looked up
	ReusedTokens   int64 // prompt tokens taken from the cache by Reserve
	Evictions      int64 // cached blocks evicted
	Snapshots      SnapshotStats
	SuspendedSeqs  int
	ReserveDenials int64
}

// SeqState is one sequence's ledger as the manager sees it.
type SeqState struct {
	Seq       SeqID
	History   int
	Capacity  int
	Reserved  int // tokens of the outstanding reservation (Tokens + Draft); 0 when none
	Draft     int // drafts of the outstanding reservation
	Hold      int
	Suspended bool
	Blocks    []int       // blocks held per pool, in Layout.Pools order
	Tables    [][]BlockID // per pool; only with InspectOptions.Tables
}

// InspectOptions chooses how deep Inspect looks.
type InspectOptions struct {
	Tables bool // include block tables, reference counts and the self-check (expensive)
	// CheckTables, with Tables, asks the side that holds the tables to check
	// them against the reference counts (CheckTables) and to leave both out
	// of the snapshot: the findings join Violations and TablesChecked is set.
	// The plugin server honours it for every manager, so the tables of a deep
	// check never cross the wire; a manager itself may ignore it, and the
	// caller then checks the tables it got.
	CheckTables bool
}

// Snapshot is a debug view for invariant checks.
type Snapshot struct {
	Pools []PoolStats
	Seqs  []SeqState
	// RefCounts[pool][block] is the number of sequences referencing the block;
	// only with InspectOptions.Tables.
	RefCounts [][]int32
	// Violations are the manager's own deep self-check findings (only with
	// InspectOptions.Tables, since a full check is expensive); empty when sound.
	Violations []string
	// TablesChecked says the tables and reference counts were checked where
	// they are held (InspectOptions.CheckTables) and left out: Tables and
	// RefCounts are empty and the findings are in Violations.
	TablesChecked bool
}

// Manager is one pipeline stage's cache manager.
//
// Errors: every method may return a transport error (the plugin died:
// ErrUnavailable). Per-item problems in Commit, Release and Unreserve (and
// Suspender's Suspend and Resume) are reported, after every valid item was applied, as one
// *Error of KindInvalidArg whose Seqs lists the refused sequences; a
// refused item changes nothing. A bad Reserve item is a denial whose Reason
// starts with "invalid:". ErrCorrupt means manager-wide state is broken and
// the engine must stop.
type Manager interface {
	// Info describes the manager; it is called first, before Configure.
	Info(ctx context.Context) (Info, error)
	// Configure lays out the pools. It fails with ErrInvalidConfig, naming the
	// numbers and the fix, when the budget cannot hold one MaxSeqLen request
	// end to end or one MaxNumTokens chunk.
	Configure(ctx context.Context, cfg Config) (Layout, error)
	// Lookup returns, per item, how many leading prompt tokens could be taken
	// from the cache now (a multiple of TokensPerBlock, at most len(Prompt)-1).
	// It changes nothing.
	Lookup(ctx context.Context, items []LookupItem) ([]int, error)
	// Reserve grants or denies each item atomically over all pools. Items are
	// processed in order; an earlier grant may cause a later denial.
	Reserve(ctx context.Context, items []ReserveItem) ([]Grant, error)
	// Unreserve undoes the outstanding reservation of each sequence exactly:
	// its ledger and block table are as before Reserve (a new sequence
	// disappears). Cached blocks evicted to make room may stay evicted, or
	// come back: the grant's copies were not made, so a manager may register
	// again content that no copy or forward overwrote.
	Unreserve(ctx context.Context, seqs []SeqID) error
	// Commit advances history; it never allocates and cannot run out of memory.
	Commit(ctx context.Context, items []CommitItem) (CommitResult, error)
	// Release frees finished or preempted sequences; committed prompt blocks
	// stay cached for reuse when block reuse is on.
	Release(ctx context.Context, seqs []SeqID) error
	// Stats returns cumulative counters.
	Stats(ctx context.Context) (Stats, error)
	// Inspect returns the ledger and pool accounting for invariant checks.
	// The snapshot is the caller's: its slices are not kept by the manager,
	// and the caller may change them (SealTables recounts RefCounts in
	// place, on the plugin's server and in the engine alike).
	Inspect(ctx context.Context, opts InspectOptions) (Snapshot, error)
}

// Suspender is an optional Manager interface, found by type assertion: a
// manager with a host tier implements it. The core suspends a sequence only
// on a Suspender whose Info says HostTier and whose layout has host blocks;
// without one, a preempted sequence is released and recomputed. A manager
// without a host tier need not implement it.
//
// Errors are Manager's: per-item problems come back as one item-scoped
// *Error after the valid items were applied; ErrUnsupported when the
// manager was configured without a host tier (HostBytes 0).
type Suspender interface {
	// Suspend moves sequences to the host tier. A sequence that does not
	// fit stays resident and is reported false. Suspending a sequence with
	// an outstanding reservation is refused. The copies are the worker's.
	Suspend(ctx context.Context, seqs []SeqID) ([]bool, []Copy, error)
	// Resume brings suspended sequences back; false when they do not fit yet.
	// The new block ids reach the worker in the sequence's next Grant.Tables.
	Resume(ctx context.Context, seqs []SeqID) ([]bool, []Copy, error)
}

// Explainer is an optional Manager interface, found by type assertion: a
// manager whose Info says Explain implements it. The core calls it instead
// of Lookup.
type Explainer interface {
	// Explain is Lookup with its reasons: per item, Explanation.Tokens is
	// exactly what Lookup returns now. It changes no cache content (like
	// Lookup, it may count looked-up tokens and advance the clock).
	Explain(ctx context.Context, items []LookupItem) ([]Explanation, error)
}

// Explanation is one lookup's answer, explained.
type Explanation struct {
	// Tokens is what Lookup returns for the item.
	Tokens int
	// HostTokens of Tokens are held by the host tier: taking them costs a
	// copy back to the device.
	HostTokens int
	// Miss is why the match stopped at Tokens: what the next prompt block
	// (the one from Tokens on) lacks.
	Miss MissReason
	// For MissEvicted: the tier the next block was evicted from, the rule
	// that chose it (an eviction policy, or "priority" when a lower
	// retention priority decided), and when (the manager's clock, the
	// latest Now it had seen, when it evicted it; 0 when the host sent no
	// clock).
	EvictedTier Tier
	EvictedBy   string
	EvictedAt   int64
}

// MissReason says why a lookup's match stopped.
type MissReason uint8

const (
	// MissUnknown: the manager does not explain (a plain Lookup).
	MissUnknown MissReason = iota
	// MissPartialBlock: the match reached the prompt's last full block
	// before its last token; what is left is computed by every cache (a
	// partial block, or the last token, whose logits are needed).
	MissPartialBlock
	// MissNeverStored: no request stored the next block, as far as the
	// manager remembers.
	MissNeverStored
	// MissEvicted: the next block was stored, then evicted (see
	// Explanation.EvictedTier, EvictedBy, EvictedAt).
	MissEvicted
	// MissSnapshot: the blocks are cached further, but the sequence state
	// (SSM) is saved only at an earlier snapshot boundary.
	MissSnapshot
	// MissCacheSalt: the next block is cached, under another cache salt.
	MissCacheSalt
	// MissInFlight: a live sequence holds the next block but has not
	// committed it for reuse yet (it is being computed).
	MissInFlight
	// MissReuseOff: block reuse is off.
	MissReuseOff
)

var missNames = [...]string{"unknown", "partial_block", "never_stored", "evicted", "snapshot_boundary", "cache_salt", "in_flight", "reuse_off"}

// MissReasons lists every reason, in order (for reports).
func MissReasons() []MissReason {
	out := make([]MissReason, len(missNames))
	for i := range out {
		out[i] = MissReason(i)
	}
	return out
}

func (r MissReason) String() string {
	if int(r) < len(missNames) {
		return missNames[r]
	}
	return "MissReason(" + strconv.Itoa(int(r)) + ")"
}

// EventKind is the type of a KV event (vLLM's kv_events names).
type EventKind uint8

const (
	// BlockStored: full blocks became reusable cache content.
	BlockStored EventKind = iota + 1
	// BlockRemoved: blocks were evicted and can no longer be reused.
	BlockRemoved
	// AllBlocksCleared: the whole cache was emptied (Configure resets it).
	AllBlocksCleared
)

func (k EventKind) String() string {
	switch k {
	case BlockStored:
		return "BlockStored"
	case BlockRemoved:
		return "BlockRemoved"
	case AllBlocksCleared:
		return "AllBlocksCleared"
	}
	return "EventKind(" + strconv.Itoa(int(k)) + ")"
}

// Event is one KV cache event: what a KV-aware router needs to index the
// cache. A block's hash names the whole prefix up to the block's end (the
// cache salt included), so two hashes are equal only for the same salt and
// the same tokens from the start of the prompt.
type Event struct {
	Kind EventKind
	// Hashes are the blocks' prefix hashes (BlockStored, BlockRemoved); for
	// BlockStored of the device tier a chain, each block the child of the
	// one before it.
	Hashes []uint64
	// Parent is the hash of the block before Hashes[0] (BlockStored);
	// HasParent is false when Hashes[0] is a prompt's first block.
	Parent    uint64
	HasParent bool
	// Tokens are the stored blocks' tokens, BlockSize per block (BlockStored).
	Tokens    []int32
	BlockSize int
	// Tier is where the blocks are (BlockStored, BlockRemoved). A block
	// enters the host tier only from the device, whose BlockStored named its
	// tokens and parent: a BlockStored of TierHost (the block's content now
	// settled on the host tier; the device's BlockRemoved comes first) has
	// no Tokens and no Parent, its hashes in no particular chain.
	Tier Tier
}

// EventReporter is an optional Manager interface, found by type assertion:
// a manager whose Info says KVEvents implements it. The core calls Events
// after a step's manager calls, only when Config.KVEvents was set.
type EventReporter interface {
	// Events returns and forgets the events recorded since the last call, in
	// the order they happened. The slice and what it holds are the caller's.
	Events(ctx context.Context) ([]Event, error)
}

// ForkItem asks for one child of a resident sequence (Forker.Fork).
type ForkItem struct {
	Parent SeqID // resident, not suspended, no outstanding reservation
	Child  SeqID // a new id: no sequence of it exists
}

// Forker is an optional Manager interface, found by type assertion: a
// manager whose Info says Fork implements it. The core forks the sequence
// that prefilled a prompt into the n sequences of one request (OpenAI's n,
// best_of), so the prompt is computed once and its blocks held once.
type Forker interface {
	// Fork creates, per item in order, the sequence Child as a copy of
	// Parent's ledger and tables: History is Parent's history, Capacity
	// is that history (no Hold, no reservation), and it stores the blocks
	// it completes under Parent's prompt and cache salt as Parent would.
	// Every full block of the history is shared by reference (its
	// reference count grows by one, on every pool; a sliding window's
	// table shares what Parent's holds), never copied. The last partial
	// block, which the child's next step writes, is the copy-on-write:
	// the child gets a fresh block and the grant's Copies copy Parent's
	// into it, so no block that a sequence writes is shared (Parent's
	// own is left as it was). Per-sequence state (SSM) is a fresh slot
	// with a copy of Parent's in Copies too. The grant's Tables are the
	// child's whole tables (From 0), for the worker.
	//
	// An item is granted or denied as Reserve's are: a denial (no room
	// for the partial block or the state slot) is OK false with a Reason
	// and leaves no trace; a bad item (unknown or suspended parent, a
	// parent with an outstanding reservation, a child that exists) is a
	// denial whose Reason starts with "invalid:". An earlier grant may
	// cause a later denial. Release frees a child like any sequence, and
	// releasing the parent first leaves its children's shared blocks held.
	Fork(ctx context.Context, items []ForkItem) ([]Grant, error)
}
