package conformance_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/kvx-dev/kvx/device"
	"github.com/kvx-dev/kvx/gqa"
	"github.com/kvx-dev/kvx/plugins/conformance"
	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
	"github.com/kvx-dev/kvx/plugins/v1/pluginrpc"
	"github.com/kvx-dev/kvx/plugins/v1/worker"
)

var ctx = context.Background()

// checksOf returns the names of the failed checks in err.
func checksOf(err error) []string {
	var names []string
	for _, v := range conformance.Violations(err) {
		names = append(names, v.Check)
	}
	return names
}

func TestReferenceManagerConforms(t *testing.T) {
	// The suite must not be stricter than the contract: the smallest
	// correct manager passes it, in-process and over gRPC.
	t.Run("inprocess", func(t *testing.T) {
		conformance.TestManager(t, func() kvcache.Manager { return &refManager{} }, conformance.ManagerOptions{Reuse: true})
	})
	t.Run("grpc", func(t *testing.T) {
		conformance.TestManager(t, func() kvcache.Manager { return pluginrpc.TestManagerPair(t, &refManager{}) }, conformance.ManagerOptions{RandomOps: 300})
	})
}

// denialErrors turns every denial into an error.
type denialErrors struct{ kvcache.Manager }

func (d denialErrors) Reserve(ctx context.Context, items []kvcache.ReserveItem) ([]kvcache.Grant, error) {
	gs, err := d.Manager.Reserve(ctx, items)
	for _, g := range gs {
		if !g.OK {
			return nil, fmt.Errorf("out of blocks for seq %d: %s", g.Seq, g.Reason)
		}
	}
	return gs, err
}

// claimsHostTier says HostTier in Info but is no kvcache.Suspender.
type claimsHostTier struct{ kvcache.Manager }

func (c claimsHostTier) Info(ctx context.Context) (kvcache.Info, error) {
	info, err := c.Manager.Info(ctx)
	info.Capabilities.HostTier = true
	return info, err
}

// silentSuspender is a Suspender without a host tier whose Suspend and
// Resume succeed instead of answering ErrUnsupported.
type silentSuspender struct{ kvcache.Manager }

func (silentSuspender) Suspend(context.Context, []kvcache.SeqID) ([]bool, []kvcache.Copy, error) {
	return nil, nil, nil
}

func (silentSuspender) Resume(context.Context, []kvcache.SeqID) ([]bool, []kvcache.Copy, error) {
	return nil, nil, nil
}

// panicky panics in Commit.
type panicky struct{ kvcache.Manager }

func (panicky) Commit(context.Context, []kvcache.CommitItem) (kvcache.CommitResult, error) {
	panic("commit exploded")
}

