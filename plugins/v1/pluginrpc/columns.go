package pluginrpc

// Helpers for the columnar per-step messages (see the proto's conventions):
// a count column, optional columns that are empty when all zero, and
// concatenated variable-length parts split by a length column.

import (
	"github.com/kvx-dev/kvx/plugins/internal/kvxpb"
	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
)

// colError is the error of a malformed columnar message. It is
// KindInvalidArg: on the server it is the caller's bad request; the client
// reports a malformed answer with its own kind (see malformed).
func colError(format string, args ...any) error {
	return kvcache.Errorf(kvcache.KindInvalidArg, format, args...)
}

// trimZero returns s, or nil when every value is zero.
func trimZero[T comparable](s []T) []T {
	var zero T
	for _, v := range s {
		if v != zero {
			return s
		}
	}
	return nil
}

// column returns get(0..n-1) as a column, or nil (nothing allocated) when
// every value is zero.
func column[T comparable](n int, get func(i int) T) []T {
	var zero T
	for i := range n {
		if get(i) != zero {
			s := make([]T, n) // s[:i] stay zero
			for j := i; j < n; j++ {
				s[j] = get(j)
			}
			return s
		}
	}
	return nil
}

// optional checks an optional column of a message with n entries.
func optional[T any](msg, name string, s []T, n int) ([]T, error) {
	switch len(s) {
	case n:
		return share(s), nil
	case 0:
		return nil, nil
	}
	return nil, colError("%s: column %s has %d values, want 0 or %d (one per entry)", msg, name, len(s), n)
}

// at returns s[i], or zero for an empty optional column.
func at[T any](s []T, i int) T {
	if s == nil {
		var zero T
		return zero
	}
	return s[i]
}

// concat joins the n parts given by part into one column and a length
// column (nil when every part is empty).
func concat[T any](n int, part func(i int) []T) (lens []int64, data []T) {
	total := 0
	for i := range n {
		total += len(part(i))
	}
	if total == 0 {
		return nil, nil
	}
	lens = make([]int64, n)
	data = make([]T, 0, total)
	for i := range n {
		p := part(i)
		lens[i] = int64(len(p))
		data = append(data, p...)
	}
	return lens, data
}

// splitter hands out the consecutive parts of a concatenated column. Parts
// share the column's memory with their capacity capped, so appending to one
// cannot overwrite the next.
type splitter[T any] struct {
	lens []int64
	data []T
	off  int
}

// newSplitter checks lens, the optional length column (n entries) that
// splits data.
func newSplitter[T any](msg, lensName, dataName string, lens []int64, data []T, n int) (splitter[T], error) {
	lens, err := optional(msg, lensName, lens, n)
	if err != nil {
		return splitter[T]{}, err
	}
	var total int64
	for i, l := range lens {
		if l < 0 || l > int64(len(data)) {
			return splitter[T]{}, colError("%s: %s[%d] = %d, want 0..%d", msg, lensName, i, l, len(data))
		}
		total += l
	}
	if total != int64(len(data)) {
		return splitter[T]{}, colError("%s: %s adds up to %d, want %d (the length of %s)", msg, lensName, total, len(data), dataName)
	}
	return splitter[T]{lens: lens, data: data}, nil
}

// part returns entry i's part; nil when it is empty.
func (s *splitter[T]) part(i int) []T {
	l := int(at(s.lens, i))
	if l == 0 {
		return nil
	}
	p := s.data[s.off : s.off+l : s.off+l]
	s.off += l
	return p
}

// --- TableDeltas ---

// toProtoTableDeltas encodes the deltas of n items; nil when there are none.
func toProtoTableDeltas(n int, of func(i int) []kvcache.TableDelta) *kvxpb.TableDeltas {
	deltas, blocks := 0, 0
	for i := range n {
		ds := of(i)
		deltas += len(ds)
		for j := range ds {
			blocks += len(ds[j].Blocks)
		}
	}
	if deltas == 0 {
		return nil
	}
	m := &kvxpb.TableDeltas{
		Item:   make([]int32, 0, deltas),
		Pool:   make([]int64, 0, deltas),
		From:   make([]int64, 0, deltas),
		Len:    make([]int64, 0, deltas),
		Blocks: make([]int32, 0, blocks),
	}
	for i := range n {
		ds := of(i)
		for j := range ds {
			d := &ds[j]
			m.Item = append(m.Item, int32(i))
			m.Pool = append(m.Pool, int64(d.Pool))
			m.From = append(m.From, int64(d.From))
			m.Len = append(m.Len, int64(len(d.Blocks)))
			for _, b := range d.Blocks {
				m.Blocks = append(m.Blocks, int32(b))
			}
		}
	}
	m.Pool, m.From, m.Len = trimZero(m.Pool), trimZero(m.From), trimZero(m.Len)
	return m
}

