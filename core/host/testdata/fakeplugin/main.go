// Command fakeplugin is a tiny kvx plugin for the host's tests. Built as a
// binary whose name contains "worker" it serves a worker, otherwise a cache
// manager. Environment (for tests):
//
//	FAKEPLUGIN_PROTOCOLS     comma-separated protocols Info reports (default "1")
//	FAKEPLUGIN_TRANSPORT     serve only this wire protocol version (a
//	                         plugin built from an older or newer contract)
//	FAKEPLUGIN_FEATURES      the features its Hello offers, comma-separated
//	                         ("-": none), instead of this build's
//	FAKEPLUGIN_REQUIRES      the features its Hello requires
//
// With KVX_PLUGIN_DEBUG=1 it serves in the SDK's debug mode, for the
// reattach tests.
//
// Lookup, and Forward of Step 7, block until their ctx ends, so tests can
// kill the process in the middle of a call. Stats reports the plugin's pid as
// Sequences, its GOMAXPROCS as SuspendedSeqs and the manager's instance
// number (the order the factory made it in, from 0) as Evictions.
package main

import (
	"context"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"

	"github.com/hashicorp/go-hclog"
	"github.com/hashicorp/go-plugin"

	"github.com/kvx-dev/kvx/plugins/sdk"
	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
	"github.com/kvx-dev/kvx/plugins/v1/pluginrpc"
	"github.com/kvx-dev/kvx/plugins/v1/spec"
	"github.com/kvx-dev/kvx/plugins/v1/worker"
)

func protocols() []int {
	s := os.Getenv("FAKEPLUGIN_PROTOCOLS")
	if s == "" {
		return []int{kvcache.ProtocolVersion}
	}
	var ps []int
	for _, f := range strings.Split(s, ",") {
		p, err := strconv.Atoi(f)
		if err != nil {
			hclog.Default().Error("bad FAKEPLUGIN_PROTOCOLS", "value", s)
			os.Exit(2)
		}
		ps = append(ps, p)
	}
	return ps
}

type manager struct{ instance int }

func (manager) Info(context.Context) (kvcache.Info, error) {
	return kvcache.Info{Name: "fake", Version: "0.0.1", Protocols: protocols(),
		Capabilities: kvcache.Capabilities{Mixers: []spec.Mixer{spec.MixerGQA}, PrefixReuse: true}}, nil
}
func (manager) Configure(context.Context, kvcache.Config) (kvcache.Layout, error) {
	return kvcache.Layout{}, kvcache.ErrUnsupported
}
func (manager) Lookup(ctx context.Context, _ []kvcache.LookupItem) ([]int, error) {
	<-ctx.Done()
	return nil, ctx.Err()
}
func (manager) Reserve(_ context.Context, items []kvcache.ReserveItem) ([]kvcache.Grant, error) {
	gs := make([]kvcache.Grant, len(items))
	blocks := make([]kvcache.BlockID, len(items))
	tables := make([]kvcache.TableDelta, len(items))
	for i, it := range items {
		blocks[i] = kvcache.BlockID(i)
		tables[i] = kvcache.TableDelta{From: 100, Blocks: blocks[i : i+1 : i+1]}
		gs[i] = kvcache.Grant{Seq: it.Seq, OK: true, Tables: tables[i : i+1 : i+1]}
	}
	return gs, nil
}
func (manager) Unreserve(context.Context, []kvcache.SeqID) error { return nil }
func (manager) Commit(context.Context, []kvcache.CommitItem) (kvcache.CommitResult, error) {
	return kvcache.CommitResult{}, nil
}
func (manager) Release(context.Context, []kvcache.SeqID) error { return nil }
func (m manager) Stats(context.Context) (kvcache.Stats, error) {
	return kvcache.Stats{Sequences: os.Getpid(), SuspendedSeqs: runtime.GOMAXPROCS(0), Evictions: int64(m.instance)}, nil
}
func (manager) Inspect(context.Context, kvcache.InspectOptions) (kvcache.Snapshot, error) {
	return kvcache.Snapshot{}, nil
}

