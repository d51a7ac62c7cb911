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
)

func logLaunch(err error) { log.Print(err) }

// The CLI's use: every check on a fresh plugin process, all violations at
// once.
func ExampleCheckManager() {
	h := host.New(nil, nil)
	defer h.Close()
	path, err := h.Find("kvx-cachemgr-v2")
	if err != nil {
		log.Fatal(err)
	}
	err = conformance.CheckManager(context.Background(), h.ManagerFactory(context.Background(), path, logLaunch), conformance.ManagerOptions{Reuse: true})
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
			conformance.TestManager(t, h.ManagerFactory(context.Background(), path, logLaunch), conformance.ManagerOptions{Reuse: true, RandomOps: 500})
		})
	}
	for _, name := range []string{"kvx-backend-dsa", "kvx-backend-mla", "kvx-backend-gqa"} {
		path := filepath.Join(*pluginDir, name)
		if _, err := os.Stat(path); err != nil {
			continue
		}
		t.Run(name, func(t *testing.T) {
			conformance.TestWorker(t, h.WorkerFactory(context.Background(), path, logLaunch), conformance.WorkerOptions{})
		})
	}
}
