//go:build unix

package host

import (
	"context"
	"fmt"
	"testing"

	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
	"github.com/kvx-dev/kvx/plugins/v1/pipeline"
	"github.com/kvx-dev/kvx/plugins/v1/worker"
)

// benchHost starts a host for a benchmark, set by edit, closed when b ends.
// Its plugins run on one thread each, as kvx runs them for the sim device;
// run the benchmarks with -cpu 1 to match kvx itself.
func benchHost(b *testing.B, edit func(h *Host)) *Host {
	h := New(nil, nil)
	h.ManagerThreads, h.WorkerThreads = 1, 1
	if edit != nil {
		edit(h)
	}
	b.Cleanup(func() { h.Close() })
	return h
}

// benchManager launches the fake manager plugin on a host set by edit.
func benchManager(b *testing.B, edit func(h *Host)) kvcache.Manager {
	m, _, err := benchHost(b, edit).LaunchManager(context.Background(), fakeManager)
	if err != nil {
		b.Fatal(err)
	}
	return m
}

// transports names the two plugin transports, for sub-benchmarks.
var transports = []struct {
	name     string
	grpcOnly bool
}{{"grpc", true}, {"dataplane", false}}

// BenchmarkReserveCommitProcess is pluginrpc's BenchmarkReserveCommitGRPC
// against a real plugin process (the fake manager answers Reserve like
// pluginrpc's trivial manager: one new block per sequence): one Reserve and
// one Commit of 256 items per iteration, with and without AutoMTLS.
func BenchmarkReserveCommitProcess(b *testing.B) {
	const n = 256
	reserve := make([]kvcache.ReserveItem, n)
	commit := make([]kvcache.CommitItem, n)
	for i := range n {
		reserve[i] = kvcache.ReserveItem{Seq: kvcache.SeqID(1000 + i), Tokens: 1, Draft: 1}
		commit[i] = kvcache.CommitItem{Seq: kvcache.SeqID(1000 + i), Accepted: 2}
	}
	for _, mtls := range []bool{false, true} {
		name := "plain"
		if mtls {
			name = "mtls"
		}
		b.Run(name, func(b *testing.B) {
			m := benchManager(b, func(h *Host) { h.AutoMTLS = mtls })
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

// BenchmarkEmptyCallProcess: the fixed cost of one call to a plugin process
// (Release of nothing), over gRPC and over the data plane: the floor of every
// process crossing, paid twice per step when one process per plugin binary
// serves every stage (the managers' phase, the chained forward), four times
// with a process per stage and PP 2.
func BenchmarkEmptyCallProcess(b *testing.B) {
	for _, tr := range transports {
		b.Run(tr.name, func(b *testing.B) {
			m := benchManager(b, func(h *Host) { h.GRPCOnly = tr.grpcOnly })
			ctx := context.Background()
			b.ReportAllocs()
			for b.Loop() {
				if err := m.Release(ctx, nil); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkStepProcess: one step of one stage against real plugin
// processes: Reserve (manager), Forward (worker), Commit (manager), the
// calls the executor makes per stage per step, at 16 running requests (seed
// A's batch) and 256, over gRPC alone and with the data plane. Compare with
// pluginrpc's BenchmarkStepGRPC/inprocess. The started variant ends each
// step as the engine does (pipeline.StartEndStep): on the data plane the
// commit goes to the plugin with the next step's Reserve.
func BenchmarkStepProcess(b *testing.B) {
	for _, n := range []int{16, 256} {
		for _, tr := range transports {
			b.Run(fmt.Sprintf("requests=%d/%s", n, tr.name), func(b *testing.B) {
				stepProcess(b, n, tr.grpcOnly, false)
			})
		}
		b.Run(fmt.Sprintf("requests=%d/dataplane-started", n), func(b *testing.B) {
			stepProcess(b, n, false, true)
		})
	}
}

func stepProcess(b *testing.B, n int, grpcOnly, started bool) {
	reserve := make([]kvcache.ReserveItem, n)
	commit := make([]kvcache.CommitItem, n)
	batch := worker.Batch{Step: 1, Items: make([]worker.Item, n)}
	blocks := make([]kvcache.BlockID, n)
	for i := range n {
		seq := kvcache.SeqID(1000 + i)
		reserve[i] = kvcache.ReserveItem{Seq: seq, Tokens: 1, Draft: 1}
		commit[i] = kvcache.CommitItem{Seq: seq, Accepted: 2}
		blocks[i] = kvcache.BlockID(i)
		batch.Items[i] = worker.Item{Seq: seq, Pos: 4000 + i, Tokens: []int32{int32(i), int32(i + 1)}, Draft: 1, Sample: true,
			Tables: []kvcache.TableDelta{{Pool: 0, From: 100, Blocks: blocks[i : i+1]}}}
	}
	h := benchHost(b, func(h *Host) { h.GRPCOnly = grpcOnly })
	ctx := context.Background()
	m, _, err := h.LaunchManager(ctx, fakeManager)
	if err != nil {
		b.Fatal(err)
	}
	w, _, err := h.LaunchWorker(ctx, fakeWorker)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	var wait func() (pipeline.EndStepResult, error)
	for b.Loop() {
		if _, err := m.Reserve(ctx, reserve); err != nil {
			b.Fatal(err)
		}
		if wait != nil {
			if _, err := wait(); err != nil {
				b.Fatal(err)
			}
		}
		if res, err := w.Forward(ctx, batch); err != nil || len(res.Outputs) != n {
			b.Fatalf("Forward = %d outputs, %v", len(res.Outputs), err)
		}
		if started {
			wait = pipeline.StartEndStep(ctx, m, pipeline.EndStepRequest{Commits: commit})
			continue
		}
		if _, err := m.Commit(ctx, commit); err != nil {
			b.Fatal(err)
		}
	}
	if wait != nil {
		if _, err := wait(); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkPipelineStepProcess: one step of a 2-stage pipeline at 16
// requests, as the engine makes it: on each stage the end of the last step
// (started, pipeline.StartEndStep) and this step's Reserve, started on both
// stages before either is waited for (pipeline.StartReserve), then the
// forward over both stages (pipeline.StartForwardStages). "shared" runs one
// process per plugin binary, an instance per stage, with the chained
// forward; "per-stage" runs a process per stage and binary, as before
// instances. "shared-overlap" waits for each forward only after the next
// step's manager phase, as the engine does with two stages (step_overlap).
func BenchmarkPipelineStepProcess(b *testing.B) {
	for _, v := range []struct {
		name            string
		shared, overlap bool
	}{{"per-stage", false, false}, {"shared", true, false}, {"shared-overlap", true, true}} {
		b.Run(v.name, func(b *testing.B) { pipelineStepProcess(b, 16, v.shared, v.overlap) })
	}
}

func pipelineStepProcess(b *testing.B, n int, shared, overlap bool) {
	const stages = 2
	reserve := make([]kvcache.ReserveItem, n)
	commit := make([]kvcache.CommitItem, n)
	items := make([]worker.Item, n)
	for i := range n {
		seq := kvcache.SeqID(1000 + i)
		reserve[i] = kvcache.ReserveItem{Seq: seq, Tokens: 1, Draft: 1}
		commit[i] = kvcache.CommitItem{Seq: seq, Accepted: 2}
		items[i] = worker.Item{Seq: seq, Pos: 4000 + i, Tokens: []int32{int32(i), int32(i + 1)}, Draft: 1, Sample: true}
	}
	h := benchHost(b, nil)
	ctx := context.Background()
	ms := make([]kvcache.Manager, stages)
	ws := make([]worker.Worker, stages)
	var mp, wp *Process // the first stage's processes
	for s := range stages {
		var err error
		if shared && s > 0 {
			if ms[s], err = h.ManagerInstance(ctx, ms[0], mp); err != nil {
				b.Fatal(err)
			}
			if ws[s], err = h.WorkerInstance(ctx, ws[0], wp); err != nil {
				b.Fatal(err)
			}
			continue
		}
		var m kvcache.Manager
		var w worker.Worker
		var p, q *Process
		if m, p, err = h.LaunchManager(ctx, fakeManager); err != nil {
			b.Fatal(err)
		}
		if w, q, err = h.LaunchWorker(ctx, fakeWorker); err != nil {
			b.Fatal(err)
		}
		ms[s], ws[s] = m, w
		if s == 0 {
			mp, wp = p, q
		}
	}
	bs := make([]worker.Batch, stages)
	for s := range bs {
		bs[s] = worker.Batch{Step: 1, Items: items}
	}
	waits := make([]func() (pipeline.EndStepResult, error), stages)
	reserves := make([]func() ([]kvcache.Grant, error), stages)
	var forward func() ([]worker.Result, error) // started, not yet waited for
	check := func() {
		res, err := forward()
		forward = nil
		if err != nil || len(res) != stages || len(res[stages-1].Outputs) != n {
			b.Fatalf("ForwardStages = %d results, %v", len(res), err)
		}
	}
	b.ReportAllocs()
	for b.Loop() {
		for s := range stages {
			reserves[s] = pipeline.StartReserve(ctx, ms[s], reserve)
		}
		for s := range stages {
			if _, err := reserves[s](); err != nil {
				b.Fatal(err)
			}
			if waits[s] != nil {
				if _, err := waits[s](); err != nil {
					b.Fatal(err)
				}
			}
		}
		if forward != nil {
			check() // the last step's, which ran beside this manager phase
		}
		forward = pipeline.StartForwardStages(ctx, ws, bs)
		if !overlap {
			check()
		}
		for s := range stages {
			waits[s] = pipeline.StartEndStep(ctx, ms[s], pipeline.EndStepRequest{Commits: commit})
		}
	}
	if forward != nil {
		check()
	}
	for _, wait := range waits {
		if wait == nil {
			continue
		}
		if _, err := wait(); err != nil {
			b.Fatal(err)
		}
	}
}
