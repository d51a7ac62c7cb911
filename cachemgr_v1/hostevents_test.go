package cachemgrv1

import (
	"fmt"
	"maps"
	"slices"
	"testing"

	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
	"pgregory.net/rapid"
)

// tierEvents is a KV event stream replayed into the hash set of each tier:
// BlockStored adds to its tier's set, BlockRemoved takes out of it (and
// must name a hash there), AllBlocksCleared empties both.
type tierEvents struct {
	dev, host map[uint64]bool
}

func newTierEvents() *tierEvents {
	return &tierEvents{dev: map[uint64]bool{}, host: map[uint64]bool{}}
}

func (te *tierEvents) clone() *tierEvents {
	return &tierEvents{dev: maps.Clone(te.dev), host: maps.Clone(te.host)}
}

// apply replays evs, checking each event's form, and returns the first
// violation ("" when none).
func (te *tierEvents) apply(evs []kvcache.Event, tpb int) string {
	for i, e := range evs {
		if e.Kind == kvcache.AllBlocksCleared {
			clear(te.dev)
			clear(te.host)
			continue
		}
		var set map[uint64]bool
		switch e.Tier {
		case kvcache.TierDevice:
			set = te.dev
		case kvcache.TierHost:
			set = te.host
		default:
			return fmt.Sprintf("event %d %+v: tier %q", i, e, e.Tier)
		}
		if len(e.Hashes) == 0 {
			return fmt.Sprintf("event %d %+v: no hashes", i, e)
		}
		switch e.Kind {
		case kvcache.BlockStored:
			if e.BlockSize != tpb {
				return fmt.Sprintf("event %d %+v: BlockSize %d, want %d", i, e, e.BlockSize, tpb)
			}
			if e.Tier == kvcache.TierHost && (e.Tokens != nil || e.HasParent) {
				return fmt.Sprintf("event %d %+v: a host BlockStored carries no tokens and no parent", i, e)
			}
			if e.Tier == kvcache.TierDevice && len(e.Tokens) != len(e.Hashes)*tpb {
				return fmt.Sprintf("event %d %+v: %d tokens for %d hashes", i, e, len(e.Tokens), len(e.Hashes))
			}
			for _, h := range e.Hashes {
				set[h] = true
			}
		case kvcache.BlockRemoved:
			for _, h := range e.Hashes {
				if !set[h] {
					return fmt.Sprintf("event %d %+v: removes %x, not in the %s set", i, e, h, e.Tier)
				}
				delete(set, h)
			}
		default:
			return fmt.Sprintf("event %d %+v: kind %v", i, e, e.Kind)
		}
	}
	return ""
}

// tierHashes returns the event hashes the first paged pool has registered
// (pending promotions included: their BlockStored comes with the grant)
// and those its host pool holds settled (not pending).
func tierHashes(m *Manager) (dev, host map[uint64]bool) {
	dev, host = map[uint64]bool{}, map[uint64]bool{}
	p := m.paged[0]
	for b := range p.n {
		if p.hashed[b] {
			dev[p.hash[b].Lo] = true
		}
	}
	if m.host != nil {
		hp := m.host[0]
		for b := range hp.n {
			if hp.hashed[b] && !hp.pend[b] {
				host[hp.hash[b].Lo] = true
			}
		}
	}
	return dev, host
}

// keys returns the hashes of set, sorted.
func keys(set map[uint64]bool) []uint64 { return slices.Sorted(maps.Keys(set)) }

// byTier collects the hashes of evs of kind k and tier tr, in order.
func byTier(evs []kvcache.Event, k kvcache.EventKind, tr kvcache.Tier) []uint64 {
	var out []uint64
	for _, e := range evs {
		if e.Kind == k && e.Tier == tr {
			out = append(out, e.Hashes...)
		}
	}
	return out
}