// fromProtoTableDeltas decodes the deltas of a message with n items and
// calls set once per item that has any, in item order. All deltas share two
// allocations.
func fromProtoTableDeltas(msg string, p *kvxpb.TableDeltas, n int, set func(i int, ds []kvcache.TableDelta)) error {
	items := p.GetItem()
	count := len(items)
	if count == 0 {
		if len(p.GetPool())+len(p.GetFrom())+len(p.GetLen())+len(p.GetBlocks()) > 0 {
			return colError("%s: tables have values but no item column", msg)
		}
		return nil
	}
	pool, err := optional(msg, "tables.pool", p.GetPool(), count)
	if err != nil {
		return err
	}
	from, err := optional(msg, "tables.from", p.GetFrom(), count)
	if err != nil {
		return err
	}
	blockIDs := p.GetBlocks()
	ids := make([]kvcache.BlockID, len(blockIDs))
	for i, b := range blockIDs {
		ids[i] = kvcache.BlockID(b)
	}
	blocks, err := newSplitter(msg, "tables.len", "tables.blocks", p.GetLen(), ids, count)
	if err != nil {
		return err
	}
	deltas := make([]kvcache.TableDelta, count)
	start := 0
	for j := range count {
		it := int(items[j])
		if it < 0 || it >= n || (j > 0 && it < int(items[j-1])) {
			return colError("%s: tables.item[%d] = %d, want 0..%d and non-decreasing", msg, j, it, n-1)
		}
		deltas[j] = kvcache.TableDelta{Pool: int(at(pool, j)), From: int(at(from, j)), Blocks: blocks.part(j)}
		if j+1 == count || int(items[j+1]) != it {
			set(it, deltas[start:j+1:j+1])
			start = j + 1
		}
	}
	return nil
}

// --- Copies ---

// toProtoCopies encodes the copies of n owners (grants, or one list with
// n == 1 and no item column); nil when there are none.
func toProtoCopies(n int, of func(i int) []kvcache.Copy) *kvxpb.Copies {
	count := 0
	for i := range n {
		count += len(of(i))
	}
	if count == 0 {
		return nil
	}
	m := &kvxpb.Copies{
		SrcPool:  make([]int64, 0, count),
		SrcBlock: make([]int32, 0, count),
		DstPool:  make([]int64, 0, count),
		DstBlock: make([]int32, 0, count),
		Item:     make([]int32, 0, count),
	}
	for i := range n {
		for _, c := range of(i) {
			m.SrcPool = append(m.SrcPool, int64(c.SrcPool))
			m.SrcBlock = append(m.SrcBlock, int32(c.SrcBlock))
			m.DstPool = append(m.DstPool, int64(c.DstPool))
			m.DstBlock = append(m.DstBlock, int32(c.DstBlock))
			m.Item = append(m.Item, int32(i))
		}
	}
	m.SrcBlock, m.DstPool, m.DstBlock, m.Item = trimZero(m.SrcBlock), trimZero(m.DstPool), trimZero(m.DstBlock), trimZero(m.Item)
	return m
}

