package pluginrpc

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"testing"

	"google.golang.org/grpc"

	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
	"github.com/kvx-dev/kvx/plugins/v1/worker"
)

// The benchmarks measure the per-call cost of the wire against the same
// trivial implementation called in-process, at 256 running requests (the
// target: per-step plugin overhead <= 150 µs at 256 requests). Transports:
//
//	inprocess  direct method calls (the baseline)
//	bufconn    gRPC over an in-memory pipe (TestManagerPair)
//	unix       gRPC over a unix socket, as go-plugin uses between processes
//	           (both ends in this process, so no cross-process scheduling)
//
// core/host has the same benchmark against a real plugin process.

const benchItems = 256

// trivialManager answers every Reserve with a grant of one new block per
// sequence (the steady-state decode case) and does nothing else.
type trivialManager struct{ fakeManager }

func (m *trivialManager) Reserve(_ context.Context, items []kvcache.ReserveItem) ([]kvcache.Grant, error) {
	gs := make([]kvcache.Grant, len(items))
	blocks := make([]kvcache.BlockID, len(items))
	tables := make([]kvcache.TableDelta, len(items))
	for i, it := range items {
		blocks[i] = kvcache.BlockID(i)
		tables[i] = kvcache.TableDelta{Pool: 0, From: 100, Blocks: blocks[i : i+1 : i+1]}
		gs[i] = kvcache.Grant{Seq: it.Seq, OK: true, Tables: tables[i : i+1 : i+1]}
	}
	return gs, nil
}

func (m *trivialManager) Commit(context.Context, []kvcache.CommitItem) (kvcache.CommitResult, error) {
	return kvcache.CommitResult{}, nil
}

// trivialWorker samples one token and one draft for every item.
type trivialWorker struct{ fakeWorker }

func (w *trivialWorker) Forward(_ context.Context, b worker.Batch) (worker.Result, error) {
	out := make([]worker.Output, len(b.Items))
	toks := make([]int32, 2*len(b.Items))
	for i, it := range b.Items {
		toks[2*i], toks[2*i+1] = 1, 2
		out[i] = worker.Output{Seq: it.Seq, Tokens: toks[2*i : 2*i+1 : 2*i+1], Drafts: toks[2*i+1 : 2*i+2 : 2*i+2]}
	}
	return worker.Result{Outputs: out, Nanos: 1000, Modelled: true}, nil
}

func benchStep() ([]kvcache.ReserveItem, worker.Batch, []kvcache.CommitItem) {
	reserve := make([]kvcache.ReserveItem, benchItems)
	commit := make([]kvcache.CommitItem, benchItems)
	b := worker.Batch{Step: 1, Items: make([]worker.Item, benchItems)}
	blocks := make([]kvcache.BlockID, benchItems)
	for i := range benchItems {
		seq := kvcache.SeqID(1000 + i)
		reserve[i] = kvcache.ReserveItem{Seq: seq, Tokens: 1, Draft: 1}
		commit[i] = kvcache.CommitItem{Seq: seq, Accepted: 2}
		blocks[i] = kvcache.BlockID(i)
		b.Items[i] = worker.Item{Seq: seq, Pos: 4000 + i, Tokens: []int32{int32(i), int32(i + 1)}, Draft: 1, Sample: true,
			Tables: []kvcache.TableDelta{{Pool: 0, From: 100, Blocks: blocks[i : i+1]}}}
	}
	return reserve, b, commit
}

type benchTransport struct {
	name string
	// connect returns clients for m and w.
	connect func(b *testing.B, m kvcache.Manager, w worker.Worker) (kvcache.Manager, worker.Worker)
}

var benchTransports = []benchTransport{
	{"inprocess", func(_ *testing.B, m kvcache.Manager, w worker.Worker) (kvcache.Manager, worker.Worker) { return m, w }},
	{"bufconn", func(b *testing.B, m kvcache.Manager, w worker.Worker) (kvcache.Manager, worker.Worker) {
		return TestManagerPair(b, m), TestWorkerPair(b, w)
	}},
	{"unix", func(b *testing.B, m kvcache.Manager, w worker.Worker) (kvcache.Manager, worker.Worker) {
		return NewManagerClient(context.Background(), unixPair(b, func(s *grpc.Server) { RegisterManagerServer(s, m) }).conn),
			NewWorkerClient(context.Background(), unixPair(b, func(s *grpc.Server) { RegisterWorkerServer(s, w) }).conn)
	}},
}

func unixPair(b *testing.B, register func(*grpc.Server)) *pair {
	dir, err := os.MkdirTemp("", "kvx") // short: unix socket paths are limited
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { os.RemoveAll(dir) })
	sock := filepath.Join(dir, "p.sock")
	lis, err := net.Listen("unix", sock)
	if err != nil {
		b.Fatal(err)
	}
	p := newPairOn(b, lis, func(ctx context.Context, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", sock)
	}, func(s *grpc.Server) error { register(s); return nil })
	b.Cleanup(p.close)
	return p
}

// BenchmarkReserveCommitGRPC: one Reserve and one Commit of 256 items.
func BenchmarkReserveCommitGRPC(b *testing.B) {
	reserve, _, commit := benchStep()
	for _, tr := range benchTransports {
		b.Run(tr.name, func(b *testing.B) {
			m, _ := tr.connect(b, &trivialManager{}, &trivialWorker{})
			ctx := context.Background()
			b.ReportAllocs()
			for b.Loop() {
				if _, err := m.Reserve(ctx, reserve); err != nil {
					b.Fatal(err)
				}
				if _, err := m.Commit(ctx, commit); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkStepGRPC: one step of one stage at 256 running requests
// (Reserve, Forward, Commit), the calls the executor makes per step.
func BenchmarkStepGRPC(b *testing.B) {
	reserve, batch, commit := benchStep()
	for _, tr := range benchTransports {
		b.Run(tr.name, func(b *testing.B) {
			m, w := tr.connect(b, &trivialManager{}, &trivialWorker{})
			ctx := context.Background()
			b.ReportAllocs()
			for b.Loop() {
				if _, err := m.Reserve(ctx, reserve); err != nil {
					b.Fatal(err)
				}
				if _, err := w.Forward(ctx, batch); err != nil {
					b.Fatal(err)
				}
				if _, err := m.Commit(ctx, commit); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkEmptyCallGRPC: the fixed cost of one call (Health, no payload).
func BenchmarkEmptyCallGRPC(b *testing.B) {
	for _, tr := range benchTransports {
		b.Run(tr.name, func(b *testing.B) {
			_, w := tr.connect(b, &trivialManager{}, &trivialWorker{})
			ctx := context.Background()
			b.ReportAllocs()
			for b.Loop() {
				if err := w.Health(ctx); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkConvert: converters alone for the largest per-step messages, both
// directions, without the wire.
func BenchmarkConvert(b *testing.B) {
	reserve, batch, _ := benchStep()
	grants, _ := (&trivialManager{}).Reserve(context.Background(), reserve)
	b.Run("reserve", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_, _ = fromProtoReserveRequest(toProtoReserveRequest(reserve, true))
			_, _ = fromProtoReserveResponse(toProtoReserveResponse(grants))
		}
	})
	b.Run("batch", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			_, _ = fromProtoBatch(toProtoBatch(&batch))
		}
	})
}