// hostEvents configures hostConfig(8) with KV events, caches prompt a (6
// full blocks, released) and commits seq 2 (8 blocks, live), and returns
// the manager, a and a's 6 event hashes; the events so far are read.
func hostEvents(t *testing.T) (*Manager, []int32, []uint64) {
	t.Helper()
	cfg := hostConfig(8)
	cfg.KVEvents = true
	m := configured(t, cfg)
	a := prompt(4, []int32{1, 2, 3, 4, 5, 6}, 1, 1) // 6 full blocks + 1 token
	mustGrant(t, m, kvcache.ReserveItem{Seq: 1, New: true, Tokens: len(a), Prompt: a})
	commit(t, m, 1, len(a))
	release(t, m, 1)
	evs, _ := m.Events(bg)
	aHashes := byTier(evs, kvcache.BlockStored, kvcache.TierDevice)
	if len(aHashes) != 6 {
		t.Fatalf("events after a = %+v, want 6 device hashes stored", evs)
	}
	b := prompt(4, []int32{7, 8, 9, 10, 11, 12, 13, 14}, 0, 2) // 8 of the 10 free blocks
	mustGrant(t, m, kvcache.ReserveItem{Seq: 2, New: true, Tokens: len(b), Prompt: b})
	commit(t, m, 2, len(b))
	_, _ = m.Events(bg)
	return m, a, aHashes
}

// evictA reserves seq 3, whose 8 blocks evict a's 6 cached device blocks to
// the host tier (pending until seq 3 commits).
func evictA(t *testing.T, m *Manager) {
	t.Helper()
	c := prompt(4, []int32{15, 16, 17, 18, 19, 20, 21, 22}, 0, 3)
	if g := mustGrant(t, m, kvcache.ReserveItem{Seq: 3, New: true, Tokens: len(c), Prompt: c}); len(g.Copies) != 6 {
		t.Fatalf("the grant evicting a has copies %+v, want 6 offloads", g.Copies)
	}
}

// commitEvicting commits seq 3 (see evictA) and checks that its events
// start with one host BlockStored of a's hashes, and hold no other.
func commitEvicting(t *testing.T, m *Manager, aHashes []uint64) {
	t.Helper()
	commit(t, m, 3, 32)
	evs, _ := m.Events(bg)
	if len(evs) == 0 || evs[0].Kind != kvcache.BlockStored || evs[0].Tier != kvcache.TierHost {
		t.Fatalf("events of the evicting Commit %+v, want a host BlockStored first", evs)
	}
	if e := evs[0]; !sameSet(e.Hashes, aHashes) || e.BlockSize != 4 || e.Tokens != nil || e.HasParent {
		t.Fatalf("host BlockStored %+v, want a's hashes %x in one event, block size 4, no tokens, no parent", e, aHashes)
	}
	if n := len(byTier(evs, kvcache.BlockStored, kvcache.TierHost)); n != 6 {
		t.Fatalf("events of the evicting Commit %+v: %d host stores, want 6", evs, n)
	}
}

