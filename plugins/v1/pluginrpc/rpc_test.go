package pluginrpc

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/go-plugin"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"

	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
	"github.com/kvx-dev/kvx/plugins/v1/worker"
)

// managerPair returns a client on an in-memory connection to f, and the pair
// so tests can break it.
func managerPair(t *testing.T, f kvcache.Manager) (*ManagerClient, *pair) {
	t.Helper()
	p := newPair(t, func(s *grpc.Server) error { RegisterManagerServer(s, f); return nil })
	t.Cleanup(p.close)
	return NewManagerClient(context.Background(), p.conn, pairOpts...), p
}

func workerPair(t *testing.T, f worker.Worker) (*WorkerClient, *pair) {
	t.Helper()
	p := newPair(t, func(s *grpc.Server) error { RegisterWorkerServer(s, f); return nil })
	t.Cleanup(p.close)
	return NewWorkerClient(context.Background(), p.conn, pairOpts...), p
}

// pairOpts are the client options of managerPair and workerPair.
var pairOpts []ClientOption

var ctx = context.Background()

// TestManagerOverWire calls every Manager method through TestManagerPair and
// checks that the fake received exactly the arguments and the caller got
// exactly the fake's answer.
func TestManagerOverWire(t *testing.T) {
	f := &fakeManager{
		info: fullInfo, layout: fullLayout, lookup: []int{0, 64}, grants: fullGrants,
		commit: kvcache.CommitResult{Copies: fullCopies}, moveOK: []bool{true, false}, moveCopies: fullCopies,
		stats: fullStats, snap: fullSnapshot, events: fullEvents,
	}
	m := TestManagerPair(t, f)
	sp := m.(kvcache.Suspender)
	er := m.(kvcache.EventReporter)
	fk := m.(kvcache.Forker)
	seqs := []kvcache.SeqID{3, 1 << 40}
	commits := []kvcache.CommitItem{{Seq: 3, Accepted: 2}}
	type result = []any
	for _, tc := range []struct {
		method string
		arg    any
		call   func() (result, error)
		want   result
	}{
		{"Info", nil, func() (result, error) { v, err := m.Info(ctx); return result{v}, err }, result{fullInfo}},
		{"Configure", fullConfig, func() (result, error) { v, err := m.Configure(ctx, fullConfig); return result{v}, err }, result{fullLayout}},
		{"Lookup", fullLookupItems, func() (result, error) { v, err := m.Lookup(ctx, fullLookupItems); return result{v}, err }, result{[]int{0, 64}}},
		{"Reserve", fullReserveItems, func() (result, error) { v, err := m.Reserve(ctx, fullReserveItems); return result{v}, err }, result{fullGrants}},
		{"Fork", fullForkItems, func() (result, error) { v, err := fk.Fork(ctx, fullForkItems); return result{v}, err }, result{fullGrants}},
		{"Unreserve", seqs, func() (result, error) { return nil, m.Unreserve(ctx, seqs) }, nil},
		{"Commit", commits, func() (result, error) { v, err := m.Commit(ctx, commits); return result{v}, err }, result{f.commit}},
		{"Suspend", seqs, func() (result, error) { ok, c, err := sp.Suspend(ctx, seqs); return result{ok, c}, err }, result{f.moveOK, fullCopies}},
		{"Resume", seqs, func() (result, error) { ok, c, err := sp.Resume(ctx, seqs); return result{ok, c}, err }, result{f.moveOK, fullCopies}},
		{"Release", seqs, func() (result, error) { return nil, m.Release(ctx, seqs) }, nil},
		{"Stats", nil, func() (result, error) { v, err := m.Stats(ctx); return result{v}, err }, result{fullStats}},
		{"Inspect", kvcache.InspectOptions{Tables: true}, func() (result, error) {
			v, err := m.Inspect(ctx, kvcache.InspectOptions{Tables: true})
			return result{v}, err
		}, result{fullSnapshot}},
		{"Events", nil, func() (result, error) { v, err := er.Events(ctx); return result{v}, err }, result{fullEvents}},
	} {
		got, err := tc.call()
		if err != nil {
			t.Errorf("%s: %v", tc.method, err)
			continue
		}
		if !deepEqual(got, normalize(tc.want)) {
			t.Errorf("%s = %#v, want %#v", tc.method, got, tc.want)
		}
		c := f.last()
		if c.method != tc.method || !deepEqual(c.arg, normalize(tc.arg)) {
			t.Errorf("%s: plugin saw %s(%#v), want %s(%#v)", tc.method, c.method, c.arg, tc.method, tc.arg)
		}
	}
}

