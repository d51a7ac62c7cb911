package cachemgrv1

import (
	"strings"
	"testing"

	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
)

// hostConfig: one full-attention pool of 16 device blocks of 4 tokens (100
// bytes a token) and, with host > 0, a host pool of host blocks.
func hostConfig(host int) kvcache.Config {
	c := smallConfig(4, 16)
	c.MaxSeqLen = 32
	c.MaxDraftTokens = 0
	c.EnableBlockReuse = true
	c.HostBytes = int64(host * 4 * 100)
	return c
}

// worker models a worker's memory: content[pool][block*tpb+slot] is the
// token whose KV the slot holds; copies run in order.
type worker struct {
	tpb     int
	content [][]int32
}

func newWorker(lay kvcache.Layout, tpb int) *worker {
	w := &worker{tpb: tpb}
	for _, p := range lay.Pools {
		c := make([]int32, p.Blocks*tpb)
		for i := range c {
			c[i] = -1
		}
		w.content = append(w.content, c)
	}
	return w
}

func (w *worker) run(cs []kvcache.Copy) {
	for _, c := range cs {
		copy(w.content[c.DstPool][int(c.DstBlock)*w.tpb:int(c.DstBlock+1)*w.tpb],
			w.content[c.SrcPool][int(c.SrcBlock)*w.tpb:int(c.SrcBlock+1)*w.tpb])
	}
}

// write stores toks at positions from.. of table (pool 0).
func (w *worker) write(table []kvcache.BlockID, from int, toks []int32) {
	for i, v := range toks {
		pos := from + i
		w.content[0][int(table[pos/w.tpb])*w.tpb+pos%w.tpb] = v
	}
}

// hostScript runs the scripted case: prompt a (6 full blocks) is computed
// and released, two 8-block requests push it out of the device tier, and a
// request with prompt a comes back. It returns the manager, the worker, a
// and the table of the returning request.
func hostScript(t *testing.T, host int) (*Manager, *worker, []int32, kvcache.Grant) {
	t.Helper()
	m, w, a := hostSetup(t, host)
	if host == 0 {
		return m, w, a, kvcache.Grant{}
	}
	g := mustGrant(t, m, kvcache.ReserveItem{Seq: 4, New: true, Tokens: 1, Reuse: 24, Prompt: a})
	g.Tables = []kvcache.TableDelta{{Pool: 0, Blocks: g.Tables[0].Blocks}}
	w.run(g.Copies)
	return m, w, a, g
}

// hostSetup is hostScript up to the return of a: a's blocks are on the
// host tier (or gone, without one).
func hostSetup(t *testing.T, host int) (*Manager, *worker, []int32) {
	t.Helper()
	const tpb = 4
	m := New()
	lay, err := m.Configure(bg, hostConfig(host))
	if err != nil {
		t.Fatal(err)
	}
	w := newWorker(lay, tpb)
	tables := map[kvcache.SeqID][]kvcache.BlockID{}
	step := func(seq kvcache.SeqID, p []int32, reuse int) kvcache.Grant {
		g := mustGrant(t, m, kvcache.ReserveItem{Seq: seq, New: true, Tokens: len(p) - reuse, Reuse: reuse, Prompt: p})
		for _, d := range g.Tables {
			tables[seq] = append(tables[seq][:d.From], d.Blocks...)
		}
		w.run(g.Copies) // before the forward, as the worker does
		w.write(tables[seq], reuse, p[reuse:])
		commit(t, m, seq, len(p)-reuse)
		noViolations(t, m)
		return g
	}
	a := prompt(tpb, []int32{1, 2, 3, 4, 5, 6}, 1, 1) // 25 tokens: 6 full blocks + 1
	step(1, a, 0)
	release(t, m, 1)
	b := prompt(tpb, []int32{7, 8, 9, 10, 11, 12, 13, 14}, 0, 2) // 8 blocks each
	c := prompt(tpb, []int32{15, 16, 17, 18, 19, 20, 21, 22}, 0, 3)
	step(2, b, 0) // 8 of the 10 free blocks
	g3 := step(3, c, 0)
	if host > 0 && len(g3.Copies) != 6 {
		t.Fatalf("the grant that evicts a's 6 cached blocks has %d copies, want 6 offloads: %+v", len(g3.Copies), g3.Copies)
	}
	release(t, m, 2, 3)
	n := lookup(t, m, a)
	if host == 0 {
		if n[0] != 0 {
			t.Fatalf("without a host tier Lookup(a) after eviction = %d, want 0", n[0])
		}
		return m, w, a
	}
	if n[0] != 24 {
		t.Fatalf("Lookup(a) after eviction to the host tier = %d, want 24", n[0])
	}
	return m, w, a
}