func TestSuiteCatchesBrokenManagers(t *testing.T) {
	ref := func(f fault) func() kvcache.Manager { return func() kvcache.Manager { return &refManager{fault: f} } }
	tests := []struct {
		name    string
		factory func(t *testing.T) func() kvcache.Manager
		want    string // a check that must fail
		got     string // in its Got
	}{
		{"commit rewinds from a width (seed A)", func(*testing.T) func() kvcache.Manager { return ref(widthCommit) }, "CommitLedger", "want 0 <= history <= capacity"},
		{"commit rewinds from a width, over gRPC", func(t *testing.T) func() kvcache.Manager {
			return func() kvcache.Manager { return pluginrpc.TestManagerPair(t, &refManager{fault: widthCommit}) }
		}, "CommitLedger", "want 0 <= history <= capacity"},
		{"unreserve leaks a block", func(*testing.T) func() kvcache.Manager { return ref(leakUnreserve) }, "Unreserve", "RefCount 1, the tables reference it 0 times"},
		{"a denial is an error", func(*testing.T) func() kvcache.Manager {
			return func() kvcache.Manager { return denialErrors{&refManager{}} }
		}, "Denial", "out of blocks"},
		{"a denial is an error, over gRPC", func(t *testing.T) func() kvcache.Manager {
			return func() kvcache.Manager { return pluginrpc.TestManagerPair(t, denialErrors{&refManager{}}) }
		}, "Denial", "out of blocks"},
		{"item errors without Seqs", func(*testing.T) func() kvcache.Manager { return ref(seqlessItemErrors) }, "CommitBadItems", "Seqs [] lack seq"},
		{"Inspect returns its own slices", func(*testing.T) func() kvcache.Manager { return ref(aliasRefCounts) }, "Ownership", "RefCount"},
		{"a panic", func(*testing.T) func() kvcache.Manager {
			return func() kvcache.Manager { return panicky{&refManager{}} }
		}, "CommitLedger", "panic: commit exploded"},
		{"HostTier without a Suspender", func(*testing.T) func() kvcache.Manager {
			return func() kvcache.Manager { return claimsHostTier{&refManager{}} }
		}, "SuspendResume", "which has no Suspend and Resume"},
		{"a Suspender without a host tier that does not refuse", func(*testing.T) func() kvcache.Manager {
			return func() kvcache.Manager { return silentSuspender{&refManager{}} }
		}, "SuspendResume", "error <nil>"},
		{"no manager", func(*testing.T) func() kvcache.Manager { return func() kvcache.Manager { return nil } }, "Configure", "nil"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := conformance.CheckManager(ctx, tt.factory(t), conformance.ManagerOptions{RandomOps: 200})
			vs := conformance.Violations(err)
			i := slices.IndexFunc(vs, func(v *conformance.Violation) bool { return v.Check == tt.want })
			if i < 0 {
				t.Fatalf("CheckManager = %v; want a violation of %s", err, tt.want)
			}
			v := vs[i]
			if !strings.Contains(v.Got, tt.got) || v.Call == "" || v.Want == "" {
				t.Errorf("violation %s: Got %q, want it to contain %q (and name the call and the rule)", v.Check, v.Got, tt.got)
			}
			if !strings.Contains(err.Error(), "conformance "+tt.want+":") {
				t.Errorf("CheckManager's error does not name check %s:\n%v", tt.want, err)
			}
			if tt.want != "Configure" && slices.Contains(checksOf(err), "Info") {
				t.Errorf("the fault also failed Info: %v", checksOf(err))
			}
		})
	}
}

// closer counts Close calls on a manager.
type closer struct {
	kvcache.Manager
	n *int
}

func (c closer) Close() error { *c.n++; return nil }

func TestCheckManagerOptions(t *testing.T) {
	made, closed := 0, 0
	factory := func() kvcache.Manager { made++; return closer{&refManager{}, &closed} }
	if err := conformance.CheckManager(ctx, factory, conformance.ManagerOptions{Checks: []string{"Info", "Unreserve"}}); err != nil {
		t.Fatalf("CheckManager(Info, Unreserve) = %v", err)
	}
	if made != 2 || closed != 2 {
		t.Errorf("factory called %d times, Close %d times; want 2 and 2 (one fresh manager per check, closed after)", made, closed)
	}
	err := conformance.CheckManager(ctx, factory, conformance.ManagerOptions{Checks: []string{"Nope"}})
	if err == nil || conformance.Violations(err) != nil || !strings.Contains(err.Error(), `"Nope"`) {
		t.Errorf("CheckManager(Checks: Nope) = %v; want an options error naming it", err)
	}
	if n, docs := len(conformance.ManagerChecks()), conformance.ManagerCheckDocs(); n < 15 || len(docs) != n {
		t.Errorf("%d checks, %d docs", n, len(docs))
	}
}

func TestRandomSeedIsReported(t *testing.T) {
	var lines []string
	logf := func(format string, args ...any) { lines = append(lines, fmt.Sprintf(format, args...)) }
	err := conformance.CheckManager(ctx, func() kvcache.Manager { return &refManager{fault: widthCommit} },
		conformance.ManagerOptions{Checks: []string{"Random"}, Seed: 77, RandomOps: 500, Logf: logf})
	vs := conformance.Violations(err)
	if len(vs) != 1 || !strings.Contains(vs[0].Call, "seed 77, operation ") {
		t.Fatalf("CheckManager(Random, seed 77) = %v; want one violation naming the seed and the operation", err)
	}
	if len(lines) == 0 || !strings.Contains(lines[0], "seed 77") {
		t.Errorf("Logf lines %q; want the seed", lines)
	}
}

// lossyErrors drops the kind and Seqs of Forward's errors.
type lossyErrors struct{ worker.Worker }

