package cachemgrv2

import (
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
)

// recorder is a Hooks that logs every call and answers as told: the
// contract of Hooks as the Core must keep it, without the mamba manager.
type recorder struct {
	log      []string
	admit    string // Admit's answer
	reusable func(end *Node, tokens int) bool
	hold     bool // CanSuspend and CanResume answer !hold
}

func (r *recorder) add(format string, args ...any) {
	r.log = append(r.log, fmt.Sprintf(format, args...))
}

func (r *recorder) Reusable(end *Node, tokens int) bool {
	return r.reusable == nil || r.reusable(end, tokens)
}
func (r *recorder) Admit(it *kvcache.ReserveItem) string { r.add("admit %d", it.Seq); return r.admit }
func (r *recorder) Reserved(s *Seq, it *kvcache.ReserveItem, g *kvcache.Grant) {
	r.add("reserved %d new %v history %d path %d", s.ID(), s.New(), s.Ledger().History, len(s.Path()))
	if s.New() {
		s.Ext = "mine"
	}
	g.Copies = append(g.Copies, kvcache.Copy{SrcPool: 9, DstPool: 9})
}
func (r *recorder) Tables(s *Seq, dst []kvcache.TableDelta) []kvcache.TableDelta {
	return append(dst, kvcache.TableDelta{Pool: 9})
}
func (r *recorder) Unreserved(s *Seq) { r.add("unreserved %d", s.ID()) }
func (r *recorder) Committed(s *Seq) {
	r.add("committed %d history %d path %d ext %v", s.ID(), s.Ledger().History, len(s.Path()), s.Ext)
}
func (r *recorder) Dropped(s *Seq, touch bool) {
	r.add("dropped %d touch %v path %d", s.ID(), touch, len(s.Path()))
}
func (r *recorder) Evicted(n *Node)      { r.add("evicted complete %v", n.Complete()) }
func (r *recorder) CanSuspend(*Seq) bool { return !r.hold }
func (r *recorder) Suspended(s *Seq, c []kvcache.Copy) []kvcache.Copy {
	r.add("suspended %d", s.ID())
	return append(c, kvcache.Copy{SrcPool: 9, DstPool: 10})
}
func (r *recorder) CanResume(*Seq) bool { return !r.hold }
func (r *recorder) CanFork(p *Seq, child kvcache.SeqID) string {
	r.add("canfork %d %d", p.ID(), child)
	return r.admit
}
func (r *recorder) Forked(p, s *Seq, g *kvcache.Grant) { r.add("forked %d %d", p.ID(), s.ID()) }
func (r *recorder) Resumed(s *Seq, c []kvcache.Copy) []kvcache.Copy {
	r.add("resumed %d", s.ID())
	return append(c, kvcache.Copy{SrcPool: 10, DstPool: 9})
}

func (r *recorder) take() []string {
	l := r.log
	r.log = nil
	return l
}

func hooked(t *testing.T, blocks, host int) (*Manager, *recorder) {
	t.Helper()
	cfg := smallCfg(blocks, host)
	groups, _, dev, hb, err := planLayout(&cfg)
	if err != nil {
		t.Fatal(err)
	}
	r := &recorder{}
	m := New()
	m.Init(CoreConfig{Name: "hooked", Config: cfg, Groups: groups, DevBlocks: dev, HostBlocks: hb, HostID: len(groups), Reuse: true, Hooks: r})
	return m, r
}

