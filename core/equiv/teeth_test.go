package equiv_test

import (
	"context"
	"slices"
	"testing"

	cachemgrv1 "github.com/kvx-dev/kvx/cachemgr_v1"
	"github.com/kvx-dev/kvx/cmd/builtin"
	"github.com/kvx-dev/kvx/core/config"
	"github.com/kvx-dev/kvx/core/engine"
	"github.com/kvx-dev/kvx/core/setup"
	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
)

// aliasing is a broken manager: in the grant of the third new sequence it
// swaps its first block after the shared prefix for the same block of
// another sequence, so two sequences write their KV into one block. Its own bookkeeping
// stays consistent (the engine's invariant checks pass); only the outputs
// can tell.
type aliasing struct {
	kvcache.Manager
	news    int
	blocks  map[kvcache.SeqID][]kvcache.BlockID // pool 0 tables as granted
	aliased bool
}

// shared is the number of blocks of the workload's shared prompt prefix
// (workload.shared_prefix_tokens 48 over 16 tokens per block).
const shared = 3

func (a *aliasing) Reserve(ctx context.Context, items []kvcache.ReserveItem) ([]kvcache.Grant, error) {
	gs, err := a.Manager.Reserve(ctx, items)
	for i := range gs {
		g := &gs[i]
		if !g.OK || len(g.Tables) == 0 {
			continue
		}
		d := &g.Tables[0]
		if items[i].New {
			a.news++
			if a.news == 3 && len(d.Blocks) > shared {
				// Another sequence's first block after the shared prefix:
				// private to it, holding prompt KV it reads until it ends.
				for other, bs := range a.blocks {
					if other != g.Seq && len(bs) > shared && !slices.Contains(d.Blocks, bs[shared]) {
						d.Blocks = slices.Clone(d.Blocks)
						d.Blocks[shared] = bs[shared]
						a.aliased = true
						break
					}
				}
			}
		}
		a.blocks[g.Seq] = append(a.blocks[g.Seq][:d.From], d.Blocks...)
	}
	return gs, err
}

// TestEquivalenceHasTeeth: the suite's oracle catches a manager that hands
// out a wrong block table, naming the request.
func TestEquivalenceHasTeeth(t *testing.T) {
	f := families[0]
	sets := slices.Concat(common, f.sets, []string{"cache_manager=v1", "max_num_tokens=64", "isolation=inprocess", "plugin_dirs=" + binDir})
	cfg, _, err := config.Load(builtin.Registry(), nil, nil, sets)
	if err != nil {
		t.Fatal(err)
	}
	res, err := setup.Resolve(cfg, "broken", true)
	if err != nil {
		t.Fatal(err)
	}
	res.Spec.KeepOutputs = true
	reg := builtin.Registry()
	broken := &aliasing{Manager: cachemgrv1.New(), blocks: map[kvcache.SeqID][]kvcache.BlockID{}}
	for i := range reg.Managers {
		if reg.Managers[i].Name == "v1" {
			reg.Managers[i].New = func() kvcache.Manager { return broken }
		}
	}
	l := setup.NewLauncher(cfg, reg, nil)
	defer l.Close()
	rep, err := engine.Run(context.Background(), res.Spec, l)
	if err != nil {
		t.Fatalf("run: %v", err)
	}
	wl, err := setup.Workload(cfg, cfg.ModelSpec().Vocab)
	if err != nil {
		t.Fatal(err)
	}
	if !broken.aliased {
		t.Fatal("the broken manager found no block to alias")
	}
	d := compare(t, newOracle(t, cfg, wl), rep)
	if d == "" {
		t.Fatal("a manager that aliases two sequences' blocks went unnoticed")
	}
	t.Logf("caught: %s", d)
}