func (l lossyErrors) Forward(ctx context.Context, b worker.Batch) (worker.Result, error) {
	r, err := l.Worker.Forward(ctx, b)
	if err != nil {
		return r, errors.New(err.Error())
	}
	return r, nil
}

// fragile reports itself unhealthy after any Forward error.
type fragile struct {
	worker.Worker
	dead *bool
}

func (f fragile) Forward(ctx context.Context, b worker.Batch) (worker.Result, error) {
	r, err := f.Worker.Forward(ctx, b)
	if err != nil {
		*f.dead = true
	}
	return r, err
}

func (f fragile) Health(ctx context.Context) error {
	if *f.dead {
		return errors.New("worker died")
	}
	return nil
}

// draftless drops the MTP drafts and any accepted draft from outputs.
type draftless struct{ worker.Worker }

func (d draftless) Forward(ctx context.Context, b worker.Batch) (worker.Result, error) {
	r, err := d.Worker.Forward(ctx, b)
	for i := range r.Outputs {
		r.Outputs[i].Drafts = nil
	}
	return r, err
}

func TestWorkerReferenceConforms(t *testing.T) {
	conformance.TestWorker(t, func() worker.Worker { return device.NewWorker(gqa.Backend) }, conformance.WorkerOptions{})
}

func TestSuiteCatchesBrokenWorkers(t *testing.T) {
	tests := []struct {
		name    string
		factory func() worker.Worker
		want    []string
		got     string
	}{
		{"errors lose their kind", func() worker.Worker { return lossyErrors{device.NewWorker(gqa.Backend)} },
			[]string{"BadItemNegativePos", "BadItemNoTokens", "BadItemDraft", "BadItemUnknownPool"}, "(kind error)"},
		{"an item error kills it", func() worker.Worker { return fragile{device.NewWorker(gqa.Backend), new(bool)} },
			[]string{"BadItemNegativePos", "BadItemNoTokens", "BadItemDraft", "BadItemUnknownPool"}, "worker died"},
		{"no drafts", func() worker.Worker { return draftless{device.NewWorker(gqa.Backend)} },
			[]string{"Forward", "TwoStages"}, "0 drafts"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := conformance.CheckWorker(ctx, tt.factory, conformance.WorkerOptions{})
			got := checksOf(err)
			for _, w := range tt.want {
				if !slices.Contains(got, w) {
					t.Errorf("CheckWorker failed %v; want %s among them:\n%v", got, w, err)
				}
			}
			for _, v := range conformance.Violations(err) {
				if !strings.Contains(v.Got, tt.got) {
					t.Errorf("violation %s: Got %q, want it to contain %q", v.Check, v.Got, tt.got)
				}
			}
			if slices.Contains(got, "Info") || slices.Contains(got, "Configure") {
				t.Errorf("the fault also failed Info or Configure: %v", got)
			}
		})
	}
}

// pagedSnapshots names a paged pool's block as a state save in every grant.
type pagedSnapshots struct {
	kvcache.Manager
	pool int
}

func (p *pagedSnapshots) Configure(ctx context.Context, cfg kvcache.Config) (kvcache.Layout, error) {
	l, err := p.Manager.Configure(ctx, cfg)
	if len(l.Pools) > 0 {
		p.pool = l.Pools[0].ID
	}
	return l, err
}

func (p *pagedSnapshots) Reserve(ctx context.Context, items []kvcache.ReserveItem) ([]kvcache.Grant, error) {
	gs, err := p.Manager.Reserve(ctx, items)
	for i := range gs {
		if gs[i].OK {
			gs[i].Snapshots = []kvcache.SnapshotSlot{{Pos: 1, Pool: p.pool}}
		}
	}
	return gs, err
}

func TestSuiteCatchesBadSnapshotSlots(t *testing.T) {
	err := conformance.CheckManager(ctx, func() kvcache.Manager { return &pagedSnapshots{Manager: &refManager{}} }, conformance.ManagerOptions{RandomOps: 50})
	vs := conformance.Violations(err)
	if !slices.ContainsFunc(vs, func(v *conformance.Violation) bool { return strings.Contains(v.Got, "a paged pool") }) {
		t.Fatalf("CheckManager = %v; want a violation about a snapshot slot in a paged pool", err)
	}
}