type fakeWorker struct{}

func (fakeWorker) Info(context.Context) (worker.Info, error) {
	return worker.Info{Name: "fake-worker", Version: "0.0.1", Protocols: protocols(), Device: "sim",
		Mixers: []spec.Mixer{spec.MixerGQA}}, nil
}
func (fakeWorker) Configure(context.Context, worker.Config) (worker.Setup, error) {
	return worker.Setup{}, nil
}
func (fakeWorker) Forward(ctx context.Context, b worker.Batch) (worker.Result, error) {
	if b.Step == 7 {
		<-ctx.Done()
		return worker.Result{}, ctx.Err()
	}
	// One sampled token and one draft per sampling item, like a decode step.
	var outs []worker.Output
	for _, it := range b.Items {
		if it.Sample {
			outs = append(outs, worker.Output{Seq: it.Seq, Tokens: []int32{1}, Drafts: []int32{2}})
		}
	}
	return worker.Result{Outputs: outs, Modelled: true}, nil
}
func (fakeWorker) CopyBlocks(context.Context, []kvcache.Copy) error { return nil }
func (fakeWorker) Health(context.Context) error                     { return nil }

// features reads a comma-separated feature list from the environment.
func features(name string, def []pluginrpc.Feature) []pluginrpc.Feature {
	s, ok := os.LookupEnv(name)
	if !ok {
		return def
	}
	var fs []pluginrpc.Feature
	for _, f := range strings.Split(s, ",") {
		if f != "" && f != "-" {
			fs = append(fs, pluginrpc.Feature(f))
		}
	}
	return fs
}

// contract is what the plugin says in Hello, and the protocol it serves.
func contract() pluginrpc.Contract {
	c := pluginrpc.Current()
	if v := os.Getenv("FAKEPLUGIN_TRANSPORT"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil {
			hclog.Default().Error("bad FAKEPLUGIN_TRANSPORT", "value", v)
			os.Exit(2)
		}
		c.Protocol = n
	}
	c.Features = features("FAKEPLUGIN_FEATURES", c.Features)
	c.Required = features("FAKEPLUGIN_REQUIRES", c.Required)
	return c
}

func main() {
	c := contract()
	made := 0
	newManager := func() kvcache.Manager {
		hclog.Default().Info("fake manager starting", "pid", os.Getpid(), "instance", made)
		made++
		return manager{instance: made - 1}
	}
	isWorker := strings.Contains(filepath.Base(os.Args[0]), "worker")
	if c.Protocol == pluginrpc.Protocol && os.Getenv("FAKEPLUGIN_FEATURES") == "" && os.Getenv("FAKEPLUGIN_REQUIRES") == "" {
		// This build as it is, the SDK's way (debug mode included).
		if isWorker {
			sdk.ServeWorker(func() worker.Worker { return fakeWorker{} })
		} else {
			sdk.ServeCacheManager(newManager)
		}
		return
	}
	// A plugin of another contract revision.
	var set plugin.PluginSet
	if isWorker {
		set = pluginrpc.ServedPlugins(nil, func() worker.Worker { return fakeWorker{} })[pluginrpc.Protocol]
	} else {
		set = pluginrpc.ServedPlugins(newManager, nil)[pluginrpc.Protocol]
	}
	set[pluginrpc.ManagerPluginName].(*pluginrpc.ManagerPlugin).Contract = &c
	set[pluginrpc.WorkerPluginName].(*pluginrpc.WorkerPlugin).Contract = &c
	handshake := pluginrpc.Handshake
	handshake.ProtocolVersion = uint(c.Protocol)
	plugin.Serve(&plugin.ServeConfig{
		HandshakeConfig:  handshake,
		VersionedPlugins: map[int]plugin.PluginSet{c.Protocol: set},
		GRPCServer:       pluginrpc.NewGRPCServer,
		Logger:           sdk.DefaultLogger(),
	})
}