// TestWorkerOverWire is TestManagerOverWire for the Worker methods.
func TestWorkerOverWire(t *testing.T) {
	f := &fakeWorker{winfo: fullWorkerInfo, setup: worker.Setup{DeviceBytes: 7, Notes: []string{"n"}}, result: fullResult}
	w := TestWorkerPair(t, f)
	type result = []any
	for _, tc := range []struct {
		method string
		arg    any
		call   func() (result, error)
		want   result
	}{
		{"Info", nil, func() (result, error) { v, err := w.Info(ctx); return result{v}, err }, result{fullWorkerInfo}},
		{"Configure", fullWorkerConfig, func() (result, error) { v, err := w.Configure(ctx, fullWorkerConfig); return result{v}, err }, result{f.setup}},
		{"Forward", fullBatch, func() (result, error) { v, err := w.Forward(ctx, fullBatch); return result{v}, err }, result{fullResult}},
		{"CopyBlocks", fullCopies, func() (result, error) { return nil, w.CopyBlocks(ctx, fullCopies) }, nil},
		{"Health", nil, func() (result, error) { return nil, w.Health(ctx) }, nil},
	} {
		got, err := tc.call()
		if err != nil {
			t.Errorf("%s: %v", tc.method, err)
			continue
		}
		if !deepEqual(got, normalize(tc.want)) {
			t.Errorf("%s = %#v, want %#v", tc.method, got, tc.want)
		}
		c := f.last()
		if c.method != tc.method || !deepEqual(c.arg, normalize(tc.arg)) {
			t.Errorf("%s: plugin saw %s(%#v), want %s(%#v)", tc.method, c.method, c.arg, tc.method, tc.arg)
		}
	}
}

func TestKindCodes(t *testing.T) {
	want := map[kvcache.Kind]codes.Code{
		kvcache.KindInvalidConfig: codes.FailedPrecondition,
		kvcache.KindInvalidArg:    codes.InvalidArgument,
		kvcache.KindUnsupported:   codes.Unimplemented,
		kvcache.KindUnavailable:   codes.Unavailable,
		kvcache.KindCorrupt:       codes.DataLoss,
		kvcache.KindOther:         codes.Unknown,
	}
	for k, c := range want {
		if got := codeOf(k); got != c {
			t.Errorf("codeOf(%v) = %v, want %v", k, got, c)
		}
		if got := kindOf(c); got != k {
			t.Errorf("kindOf(%v) = %v, want %v", c, got, k)
		}
	}
	if got := codeOf(kvcache.Kind(1000)); got != codes.Unknown {
		t.Errorf("codeOf(unknown kind) = %v, want %v", got, codes.Unknown)
	}
	if got := kindOf(codes.ResourceExhausted); got != kvcache.KindOther {
		t.Errorf("kindOf(%v) = %v, want %v", codes.ResourceExhausted, got, kvcache.KindOther)
	}
}

// TestErrorsCrossTheWire checks that what a plugin returns is what the caller
// sees: kind (errors.Is and KindOf), message and Seqs.
func TestErrorsCrossTheWire(t *testing.T) {
	seqs := []kvcache.SeqID{4, 9}
	for _, tc := range []struct {
		name     string
		err      error
		sentinel error
		kind     kvcache.Kind
		msg      string
		seqs     []kvcache.SeqID
	}{
		{"corrupt", kvcache.Errorf(kvcache.KindCorrupt, "pool 0: free list has block 7 twice"), kvcache.ErrCorrupt,
			kvcache.KindCorrupt, "pool 0: free list has block 7 twice", nil},
		{"item", kvcache.ItemErrorf(seqs, "commit: accepted 5 > reserved 2"), kvcache.ErrInvalidArg,
			kvcache.KindInvalidArg, "commit: accepted 5 > reserved 2", seqs},
		{"config", kvcache.Errorf(kvcache.KindInvalidConfig, "device_bytes 0 < 1 block"), kvcache.ErrInvalidConfig,
			kvcache.KindInvalidConfig, "device_bytes 0 < 1 block", nil},
		{"unsupported", kvcache.ErrUnsupported, kvcache.ErrUnsupported, kvcache.KindUnsupported, "", nil},
		{"unavailable", kvcache.Errorf(kvcache.KindUnavailable, "device lost"), kvcache.ErrUnavailable,
			kvcache.KindUnavailable, "device lost", nil},
		{"wrapped", fmt.Errorf("stage 1: %w", &kvcache.Error{Kind: kvcache.KindCorrupt, Msg: "x", Seqs: seqs}), kvcache.ErrCorrupt,
			kvcache.KindCorrupt, "stage 1: x", seqs},
		{"plain", errors.New("disk on fire"), nil, kvcache.KindOther, "disk on fire", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m, _ := managerPair(t, &fakeManager{err: tc.err})
			w, _ := workerPair(t, &fakeWorker{fakeManager: fakeManager{err: tc.err}})
			for method, err := range map[string]error{
				"Manager.Release": m.Release(ctx, []kvcache.SeqID{1}),
				"Manager.Stats":   func() error { _, err := m.Stats(ctx); return err }(),
				"Worker.Health":   w.Health(ctx),
			} {
				if tc.sentinel != nil && !errors.Is(err, tc.sentinel) {
					t.Errorf("%s: errors.Is(%v, %v) = false", method, err, tc.sentinel)
				}
				var e *kvcache.Error
				if !errors.As(err, &e) {
					t.Fatalf("%s: error %T %v is not a *kvcache.Error", method, err, err)
				}
				if e.Kind != tc.kind || e.Msg != tc.msg || !deepEqual(e.Seqs, tc.seqs) {
					t.Errorf("%s: error = {%v %q %v}, want {%v %q %v}", method, e.Kind, e.Msg, e.Seqs, tc.kind, tc.msg, tc.seqs)
				}
				if err.Error() != tc.err.Error() {
					t.Errorf("%s: error text %q, want %q", method, err.Error(), tc.err.Error())
				}
			}
		})
	}
}