// TestHooksAreCalledAtTheirPoints: the Core asks Admit before it takes
// anything (a denial leaves no trace), tells Reserved after the grant (with
// the ledger recorded), appends the hooks' deltas after its own in every
// grant and their copies after its own, tells Committed after registration,
// Dropped before it unpins the path, and Evicted for every node it evicts.
func TestHooksAreCalledAtTheirPoints(t *testing.T) {
	m, r := hooked(t, 10, 0)
	r.admit = "no capacity: hooks say no"
	before := inspect(t, m)
	if g := reserve1(t, m, kvcache.ReserveItem{Seq: 1, Tokens: 4, New: true, Prompt: tokens(9, 1)}); g.OK || g.Reason != r.admit || len(g.Copies) > 0 {
		t.Fatalf("grant %+v, want the Admit denial and nothing else", g)
	}
	if !reflect.DeepEqual(inspect(t, m), before) {
		t.Fatal("a denial by Admit changed the state")
	}
	if got := r.take(); !slices.Equal(got, []string{"admit 1"}) {
		t.Fatalf("calls %q, want only Admit", got)
	}
	r.admit = ""
	p := tokens(9, 1)
	g := mustGrant(t, m, kvcache.ReserveItem{Seq: 1, Tokens: 9, New: true, Prompt: p})
	if len(g.Tables) != 2 || g.Tables[0].Pool != 0 || g.Tables[1].Pool != 9 || len(g.Copies) != 1 {
		t.Fatalf("grant tables %+v copies %+v: want the core's delta, then the hooks'; the hooks' copy", g.Tables, g.Copies)
	}
	mustCommit(t, m, 1, 9)
	// A grant that changes no attention table still carries the hooks' delta.
	if g := mustGrant(t, m, kvcache.ReserveItem{Seq: 1, Tokens: 1}); len(g.Tables) != 2 || len(g.Tables[0].Blocks) != 0 {
		t.Fatalf("grant tables %+v, want an empty core delta and the hooks'", g.Tables)
	}
	mustCommit(t, m, 1, 1)
	if err := m.Release(ctx, []kvcache.SeqID{1}); err != nil {
		t.Fatal(err)
	}
	want := []string{
		"admit 1", "reserved 1 new true history 0 path 0",
		"committed 1 history 9 path 2 ext mine",
		"reserved 1 new false history 9 path 2",
		"committed 1 history 10 path 2 ext mine",
		"dropped 1 touch true path 2",
	}
	if got := r.take(); !slices.Equal(got, want) {
		t.Fatalf("calls\n%q\nwant\n%q", got, want)
	}
	// A max_seq_len reservation (9 of the 10 blocks) must evict one of the
	// two cached blocks, between Admit and Reserved.
	mustGrant(t, m, kvcache.ReserveItem{Seq: 2, Tokens: 32, Draft: 2, New: true})
	want = []string{"admit 2", "evicted complete false", "reserved 2 new true history 0 path 0"}
	if got := r.take(); !slices.Equal(got, want) {
		t.Fatalf("calls %q, want %q", got, want)
	}
	if err := m.Unreserve(ctx, []kvcache.SeqID{2}); err != nil {
		t.Fatal(err)
	}
	if got := r.take(); !slices.Equal(got, []string{"dropped 2 touch false path 0"}) {
		t.Fatalf("calls %q after undoing a creating reservation, want Dropped without touch", got)
	}
}

// TestHooksDecideReuseAndTier: Reusable false hides a cached prefix from
// Lookup and denies a Reuse of it, leaving no trace; CanSuspend and
// CanResume false keep a sequence where it is, changing nothing; true moves
// it with the hooks' copies after the core's.
func TestHooksDecideReuseAndTier(t *testing.T) {
	m, r := hooked(t, 16, 8)
	p := tokens(13, 1)
	mustGrant(t, m, kvcache.ReserveItem{Seq: 1, Tokens: 13, New: true, Prompt: p})
	mustCommit(t, m, 1, 13)
	r.reusable = func(end *Node, tokens int) bool { return tokens == 4 }
	if look, _ := m.Lookup(ctx, []kvcache.LookupItem{{Prompt: p}}); look[0] != 4 {
		t.Fatalf("Lookup = %v, want 4: the only length the hooks allow", look)
	}
	before := inspect(t, m)
	if g := reserve1(t, m, kvcache.ReserveItem{Seq: 2, Tokens: 1, New: true, Prompt: p, Reuse: 8}); g.OK || !strings.Contains(g.Reason, "no longer reusable") {
		t.Fatalf("Reserve with a Reuse the hooks refuse = %+v, want a denial", g)
	}
	if !reflect.DeepEqual(inspect(t, m), before) {
		t.Fatal("a Reuse denied by the hooks changed the state")
	}
	r.take()
	r.hold = true
	if ok, copies, err := m.Suspend(ctx, []kvcache.SeqID{1}); err != nil || ok[0] || len(copies) != 0 || !reflect.DeepEqual(inspect(t, m), before) {
		t.Fatalf("Suspend held by the hooks = %v, %v, %v: want false and no change", ok, copies, err)
	}
	r.hold = false
	ok, copies, err := m.Suspend(ctx, []kvcache.SeqID{1})
	if err != nil || !ok[0] || copies[len(copies)-1] != (kvcache.Copy{SrcPool: 9, DstPool: 10}) || len(copies) != 2 {
		t.Fatalf("Suspend = %v, %v, %v: want the core's copy of the private block, then the hooks'", ok, copies, err)
	}
	r.hold = true
	suspended := inspect(t, m)
	if ok, copies, err := m.Resume(ctx, []kvcache.SeqID{1}); err != nil || ok[0] || len(copies) != 0 || !reflect.DeepEqual(inspect(t, m), suspended) {
		t.Fatalf("Resume held by the hooks = %v, %v, %v: want false and no change", ok, copies, err)
	}
	r.hold = false
	ok, copies, err = m.Resume(ctx, []kvcache.SeqID{1})
	if err != nil || !ok[0] || copies[len(copies)-1] != (kvcache.Copy{SrcPool: 10, DstPool: 9}) {
		t.Fatalf("Resume = %v, %v, %v: want the hooks' copy last", ok, copies, err)
	}
	if got := r.take(); !slices.Equal(got, []string{"suspended 1", "resumed 1"}) {
		t.Fatalf("calls %q", got)
	}
	inspect(t, m)
}
