package mamba

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
)

// TestInspectSealsTables: with Tables and CheckTables the core checks every
// pool's tables, the ssm pool's included, against the reference counts
// (cachemgrv2.Core.Seal), and finds what kvcache.CheckTables finds on the
// unsealed snapshot of the same state, sound or corrupted.
func TestInspectSealsTables(t *testing.T) {
	const tpb = 16
	m, lay := configured(t, testConfig(tpb, 64, 8))
	p := tokens(3*tpb+5, 1)
	prefill(t, m, 1, p, 2*tpb)
	compare := func(when string) {
		t.Helper()
		open, err := m.Inspect(context.Background(), kvcache.InspectOptions{Tables: true})
		if err != nil {
			t.Fatalf("%s: Inspect(Tables): %v", when, err)
		}
		var want []string
		for _, f := range kvcache.CheckTables(lay.Pools, &open) {
			want = append(want, "tables: "+f)
		}
		sealed, err := m.Inspect(context.Background(), kvcache.InspectOptions{Tables: true, CheckTables: true})
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
		if !slices.Equal(got, want) {
			t.Fatalf("%s: sealed findings %q, want CheckTables' %q", when, got, want)
		}
		if strings.Contains(when, "corrupt") && len(want) == 0 {
			t.Fatalf("%s: CheckTables finds nothing", when)
		}
	}
	compare("sound")
	mustClean(t, m, "sound")
	x := stateOf(m.Seq(1))
	m.life.ssm.refs[x.live]++
	compare("corrupted ssm count")
}