func release(t *testing.T, m *Manager, seqs ...kvcache.SeqID) {
	t.Helper()
	if err := m.Release(bg, seqs); err != nil {
		t.Fatalf("Release(%v): %v", seqs, err)
	}
}

func TestHostTierEvictAndRehit(t *testing.T) {
	m, w, a, g := hostScript(t, 8)
	table := g.Tables[0].Blocks
	up := 0
	for _, c := range g.Copies {
		switch {
		case c.SrcPool == 1 && c.DstPool == 0:
			up++
			if !containsBlock(table[:6], c.DstBlock) {
				t.Errorf("host→device copy %+v writes a block outside the reused prefix %v", c, table[:6])
			}
		case c.SrcPool == 0 && c.DstPool == 1:
		default:
			t.Errorf("copy %+v is not between pool 0 and its host pool 1", c)
		}
	}
	if up != 6 {
		t.Fatalf("%d host→device copies, want 6 (every reused block came from the host): %+v", up, g.Copies)
	}
	for pos := range 24 {
		if got := w.content[0][int(table[pos/4])*4+pos%4]; got != a[pos] {
			t.Fatalf("after the copies, reused position %d (block %d) holds %d, prompt has %d", pos, table[pos/4], got, a[pos])
		}
	}
	st, err := m.Stats(bg)
	if err != nil {
		t.Fatal(err)
	}
	if st.ReusedTokens != 24 || m.c.promoted != 6 || m.c.offloaded < 6 {
		t.Fatalf("reused %d tokens, promoted %d, offloaded %d; want 24, 6, >= 6", st.ReusedTokens, m.c.promoted, m.c.offloaded)
	}
	// Until Commit the promoted blocks are pending: nobody else reuses them.
	if n := lookup(t, m, a); n[0] != 0 {
		t.Fatalf("Lookup(a) while its promotion is uncommitted = %d, want 0", n[0])
	}
	noViolations(t, m)
	commit(t, m, 4, 1)
	if n := lookup(t, m, a); n[0] != 24 {
		t.Fatalf("Lookup(a) after the promotion committed = %d, want 24", n[0])
	}
	snap := inspect(t, m)
	if len(snap.Pools) != 2 || snap.Pools[1].InUse != 0 || snap.Pools[1].Total != 8 {
		t.Fatalf("pools %+v: want a device pool and a host pool of 8 blocks, none in use", snap.Pools)
	}
	noViolations(t, m)
}

func TestHostTierOffWhenUnset(t *testing.T) {
	hostScript(t, 0) // asserts that a's blocks vanished
	m := configured(t, hostConfig(0))
	if m.host != nil {
		t.Fatal("host pools without host_cache_size")
	}
}

// An Unreserve drops the copies of its grant, so the moves it made must not
// leave blocks whose content never arrives: the promoted hashes vanish.
// An undone promotion copies nothing, so the host blocks it would have read
// still hold a, and the device blocks it evicted still hold what they held:
// Unreserve puts both back (undo.go), and a later request reuses a with the
// right content.
func TestHostTierUnreservePutsBack(t *testing.T) {
	m, w, a, _ := hostScript(t, 8)
	if err := m.Unreserve(bg, []kvcache.SeqID{4}); err != nil {
		t.Fatal(err)
	}
	noViolations(t, m)
	if n := lookup(t, m, a); n[0] != 24 {
		t.Fatalf("Lookup(a) after the promoting reservation was undone = %d, want 24 (still on the host tier)", n[0])
	}
	for _, p := range inspect(t, m).Pools {
		if p.InUse != 0 || p.Free+p.Cached != p.Total {
			t.Fatalf("pool %+v after Unreserve: want nothing in use", p)
		}
	}
	g := mustGrant(t, m, kvcache.ReserveItem{Seq: 5, New: true, Tokens: 1, Reuse: 24, Prompt: a})
	if g.HostReused != 0 && g.HostReused != 24 {
		t.Fatalf("HostReused = %d, want 24 (or 0 from a manager that does not say)", g.HostReused)
	}
	w.run(g.Copies)
	table := g.Tables[0].Blocks
	for pos := range 24 {
		if got := w.content[0][int(table[pos/4])*4+pos%4]; got != a[pos] {
			t.Fatalf("reused position %d (block %d) holds %d, prompt has %d", pos, table[pos/4], got, a[pos])
		}
	}
	commit(t, m, 5, 1)
	noViolations(t, m)
}

