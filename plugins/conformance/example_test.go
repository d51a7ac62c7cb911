package conformance_test

import (
	"context"
	"flag"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"testing"

	"github.com/kvx-dev/kvx/core/host"
	"github.com/kvx-dev/kvx/plugins/conformance"
	"github.com/kvx-dev/kvx/plugins/v1/kvcache"
	"github.com/kvx-dev/kvx/plugins/v1/worker"
)

// managerProcess is a plugin client that stops its process on Close, which
// the suite calls when a check is done.
type managerProcess struct {
	kvcache.Manager
	proc *host.Process
}

func (m managerProcess) Close() error { m.proc.Kill(); return nil }

type workerProcess struct {
	worker.Worker
	proc *host.Process
}

func (w workerProcess) Close() error { w.proc.Kill(); return nil }

// managerFactory launches the plugin binary at path once per check.
func managerFactory(h *host.Host, path string) func() kvcache.Manager {
	return func() kvcache.Manager {
		m, proc, err := h.LaunchManager(context.Background(), path)
		if err != nil {
			log.Print(err)
			return nil // reported as a violation of the check
		}
		return managerProcess{m, proc}
	}
}

func workerFactory(h *host.Host, path string) func() worker.Worker {
	return func() worker.Worker {
		w, proc, err := h.LaunchWorker(context.Background(), path)
		if err != nil {
			log.Print(err)
			return nil
		}
		return workerProcess{w, proc}
	}
}

// The CLI's use: every check on a fresh plugin process, all violations at
// once.
func ExampleCheckManager() {
	h := host.New(nil, nil)
	defer h.Close()
	path, err := h.Find("kvx-cachemgr-v2")
	if err != nil {
		log.Fatal(err)
	}
	err = conformance.CheckManager(context.Background(), managerFactory(h, path), conformance.ManagerOptions{Reuse: true})
	for _, v := range conformance.Violations(err) {
		fmt.Println(v)
	}
}

var pluginDir = flag.String("plugin-dir", "", "run the suite against the kvx-cachemgr-* and kvx-backend-* binaries in this directory, one process per check")

func TestPluginBinaries(t *testing.T) {
	if *pluginDir == "" {
		t.Skip("-plugin-dir not set")
	}
	h := host.New(nil, []string{*pluginDir})
	t.Cleanup(h.Close)
	for _, name := range []string{"kvx-cachemgr-v1", "kvx-cachemgr-v2"} {
		path := filepath.Join(*pluginDir, name)
		if _, err := os.Stat(path); err != nil {
			continue
		}
		t.Run(name, func(t *testing.T) {
			conformance.TestManager(t, managerFactory(h, path), conformance.ManagerOptions{Reuse: true, RandomOps: 500})
		})
	}
	for _, name := range []string{"kvx-backend-dsa", "kvx-backend-mla", "kvx-backend-gqa"} {
		path := filepath.Join(*pluginDir, name)
		if _, err := os.Stat(path); err != nil {
			continue
		}
		t.Run(name, func(t *testing.T) {
			conformance.TestWorker(t, workerFactory(h, path), conformance.WorkerOptions{})
		})
	}
}
