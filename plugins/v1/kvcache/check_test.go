package kvcache_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
)

func checkPools() []kvcache.Pool {
	return []kvcache.Pool{
		{ID: 0, Name: "full", Blocks: 4, TokensPerBlock: 16},
		{ID: 1, Name: "window-32", Blocks: 3, TokensPerBlock: 16, Window: 32},
	}
}

// soundSnapshot: seqs 1 and 2 share block 0 of the full pool (reuse);
// seq 2's windowed table has released its first slot.
func soundSnapshot() kvcache.Snapshot {
	return kvcache.Snapshot{
		Seqs: []kvcache.SeqState{
			{Seq: 1, Tables: [][]kvcache.BlockID{{0, 1}, {0}}},
			{Seq: 2, Tables: [][]kvcache.BlockID{{0, 2}, {-1, 1}}},
		},
		RefCounts: [][]int32{{2, 1, 1, 0}, {1, 1, 0}},
	}
}

func TestCheckTables(t *testing.T) {
	for _, c := range []struct {
		name   string
		mutate func(s *kvcache.Snapshot)
		want   string // a finding contains it; "" for none
	}{
		{"sound", func(*kvcache.Snapshot) {}, ""},
		{"count too low", func(s *kvcache.Snapshot) { s.RefCounts[0][0] = 1 }, "pool full block 0: reference count 1, tables reference it 2 times"},
		{"block owned twice", func(s *kvcache.Snapshot) { s.Seqs[1].Tables[0][1] = 1 }, "pool full block 1: reference count 1, tables reference it 2 times"},
		{"leaked block", func(s *kvcache.Snapshot) { s.RefCounts[1][2] = 1 }, "pool window-32 block 2: reference count 1, tables reference it 0 times"},
		{"beyond the pool", func(s *kvcache.Snapshot) { s.Seqs[0].Tables[1][0] = 3 }, "request 1: block 3 beyond pool window-32 of 3 blocks"},
		{"table of no pool", func(s *kvcache.Snapshot) { s.Seqs[0].Tables = append(s.Seqs[0].Tables, []kvcache.BlockID{0}) }, "request 1: table for pool 2 of 2"},
		{"short counts", func(s *kvcache.Snapshot) { s.RefCounts[1] = s.RefCounts[1][:2] }, "pool window-32: 2 reference counts for 3 blocks"},
		{"missing counts", func(s *kvcache.Snapshot) { s.RefCounts = nil }, "0 reference-count tables for 2 pools"},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := soundSnapshot()
			c.mutate(&s)
			got := kvcache.CheckTables(checkPools(), &s)
			if c.want == "" {
				if len(got) != 0 {
					t.Fatalf("findings %q on a sound snapshot", got)
				}
				return
			}
			if !slices.ContainsFunc(got, func(f string) bool { return strings.Contains(f, c.want) }) {
				t.Fatalf("findings %q, want one with %q", got, c.want)
			}
		})
	}
}

func TestCheckTablesBoundsItsFindings(t *testing.T) {
	pools := []kvcache.Pool{{Name: "full", Blocks: 100, TokensPerBlock: 16}}
	s := kvcache.Snapshot{RefCounts: [][]int32{make([]int32, 100)}}
	for b := range s.RefCounts[0] {
		s.RefCounts[0][b] = 1 // every block leaked
	}
	if got := kvcache.CheckTables(pools, &s); len(got) == 0 || len(got) > 11 {
		t.Fatalf("%d findings for 100 leaked blocks, want between 1 and 11", len(got))
	}
}

func TestSealTables(t *testing.T) {
	pools := checkPools()
	deep := kvcache.InspectOptions{Tables: true, CheckTables: true}

	s := soundSnapshot()
	s.RefCounts[0][3] = 1 // a leaked block
	s.Violations = []string{"the manager's own finding"}
	kvcache.SealTables(pools, deep, &s)
	if !s.TablesChecked || s.RefCounts != nil || s.Seqs[0].Tables != nil || s.Seqs[1].Tables != nil {
		t.Fatalf("sealed snapshot still carries tables or is not marked: %+v", s)
	}
	want := []string{"the manager's own finding", "tables: pool full block 3: reference count 1, tables reference it 0 times"}
	if !slices.Equal(s.Violations, want) {
		t.Fatalf("Violations = %q, want %q", s.Violations, want)
	}

	// Sealing twice changes nothing: the tables are gone, the findings stay.
	again := s
	kvcache.SealTables(pools, deep, &again)
	if !slices.Equal(again.Violations, want) {
		t.Fatalf("second seal: Violations = %q, want %q", again.Violations, want)
	}

	// Without CheckTables, or without Tables, the snapshot is left alone.
	for _, opts := range []kvcache.InspectOptions{{Tables: true}, {CheckTables: true}} {
		s := soundSnapshot()
		kvcache.SealTables(pools, opts, &s)
		if s.TablesChecked || s.RefCounts == nil || s.Seqs[0].Tables == nil {
			t.Fatalf("opts %+v: snapshot changed: %+v", opts, s)
		}
	}
}