// Without a host tier, the cached blocks a reservation evicted come back
// when it is undone: their content was never overwritten.
func TestUnreservePutsBackEvicted(t *testing.T) {
	m, w, _ := hostSetup(t, 0) // a was evicted by b and c; b and c are cached
	const tpb = 4
	b := prompt(tpb, []int32{7, 8, 9, 10, 11, 12, 13, 14}, 0, 2)
	before := lookup(t, m, b)[0]
	if before != 28 {
		t.Fatalf("Lookup(b) = %d before the test, want 28", before)
	}
	// d needs 8 blocks: every block is cached, and b's are the oldest.
	d := prompt(tpb, []int32{31, 32, 33, 34, 35, 36, 37, 38}, 0, 4)
	mustGrant(t, m, kvcache.ReserveItem{Seq: 9, New: true, Tokens: 8 * tpb, Prompt: d})
	if n := lookup(t, m, b)[0]; n != 0 {
		t.Fatalf("Lookup(b) while d holds every block = %d, want 0", n)
	}
	if err := m.Unreserve(bg, []kvcache.SeqID{9}); err != nil {
		t.Fatal(err)
	}
	noViolations(t, m)
	if n := lookup(t, m, b)[0]; n != before {
		t.Fatalf("Lookup(b) after the evicting reservation was undone = %d, want %d", n, before)
	}
	g := mustGrant(t, m, kvcache.ReserveItem{Seq: 10, New: true, Tokens: 4, Reuse: 28, Prompt: b})
	table := g.Tables[0].Blocks
	for pos := range 28 {
		if got := w.content[0][int(table[pos/4])*4+pos%4]; got != b[pos] {
			t.Fatalf("reused position %d (block %d) holds %d, prompt has %d", pos, table[pos/4], got, b[pos])
		}
	}
}

// The host tier evicts its own least recently used block: with 3 host
// blocks only a's last 3 offloads (its first blocks: a chain's deeper blocks
// are older and leave the device first) stay, so a is found up to 3 blocks.
// Request c arrives in one-block chunks, each committed, so every offload is
// settled before the next (a reservation never evicts its own pending moves).
func TestHostTierLRU(t *testing.T) {
	const tpb = 4
	m := configured(t, hostConfig(3))
	a := prompt(tpb, []int32{1, 2, 3, 4, 5, 6}, 1, 1)
	mustGrant(t, m, kvcache.ReserveItem{Seq: 1, New: true, Tokens: len(a), Prompt: a})
	commit(t, m, 1, len(a))
	release(t, m, 1)
	b := prompt(tpb, []int32{7, 8, 9, 10, 11, 12, 13, 14}, 0, 2)
	c := prompt(tpb, []int32{15, 16, 17, 18, 19, 20, 21, 22}, 0, 3)
	mustGrant(t, m, kvcache.ReserveItem{Seq: 2, New: true, Tokens: len(b), Prompt: b})
	copies := 0
	for k := range 8 {
		g := mustGrant(t, m, kvcache.ReserveItem{Seq: 3, New: k == 0, Tokens: tpb, Prompt: c})
		copies += len(g.Copies)
		commit(t, m, 3, tpb)
		noViolations(t, m)
	}
	if copies != 6 || m.host[0].evictions != 3 {
		t.Fatalf("%d offload copies, %d host evictions; want 6 and 3", copies, m.host[0].evictions)
	}
	if n := lookup(t, m, a); n[0] != 3*tpb {
		t.Fatalf("Lookup(a) = %d, want %d (a's first 3 blocks on the host)", n[0], 3*tpb)
	}
}

func TestHostTierLayout(t *testing.T) {
	lay, err := New().Configure(bg, hostConfig(5))
	if err != nil {
		t.Fatal(err)
	}
	if len(lay.Pools) != 2 {
		t.Fatalf("pools %+v, want full and host-full", lay.Pools)
	}
	d, h := lay.Pools[0], lay.Pools[1]
	if h.ID != 1 || h.Name != "host-full" || h.Tier != kvcache.TierHost || h.Blocks != 5 ||
		h.BlockBytes != d.BlockBytes || h.TokensPerBlock != d.TokensPerBlock || len(h.Layers) != len(d.Layers) {
		t.Fatalf("host pool %+v for device pool %+v", h, d)
	}
	for _, tc := range []struct {
		name string
		cfg  func() kvcache.Config
		want string
	}{
		{"reuse off", func() kvcache.Config { c := hostConfig(5); c.EnableBlockReuse = false; return c },
			"host_cache_size 2,000 bytes ignored"},
		{"too small", func() kvcache.Config { c := hostConfig(0); c.HostBytes = 399; return c },
			"host_cache_size 399 bytes is less than one block in every paged pool (400 bytes); no host tier"},
	} {
		lay, err := New().Configure(bg, tc.cfg())
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if len(lay.Pools) != 1 || !strings.Contains(strings.Join(lay.Warnings, "\n"), tc.want) {
			t.Errorf("%s: pools %d, warnings %q; want 1 pool and a warning containing %q", tc.name, len(lay.Pools), lay.Warnings, tc.want)
		}
	}
}