// An offload reports the device BlockRemoved when the device evicts the
// block and the host BlockStored when the evicting reservation commits; a
// promotion reports the host BlockRemoved and the device BlockStored, each
// in events of its own tier.
func TestHostEventsOffloadAndPromotion(t *testing.T) {
	m, a, aHashes := hostEvents(t)
	evictA(t, m)
	evs, _ := m.Events(bg)
	if rm := byTier(evs, kvcache.BlockRemoved, kvcache.TierDevice); !sameSet(rm, aHashes) {
		t.Fatalf("events of the evicting Reserve %+v: device removals %x, want a's %x", evs, rm, aHashes)
	}
	if h := byTier(evs, kvcache.BlockStored, kvcache.TierHost); len(h) != 0 {
		t.Fatalf("events of the evicting Reserve %+v: host stores %x before the offload settled", evs, h)
	}
	commitEvicting(t, m, aHashes)
	release(t, m, 2, 3)
	_, _ = m.Events(bg)

	// a comes back: its host blocks are promoted (their hashes leave the
	// host tier) while the allocations evict b's and c's device blocks,
	// two of them onto the host's 2 free blocks.
	mustGrant(t, m, kvcache.ReserveItem{Seq: 4, New: true, Tokens: 1, Reuse: 24, Prompt: a})
	evs, _ = m.Events(bg)
	if rm := byTier(evs, kvcache.BlockRemoved, kvcache.TierHost); !sameSet(rm, aHashes) {
		t.Fatalf("events of the promotion %+v: host removals %x, want a's %x", evs, rm, aHashes)
	}
	if st := byTier(evs, kvcache.BlockStored, kvcache.TierDevice); !sameSet(st, aHashes) {
		t.Fatalf("events of the promotion %+v: device stores %x, want a's %x", evs, st, aHashes)
	}
	devRm := byTier(evs, kvcache.BlockRemoved, kvcache.TierDevice)
	if len(devRm) != 7 {
		t.Fatalf("events of the promotion %+v: %d device removals, want 7 (6 promotions and the tail block)", evs, len(devRm))
	}
	for _, h := range devRm {
		if slices.Contains(aHashes, h) {
			t.Fatalf("events of the promotion %+v: a's hash %x removed from the device", evs, h)
		}
	}
	commit(t, m, 4, 1)
	evs, _ = m.Events(bg)
	if st := byTier(evs, kvcache.BlockStored, kvcache.TierHost); len(st) != 2 || !slices.Contains(devRm, st[0]) || !slices.Contains(devRm, st[1]) {
		t.Fatalf("events of the promotion's Commit %+v: host stores %x, want 2 of the evicted %x", evs, st, devRm)
	}
	noViolations(t, m)
}

// An Unreserve of the evicting reservation records no host event, and
// takes back the device removals of the blocks it puts back (after which
// the same reservation, committed, reports their host stores); events
// read in between keep the blocks removed.
func TestHostEventsUnreserveOffload(t *testing.T) {
	for _, read := range []bool{false, true} {
		t.Run(fmt.Sprintf("read=%v", read), func(t *testing.T) {
			m, a, aHashes := hostEvents(t)
			evictA(t, m)
			var evs []kvcache.Event
			if read {
				evs, _ = m.Events(bg)
			}
			if err := m.Unreserve(bg, []kvcache.SeqID{3}); err != nil {
				t.Fatal(err)
			}
			more, _ := m.Events(bg)
			evs = append(evs, more...)
			for _, e := range evs {
				if e.Tier == kvcache.TierHost {
					t.Fatalf("events %+v: a host event for an offload that never ran", evs)
				}
			}
			want, hit := []uint64(nil), 24
			if read {
				want, hit = aHashes, 0
			}
			if rm := byTier(evs, kvcache.BlockRemoved, kvcache.TierDevice); !sameSet(rm, want) {
				t.Fatalf("events %+v: device removals %x, want %x", evs, rm, want)
			}
			if n := lookup(t, m, a)[0]; n != hit {
				t.Fatalf("Lookup(a) after the Unreserve = %d, want %d", n, hit)
			}
			if dev, host := tierHashes(m); len(host) != 0 || slices.ContainsFunc(aHashes, func(h uint64) bool { return dev[h] == read }) {
				t.Fatalf("after the Unreserve the device holds %x and the host %x", keys(dev), keys(host))
			}
			noViolations(t, m)
			if !read {
				evictA(t, m)
				if evs, _ := m.Events(bg); !sameSet(byTier(evs, kvcache.BlockRemoved, kvcache.TierDevice), aHashes) {
					t.Fatalf("events of the evicting Reserve again %+v, want a's device removals %x", evs, aHashes)
				}
				commitEvicting(t, m, aHashes)
			}
		})
	}
}

