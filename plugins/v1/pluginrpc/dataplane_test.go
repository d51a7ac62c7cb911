package pluginrpc

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvx-dev/kvx/internal/race"
	"github.com/kvx-dev/kvx/plugins/internal/kvxpb"
	"github.com/kvx-dev/kvx/plugins/internal/plane"
	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
)

// The wire tests of rpc_test.go run over the data plane
// (the default); these run them again with every call on gRPC, so both
// transports keep the same behaviour.
func TestOverGRPCOnly(t *testing.T) {
	pairOpts = []ClientOption{GRPCOnly()}
	defer func() { pairOpts = nil }()
	for _, tc := range []struct {
		name string
		f    func(*testing.T)
	}{
		{"ManagerOverWire", TestManagerOverWire},
		{"WorkerOverWire", TestWorkerOverWire},
		{"ErrorsCrossTheWire", TestErrorsCrossTheWire},
		{"PartialResultCrossesWithError", TestPartialResultCrossesWithError},
		{"TransportFailureIsUnavailable", TestTransportFailureIsUnavailable},
		{"ContextCrossesTheWire", TestContextCrossesTheWire},
		{"ServerSerializesCalls", TestServerSerializesCalls},
		{"StartedCallsOverWire", TestStartedCallsOverWire},
	} {
		t.Run(tc.name, tc.f)
	}
}

// TestPerStepCallsUseTheDataPlane: the per-step calls travel as frames, and
// with the plane turned off none is opened.
func TestPerStepCallsUseTheDataPlane(t *testing.T) {
	for _, off := range []bool{false, true} {
		f := &fakeManager{grants: fullGrants}
		p := newPair(t, func(s *grpc.Server) error { RegisterManagerServer(s, f); return nil })
		t.Cleanup(p.close)
		var opts []ClientOption
		if off {
			opts = append(opts, GRPCOnly())
		}
		m := NewManagerClient(context.Background(), p.conn, opts...)
		if _, err := m.Reserve(ctx, fullReserveItems); err != nil {
			t.Fatal(err)
		}
		if _, err := m.Stats(ctx); err != nil { // control plane: always gRPC
			t.Fatal(err)
		}
		r := m.rpc.(*managerRPC)
		if used := r.opener.Current() != nil; used == off {
			t.Errorf("transport off=%v: data plane open = %v", off, used)
		}
		if len(f.calls) != 2 || f.calls[0].method != "Reserve" || f.calls[1].method != "Stats" {
			t.Errorf("plugin saw %+v, want Reserve then Stats", f.calls)
		}
	}
}

// oldManagerServer is a manager server without a data plane.
type oldManagerServer struct{ *managerServer }

func (oldManagerServer) OpenDataPlane(*kvxpb.DataPlaneRequest, grpc.ServerStreamingServer[kvxpb.DataPlane]) error {
	return status.Error(codes.Unimplemented, "method OpenDataPlane not implemented")
}

// TestPluginWithoutPlaneStaysOnGRPC: a plugin without OpenDataPlane is
// served over gRPC for everything.
func TestPluginWithoutPlaneStaysOnGRPC(t *testing.T) {
	f := &fakeManager{grants: fullGrants}
	p := newPair(t, func(s *grpc.Server) error {
		kvxpb.RegisterCacheManagerServer(s, oldManagerServer{&managerServer{impl: f, gate: newGate()}})
		return nil
	})
	t.Cleanup(p.close)
	m := NewManagerClient(context.Background(), p.conn)
	for range 2 {
		grants, err := m.Reserve(ctx, fullReserveItems)
		if err != nil || !deepEqual(grants, fullGrants) {
			t.Fatalf("Reserve = %v, %v; want %v", grants, err, fullGrants)
		}
	}
	if r := m.rpc.(*managerRPC); r.opener.Current() != nil || !r.opener.Off() {
		t.Errorf("opener plane %v, off %v: want no plane and off", r.opener.Current(), r.opener.Off())
	}
}