// fromProtoCopies decodes copies owned by n owners and calls set once per
// owner that has any, in order. All copies share one allocation.
func fromProtoCopies(msg string, p *kvxpb.Copies, n int, set func(i int, cs []kvcache.Copy)) error {
	src := p.GetSrcPool()
	count := len(src)
	if count == 0 {
		if len(p.GetSrcBlock())+len(p.GetDstPool())+len(p.GetDstBlock())+len(p.GetItem()) > 0 {
			return colError("%s: copies have values but no src_pool column", msg)
		}
		return nil
	}
	if n == 0 {
		return colError("%s: %d copies but no entry to own them", msg, count)
	}
	srcBlock, err := optional(msg, "copies.src_block", p.GetSrcBlock(), count)
	if err != nil {
		return err
	}
	dstPool, err := optional(msg, "copies.dst_pool", p.GetDstPool(), count)
	if err != nil {
		return err
	}
	dstBlock, err := optional(msg, "copies.dst_block", p.GetDstBlock(), count)
	if err != nil {
		return err
	}
	items, err := optional(msg, "copies.item", p.GetItem(), count)
	if err != nil {
		return err
	}
	cs := make([]kvcache.Copy, count)
	start := 0
	for j := range count {
		it := int(at(items, j))
		if it < 0 || it >= n || (j > 0 && it < int(at(items, j-1))) {
			return colError("%s: copies.item[%d] = %d, want 0..%d and non-decreasing", msg, j, it, n-1)
		}
		cs[j] = kvcache.Copy{
			SrcPool:  int(src[j]),
			SrcBlock: kvcache.BlockID(at(srcBlock, j)),
			DstPool:  int(at(dstPool, j)),
			DstBlock: kvcache.BlockID(at(dstBlock, j)),
		}
		if j+1 == count || int(at(items, j+1)) != it {
			set(it, cs[start:j+1:j+1])
			start = j + 1
		}
	}
	return nil
}

// toProtoCopyList encodes one list of copies.
func toProtoCopyList(cs []kvcache.Copy) *kvxpb.Copies {
	return toProtoCopies(1, func(int) []kvcache.Copy { return cs })
}

// fromProtoCopyList decodes one list of copies.
func fromProtoCopyList(msg string, p *kvxpb.Copies) ([]kvcache.Copy, error) {
	var out []kvcache.Copy
	err := fromProtoCopies(msg, p, 1, func(_ int, cs []kvcache.Copy) { out = cs })
	return out, err
}

// --- Snapshot slots ---

// toProtoSnapshotSlots encodes the snapshot slots of n owners; nil when
// there are none.
func toProtoSnapshotSlots(n int, of func(i int) []kvcache.SnapshotSlot) *kvxpb.SnapshotSlots {
	count := 0
	for i := range n {
		count += len(of(i))
	}
	if count == 0 {
		return nil
	}
	m := &kvxpb.SnapshotSlots{
		Pos:   make([]int64, 0, count),
		Pool:  make([]int64, 0, count),
		Block: make([]int32, 0, count),
		Item:  make([]int32, 0, count),
	}
	for i := range n {
		for _, s := range of(i) {
			m.Pos = append(m.Pos, int64(s.Pos))
			m.Pool = append(m.Pool, int64(s.Pool))
			m.Block = append(m.Block, int32(s.Block))
			m.Item = append(m.Item, int32(i))
		}
	}
	m.Pool, m.Block, m.Item = trimZero(m.Pool), trimZero(m.Block), trimZero(m.Item)
	return m
}

// fromProtoSnapshotSlots decodes snapshot slots owned by n owners and calls
// set once per owner that has any, in order. All slots share one allocation.
func fromProtoSnapshotSlots(msg string, p *kvxpb.SnapshotSlots, n int, set func(i int, ss []kvcache.SnapshotSlot)) error {
	pos := p.GetPos()
	count := len(pos)
	if count == 0 {
		if len(p.GetPool())+len(p.GetBlock())+len(p.GetItem()) > 0 {
			return colError("%s: snapshot slots have values but no pos column", msg)
		}
		return nil
	}
	if n == 0 {
		return colError("%s: %d snapshot slots but no entry to own them", msg, count)
	}
	pool, err1 := optional(msg, "snapshots.pool", p.GetPool(), count)
	block, err2 := optional(msg, "snapshots.block", p.GetBlock(), count)
	items, err3 := optional(msg, "snapshots.item", p.GetItem(), count)
	if err := firstErr(err1, err2, err3); err != nil {
		return err
	}
	ss := make([]kvcache.SnapshotSlot, count)
	start := 0
	for j := range count {
		it := int(at(items, j))
		if it < 0 || it >= n || (j > 0 && it < int(at(items, j-1))) {
			return colError("%s: snapshots.item[%d] = %d, want 0..%d and non-decreasing", msg, j, it, n-1)
		}
		ss[j] = kvcache.SnapshotSlot{Pos: int(pos[j]), Pool: int(at(pool, j)), Block: kvcache.BlockID(at(block, j))}
		if j+1 == count || int(at(items, j+1)) != it {
			set(it, ss[start:j+1:j+1])
			start = j + 1
		}
	}
	return nil
}