// An Unreserve of a promotion puts its host blocks back only while their
// host BlockRemoved is unread, and then takes it back.
func TestHostEventsUnreservePromotion(t *testing.T) {
	for _, read := range []bool{false, true} {
		t.Run(fmt.Sprintf("read=%v", read), func(t *testing.T) {
			m, a, aHashes := hostEvents(t)
			evictA(t, m)
			commit(t, m, 3, 32)
			release(t, m, 2, 3)
			_, _ = m.Events(bg)
			te := newTierEvents()
			te.dev, te.host = tierHashes(m) // what the events read so far say (TestPropertyHostTierEvents)
			if slices.ContainsFunc(aHashes, func(h uint64) bool { return !te.host[h] }) {
				t.Fatalf("before the promotion the host holds %x, want a's %x", keys(te.host), aHashes)
			}
			mustGrant(t, m, kvcache.ReserveItem{Seq: 4, New: true, Tokens: 1, Reuse: 24, Prompt: a})
			if read {
				evs, _ := m.Events(bg)
				if bad := te.apply(evs, 4); bad != "" {
					t.Fatal(bad)
				}
			}
			if err := m.Unreserve(bg, []kvcache.SeqID{4}); err != nil {
				t.Fatal(err)
			}
			evs, _ := m.Events(bg)
			if bad := te.apply(evs, 4); bad != "" {
				t.Fatal(bad)
			}
			dev, host := tierHashes(m)
			if !maps.Equal(te.dev, dev) || !maps.Equal(te.host, host) {
				t.Fatalf("events say device %x host %x; the pools hold device %x host %x", keys(te.dev), keys(te.host), keys(dev), keys(host))
			}
			hit := 24
			if read {
				hit = 0
			}
			if n := lookup(t, m, a)[0]; n != hit {
				t.Fatalf("Lookup(a) after the Unreserve = %d, want %d", n, hit)
			}
			noViolations(t, m)
		})
	}
}

// evWalk drives a manager with a host tier and KV events for
// TestPropertyHostTierEvents: whole prompts in one reservation, so the
// cache fills and spills to the host within a short walk.
type evWalk struct {
	m        *Manager
	cfg      kvcache.Config
	reserved map[kvcache.SeqID]int // live sequences: tokens of the outstanding reservation, -1 for none
	hist     map[kvcache.SeqID]int
	next     kvcache.SeqID
	read     *tierEvents // the events read so far, replayed
	n        *hostEventCounts
}

// hostEventCounts counts, over all walks, the host events read and the
// reconfigurations, so the test can show that the walks reach them.
type hostEventCounts struct{ stored, removed, resets int }

func (w *evWalk) seqs(reserved bool) []kvcache.SeqID {
	var out []kvcache.SeqID
	for id, tok := range w.reserved {
		if (tok >= 0) == reserved {
			out = append(out, id)
		}
	}
	slices.Sort(out)
	return out
}

func (w *evWalk) New(t *rapid.T) {
	// 1 to 10 blocks of six patterns, then a tail of 0 to 3 tokens: many
	// distinct chains, some shared prefixes.
	var p []int32
	for _, b := range rapid.SliceOfN(rapid.IntRange(0, 5), 1, 10).Draw(t, "blocks") {
		for i := range propTPB {
			p = append(p, int32(10*b+i))
		}
	}
	p = append(p, rapid.SliceOfN(rapid.Int32Range(0, 1), 0, 3).Draw(t, "tail")...)
	n, _ := w.m.Lookup(bg, []kvcache.LookupItem{{Prompt: p}})
	reuse := rapid.IntRange(0, n[0]/propTPB).Draw(t, "reuseBlocks") * propTPB
	id := w.next
	w.next++
	g, err := w.m.Reserve(bg, []kvcache.ReserveItem{{Seq: id, New: true, Prompt: p, Reuse: reuse, Tokens: len(p) - reuse}})
	if err != nil {
		t.Fatal(err)
	}
	if g[0].OK {
		w.reserved[id], w.hist[id] = len(p)-reuse, reuse
	}
}

func (w *evWalk) Step(t *rapid.T) {
	ids := w.seqs(false)
	if len(ids) == 0 {
		t.Skip("no idle sequence")
	}
	id := rapid.SampledFrom(ids).Draw(t, "seq")
	tok := rapid.IntRange(1, 8).Draw(t, "tokens")
	if w.hist[id]+tok > w.cfg.MaxSeqLen {
		t.Skip("at max_seq_len")
	}
	g, err := w.m.Reserve(bg, []kvcache.ReserveItem{{Seq: id, Tokens: tok}})
	if err != nil {
		t.Fatal(err)
	}
	if g[0].OK {
		w.reserved[id] = tok
	}
}