// TestDataPlaneLargeFrames: requests and answers larger than a plane's
// read buffer (64 KiB) arrive whole and in order, both ways, many times.
func TestDataPlaneLargeFrames(t *testing.T) {
	const n = 60000 // about 300 KiB of request, 120 KiB of answer
	items := make([]kvcache.LookupItem, n)
	answer := make([]int, n)
	for i := range items {
		items[i] = kvcache.LookupItem{Seq: kvcache.SeqID(i + 1), Prompt: []int32{int32(i), 7, 9}}
		answer[i] = i % 3
	}
	f := &fakeManager{lookup: answer}
	m, _ := managerPair(t, f)
	for round := range 3 {
		got, err := m.Lookup(ctx, items)
		if err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		if !slices.Equal(got, answer) {
			t.Fatalf("round %d: answer differs from what the plugin sent", round)
		}
		sent := f.last().arg.([]kvcache.LookupItem)
		if len(sent) != n || sent[n-1].Seq != items[n-1].Seq || !slices.Equal(sent[n/2].Prompt, items[n/2].Prompt) {
			t.Fatalf("round %d: plugin got %d items, want %d as sent", round, len(sent), n)
		}
		// A small call between large ones finds the stream in step.
		if err := m.Release(ctx, []kvcache.SeqID{4}); err != nil {
			t.Fatalf("round %d: Release after a large call: %v", round, err)
		}
	}
	if r := m.rpc.(*managerRPC); r.opener.Current() == nil {
		t.Fatal("the calls did not use the data plane")
	}
}

// TestDataPlanePipelinedLargeFrames: several instances of one process send
// large frames at once and get large answers on one plane; nothing blocks
// (a writer waiting on a full socket never keeps the answers from being
// read) and every caller gets its own answer.
// On shared memory (version 3) the larger size takes frames through the
// rings in pieces: 2.5 MiB requests, 1 MiB answers, against 2 MiB rings.
func TestDataPlanePipelinedLargeFrames(t *testing.T) {
	for _, n := range []int{60000, 500000} {
		t.Run(fmt.Sprintf("%d items", n), func(t *testing.T) { testPipelinedLargeFrames(t, n) })
	}
}

func testPipelinedLargeFrames(t *testing.T, n int) {
	const callers = 4 // about 5 bytes of request and 2 of answer an item, each
	answer := make([]int, n)
	for i := range answer {
		answer[i] = i % 5
	}
	var made atomic.Int32
	ms := TestManagerInstances(t, func() kvcache.Manager {
		k := int(made.Add(1))
		a := slices.Clone(answer)
		a[0] = k // tells the instances' answers apart
		return &fakeManager{lookup: a}
	}, callers)
	for _, m := range ms { // make the instances in order: instance i answers i+1
		if _, err := m.Stats(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := ms[0].Lookup(ctx, nil); err != nil {
		t.Fatal(err)
	}
	if dp := ms[0].(*ManagerClient).rpc.(*managerRPC).opener.Current(); dp == nil || (dp.SharedMemory()) != plane.ShmSupported {
		t.Fatalf("plane %v: want one, in shared memory where that is supported (%v)", dp, plane.ShmSupported)
	}
	items := make([]kvcache.LookupItem, n)
	for i := range items {
		items[i] = kvcache.LookupItem{Seq: kvcache.SeqID(i + 1), Prompt: []int32{int32(i), 7, 9}}
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute) // a hang guard: slow under -race
	defer cancel()
	// Every round after the first checks the stream stays in step after
	// the pieces (the plain pass runs three); under -race, where a round
	// of the larger size takes 12 s, one round races the four callers.
	rounds := 3
	if race.Enabled && n > 100000 {
		rounds = 1
	}
	var wg sync.WaitGroup
	for i, m := range ms {
		wg.Go(func() {
			for round := range rounds {
				got, err := m.Lookup(ctx, items)
				if err != nil {
					t.Errorf("instance %d round %d: %v", i, round, err)
					return
				}
				if len(got) != n || got[0] != i+1 || !slices.Equal(got[1:], answer[1:]) {
					t.Errorf("instance %d round %d: got another instance's answer or a damaged one (first %v)", i, round, got[:min(len(got), 1)])
					return
				}
			}
		})
	}
	wg.Wait()
}
