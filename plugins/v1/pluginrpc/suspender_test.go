package pluginrpc

import (
	"context"
	"testing"

	"google.golang.org/grpc"

	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
)

// noSuspender hides the kvcache.Suspender of the manager it wraps; its Info
// still says HostTier, as a manager that lost its host tier might.
type noSuspender struct{ kvcache.Manager }

// TestServedManagerWithoutSuspender: the client is always a Suspender, but
// a plugin whose manager is none answers Suspend and Resume with
// KindUnsupported, changing nothing, and its Info says no HostTier, so the
// core, which suspends only on a HostTier Suspender, sees what it sees of
// the same manager in-process. A manager that is one is served as before.
func TestServedManagerWithoutSuspender(t *testing.T) {
	info := fullInfo
	info.Capabilities.HostTier = true
	for _, grpcOnly := range []bool{false, true} {
		var opts []ClientOption
		if grpcOnly {
			opts = append(opts, GRPCOnly())
		}
		f := &fakeManager{info: info, moveOK: []bool{true}, moveCopies: fullCopies}
		seqs := []kvcache.SeqID{7}

		hidden := managerClient(t, noSuspender{f}, opts)
		got, err := hidden.Info(ctx)
		if err != nil || got.Capabilities.HostTier {
			t.Errorf("grpcOnly %v: Info of a manager that is no Suspender = %+v, %v; want HostTier false", grpcOnly, got.Capabilities, err)
		}
		for name, call := range map[string]func() ([]bool, []kvcache.Copy, error){
			"Suspend":      func() ([]bool, []kvcache.Copy, error) { return hidden.Suspend(ctx, seqs) },
			"Resume":       func() ([]bool, []kvcache.Copy, error) { return hidden.Resume(ctx, seqs) },
			"StartSuspend": func() ([]bool, []kvcache.Copy, error) { return hidden.StartSuspend(ctx, seqs)() },
			"StartResume":  func() ([]bool, []kvcache.Copy, error) { return hidden.StartResume(ctx, seqs)() },
		} {
			ok, copies, err := call()
			if kvcache.KindOf(err) != kvcache.KindUnsupported || ok != nil || copies != nil {
				t.Errorf("grpcOnly %v: %s of a manager that is no Suspender = %v, %v, %v; want kind %v", grpcOnly, name, ok, copies, err, kvcache.KindUnsupported)
			}
		}
		if c := f.last(); c.method != "Info" {
			t.Errorf("grpcOnly %v: the manager saw %s; want no call after Info", grpcOnly, c.method)
		}

		served := managerClient(t, f, opts)
		if got, err := served.Info(ctx); err != nil || !got.Capabilities.HostTier {
			t.Errorf("grpcOnly %v: Info of a Suspender = %+v, %v; want HostTier true", grpcOnly, got.Capabilities, err)
		}
		ok, copies, err := served.Suspend(ctx, seqs)
		if err != nil || !deepEqual(ok, []bool{true}) || !deepEqual(copies, fullCopies) {
			t.Errorf("grpcOnly %v: Suspend of a Suspender = %v, %v, %v; want [true], its copies", grpcOnly, ok, copies, err)
		}
	}
}

// managerClient serves m as one plugin process does and returns the client.
func managerClient(t *testing.T, m kvcache.Manager, opts []ClientOption) *ManagerClient {
	t.Helper()
	p := newPair(t, func(s *grpc.Server) error {
		return (&ManagerPlugin{New: func() kvcache.Manager { return m }}).GRPCServer(nil, s)
	})
	t.Cleanup(p.close)
	return NewManagerClient(context.Background(), p.conn, opts...)
}