func (w *evWalk) Commit(t *rapid.T) {
	ids := w.seqs(true)
	if len(ids) == 0 {
		t.Skip("no reservation")
	}
	id := rapid.SampledFrom(ids).Draw(t, "seq")
	if _, err := w.m.Commit(bg, []kvcache.CommitItem{{Seq: id, Accepted: w.reserved[id]}}); err != nil {
		t.Fatal(err)
	}
	w.hist[id] += w.reserved[id]
	w.reserved[id] = -1
}

func (w *evWalk) Unreserve(t *rapid.T) {
	ids := w.seqs(true)
	if len(ids) == 0 {
		t.Skip("no reservation")
	}
	id := rapid.SampledFrom(ids).Draw(t, "seq")
	if err := w.m.Unreserve(bg, []kvcache.SeqID{id}); err != nil {
		t.Fatal(err)
	}
	w.reserved[id] = -1
	if w.m.seqs[id] == nil { // it was new: gone
		delete(w.reserved, id)
		delete(w.hist, id)
	}
}

func (w *evWalk) Release(t *rapid.T) {
	ids := append(w.seqs(true), w.seqs(false)...)
	if len(ids) == 0 {
		t.Skip("no sequence")
	}
	id := rapid.SampledFrom(ids).Draw(t, "seq")
	if err := w.m.Release(bg, []kvcache.SeqID{id}); err != nil {
		t.Fatal(err)
	}
	delete(w.reserved, id)
	delete(w.hist, id)
}

func (w *evWalk) Events(t *rapid.T) {
	evs, err := w.m.Events(bg)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range evs {
		switch {
		case e.Kind == kvcache.BlockStored && e.Tier == kvcache.TierHost:
			w.n.stored += len(e.Hashes)
		case e.Kind == kvcache.BlockRemoved && e.Tier == kvcache.TierHost:
			w.n.removed += len(e.Hashes)
		}
	}
	if bad := w.read.apply(evs, propTPB); bad != "" {
		t.Fatalf("Events: %s", bad)
	}
}

func (w *evWalk) Configure(t *rapid.T) {
	if rapid.IntRange(0, 19).Draw(t, "configureDie") != 0 {
		t.Skip("Configure is rare")
	}
	if _, err := w.m.Configure(bg, w.cfg); err != nil {
		t.Fatal(err)
	}
	clear(w.reserved)
	clear(w.hist)
	w.n.resets++
}

// Check: no self-check violation, and the events read so far followed by
// the unread ones say what the first pool's tiers hold.
func (w *evWalk) Check(t *rapid.T) {
	snap, err := w.m.Inspect(bg, kvcache.InspectOptions{Tables: true})
	if err != nil || len(snap.Violations) > 0 {
		t.Fatalf("Inspect: %v, violations %v", err, snap.Violations)
	}
	now := w.read.clone()
	if bad := now.apply(w.m.ev.Unread(), propTPB); bad != "" {
		t.Fatalf("unread events: %s", bad)
	}
	dev, host := tierHashes(w.m)
	if !maps.Equal(now.dev, dev) {
		t.Fatalf("events say the device holds %x; it holds %x", keys(now.dev), keys(dev))
	}
	if !maps.Equal(now.host, host) {
		t.Fatalf("events say the host holds %x; it holds %x", keys(now.host), keys(host))
	}
}