// TestPartialResultCrossesWithError: Commit reports a bad item after applying
// the others; the copies for the applied items must reach the caller.
func TestPartialResultCrossesWithError(t *testing.T) {
	itemErr := kvcache.ItemErrorf([]kvcache.SeqID{8}, "commit: sequence 8 unknown")
	f := &fakeManager{commit: kvcache.CommitResult{Copies: fullCopies}, err: itemErr,
		moveOK: []bool{true}, moveCopies: fullCopies[:1]}
	m, _ := managerPair(t, f)
	res, err := m.Commit(ctx, []kvcache.CommitItem{{Seq: 7, Accepted: 1}, {Seq: 8, Accepted: 1}})
	if kvcache.KindOf(err) != kvcache.KindInvalidArg || !deepEqual(res.Copies, fullCopies) {
		t.Errorf("Commit = %v, %v; want copies %v and an item error", res, err, fullCopies)
	}
	ok, copies, err := m.Suspend(ctx, []kvcache.SeqID{7})
	if kvcache.KindOf(err) != kvcache.KindInvalidArg || !deepEqual(ok, []bool{true}) || !deepEqual(copies, fullCopies[:1]) {
		t.Errorf("Suspend = %v, %v, %v; want [true], %v and an item error", ok, copies, err, fullCopies[:1])
	}
	// Without a result, nothing extra travels and the caller gets zero values.
	f.mu.Lock()
	f.commit = kvcache.CommitResult{}
	f.mu.Unlock()
	if res, err := m.Commit(ctx, nil); res.Copies != nil || err == nil {
		t.Errorf("Commit = %v, %v; want no copies and an error", res, err)
	}
}

// TestTransportFailureIsUnavailable breaks the connection in the ways a dying
// plugin does and expects KindUnavailable every time.
func TestTransportFailureIsUnavailable(t *testing.T) {
	check := func(t *testing.T, err error) {
		t.Helper()
		if !errors.Is(err, kvcache.ErrUnavailable) || kvcache.KindOf(err) != kvcache.KindUnavailable {
			t.Errorf("error = %v (kind %v), want kind %v", err, kvcache.KindOf(err), kvcache.KindUnavailable)
		}
	}
	t.Run("server stopped", func(t *testing.T) {
		m, p := managerPair(t, &fakeManager{})
		if _, err := m.Info(ctx); err != nil {
			t.Fatal(err)
		}
		p.server.Stop()
		_, err := m.Reserve(ctx, fullReserveItems)
		check(t, err)
	})
	t.Run("server stopped mid-call", func(t *testing.T) {
		f := &fakeWorker{}
		f.block = true
		w, p := workerPair(t, f)
		errc := make(chan error, 1)
		go func() { _, err := w.Forward(ctx, fullBatch); errc <- err }()
		waitFor(t, func() bool { return f.inflight.Load() == 1 })
		p.server.Stop()
		check(t, <-errc)
	})
	t.Run("connection closed", func(t *testing.T) {
		m, p := managerPair(t, &fakeManager{})
		_ = p.conn.Close()
		check(t, m.Release(ctx, nil))
	})
	t.Run("process exited", func(t *testing.T) {
		f := &fakeManager{}
		p := newPair(t, func(s *grpc.Server) error { RegisterManagerServer(s, f); return nil })
		t.Cleanup(p.close)
		life, exit := context.WithCancel(context.Background())
		m := NewManagerClient(life, p.conn)
		exit()
		_, err := m.Commit(ctx, nil)
		check(t, err)
		if len(f.calls) != 0 {
			t.Errorf("plugin saw %d calls after its lifetime ended, want 0", len(f.calls))
		}
		select {
		case <-m.Done():
		default:
			t.Error("Done() not closed after the lifetime ended")
		}
	})
}

