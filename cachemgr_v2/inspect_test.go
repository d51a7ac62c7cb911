package cachemgrv2

import (
	"slices"
	"strings"
	"testing"

	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
)

// TestInspectSealsTables: Inspect with Tables and CheckTables checks the
// tables against the reference counts itself (Seal, no copy of a pool's
// counts) and finds what kvcache.CheckTables finds on the unsealed
// snapshot of the same state, sound or corrupted, on both tiers.
func TestInspectSealsTables(t *testing.T) {
	m, lay := configure(t, smallCfg(16, 16))
	p := tokens(13, 1)
	mustGrant(t, m, kvcache.ReserveItem{Seq: 1, Tokens: 13, New: true, Prompt: p})
	mustCommit(t, m, 1, 13)
	mustGrant(t, m, kvcache.ReserveItem{Seq: 2, Tokens: 1, New: true, Prompt: p, Reuse: 12})
	mustCommit(t, m, 2, 1)
	mustGrant(t, m, kvcache.ReserveItem{Seq: 3, Tokens: 9, New: true, Prompt: tokens(9, 3)})
	mustCommit(t, m, 3, 9)
	if ok, _, err := m.Suspend(ctx, []kvcache.SeqID{3}); err != nil || !ok[0] {
		t.Fatalf("Suspend(3) = %v, %v; want suspended", ok, err)
	}
	compare := func(when string) {
		t.Helper()
		open, err := m.Inspect(ctx, kvcache.InspectOptions{Tables: true})
		if err != nil {
			t.Fatalf("%s: Inspect(Tables): %v", when, err)
		}
		var want []string
		for _, f := range kvcache.CheckTables(lay.Pools, &open) {
			want = append(want, "tables: "+f)
		}
		sealed, err := m.Inspect(ctx, kvcache.InspectOptions{Tables: true, CheckTables: true})
		if err != nil {
			t.Fatalf("%s: Inspect(Tables, CheckTables): %v", when, err)
		}
		if !sealed.TablesChecked || sealed.RefCounts != nil {
			t.Fatalf("%s: sealed snapshot: TablesChecked %v, %d reference-count tables; want true, none", when, sealed.TablesChecked, len(sealed.RefCounts))
		}
		var got []string
		for _, v := range sealed.Violations {
			if strings.HasPrefix(v, "tables: ") {
				got = append(got, v)
			}
		}
		for _, s := range sealed.Seqs {
			if s.Tables != nil {
				t.Fatalf("%s: sealed snapshot keeps seq %d's tables", when, s.Seq)
			}
		}
		if !slices.Equal(got, want) {
			t.Fatalf("%s: sealed findings %q, want CheckTables' %q", when, got, want)
		}
	}
	compare("sound")
	if v := inspect(t, m).Violations; len(v) > 0 {
		t.Fatalf("sound state: %v", v)
	}
	m.dev[0].refs[m.seqs[1].tables[0][0]]++
	hb := present(m.seqs[3].host[0]) // its private block moved; the cached ones stayed
	if len(hb) == 0 {
		t.Fatal("suspended seq 3 holds no host block")
	}
	m.host[0].refs[hb[0]]--
	compare("corrupted")
	open, _ := m.Inspect(ctx, kvcache.InspectOptions{Tables: true})
	if f := kvcache.CheckTables(lay.Pools, &open); len(f) != 2 {
		t.Fatalf("CheckTables after corrupting a device and a host count = %q, want two findings", f)
	}
}