// TestPropertyHostTierEvents: on random walks over the property test's
// stage (two paged pools, so the second's blocks must produce no event)
// with a host tier and KV events, after every action the event stream
// (the events read so far, then the unread ones) replays into the hashes
// the first device pool holds and those its host pool holds settled.
// Events are read at random points, so an Unreserve meets both read and
// unread removals.
func TestPropertyHostTierEvents(t *testing.T) {
	var n hostEventCounts
	rapid.Check(t, func(t *rapid.T) {
		cfg := propConfig()
		cfg.HostBytes = propHostBlocks * propTPB * 100
		cfg.KVEvents = true
		cfg.EvictionPolicy = rapid.SampledFrom([]string{kvcache.EvictionLRU, kvcache.EvictionLFU}).Draw(t, "policy")
		m := New()
		if _, err := m.Configure(bg, cfg); err != nil {
			t.Fatal(err)
		}
		w := &evWalk{m: m, cfg: cfg, reserved: map[kvcache.SeqID]int{}, hist: map[kvcache.SeqID]int{},
			next: 1, read: newTierEvents(), n: &n}
		t.Repeat(map[string]func(*rapid.T){
			// New and Commit twice as often as the rest: the cache fills.
			"new": w.New, "new2": w.New, "commit": w.Commit, "commit2": w.Commit,
			"step": w.Step, "unreserve": w.Unreserve, "release": w.Release, "events": w.Events, "configure": w.Configure,
			"": w.Check,
		})
	})
	if testing.Short() {
		return // 20 walks of 15 actions may read none
	}
	if n.stored == 0 || n.removed == 0 || n.resets == 0 {
		t.Fatalf("the walks read %d host stores and %d host removals, and reconfigured %d times: want some of each", n.stored, n.removed, n.resets)
	}
	t.Logf("read %d host stores and %d host removals; reconfigured %d times", n.stored, n.removed, n.resets)
}

// A device BlockStored whose parent is the hash a host BlockStored just
// recorded starts an event of its own: seq 2 commits block 0 of [1 3]
// while seq 1's cached block holds it, then its next reservation evicts
// that block to the host, and the commit reports the host store of block
// 0 and the device store of block 1, its child.
func TestHostEventsTiersNeverJoin(t *testing.T) {
	cfg := hostConfig(8)
	cfg.KVEvents = true
	m := configured(t, cfg)
	x := prompt(4, []int32{1}, 1, 1)
	mustGrant(t, m, kvcache.ReserveItem{Seq: 1, New: true, Tokens: len(x), Prompt: x})
	commit(t, m, 1, len(x))
	release(t, m, 1)
	y := prompt(4, []int32{1, 3}, 1, 2)
	mustGrant(t, m, kvcache.ReserveItem{Seq: 2, New: true, Tokens: 4, Prompt: y})
	commit(t, m, 2, 4) // block 0 stays unregistered: seq 1's holds its hash
	mustGrant(t, m, kvcache.ReserveItem{Seq: 3, New: true, Tokens: 32, Prompt: prompt(4, nil, 32, 3)})
	mustGrant(t, m, kvcache.ReserveItem{Seq: 4, New: true, Tokens: 24, Prompt: prompt(4, nil, 24, 4)})
	evs, _ := m.Events(bg)
	h1 := byTier(evs, kvcache.BlockStored, kvcache.TierDevice)
	if len(h1) != 1 {
		t.Fatalf("events so far %+v, want one device store (block 1 of seq 1)", evs)
	}
	if g := mustGrant(t, m, kvcache.ReserveItem{Seq: 2, Tokens: 4}); len(g.Copies) != 1 {
		t.Fatalf("grant %+v, want seq 1's cached block offloaded", g)
	}
	commit(t, m, 2, 4)
	evs, _ = m.Events(bg)
	if len(evs) != 3 || evs[0].Tier != kvcache.TierDevice || evs[0].Kind != kvcache.BlockRemoved ||
		evs[1].Tier != kvcache.TierHost || !slices.Equal(evs[1].Hashes, h1) ||
		evs[2].Tier != kvcache.TierDevice || evs[2].Kind != kvcache.BlockStored || len(evs[2].Hashes) != 1 ||
		!evs[2].HasParent || evs[2].Parent != h1[0] {
		t.Fatalf("events %+v, want the device removal and the host store of %x, then a device store of its child", evs, h1)
	}
}
