package pluginrpc_test

import (
	"context"
	"slices"
	"strings"
	"testing"

	cachemgrv1 "github.com/kvx-dev/kvx/cachemgr_v1"
	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
	"github.com/kvx-dev/kvx/plugins/v1/pipeline"
	"github.com/kvx-dev/kvx/plugins/v1/pluginrpc"
)

// leakyInspect is a manager whose deep snapshot reports one reference too
// many on block 0 of its first pool, as a manager that leaked it would.
type leakyInspect struct{ kvcache.Manager }

func (m leakyInspect) Inspect(ctx context.Context, opts kvcache.InspectOptions) (kvcache.Snapshot, error) {
	s, err := m.Manager.Inspect(ctx, opts)
	if err == nil && opts.Tables && len(s.RefCounts) > 0 {
		s.RefCounts[0][0]++
	}
	return s, err
}

// TestTablesCheckedInThePlugin: with InspectOptions.CheckTables the plugin
// server checks a deep snapshot's tables against its reference counts and
// leaves both out, on every path a snapshot takes (Inspect over gRPC,
// EndStep on the data plane, a started end of step); the findings come back
// as violations. Without CheckTables the tables cross as before.
func TestTablesCheckedInThePlugin(t *testing.T) {
	ctx := context.Background()
	deep := kvcache.InspectOptions{Tables: true, CheckTables: true}
	paths := []struct {
		name    string
		inspect func(m kvcache.Manager, opts kvcache.InspectOptions) (kvcache.Snapshot, error)
	}{
		{"Inspect", func(m kvcache.Manager, opts kvcache.InspectOptions) (kvcache.Snapshot, error) {
			return m.Inspect(ctx, opts)
		}},
		{"EndStep", func(m kvcache.Manager, opts kvcache.InspectOptions) (kvcache.Snapshot, error) {
			res, err := pipeline.EndStep(ctx, m, pipeline.EndStepRequest{Inspect: &opts})
			return *res.Snapshot, err
		}},
		{"StartEndStep", func(m kvcache.Manager, opts kvcache.InspectOptions) (kvcache.Snapshot, error) {
			res, err := pipeline.StartEndStep(ctx, m, pipeline.EndStepRequest{Inspect: &opts})()
			return *res.Snapshot, err
		}},
	}
	for _, p := range paths {
		for _, leaky := range []bool{false, true} {
			name := p.name + "/sound"
			var impl kvcache.Manager = cachemgrv1.New()
			if leaky {
				name, impl = p.name+"/leaky", leakyInspect{impl}
			}
			t.Run(name, func(t *testing.T) {
				m := pluginrpc.TestManagerPair(t, impl)
				if _, err := m.Configure(ctx, endStepConfig()); err != nil {
					t.Fatal(err)
				}
				if g, err := m.Reserve(ctx, []kvcache.ReserveItem{{Seq: 1, New: true, Tokens: 40}}); err != nil || !g[0].OK {
					t.Fatalf("Reserve = %+v, %v", g, err)
				}
				s, err := p.inspect(m, deep)
				if err != nil {
					t.Fatal(err)
				}
				if !s.TablesChecked || s.RefCounts != nil || len(s.Seqs) != 1 || s.Seqs[0].Tables != nil {
					t.Fatalf("snapshot not sealed: checked %v, %d ref-count tables, seqs %+v", s.TablesChecked, len(s.RefCounts), s.Seqs)
				}
				found := slices.ContainsFunc(s.Violations, func(v string) bool {
					return strings.HasPrefix(v, "tables: ") && strings.Contains(v, "block 0: reference count 2, tables reference it 1 times")
				})
				if found != leaky || (!leaky && len(s.Violations) > 0) {
					t.Fatalf("violations %q for a leaky manager %v", s.Violations, leaky)
				}
				// Without CheckTables the tables come back, for the caller to check.
				s, err = p.inspect(m, kvcache.InspectOptions{Tables: true})
				if err != nil {
					t.Fatal(err)
				}
				if s.TablesChecked || len(s.RefCounts) == 0 || len(s.Seqs) != 1 || len(s.Seqs[0].Tables) == 0 {
					t.Fatalf("tables missing without CheckTables: %+v", s)
				}
			})
		}
	}
}
