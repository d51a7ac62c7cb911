package conformance

import (
	"strings"
	"testing"

	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
)

func TestNumberIn(t *testing.T) {
	tests := []struct {
		msg  string
		n    int64
		want bool
	}{
		{"max_seq_len 1024 needs", 1024, true},
		{"max_seq_len 1,024 needs", 1024, true},
		{"budget 41_943_040 bytes", 41943040, true},
		{"budget 41 943 040 bytes", 41943040, true},
		{"needs 10240 tokens", 1024, false},
		{"needs 21024 tokens", 1024, false},
		{"1024", 1024, true},
		{"no numbers", 7, false},
	}
	for _, tt := range tests {
		if got := numberIn(tt.msg, tt.n); got != tt.want {
			t.Errorf("numberIn(%q, %d) = %v, want %v", tt.msg, tt.n, got, tt.want)
		}
	}
}

// sound is a consistent snapshot of a layout with one full pool of 4
// blocks and one 64-token window pool of 4 blocks: two sequences that share
// block 0 of the full pool.
func sound() (*mh, kvcache.Snapshot) {
	h := &mh{tpb: 16, layout: kvcache.Layout{MaxSeqTokens: 64, Pools: []kvcache.Pool{
		{ID: 0, Tier: kvcache.TierDevice, TokensPerBlock: 16, Blocks: 4},
		{ID: 5, Tier: kvcache.TierDevice, Window: 64, TokensPerBlock: 16, Blocks: 4},
	}}, full: []int{0}}
	s := kvcache.Snapshot{
		Pools: []kvcache.PoolStats{{Pool: 0, Total: 4, Free: 1, InUse: 3}, {Pool: 5, Total: 4, Free: 1, InUse: 3}},
		Seqs: []kvcache.SeqState{
			{Seq: 1, History: 20, Capacity: 20, Blocks: []int{2, 1}, Tables: [][]kvcache.BlockID{{0, 1}, {-1, 0}}},
			{Seq: 2, History: 16, Capacity: 19, Reserved: 3, Draft: 2, Blocks: []int{2, 2}, Tables: [][]kvcache.BlockID{{0, 2}, {1, 2}}},
		},
		RefCounts: [][]int32{{2, 1, 1, 0}, {1, 1, 1, 0}},
	}
	return h, s
}

func TestInvariants(t *testing.T) {
	h, s := sound()
	if bad := h.invariants(s); len(bad) != 0 {
		t.Fatalf("invariants(sound) = %q, want none", bad)
	}
	tests := []struct {
		name   string
		mutate func(s *kvcache.Snapshot)
		want   string
	}{
		{"self-check", func(s *kvcache.Snapshot) { s.Violations = []string{"x"} }, "self-check"},
		{"history beyond capacity", func(s *kvcache.Snapshot) { s.Seqs[0].History = 21 }, "want 0 <= history <= capacity"},
		{"capacity beyond MaxSeqTokens", func(s *kvcache.Snapshot) { s.Seqs[1].Capacity = 65 }, "MaxSeqTokens"},
		{"draft beyond reserved", func(s *kvcache.Snapshot) { s.Seqs[1].Draft = 4 }, "Draft <= Reserved"},
		{"unbacked capacity", func(s *kvcache.Snapshot) { s.Seqs[0].Capacity = 33 }, "back capacity 33"},
		{"pool sum", func(s *kvcache.Snapshot) { s.Pools[0].Free = 2 }, "!= Total"},
		{"pool total", func(s *kvcache.Snapshot) { s.Pools[1].Total, s.Pools[1].Free = 5, 2 }, "the layout's Blocks"},
		{"refcount", func(s *kvcache.Snapshot) { s.RefCounts[0][0] = 1 }, "RefCount 1, the tables reference it 2 times"},
		{"in use", func(s *kvcache.Snapshot) { s.Pools[0].InUse, s.Pools[0].Free = 2, 2 }, "InUse 2, 3 blocks"},
		{"block out of range", func(s *kvcache.Snapshot) { s.Seqs[0].Tables[0][1] = 4 }, "outside [0, 4)"},
		{"negative entry in a full pool", func(s *kvcache.Snapshot) { s.Seqs[0].Tables[0][1] = -1 }, "outside [0, 4)"},
		{"block twice in a table", func(s *kvcache.Snapshot) { s.Seqs[1].Tables[1][1] = 1 }, "twice in one table"},
		{"blocks count", func(s *kvcache.Snapshot) { s.Seqs[1].Blocks[1] = 1 }, "Blocks 1, its table holds 2"},
		{"missing tables", func(s *kvcache.Snapshot) { s.Seqs[1].Tables = nil }, "0 Tables for 2 pools"},
		{"missing refcounts", func(s *kvcache.Snapshot) { s.RefCounts = nil }, "0 RefCounts for 2 pools"},
	}
	for _, tt := range tests {
		h, s := sound()
		tt.mutate(&s)
		bad := h.invariants(s)
		if !strings.Contains(strings.Join(bad, "; "), tt.want) {
			t.Errorf("%s: invariants = %q, want a finding containing %q", tt.name, bad, tt.want)
		}
	}
}

func TestDiffSnap(t *testing.T) {
	_, a := sound()
	_, b := sound()
	if d := diffSnap(a, b); d != "" {
		t.Fatalf("diffSnap(equal) = %q", d)
	}
	b = deepSnap(a)
	b.Seqs[1].Tables[0][1] = 3
	if d := diffSnap(a, b); !strings.Contains(d, "seq 2") {
		t.Errorf("diffSnap(table changed) = %q, want it to name seq 2", d)
	}
	if a.Seqs[1].Tables[0][1] != 2 {
		t.Errorf("deepSnap shares tables with its source")
	}
	b = deepSnap(a)
	b.RefCounts[1][3] = 1
	if d := diffSnap(a, b); !strings.Contains(d, "RefCounts[1]: block 3") {
		t.Errorf("diffSnap(refcount changed) = %q", d)
	}
	b = deepSnap(a)
	b.Seqs = b.Seqs[:1]
	if d := diffSnap(a, b); !strings.Contains(d, "sequences [1 2], then [1]") {
		t.Errorf("diffSnap(seq gone) = %q", d)
	}
}
