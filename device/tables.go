package device

import "github.com/kvx-dev/kvx/plugins/v1/kvcache"

// Tables are the block tables a worker keeps: per sequence, per pool of the
// layout, the blocks holding that sequence's cache in logical token order.
// They change only by the table deltas and Released lists of Forward, exactly
// as the manager granted them (table = table[:From] ++ Blocks). Not safe for
// concurrent use; a worker's calls come from one goroutine at a time.
type Tables struct {
	seqs  map[kvcache.SeqID]*seqTables
	pools int
	spare []*seqTables // released entries, reused with their capacity
}

type seqTables struct {
	blocks [][]kvcache.BlockID // by pool index
	stamp  uint64              // the last Forward that named the sequence
	seq    kvcache.SeqID       // whose tables these are, while live
	live   bool                // false once released (the entry may be reused)
}

func (t *Tables) reset(pools int) {
	t.seqs = make(map[kvcache.SeqID]*seqTables)
	t.pools = pools
	t.spare = nil
}

// Len returns the number of sequences that hold a table.
func (t *Tables) Len() int { return len(t.seqs) }

// Table returns seq's table in the pool at index pool of the layout (nil
// when it holds none). The slice is the worker's: read it before the next
// Forward and do not modify it.
func (t *Tables) Table(seq kvcache.SeqID, pool int) []kvcache.BlockID {
	s := t.seqs[seq]
	if s == nil || pool < 0 || pool >= len(s.blocks) {
		return nil
	}
	return s.blocks[pool]
}

func (t *Tables) get(seq kvcache.SeqID) *seqTables { return t.seqs[seq] }

func (t *Tables) getOrAdd(seq kvcache.SeqID) *seqTables {
	if s := t.seqs[seq]; s != nil {
		return s
	}
	var s *seqTables
	if n := len(t.spare); n > 0 {
		s, t.spare = t.spare[n-1], t.spare[:n-1]
	} else {
		s = &seqTables{blocks: make([][]kvcache.BlockID, t.pools)}
	}
	s.seq, s.live = seq, true
	t.seqs[seq] = s
	return s
}

// release drops seq's tables; unknown sequences are ignored.
func (t *Tables) release(seq kvcache.SeqID) {
	s := t.seqs[seq]
	if s == nil {
		return
	}
	delete(t.seqs, seq)
	for i := range s.blocks {
		s.blocks[i] = s.blocks[i][:0]
	}
	s.stamp, s.live = 0, false
	t.spare = append(t.spare, s)
}

// apply applies one validated delta to the pool at index pool.
func (s *seqTables) apply(pool int, d kvcache.TableDelta) {
	s.blocks[pool] = append(s.blocks[pool][:d.From], d.Blocks...)
}

// TablesOf returns tables holding tabs (by sequence, one table per pool
// index of a layout of pools pools), for a device's tests, which run a
// device's kernels without the runtime. The tables are the caller's
// slices.
func TablesOf(pools int, tabs map[kvcache.SeqID][][]kvcache.BlockID) *Tables {
	t := &Tables{}
	t.reset(pools)
	for seq, bs := range tabs {
		s := t.getOrAdd(seq)
		copy(s.blocks, bs)
	}
	return t
}