// TestContextCrossesTheWire: the caller's deadline reaches the plugin, and
// cancelling the caller's ctx cancels the plugin's and returns ctx.Err().
func TestContextCrossesTheWire(t *testing.T) {
	f := &fakeManager{}
	m, _ := managerPair(t, f)
	dctx, cancel := context.WithTimeout(ctx, time.Hour)
	defer cancel()
	if _, err := m.Stats(dctx); err != nil {
		t.Fatal(err)
	}
	if !f.last().deadline {
		t.Error("plugin saw no deadline, want the caller's")
	}

	f.block = true
	cctx, cancel := context.WithCancel(ctx)
	errc := make(chan error, 1)
	go func() { _, err := m.Reserve(cctx, fullReserveItems); errc <- err }()
	waitFor(t, func() bool { return f.inflight.Load() == 1 })
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Errorf("Reserve after cancel: %v, want context.Canceled", err)
	}
	waitFor(t, func() bool { return f.inflight.Load() == 0 }) // the plugin's ctx ended too

	tctx, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancel()
	if _, err := m.Lookup(tctx, fullLookupItems); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Lookup past deadline: %v, want context.DeadlineExceeded", err)
	}
}

// TestServerSerializesCalls: concurrent callers never overlap inside the
// implementation.
func TestServerSerializesCalls(t *testing.T) {
	f := &fakeManager{grants: fullGrants}
	m, _ := managerPair(t, f)
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 20 {
				if _, err := m.Reserve(ctx, fullReserveItems); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	if n := f.maxInflight.Load(); n != 1 {
		t.Errorf("max calls inside the plugin at once = %d, want 1", n)
	}
}

// TestUnservedServiceIsUnsupported: a manager binary asked for a worker
// method answers KindUnsupported, not a transport error.
func TestUnservedServiceIsUnsupported(t *testing.T) {
	p := newPair(t, func(s *grpc.Server) error {
		return (&WorkerPlugin{}).GRPCServer(nil, s) // nil Impl: nothing registered
	})
	t.Cleanup(p.close)
	w := NewWorkerClient(context.Background(), p.conn)
	if err := w.Health(ctx); kvcache.KindOf(err) != kvcache.KindUnsupported {
		t.Errorf("Health on a server without the Worker service: %v, want kind %v", err, kvcache.KindUnsupported)
	}
}

// TestPluginSets checks the plugin sets the host and the SDK share: one
// protocol, InstancesProtocol, in the handshake too, with both kinds.
func TestPluginSets(t *testing.T) {
	served := ServedPlugins(func() kvcache.Manager { return &fakeManager{} }, nil)
	for name, vp := range map[string]map[int]plugin.PluginSet{"ServedPlugins": served, "HostPlugins": HostPlugins()} {
		set, ok := vp[InstancesProtocol]
		if !ok || len(vp) != 1 {
			t.Fatalf("%s versions = %v, want exactly [%d]", name, vp, InstancesProtocol)
		}
		if _, ok := set[ManagerPluginName].(*ManagerPlugin); !ok {
			t.Errorf("%s: plugin %q is %T, want *ManagerPlugin", name, ManagerPluginName, set[ManagerPluginName])
		}
		if _, ok := set[WorkerPluginName].(*WorkerPlugin); !ok {
			t.Errorf("%s: plugin %q is %T, want *WorkerPlugin", name, WorkerPluginName, set[WorkerPluginName])
		}
	}
	if p := served[InstancesProtocol][ManagerPluginName].(*ManagerPlugin); p.New == nil {
		t.Error("ServedPlugins with a manager factory serves no manager instances")
	}
	if p := served[InstancesProtocol][WorkerPluginName].(*WorkerPlugin); p.New != nil || p.Impl != nil {
		t.Error("ServedPlugins without a worker factory serves a worker")
	}
	if Handshake.MagicCookieKey != "KVX_PLUGIN" || Handshake.MagicCookieValue == "" || Handshake.ProtocolVersion != InstancesProtocol {
		t.Errorf("Handshake = %+v", Handshake)
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not reached in 5s")
		}
		time.Sleep(time.Millisecond)
	}
}