func containsBlock(bs []kvcache.BlockID, b kvcache.BlockID) bool {
	for _, x := range bs {
		if x == b {
			return true
		}
	}
	return false
}

// The device tier's KV events: an offload removes a's blocks from it and
// a promotion stores them again, under the same hashes (the host tier's
// events: hostevents_test.go).
func TestHostTierEvents(t *testing.T) {
	const tpb = 4
	cfg := hostConfig(8)
	cfg.KVEvents = true
	m := configured(t, cfg)
	a := prompt(tpb, []int32{1, 2, 3, 4, 5, 6}, 1, 1)
	b := prompt(tpb, []int32{7, 8, 9, 10, 11, 12, 13, 14}, 0, 2)
	c := prompt(tpb, []int32{15, 16, 17, 18, 19, 20, 21, 22}, 0, 3)
	mustGrant(t, m, kvcache.ReserveItem{Seq: 1, New: true, Tokens: len(a), Prompt: a})
	commit(t, m, 1, len(a))
	release(t, m, 1)
	evs, _ := m.Events(bg)
	if len(evs) != 2 || evs[1].Kind != kvcache.BlockStored || len(evs[1].Hashes) != 6 {
		t.Fatalf("events after a = %+v, want AllBlocksCleared and one BlockStored of 6", evs)
	}
	aHashes := evs[1].Hashes
	mustGrant(t, m, kvcache.ReserveItem{Seq: 2, New: true, Tokens: len(b), Prompt: b})
	mustGrant(t, m, kvcache.ReserveItem{Seq: 3, New: true, Tokens: len(c), Prompt: c})
	evs, _ = m.Events(bg)
	var removed []uint64
	for _, e := range evs {
		if e.Kind == kvcache.BlockRemoved && e.Tier == kvcache.TierDevice {
			removed = append(removed, e.Hashes...)
		}
	}
	if len(removed) != 6 || !sameSet(removed, aHashes) {
		t.Fatalf("device removals %v, want a's hashes %v", removed, aHashes)
	}
	commit(t, m, 2, len(b))
	commit(t, m, 3, len(c))
	release(t, m, 2, 3)
	_, _ = m.Events(bg)
	mustGrant(t, m, kvcache.ReserveItem{Seq: 4, New: true, Tokens: 1, Reuse: 24, Prompt: a})
	evs, _ = m.Events(bg)
	var stored []uint64
	for _, e := range evs {
		if e.Kind == kvcache.BlockStored {
			stored = append(stored, e.Hashes...)
		}
	}
	if !sameSet(stored, aHashes) {
		t.Fatalf("stores after the promotion %v (events %+v), want a's hashes %v", stored, evs, aHashes)
	}
}

func sameSet(a, b []uint64) bool {
	if len(a) != len(b) {
		return false
	}
	in := map[uint64]int{}
	for _, x := range a {
		in[x]++
	}
	for _, x := range b {
		in[x]--
	}
	for _, n := range in {
		if n != 0 {
			return false
		}
	}
	return true
}

// Two requests of one Reserve call reuse the same host prefix: the second
// shares the blocks the first promoted and carries the same copies, so it
// stays right when the first grant is undone (the engine drops its copies).
func TestHostTierSharedPromotionInOneCall(t *testing.T) {
	m, w, a := hostSetup(t, 8)
	gs := reserve(t, m,
		kvcache.ReserveItem{Seq: 4, New: true, Tokens: 1, Reuse: 24, Prompt: a},
		kvcache.ReserveItem{Seq: 5, New: true, Tokens: 1, Reuse: 24, Prompt: a})
	if !gs[0].OK || !gs[1].OK {
		t.Fatalf("grants %+v: want both", gs)
	}
	t4, t5 := gs[0].Tables[0].Blocks, gs[1].Tables[0].Blocks
	for j := range 6 {
		if t4[j] != t5[j] {
			t.Fatalf("tables %v and %v: want the 6 reused blocks shared", t4, t5)
		}
	}
	if err := m.Unreserve(bg, []kvcache.SeqID{4}); err != nil {
		t.Fatal(err)
	}
	noViolations(t, m)
	w.run(gs[1].Copies) // only the kept grant's copies run
	for pos := range 24 {
		if got := w.content[0][int(t5[pos/4])*4+pos%4]; got != a[pos] {
			t.Fatalf("reused position %d (block %d) holds %d, prompt has %d", pos, t5[pos/4], got, a[pos])
		}
	}
	commit(t, m, 5, 1)
	noViolations(t, m)
}
